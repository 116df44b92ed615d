"""Where does a call of the island program spend its time? torch.profiler's table per configuration.

    python bench/profile_island.py [--calls 20] [--config SUBSTRING]

Builds the island program's configurations of bench_cudagraphs.py's interleaved table, warms each
up, then profiles ``--calls`` calls (CPU and CUDA activity) and prints the operators by self CPU
time. On the H200 this showed, for example, that ``cudaGraphLaunch`` of the ~100-kernel graph takes
far more CPU time than the copy of the returned tensor.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import bench_cudagraphs as bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--config", default="", help="only configurations whose name contains this")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("profile_island: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    from torch.profiler import ProfilerActivity, profile

    for program, _, make, cfg, factory in bench._cases():
        if not program.startswith("island") or cfg not in bench.INTERLEAVED or a.config not in cfg:
            continue
        f, _ = factory()
        bench.warm_up(f, make(0))
        inputs = [make(i) for i in range(a.calls)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for x in inputs:
                f(*x)
            torch.cuda.synchronize()
        print(f"\n## {cfg}: {a.calls} calls")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
