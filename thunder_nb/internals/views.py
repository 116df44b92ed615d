"""A view read after an in-place write into its base, taken again from the written base before thunder differentiates
it: the pass `rebase_stale_views`, which `thunder_nb.internals.saved` runs on the trace thunder's grad transform gets
(lightning-thunder 0.2.6).

thunder traces ``v = t.unsqueeze(1); t.mul_(x); v.sum()`` as ``v = unsqueeze(t)``, ``t2 = mul_(t, x)``, then
``(v2, t3) = update_aliases((v, t2))`` and ``sum(v2)``: at run time ``v2`` is ``v``'s memory, which the write changed,
so the value is eager's; but thunder's rule for ``update_aliases`` hands ``v2``'s gradient to ``v``, the view of ``t``
before the write, so the gradient misses the write (``2`` where eager's is ``4x``), with no error. Eager's autograd
rebases such a view onto the write. So does this pass: where a view taken by ops that always return views
(thunder's ``_syms_returning_views``: ``unsqueeze``, ``view``, ``transpose``, ``expand``, slicing, ...; and ``.T``,
which thunder traces as its ``transpose`` prim and 0.2.6 did not take as a view at all: with a gradient, a write
through ``t.T`` was lost from ``t``'s value) is read after
a write into its base, it is taken again, by the same ops, from the base as written (``v2 = unsqueeze(t2)``), and the
reads use that. Same memory, same values; the gradient now goes through the write.

A write through a view (``v = t[1:]; v.mul_(x)``, then ``t`` read) is the same rule's other side: thunder handed the
base the gradient of its values before the write. Where the view was taken by ``getitem``/``select``/``narrow`` with
plain indices and by views that take all of their input (`_WHOLE_VIEWS`), the base is rebuilt for the reads after the
write: its old values with the written view put in by thunder's ``setitem`` (the views undone), copied back into the
base's own memory (`_written_back`: one copy; a returned base still aliases what eager's does), so its gradient is
eager's (``CopySlices``: none to the old values where the view lies); a diagonal's, by thunder's
``diagonal_scatter``. Writes in turn are mended in turn: the same view written again before any read (its last value
is put in), and a write into the base, or through another of its views, after a read rebuilt it (the base goes on
from the rebuilt one). ``x.copy_(y)`` is a write too (thunder 0.2.6 tags it as none: the values copied into a slice
got no gradient). Left as thunder has it (and warned of by the split, `thunder_nb.internals.saved.stale_view_reads`):
a view taken through an op that only may return a view (``reshape``, ``contiguous``, ``to``: a copy would not see the
write; but a ``reshape`` to the same shape and a ``flatten`` of one dimension return a view whatever the strides, and
are taken as views) or read through one, a base that is an input, and a part of a written view written again before a
read rebuilt the base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["rebase_stale_views", "tensor_names", "in_place", "alias_update", "torch_view_symbols", "user_line",
           "WRITTEN_BACK"]

#: The source file of the symbols `rebase_stale_views` makes to copy a rebuilt base back into its memory (thunder's
#: transforms pass it on): a write of what a write through a view put there already, by which no view goes stale.
WRITTEN_BACK = "<thunder_nb: a base rebuilt after a write through its view>"


@dataclass(frozen=True)
class _Recipe:
    """How a view was taken: its base (by the name of the base's first tensor), the writes into that base before it
    (``generation``), and the view ops from the base, in order."""

    base: str
    generation: int
    chain: tuple[Any, ...]


def tensor_names(values: Any) -> list[str]:
    """The names of the tensor proxies among ``values``."""
    from thunder.core.proxies import TensorProxy

    return [p.name for p in values if isinstance(p, TensorProxy)]


def alias_update(bsym: Any) -> bool:
    """Whether ``bsym`` is thunder's ``update_aliases`` (its prim, or the torch executor's symbol of it after the
    executors' transform)."""
    import thunder.core.prims as prims

    return getattr(bsym.sym, "id", None) == prims.PrimIDs.UPDATE_ALIASES or bsym.sym.name == "update_aliases"


def in_place(bsym: Any) -> bool:
    """Whether ``bsym`` writes its first input in place: a symbol thunder tags as in-place, or one of thunder's torch
    ops with an in-place form (or ``Tensor.copy_``) whose symbols, at any depth, ``copy_`` into that input. thunder
    0.2.6 tags ``mul_`` and the like but not the activations: ``relu_``, ``F.relu(t, inplace=True)``,
    ``silu``/``dropout(inplace=True)`` carry no tag, only the ``copy_`` inside."""
    import thunder.core.prims as prims
    import thunder.torch as ltorch

    if prims.OpTags.IN_PLACE in (getattr(bsym.sym, "tags", None) or ()):
        return True
    if bsym.sym not in getattr(ltorch, "_inplace_to_out_of_place", {}) and bsym.sym.id != "torch.Tensor.copy_":
        return False  # NOTE: x.copy_(y) carries no tag either (thunder 0.2.6 comments it out)
    if not bsym.subsymbols:
        return False
    first = tensor_names(bsym.flat_proxy_args)[:1]
    return bool(first) and first[0] in _copied_into(bsym)


def _copied_into(bsym: Any) -> set[str]:
    """The names the ``copy_`` symbols among ``bsym``'s, at any depth, write."""
    import thunder.core.prims as prims

    if bsym.sym.id == prims.PrimIDs.COPY_:
        return set(tensor_names(bsym.args[1:2]))
    return set().union(*(_copied_into(sub) for sub in bsym.subsymbols)) if bsym.subsymbols else set()


def torch_view_symbols() -> tuple[set[Any], set[Any]]:
    """thunder's torch symbols that always return a view of their first input, and those that may (or a copy)."""
    import thunder.torch as ltorch

    return set(ltorch._syms_returning_views), set(ltorch._syms_that_may_return_views)


def rebase_stale_views(trace: Any) -> tuple[Any, frozenset[str]]:
    """``trace`` (thunder's computation trace before its grad transform, with its alias updates), with each read of a
    view taken before an in-place write into its base reading the same view taken again from the written base, and
    each read of a base after a write through one of its views reading the base rebuilt out of place
    (`_with_view_written`). The same trace where there is none. With it, the user's lines (``file:line``) of the
    writes through a view whose every later read it mended: the split warns of the rest
    (`thunder_nb.internals.saved.stale_view_reads`)."""
    no_mend: frozenset[str] = frozenset()
    while True:  # NOTE: a base it could not mend whole is left as thunder has it: pass again without it
        new_trace, mended, invalid = _rebase(trace, no_mend)
        if not invalid:
            return new_trace, mended
        no_mend |= invalid


def _rebase(trace: Any, no_mend: frozenset[str]) -> tuple[Any, frozenset[str], frozenset[str]]:
    """`rebase_stale_views`'s pass, with the bases named in ``no_mend`` left as thunder has them after a write through
    a view; the lines of the writes it mended; and the bases it could not mend whole (written again after such a
    write, whose later reads would get the base rebuilt before it; or read after it through a view that may be a copy
    or that thunder's ops would not take again): the pass must be run again without mending them."""
    import thunder.core.prims as prims
    from thunder.core.proxies import variableify
    from thunder.core.pytree import tree_flatten
    from thunder.core.trace import from_trace, tracectx

    always_views, maybe_views = torch_view_symbols()
    base_of: dict[str, str] = {}  # NOTE: a tensor that is no view -> its base (its own name, or its first version's)
    generation: dict[str, int] = {}  # NOTE: base -> writes into it so far
    blocked: set[str] = set()  # NOTE: bases written through a view that is not mended: nothing of theirs is rebased
    recipe: dict[str, _Recipe | None] = {}  # NOTE: view -> how it was taken (None: through an op that may copy)
    swap: dict[Any, Any] = {}  # NOTE: a stale view or base (thunder's variable of it) -> its proxy taken again
    written: dict[str, tuple[Any, _Recipe, Any]] = {}  # NOTE: base written through a view -> (view, recipe, write)
    writes_mended: list[Any] = []  # NOTE: every write through a view this pass mends, in order
    loose: dict[str, tuple[str, int]] = {}  # NOTE: a view with no recipe -> its base and the writes into it before
    rebuilt: dict[str, Any] = {}  # NOTE: such a base -> its proxy rebuilt out of place
    invalid: set[str] = set()
    inputs = set(tensor_names(tree_flatten((trace.args, trace.kwargs))[0]))
    new_trace = from_trace(trace)
    out: list[Any] = []

    def base(name: str) -> str:
        return base_of.setdefault(name, name)

    def emitted(make: Any, source: str | None = None) -> Any | None:
        """``make()``'s proxy, its symbols appended to ``out`` (None where thunder's ops refuse it), with ``source``
        as their source file where given."""
        with tracectx(new_trace):
            new_trace.push_scope([])
            new_trace.set_current_source_location(source, None)
            try:
                made = make()
            except Exception:  # NOTE: an op that will not take it: thunder's trace, and the split's warning
                new_trace.pop_scope()
                return None
            finally:
                new_trace.set_current_source_location(None, None)
            out.extend(new_trace.pop_scope())
        return made

    def latest(root: str) -> Any | None:
        """The newest proxy of ``root``: after a write through its view, the base rebuilt (once)."""
        if root not in written:
            return latest_proxy.get(root)
        if root not in rebuilt:
            if latest_proxy.get(root) is None:
                invalid.add(root)  # NOTE: a base this pass did not see made: left as thunder has it, and warned
                return None
            view, r, _ = written[root]
            made = emitted(lambda: _written_back(latest_proxy[root], r.chain, view), WRITTEN_BACK)
            if made is None:
                invalid.add(root)
                return None
            rebuilt[root] = made
            base_of[made.name] = root  # NOTE: a later write into it, or into a view of it, is a write into root
            generation[root] += 1  # NOTE: the copy back is a write: the views read after are taken again from it
        return rebuilt.get(root)

    def rebased(name: str) -> Any | None:
        r = recipe.get(name)
        if r is None or r.base in blocked or generation.get(r.base, 0) <= r.generation:
            return None
        view = latest(r.base)
        if view is None:
            return None  # NOTE: a base this pass did not see made (none known): left as thunder has it

        def take() -> Any:
            taken = view
            for step in r.chain:
                taken = step.sym(taken, *step.args[1:], **step.kwargs)
            return taken

        view = emitted(take)
        if view is not None:
            recipe[view.name] = _Recipe(r.base, generation[r.base], r.chain)
        elif r.base in written:
            invalid.add(r.base)
        return view

    latest_proxy: dict[str, Any] = {}  # NOTE: base -> its newest version's proxy
    for p in tree_flatten((trace.args, trace.kwargs))[0]:
        if tensor_names([p]):
            latest_proxy[base(p.name)] = p
    for bsym in trace.bound_symbols:
        alias_update = bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES
        writes = (in_place(bsym) or bsym.sym.id == prims.PrimIDs.COPY_) and bool(tensor_names(bsym.flat_proxy_args))
        if not alias_update:
            for p in bsym.flat_proxy_args:
                if not tensor_names([p]) or variableify(p) in swap:
                    continue
                root, taken = loose.get(p.name, ("", 0))
                if root in written and generation[root] > taken:
                    invalid.add(root)  # NOTE: a view that may be a copy, read after the write: not mended
                if p.name in recipe:
                    view = rebased(p.name)
                elif base(p.name) in written:
                    view = latest(base(p.name))  # NOTE: a base read after a write through its view: rebuilt
                else:
                    view = None
                if view is not None:
                    swap[variableify(p)] = view
        bsym = bsym.from_bsym_swap_proxies(swap) if swap else bsym
        out.append(bsym)
        ins, outs = tensor_names(bsym.flat_proxy_args), tensor_names(bsym.flat_proxy_outs)
        if alias_update:
            for a, b in zip(ins, outs):
                if a in loose:
                    loose[b] = loose[a]
                if a in recipe:
                    recipe[b] = recipe[a]
                    if (view := rebased(b)) is not None:
                        swap[variableify(next(o for o in bsym.flat_proxy_outs if o.name == b))] = view
                else:
                    base_of[b] = base(a)
                    latest_proxy[base(a)] = next(p for p in bsym.flat_proxy_outs if getattr(p, "name", None) == b)
        elif writes:
            destination = ins[0] if bsym.sym.id != prims.PrimIDs.COPY_ else tensor_names(bsym.args[1:2])[0]
            r = recipe.get(destination, False)
            root = r.base if r else base(destination)
            if root in rebuilt:  # NOTE: the base rebuilt after the last write through a view: it goes on from there
                latest_proxy[root] = rebuilt.pop(root)
                del written[root]
            elif root in written and not (r and r.chain == written[root][1].chain):
                invalid.add(root)  # NOTE: written again, not through that view, before any read rebuilt it
            generation[root] = generation.get(root, 0) + 1
            mend = (r and root not in no_mend and root not in inputs and _writable(r.chain) and len(outs) == 1
                    and r.generation == generation[root] - 1)
            if not mend and root in written:
                invalid.add(root)  # NOTE: its view written again where this pass cannot follow: not rebuilt at all
            if mend:
                o = next(p for p in bsym.flat_proxy_outs if getattr(p, "name", None) == outs[0])
                written[root] = (o, r, bsym)
                writes_mended.append(bsym)
                recipe[o.name] = _Recipe(root, generation[root], r.chain)
                continue
            if r is not False:
                blocked.add(root if r else destination)  # NOTE: written through a view (or one that may copy)
            for o in bsym.flat_proxy_outs:
                if getattr(o, "name", None) in outs:
                    base_of[o.name] = root
                    latest_proxy[root] = o
        elif bsym.sym in always_views or bsym.sym in maybe_views or bsym.sym.id == prims.PrimIDs.TRANSPOSE:
            source = recipe.get(ins[0], False) if ins else None
            for o in outs:
                if source is None or (bsym.sym in maybe_views and not _a_view_here(bsym)) or len(outs) != 1:
                    recipe[o] = None
                    if source is None and ins and ins[0] in loose:
                        loose[o] = loose[ins[0]]
                    elif source is not None:
                        root = source.base if source else base(ins[0])
                        loose[o] = (root, source.generation if source else generation.get(root, 0))
                elif source is False:
                    root = base(ins[0])
                    recipe[o] = _Recipe(root, generation.get(root, 0), (bsym,))
                else:
                    recipe[o] = _Recipe(source.base, source.generation, source.chain + (bsym,))
        else:
            for o in outs:
                latest_proxy.setdefault(base(o), next(p for p in bsym.flat_proxy_outs if p.name == o))
    if invalid:
        return trace, frozenset(), frozenset(invalid)
    mended = frozenset(user_line(write) for write in writes_mended)
    if not swap:
        return trace, mended, frozenset()
    new_trace.bound_symbols = out
    return new_trace, mended, frozenset()


def user_line(bsym: Any) -> str:
    """``bsym``'s user's line, ``file:line`` (its symbol's name where thunder kept none): how the split's warning
    names a write."""
    position, filename = getattr(bsym, "source_positions", None), getattr(bsym, "source_filename", None)
    return f"{filename}:{position.lineno}" if filename and position else bsym.sym.name


#: thunder's torch view ops that take all of their input, each undone by `_undo` (``reshape`` and ``flatten`` where
#: `_a_view_here`)
_WHOLE_VIEWS = frozenset({"unsqueeze", "squeeze", "view", "view_as", "unflatten", "transpose", "swapaxes",
                          "swapdims", "permute", "t", "movedim", "reshape", "reshape_as", "flatten"})


def _a_view_here(bsym: Any) -> bool:
    """Whether ``bsym``, an op that may return a view or a copy, returns a view whatever its input's strides: a
    ``reshape`` to the same shape, a ``flatten`` of at most one dimension or of one dimension into itself (PyTorch
    returns the input itself then)."""
    name, args = bsym.sym.name, bsym.args
    outs = [p for p in bsym.flat_proxy_outs if hasattr(p, "shape")]
    if not args or not hasattr(args[0], "shape") or len(outs) != 1:
        return False
    shape = tuple(args[0].shape)
    if name in ("reshape", "reshape_as"):
        return tuple(outs[0].shape) == shape
    if name == "flatten":
        ndim = max(len(shape), 1)
        start = args[1] if len(args) > 1 else bsym.kwargs.get("start_dim", 0)
        end = args[2] if len(args) > 2 else bsym.kwargs.get("end_dim", -1)
        return len(shape) <= 1 or (type(start) is int and type(end) is int and start % ndim == end % ndim)
    return False


def _region_key(step: Any) -> Any:
    """The basic index (ints, slices of ints, None, Ellipsis) that takes the same view as ``step`` (``getitem``,
    ``select``, ``narrow``), or None."""
    name, args = step.sym.name, step.args
    if step.kwargs:
        return None
    if name == "getitem" and len(args) == 2:
        key = args[1] if isinstance(args[1], tuple) else (args[1],)
        basic = all(k is None or k is Ellipsis or type(k) is int or (
            isinstance(k, slice) and all(v is None or type(v) is int for v in (k.start, k.stop, k.step))) for k in key)
        return key if basic else None
    if name in ("select", "narrow") and all(type(a) is int for a in args[1:]):
        dim = args[1] % max(len(args[0].shape), 1)
        if name == "select":
            return (slice(None),) * dim + (args[2],)
        start = args[2] % args[0].shape[dim] if args[2] < 0 else args[2]  # NOTE: a negative start counts from the end
        return (slice(None),) * dim + (slice(start, start + args[3]),)
    return None


def _writable(chain: tuple[Any, ...]) -> bool:
    """Whether `_with_view_written` can rebuild a base written through the view ``chain`` takes."""
    return all(step.sym.name in _WHOLE_VIEWS or step.sym.name == "diagonal" or _region_key(step) is not None
               for step in chain)


def _undo(step: Any, x: Any) -> Any:
    """``x`` (shaped as ``step``'s output) taken back to the shape of ``step``'s input by the inverse view."""
    import thunder.torch as ltorch

    name, args = step.sym.name, step.args
    as_list = len(args) == 2 and isinstance(args[1], (tuple, list))  # NOTE: permute's dims, or the transpose prim's
    if name == "permute" or (name == "transpose" and as_list):
        dims = args[1] if as_list else args[1:]
        dims = [d % len(dims) for d in dims]
        return ltorch.permute(x, [dims.index(i) for i in range(len(dims))])
    if name in ("transpose", "swapaxes", "swapdims", "t"):
        return ltorch.transpose(x, *args[1:3]) if name != "t" else ltorch.t(x)
    if name == "movedim":
        return ltorch.movedim(x, args[2], args[1])
    return ltorch.reshape(x, tuple(args[0].shape))


def _with_view_written(base: Any, chain: tuple[Any, ...], new: Any) -> Any:
    """``base`` with the memory its view ``chain`` takes replaced by ``new``, out of place (thunder's ``setitem`` and
    the views undone): the values the base holds after ``new`` was written through that view, with eager's gradient
    (the base's old values get none where the view lies, ``new`` gets the rest)."""
    import thunder.torch as ltorch

    if not chain:
        return new
    step, rest = chain[0], chain[1:]
    key = _region_key(step)
    if key is not None:
        return ltorch.setitem(base, key, _with_view_written(ltorch.getitem(base, key), rest, new))
    if step.sym.name == "diagonal":
        part = _with_view_written(step.sym(base, *step.args[1:], **step.kwargs), rest, new)
        return ltorch.diagonal_scatter(base, part, *step.args[1:], **step.kwargs)
    return _undo(step, _with_view_written(step.sym(base, *step.args[1:], **step.kwargs), rest, new))


def _written_back(base: Any, chain: tuple[Any, ...], new: Any) -> Any:
    """`_with_view_written`'s rebuilt base copied into ``base`` itself: the same memory (a returned base, or views taken
    of it later, alias it as in eager) and values, with the rebuilt base's gradient (thunder's ``copy_`` hands it to
    what it copies)."""
    import thunder.torch as ltorch

    return ltorch.copy_(base, _with_view_written(base, chain, new))
