"""Differential fuzzing: run many generated programs through thunder and thunder-nb, print a summary.

    python bench/fuzz.py --n 2000                          # CPU: regions run eagerly
    python bench/fuzz.py --n 2000 --emulate-capture        # CPU: the capture path, CPU stand-ins for graphs
    python bench/fuzz.py --n 100 --device cuda --capture   # GPU: real CUDA-graph capture
    python bench/fuzz.py --seed 1234 --n 1 --show          # replay one program, print it

Program number i is ``fuzzgen.generate(RandomChooser(i))`` (tests/fuzzgen.py), so every program
the summary counts can be replayed with ``--seed i --n 1 --show``. Each program runs through eager
PyTorch, plain ``thunder.jit``, thunder-nb's fixed and legacy transforms and thunder's stock
``CUDAGraphTransform``; `fuzzgen.judge` says which claims hold. Exit status 1 when any program
broke a claim (known bugs, listed in tests/test_fuzz_regressions.py, are counted apart).
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.filterwarnings("ignore")

import fuzzgen  # noqa: E402


def judge_one(args: tuple[int, str, bool | str]) -> fuzzgen.Outcome:
    """Generate program ``seed`` and judge it (one unit of work for a worker process)."""
    seed, device, capture = args
    program = fuzzgen.Program(f"# the generator crashed on program {seed}\n", ())
    try:
        program = fuzzgen.generate(fuzzgen.RandomChooser(seed))
        return fuzzgen.judge(program, device=device, capture=capture)
    except Exception as e:  # NOTE: a crash of the harness is a finding too, not the end of the run
        return fuzzgen.Outcome(program, capture=capture, problems=[f"the harness crashed: {type(e).__name__}: {e}"])


@dataclass
class Tally:
    """The figures of a run, summed over its programs."""

    tried: int = 0
    backward: int = 0
    discarded: Counter = field(default_factory=Counter)
    fixed_errors: int = 0
    fixed_mismatches: int = 0
    fixed_defects: int = 0  # programs with a defect in a fixed trace (known bugs left out)
    fixed_fallbacks: int = 0  # programs with a refused (documented) scalar hand-off
    legacy: Counter = field(default_factory=Counter)  # "failed", "predicted", "false negative", "false positive"
    legacy_failures: Counter = field(default_factory=Counter)  # failure kind -> programs
    legacy_compile_crash: int = 0
    stock_item: int = 0
    stock_reported: int = 0
    stock_disagree: int = 0
    stock_no_trace: int = 0
    stock_capture: Counter = field(default_factory=Counter)  # as legacy, for the stock transform with capture
    stock_crash: int = 0
    thunder_differs: int = 0
    known_bugs: Counter = field(default_factory=Counter)
    problems: list[tuple[int, fuzzgen.Outcome]] = field(default_factory=list)

    def add(self, seed: int, o: fuzzgen.Outcome) -> None:
        self.tried += 1
        self.backward += o.program.backward
        if o.discarded:
            self.discarded[o.discarded] += 1
            return
        self.fixed_errors += o.fixed_error is not None
        self.fixed_mismatches += any(p.startswith("fixed differs") for p in o.problems)
        self.fixed_defects += bool(o.fixed_defects)
        self.fixed_fallbacks += bool(o.fixed_fallbacks)
        failed = o.legacy_failure is not None
        if o.legacy_compile_crash:
            self.legacy_compile_crash += 1
        else:
            self.legacy.update({"failed": failed, "predicted": o.legacy_predicted,
                                "false negative": o.false_negative, "false positive": o.false_positive})
        if failed:
            self.legacy_failures[o.legacy_failure.split(":")[0] if not o.legacy_failure.startswith("wrong") else "wrong values"] += 1
        if o.stock_item_in_region is None:
            self.stock_no_trace += 1
        else:
            self.stock_item += o.stock_item_in_region
            self.stock_reported += bool(o.stock_host_sync_reported)
            self.stock_disagree += o.stock_item_in_region != o.stock_host_sync_reported
        if o.stock_transform_crash:
            self.stock_crash += 1
        elif o.stock_predicted is not None:
            stock_failed = o.stock_failure is not None
            self.stock_capture.update({"failed": stock_failed, "predicted": o.stock_predicted,
                                       "false negative": stock_failed and not o.stock_explained,
                                       "false positive": not stock_failed and o.stock_predicted})
        self.thunder_differs += o.thunder_differs
        self.known_bugs.update(o.known_bugs)
        if o.problems:
            self.problems.append((seed, o))

    def summary(self, *, first: int, device: str, capture: bool | str, seconds: float, jobs: int) -> str:
        """The summary, one figure per line."""
        import thunder
        import torch

        judged = self.tried - sum(self.discarded.values())
        pytorch = sum(n for k, n in self.discarded.items() if k.startswith("PyTorch"))
        thunder_rej = sum(n for k, n in self.discarded.items() if k.startswith("thunder"))
        kinds = ", ".join(f"{k.split(': ', 1)[1]} {n}" for k, n in self.discarded.most_common() if k.startswith("thunder"))
        pt_kinds = ", ".join(f"{k.split(': ', 1)[1]} {n}" for k, n in self.discarded.most_common() if k.startswith("PyTorch"))
        observed, predicted = self.legacy["failed"], self.legacy["predicted"]
        how = ", ".join(f"{k} {n}" for k, n in self.legacy_failures.most_common())
        mode = {True: "real CUDA-graph capture", False: "regions run eagerly (no capture)",
                "emulated": "emulated capture (capture path, CPU stand-ins for graphs)"}[capture]
        lines = [
            f"thunder-nb differential fuzz: programs {first}..{first + self.tried - 1}, device {device}, {mode}; "
            f"thunder {thunder.__version__}, torch {torch.__version__}, Python {platform.python_version()}",
            f"programs tried:                      {self.tried} ({self.tried - self.backward} forward only, "
            f"{self.backward} with backward)",
            f"discarded, thunder can't trace:      {thunder_rej} ({_pct(thunder_rej, self.tried)}){': ' + kinds if kinds else ''}",
            f"discarded, PyTorch rejects:          {pytorch} ({_pct(pytorch, self.tried)}){': ' + pt_kinds if pt_kinds else ''}",
            f"judged:                              {judged}",
            f"fixed: mismatches with eager:        {self.fixed_mismatches}",
            f"fixed: raised where thunder ran:     {self.fixed_errors}",
            f"fixed: defects in its traces:        {self.fixed_defects} programs "
            f"(refused scalar hand-offs, documented: {self.fixed_fallbacks} programs)",
            f"legacy failures observed/predicted:  {observed} / {predicted}{' (' + how + ')' if how else ''}",
            f"legacy false negatives:              {self.legacy['false negative']}",
            f"legacy false positives:              {self.legacy['false positive']}",
            f"legacy crashed while compiling:      {self.legacy_compile_crash} (thunder's dataflow fusion ordered a "
            f"region after the return; not judged)",
            f"stock: .item() inside a region:      {self.stock_item} programs; host-sync-in-region reported: "
            f"{self.stock_reported}; disagreements: {self.stock_disagree}; no trace: {self.stock_no_trace}",
        ]
        if capture:
            s = self.stock_capture
            lines.append(
                f"stock with capture: failed/predicted: {s['failed']} / {s['predicted']}; "
                f"false negatives {s['false negative']}, false positives {s['false positive']}; "
                f"thunder 0.2.6 asserted while compiling: {self.stock_crash}"
            )
        lines.append(f"thunder itself differs from eager:   {self.thunder_differs} programs (judged against plain thunder there)")
        if self.known_bugs:
            lines.append("known bugs (tests/test_fuzz_regressions.py):")
            lines += [f"  {n:5d}  {name}" for name, n in self.known_bugs.most_common()]
        else:
            lines.append("known bugs (tests/test_fuzz_regressions.py): none hit")
        lines.append(f"programs with problems:              {len(self.problems)}"
                     + (f" (seeds {', '.join(str(s) for s, _ in self.problems[:20])}{' ...' if len(self.problems) > 20 else ''})"
                        if self.problems else ""))
        lines.append(f"time:                                {seconds:.0f} s ({seconds / max(self.tried, 1):.2f} s per program, "
                     f"{jobs} job{'s' if jobs > 1 else ''})")
        return "\n".join(lines)


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="how many programs (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="number of the first program (default 0)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the inputs live")
    ap.add_argument("--capture", action="store_true", help="capture CUDA graphs for real (needs --device cuda)")
    ap.add_argument("--emulate-capture", action="store_true",
                    help="CPU: run the runners' capture path with CPU stand-ins for graphs (fuzzgen.emulated_capture)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--show", action="store_true", help="print every program that broke a claim or hit a known bug")
    ap.add_argument("--out", type=Path, help="also write the summary to this file")
    args = ap.parse_args(argv)
    if args.capture and args.device != "cuda":
        ap.error("--capture needs --device cuda")
    if args.emulate_capture and (args.capture or args.device != "cpu"):
        ap.error("--emulate-capture is for --device cpu without --capture")
    capture: bool | str = "emulated" if args.emulate_capture else args.capture
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: torch sees no CUDA device")

    work = [(s, args.device, capture) for s in range(args.seed, args.seed + args.n)]
    tally = Tally()
    start = time.perf_counter()
    if args.jobs > 1:
        # NOTE: spawn, not fork: a forked CUDA context is unusable, and thunder caches per process anyway
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            outcomes = pool.imap(judge_one, work, chunksize=4)
            _consume(outcomes, work, tally, args.show)
    else:
        _consume(map(judge_one, work), work, tally, args.show)
    text = tally.summary(first=args.seed, device=args.device, capture=capture,
                         seconds=time.perf_counter() - start, jobs=args.jobs)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if tally.problems else 0


def _consume(outcomes, work, tally: Tally, show: bool) -> None:
    for (seed, _, _), o in zip(work, outcomes):
        tally.add(seed, o)
        if o.problems or (show and (o.known_bugs or o.discarded)):
            print(f"--- program {seed}: {'; '.join(o.known_bugs) or o.discarded or 'PROBLEM'}{o.program!r}")
            for p in o.problems:
                print(f"  - {p}")
            sys.stdout.flush()
        if tally.tried % 100 == 0:
            print(f"... {tally.tried} programs", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
