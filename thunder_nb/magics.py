"""``%%thunder_cudagraph``: run a cell, then compare the original and fixed CUDA-graph transform on a call."""

from __future__ import annotations

import ast
import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .cudagraph.capture import CAPTURE_WORDS, capture_mode
from .diagnosis import failures

__all__ = ["ThunderCUDAGraphMagics", "CAPTURE_CHOICES", "options_markdown"]

#: ``--capture`` values and what `compare` gets for them (`thunder_nb.cudagraph.capture.CAPTURE_WORDS`).
CAPTURE_CHOICES = CAPTURE_WORDS

_EXAMPLE = "%%thunder_cudagraph f(x)"


@magics_class
class ThunderCUDAGraphMagics(Magics):
    """The ``%%thunder_cudagraph`` cell magic."""

    _cell_name: str | None = None  # the file name the shell compiled the magic's cell under

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
        default=",".join(("diagram", "lifetimes", "source", "run")),
        metavar="LIST",
        help="comma-separated views to show, from diagram,lifetimes,source,run (default: all)",
    )
    @argument("--no-run", action="store_true", help="compile and trace only: run and time nothing")
    @argument(
        "--repeats",
        type=int,
        default=20,
        metavar="N",
        help="calls timed per version, after 2 warm-up calls (median and 10th-90th percentile shown); default 20",
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
    @cell_magic
    def thunder_cudagraph(self, line: str, cell: str) -> None:
        """Run the cell, then compile the call on the magic line with the original and the fixed CUDA-graph transform.

        Shows a one-line verdict, a toggle between the original and the fixed side (region diagram,
        value lifetimes, generated code with defect lines highlighted) and the run: the value, its
        check against eager PyTorch, timings and CUDA graphs captured. The original failing is part
        of the report. Example, with ``model`` an ``nn.Module`` defined anywhere in the notebook::

            %%thunder_cudagraph --train --lr 0.01 -o cmp step(xb)
            def step(x):
                return model(x).pow(2).mean()

        With ``--whole-step model,opt loss_fn(xb, yb)`` it diagnoses and runs the whole training iteration instead
        (forward, backward and ``opt.step()`` as one CUDA graph, `thunder_nb.jit_step`), against eager PyTorch.
        """
        args, call_text = _parse_line(self.thunder_cudagraph, line)
        views = _check_arguments(args)
        executors = _check_executors(args.executors)
        call = _parse_call(call_text)
        whole_step = _check_whole_step(args) if args.whole_step is not None else None

        defined = self._run_cell(cell)
        fn = self._resolve_function(args.function, call, defined)
        call_args, call_kwargs = self._evaluate_arguments(call, call_text)

        progress = _Progress()
        with _addressed_warnings():
            if whole_step is not None:
                model, optimizer = self._resolve_whole_step(whole_step, defined)
                if call_kwargs:
                    raise UsageError(f"--whole-step passes the batch as positional arguments: {ast.unparse(call.func)}"
                                     f"(x, y), not keywords ({', '.join(call_kwargs)})")
                self._whole_step_and_show(args, model, fn, optimizer, call_args, executors, progress)
            else:
                self._compare_and_show(args, fn, call_args, call_kwargs, views, executors, progress)

    def _whole_step_and_show(self, args: Any, model: Any, fn: Any, optimizer: Any, batch: tuple,
                             executors: tuple[str, ...], progress: _Progress) -> None:
        """``--whole-step``: `thunder_nb.step.compare_step` on the user's objects; its report, with lines of this cell
        worded as the rest of the magic words them."""
        import dataclasses

        from .step import compare_step

        try:
            result = compare_step(model, fn, optimizer, *batch, repeats=args.repeats, executors=executors,
                                  capture=capture_mode(args.capture), execute=not args.no_run,
                                  progress=progress)
        except Exception as e:
            progress.clear()
            where = failures.user_frame(e.__traceback__)
            if where is None and isinstance(e, ValueError):  # NOTE: compare_step's own check of the arguments
                raise UsageError(f"--whole-step: {e}") from None
            at = f" ({self._where(where)})" if where is not None else ""
            name = getattr(fn, "__name__", "the loss function")
            raise UsageError(f"{name} raised {failures.error_line(e)} in eager PyTorch{at}; your model and optimizer "
                             "are as they were") from None
        blockers = tuple(dataclasses.replace(b, where=self._where(failures.Where(b.filename, b.line, _source_line(b),
                                                                                  "")))
                         if b.filename is not None and b.line is not None else b for b in result.report.blockers)
        result = dataclasses.replace(result, report=dataclasses.replace(result.report, blockers=blockers))
        if args.output:
            self.shell.user_ns[args.output] = result
        progress.done({"text/plain": result.to_text(), "text/html": result._repr_html_()})

    def _resolve_whole_step(self, names: tuple[str, str], defined: list[str]) -> tuple[Any, Any]:
        """The model and the optimizer that ``--whole-step MODEL,OPTIMIZER`` names, checked.

        Raises:
            UsageError: a name that is not defined, a model that is not an ``nn.Module`` or has nothing to train, an
                optimizer that is not a ``torch.optim.Optimizer`` or updates none of the model's parameters.
        """
        import torch

        ns = self.shell.user_ns
        found = {"module": [k for k, v in ns.items() if not k.startswith("_") and isinstance(v, torch.nn.Module)],
                 "optimizer": [k for k, v in ns.items()
                               if not k.startswith("_") and isinstance(v, torch.optim.Optimizer)]}
        objects = []
        kinds = (("module", torch.nn.Module, "torch.nn.Module"),
                 ("optimizer", torch.optim.Optimizer, "torch.optim.Optimizer"))
        for text, (kind, cls, cls_name), (_, other, _) in zip(names, kinds, kinds[::-1]):
            try:
                value = eval(compile(text, "<thunder_cudagraph --whole-step>", "eval"), ns)
            except Exception as e:
                here = found[kind]
                hint = (f"; {kind}s in the namespace: {', '.join(here)}" if here
                        else f"; there is no {kind} in the namespace")
                raise UsageError(f"--whole-step {names[0]},{names[1]}: {text} failed: {failures.error_line(e)}{hint}"
                                 ) from None
            if not isinstance(value, cls):
                what = type(value).__name__
                swapped = " (the model comes first: --whole-step MODEL,OPTIMIZER)" if isinstance(value, other) else ""
                raise UsageError(f"--whole-step: {text!r} is {_article(what)} {what}, not a {cls_name}{swapped}")
            objects.append(value)
        model, optimizer = objects
        trained = {id(p) for p in model.parameters() if p.requires_grad}
        if not trained:
            raise UsageError(f"--whole-step: {names[0]} has no parameter that requires grad: nothing to train")
        if not any(id(p) in trained for g in optimizer.param_groups for p in g["params"]):
            raise UsageError(f"--whole-step: {names[1]} updates none of {names[0]}'s parameters (was it made for "
                             "another model?)")
        return model, optimizer

    def _compare_and_show(self, args: Any, fn: Any, call_args: tuple, call_kwargs: dict, views: list[str],
                          executors: tuple[str, ...], progress: _Progress) -> None:
        from .notebook import widget
        from .notebook.comparison import CompareError, compare

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
                capture=capture_mode(args.capture),
                executors=executors,
                peers=args.peers,
                progress=progress,
            )
        except CompareError as e:
            progress.clear()
            raise UsageError(e.render(self._where)) from None
        except BaseException:
            progress.clear()
            raise
        if args.output:
            self.shell.user_ns[args.output] = comparison
        side_views = [v for v in views if v in widget.SIDE_VIEWS]
        if side_views:
            progress("drawing the views…")
            view = widget.comparison_toggle(comparison, side_views)
        progress.done({"text/plain": comparison.verdict(), "text/html": comparison.verdict_html()})
        if side_views:
            display(view)
        if "run" in views:
            display({"text/plain": comparison.run_text(), "text/html": comparison.run_html()}, raw=True)

    # --- steps --------------------------------------------------------------------------------------

    def _run_cell(self, cell: str) -> list[str]:
        """Run the cell as the shell runs any cell; return the names of the functions it defines, in order.

        The shell's own machinery runs it (input transforms, run events, the display of a last
        expression); an exception it raises becomes one `UsageError` instead of a traceback.
        Statements before a failing one stay in effect, as in a normal cell.
        """
        shell = self.shell
        source = shell.transform_cell(cell)
        try:
            tree = ast.parse(source)
        except SyntaxError as e:
            raise UsageError(f"syntax error in the cell, line {(e.lineno or 0) + 1}: {e.msg}") from None
        # NOTE: the name the shell compiles the cell under, to say "line N of the cell" in messages
        self._cell_name = shell.compile.get_code_name(cell, source, shell.execution_count)
        saved = shell.custom_exceptions, shell.CustomTB
        shell.set_custom_exc((Exception,), _keep_for_message)
        try:
            result = shell.run_cell(cell, store_history=False)
        finally:
            shell.custom_exceptions, shell.CustomTB = saved
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            where = failures.user_frame(error.__traceback__)
            at = f" ({self._where(where)})" if where is not None else ""
            raise UsageError(f"the cell raised {failures.error_line(error)}{at}") from None
        return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def _where(self, where: failures.Where) -> str:
        """A line of user code in words: ``line 4 of the cell: `...``` for this cell (counting the magic's line)."""
        if where.filename == self._cell_name:
            return f"line {where.line + 1} of the cell" + (f": `{where.text}`" if where.text else "")
        return failures.where_text(where)

    def _resolve_function(self, name: str | None, call: ast.Call, defined: list[str]) -> Any:
        ns = self.shell.user_ns
        if name is not None:
            if name not in ns:
                hint = f" (the cell defines: {', '.join(defined)})" if defined else ""
                raise UsageError(f"no function {name!r} in the namespace{hint}")
            fn = ns[name]
        elif isinstance(call.func, ast.Name) and call.func.id not in ns and call.func.id not in _builtins(ns):
            # NOTE: never guess: a typo in the callee compiling another function would report on code the user
            # did not name
            callee = call.func.id
            defines = (f"the cell defines {', '.join(defined)}" if defined else "the cell defines no function")
            raise UsageError(f"no function {callee!r}: {defines}, and {callee!r} is not in the namespace "
                             f"(call a function by its name, or name one with -f NAME)")
        else:
            try:
                fn = eval(compile(ast.Expression(call.func), "<thunder_cudagraph call>", "eval"), ns)
            except Exception as e:
                raise UsageError(f"the call {ast.unparse(call.func)}(...) failed: {failures.error_line(e)}") from None
        if not callable(fn):
            kind = type(fn).__name__
            raise UsageError(f"{name or ast.unparse(call.func)!r} is {_article(kind)} {kind}, not a function")
        return fn

    def _evaluate_arguments(self, call: ast.Call, call_text: str) -> tuple[tuple, dict]:
        """Evaluate the call's arguments (``*args`` and ``**kwargs`` included) in the user's namespace."""
        collect = ast.Call(func=ast.Name("__thunder_nb_arguments__", ast.Load()), args=call.args, keywords=call.keywords)
        expr = ast.fix_missing_locations(ast.Expression(collect))
        scope = {"__thunder_nb_arguments__": lambda *a, **k: (a, k)}
        try:
            return eval(compile(expr, "<thunder_cudagraph call>", "eval"), self.shell.user_ns, scope)
        except Exception as e:
            raise UsageError(f"the call {call_text} failed: {failures.error_line(e)}") from None


#: Where a warning of thunder-nb's own code is shown as coming from: the magic the user typed, not a line of
#: thunder-nb (Python would print that file's path and the line of code under it).
WARNING_ORIGIN = "%%thunder_cudagraph"


@contextlib.contextmanager
def _addressed_warnings() -> Iterator[None]:
    """Show each warning thunder-nb's own code raises while the magic runs as one line addressed to the user."""
    import os

    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        yield
    for w in caught:
        if os.path.abspath(w.filename).startswith(here):
            warnings.warn_explicit(w.message, w.category, WARNING_ORIGIN, 1, module="thunder_nb")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _builtins(ns: dict) -> set[str]:
    import builtins

    b = ns.get("__builtins__", builtins)
    return set(b if isinstance(b, dict) else dir(b))


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _keep_for_message(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> list[str]:
    """The shell's custom exception handler while the magic runs the cell: show nothing (`_run_cell` says it once)."""
    return []


def _parse_line(magic: Any, line: str) -> tuple[Any, str]:
    """Split the magic line into parsed options and the call's source text.

    The call is the first stretch of the line, from a word boundary to the end, that is a Python
    expression; what comes before it must be options. (Splitting the call into shell words would
    break string arguments and read ``-1`` as an option.)
    """
    import re

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
            raise UsageError(f"unexpected words before the call: {' '.join(args.call)} (write it like {_EXAMPLE})")
        return args, tail
    args = parse_argstring(magic, line)
    if args.call:
        raise UsageError(f"the call is not a Python expression: {' '.join(args.call)} (write it like {_EXAMPLE})")
    raise UsageError(f"missing call: write the call to compile on the magic line, e.g. {_EXAMPLE}")


def _check_arguments(args: Any) -> list[str]:
    """Check the options that argparse cannot; return the views asked for.

    Raises:
        UsageError: an option's value is out of range, ``--lr`` without ``--train``, or ``--peers`` with ``--no-run``.
    """
    from .notebook import widget

    try:
        views = widget.parse_views(args.views)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, not {args.repeats}")
    if args.lr is not None and not args.train:
        raise UsageError("--lr needs --train (an SGD step needs gradients)")
    if args.lr is not None and not args.lr > 0:
        raise UsageError(f"--lr must be a positive number, not {args.lr}")
    if args.peers and args.no_run:
        raise UsageError("--peers needs a run (it times torch.compile): not with --no-run")
    if args.output is not None and not args.output.isidentifier():
        raise UsageError(f"-o needs a Python name, not {args.output!r}")
    return views


def _check_whole_step(args: Any) -> tuple[str, str]:
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
    default_views = ",".join(("diagram", "lifetimes", "source", "run"))
    other = [name for name, given in (("--train", args.train), ("--lr", args.lr is not None), ("--peers", args.peers),
                                      ("--original", args.original != "stock"),
                                      ("--views", args.views != default_views)) if given]
    if other:
        raise UsageError(f"--whole-step does not take {', '.join(other)}: it trains the step itself, and shows its "
                         "capturability report and its run against eager PyTorch")
    if args.capture == "off":
        raise UsageError("--whole-step records the step as one graph: not with --capture off (auto or on)")
    if args.capture == "on":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--whole-step with --capture on needs a CUDA GPU, and torch sees none (--capture auto "
                             "runs capture's CPU stand-in)")
    return parts[0], parts[1]


def _source_line(blocker: Any) -> str:
    import linecache

    return linecache.getline(blocker.filename, blocker.line).strip()


def _check_executors(text: str) -> tuple[str, ...]:
    """The ``--executors`` names, checked.

    Raises:
        UsageError: an unknown name, or one thunder cannot use here.
    """
    from .cudagraph.executors import executor_list, executor_names

    try:
        names = executor_names([n.strip() for n in text.split(",") if n.strip()])
        if "nvfuser" in names:
            executor_list(names)  # NOTE: imports thunder; only nvFuser may be missing here
    except ValueError as e:
        raise UsageError(str(e)) from None
    return names


def _parse_call(text: str) -> ast.Call:
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call):
        raise UsageError(
            f"the magic line needs a call like f(x), not {text!r} (options go before the call: {_EXAMPLE})"
        )
    return node


class _Progress:
    """One output line that says what is going on, then becomes the verdict."""

    def __init__(self) -> None:
        self._handle = None

    def __call__(self, message: str) -> None:
        bundle = {"text/plain": f"thunder-nb: {message}", "text/html": f"<i>thunder-nb: {_html(message)}</i>"}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def done(self, bundle: dict[str, str]) -> None:
        """Replace the progress line with ``bundle`` (or show it, when there was no progress)."""
        if self._handle is None:
            display(bundle, raw=True)
        else:
            self._handle.update(bundle, raw=True)

    def clear(self) -> None:
        """Blank the progress line (the error message says what happened)."""
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)


def _html(text: str) -> str:
    import html

    return html.escape(text)


def _help_text(doc: str) -> str:
    """The magic's help as a notebook user reads it: the usage line of a cell magic (``%%``, not IPython's ``%``) under
    "Usage:" (not reStructuredText's ``::``), and argparse's choices without the brackets magic_arguments adds."""
    import re

    head, _, rest = doc.partition("\n\n")
    usage, _, body = rest.partition("\n\n")
    if head.strip() == "::" and usage.lstrip().startswith("%thunder_cudagraph"):
        # NOTE: one more character on the first line: continuation lines move right by one to stay aligned
        lines = usage.replace("%thunder_cudagraph", "%%thunder_cudagraph", 1).splitlines()
        usage = "\n".join([lines[0]] + [" " + line for line in lines[1:]])
        doc = f"Usage:\n\n{usage}\n\n{body}"
    doc = re.sub(r"<(\{[^}]*\})>", r"\1", doc)
    return doc.replace("defined anywhere in the notebook::", "defined anywhere in the notebook:")


ThunderCUDAGraphMagics.thunder_cudagraph.__doc__ = _help_text(ThunderCUDAGraphMagics.thunder_cudagraph.__doc__ or "")


def options_markdown() -> str:
    """Return the magic's options as a Markdown table, made from its argument declarations (the README's table).

    One row per declared argument, in declaration order: how it is written (positional ones by their
    name in capitals), its help text and its default. ``python -m thunder_nb.magics`` prints it.
    """
    rows = ["| option | what it does | default |", "|---|---|---|"]
    # NOTE: argparse keeps the declarations in _actions; its help formatter wraps text for a terminal instead
    for action in ThunderCUDAGraphMagics.thunder_cudagraph.parser._actions:
        value = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.metavar or action.dest.upper()
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
