"""The magic line: split into options and the call, and the options checked where argparse cannot check them."""

from __future__ import annotations

import ast
import re
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from ..cudagraph.capture import Capture, parse_capture, resolve
from .options import MAGIC_WORDS, check_run, resolve_executors

__all__ = ["EXAMPLE", "DEFAULT_VIEWS", "parse_line", "parse_call", "check_arguments", "check_whole_step",
           "check_executors"]

#: The most calls ``--repeats`` times per version: what a notebook's cell waits for stays bounded.
MAX_REPEATS = 10_000

#: How a magic line is written, for messages.
EXAMPLE = "%%thunder_cudagraph f(x)"

#: ``--views`` when it is not given: every view.
DEFAULT_VIEWS = ",".join(("diagram", "lifetimes", "source", "run"))


def parse_line(magic: Any, line: str) -> tuple[Any, str]:
    """Split the magic line into parsed options and the call's source text.

    The call is the first stretch of the line, from a word boundary to the end, that is a Python
    expression; what comes before it must be options. (Splitting the call into shell words would
    break string arguments and read ``-1`` as an option.)

    Args:
        magic: the magic's method, whose ``magic_arguments`` declarations parse the options.
        line: the magic line, without ``%%thunder_cudagraph``.
    """
    for m in re.finditer(r"\S+", line):
        tail = line[m.start():].strip()
        if tail.startswith("-"):
            continue
        try:
            ast.parse(tail, mode="eval")
        except SyntaxError:
            continue
        args = parse_argstring(magic, line[: m.start()])
        if args.call:
            raise UsageError(f"unexpected words before the call: {' '.join(args.call)} (write it like {EXAMPLE})")
        return args, tail
    args = parse_argstring(magic, line)
    if args.call:
        raise UsageError(f"the call is not a Python expression: {' '.join(args.call)} (write it like {EXAMPLE})")
    raise UsageError(f"missing call: write the call to compile on the magic line, e.g. {EXAMPLE}")


def parse_call(text: str) -> ast.Call:
    """The call on the magic line, parsed.

    Raises:
        UsageError: the expression is not a call.
    """
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call):
        raise UsageError(
            f"the magic line needs a call like f(x), not {text!r} (options go before the call: {EXAMPLE})"
        )
    return node


def check_arguments(args: Any) -> list[str]:
    """Check the options that argparse cannot; return the views asked for. The run's options are checked as `compare`
    checks them (`options.check_run`, in the magic's words). ``args.capture`` becomes the `Capture` its word stands for
    (parsed here once: what the magic calls compares members).

    Raises:
        UsageError: an option's value is out of range, ``--lr`` without ``--train``, or ``--peers`` with ``--no-run``.
    """
    from . import widget

    args.capture = parse_capture(args.capture)  # NOTE: argparse took only the magic's words (auto, on, off)
    try:
        views = widget.parse_views(args.views)
        check_run(args.repeats, args.train, args.lr, args.peers, not args.no_run, words=MAGIC_WORDS)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.repeats > MAX_REPEATS:
        raise UsageError(f"--repeats must be at most {MAX_REPEATS}, not {args.repeats} (each version runs that many "
                         "calls in the notebook's kernel; a median and its spread settle long before)")
    if args.output is not None and not args.output.isidentifier():
        raise UsageError(f"-o needs a Python name, not {args.output!r}")
    return views


def check_whole_step(args: Any) -> tuple[str, str]:
    """The two names of ``--whole-step MODEL,OPTIMIZER``, and the options it cannot take, checked before the cell runs.

    Raises:
        UsageError: not two Python expressions, an option that belongs to the comparison of transforms, ``--capture
            off``, or ``--capture on`` without a GPU.
    """
    example = "--whole-step model,opt loss_fn(xb, yb)"
    parts = [p.strip() for p in args.whole_step.split(",")]
    if len(parts) != 2 or not all(parts):
        hint = " (no space after the comma)" if args.whole_step.endswith(",") else ""
        raise UsageError(f"--whole-step needs MODEL,OPTIMIZER, the names of your nn.Module and your optimizer, not "
                         f"{args.whole_step!r}{hint}: write it like {example}")
    for part in parts:
        try:
            ast.parse(part, mode="eval")
        except SyntaxError:
            raise UsageError(f"--whole-step: {part!r} is not a Python name or expression (write it like "
                             f"{example})") from None
    other = [name for name, given in (("--train", args.train), ("--lr", args.lr is not None), ("--peers", args.peers),
                                      ("--original", args.original != "stock"),
                                      ("--views", args.views != DEFAULT_VIEWS)) if given]
    if other:
        raise UsageError(f"--whole-step does not take {', '.join(other)}: it trains the step itself, and shows its "
                         "capturability report and its run against eager PyTorch")
    if args.capture is Capture.OFF:  # NOTE: worded in the magic's words: argparse took only auto, on and off
        raise UsageError("--whole-step records the step as one graph: not with --capture off (auto or on)")
    if args.capture is Capture.CUDA:
        import torch

        try:
            resolve(args.capture, "cuda" if torch.cuda.is_available() else None, auto=Capture.EMULATED)
        except ValueError as e:
            raise UsageError(f"--whole-step: {e}") from None
    return parts[0], parts[1]


def check_executors(text: str) -> tuple[str, ...]:
    """The ``--executors`` names, resolved before the cell runs as `compare` resolves them
    (`options.resolve_executors`).

    Raises:
        UsageError: an unknown name, or one thunder cannot use here.
    """
    try:
        return resolve_executors([n.strip() for n in text.split(",") if n.strip()])
    except ValueError as e:
        raise UsageError(str(e)) from None
