"""Pure passes over bound symbols: del placement and in-place plans."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from thunder.core import prims
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx

from ..diagnosis.ops import WRITES_ARGUMENT, alias_root

__all__ = [
    "strip_top_level_dels",
    "region_del_pass",
    "replace_args",
    "walk",
    "in_place_plan",
    "has_in_place",
    "written_argument",
    "same_tensor",
    "alias_groups",
    "is_cuda_trace",
]


def strip_top_level_dels(bsyms: Sequence[BoundSymbol], *, collections: bool = False) -> list[BoundSymbol]:
    """Drop top-level ``del`` symbols (and ``clear_mutable_collection`` ones when ``collections``)."""
    out = []
    for b in bsyms:
        if b.sym.id == prims.PrimIDs.DEL:
            continue
        if collections and b.sym.id == "clear_mutable_collection":
            continue
        out.append(b)
    return out


def region_del_pass(
    bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]
) -> list[BoundSymbol]:
    """Insert dels into a region: only values produced in it and not among its outputs, after their last use.

    Existing dels are dropped. Inputs (values produced outside the region) are never deleted.
    """
    protected = {p.name for p in inputs} | {p.name for p in outputs}
    produced = {p.name for b in bsyms if b.sym.id != prims.PrimIDs.DEL for p in b.flat_proxy_outs}
    handled: set[str] = set(protected)
    result: list[BoundSymbol] = []
    for b in reversed(list(bsyms)):
        if b.sym.id == prims.PrimIDs.DEL:
            continue
        to_del = []
        for p in list(b.flat_proxy_outs) + list(b.flat_proxy_args):
            if p.name in handled or p.name not in produced:
                continue
            handled.add(p.name)
            to_del.append(p)
        if to_del:
            result.append(prims.python_del.bind(*to_del, output=None))
        result.append(b)
    result.reverse()
    return result


def replace_args(bsym: BoundSymbol, swap: dict[str, Proxy]) -> BoundSymbol:
    """Return ``bsym`` reading ``swap[name]`` wherever it read proxy ``name`` (subsymbols too)."""

    def sub(x: Any) -> Any:
        if isinstance(x, Proxy) and x.name in swap:
            return swap[x.name]
        if isinstance(x, tuple):
            return tuple(sub(e) for e in x)
        if isinstance(x, list):
            return [sub(e) for e in x]
        if isinstance(x, dict):
            return {k: sub(v) for k, v in x.items()}
        return x

    return bsym.from_bsym(
        args=sub(bsym.args),
        kwargs=sub(bsym.kwargs),
        subsymbols=[replace_args(s, swap) for s in bsym.subsymbols],
    )


def walk(bsyms: Sequence[BoundSymbol]):
    """Bound symbols and, depth first, their subsymbols."""
    for b in bsyms:
        yield b
        yield from walk(b.subsymbols)


def in_place_plan(
    bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Which inputs a region writes in place, and which outputs are inputs under another name.

    thunder names aliases with ``update_aliases``: ``(t10,) = update_aliases((x,))`` makes ``t10``
    the same tensor as ``x``, and ``t12 = copy_(t11, t10)`` then updates ``x`` (``t12`` is ``x`` too).

    Returns:
        (positions of inputs written by a ``copy_`` or another in-place op (`written_argument`),
        ((output position, input position), ...))
    """
    every = list(walk(bsyms))  # NOTE: inside fusions too (inductor's TorchCompile holds updates of its inputs)
    find, renamed = same_tensor(every)  # NOTE: a fusion's output can be an input under another name
    # NOTE: inside a fusion too (inductor's TorchCompile holds BatchNorm's ``update_aliases`` of num_batches_tracked
    # and its ``copy_``), as `dests` reads them there
    group_of = alias_groups(every)
    dests = {group_of(dst.name) for b in every if (dst := written_argument(b)) is not None}
    position = {p.name: i for i, p in enumerate(inputs)}
    written = tuple(i for i, p in enumerate(inputs) if group_of(p.name) in dests)
    through = tuple(
        (j, position[find(o.name)]) for j, o in enumerate(outputs) if o.name in renamed and find(o.name) in position
    )
    return written, through


def same_tensor(bsyms: Sequence[BoundSymbol]) -> tuple[Callable[[str], str], set[str]]:
    """The first name of each tensor, by any of its names, and the names that are a tensor renamed.

    ``(b,) = update_aliases((a,))`` makes ``b`` the same tensor as ``a``, and so does ``b = copy_(x, a)`` (an in-place
    op returns what it wrote: `written_argument`).
    """
    root: dict[str, str] = {}

    def find(name: str) -> str:
        while name in root:
            name = root[name]
        return name

    for b in bsyms:
        if b.sym.name == "update_aliases" and b.args:
            srcs = [p for p in tree_flatten(b.args[0])[0] if isinstance(p, Proxy)]
            for out, src in zip(b.flat_proxy_outs, srcs):
                root[out.name] = find(src.name)
        elif (dst := written_argument(b)) is not None and b.flat_proxy_outs:
            root[b.flat_proxy_outs[0].name] = find(dst.name)
    return find, set(root)


def alias_groups(bsyms: Sequence[BoundSymbol]) -> Callable[[str], str]:
    """The root of each name's alias group (`alias_root`): one ``update_aliases`` call names a whole group (a tensor
    and its views), so an update of any member writes the memory of every other."""
    return alias_root(
        [p.name for p in tree_flatten(b.args)[0] if isinstance(p, Proxy)] + [p.name for p in b.flat_proxy_outs]
        for b in bsyms
        if b.sym.name == "update_aliases"
    )


def written_argument(b: BoundSymbol) -> Proxy | None:
    """The argument ``b`` writes in place and returns (``copy_``'s destination; `WRITES_ARGUMENT`), or None."""
    at = WRITES_ARGUMENT.get(b.sym.name)
    if at is None or len(b.args) <= at or not isinstance(b.args[at], Proxy):
        return None
    return b.args[at]


def has_in_place(bsyms: Sequence[BoundSymbol]) -> bool:
    return any(b.sym.name in WRITES_ARGUMENT for b in bsyms)


def is_cuda_trace(trace: TraceCtx) -> bool:
    for b in trace.bound_symbols:
        for p in b.flat_proxy_outs:
            if isinstance(p, TensorProxy) and p.device.devicetype.name == "CUDA":
                return True
    return any(isinstance(a, TensorProxy) and a.device.devicetype.name == "CUDA" for a in trace.args)
