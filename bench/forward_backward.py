"""Host time of a training step's forward call and of its ``loss.backward()`` apart: fused thunder-nb against torch.compile.

    python bench/forward_backward.py [--layers 6] [--steps 150]     # on a GPU

Runs thunder's bundled nanoGPT training step (`thunder_nb.testing.models`, width 128, batch 8x64, ``--layers``
layers) as `bench_cudagraphs.py` makes its "thunder-nb Fixed + torchcompile" and torch.compile(mode="reduce-overhead")
configurations, taking turns step by step on 8 batches. Each step is synchronised before it starts; the forward
call, ``loss.backward()`` and the gradients' reset are timed apart (wall time until each returns: the host's
share), then the synchronise ends the step (``all``). Prints the median microseconds of each over ``--steps``
steps after 10 warm-up steps.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import bench_cudagraphs as B
from thunder_nb.testing.models import model_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    case = model_case("nanoGPT", "cuda", layers=args.layers)
    steps = {name: factory()[0].f for name, factory in B.configs(B.TrainingStep(case)) if name in (B.FUSED, B.COMPILED)}
    batches = [case.make_batch(i) for i in range(8)]
    params = list(case.model.parameters())
    times = {name: {"forward": [], "backward": [], "reset": [], "all": []} for name in steps}
    for i in range(args.steps + 10):
        for name, f in steps.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = f(*batches[i % 8])
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            for p in params:
                p.grad = None
            t3 = time.perf_counter()
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            if i >= 10:
                for phase, dt in zip(times[name], (t1 - t0, t2 - t1, t3 - t2, t4 - t0)):
                    times[name][phase].append(dt)
    print(f"nanoGPT training step, {args.layers} layers: host µs until each part returns, median of {args.steps} steps")
    print("| configuration | " + " | ".join(times[B.FUSED]) + " |")
    print("|---|" + "---:|" * len(times[B.FUSED]))
    for name, phases in times.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(v) * 1e6:.1f}" for v in phases.values()) + " |")


if __name__ == "__main__":
    main()
