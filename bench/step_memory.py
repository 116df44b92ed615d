"""Peak GPU memory of a training loop, per configuration, each in its own process (#34: the whole step's memory).

    python bench/step_memory.py [--models nanogpt,llama2] [--steps 12] [--out FILE.md] [--alloc-conf CONF]
                                [--env NAME=VALUE ...]

For each zoo model and configuration, a fresh Python process builds the model and AdamW from the zoo's initial state
and runs ``--steps`` training steps (zero_grad, forward, backward, optimizer step; the whole step's own loop for
`thunder_nb.jit_step`). Reported: the peak of `torch.cuda.max_memory_allocated` over the whole run (recording and
warm-up included, what decides an out-of-memory error), the step it came at (1-based; `jit_step`'s first three
steps are its uncaptured warm-up and the fourth records), the peak over the last half of the steps only (the steady
state), and `torch.cuda.max_memory_reserved` (what the caching allocator holds, graph pools included), in MiB.

Also reported: the cuBLAS workspace, the memory a first matmul takes besides its result on a (cuBLAS handle, stream)
pair that has none (torch keys its workspaces by that pair, and each thread has its own handle). A capture that
runs matmuls on two threads, the forward on the caller's and the backward on autograd's device thread, holds two
workspaces at once, and the per-region transform holds each in its own graph's pool: the peaks are read with that
figure beside them (#34). ``--env CUBLAS_WORKSPACE_CONFIG=:4096:1`` shrinks it, to check.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("eager", "thunder", "stock", "thunder_nb.jit", "whole step", "reduce-overhead")
LABELS = {"eager": "eager", "thunder": "thunder (no graphs)", "stock": "thunder's CUDAGraphTransform (per region)",
          "thunder_nb.jit": "thunder_nb.jit (per region)", "whole step": "thunder_nb.jit_step (whole step)",
          "reduce-overhead": "torch.compile reduce-overhead"}

CHILD = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, ROOT)
import torch
from thunder_nb.step import jit_step
from thunder_nb.testing import zoo

torch._C._cuda_clearCublasWorkspaces()
a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
before = torch.cuda.memory_allocated()
b = a @ a
torch.cuda.synchronize()
workspace = torch.cuda.memory_allocated() - before - b.untyped_storage().nbytes()
del a, b
torch._C._cuda_clearCublasWorkspaces()
torch.cuda.reset_peak_memory_stats()
model = zoo.MODELS[NAME]
net = model.build("cuda").train()
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
fn = model.loss(net)
batches = [model.batch(i, "cuda") for i in range(3)]
if CONFIG == "whole step":
    whole = jit_step(net, fn, opt)
else:
    compiled, _ = zoo.compile_with(CONFIG, fn, True)
torch.cuda.synchronize()
start = torch.cuda.memory_allocated()
losses, peaks = [], []
for i in range(STEPS):
    torch.cuda.reset_peak_memory_stats()
    args, targets = batches[i % 3]
    if CONFIG == "whole step":
        losses.append(whole(*args, targets))
    else:
        opt.zero_grad()
        loss = compiled(*args, targets)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    peaks.append(torch.cuda.max_memory_allocated())
print(json.dumps({"peak": max(peaks), "steady": max(peaks[STEPS // 2:]), "at": peaks.index(max(peaks)) + 1,
                  "reserved": torch.cuda.max_memory_reserved(), "start": start, "loss": float(losses[-1]),
                  "workspace": workspace}))
"""


def measure(name: str, config: str, steps: int, env: dict[str, str] | None = None) -> dict:
    code = (CHILD.replace("ROOT", repr(str(ROOT))).replace("NAME", repr(name)).replace("CONFIG", repr(config))
            .replace("STEPS", str(steps)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **env) if env else None)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:150]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: dict, steps: int) -> str:
    import torch

    mib = 2 ** 20
    lines = [f"Machine: {torch.cuda.get_device_name()}, torch {torch.__version__}. {steps} AdamW steps per process.", "",
             "| model | configuration | peak allocated, MiB (whole run) | peak allocated, MiB (last half) "
             "| the step of the peak | peak reserved, MiB | allocated before the first step, MiB | cuBLAS workspace, MiB "
             "| last loss | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (name, config), r in results.items():
        if "error" in r:
            lines.append(f"| {name} | {LABELS[config]} | - | - | - | - | - | - | - | fails: {r['error']} |")
            continue
        lines.append(f"| {name} | {LABELS[config]} | {r['peak'] / mib:.1f} | {r['steady'] / mib:.1f} "
                     f"| {r['at']} | {r['reserved'] / mib:.1f} | {r['start'] / mib:.1f} | {r['workspace'] / mib:.1f} "
                     f"| {r['loss']:.4f} | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="nanogpt,llama2")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", help="also write the table into this Markdown file")
    parser.add_argument("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF for the measured processes, e.g. "
                        "graph_capture_record_stream_reuse:True (the caching allocator's reuse, during a capture, of "
                        "blocks freed with uses on another stream; #34's whole-step peak)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the measured processes (repeatable), e.g. "
                        "CUBLAS_WORKSPACE_CONFIG=:4096:1")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    if args.alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    results = {}
    for name in args.models.split(","):
        for config in args.configs.split(","):
            results[(name, config)] = r = measure(name, config, args.steps, env)
            print(f"  {name} {config}: {r}", file=sys.stderr, flush=True)
    text = table(results, args.steps) + "".join(f"\n\n{k}={v}" for k, v in env.items())
    print(text)
    if args.out:
        Path(args.out).write_text(f"# Peak memory of a training loop, {datetime.date.today()}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
