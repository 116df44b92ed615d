"""A view read after an in-place write into its base, taken again from the written base before thunder differentiates
it: the pass `rebase_stale_views`, which `thunder_nb.internals.saved` runs on the trace thunder's grad transform gets
(lightning-thunder 0.2.6).

thunder traces ``v = t.unsqueeze(1); t.mul_(x); v.sum()`` as ``v = unsqueeze(t)``, ``t2 = mul_(t, x)``, then
``(v2, t3) = update_aliases((v, t2))`` and ``sum(v2)``: at run time ``v2`` is ``v``'s memory, which the write changed,
so the value is eager's; but thunder's rule for ``update_aliases`` hands ``v2``'s gradient to ``v``, the view of ``t``
before the write, so the gradient misses the write (``2`` where eager's is ``4x``), with no error. Eager's autograd
rebases such a view onto the write. So does this pass: where a view taken by ops that always return views
(thunder's ``_syms_returning_views``: ``unsqueeze``, ``view``, ``transpose``, ``expand``, slicing, ...) is read after
a write into its base, it is taken again, by the same ops, from the base as written (``v2 = unsqueeze(t2)``), and the
reads use that. Same memory, same values; the gradient now goes through the write. Left as thunder has it (and warned
of by the split, `thunder_nb.internals.saved.stale_view_reads`): a view taken through an op that only may return a
view (``reshape``, ``contiguous``, ``to``: a copy would not see the write), and a base written through one of its
views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["rebase_stale_views", "tensor_names", "in_place", "torch_view_symbols"]


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


def in_place(bsym: Any) -> bool:
    """Whether ``bsym`` writes its first input in place: a symbol thunder tags as in-place, or one of thunder's torch
    ops with an in-place form whose symbols, at any depth, ``copy_`` into that input. thunder 0.2.6 tags ``mul_``
    and the like but not the activations: ``relu_``, ``F.relu(t, inplace=True)``, ``silu``/``dropout(inplace=True)``
    carry no tag, only the ``copy_`` inside."""
    import thunder.core.prims as prims
    import thunder.torch as ltorch

    if prims.OpTags.IN_PLACE in (getattr(bsym.sym, "tags", None) or ()):
        return True
    if bsym.sym not in getattr(ltorch, "_inplace_to_out_of_place", {}) or not bsym.subsymbols:
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


def rebase_stale_views(trace: Any) -> Any:
    """``trace`` (thunder's computation trace before its grad transform, with its alias updates), with each read of a
    view taken before an in-place write into its base reading the same view taken again from the written base. The
    same trace where there is none."""
    import thunder.core.prims as prims
    from thunder.core.proxies import variableify
    from thunder.core.pytree import tree_flatten
    from thunder.core.trace import from_trace, tracectx

    always_views, maybe_views = torch_view_symbols()
    base_of: dict[str, str] = {}  # NOTE: a tensor that is no view -> its base (its own name, or its first version's)
    generation: dict[str, int] = {}  # NOTE: base -> writes into it so far
    blocked: set[str] = set()  # NOTE: bases written through a view: nothing of theirs is rebased
    recipe: dict[str, _Recipe | None] = {}  # NOTE: view -> how it was taken (None: through an op that may copy)
    swap: dict[Any, Any] = {}  # NOTE: a stale view (thunder's variable of it) -> its proxy taken again
    new_trace = from_trace(trace)
    out: list[Any] = []

    def base(name: str) -> str:
        return base_of.setdefault(name, name)

    def rebased(name: str) -> Any | None:
        r = recipe.get(name)
        if r is None or r.base in blocked or generation.get(r.base, 0) <= r.generation:
            return None
        view = latest_proxy.get(r.base)
        if view is None:
            return None  # NOTE: a base this pass did not see made (none known): left as thunder has it
        with tracectx(new_trace):
            new_trace.push_scope([])
            try:
                for step in r.chain:
                    view = step.sym(view, *step.args[1:], **step.kwargs)
            except Exception:  # NOTE: a view op that will not take the written base: thunder's trace, and the warning
                new_trace.pop_scope()
                return None
            out.extend(new_trace.pop_scope())
        recipe[view.name] = _Recipe(r.base, generation[r.base], r.chain)
        return view

    latest_proxy: dict[str, Any] = {}  # NOTE: base -> its newest version's proxy
    for p in tree_flatten((trace.args, trace.kwargs))[0]:
        if tensor_names([p]):
            latest_proxy[base(p.name)] = p
    for bsym in trace.bound_symbols:
        alias_update = bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES
        if not alias_update:
            for p in bsym.flat_proxy_args:
                if p.name in recipe and variableify(p) not in swap and (view := rebased(p.name)) is not None:
                    swap[variableify(p)] = view
        bsym = bsym.from_bsym_swap_proxies(swap) if swap else bsym
        out.append(bsym)
        ins, outs = tensor_names(bsym.flat_proxy_args), tensor_names(bsym.flat_proxy_outs)
        if alias_update:
            for a, b in zip(ins, outs):
                if a in recipe:
                    recipe[b] = recipe[a]
                    if (view := rebased(b)) is not None:
                        swap[variableify(next(o for o in bsym.flat_proxy_outs if o.name == b))] = view
                else:
                    base_of[b] = base(a)
                    latest_proxy[base(a)] = next(p for p in bsym.flat_proxy_outs if getattr(p, "name", None) == b)
        elif (in_place(bsym) or bsym.sym.id == prims.PrimIDs.COPY_) and ins:
            destination = ins[0] if bsym.sym.id != prims.PrimIDs.COPY_ else tensor_names(bsym.args[1:2])[0]
            r = recipe.get(destination, False)
            root = r.base if r else base(destination)
            if r is not False:
                blocked.add(root if r else destination)  # NOTE: written through a view (or one that may copy)
            generation[root] = generation.get(root, 0) + 1
            for o in bsym.flat_proxy_outs:
                if getattr(o, "name", None) in outs:
                    base_of[o.name] = root
                    latest_proxy[root] = o
        elif bsym.sym in always_views or bsym.sym in maybe_views:
            source = recipe.get(ins[0], False) if ins else None
            for o in outs:
                if source is None or bsym.sym in maybe_views or len(outs) != 1:
                    recipe[o] = None
                elif source is False:
                    root = base(ins[0])
                    recipe[o] = _Recipe(root, generation.get(root, 0), (bsym,))
                else:
                    recipe[o] = _Recipe(source.base, source.generation, source.chain + (bsym,))
        else:
            for o in outs:
                latest_proxy.setdefault(base(o), next(p for p in bsym.flat_proxy_outs if p.name == o))
    if not swap:
        return trace
    new_trace.bound_symbols = out
    return new_trace

