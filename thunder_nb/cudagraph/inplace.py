"""Partial updates as the program wrote them: thunder's functionalized ``index_copy_``, ``buf[i] = v`` and their kin
made in place again.

thunder 0.2.6 traces an in-place update of part of a tensor (litgpt's KV cache: ``buf.index_copy_(dim, index, src)``;
gpt-fast's: ``buf[:, :, pos] = v``) as an out-of-place copy of the whole tensor with that part changed, then a
``copy_`` of the copy back into the tensor::

    t797 = torch.index_copy(t795, -2, input_pos, t792)  # a new tensor as large as the cache
    t798 = copy_(t797, t795, grad_enabled=False)        # the cache written whole

Three kernels (a clone, the rows, the copy back) that read and write the whole tensor twice, where the program asked
for one that writes the rows: on a decode step their time grows with the cache; litgpt pythia-14m's step has 12 of
them. `fold_in_place` turns each such pair back into one in-place update (``t798 = thunder_nb_index_copy_(t795, -2,
input_pos, t792)``), under the conditions that make the two equal. The out-of-place ops it folds are thunder's torch
executor's, each PyTorch's in-place op on a clone: `IN_PLACE_FORMS`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol, Symbol

from ..diagnosis.ops import IN_PLACE_FORMS
from .passes import alias_groups, same_tensor, walk, written_argument

__all__ = ["fold_in_place", "in_place_symbol"]


@functools.cache  # NOTE: registered with thunder once per op
def in_place_symbol(name: str) -> Symbol:
    """The symbol that runs thunder's torch executor's out-of-place op ``name`` (a key of `IN_PLACE_FORMS`) in place
    on its first argument and returns that argument: ``thunder_nb_index_copy_(dst, dim, index, src)`` is
    ``dst.index_copy_(dim, index, src)``, ``thunder_nb_setitem_(dst, key, value)`` is ``dst[key] = value``. thunder
    never removes it as dead code (as its ``copy_``)."""
    import torch
    from thunder.core import prims
    from thunder.extend import OperatorExecutor, get_executor, register_executor

    ex = get_executor("thunder_nb_in_place")
    if ex is None:
        ex = OperatorExecutor("thunder_nb_in_place", version=torch.__version__)
        register_executor(ex)

    def meta(dst: TensorProxy, *args: Any, **kwargs: Any) -> TensorProxy:
        return TensorProxy(like=dst)

    if name == "copy_with_setitem_impl":
        def update(dst: torch.Tensor, key: Any, value: Any) -> torch.Tensor:
            dst[key] = value
            return dst
    else:
        method = getattr(torch.Tensor, f"{name}_")  # NOTE: index_copy -> Tensor.index_copy_

        def update(dst: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            return method(dst, *args, **kwargs)

    return ex.register_operator(IN_PLACE_FORMS[name], meta=meta, fn=update, tags=(prims.OpTags.DONT_DCE,))


def fold_in_place(bsyms: Sequence[BoundSymbol]) -> list[BoundSymbol]:
    """``bsyms`` (a trace's top level, without dels) with each out-of-place partial update (`IN_PLACE_FORMS`, thunder's
    torch executor's) whose only reader is the ``copy_`` back into its own first argument made one in-place update in
    the ``copy_``'s place, named as the ``copy_``'s result.

    The part is written where the ``copy_`` wrote the whole tensor, so every op between the two still reads the
    tensor as it was. Folded only where the two compute the same: the copy's destination is the update's first
    argument (the same tensor: the same name, or one that ``update_aliases`` or an in-place update gave it); nothing
    but that ``copy_`` reads the out-of-place result (not a later op, not the return, not a backward that saves it); no
    op between the two updates any tensor in place (the ``copy_`` would discard an update of the destination that the
    in-place form keeps, and the other arguments would be read later than the program read them); none of the other
    arguments (an index, the values) is the destination or anything thunder names as its alias (``update_aliases``:
    PyTorch's in-place updates refuse overlapping memory); and the ``copy_`` runs without autograd
    (``grad_enabled=False``: thunder's ``copy_`` checks a leaf that requires grad otherwise).
    """
    bsyms = list(bsyms)
    readers: dict[str, list[int]] = {}
    for i, b in enumerate(bsyms):
        for p in b.flat_proxy_args:
            readers.setdefault(p.name, []).append(i)
    tensor, _ = same_tensor(bsyms)
    group_of = alias_groups(bsyms)
    found: list[tuple[int, int]] = []
    for i, b in enumerate(bsyms):
        if (b.sym.name not in IN_PLACE_FORMS or getattr(b.sym.executor, "name", None) != "torch" or not b.args
                or not isinstance(b.args[0], TensorProxy) or len(b.flat_proxy_outs) != 1):
            continue
        dst, out = b.args[0], b.flat_proxy_outs[0]
        uses = readers.get(out.name, [])
        if len(uses) != 1:
            continue
        j = uses[0]
        c = bsyms[j]
        if (c.sym.name != "copy_" or len(c.args) != 2 or c.kwargs.get("grad_enabled", True) is not False
                or getattr(c.args[0], "name", None) != out.name or not isinstance(c.args[1], TensorProxy)
                or tensor(c.args[1].name) != tensor(dst.name) or len(c.flat_proxy_outs) != 1):
            continue
        group = group_of(dst.name)
        others = [p for p in tree_flatten((b.args[1:], b.kwargs))[0] if isinstance(p, Proxy)]
        if any(group_of(p.name) == group for p in others):
            continue
        if any(_updates(bsyms[k]) for k in range(i + 1, j)):
            continue
        found.append((i, j))
    drop = {i for i, _ in found}
    # NOTE: into the copy_'s destination: the same tensor as the update's first argument, under its name there
    replace = {j: in_place_symbol(bsyms[i].sym.name).bind(bsyms[j].args[1], *bsyms[i].args[1:],
                                                           output=bsyms[j].flat_proxy_outs[0], **bsyms[i].kwargs)
               for i, j in found}
    return [replace.get(k, b) for k, b in enumerate(bsyms) if k not in drop]


def _updates(b: BoundSymbol) -> bool:
    """Whether ``b`` updates a tensor in place, or holds an op that does (a fusion)."""
    return any(written_argument(s) is not None for s in walk([b]))
