"""thunder's split of forward and backward made right about in-place writes: two changes to
``thunder.transforms.autodiff`` (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`, which every entry point calls).

thunder 0.2.6 runs an in-place op as its functional op and a ``copy_`` into the tensor (``t.mul_(x)``:
``t2 = mul(t, x); copy_(t2, t)``). Three things went wrong around such a write:

- thunder's split saves for the backward the proxies the backward reads: ``t`` above, the value before the write,
  which ``mul``'s rule needs; but the forward still runs the ``copy_``, which overwrites ``t``'s storage, so the
  backward read the product where it needed the factor (``t = x.sin(); t.mul_(x); t.sum()``: a wrong gradient, no
  error). The same for a saved view of a tensor written later, or a buffer written after its use.
  `keep_overwritten_saved` saves a ``clone`` taken just before the first write into the saved tensor's storage
  instead. Eager's autograd keeps the original where it can and otherwise refuses ("modified by an inplace
  operation").
- The split keeps a ``copy_`` in the forward only where the forward still needs its destination by that name: a write
  into a tensor whose *view* the forward returns (``v = t.reshape(4, 1); t.mul_(x); return v``) went to the backward,
  so the returned view held the old values, and changed during the backward. `move_forward_writes` puts it back at the
  end of the forward (a view that `thunder_nb.internals.views` takes again from the written base keeps it there
  already).
- thunder's rule for ``update_aliases`` hands the gradient of a view read after a write into its base to the view as
  it was before the write: ``v = t.unsqueeze(1); t.mul_(x); v.sum()`` had eager's value and a wrong gradient.
  The same for a base read after a write through its view. `install` also makes thunder's grad transform take such a
  view again from the written base, and rebuild such a base, first (`thunder_nb.internals.views.rebase_stale_views`);
  where it cannot (a view through an op that may copy, a part of a written view written again before the base is
  read),
  `stale_view_reads` finds it and the split warns (`InPlaceGradientWarning`), naming the user's line of the write.

Where no write meets a saved tensor or a view read after it, the traces are thunder's own (an in-place ReLU saves its
mask; a fusion that recomputes a value in the backward saves the inputs instead). Every ``thunder.jit`` traced in the
process after `install`, thunder_nb's or not, takes this split; one traced before keeps thunder's. `uninstall` puts
thunder's back (for the tests that show the difference).

Which tensors share storage is read from the trace, over-approximated (`thunder_nb.internals.storage`): an extra
tensor taken as shared costs one copy, never a wrong value. The split also warns where the user's code writes into an
input that does not require grad a value that does (eager PyTorch makes that input require grad, thunder does not),
and where it writes into an input that requires grad (thunder gives that input no gradient):
`thunder_nb.internals.plain_inputs`.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from .patches import ProcessPatch
from .plain_inputs import written_losing_grad, written_with_grad
from .storage import Storage, forward_of, storage_of, view_symbols, walk
from .views import WRITTEN_BACK, alias_update, rebase_stale_views, tensor_names, user_line

__all__ = ["install", "uninstall", "installed", "keep_overwritten_saved", "move_forward_writes", "stale_view_reads",
           "InPlaceGradientWarning", "storage_of", "written_with_grad", "written_losing_grad"]


def keep_overwritten_saved(forward_trace: Any) -> Any:
    """``forward_trace`` (the forward of `thunder.transforms.autodiff.split_into_forward_and_backward`), with each
    tensor it saves for the backward that a later in-place write overwrites kept as a clone taken before that write.
    The same trace where none is."""
    import thunder.core.prims as prims
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import tracectx
    from thunder.executors.torchex import clone

    bsyms = list(forward_trace.bound_symbols)
    if not bsyms or bsyms[-1].sym.id != prims.PrimIDs.RETURN:
        return forward_trace
    saved_tensors, saved_other = bsyms[-1].args[1]
    if not saved_tensors:
        return forward_trace
    storage, views = Storage(), view_symbols()
    defined_at = {name: -1 for name in tensor_names(forward_trace.args)}
    first_write: dict[str, int] = {}  # NOTE: saved name -> index of the first write after it into its storage
    saved_names = {p.name for p in saved_tensors}
    for i, bsym in enumerate(bsyms[:-1]):
        writes: list[str] = []
        walk(bsym, storage, writes, views)
        for name in tensor_names(bsym.flat_proxy_outs):
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
    return _rebuilt(forward_trace, new_bsyms)


def _rebuilt(trace: Any, bsyms: list[Any]) -> Any:
    """A trace like ``trace`` (its tags, and the names it shares with its backward, as thunder's split leaves them)
    with ``bsyms``."""
    from thunder.core.trace import from_trace

    new = from_trace(trace)
    new.bound_symbols = bsyms
    new.tags.update(trace.tags)
    new.names = trace.names
    return new


def move_forward_writes(forward_trace: Any, backward_trace: Any) -> tuple[Any, Any]:
    """The traces of thunder's split, with each in-place write into a forward tensor that the split put into the
    backward (with what it computes from forward values alone) moved to the end of the forward, where the program
    wrote it.

    thunder's split keeps a ``copy_`` in the forward only where the forward still needs its destination by that name;
    a write that nothing after it in the forward reads by name, into a tensor whose *view* the forward returns
    (``v = t.reshape(4, 1); t.mul_(x); return v``), went to the backward: the returned view held the old values, then
    changed during the backward. Where such a write needs a gradient, or the backward reads what it computes, the
    traces stay as they are."""
    import thunder.core.prims as prims

    fw, bw = list(forward_trace.bound_symbols), list(backward_trace.bound_symbols)
    forward_names = set(tensor_names(forward_trace.args)) | {
        p.name for b in fw for p in b.flat_proxy_outs}
    moved: set[int] = set()
    for i, bsym in enumerate(bw):
        writes: list[str] = []
        walk(bsym, None, writes, (set(), set()))
        if not any(w in forward_names for w in writes):
            continue
        closure, needed = {i}, {p.name for p in bsym.flat_proxy_args} - forward_names
        for j in range(i - 1, -1, -1):
            outs = {p.name for p in bw[j].flat_proxy_outs}
            if outs & needed:
                if bw[j].sym.id in (prims.PrimIDs.UNPACK_SEQUENCE, prims.PrimIDs.UNPACK_TRIVIAL):
                    break  # NOTE: needs a cotangent: a write of the backward's own
                closure.add(j)
                needed = (needed - outs) | ({p.name for p in bw[j].flat_proxy_args} - forward_names)
        else:
            if not needed:
                moved |= closure
    if not moved:
        return forward_trace, backward_trace
    made = {p.name for j in moved for p in bw[j].flat_proxy_outs}
    if any(p.name in made for j, b in enumerate(bw) if j not in moved for p in b.flat_proxy_args):
        return forward_trace, backward_trace  # NOTE: the backward reads what the write computes: left to thunder
    fw = fw[:-1] + [bw[j] for j in sorted(moved)] + fw[-1:]
    return _rebuilt(forward_trace, fw), _rebuilt(backward_trace, [b for j, b in enumerate(bw) if j not in moved])


class InPlaceGradientWarning(UserWarning):
    """thunder 0.2.6 differentiates a tensor read after an in-place write into memory it shares (a view of the written
    tensor, or the base of a written view) as if the write had not happened, where `thunder_nb.internals.views`
    cannot take the view again: the gradient through it is wrong (`stale_view_reads`). It leaves an input that
    does not require grad a plain tensor where the user's code writes into it a value that does, which eager PyTorch
    makes require grad (`thunder_nb.internals.plain_inputs.written_with_grad`). And it gives an input that requires
    grad no gradient where the user's code writes into it (`thunder_nb.internals.plain_inputs.written_losing_grad`)."""


def stale_view_reads(joint_trace: Any) -> list[str]:
    """Where (the user's lines of the in-place writes) ``joint_trace`` (thunder's forward and backward in one trace,
    before its split) reads, with a gradient, a tensor that shares memory with an in-place write made after it was
    taken: a view of the written tensor, or (through thunder's alias update) the base of a written view (the CPU
    fuzzer's programs 616, 896, 1541: ``t4 = t2[2:]; t4.add_(t4)``, then ``t2`` read).

    thunder runs the write into the storage and passes the views on through ``update_aliases``, so the values are
    eager's, but its rule for ``update_aliases`` hands each view's gradient to the view as it was before the write:
    ``v = t.unsqueeze(1); t.mul_(x); v.sum()`` gets the gradient of ``t``'s old values, not of ``t * x``, with no error.
    Eager's autograd rebases such a view onto the write, and so does `thunder_nb.internals.views` before thunder's
    grad transform, where the view's ops always return views: what is left here it could not rebase, and the split
    warns of it (`InPlaceGradientWarning`)."""
    import thunder.core.prims as prims

    storage, views = Storage(), view_symbols()
    defined_at = {name: -1 for name in tensor_names(joint_trace.args)}
    with_grad = {p.name for p in joint_trace.args if getattr(p, "requires_grad", False)}
    last_write: dict[str, tuple[int, Any]] = {}  # NOTE: storage root -> (index, the writing symbol)
    stale: dict[str, Any] = {}  # NOTE: name -> the write it missed
    found: dict[str, None] = {}
    # NOTE: the forward, then its return (thunder's joint trace: the forward, the backward, the return of both)
    for i, bsym in enumerate(forward_of(joint_trace) + list(joint_trace.bound_symbols[-1:])):
        sym_id = bsym.sym.id
        if sym_id == prims.PrimIDs.DEL:
            continue
        reads = tensor_names(bsym.flat_proxy_args)
        if sym_id == prims.PrimIDs.RETURN:
            reads = tensor_names(bsym.args[0].get("fw_flat_out", ()) if isinstance(bsym.args[0], dict) else ())
        aliases = alias_update(bsym)
        outs = tensor_names(bsym.flat_proxy_outs)
        for k, name in enumerate(reads):
            write = stale.get(name) or _missed_write(name, storage, defined_at, last_write)
            if write is None:
                continue
            if aliases and k < len(outs):
                stale[outs[k]] = write
            elif not aliases and (name in with_grad or with_grad & set(tensor_names(write.flat_proxy_args))):
                found[user_line(write)] = None
        if with_grad & set(reads):
            with_grad.update(outs)
        writes: list[str] = []
        walk(bsym, storage, writes, views)
        for name in outs:
            defined_at.setdefault(name, i)
        if bsym.source_filename != WRITTEN_BACK:  # NOTE: the pass's own copy back: the values are there already
            for written in writes:
                last_write[storage.find(written)] = (i, bsym)
    return list(found)


def _missed_write(name: str, storage: Storage, defined_at: dict[str, int],
                  last_write: dict[str, tuple[int, Any]]) -> Any:
    """The write into ``name``'s storage made after ``name`` was defined (None: none)."""
    index, write = last_write.get(storage.find(name), (-2, None))
    return write if index > defined_at.get(name, -1) else None


#: the lines of the writes through a view `rebase_stale_views` mended in the grad transform of this thread's
#: compilation, which its split (thunder calls it next) leaves out of its warning
_MENDED = threading.local()


#: What the split says where thunder 0.2.6 gets a gradient wrong (``{lines}``: the user's lines of the writes).
_STALE_VIEW = (
    "thunder 0.2.6 gets a gradient wrong here: a tensor read after an in-place write into memory it shares ({lines}: a "
    "view of the written tensor, or the base of a written view) is differentiated as if the write had not happened "
    "(the values are right). Write it out of place (t = t * x instead of t.mul_(x)), or take the view after the write.")
_WRITTEN_LOSING_GRAD = (
    "thunder 0.2.6 gets a gradient wrong here: an input that requires grad is written in place ({lines}), and thunder "
    "gives that input no gradient: what made it (the layers before this function) gets none through it. Eager "
    "PyTorch differentiates through the write. Write into a new tensor (y = x + w instead of x.add_(w); inplace=False "
    "for an activation).")
_WRITTEN_WITH_GRAD = (
    "thunder 0.2.6 gets a gradient wrong here: an input that does not require grad is written in place with a value "
    "that does ({lines}). Eager PyTorch makes that input require grad (returned, it carries the gradient; the next "
    "call's write builds on this one's graph); thunder leaves it a plain tensor. Write into a new tensor (y = x - w "
    "instead of x.sub_(w)), or detach the value written.")


def _keeping_split(split: Any) -> Any:
    """thunder's ``split_into_forward_and_backward``, its traces passed through `move_forward_writes` and its forward
    then through `keep_overwritten_saved`."""

    def split_keeping_saved(joint_trace: Any) -> Any:
        mended, _MENDED.lines = getattr(_MENDED, "lines", frozenset()), frozenset()
        checks = ((lambda t: [line for line in stale_view_reads(t) if line not in mended], _STALE_VIEW),
                  (written_losing_grad, _WRITTEN_LOSING_GRAD), (written_with_grad, _WRITTEN_WITH_GRAD))
        warned: list[str] = []  # NOTE: a line is named once, by the first check that finds it
        for check, text in checks:
            lines = [line for line in check(joint_trace) if line not in warned]
            if lines:
                warnings.warn(text.format(lines=", ".join(lines)), InPlaceGradientWarning, stacklevel=2)
                warned += lines
        forward_trace, backward_trace = split(joint_trace)
        if backward_trace is None:
            return forward_trace, backward_trace
        forward_trace, backward_trace = move_forward_writes(forward_trace, backward_trace)
        return keep_overwritten_saved(forward_trace), backward_trace

    return split_keeping_saved


def _rebasing_grad_transform(grad_transform: Any) -> Any:
    """thunder's ``grad_transform_on_trace``, given the trace passed through
    `thunder_nb.internals.views.rebase_stale_views` first."""

    def grad_transform_rebasing_views(trace: Any, *args: Any, **kwargs: Any) -> Any:
        trace, _MENDED.lines = rebase_stale_views(trace)
        return grad_transform(trace, *args, **kwargs)

    return grad_transform_rebasing_views


def _apply() -> dict[str, Any] | None:
    """``thunder.transforms.autodiff``'s ``split_into_forward_and_backward`` made `_keeping_split` and its
    ``grad_transform_on_trace`` made `_rebasing_grad_transform`; what they were (None: not the module this was
    written for, unchanged)."""
    from thunder.transforms import autodiff

    split = getattr(autodiff, "split_into_forward_and_backward", None)
    grad_transform = getattr(autodiff, "grad_transform_on_trace", None)
    if not callable(split) or not callable(grad_transform):
        return None
    autodiff.split_into_forward_and_backward = _keeping_split(split)
    autodiff.grad_transform_on_trace = _rebasing_grad_transform(grad_transform)
    return {"split_into_forward_and_backward": split, "grad_transform_on_trace": grad_transform}


def _restore(originals: dict[str, Any]) -> None:
    from thunder.transforms import autodiff

    for name, original in originals.items():
        setattr(autodiff, name, original)


#: thunder's split changed as this module's docstring says, once per process (`thunder_nb.internals.patches`)
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
