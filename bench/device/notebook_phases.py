"""Where a teaching notebook's time goes, cell by cell and, inside a ``%%thunder_cudagraph`` cell, phase by phase.

Notebook 05's first magic cell took 341 s on an H100 (2026-12-06; 32 s on the CPU with the same 6-layer model): a
kernel run says only which cell. This runs the notebook's code cells in one IPython shell, as a kernel would, prints
each cell's seconds, each of the magic's progress messages with the seconds since the cell began (its phases:
tracing each side, running, timing), and every ``--stacks`` seconds the stack of every thread (``faulthandler``),
so that a phase that runs for minutes shows where. Its own run is cut short by ``--cells``.

    bash .gpu/on-device.sh python3 bench/device/notebook_phases.py notebooks/05_nanogpt_training.ipynb \\
        --cells 7 --stacks 30 > $OUT/phases.log 2>&1

On the CPU the notebook takes its CPU branch (a tiny model): ``--gpu-model`` replaces ``if device == "cuda":`` with
``if True:`` in the cells, so that the CPU traces the GPU's model.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebook", type=Path)
    p.add_argument("--cells", type=int, default=0, help="run the first N code cells (default: all)")
    p.add_argument("--stacks", type=float, default=0, help="dump every thread's stack every S seconds (0: never)")
    p.add_argument("--gpu-model", action="store_true", help='take the notebook\'s `if device == "cuda":` branches')
    args = p.parse_args()

    from IPython.testing.globalipapp import start_ipython

    from thunder_nb.notebook import progress

    cells = [c for c in json.loads(args.notebook.read_text())["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells][: args.cells or None]
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
    if args.stacks:
        faulthandler.dump_traceback_later(args.stacks, repeat=True, file=sys.stderr)
    total = time.perf_counter()
    for i, source in enumerate(sources, 1):
        began[0] = time.perf_counter()
        print(f"code cell {i}: {source.splitlines()[0][:100] if source else ''}", file=sys.stderr, flush=True)
        result = shell.run_cell(source, silent=True)
        error = result.error_in_exec or result.error_before_exec
        print(f"code cell {i}: {time.perf_counter() - began[0]:.1f} s"
              + (f", raised {type(error).__name__}: {error}" if error else ""), file=sys.stderr, flush=True)
    faulthandler.cancel_dump_traceback_later()
    print(f"{len(sources)} code cells: {time.perf_counter() - total:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
