"""Where a teaching notebook's time goes, cell by cell and, inside a ``%%thunder_cudagraph`` cell, phase by phase.

Notebook 05's first magic cell took 341 s on an H100 (2026-12-06; 32 s on the CPU with the same 6-layer model): a kernel
run says only which cell (this script found it in Graphviz's ``dot``: bench/results/2026-12-06-ddp-notebook05-h100.md).
It runs the notebook's code cells in one IPython shell, as a kernel would, prints each cell's seconds, each of the
magic's progress messages with the seconds since the cell began (its phases: tracing each side, running, timing), and,
with ``--sample``, where the main thread spent each cell: its stack read every S seconds (``sys._current_frames``, under
the GIL: ``faulthandler``'s dumps from a watchdog thread crashed the process on the H100), each function counted once
per sample it was on the stack, the most frequent printed after the cell; with ``--dot-log``, each drawing's DOT source
and seconds. ``--cells`` cuts the run short; ``--skip`` leaves out cells the later ones do not need.

    bash .gpu/on-device.sh python3 bench/device/notebook_phases.py notebooks/05_nanogpt_training.ipynb \\
        --cells 7 --skip 4,5 --sample 0.5 --dot-log /tmp/dot > $OUT/phases.log 2>&1

On the CPU the notebook takes its CPU branch (a tiny model): ``--gpu-model`` replaces ``if device == "cuda":`` with
``if True:`` in the cells, so that the CPU traces the GPU's model.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time
from pathlib import Path


class Sampler:
    """Reads the main thread's stack every ``every`` seconds; ``top()`` gives the functions seen most often."""

    def __init__(self, every: float) -> None:
        self.every, self.main = every, threading.main_thread().ident
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self.every)
            frame = sys._current_frames().get(self.main)
            seen = set()
            while frame is not None:
                code = frame.f_code
                seen.add(f"{code.co_name} ({code.co_filename.rsplit('site-packages/', 1)[-1]}:{code.co_firstlineno})")
                frame = frame.f_back
            self.counts.update(seen)
            self.samples += 1

    def top(self, n: int = 45) -> str:
        counts, samples = self.counts, max(self.samples, 1)
        self.counts, self.samples = collections.Counter(), 0
        return "\n".join(f"    {c / samples:6.1%}  {name}" for name, c in counts.most_common(n))


def log_dot(folder: Path, limit: float) -> None:
    """Each diagram the magic draws: its DOT source written to ``folder`` before ``dot`` runs, its seconds printed, and
    whether ``dot`` was stopped (`thunder_nb.render.backend.DOT_SECONDS`, set to ``limit`` where given)."""
    from thunder_nb.render import backend, html_diagram

    folder.mkdir(parents=True, exist_ok=True)
    if limit:
        backend.DOT_SECONDS = limit
    drawn, n = html_diagram.svg, [0]

    def timed(graph, **how):
        n[0] += 1
        (folder / f"{n[0]:02d}.dot").write_text(graph.source)
        print(f"    dot {n[0]:02d}: {len(graph.source)} bytes …", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            return drawn(graph, **how)
        except backend.DrawingTooSlow:
            print(f"    dot {n[0]:02d}: stopped", file=sys.stderr, flush=True)
            raise
        finally:
            print(f"    dot {n[0]:02d}: {time.perf_counter() - t:.2f} s", file=sys.stderr, flush=True)

    html_diagram.svg = timed  # NOTE: html_diagram calls it by this name


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebook", type=Path)
    p.add_argument("--cells", type=int, default=0, help="run the first N code cells (default: all)")
    p.add_argument("--skip", default="", help="code cells (from 1) not to run, comma-separated")
    p.add_argument("--sample", type=float, default=0, help="read the main thread's stack every S seconds (0: never)")
    p.add_argument("--dot-log", type=Path, help="write each diagram's DOT source here (NN.dot) and time its drawing")
    p.add_argument("--dot-limit", type=float, default=0,
                   help="with --dot-log: stop a dot after S seconds (default: thunder-nb's limit)")
    p.add_argument("--gpu-model", action="store_true", help='take the notebook\'s `if device == "cuda":` branches')
    args = p.parse_args()

    from IPython.testing.globalipapp import start_ipython

    from thunder_nb.notebook import progress

    cells = [c for c in json.loads(args.notebook.read_text())["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells][: args.cells or None]
    skipped = {int(n) for n in args.skip.split(",") if n}
    if args.gpu_model:
        sources = [s.replace('if device == "cuda":', "if True:") for s in sources]
    os.chdir(args.notebook.parent)
    shell = start_ipython()
    began = [time.perf_counter()]
    shown = progress.Progress.__call__

    def timed(self, message: str) -> None:
        print(f"    {time.perf_counter() - began[0]:7.1f} s  {message}", file=sys.stderr, flush=True)
        shown(self, message)

    progress.Progress.__call__ = timed  # NOTE: the magic's progress line, with the time it was shown
    sampler = Sampler(args.sample) if args.sample else None
    if args.dot_log:
        log_dot(args.dot_log, args.dot_limit)
    total = time.perf_counter()
    for i, source in enumerate(sources, 1):
        if i in skipped:
            continue
        began[0] = time.perf_counter()
        if sampler:
            sampler.top()  # forget what came before this cell
        print(f"code cell {i}: {source.splitlines()[0][:100] if source else ''}", file=sys.stderr, flush=True)
        result = shell.run_cell(source, silent=True)
        error = result.error_in_exec or result.error_before_exec
        print(f"code cell {i}: {time.perf_counter() - began[0]:.1f} s"
              + (f", raised {type(error).__name__}: {error}" if error else ""), file=sys.stderr, flush=True)
        if sampler:
            print(f"  where the main thread was (share of {sampler.samples} samples):\n{sampler.top()}",
                  file=sys.stderr, flush=True)
    print(f"{len(sources)} code cells: {time.perf_counter() - total:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
