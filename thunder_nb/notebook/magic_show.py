"""What the magic runs on what its cell resolved, and how it shows it: `compare` (the verdict, the toggle, the run)
or, with ``--whole-step``, `thunder_nb.step.compare_step` (its report, lines of the cell worded as the cell's)."""

from __future__ import annotations

import dataclasses
import linecache
import warnings
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from ..diagnosis import failures
from .magic_cell import MagicCell
from .progress import Progress

__all__ = ["compare_and_show", "whole_step_and_show"]


def compare_and_show(cell: MagicCell, args: Any, fn: Any, call_args: tuple, call_kwargs: dict, views: list[str],
                     executors: tuple[str, ...], progress: Progress, call: str | None = None) -> None:
    """Compare the original and the fixed transform on ``fn(*call_args, **call_kwargs)``; show the verdict, what to
    do next (``call``: the call as the user wrote it), the views asked for and the run; store the `Comparison` under
    ``-o NAME``.

    Raises:
        UsageError: `compare` refused the function or its inputs (`CompareError`), worded with the cell's lines.
    """
    from . import widget
    from .comparison import CompareError, compare

    try:
        comparison = compare(
            fn,
            call_args,
            call_kwargs,
            original=args.original,
            training=args.train,
            lr=args.lr,
            repeats=args.repeats,
            execute=not args.no_run,
            capture=args.capture,
            executors=executors,
            peers=args.peers,
            progress=progress,
        )
    except CompareError as e:
        progress.clear()
        raise UsageError(e.render(cell.where)) from None
    except BaseException:
        progress.clear()
        raise
    if args.output:
        cell.shell.user_ns[args.output] = comparison
    side_views = [v for v in views if v in widget.SIDE_VIEWS]
    if side_views:
        progress("drawing the views…")
        view = widget.comparison_toggle(comparison, side_views)
    progress.done({"text/plain": comparison.verdict(), "text/html": comparison.verdict_html()})
    model, optimizer = cell.training_names(comparison.trainable) if args.train else (None, None)
    names = dict(call=call, model=model, optimizer=optimizer, lr=args.lr)  # NOTE: the executors: the Comparison's
    display({"text/plain": comparison.next_step(**names), "text/html": comparison.next_html(**names)}, raw=True)
    if side_views:
        display(view)
    if "run" in views:
        display({"text/plain": comparison.run_text(), "text/html": comparison.run_html()}, raw=True)


def whole_step_and_show(cell: MagicCell, args: Any, model: Any, fn: Any, optimizer: Any, batch: tuple,
                        executors: tuple[str, ...], progress: Progress,
                        names: tuple[str, str, str] | None = None) -> None:
    """``--whole-step``: `thunder_nb.step.compare_step` on the user's objects; its report, with lines of this cell
    worded as the rest of the magic words them, and what to do next (``names``: the model's, the optimizer's and the
    call as the user wrote them); store the result under ``-o NAME``.

    Raises:
        UsageError: the loss function raised in eager PyTorch, or `compare_step` refused the arguments.
    """
    from ..step import compare_step

    try:
        with warnings.catch_warnings():
            # NOTE: thunder warns at its first import about an optional executor nobody asked for (as compare hides it)
            warnings.filterwarnings("ignore", message="transformer_engine module not found")
            result = compare_step(model, fn, optimizer, *batch, repeats=args.repeats, executors=executors,
                                  capture=args.capture, execute=not args.no_run,
                                  progress=progress)
    except Exception as e:
        progress.clear()
        where = failures.user_frame(e.__traceback__)
        if where is None and isinstance(e, ValueError):  # NOTE: compare_step's own check of the arguments
            raise UsageError(f"--whole-step: {e}") from None
        at = f" ({cell.where(where)})" if where is not None else ""
        name = getattr(fn, "__name__", "the loss function")
        raise UsageError(f"{name} raised {failures.error_line(e)} in eager PyTorch{at}; your model and optimizer "
                         "are as they were") from None
    blockers = tuple(dataclasses.replace(b, where=cell.where(failures.Where(b.filename, b.line, _source_line(b), "")))
                     if b.filename is not None and b.line is not None else b for b in result.report.blockers)
    result = dataclasses.replace(result, report=dataclasses.replace(result.report, blockers=blockers))
    if args.output:
        cell.shell.user_ns[args.output] = result
    progress.done({"text/plain": result.to_text(), "text/html": result._repr_html_()})
    if names is not None:
        model_name, optimizer_name, call = names
        shown = dict(model=model_name, optimizer=optimizer_name, call=call, executors=tuple(executors))
        display({"text/plain": result.next_step(**shown), "text/html": result.next_html(**shown)}, raw=True)


def interrupted(doing: str | None, whole_step: bool) -> str:
    """The one line a Ctrl-C during the magic leaves: what it was doing, and that the user's objects are as they
    were."""
    what = f" while {doing.rstrip('…').rstrip('.')}" if doing else " while the cell ran"
    kept = ("your model and optimizer are put back as they were" if whole_step
            else "your variables are as they were (each run worked on its own copies)")
    return f"interrupted (Ctrl-C){what}: nothing stored, {kept}"


def _source_line(blocker: Any) -> str:
    return linecache.getline(blocker.filename, blocker.line).strip()
