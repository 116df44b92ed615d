"""Every torch function thunder traces to one of its symbols takes its positional arguments where PyTorch has them,
after thunder-nb's patches: thunder 0.2.6's ``nll_loss`` read PyTorch's deprecated ``size_average`` as
``ignore_index`` (class 0 ignored, silently), and its max pooling read ``ceil_mode`` as ``return_indices``
(`thunder_nb.internals.nll_loss`, `thunder_nb.internals.pooling`). Names may differ (thunder's ``b`` for PyTorch's
``other``); a name both have must stand at the same position."""

from __future__ import annotations

import inspect

import torch
from thunder.core.symbol import Symbol
from thunder.torch import _torch_to_thunder_function_map

from thunder_nb import internals


def _positional(fn) -> list[str] | None:
    try:
        parameters = inspect.signature(inspect.unwrap(fn)).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _torchs(fn) -> list[list[str]]:
    """PyTorch's positional parameters of ``fn`` (its Python signature, or ATen's schemas of a builtin), after the
    first."""
    if type(fn).__name__ == "builtin_function_or_method":
        if "TensorBase" in getattr(fn, "__qualname__", ""):
            return []  # NOTE: a Tensor method: its schemas' first argument is self, as the function's
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{fn.__name__}")
        return [[a.name for a in schema.arguments if not a.kwarg_only][1:] for schema in schemas]
    names = _positional(fn)
    return [names[1:]] if names else []


def test_every_mapped_torch_function_takes_its_positional_arguments_where_pytorch_does():
    assert internals.supported() and internals.check_versions()
    misplaced, checked = [], 0
    for fn, symbol in list(_torch_to_thunder_function_map.items()):
        if not isinstance(symbol, Symbol) or symbol.meta is None:
            continue
        ours = _positional(symbol.meta)
        if ours is None:
            continue
        ours = ours[1:]
        for theirs in _torchs(fn):
            checked += 1
            wrong = [name for name in theirs if name in ours and theirs.index(name) != ours.index(name)]
            if wrong:
                misplaced.append(f"{getattr(fn, '__qualname__', fn)}: {wrong} (PyTorch {theirs}, thunder {ours})")
                break
    assert checked > 500, checked  # NOTE: the check reached the table (596 builtins and Python functions here)
    assert not misplaced, "\n".join(misplaced)
