"""Give each run its own copy of what a function reaches: its arguments, closure cells, the globals it names,
nn.Modules."""

from __future__ import annotations

import copy
import functools
import inspect
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..diagnosis.failures import is_user_file
from .values import clone_tensor, map_tensors

__all__ = ["Bound", "bind"]


@dataclass(frozen=True, slots=True)
class Bound:
    """A function rebound to its own copies of the modules and trainable tensors it reaches, with its arguments."""

    fn: Any  # the function (or module) to call: the original when it reaches nothing to copy
    args: tuple  # the arguments, with this copy's modules and trainable tensors in place
    kwargs: dict
    trainable: Mapping[str, Any]  # name -> this copy's leaf tensor that requires grad, in the order found
    copied: tuple[str, ...] = ()  # names of the modules and tensors copied (for messages)
    modules: tuple[Any, ...] = ()  # this copy's modules

    def inputs(self) -> tuple[tuple, dict]:
        """The arguments of one call: this copy's state as it is, every other tensor cloned afresh."""

        def fresh(t: Any) -> Any:
            # NOTE: a tensor that requires grad here is this copy's own (bind cloned it); the rest is data,
            # cloned per call so that a function that updates its inputs in place starts from the same values
            return t if t.requires_grad else clone_tensor(t)

        return map_tensors(self.args, fresh), map_tensors(self.kwargs, fresh)

    def tensors(self) -> list[Any]:
        """Every tensor this copy holds: arguments, trainable tensors, module parameters and buffers."""
        import torch

        from .values import leaves

        found = [t for _, t in leaves((self.args, self.kwargs)) if isinstance(t, torch.Tensor)]
        found += list(self.trainable.values())
        for m in self.modules:
            found += list(m.parameters()) + list(m.buffers())
        return found

    def grads(self) -> dict[str, Any]:
        """A copy of the ``.grad`` of every trainable tensor, by name (None where there is none).

        Copies: a gradient a graph lent to autograd lies in that graph's memory, and a record that kept it
        would hold the graph instance at the next backward (one more graph, lending stopped), where a
        training loop that resets its gradients keeps one.
        """
        return {name: None if t.grad is None else t.grad.detach().clone() for name, t in self.trainable.items()}

    def zero_grad(self) -> None:
        """Drop the gradients (``set_to_none``, as ``optimizer.zero_grad()`` does)."""
        for t in self.trainable.values():
            t.grad = None

    def sgd_step(self, lr: float) -> None:
        """One plain SGD step on the trainable tensors, in place; then drop the gradients."""
        import torch

        with torch.no_grad():
            for t in self.trainable.values():
                if t.grad is not None:
                    t.add_(t.grad, alpha=-lr)
        self.zero_grad()


def bind(fn: Any, args: tuple = (), kwargs: Mapping[str, Any] | None = None) -> Bound:
    """Copy the modules and trainable tensors that ``fn`` reaches and rebind ``fn`` to the copies.

    Reached are: the arguments (nested in lists, tuples and dicts), ``fn`` itself when it is a
    module or a module's bound method, its closure cells, its defaults, and the globals its code
    names; functions of the user's own code (not of an installed package) found that way are
    followed too. Shared objects stay shared among the copies (one ``copy.deepcopy`` memo). Tensors
    that do not require grad are not copied, except the arguments, which `Bound.inputs` clones per
    call; what hides behind other objects' attributes (``cfg.model``) is not found.

    Returns:
        A `Bound`; its ``fn`` is ``fn`` itself when nothing was copied.
    """
    kwargs = dict(kwargs or {})
    c = _Copier()
    names = _argument_names(fn, args, kwargs)
    new_args = tuple(c.state(a, n) for a, n in zip(args, names))
    new_kwargs = {k: c.state(v, k) for k, v in kwargs.items()}
    new_fn = c.state(fn, "")
    if not c.copied:
        return Bound(fn, tuple(args), kwargs, {}, ())
    c.finish()
    return Bound(new_fn, new_args, new_kwargs, dict(c.trainable), tuple(c.copied), tuple(c.modules))


# ---------------------------------------------------------------------------------------------------


def _code_names(code: types.CodeType) -> set[str]:
    """The global (and attribute) names a code object and the code nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _argument_names(fn: Any, args: tuple, kwargs: dict) -> list[str]:
    """A name for each positional argument: its parameter's (``w1``, ``xs[2]`` for ``*xs``), else ``args[i]``."""
    fallback = [f"args[{i}]" for i in range(len(args))]
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return fallback
    names: list[str] = []
    for name, value in bound.arguments.items():
        if len(names) >= len(args):
            break
        param = bound.signature.parameters[name]
        if param.kind is param.VAR_POSITIONAL:
            names += [f"{name}[{j}]" for j in range(len(value))]
        elif param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) and name not in kwargs:
            names.append(name)
    return names[: len(args)] if len(names) >= len(args) else fallback


class _Copier:
    """One deep copy of everything reached, with one memo so that shared objects stay shared."""

    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}  # id(original) -> copy (also copy.deepcopy's memo)
        self.keep: list[Any] = []  # the originals, alive while their ids are keys
        self.functions: dict[int, Any] = {}  # id(original function) -> rebound function (or itself)
        self.cells: dict[int, Any] = {}  # id(original cell) -> new cell
        self._filled: set[int] = set()  # ids of the original cells whose new cell is filled
        self._visiting: set[int] = set()  # ids of the containers being walked (a list may hold itself)
        self.globals: list[tuple[dict, dict]] = []  # (original globals dict, its copy)
        self.trainable: dict[str, Any] = {}
        self.copied: list[str] = []
        self.modules: list[Any] = []
        self._trainable_ids: set[int] = set()

    def state(self, obj: Any, name: str) -> Any:
        """The copy of ``obj`` when it holds state (or reaches some); else ``obj`` itself."""
        import torch

        if id(obj) in self.memo:
            return self.memo[id(obj)]
        if isinstance(obj, torch.nn.Module):
            new = copy.deepcopy(obj, self.memo)
            self.keep.append(obj)
            self.copied.append(name or type(obj).__name__)
            self.modules.append(new)
            for pname, p in new.named_parameters():
                self._trainable(f"{name}.{pname}" if name else pname, p)
            return new
        if isinstance(obj, torch.Tensor):
            if not obj.requires_grad:
                return obj
            new = clone_tensor(obj)
            self.memo[id(obj)] = new
            self.keep.append(obj)
            self.copied.append(name)
            self._trainable(name, new)
            return new
        if isinstance(obj, (list, tuple, dict)):
            if id(obj) in self._visiting:
                return obj
            self._visiting.add(id(obj))
            try:
                return self._container(obj, name)
            finally:
                self._visiting.discard(id(obj))
        if isinstance(obj, types.MethodType):
            owner = self.state(obj.__self__, name)
            func = self.function(obj.__func__)
            return obj if (owner is obj.__self__ and func is obj.__func__) else types.MethodType(func, owner)
        if isinstance(obj, functools.partial):
            func = self.state(obj.func, name)
            pargs = self.state(obj.args, name)
            pkw = self.state(obj.keywords, name)
            same = func is obj.func and pargs is obj.args and pkw is obj.keywords
            return obj if same else functools.partial(func, *pargs, **pkw)
        if isinstance(obj, types.FunctionType):
            return self.function(obj)
        return obj

    def _container(self, obj: list | tuple | dict, name: str) -> Any:
        if isinstance(obj, dict):
            items = {k: self.state(v, f"{name}[{k!r}]") for k, v in obj.items()}
            return obj if all(items[k] is v for k, v in obj.items()) else items
        new = [self.state(e, f"{name}[{i}]") for i, e in enumerate(obj)]
        if all(a is b for a, b in zip(new, obj)):
            return obj
        return type(obj)(*new) if hasattr(obj, "_fields") else type(obj)(new)

    def _trainable(self, name: str, t: Any) -> None:
        if t.requires_grad and id(t) not in self._trainable_ids:
            self._trainable_ids.add(id(t))
            self.trainable[name] = t

    def function(self, f: types.FunctionType) -> Any:
        """``f`` over a copy of its globals and new closure cells, holding the copies of what it reaches."""
        if id(f) in self.functions:
            return self.functions[id(f)]
        if not is_user_file(f.__code__.co_filename):
            self.functions[id(f)] = f
            return f
        # NOTE: the new function is registered before what it reaches is copied, so that recursion
        # (a helper that calls back, a closure over itself) ends at the new function, not the old one
        new_globals = self._globals_copy(f.__globals__)
        cells = tuple(self._cell(c) for c in f.__closure__ or ())
        new = types.FunctionType(f.__code__, new_globals, f.__name__, None, cells or None)
        for attr in ("__qualname__", "__module__", "__doc__"):
            setattr(new, attr, getattr(f, attr))
        new.__dict__.update(f.__dict__)
        self.functions[id(f)] = new
        self.keep.append(f)
        for var, old, cell in zip(f.__code__.co_freevars, f.__closure__ or (), cells):
            if id(old) not in self._filled:  # NOTE: a cell shared by two closures is filled once
                self._filled.add(id(old))
                try:
                    cell.cell_contents = self.state(old.cell_contents, var)
                except ValueError:  # an empty cell (a variable not assigned yet) stays empty
                    pass
        for n in sorted(_code_names(f.__code__)):
            if n in f.__globals__:
                new_globals[n] = self.state(f.__globals__[n], n)
        if f.__defaults__:
            new.__defaults__ = tuple(self.state(d, f"{f.__name__} default") for d in f.__defaults__)
        if f.__kwdefaults__:
            new.__kwdefaults__ = {k: self.state(v, k) for k, v in f.__kwdefaults__.items()}
        return new

    def _cell(self, old: Any) -> Any:
        if id(old) not in self.cells:
            self.cells[id(old)] = types.CellType()
            self.keep.append(old)
        return self.cells[id(old)]

    def _globals_copy(self, g: dict) -> dict:
        for old, new in self.globals:
            if old is g:
                return new
        new = dict(g)
        self.globals.append((g, new))
        return new

    def finish(self) -> None:
        """Point every name in the copied globals that holds a copied object at its copy."""
        replaced = {**self.memo, **self.functions}
        for old, new in self.globals:
            for name, value in old.items():
                copy_ = replaced.get(id(value))
                if copy_ is not None and copy_ is not value and new.get(name) is value:
                    new[name] = copy_
