"""The whole training iteration as one CUDA graph (thunder_nb.jit_step) against eager, torch.compile and thunder_nb.jit.

    python bench/bench_step.py [--rounds 5] [--steps 30] [--models nanogpt,llama2] [--pt2] [--configs ...]
                               [--out FILE.md]
    python bench/bench_step.py --models gpt2-small --rounds 3 --steps 10   # a size where the GPU bounds the step
    python bench/bench_step.py --capturability [--device cpu]  # what stops each zoo training case
    python bench/bench_step.py --device cpu --steps 2     # checks the script (CPU stand-in; no inductor)

The zoo's 2-layer nanoGPT and llama2 AdamW training loops (`thunder_nb.testing.zoo`), each configuration with its own
model and optimizer from the same initial state. Per configuration: 5 checked steps (the loss read after each and held
against eager's by the one judge, `rounds.matches`), then rounds: in each round every configuration runs ``--steps``
consecutive steps (zero_grad, forward, backward, optimizer step; no sync inside), synchronised only at the round's
ends, taking turns. Reported: the median over rounds of ms/step and the ratio to torch.compile reduce-overhead's (RO)
with its spread (min-max of the per-round ratios). In the same run, torch.profiler's sum of GPU kernel time per step
of the whole step (the graph's kernels), and the GPU time of back-to-back replays (CUDA events). ``--pt2`` adds PT2's
closest: torch.compile(mode="reduce-overhead") of the whole step function with compiled autograd.

The two recipes an expert writes by hand (`HandCapture`): PyTorch's whole-network capture of forward, backward and a
capturable AdamW over eager's kernels, and the same over torch.compile's (inductor's) kernels; and thunder-nb's whole
step with inductor's fusions (``whole step fused``). ``--models gpt2-small,llama-1b`` times the sizes where the GPU
bounds the step (`sized_models`: GPT-2 small at 8x256 tokens; a Llama-3.2-1B-shaped model at 4x512 under bfloat16
autocast). Each configuration holds its own model and optimizer: the 1B model's float32 weights, gradients and AdamW
state take about 24 GB a configuration, so time it one configuration a run beside eager (``--configs``; eager
always runs; three did not fit an 80 GB H100). On a GPU each row also gives its configuration's own peak memory: the
most allocated while it was built and ran its checked steps, above what the configurations before it held.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from rounds import (add_ratios, add_round_arguments, kernel_us, machine, matches, on_gpu,  # noqa: E402
                    recover, run_rows, sync, time_rounds, write_markdown)

import sized_models  # noqa: E402
from hand_capture import HandCapture  # noqa: E402
from thunder_nb.step import jit_step  # noqa: E402
from thunder_nb.testing import zoo  # noqa: E402

CONFIGS = ("eager", "reduce-overhead", "thunder_nb.jit", "whole step", "whole step fused", "capture by hand",
           "inductor + capture by hand", "pt2 whole step")
#: The configurations the CPU stand-in leaves out: CUDA graphs written by hand, and inductor's (not the stand-in's).
CUDA_ONLY = ("reduce-overhead", "whole step fused", "capture by hand", "inductor + capture by hand", "pt2 whole step")
LABELS = {"eager": "eager", "reduce-overhead": "torch.compile reduce-overhead (RO)", "thunder_nb.jit": "thunder_nb.jit",
          "whole step": "thunder_nb.jit_step (whole step)",
          "whole step fused": 'thunder_nb.jit_step (whole step), executors=["torchcompile"]',
          "capture by hand": "eager kernels + PyTorch's whole-network capture, by hand",
          "inductor + capture by hand": "torch.compile (inductor) + PyTorch's whole-network capture, by hand",
          "pt2 whole step": "torch.compile RO of the whole step + compiled autograd"}
CHECKED = 5


class TrainLoop:
    """One configuration's AdamW loop on its own copy of a zoo (or sized) model; ``step(i)`` returns the loss (not
    read). A model in `sized_models.AUTOCAST` runs its forward under bfloat16 autocast, in every configuration."""

    def __init__(self, name: str, config: str, device: str):
        self.model = sized_models.model(name)
        self.config, self.device = config, device
        self.autocast = name in sized_models.AUTOCAST
        self.net = self.model.build(device).train()
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-3)
        fn = self.model.loss(self.net)
        self.batches = [self.model.batch(i, device) for i in range(3)]
        self.whole = None
        self.graphs = None
        if config in ("whole step", "whole step fused"):
            with self.around():
                self.whole = jit_step(self.net, fn, self.opt,
                                      executors=["torchcompile"] if config == "whole step fused" else ())
        elif config in ("capture by hand", "inductor + capture by hand"):
            compiled = torch.compile(fn) if config.startswith("inductor") else fn
            self.whole = HandCapture(self.net, compiled, self.batches[0], self.around)
        elif config == "pt2 whole step":
            opt = self.opt

            def train_step(idx, targets):
                opt.zero_grad(set_to_none=True)
                loss = fn(idx, targets)
                loss.backward()
                opt.step()
                return loss.detach()

            self.whole = torch.compile(train_step, mode="reduce-overhead")
        else:
            capture = True if device == "cuda" else "emulated"
            self.fn, self.transform = zoo.compile_with(config, fn, capture)

    def around(self) -> contextlib.AbstractContextManager:
        """bfloat16 autocast for a model in `sized_models.AUTOCAST`, else nothing."""
        if self.autocast:
            return torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def context(self) -> contextlib.AbstractContextManager:
        """What the timed steps run inside (not autocast: `step` enters it for each step)."""
        stack = contextlib.ExitStack()
        if self.config == "pt2 whole step":
            stack.enter_context(torch._dynamo.config.patch(compiled_autograd=True))
        if self.device == "cpu" and self.config == "thunder_nb.jit":
            stack.enter_context(zoo.capturing("emulated"))
        return stack

    def step(self, i: int) -> torch.Tensor:
        """One training step; autocast (`around`) entered for this step alone: around the forward, or around the
        whole step's call (`jit_step` reads it there).

        NOTE: eager PyTorch caches the bfloat16 copies of the weights until the outermost autocast context exits;
        one context around several steps makes eager's forwards read the first step's weights (its loss stops
        falling: 1.2 above thunder's and float32's after four AdamW steps of a 2-layer llama with a 128256-token
        vocabulary), as PyTorch's docs warn: autocast around the forward and the loss only."""
        (idx,), targets = self.batches[i % 3]
        if self.whole is not None:
            with self.around():
                loss = self.whole(idx, targets)
            # NOTE: RO's output is its buffer; the hand capture's is its static loss, read before the next replay
            return loss.clone() if self.config == "pt2 whole step" else loss
        self.opt.zero_grad()
        with self.around():
            loss = self.fn(idx, targets)
        loss.backward()
        self.opt.step()
        return loss.detach()


def replay_us(loop: TrainLoop, steps: int) -> float | None:
    """The GPU time of back-to-back replays of the whole step's graph (CUDA events, no host work between them)."""
    graph = getattr(loop.whole, "graph", None)  # NOTE: jit_step's Step; torch.compile's whole step has none
    if graph is None:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / steps


def own_memory_start(device: str) -> int | None:
    """What is allocated on the GPU before a configuration is built (the configurations before it, held), with the
    peak counter reset; None on the CPU."""
    if not on_gpu(device):
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def own_memory_peak(device: str, below: int | None) -> float | None:
    """A configuration's own peak, MiB: the most allocated while it was built and ran its checked steps (compiling,
    warming up and recording included: what decides an out-of-memory error), above what was held before it."""
    if below is None:
        return None
    return (torch.cuda.max_memory_allocated() - below) / 2**20


def bench_model(name: str, rounds: int, steps: int, device: str, configs: list[str]) -> dict:
    rows: dict[str, dict] = {}
    loops: dict[str, TrainLoop] = {}
    for config in configs:
        row = rows[config] = {"ms": [], "note": "", "losses": []}
        loop = None  # NOTE: a configuration that failed is not held while the next one is built (its memory)
        try:
            started = time.perf_counter()
            below = own_memory_start(device)
            loop = TrainLoop(name, config, device)
            with loop.context():
                row["losses"] = [float(loop.step(i)) for i in range(CHECKED)]  # NOTE: compile, warm up, record
            sync(device)
            row["first_s"] = time.perf_counter() - started
            row["peak_mib"] = own_memory_peak(device, below)
            loops[config] = loop
        except Exception as e:
            recover(device)
            row["note"] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    reference = rows["eager"]["losses"]
    for row in rows.values():
        if row["losses"] and reference:
            row["matches"] = matches(row["losses"], reference, name in sized_models.AUTOCAST)
    time_rounds(loops, rows, rounds, steps, device)
    add_ratios(rows)
    for config, row in rows.items():
        loop = loops.get(config)
        if loop is not None and loop.whole is not None and hasattr(loop.whole, "graphs_recorded"):
            row["graphs"] = loop.whole.graphs_recorded
        elif loop is not None and getattr(loop, "transform", None) is not None:
            graphs, regions = zoo.count_graphs(loop.transform)
            row["graphs"] = f"{graphs} ({regions} regions)"
    out = {"rows": rows}
    whole = loops.get("whole step")
    if whole is not None and device == "cuda":
        out["kernel_us"] = kernel_us(whole, steps, device)
        out["replay_us"] = replay_us(whole, steps)
        if "eager" in loops:
            out["eager_kernel_us"] = kernel_us(loops["eager"], steps, device)
    return out


def zoo_capturability(device: str) -> str:
    """`thunder_nb.step.capturability` of every zoo training case, one line each (traces only: nothing runs)."""
    from thunder_nb.step import capturability

    lines = [f"Capturability of the zoo's training cases on {device} traces (`thunder_nb.step.capturability`):", "",
             "| model | protocol | in one graph | what stops the rest (line: fix) |", "|---|---|---:|---|"]
    for name, model in zoo.MODELS.items():
        for protocol in model.protocols:
            if protocol not in zoo.TRAINING_OPTIMIZERS or zoo.missing_package(model):
                continue
            net = model.build(device).train()
            opt = zoo.training_optimizer(zoo.TRAINING_OPTIMIZERS[protocol], net.parameters())
            args, targets = model.batch(0, device)
            around = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if protocol == "autocast"
                      else contextlib.nullcontext())
            with around:
                report = capturability(net, model.loss(net), opt, *args, targets)
            stops = "; ".join(f"{b.kind}: {b.op} at {b.place}: {b.fix}" for b in report.blockers) or "nothing"
            lines.append(f"| {name} | {protocol} | {report.fraction:.1%} ({report.in_graph}/{report.ops} ops) | "
                         f"{stops.replace('|', '/')} |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def table(results: dict, rounds: int, steps: int) -> str:
    lines = [f"Machine: {machine()}. {rounds} rounds of {steps} consecutive AdamW steps per configuration, taking "
             "turns.", "",
             "| model | configuration | ms/step (median of rounds) | vs RO (min-max) | peak MiB (its own) | "
             "first 5 losses equal to eager (max abs diff) | graphs | first 5 steps, s | note |",
             "|---|---|---:|---:|---:|---|---:|---:|---|"]
    for name, res in results.items():
        for config, row in res["rows"].items():
            ms = f"{statistics.median(row['ms']):.3f}" if row["ms"] else "-"
            r = row.get("ratio")
            rtext = f"{r[0]:.3f}x ({r[1]:.3f}-{r[2]:.3f})" if r else "-"
            first = f"{row['first_s']:.1f}" if row.get("first_s") else "-"
            peak = f"{row['peak_mib']:,.0f}" if row.get("peak_mib") is not None else "-"
            lines.append(f"| {name} | {LABELS[config]} | {ms} | {rtext} | {peak} | {row.get('matches', '-')} | "
                         f"{row.get('graphs', '')} | {first} | {row['note']} |")
    lines.append("")
    for name, res in results.items():
        k, rep, ek = res.get("kernel_us"), res.get("replay_us"), res.get("eager_kernel_us")
        ms = res["rows"].get("whole step", {}).get("ms")
        if k:
            step_us = statistics.median(ms) * 1e3 if ms else float("nan")
            lines.append(f"- {name}: whole step's GPU kernel time (torch.profiler, sum of kernels) {k:.0f} µs/step; "
                         f"its ms/step is {step_us / k:.2f}x that; back-to-back replays take {rep:.0f} µs of GPU time "
                         f"per step (CUDA events); eager's kernels sum to {ek or float('nan'):.0f} µs/step.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser)
    parser.add_argument("--models", default="nanogpt,llama2")
    parser.add_argument("--pt2", action="store_true", help="add torch.compile of the whole step with compiled autograd")
    parser.add_argument("--configs", default="", help="only these configurations, comma-separated (eager always runs: "
                                                      "the losses are checked against it)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: the CPU stand-in, without inductor's configurations (checks the script only)")
    parser.add_argument("--out", help="also write the table into this Markdown file")
    parser.add_argument("--capturability", action="store_true",
                        help="instead of timing: the capturability report of every zoo training case")
    args = parser.parse_args()
    if args.capturability:
        text = zoo_capturability(args.device)
        print(text)
        write_markdown(args.out, "Whole-step capturability", text)
        return 0
    chosen = set(args.configs.split(",")) | {"eager"} if args.configs else set(CONFIGS)
    configs = [c for c in CONFIGS if c in chosen and (c != "pt2 whole step" or args.pt2)
               and not (args.device == "cpu" and c in CUDA_ONLY)]
    run_rows(args.models.split(","), lambda name: bench_model(name, args.rounds, args.steps, args.device, configs),
             str, lambda res: table(res, args.rounds, args.steps), args.out, "Whole-step capture",
             time_limit=args.time_limit, rest=("--models", str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
