"""In-place updates as the program wrote them: thunder's functionalized ``index_copy_`` made in place again.

thunder 0.2.6 traces ``buf.index_copy_(dim, index, src)`` (litgpt's KV cache, once per key and value and layer) as an
out-of-place copy of the whole buffer with the new rows, then a ``copy_`` of that copy back into the buffer::

    t797 = torch.index_copy(t795, -2, input_pos, t792)  # a new tensor as large as the cache
    t798 = copy_(t797, t795, grad_enabled=False)        # the cache written whole

Three kernels (a clone, the rows, the copy back) that read and write the whole buffer twice, where the program asked
for one that writes a row: on a decode step their time grows with the cache, and on litgpt pythia-14m they are 12 of
the step's kernels. `fold_index_copies` turns each such pair back into one in-place ``index_copy_``
(``t798 = thunder_nb_index_copy_(t795, -2, input_pos, t792)``), under the conditions that make the two equal.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol

from ..diagnosis.ops import INDEX_COPY_NAME, WRITES_ARGUMENT, alias_root
from .passes import walk, written_argument

__all__ = ["fold_index_copies", "index_copy_in_place"]


@functools.cache  # NOTE: registered with thunder once
def index_copy_in_place() -> Any:
    """The symbol ``thunder_nb_index_copy_(dst, dim, index, src)``: ``dst.index_copy_(dim, index, src)``, returning
    ``dst``; thunder never removes it as dead code (as its ``copy_``)."""
    import torch
    from thunder.core import prims
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor("thunder_nb_in_place", version=torch.__version__)
    register_executor(ex)

    def meta(dst: TensorProxy, dim: int, index: TensorProxy, src: TensorProxy) -> TensorProxy:
        return TensorProxy(like=dst)

    def index_copy_(dst: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return dst.index_copy_(dim, index, src)

    return ex.register_operator(INDEX_COPY_NAME, meta=meta, fn=index_copy_, tags=(prims.OpTags.DONT_DCE,))


def fold_index_copies(bsyms: Sequence[BoundSymbol]) -> list[BoundSymbol]:
    """``bsyms`` (a trace's top level, without dels) with each out-of-place ``index_copy`` whose only reader is the
    ``copy_`` back into its own first argument made one in-place ``index_copy_`` in the ``copy_``'s place, named as
    the ``copy_``'s result.

    The rows are written where the ``copy_`` wrote the whole buffer, so every op between the two still reads the
    buffer as it was. Folded only where the two compute the same: the copy's destination is the ``index_copy``'s first
    argument (the same tensor: the same name, or one that ``update_aliases`` or an in-place update gave it); nothing but that ``copy_`` reads the out-of-place result (not a later op, not the return, not a
    backward that saves it); no op between the two updates any tensor in place (the ``copy_`` would discard an update
    of the buffer that the in-place form keeps, and the source and the index are read later than the program read
    them); neither the index nor the source is the buffer or anything thunder names as its alias (``update_aliases``:
    ``index_copy_`` refuses overlapping memory); and the ``copy_`` runs without autograd (``grad_enabled=False``:
    thunder's ``copy_`` checks a leaf that requires grad otherwise).
    """
    bsyms = list(bsyms)
    found: list[tuple[int, int]] = []
    readers: dict[str, list[int]] = {}
    for i, b in enumerate(bsyms):
        for p in _read(b):
            readers.setdefault(p, []).append(i)
    same: dict[str, str] = {}  # NOTE: ``(b,) = update_aliases((a,))`` and ``b = copy_(x, a)``: b is a, renamed

    def tensor(name: str) -> str:
        while name in same:
            name = same[name]
        return name

    for b in bsyms:
        if b.sym.name == "update_aliases" and b.args:
            for out, arg in zip(b.flat_proxy_outs, tree_flatten(b.args[0])[0]):
                if isinstance(arg, Proxy):
                    same[out.name] = tensor(arg.name)
        elif (dst := written_argument(b)) is not None and b.flat_proxy_outs:
            same[b.flat_proxy_outs[0].name] = tensor(dst.name)
    group_of = alias_root(
        [p.name for p in tree_flatten(b.args)[0] if isinstance(p, Proxy)] + [p.name for p in b.flat_proxy_outs]
        for b in bsyms
        if b.sym.name == "update_aliases"
    )
    for i, b in enumerate(bsyms):
        if b.sym.name != "index_copy" or len(b.args) != 4 or b.kwargs or len(b.flat_proxy_outs) != 1:
            continue
        dst, dim, index, src = b.args
        out = b.flat_proxy_outs[0]
        if not (isinstance(dst, TensorProxy) and isinstance(index, TensorProxy) and isinstance(src, TensorProxy)
                and isinstance(dim, int)):
            continue
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
        if group_of(index.name) == group or group_of(src.name) == group:
            continue
        if any(_updates(bsyms[k]) for k in range(i + 1, j)):
            continue
        found.append((i, j))
    if not found:
        return bsyms
    op = index_copy_in_place()
    drop = {i for i, _ in found}
    # NOTE: into the copy_'s destination: the same tensor as the index_copy's first argument, under its name there
    replace = {j: op.bind(bsyms[j].args[1], *bsyms[i].args[1:], output=bsyms[j].flat_proxy_outs[0]) for i, j in found}
    return [replace.get(k, b) for k, b in enumerate(bsyms) if k not in drop]


def _read(b: BoundSymbol) -> list[str]:
    return [p.name for p in b.flat_proxy_args]


def _updates(b: BoundSymbol) -> bool:
    """Whether ``b`` updates a tensor in place, or holds an op that does (a fusion)."""
    return any(s.sym.name in WRITES_ARGUMENT for s in walk([b]))
