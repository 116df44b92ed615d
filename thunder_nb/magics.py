"""``%%thunder_cudagraph``: run a cell, then compare the original and fixed CUDA-graph transform on a call."""

from __future__ import annotations

import argparse
import ast
import copy
import inspect
import re
import textwrap
from collections.abc import Iterable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicHelpFormatter, argument, magic_arguments

from .cudagraph.capture import CAPTURE_WORDS
from .notebook import magic_line, magic_show
from .notebook.magic_cell import MagicCell
from .notebook.progress import Progress, addressed_warnings, quiet_proxies

__all__ = ["ThunderCUDAGraphMagics", "CAPTURE_CHOICES", "options_markdown"]

#: ``--capture`` values and the `Capture` each stands for (`thunder_nb.cudagraph.capture.CAPTURE_WORDS`).
CAPTURE_CHOICES = CAPTURE_WORDS


@magics_class
class ThunderCUDAGraphMagics(Magics):
    """The ``%%thunder_cudagraph`` cell magic (and ``%thunder_cudagraph``, its line form)."""

    @magic_arguments()
    @argument(
        "call",
        nargs="*",
        help="the call to compile and run, e.g. f(x): its arguments are evaluated in the notebook's namespace "
        "after the cell ran; the function is its callee (or -f NAME)",
    )
    @argument("-f", "--function", metavar="NAME", help="the function to compile (default: the call's callee)")
    @argument(
        "--original",
        choices=["stock", "legacy"],
        default="stock",
        help="what to compare the fixed transform with: thunder's CUDAGraphTransform (stock) or the "
        "July 2024 behaviour of issue #728 (legacy); default: stock",
    )
    @argument(
        "--train",
        action="store_true",
        help="call .backward() on the scalar result and compare the gradients of every tensor that requires grad "
        "that the function reaches (arguments, and the parameters of modules it reaches through arguments, closures "
        "or the globals it names) with eager's",
    )
    @argument(
        "--lr",
        type=float,
        metavar="LR",
        help="with --train: follow every call by an SGD step (p -= LR * p.grad) on each run's own copy of the "
        "parameters, and check the parameters against eager's after the last step",
    )
    @argument("-o", "--output", metavar="NAME",
              help="store the Comparison (with --whole-step: the StepComparison) in the namespace under NAME")
    @argument(
        "--views",
        default=magic_line.DEFAULT_VIEWS,
        metavar="LIST",
        help="comma-separated views to show, from diagram,lifetimes,source,run (default: all)",
    )
    @argument("--no-run", action="store_true", help="compile and trace only: run and time nothing")
    @argument(
        "--repeats",
        type=int,
        default=20,
        metavar="N",
        help="calls timed per version, after 2 warm-up calls (median and 10th-90th percentile shown); default 20, "
        "at most 10000",
    )
    @argument(
        "--capture",
        choices=list(CAPTURE_CHOICES),
        default="auto",
        help="auto: capture CUDA graphs when the inputs are on a GPU, else run regions eagerly; "
        "on: always capture (needs a GPU); off: never capture",
    )
    @argument(
        "--executors",
        default="",
        metavar="LIST",
        help="comma-separated fusion executors put before thunder's defaults, for both transforms: "
        "torchcompile (inductor fuses ops inside regions; its first call compiles for a while), "
        "torchcompile_cat, nvfuser; no-sdpa leaves thunder's sdpa executor out; default: none (thunder's defaults)",
    )
    @argument(
        "--peers",
        action="store_true",
        help='also check and time torch.compile(fn, mode="reduce-overhead") on the same inputs; the verdict '
        "then gives the fixed side's speed against eager and against it (its failing is reported, not raised)",
    )
    @argument(
        "--whole-step",
        metavar="MODEL,OPTIMIZER",
        help="check one whole training iteration as one CUDA graph (thunder_nb.jit_step): name your nn.Module and "
        "torch.optim optimizer, and the call is your loss function on one batch, e.g. --whole-step model,opt "
        "loss_fn(xb, yb). Shows what share of the iteration one graph holds and what stops the rest, each with your "
        "line and the fix; when nothing does, runs 6 steps (3 uncaptured, the recording, 2 replays) against eager "
        "PyTorch from the same state and times --repeats consecutive steps of each (without a GPU: capture's CPU "
        "stand-in, not timed). Your model and optimizer are trained, then put back as they were",
    )
    @line_cell_magic
    def thunder_cudagraph(self, line: str, cell: str | None = None) -> None:
        """Run the cell, then compile the call on the magic line with the original and the fixed CUDA-graph transform.

        Shows a one-line verdict, what to do next (code in your names), a toggle between the original and the fixed
        side (region diagram, value lifetimes, generated code with defect lines highlighted) and the run: the value,
        its check against eager PyTorch, timings and CUDA graphs captured. The original failing is part of the
        report. Example, with ``model`` an ``nn.Module`` defined anywhere in the notebook::

            %%thunder_cudagraph --train --lr 0.01 -o cmp step(xb)
            def step(x):
                return model(x).pow(2).mean()

        For a function an earlier cell defined, the line magic needs no cell: ``%thunder_cudagraph step(xb)``. With
        ``--whole-step model,opt loss_fn(xb, yb)`` it diagnoses and runs the whole training iteration instead
        (forward, backward and ``opt.step()`` as one CUDA graph, `thunder_nb.jit_step`), against eager PyTorch.
        Ctrl-C stops it; your variables stay as they were.
        """
        args, call_text = magic_line.parse_line(self.thunder_cudagraph, line)
        views = magic_line.check_arguments(args)
        executors = magic_line.check_executors(args.executors)
        call = magic_line.parse_call(call_text)
        whole_step = magic_line.check_whole_step(args) if args.whole_step is not None else None

        in_shell = MagicCell(self.shell)
        progress = Progress()
        try:
            defined = in_shell.run(cell) if cell is not None else []
            fn = in_shell.function(args.function, call, defined)
            call_args, call_kwargs = in_shell.arguments(call, call_text)
            # NOTE: the call as the user would write it, for the code of the "next" line
            shown_call = call_text if args.function is None else args.function + call_text[call_text.index("("):]
            with addressed_warnings(), quiet_proxies(getattr(fn, "__name__", "the function")):
                if whole_step is not None:
                    model, optimizer = in_shell.whole_step_objects(whole_step)
                    if call_kwargs:
                        raise UsageError(f"--whole-step passes the batch as positional arguments: "
                                         f"{ast.unparse(call.func)}(x, y), not keywords ({', '.join(call_kwargs)})")
                    magic_show.whole_step_and_show(in_shell, args, model, fn, optimizer, call_args, executors,
                                                   progress, names=(*whole_step, shown_call))
                else:
                    magic_show.compare_and_show(in_shell, args, fn, call_args, call_kwargs, views, executors,
                                                progress, shown_call)
        except KeyboardInterrupt:
            progress.clear()
            raise UsageError(magic_show.interrupted(progress.last, whole_step is not None)) from None

class _NotebookHelpFormatter(MagicHelpFormatter):
    """IPython's help formatter for a magic, as a notebook user reads a cell magic's help: the usage line with ``%%``
    (IPython writes ``%``) under "Usage:" (not reStructuredText's ``::``), each option's value as argparse writes it
    (``--whole-step MODEL,OPTIMIZER``, ``--original {stock,legacy}``: no ``<...>``, which is for reStructuredText),
    wrapped for an 80-column screen whatever the terminal (the same help in every notebook; its test is exact)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_HELP_WIDTH)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        return argparse.HelpFormatter._format_action_invocation(self, action)

    def _split_lines(self, text: str, width: int) -> list[str]:
        # NOTE: never at a hyphen: `mode="reduce-overhead"` is code, and a line break inside it reads as a typo
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def add_usage(self, usage: str | None, actions: Iterable[argparse.Action], groups: Iterable[Any],
                  prefix: str | None = None) -> None:
        # NOTE: argparse indents the usage's continuation lines by the prefix's length: "  %%" puts them under the
        # first argument; "Usage:" is put above it afterwards, where it moves nothing
        argparse.HelpFormatter.add_usage(self, usage, actions, groups, "  %%")


#: The help's width: argparse's own for an 80-column terminal.
_HELP_WIDTH = 78


def _help_text(parser: argparse.ArgumentParser) -> str:
    """The magic's help as a notebook user reads it (`_NotebookHelpFormatter`), its text as plain text: code in single
    backticks (reStructuredText's are doubled), an example under a line that ends in one colon (not two), prose
    filled to the options' width."""
    text = re.sub(r"``([^`]+)``", r"`\1`", re.sub(r"::$", ":", inspect.cleandoc(parser.description or ""), flags=re.M))
    # NOTE: prose is filled to the width of the options below it; the indented example keeps its lines
    paragraphs = [p if p.startswith(" ") else textwrap.fill(" ".join(p.split()), _HELP_WIDTH, break_on_hyphens=False)
                  for p in text.split("\n\n")]
    shown = copy.copy(parser)  # NOTE: a copy: the parser that parses the magic's line keeps IPython's formatter
    shown.formatter_class = _NotebookHelpFormatter
    shown.description = "\n\n".join(paragraphs)
    return "Usage:\n\n" + shown.format_help()


ThunderCUDAGraphMagics.thunder_cudagraph.__doc__ = _help_text(ThunderCUDAGraphMagics.thunder_cudagraph.parser)


def options_markdown() -> str:
    """Return the magic's options as a Markdown table, made from its argument declarations (the README's table).

    One row per declared argument, in declaration order: how it is written (positional ones by their
    name in capitals), its help text and its default. ``python -m thunder_nb.magics`` prints it.
    """
    rows = ["| option | what it does | default |", "|---|---|---|"]
    # NOTE: argparse keeps the declarations in _actions; its help formatter wraps text for a terminal instead
    for action in ThunderCUDAGraphMagics.thunder_cudagraph.parser._actions:
        value = ("{" + ",".join(map(str, action.choices)) + "}" if action.choices
                 else action.metavar or action.dest.upper())
        if not action.option_strings:
            written = f"`{value}`"
        elif action.nargs == 0:
            written = ", ".join(f"`{s}`" for s in action.option_strings)
        else:
            written = ", ".join(f"`{s} {value}`" for s in action.option_strings)
        # NOTE: by identity: a default of 0 equals False, and is shown
        shown = action.default is not None and action.default is not False and action.default != ""
        default = f"`{action.default}`" if shown else ""
        rows.append(f"| {written} | {(action.help or '').replace('|', chr(92) + '|')} | {default} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(options_markdown(), end="")
