"""Which proxies of a thunder trace may share storage, and what each symbol writes in place: a union-find over the
trace's views, copies and alias updates (`storage_of`), over-approximated: the outputs of a view (thunder's lists of
the torch ops that return or may return views, its view prims, the names of its executors' implementations of them),
of a ``copy_`` and of ``update_aliases`` share their input's storage, at any depth of an executor's or a fusion's
symbols. Read by thunder's split as `thunder_nb.internals.saved` changes it, by `thunder_nb.internals.plain_inputs`
and by `thunder_nb.internals.ordering`. And which of a joint trace's symbols are its forward's (`forward_of`)."""

from __future__ import annotations

import functools
import re
from typing import Any

from .views import alias_update, in_place, tensor_names, torch_view_symbols

__all__ = ["Storage", "storage_of", "view_symbols", "walk", "forward_of", "joint_return"]


#: words of the names of the ops that return (or may return) a view of their first input, or the input itself, as
#: thunder's executors name their implementations (``torch_prims_reshape_impl``, ``Tensor.expand``): an executor's
#: symbol of a view carries no other mark of one
_VIEW_WORDS = frozenset({
    "adjoint", "alias", "as_strided", "bitcast", "broadcast_in_dim", "chunk", "contiguous", "detach", "diagonal",
    "expand", "expand_as", "flatten", "getitem", "hsplit", "imag", "indices", "movedim", "narrow", "permute", "real",
    "reshape", "reshape_as", "select", "shallow_copy", "slice", "split", "split_with_sizes", "squeeze", "stride_order",
    "swapaxes", "swapdims", "t", "tensor_split", "to", "transpose", "type_as", "unbind", "unflatten", "unfold",
    "unsqueeze", "values", "view", "view_as", "view_as_real", "vsplit"})


def view_symbols() -> tuple[set[Any], set[Any]]:
    """thunder's torch symbols that return (or may return) a view of their first input, and the prims that do."""
    import thunder.core.prims as prims

    ids = prims.PrimIDs
    view_prims = {ids.BROADCAST_IN_DIM, ids.RESHAPE, ids.SLICE, ids.SQUEEZE, ids.TRANSPOSE, ids.UNFOLD, ids.VIEW,
                  ids.SHALLOW_COPY, ids.REAL, ids.IMAG, ids.BITCAST, ids.STRIDE_ORDER}
    always, maybe = torch_view_symbols()
    return always | maybe, view_prims


@functools.lru_cache(maxsize=4096)
def _named_as_view(name: str) -> bool:
    """Whether a symbol's name names a view (`_VIEW_WORDS`): the whole name or any run of its words."""
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name.replace("_", " ")) if w]
    runs = {"_".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, min(len(words), i + 4) + 1)}
    return bool(runs & _VIEW_WORDS) or name.split(".")[-1] in _VIEW_WORDS


class Storage:
    """Which proxies (by name) may share storage: a union-find over the trace's views, copies and alias updates."""

    def __init__(self) -> None:
        self._parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        while (up := self._parent.get(name, name)) != name:
            self._parent[name] = self._parent.get(up, up)
            name = up
        return name

    def join(self, a: str, b: str) -> None:
        self._parent[self.find(a)] = self.find(b)


def walk(bsym: Any, storage: Storage | None, writes: list[str], views: tuple[set[Any], set[Any]]) -> None:
    """Record in ``storage`` what ``bsym`` and its symbols, at any depth, make share storage (None: nothing), and in
    ``writes`` the names whose storage a ``copy_`` among them writes. Only the symbols that write or alias have their
    arguments flattened (thunder's flattening is most of a walk's time)."""
    import thunder.core.prims as prims

    view_syms, view_prims = views
    sym, sym_id = bsym.sym, getattr(bsym.sym, "id", None)
    if sym_id == prims.PrimIDs.COPY_ or (sym.name == "copy_" and not bsym.subsymbols and len(bsym.args) > 1):
        destination = bsym.args[1].name  # NOTE: prims.copy_(copy_from, copy_to) and the torch executor's copy_
        writes.append(destination)
        joined = [(out, destination) for out in tensor_names(bsym.flat_proxy_outs)]
    elif in_place(bsym):
        ins = tensor_names(bsym.flat_proxy_args)
        writes.extend(ins[:1])
        joined = [(out, ins[0]) for out in tensor_names(bsym.flat_proxy_outs)] if ins else []
    elif storage is None:
        joined = []
    elif alias_update(bsym):
        names = tensor_names(bsym.flat_proxy_args) + tensor_names(bsym.flat_proxy_outs)
        joined = [(name, names[0]) for name in names]  # NOTE: thunder's own groups of one storage, updated together
    elif sym in view_syms or sym_id in view_prims or _named_as_view(sym.name):
        ins = tensor_names(bsym.flat_proxy_args)
        joined = [(out, ins[0]) for out in tensor_names(bsym.flat_proxy_outs)] if ins else []
    else:
        joined = []
    if storage is not None:
        for a, b in joined:
            storage.join(a, b)
    for sub in bsym.subsymbols:
        walk(sub, storage, writes, views)


def storage_of(bsyms: Any) -> tuple[Any, list[list[str]]]:
    """Which proxies of ``bsyms`` (a trace's bound symbols, in order) may share storage, and what each writes: a
    function from a proxy's name to its storage's, and per symbol the names whose storage it writes in place."""
    storage, views, writes = Storage(), view_symbols(), []
    for bsym in bsyms:
        written: list[str] = []
        walk(bsym, storage, written, views)
        writes.append(written)
    return storage.find, writes


def forward_of(joint_trace: Any) -> list[Any]:
    """The forward's symbols of thunder's joint trace (its forward and backward in one trace, before the split), in
    the trace's order, less its return: those that read no gradient (a ``get_grad``'s output, or a value computed
    from one) and that the forward's outputs or its in-place writes need.

    thunder lays the joint trace out as the forward, then the backward; but with ``fusion_type="dataflow"`` (a
    ``thunder.jit`` option, ThunderFX's default) its fusion pass sorts the symbols by their data alone, and the first
    ``get_grad`` comes before forward writes (the CPU fuzzer's program 9780). The backward's own values that read no
    gradient (a primal recomputed for a rule, a zero) are left out wherever they stand.
    """
    import thunder.core.prims as prims

    bsyms = list(joint_trace.bound_symbols)
    body = bsyms[:-1] if bsyms and bsyms[-1].sym.id == prims.PrimIDs.RETURN else bsyms
    grads: set[str] = set()
    for bsym in body:
        if bsym.sym.id == prims.PrimIDs.GET_GRAD or grads.intersection(tensor_names(bsym.flat_proxy_args)):
            grads.update(tensor_names(bsym.flat_proxy_outs))
    needed = set(tensor_names(joint_return(joint_trace).get("fw_flat_out", ())))
    kept: list[Any] = []
    for bsym in reversed(body):
        outs = tensor_names(bsym.flat_proxy_outs)
        if bsym.sym.id == prims.PrimIDs.GET_GRAD or grads.intersection(outs):
            continue
        if needed.intersection(outs) or bsym.sym.name == "copy_" or in_place(bsym):
            kept.append(bsym)
            needed.update(tensor_names(bsym.flat_proxy_args))
    return kept[::-1]


def joint_return(joint_trace: Any) -> dict[str, Any]:
    """What thunder's joint trace returns: ``output`` (the inputs' gradients, in the order of the trace's arguments),
    ``flat_args``, ``fw_flat_out`` (the forward's outputs); empty where its last symbol returns no such dict."""
    import thunder.core.prims as prims

    bsyms = joint_trace.bound_symbols
    ret = bsyms[-1] if bsyms and bsyms[-1].sym.id == prims.PrimIDs.RETURN else None
    return ret.args[0] if ret is not None and ret.args and isinstance(ret.args[0], dict) else {}
