"""Differential fuzzing: run many generated programs through thunder and thunder-nb, print a summary.

    python bench/fuzz.py --n 1000 --jobs 2                  # CPU: regions run eagerly
    python bench/fuzz.py --n 1000 --jobs 2 --emulate-capture # CPU: the capture path, CPU stand-ins for graphs
    python bench/fuzz.py --n 200 --device cuda --capture     # GPU: real CUDA-graph capture
    python bench/fuzz.py --seed 1234 --n 1 --show            # replay one program, print it
    python bench/fuzz.py --n 200 --emulate-capture --collectives  # modules under thunder's ddp/fsdp, gloo, one rank

Program number i is ``generate(RandomChooser(i))`` (`thunder_nb.testing.fuzz`), so every program
the summary counts can be replayed with ``--seed i --n 1 --show`` (workers run with PYTHONHASHSEED=0,
as thunder's dataflow fusion orders some regions by string hashes). Each program goes through the
oracle's call protocol (three calls with fresh inputs, two parameter sets, two forwards before one
backward, every result kept; `thunder_nb.testing.fuzz.calls`) in eager PyTorch, plain
``thunder.jit``, thunder-nb's fixed and legacy transforms and thunder's own ``CUDAGraphTransform``;
`thunder_nb.testing.fuzz.judge` says which claims hold. Exit status 1 when any program broke a
claim (known bugs, listed in tests/test_fuzz_regressions.py, are counted apart). With ``--collectives`` program i
is ``generate(RandomChooser(i), collectives=True)``: a module trained under ``thunder.distributed.ddp`` or ``fsdp`` in
a gloo process group of one rank made in the worker (`thunder_nb.testing.fuzz.collectives`; CPU only). The package is
imported as installed: from a checkout, run with ``PYTHONPATH=.`` to be sure it is this one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

warnings.filterwarnings("ignore")

from thunder_nb.testing import fuzz  # noqa: E402
from thunder_nb.testing.modes import mode_name  # noqa: E402


def judge_one(args: tuple[int, str, bool | str, bool]) -> fuzz.ProgramOutcome:
    """Generate program ``seed`` (with collectives: a module program) and judge it (one unit of work for a worker
    process)."""
    seed, device, capture, collectives = args
    program = fuzz.Program(f"# the generator crashed on program {seed}\n", ())
    try:
        program = fuzz.generate(fuzz.RandomChooser(seed), collectives=collectives)
        return fuzz.judge(program, device=device, capture=capture)
    except Exception as e:  # NOTE: a crash of the harness is a finding too, not the end of the run
        return fuzz.ProgramOutcome(program, capture=capture, problems=[f"the harness crashed: {type(e).__name__}: {e}"])


@dataclass
class Side:
    """The figures of one transform the checker judges (legacy or stock), summed over programs."""

    judged: int = 0
    failed: int = 0
    must: int = 0  # programs with a must-show error defect
    false_negatives: int = 0
    false_positives: int = 0
    before_run: int = 0  # failures explained by rules found in the traces before the first call
    compile_crash: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)  # failure kind -> programs
    may: Counter = field(default_factory=Counter)  # may-show rule -> programs reporting it
    may_shown: Counter = field(default_factory=Counter)  # ... in which a failure kind it can cause showed

    def add(self, v: fuzz.Verdict) -> None:
        if v.compile_crash:
            self.compile_crash[v.compile_crash] += 1
            return
        if v.prediction is None:
            return
        p = v.prediction
        self.judged += 1
        self.failed += bool(p.failed)
        self.must += bool(p.must)
        self.false_negatives += p.false_negative
        self.false_positives += p.false_positive
        self.before_run += bool(p.failed) and v.explained_before_run
        self.kinds.update(p.failed)
        self.may.update(p.may)
        self.may_shown.update(p.may_shown)

    def lines(self, name: str) -> list[str]:
        kinds = ", ".join(f"{k} {n}" for k, n in self.kinds.most_common())
        may = ", ".join(f"{r} {self.may_shown[r]}/{n}" for r, n in sorted(self.may.items()))
        crash = ", ".join(f"{k} {n}" for k, n in self.compile_crash.most_common())
        return [
            f"{name}: judged {self.judged}; failed {self.failed} ({kinds or 'none'})",
            f"{name}: failures explained by the checker's errors: {self.failed - self.false_negatives} of "
            f"{self.failed} ({self.before_run} by rules found in the traces before the first call)",
            f"{name}: must-show errors reported: {self.must} programs; false negatives {self.false_negatives}, "
            f"false positives {self.false_positives}",
            f"{name}: may-show errors, programs where a failure they can cause showed / reporting them: {may or 'none'}",
            f"{name}: thunder raised while compiling (not judged): {sum(self.compile_crash.values())}"
            + (f" ({crash})" if crash else ""),
        ]


@dataclass
class Tally:
    """The figures of a run, summed over its programs."""

    tried: int = 0
    backward: int = 0
    parameters: int = 0
    discarded: Counter = field(default_factory=Counter)
    fixed_errors: int = 0
    fixed_mismatches: int = 0
    fixed_kinds: Counter = field(default_factory=Counter)
    fixed_defects: int = 0  # programs with a defect in a fixed trace (known bugs left out)
    fixed_fallbacks: int = 0  # programs with a refused (documented) scalar hand-off
    fixed_replayed: int = 0  # programs whose fixed regions replayed a graph
    fixed_second_instance: int = 0
    fixed_per_address: int = 0
    fixed_held: int = 0
    legacy: Side = field(default_factory=Side)
    stock: Side = field(default_factory=Side)
    stock_item: int = 0
    stock_reported: int = 0
    stock_disagree: int = 0
    stock_no_trace: int = 0
    thunder_differs: int = 0
    known_bugs: Counter = field(default_factory=Counter)
    problems: list[tuple[int, fuzz.ProgramOutcome]] = field(default_factory=list)
    thunder_wrong: list[int] = field(default_factory=list)  # programs where plain thunder itself is wrong
    wrong_silent: list[int] = field(default_factory=list)  # ... and thunder-nb's run gave no InPlaceGradientWarning
    warned_right: list[int] = field(default_factory=list)  # an InPlaceGradientWarning where thunder agreed with eager

    def add(self, seed: int, o: fuzz.ProgramOutcome) -> None:
        self.tried += 1
        self.backward += o.program.backward
        self.parameters += o.program.has_parameters
        if o.problems:
            self.problems.append((seed, o))
        if o.discarded:
            self.discarded[o.discarded] += 1
            if o.discarded.startswith("thunder wrong"):
                self.thunder_wrong.append(seed)
                if not o.fixed_warned:
                    self.wrong_silent.append(seed)
            return
        if o.fixed_warned and not o.thunder_differs:
            self.warned_right.append(seed)
        self.fixed_errors += o.fixed_error is not None
        mismatch = any(p.startswith("fixed differs") for p in o.problems)
        self.fixed_mismatches += mismatch
        if mismatch and o.fixed_mismatch:
            self.fixed_kinds[o.fixed_mismatch.split(":", 1)[0]] += 1
        self.fixed_defects += bool(o.fixed_defects)
        self.fixed_fallbacks += bool(o.fixed_fallbacks)
        s = o.fixed_stats
        self.fixed_replayed += s.replays > 0
        self.fixed_second_instance += s.most_instances > 1
        self.fixed_per_address += s.most_address_keys > 1
        self.fixed_held += s.held_calls > 0
        self.legacy.add(o.legacy)
        self.stock.add(o.stock)
        if o.stock_item_in_region is None:
            self.stock_no_trace += 1
        else:
            self.stock_item += o.stock_item_in_region
            self.stock_reported += bool(o.stock_host_sync_reported)
            self.stock_disagree += o.stock_item_in_region != o.stock_host_sync_reported
        self.thunder_differs += o.thunder_differs
        self.known_bugs.update(o.known_bugs)

    def summary(self, *, first: int, device: str, capture: bool | str, seconds: float, jobs: int,
                collectives: bool = False) -> str:
        """The summary, one figure per line."""
        import thunder
        import torch

        import thunder_nb

        judged = self.tried - sum(self.discarded.values())
        pytorch = sum(n for k, n in self.discarded.items() if k.startswith("PyTorch"))
        thunder_rej = sum(n for k, n in self.discarded.items() if k.startswith("thunder rejects"))
        kinds = ", ".join(f"{k.split(': ', 1)[1]} {n}" for k, n in self.discarded.most_common()
                          if k.startswith("thunder rejects"))
        wrong = len(self.thunder_wrong)
        wrong_kinds = ", ".join(f"{k.split(': ', 1)[1]} {n}" for k, n in self.discarded.most_common()
                                if k.startswith("thunder wrong"))
        wrong_seeds = ", ".join(map(str, sorted(self.thunder_wrong)[:20])) + (", ..." if wrong > 20 else "")
        pt_kinds = ", ".join(f"{k.split(': ', 1)[1]} {n}" for k, n in self.discarded.most_common() if k.startswith("PyTorch"))
        mode = {"real": "real CUDA-graph capture", "eager": "regions run eagerly (no capture)",
                "emulated": "emulated capture (capture path, CPU stand-ins for graphs)"}[mode_name(capture)]
        fixed_kinds = ", ".join(f"{k} {n}" for k, n in self.fixed_kinds.most_common())
        lines = [
            f"thunder-nb differential fuzz: programs {first}..{first + self.tried - 1}, device {device}, {mode}; "
            f"thunder {thunder.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
            f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED')}; thunder_nb from {Path(thunder_nb.__file__).parent}",
            f"calls per program:                   {len(fuzz.PROTOCOL)} with fresh inputs, "
            + ("the module's parameters (under thunder's ddp or fsdp, a gloo world of one rank), " if collectives
               else "2 parameter sets, ")
            + "two forwards before one backward, every result kept",
            f"programs tried:                      {self.tried} ({self.tried - self.backward} forward only, "
            f"{self.backward} with backward; {self.parameters} with nn.Parameter inputs)",
            f"discarded, thunder can't trace:      {thunder_rej} ({_pct(thunder_rej, self.tried)}){': ' + kinds if kinds else ''}",
            f"discarded, PyTorch rejects:          {pytorch} ({_pct(pytorch, self.tried)}){': ' + pt_kinds if pt_kinds else ''}",
            f"discarded, thunder itself wrong:     {wrong} ({_pct(wrong, self.tried)})"
            + (f": {wrong_kinds}; programs {wrong_seeds} (thunder-nb inherits these: replay with --seed N --show); "
               f"warned of by thunder-nb (InPlaceGradientWarning) {wrong - len(self.wrong_silent)}, silent "
               f"{len(self.wrong_silent)}" + (f": programs {', '.join(map(str, sorted(self.wrong_silent)[:20]))}"
                                              if self.wrong_silent else "") if wrong else ""),
            f"judged:                              {judged}",
            f"fixed: mismatches with eager:        {self.fixed_mismatches}{' (' + fixed_kinds + ')' if fixed_kinds else ''}",
            f"fixed: raised where thunder ran:     {self.fixed_errors}",
            f"fixed: defects in its traces:        {self.fixed_defects} programs "
            f"(refused scalar hand-offs, documented: {self.fixed_fallbacks} programs)",
            f"fixed: graphs replayed in {self.fixed_replayed} programs; a second instance while saved tensors were "
            f"held in {self.fixed_second_instance}; a graph per parameter set in {self.fixed_per_address}; "
            f"calls without a graph (all instances held) in {self.fixed_held}",
            *self.legacy.lines("legacy"),
            *self.stock.lines("stock"),
            f"stock: .item() inside a region:      {self.stock_item} programs; host-sync-in-region reported: "
            f"{self.stock_reported}; disagreements: {self.stock_disagree}; no trace: {self.stock_no_trace}",
            f"thunder itself differs from eager:   {self.thunder_differs} programs (judged against plain thunder there)",
            f"warned where thunder agreed:         {len(self.warned_right)} programs (an InPlaceGradientWarning where "
            f"plain thunder's values and gradients equal eager's)"
            + (f": {', '.join(map(str, sorted(self.warned_right)[:20]))}" if self.warned_right else ""),
        ]
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
                    help="CPU: run the runners' capture path with CPU stand-ins for graphs "
                         "(thunder_nb.testing.emulated_capture)")
    ap.add_argument("--collectives", action="store_true",
                    help="programs with collectives: modules under thunder's ddp or fsdp, a gloo world of one rank "
                         "(--device cpu)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1; spawned with PYTHONHASHSEED=0)")
    ap.add_argument("--show", action="store_true", help="print every program that broke a claim or hit a known bug")
    ap.add_argument("--out", type=Path, help="also write the summary to this file (markdown: date, machine, command)")
    args = ap.parse_args(argv)
    if args.capture and args.device != "cuda":
        ap.error("--capture needs --device cuda")
    if args.emulate_capture and (args.capture or args.device != "cpu"):
        ap.error("--emulate-capture is for --device cpu without --capture")
    if args.collectives and args.device != "cpu":
        ap.error("--collectives runs gloo's collectives on the CPU: --device cpu")
    capture: bool | str = "emulated" if args.emulate_capture else args.capture
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: torch sees no CUDA device")

    work = [(s, args.device, capture, args.collectives) for s in range(args.seed, args.seed + args.n)]
    tally = Tally()
    start = time.perf_counter()
    # NOTE: thunder's dataflow fusion orders some regions by string hashes, so a program's traces
    # depend on the hash seed: workers run with a fixed one (unless PYTHONHASHSEED says otherwise),
    # which makes program i the same run every time. Spawn, not fork: a forked CUDA context is unusable.
    os.environ.setdefault("PYTHONHASHSEED", "0")
    with multiprocessing.get_context("spawn").Pool(max(args.jobs, 1)) as pool:
        _consume(pool.imap(judge_one, work, chunksize=4 if args.jobs > 1 else 1), work, tally, args.show)
    text = tally.summary(first=args.seed, device=args.device, capture=capture,
                         seconds=time.perf_counter() - start, jobs=args.jobs, collectives=args.collectives)
    print(text)
    if args.out:
        args.out.write_text(_markdown(text, argv if argv is not None else sys.argv[1:], args.device, capture))
    return 1 if tally.problems else 0


def _markdown(summary: str, argv: list[str], device: str, capture: bool | str) -> str:
    """The summary as a results file: a title with the date and the machine, the command, the figures."""
    import datetime
    import os

    import torch

    if device == "cuda":
        machine = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    else:
        machine = f"{os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}), no GPU"
    mode = {"real": "real CUDA-graph capture", "eager": "regions run eagerly",
            "emulated": "emulated capture"}[mode_name(capture)]
    where = _code_version()
    return (f"# Differential fuzzing, {mode}, {datetime.date.today().isoformat()}, {machine}\n\n"
            f"{where}Command: `python bench/fuzz.py {' '.join(argv)}`\n\n```\n{summary}\n```\n")


def _code_version() -> str:
    """Which code ran: the commit where git says the tree is clean, and always a hash of thunder_nb's sources.

    The GPU machine's copy of the tree can carry a stale git directory, so the commit alone may be wrong.
    """
    import hashlib

    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted((root / "thunder_nb").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    sources = f"thunder_nb sources sha256 {digest.hexdigest()[:12]}"
    try:
        def git(*a: str) -> str:
            return subprocess.run(["git", *a], capture_output=True, text=True, cwd=root, check=True).stdout.strip()

        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--", "thunder_nb", "bench")
    except (OSError, subprocess.CalledProcessError):
        return f"Code: {sources}. "  # NOTE: a copy of the tree without its git directory
    return f"Code at commit {commit}{' with local changes' if changed else ''} ({sources}). "


def _consume(outcomes, work, tally: Tally, show: bool) -> None:
    for (seed, *_), o in zip(work, outcomes):
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
