"""Where a training step's time goes: GPU kernel time against the rest (launches, Python), per configuration.

    python bench/where_time_goes.py [--program 'nanoGPT training step'] [--steps 50] [--out-dir bench/results]

For each configuration of bench_cudagraphs.py on one program (all in one process, each after a
warm-up): the median time of a synchronised step, the median time until the step returns (the
host's share), and from torch.profiler's CUDA trace of 20 steps the kernels the GPU ran, the time
it spent in them, the kernel launches made from the host and the graph launches. Writes a markdown
table and a picture (SVG, no plotting library): per configuration one bar of the step time, split
into the GPU's kernel time and the time the GPU had nothing to run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
import warnings
from html import escape
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import bench_cudagraphs as bench  # noqa: E402

KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel", "cuLaunchKernelEx")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")


def timed(f, inputs) -> tuple[float, float]:
    """Median µs per synchronised call, and median µs until the call returns."""
    wall, host = [], []
    for args in inputs:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = f(*args)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        host.append(t1 - t0)
        del out
    return statistics.median(wall) * 1e6, statistics.median(host) * 1e6


def profiled(f, inputs) -> dict:
    """Per-step counts and GPU kernel time from torch.profiler's trace of ``inputs``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for args in inputs:
            f(*args)
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    n = len(inputs)
    return {
        "kernels": len(kernels) / n,
        "gpu_us": sum(e.time_range.elapsed_us() for e in kernels) / n,
        "launches": sum(e.name.startswith(KERNEL_LAUNCHES) for e in events) / n,
        "graph_launches": sum(e.name.startswith(GRAPH_LAUNCHES) for e in events) / n,
    }


def measure(program: str, steps: int) -> list[dict]:
    bench.PROGRAM_FILTER = f"^{program}$"
    rows = []
    for _, fn, make, cfg, factory in bench._cases():
        try:
            f, _ = factory()
            bench.warm_up(f, make(0))
            step_us, host_us = timed(f, [make(i % 50) for i in range(steps)])
            row = {"config": cfg, "step_us": step_us, "host_us": host_us, **profiled(f, [make(i) for i in range(20)])}
        except Exception as e:  # a failing configuration is a finding
            row = {"config": cfg, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:100]}"}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def table(program: str, rows: list[dict]) -> str:
    lines = [
        f"| {program}: configuration | step µs | until return µs | GPU kernel µs | GPU idle µs | kernels | "
        "kernel launches | graph launches |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | fails: {r['error']} | | | | | | |")
            continue
        idle = max(r["step_us"] - r["gpu_us"], 0.0)
        lines.append(f"| {r['config']} | {r['step_us']:.0f} | {r['host_us']:.0f} | {r['gpu_us']:.0f} | {idle:.0f} | "
                     f"{r['kernels']:.0f} | {r['launches']:.0f} | {r['graph_launches']:.0f} |")
    return "\n".join(lines) + "\n"


def picture(program: str, rows: list[dict], machine: str) -> str:
    """An SVG of stacked bars: GPU kernel time and GPU idle time per step, one bar per configuration."""
    rows = [r for r in rows if "error" not in r]
    label_w, bar_w, row_h, top = 330, 520, 34, 58
    scale = bar_w / max(r["step_us"] for r in rows)
    h = top + row_h * len(rows) + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 190}" height="{h}" '
           'font-family="sans-serif" font-size="13">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="22" font-size="15" font-weight="bold">{escape(program)}: where one step\'s time goes</text>',
           f'<text x="10" y="42" fill="#555">{escape(machine)}; median of synchronised steps; '
           'kernel time from torch.profiler</text>']
    for i, r in enumerate(rows):
        y = top + i * row_h
        gpu = min(r["gpu_us"], r["step_us"]) * scale
        idle = r["step_us"] * scale - gpu
        out += [f'<text x="{label_w - 8}" y="{y + 19}" text-anchor="end">{escape(r["config"])}</text>',
                f'<rect x="{label_w}" y="{y + 4}" width="{gpu:.1f}" height="22" fill="#2f6db5"/>',
                f'<rect x="{label_w + gpu:.1f}" y="{y + 4}" width="{idle:.1f}" height="22" fill="#e0a030"/>',
                f'<text x="{label_w + gpu + idle + 6:.1f}" y="{y + 19}">{r["step_us"]:.0f} µs, '
                f'{r["kernels"]:.0f} kernels</text>']
    y = top + row_h * len(rows) + 18
    out += [f'<rect x="{label_w}" y="{y}" width="14" height="14" fill="#2f6db5"/>',
            f'<text x="{label_w + 20}" y="{y + 12}">GPU running kernels</text>',
            f'<rect x="{label_w + 190}" y="{y}" width="14" height="14" fill="#e0a030"/>',
            f'<text x="{label_w + 210}" y="{y + 12}">GPU idle: waiting for the host (launches, Python, sync)</text>',
            "</svg>"]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="nanoGPT training step")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out-dir", type=Path, help="write <date>-where-time-goes-h200.{md,svg,json} here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("where_time_goes: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    rows = measure(a.program, a.steps)
    machine = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    text = table(a.program, rows)
    print(text)
    if a.out_dir:
        a.out_dir.mkdir(parents=True, exist_ok=True)
        stem = a.out_dir / f"{datetime.date.today().isoformat()}-where-time-goes-h200"
        stem.with_suffix(".json").write_text(json.dumps({"program": a.program, "machine": machine, "rows": rows}, indent=1))
        stem.with_suffix(".md").write_text(f"# Where the time goes, {datetime.date.today().isoformat()}\n\n"
                                           f"Machine: {machine}. Command: `python bench/where_time_goes.py`.\n\n{text}")
        stem.with_suffix(".svg").write_text(picture(a.program, rows, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
