"""``python -m thunder_nb``: run notebooks in a real kernel and export them as standalone pages.

The work is `thunder_nb.notebook.export`'s.

    python -m thunder_nb example [--out DIR]                 notebook 01: executed .ipynb + standalone .html
    python -m thunder_nb notebooks [--out DIR | --in-place] [NAME ...]
                                                             every notebook (or those named); exit 1 if a cell raised
    python -m thunder_nb export NOTEBOOK.ipynb [--out DIR] [--no-execute]
                                                             your notebook as standalone .html; exit 1 if a cell raised
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    # NOTE: the docstring's first line is one whole sentence
    p = argparse.ArgumentParser(prog="python -m thunder_nb", description=__doc__.splitlines()[0].split(": ", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ex = sub.add_parser(
        "example",
        help="run notebooks/01_del_bug.ipynb; write it executed and as a standalone HTML page",
        description="Run notebooks/01_del_bug.ipynb in a fresh kernel; write the executed notebook and an HTML page "
        "whose original/fixed toggle works offline (no kernel, no network).",
    )
    ex.add_argument("--out", metavar="DIR", type=Path, default=Path("out"), help="output folder (default: out/)")
    nbs = sub.add_parser(
        "notebooks",
        help="run every notebook in notebooks/; write them executed (and as HTML pages)",
        description="Run every notebook in notebooks/ in a fresh kernel each. Exit status 1 if any cell raised.",
    )
    where = nbs.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR", type=Path, default=Path("out"), help="output folder (default: out/)")
    where.add_argument(
        "--in-place",
        action="store_true",
        help="write the executed notebooks (outputs and widget state) back into notebooks/ instead; "
        "a notebook in which a cell raised is left as it was",
    )
    nbs.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="only these notebooks, in this order (a file name or its start, e.g. 05); default: every one, in name "
        "order. A GPU machine that lends a command ten minutes runs them one or two at a time",
    )
    exp = sub.add_parser(
        "export",
        help="run a notebook of yours; write it as a standalone HTML page whose widgets work offline",
        description="Run NOTEBOOK in a fresh kernel (in its own folder) and write NOTEBOOK.html next to it, or in "
        "--out DIR: one page that needs no kernel and no network, with the %%thunder_cudagraph toggles working. "
        "The notebook file itself is not changed. Exit status 1 if a cell raised (the page is written all the same).",
    )
    exp.add_argument("notebook", metavar="NOTEBOOK.ipynb", type=Path, help="the notebook to export")
    exp.add_argument("--out", metavar="DIR", type=Path, help="output folder (default: the notebook's folder)")
    exp.add_argument(
        "--no-execute",
        action="store_true",
        help="export the outputs saved in the notebook instead of running it (its widgets show only if it was "
        "saved with its widget state)",
    )
    for sp in (ex, nbs, exp):
        sp.add_argument("--timeout", type=int, default=600, metavar="S", help="seconds one cell may run (default 600)")
    return p


def _run(path: Path, timeout: int):
    """Run the notebook at ``path``, saying each code cell as it ends; (the executed notebook, its errors), or (None,
    [why]) where the kernel died or a cell ran past ``timeout`` (nothing of the run is kept then)."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    from .notebook import export

    print(f"thunder-nb: running {path.name} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    done = [0]

    def progress(number: int, count: int, seconds: float) -> None:
        done[0] = number
        print(f"thunder-nb: {path.name}: code cell {number} of {count} done ({seconds:.1f} s)", file=sys.stderr,
              flush=True)

    try:
        nb = export.execute_notebook(path, timeout=timeout, progress=progress)
    except (DeadKernelError, CellTimeoutError) as e:
        what = ("the kernel died" if isinstance(e, DeadKernelError)
                else f"a cell ran past --timeout {timeout} s")
        why = f"{what} in code cell {done[0] + 1}, after {time.perf_counter() - t0:.1f} s: nothing of this run is kept"
        print(f"thunder-nb: {path.name}: {why}", file=sys.stderr, flush=True)
        return None, [why]
    errors = export.error_outputs(nb)
    status = "ok" if not errors else f"{len(errors)} error(s)"
    print(f"thunder-nb: {path.name}: {status} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    for e in errors:
        print(f"thunder-nb: {path.name}: {e}", file=sys.stderr)
    return nb, errors


def _export(nb, dest: Path) -> Path:
    from .notebook import export

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", export.OfflineWidgetWarning)
        page = export.export_html(nb, dest)
    for w in caught:
        print(f"thunder-nb: warning: {w.message}", file=sys.stderr)
    return page


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
    try:
        import nbclient  # noqa: F401
        import nbconvert  # noqa: F401
        import nbformat
    except ImportError as e:
        print(f"thunder-nb: {e.name} is missing: install the test extra (pip install -e '.[test]')", file=sys.stderr)
        return 2
    from .notebook import export

    if args.command == "export":
        return _export_one(args)
    try:
        folder = export.find_notebooks()
    except FileNotFoundError as e:
        print(f"thunder-nb: {e}", file=sys.stderr)
        return 2

    if args.command == "example":
        path = folder / export.EXAMPLE
        if not path.is_file():
            print(f"thunder-nb: the example notebook {path} is missing", file=sys.stderr)
            return 2
        nb, errors = _run(path, args.timeout)
        if nb is None:
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        executed = args.out / path.name
        nbformat.write(nb, executed)
        page = _export(nb, args.out / path.with_suffix(".html").name)
        print(f"executed notebook: {executed.resolve()}")
        print(f"HTML page:         {page.resolve()}  (open it in a browser; no kernel or network needed)")
        return 1 if errors else 0

    failed = []
    every = sorted(folder.glob("*.ipynb"))
    paths = every
    if args.names:
        paths = []
        for name in (Path(n).name for n in args.names):  # NOTE: notebooks/05_x.ipynb, as tab completion gives it
            found = [p for p in every if p.name in (name, name + ".ipynb")] or [
                p for p in every if p.name.startswith(name)]
            if len(found) != 1:
                print(f"thunder-nb: {name!r} names {len(found)} of the notebooks in {folder}: "
                      f"{', '.join(p.name for p in every)}", file=sys.stderr)
                return 2
            paths.append(found[0])
        paths = list(dict.fromkeys(paths))  # NOTE: each once, in the order first named
    for path in paths:
        nb, errors = _run(path, args.timeout)
        if errors:
            failed.append(path.name)
        if nb is None:
            continue
        if args.in_place:
            if not errors:
                nbformat.write(nb, path)
                print(f"updated: {path}")
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, args.out / path.name)
        page = _export(nb, args.out / path.with_suffix(".html").name)
        print(f"{args.out / path.name}  {page}")
    if failed:
        print(f"thunder-nb: failed (a cell raised, or the run stopped): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _export_one(args: argparse.Namespace) -> int:
    """``export NOTEBOOK.ipynb``: run it (unless --no-execute) and write its standalone page."""
    import nbformat

    from .notebook import export

    path: Path = args.notebook
    if not path.is_file():
        print(f"thunder-nb: no such notebook: {path}", file=sys.stderr)
        return 2
    try:
        stored = nbformat.read(path, as_version=4)
    except Exception as e:  # NOTE: nbformat raises several kinds for a file that is not a notebook
        print(f"thunder-nb: {path} is not a Jupyter notebook ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    if args.no_execute:
        nb, errors = stored, export.error_outputs(stored)
        missing = export.widget_views_without_state(nb)
        if missing:
            print(
                f"thunder-nb: warning: {path.name} has {missing} widget output(s) with no saved widget state, so the "
                "page cannot draw them: export it without --no-execute, or save it in Jupyter with "
                "Settings > Save Widget State Automatically turned on",
                file=sys.stderr,
            )
    else:
        nb, errors = _run(path, args.timeout)
        if nb is None:
            return 1
    dest = (args.out if args.out is not None else path.parent) / path.with_suffix(".html").name
    page = _export(nb, dest)
    print(f"HTML page: {page.resolve()}  (open it in a browser; no kernel or network needed)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
