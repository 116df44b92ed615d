"""Several compiled models in one process: does a CUDA-graph replay survive another compiler's capture? (GPU)

    python bench/repro_replay_after_compile.py            # every variant, each in its own process

Model A (thunder's bundled llama2: 2 layers, width 128, GQA, batch 8x64) is jitted with a CUDA-graph
transform and trained 3 steps; a deep copy, model B, goes through torch.compile(mode="reduce-overhead")
and trains 3 steps; then model A trains again. Each variant runs in a process of its own, since an
illegal memory access ends the CUDA context. Variants: thunder-nb's fixed transform with
copy_outputs True and False, each with and without its cuBLAS-workspace handling, and thunder's own
transform. Prints one line per variant: how the process ended and the losses against eager.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore")

VARIANTS = {
    "fixed, copy_outputs=True": ["--transform", "fixed", "--copy-outputs", "1"],
    "fixed, copy_outputs=False": ["--transform", "fixed", "--copy-outputs", "0"],
    "fixed, copy_outputs=False, without the workspace handling": ["--transform", "fixed", "--copy-outputs", "0",
                                                                  "--no-workspace-fix"],
    "fixed, copy_outputs=True, without the workspace handling": ["--transform", "fixed", "--copy-outputs", "1",
                                                                 "--no-workspace-fix"],
    "thunder CUDAGraphTransform": ["--transform", "stock"],
}


def one(transform: str, copy_outputs: bool, workspace_fix: bool) -> None:
    import thunder
    import torch
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from thunder_nb import internals
    from thunder_nb.fix import FixedCUDAGraphTransform
    from thunder_nb.testing.models import model_case

    if not workspace_fix:
        internals.clear_cublas_workspaces = lambda: None
    a = model_case("llama2", "cuda")
    ref = model_case("llama2", "cuda", model=copy.deepcopy(a.model))
    t = FixedCUDAGraphTransform(capture=True, copy_outputs=copy_outputs) if transform == "fixed" else CUDAGraphTransform()
    ja = thunder.jit(a.step, transforms=[t])

    def train(case, f, seeds):
        out = []
        for s in seeds:
            loss = f(*case.make_batch(s))
            loss.backward()
            for p in case.model.parameters():
                p.grad = None
            out.append(loss.detach().clone())
        return out

    losses = train(a, ja, range(3))
    b = model_case("llama2", "cuda", model=copy.deepcopy(a.model))
    train(b, torch.compile(b.step, mode="reduce-overhead"), range(100, 103))
    losses += train(a, ja, range(3, 8))
    torch.cuda.synchronize()
    expected = train(ref, ref.step, range(8))
    worst = max(abs(x - y).item() for x, y in zip(losses, expected))
    print(f"survived; max |loss - eager| over 8 steps: {worst:.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transform", choices=["fixed", "stock"])
    ap.add_argument("--copy-outputs", type=int, default=1)
    ap.add_argument("--no-workspace-fix", action="store_true")
    ap.add_argument("--only", metavar="REGEX", help="only the variants whose name matches")
    a = ap.parse_args()
    if a.transform:
        one(a.transform, bool(a.copy_outputs), not a.no_workspace_fix)
        return 0
    import re

    for name, args in VARIANTS.items():
        if a.only and not re.search(a.only, name):
            continue
        proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=400)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        last = next((ln for ln in reversed(lines) if "survived" in ln or "Error" in ln or "error" in ln), "")
        print(f"{name}: exit {proc.returncode}: {last.strip()[:160]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
