"""Which kernels make one configuration's training step slower on the GPU than another's (issue 55: where jit_step
fused loses its 2% to inductor's hand capture on GPT-2 small, its 6% on the 1B model).

    python bench/kernel_diff.py --model gpt2-small [--configs "whole step fused,inductor + capture by hand"]
                                [--steps 10] [--top 20] [--out FILE.md]
    python bench/kernel_diff.py --model nanogpt --device cpu --configs "eager,whole step" --steps 2  # the script

Each configuration (`bench_step.TrainLoop`: its own model and AdamW from the same initial state) runs 3 steps to warm
up (compiling, capturing), then ``--steps`` consecutive steps under torch.profiler (CUDA activity; ``--device cpu``:
the CPU's leaf aten ops instead, a check of the script). It is freed before the next is built, so that the 1B model's
configurations fit one after the other. Per configuration, each kernel's own device time per step, summed by kernel
name (the trailing numbers of inductor's names dropped: ``triton_poi_fused_add_3`` is ``triton_poi_fused_add``) and
by class (`CLASSES`: matrix multiplies, attention, inductor's fusions, the optimizer, elementwise, reductions, copies);
then the classes side by side and the kernels whose time differs most between the first two configurations.
"""

from __future__ import annotations

import argparse
import collections
import gc
import re
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from rounds import machine, on_gpu, profiled_steps, write_markdown  # noqa: E402

#: (class, pattern over a kernel's name), the first that matches; "other" for none.
CLASSES = (
    ("attention", r"flash|fmha|attention|sdpa|softmax_warp"),
    ("matrix multiply", r"gemm|cutlass|xmma|cublas|nvjet|sm\d+_|ampere_|hopper_|splitK|addmm|aten::mm|aten::bmm"),
    ("optimizer (foreach, fused AdamW)", r"multi_tensor_apply|adam|foreach|_amp_update"),
    ("inductor fusion (triton)", r"^triton_"),
    ("reduction", r"reduce_kernel|reduction|aten::sum|aten::mean|aten::max"),
    ("copy, fill", r"[Mm]emcpy|[Mm]emset|copy_kernel|fill_kernel|aten::copy_|aten::fill_|aten::zero_"),
    ("elementwise", r"elementwise|vectorized|aten::"),
)


def kernel_class(name: str) -> str:
    return next((c for c, pattern in CLASSES if re.search(pattern, name)), "other")


def short_name(name: str) -> str:
    """A kernel's name without inductor's trailing number, and cut to 90 characters."""
    name = re.sub(r"^(triton_\w+?)_\d+$", r"\1", name)
    return name if len(name) <= 90 else name[:87] + "..."


def profile_config(model: str, config: str, device: str, steps: int) -> dict[str, tuple[float, float]]:
    """{kernel name: (µs per step, calls per step)} of ``steps`` steps of ``config`` after 3 warm-up steps."""
    from bench_step import TrainLoop

    loop = TrainLoop(model, config, device)
    for i in range(3):
        loop.step(i)
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for event in profiled_steps(loop, steps, device).key_averages():
        if on_gpu(device):
            us = event.self_device_time_total
        elif event.key.startswith("aten::"):
            us = event.self_cpu_time_total  # NOTE: the CPU check: every aten op's own time
        else:
            continue
        if us > 0:
            entry = per[short_name(event.key)]
            entry[0] += us / steps
            entry[1] += event.count / steps
    del loop
    gc.collect()
    if on_gpu(device):
        torch.cuda.empty_cache()
    return {k: (v[0], v[1]) for k, v in per.items()}


def report(model: str, configs: list[str], kernels: dict[str, dict[str, tuple[float, float]]], steps: int,
           top: int, device: str) -> str:
    what = ("µs of GPU kernel time per step (each kernel's own time, torch.profiler)" if on_gpu(device) else
            "µs of CPU time per step in each aten op's own code (the CPU check of the script, not kernels)")
    lines = [f"{machine()}; model {model}; {steps} profiled steps a configuration after 3 warm-up steps; {what}", ""]
    by_class = {c: collections.Counter() for c in configs}
    for c in configs:
        for name, (us, _) in kernels[c].items():
            by_class[c][kernel_class(name)] += us
    classes = [c for c, _ in CLASSES] + ["other"]
    lines += ["| class | " + " | ".join(configs) + (" | difference |" if len(configs) > 1 else " |"),
              "|---|" + "---:|" * (len(configs) + (len(configs) > 1))]
    for cls in classes + ["all kernels"]:
        values = [sum(by_class[c].values()) if cls == "all kernels" else by_class[c][cls] for c in configs]
        if not any(values):
            continue
        diff = f" {values[0] - values[1]:+.0f} |" if len(configs) > 1 else ""
        lines.append(f"| {cls} | " + " | ".join(f"{v:.0f}" for v in values) + " |" + diff)
    if len(configs) > 1:
        a, b = (kernels[c] for c in configs[:2])
        names = sorted(set(a) | set(b), key=lambda n: -abs(a.get(n, (0, 0))[0] - b.get(n, (0, 0))[0]))[:top]
        lines += ["", f"The {top} kernels whose time differs most ({configs[0]} against {configs[1]}; "
                      "µs per step, calls per step):", "",
                  f"| kernel | class | {configs[0]} | {configs[1]} | difference |", "|---|---|---:|---:|---:|"]
        for n in names:
            (ua, ca), (ub, cb) = a.get(n, (0.0, 0.0)), b.get(n, (0.0, 0.0))
            lines.append(f"| `{n}` | {kernel_class(n)} | {ua:.0f} ({ca:g}) | {ub:.0f} ({cb:g}) | {ua - ub:+.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--configs", default="whole step fused,inductor + capture by hand",
                        help="comma-separated configurations of bench_step.py (the first two are compared)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", default=None, help="also write the tables to this Markdown file")
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    kernels = {}
    for config in configs:
        print(f"profiling {config} ...", flush=True)
        kernels[config] = profile_config(args.model, config, args.device, args.steps)
    text = report(args.model, configs, kernels, args.steps, args.top, args.device)
    print(text)
    write_markdown(args.out, f"Kernels of one training step of {args.model}: {' against '.join(configs)}", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
