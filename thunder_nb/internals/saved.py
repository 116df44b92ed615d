"""thunder's forward made to keep what its backward reads from being overwritten in place: one change to
``thunder.transforms.autodiff`` (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`, which every entry point calls).

thunder 0.2.6 runs an in-place op as its functional op and a ``copy_`` into the tensor (``t.mul_(x)``:
``t2 = mul(t, x); copy_(t2, t)``), and its split of the joint trace saves for the backward the proxies the backward
reads: ``t`` there, the value before the write, since ``mul``'s rule needs it. But the forward still runs the
``copy_``, which overwrites ``t``'s storage: the backward reads the product where it needs the factor. So
``t = x.sin(); t.mul_(x); t.sum()`` gets a wrong gradient with no error (2.6 off eager's on seed 0), and so does every
saved tensor that shares storage with one written later in the forward (a view of it, a buffer updated in place).
Eager's autograd keeps the original for its backward where it can and otherwise refuses ("modified by an inplace
operation"). `install` makes thunder's split keep each such saved tensor: a ``clone`` of it just before the first
write into its storage, saved in its place. The backward is unchanged, and so is the forward where nothing saved is
written (a fusion that recomputes the value in the backward saves the inputs instead: nothing to keep). Every
``thunder.jit`` traced in the process after it, thunder_nb's or not, gets eager's gradient; one traced before keeps
thunder's. `uninstall` puts thunder's split back (for the test that shows the difference).

Which tensors share storage is read from the trace, over-approximated: the outputs of a view (thunder's lists of the
torch ops that return or may return views, and its view prims), of a ``copy_`` and of ``update_aliases`` share their
input's storage, at any depth of an executor's or a fusion's symbols. An extra tensor taken as shared costs one copy,
never a wrong value.
"""

from __future__ import annotations

import re
from typing import Any

from .patches import ProcessPatch

__all__ = ["install", "uninstall", "installed", "keep_overwritten_saved"]


#: words of the names of the ops that return (or may return) a view of their first input, or the input itself, as
#: thunder's executors name their implementations (``torch_prims_reshape_impl``, ``Tensor.expand``): an executor's
#: symbol of a view carries no other mark of one
_VIEW_WORDS = frozenset({
    "adjoint", "alias", "as_strided", "bitcast", "broadcast_in_dim", "chunk", "contiguous", "detach", "diagonal",
    "expand", "expand_as", "flatten", "getitem", "hsplit", "imag", "indices", "movedim", "narrow", "permute", "real",
    "reshape", "reshape_as", "select", "shallow_copy", "slice", "split", "split_with_sizes", "squeeze", "stride_order",
    "swapaxes", "swapdims", "t", "tensor_split", "to", "transpose", "type_as", "unbind", "unflatten", "unfold",
    "unsqueeze", "values", "view", "view_as", "view_as_real", "vsplit"})


def _view_symbols() -> tuple[set[Any], set[Any]]:
    """thunder's torch symbols that return (or may return) a view of their first input, and the prims that do."""
    import thunder.core.prims as prims
    import thunder.torch as ltorch

    ids = prims.PrimIDs
    view_prims = {ids.BROADCAST_IN_DIM, ids.RESHAPE, ids.SLICE, ids.SQUEEZE, ids.TRANSPOSE, ids.UNFOLD, ids.VIEW,
                  ids.SHALLOW_COPY, ids.REAL, ids.IMAG, ids.BITCAST, ids.STRIDE_ORDER}
    return set(ltorch._syms_returning_views) | set(ltorch._syms_that_may_return_views), view_prims


def _named_as_view(name: str) -> bool:
    """Whether a symbol's name names a view (`_VIEW_WORDS`): the whole name or any run of its words."""
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name.replace("_", " ")) if w]
    runs = {"_".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, min(len(words), i + 4) + 1)}
    return bool(runs & _VIEW_WORDS) or name.split(".")[-1] in _VIEW_WORDS


class _Storage:
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


def _tensor_names(values: Any) -> list[str]:
    from thunder.core.proxies import TensorProxy

    return [p.name for p in values if isinstance(p, TensorProxy)]


def _walk(bsym: Any, storage: _Storage, writes: list[str], views: tuple[set[Any], set[Any]]) -> None:
    """Record in ``storage`` what ``bsym`` and its symbols, at any depth, make share storage, and in ``writes`` the
    names whose storage a ``copy_`` among them writes."""
    import thunder.core.prims as prims

    view_syms, view_prims = views
    ins, outs = _tensor_names(bsym.flat_proxy_args), _tensor_names(bsym.flat_proxy_outs)
    sym_id = getattr(bsym.sym, "id", None)
    if sym_id == prims.PrimIDs.COPY_ or (bsym.sym.name == "copy_" and not bsym.subsymbols and len(bsym.args) > 1):
        destination = bsym.args[1].name  # NOTE: prims.copy_(copy_from, copy_to) and the torch executor's copy_
        writes.append(destination)
        for out in outs:
            storage.join(out, destination)
    elif sym_id == prims.PrimIDs.UPDATE_ALIASES or bsym.sym.name == "update_aliases":
        for name in ins + outs:  # NOTE: thunder's own groups of tensors that share storage, updated together
            storage.join(name, ins[0])
    elif _in_place(bsym) and ins:
        writes.append(ins[0])
        for out in outs:
            storage.join(out, ins[0])
    elif ins and (bsym.sym in view_syms or sym_id in view_prims or _named_as_view(bsym.sym.name)):
        for out in outs:
            storage.join(out, ins[0])
    for sub in bsym.subsymbols:
        _walk(sub, storage, writes, views)


def _in_place(bsym: Any) -> bool:
    """Whether ``bsym``'s symbol is tagged as writing its first input (an in-place op thunder left whole)."""
    import thunder.core.prims as prims

    return prims.OpTags.IN_PLACE in (getattr(bsym.sym, "tags", None) or ())


def keep_overwritten_saved(forward_trace: Any) -> Any:
    """``forward_trace`` (the forward of `thunder.transforms.autodiff.split_into_forward_and_backward`), with each
    tensor it saves for the backward that a later in-place write overwrites kept as a clone taken before that write.
    The same trace where none is."""
    import thunder.core.prims as prims
    from thunder.core.trace import from_trace, tracectx
    from thunder.core.proxies import TensorProxy
    from thunder.executors.torchex import clone

    bsyms = list(forward_trace.bound_symbols)
    if not bsyms or bsyms[-1].sym.id != prims.PrimIDs.RETURN:
        return forward_trace
    saved_tensors, saved_other = bsyms[-1].args[1]
    if not saved_tensors:
        return forward_trace
    storage, views = _Storage(), _view_symbols()
    defined_at = {name: -1 for name in _tensor_names(forward_trace.args)}
    first_write: dict[str, int] = {}  # NOTE: saved name -> index of the first write after it into its storage
    saved_names = {p.name for p in saved_tensors}
    for i, bsym in enumerate(bsyms[:-1]):
        writes: list[str] = []
        _walk(bsym, storage, writes, views)
        for name in _tensor_names(bsym.flat_proxy_outs):
            defined_at.setdefault(name, i)
        for written in writes:
            root = storage.find(written)
            for name in saved_names - first_write.keys():
                if defined_at.get(name, -1) < i and storage.find(name) == root:
                    first_write[name] = i
    if not first_write:
        return forward_trace
    kept: dict[str, TensorProxy] = {}
    new_bsyms = []
    for i, bsym in enumerate(bsyms[:-1]):
        for p in saved_tensors:
            if first_write.get(p.name) == i and p.name not in kept:
                with tracectx(forward_trace):
                    kept[p.name] = TensorProxy(like=p)
                new_bsyms.append(clone.bind(p, output=kept[p.name]))
        new_bsyms.append(bsym)
    ret = bsyms[-1]
    saved = tuple(kept.get(p.name, p) for p in saved_tensors)
    new_bsyms.append(ret.from_bsym(args=(ret.args[0], (saved, saved_other))))
    trace = from_trace(forward_trace)
    trace.bound_symbols = new_bsyms
    trace.tags.update(forward_trace.tags)
    trace.names = forward_trace.names  # NOTE: shared with the backward trace, as thunder's split leaves them
    return trace


def _keeping_split(split: Any) -> Any:
    """thunder's ``split_into_forward_and_backward``, its forward passed through `keep_overwritten_saved`."""

    def split_keeping_saved(joint_trace: Any) -> Any:
        forward_trace, backward_trace = split(joint_trace)
        if backward_trace is None:
            return forward_trace, backward_trace
        return keep_overwritten_saved(forward_trace), backward_trace

    return split_keeping_saved


def _apply() -> dict[str, Any] | None:
    """``thunder.transforms.autodiff.split_into_forward_and_backward`` made `_keeping_split`; what it was (None: not the
    module this was written for, unchanged)."""
    from thunder.transforms import autodiff

    split = getattr(autodiff, "split_into_forward_and_backward", None)
    if not callable(split):
        return None
    autodiff.split_into_forward_and_backward = _keeping_split(split)
    return {"split_into_forward_and_backward": split}


def _restore(originals: dict[str, Any]) -> None:
    from thunder.transforms import autodiff

    autodiff.split_into_forward_and_backward = originals["split_into_forward_and_backward"]


#: thunder's split changed as this module's docstring says, once per process (`thunder_nb.internals.patches`)
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
