"""Host time of one call of a program: thunder's CUDA-graph transform against `thunder_nb.jit`, replays left out.

    python bench/call_host.py [--programs chain,island] [--size 64] [--calls 2000] [--rounds 5] [--thunder-nb DIR]

Each program of `bench/programs.py` named, one of those that take one vector (``chain``, ``island``, ``norm_chain``,
``seed``, ``fill_from_item``; ``--size`` elements on the CPU), is jitted by
thunder's ``CUDAGraphTransform`` and `thunder_nb.jit` (also with ``rotation=0``); ``--thunder-nb DIR`` imports the
``thunder_nb`` under DIR instead (an older commit's: ``git archive COMMIT thunder_nb | tar -x -C DIR``; its ratio to
thunder's transform, from its own process, then compares with this one's). Under emulated capture
(`thunder_nb.testing.emulated_capture`) with every graph replay made a no-op, a call's thread CPU time is the host's
work around the replay: thunder's call path, the prologue, the runner, the hand-out. The configurations take turns in
rounds in one process; printed: per configuration the median over rounds of each round's median µs per call, its
lowest and highest round, and its ratio to thunder's transform. On a GPU a program this small waits for the host, so
its time per call follows this (bench/results/2026-12-04-chain-host-cpu.md); confirm there with
``bench_cudagraphs.py --only-interleaved``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402


def _nb(fn, **options):
    """``thunder_nb.jit(fn)`` with emulated capture (its runner's capture path)."""
    import thunder_nb

    jfn = thunder_nb.jit(fn, capture=False, **options)
    jfn._lc_transforms[0].cuda_graph_runner.capture = True
    return jfn


def configurations(fn) -> dict:
    import thunder
    from thunder.transforms.cudagraph import CUDAGraphTransform

    return {"thunder's CUDAGraphTransform": thunder.jit(fn, transforms=[CUDAGraphTransform()]),
            "thunder_nb.jit": _nb(fn), "thunder_nb.jit rotation=0": _nb(fn, rotation=0)}


def measure(name: str, size: int, calls: int, rounds: int) -> dict[str, list[float]]:
    import programs
    from thunder_nb.testing.emulate import emulated_capture

    fn = getattr(programs, name)
    args = (torch.randn(size, generator=torch.Generator().manual_seed(0)),)
    with emulated_capture():
        configs = configurations(fn)
        for f in configs.values():
            for _ in range(5):  # NOTE: traced, recorded, guards made
                f(*args)
        times: dict[str, list[float]] = {k: [] for k in configs}
        for _ in range(rounds):
            for k, f in configs.items():
                each = []
                for _ in range(calls):
                    t = time.thread_time_ns()
                    out = f(*args)
                    each.append(time.thread_time_ns() - t)
                    del out
                times[k].append(statistics.median(each) / 1e3)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", default="chain", help="names in bench/programs.py, comma-separated")
    parser.add_argument("--thunder-nb", help="a folder holding the thunder_nb/ to import (an older commit's)")
    parser.add_argument("--size", type=int, default=64, help="elements of the program's vector")
    parser.add_argument("--calls", type=int, default=2000, help="calls per configuration and round")
    parser.add_argument("--rounds", type=int, default=5)
    a = parser.parse_args()
    if a.thunder_nb:
        sys.path.insert(0, str(Path(a.thunder_nb).resolve()))
    import thunder_nb
    from thunder_nb.testing.emulate import EmulatedGraph

    torch.set_num_threads(1)
    replay = EmulatedGraph.replay
    EmulatedGraph.replay = lambda graph: None  # NOTE: the host's work only; values go stale
    try:
        print(f"Host µs per call (thread CPU time), CPU, emulated capture, replays skipped; {a.rounds} rounds of "
              f"{a.calls} calls, configurations taking turns; thunder_nb from {Path(thunder_nb.__file__).parent}.\n")
        print("| program | configuration | µs per call (median of rounds) | rounds | vs thunder's transform |")
        print("|---|---|---:|---|---:|")
        for name in a.programs.split(","):
            times = measure(name, a.size, a.calls, a.rounds)
            ref = statistics.median(times["thunder's CUDAGraphTransform"])
            for k, v in times.items():
                m = statistics.median(v)
                print(f"| {name} | {k} | {m:.1f} | {min(v):.1f}-{max(v):.1f} | {m / ref:.2f}x |")
    finally:
        EmulatedGraph.replay = replay
    return 0


if __name__ == "__main__":
    sys.exit(main())
