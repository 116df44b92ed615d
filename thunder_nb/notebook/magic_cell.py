"""The magic's cell in the user's shell: run it as the shell runs any cell, find the function, its arguments and
``--whole-step``'s model and optimizer in the namespace, and word a line of user code as a line of the cell."""

from __future__ import annotations

import ast
import builtins
from typing import Any

from IPython.core.error import UsageError

from ..diagnosis import failures

__all__ = ["MagicCell"]


class MagicCell:
    """The cell a magic runs in ``shell``, and the names on its magic line resolved in the shell's namespace."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.name: str | None = None  # the file name the shell compiled the cell under (known once it ran)

    def run(self, cell: str) -> list[str]:
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
        self.name = shell.compile.get_code_name(cell, source, shell.execution_count)
        saved = shell.custom_exceptions, shell.CustomTB
        shell.set_custom_exc((Exception, KeyboardInterrupt), _keep_for_message)
        try:
            result = shell.run_cell(cell, store_history=False)
        finally:
            shell.custom_exceptions, shell.CustomTB = saved
        error = result.error_before_exec or result.error_in_exec
        if isinstance(error, KeyboardInterrupt):
            raise KeyboardInterrupt  # NOTE: the magic words a Ctrl-C once, wherever it came
        if error is not None:
            where = failures.user_frame(error.__traceback__)
            at = f" ({self.where(where)})" if where is not None else ""
            raise UsageError(f"the cell raised {failures.error_line(error)}{at}") from None
        return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def where(self, where: failures.Where) -> str:
        """A line of user code in words: ``line 4 of the cell: `...``` for this cell (counting the magic's line)."""
        if where.filename == self.name:
            return f"line {where.line + 1} of the cell" + (f": `{where.text}`" if where.text else "")
        return failures.where_text(where)

    def function(self, name: str | None, call: ast.Call, defined: list[str]) -> Any:
        """The function to compile: ``-f NAME``'s, else the call's callee.

        Raises:
            UsageError: no such name (a callee is never guessed), or what it names cannot be called.
        """
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
            raise UsageError(f"{name or ast.unparse(call.func)!r} is {article(kind)} {kind}, not a function")
        return fn

    def arguments(self, call: ast.Call, call_text: str) -> tuple[tuple, dict]:
        """Evaluate the call's arguments (``*args`` and ``**kwargs`` included) in the user's namespace."""
        collect = ast.Call(func=ast.Name("__thunder_nb_arguments__", ast.Load()), args=call.args,
                           keywords=call.keywords)
        expr = ast.fix_missing_locations(ast.Expression(collect))
        scope = {"__thunder_nb_arguments__": lambda *a, **k: (a, k)}
        try:
            return eval(compile(expr, "<thunder_cudagraph call>", "eval"), self.shell.user_ns, scope)
        except Exception as e:
            raise UsageError(f"the call {call_text} failed: {failures.error_line(e)}") from None

    def training_names(self, trainable: tuple[str, ...]) -> tuple[str | None, str | None]:
        """The names of the module whose parameters ``trainable`` are (``model.0.weight``: ``model``) and of an
        optimizer of its parameters, as the namespace has them; None for what is not there (tensors trained outside a
        module, no optimizer yet)."""
        import torch

        ns = self.shell.user_ns
        roots = {name.split(".", 1)[0] for name in trainable}
        if len(roots) != 1 or not all("." in name for name in trainable):
            return None, None
        (root,) = roots
        model = ns.get(root)
        if not root.isidentifier() or not isinstance(model, torch.nn.Module):
            return None, None
        params = {id(p) for p in model.parameters()}
        optimizers = [k for k, v in ns.items() if not k.startswith("_") and isinstance(v, torch.optim.Optimizer)
                      and any(id(p) in params for g in v.param_groups for p in g["params"])]
        return root, (optimizers[0] if optimizers else None)

    def whole_step_objects(self, names: tuple[str, str]) -> tuple[Any, Any]:
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
                raise UsageError(f"--whole-step: {text!r} is {article(what)} {what}, not a {cls_name}{swapped}")
            objects.append(value)
        model, optimizer = objects
        trained = {id(p) for p in model.parameters() if p.requires_grad}
        if not trained:
            raise UsageError(f"--whole-step: {names[0]} has no parameter that requires grad: nothing to train")
        if not any(id(p) in trained for g in optimizer.param_groups for p in g["params"]):
            raise UsageError(f"--whole-step: {names[1]} updates none of {names[0]}'s parameters (was it made for "
                             "another model?)")
        return model, optimizer


def article(word: str) -> str:
    """``a`` or ``an``, before ``word``."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _builtins(ns: dict) -> set[str]:
    b = ns.get("__builtins__", builtins)
    return set(b if isinstance(b, dict) else dir(b))


def _keep_for_message(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> list[str]:
    """The shell's custom exception handler while the magic runs the cell: show nothing (`MagicCell.run` says it
    once)."""
    return []
