"""The scalar hand-off: island numbers handed to regions on the device, exactly, so new values capture nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from thunder.core import prims
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol

from .passes import replace_args

__all__ = ["handoff_scalars", "buffer_plan"]


def handoff_scalars(bsyms: Sequence[BoundSymbol], can_fuse) -> tuple[list[BoundSymbol], dict[str, str], dict[str, str]]:
    """Plan the hand-over of island scalars to regions as the 0-d tensors they came from.

    For every ``n = item(t)`` (``t`` a 0-d tensor) whose number ``n`` is read by capturable ops,
    those ops read ``t`` instead when that computes the same values: every reader is an elementwise
    op whose tensor operands all have ``t``'s dtype (so PyTorch's type promotion and the kernel's
    compute type are the same as with the Python number). The ``item`` itself stays when its number
    is still needed (returned, read by an island); otherwise it is dropped, and with it the host sync.

    Returns:
        (new bound symbols, {number: tensor} handed over, {number: why not} kept as numbers)
    """
    producers: dict[str, BoundSymbol] = {}
    for b in bsyms:
        for p in b.flat_proxy_outs:
            producers.setdefault(p.name, b)
    readers: dict[str, list[BoundSymbol]] = {}
    for b in bsyms:
        if b.sym.id in (prims.PrimIDs.DEL,):
            continue
        for p in b.flat_proxy_args:
            readers.setdefault(p.name, []).append(b)

    bsyms = list(bsyms)
    position = {id(b): i for i, b in enumerate(bsyms)}
    handed: dict[str, str] = {}
    refused: dict[str, str] = {}
    swaps: dict[str, TensorProxy] = {}
    for b in bsyms:
        if b.sym.name != "item" or len(b.flat_proxy_outs) != 1:
            continue
        n = b.flat_proxy_outs[0]
        src = b.flat_proxy_args[0] if b.flat_proxy_args else None
        if not isinstance(n, NumberProxy) or not isinstance(src, TensorProxy) or len(src.shape) != 0:
            continue
        fusible_readers = [r for r in readers.get(n.name, ()) if can_fuse(r) and r.sym.id != prims.PrimIDs.RETURN]
        if not fusible_readers:
            continue
        start, end = position[id(b)], max(position[id(r)] for r in fusible_readers)
        if any(x.sym.name == "copy_" for x in bsyms[start:end]):
            refused[n.name] = (f"an in-place update between {n.name} = item({src.name}) and its readers may write "
                               f"through an alias of {src.name}")
            continue
        why = _handoff_refusal(n, src, fusible_readers)
        if why:
            refused[n.name] = why
            continue
        swaps[n.name] = src
        handed[n.name] = src.name

    if not swaps:
        return list(bsyms), handed, refused
    swap_map = swaps
    new: list[BoundSymbol] = []
    for b in bsyms:
        if can_fuse(b) and any(p.name in swap_map for p in b.flat_proxy_args) and b.sym.id != prims.PrimIDs.RETURN:
            b = replace_args(b, swap_map)
        new.append(b)
    # drop an item whose number nobody reads any more
    still_read = {p.name for b in new if b.sym.id != prims.PrimIDs.DEL for p in b.flat_proxy_args}
    final = []
    for b in new:
        if b.sym.name == "item" and b.flat_proxy_outs and b.flat_proxy_outs[0].name in swaps:
            if b.flat_proxy_outs[0].name not in still_read:
                continue
        final.append(b)
    return final, handed, refused


# NOTE: ops for which PyTorch computes bit-identical results with a Python number or a 0-d tensor of
# the same dtype in its place. Not div (a CPU-scalar divisor becomes a multiplication by its
# reciprocal), not pow (scalar exponents take special paths), not ops with a number-only keyword (alpha).
_ELEMENTWISE = frozenset({"add", "sub", "mul", "maximum", "minimum", "where", "eq", "ne", "lt", "le", "gt", "ge"})


def _in_kwargs(bsym: BoundSymbol, name: str) -> bool:
    flat, _ = tree_flatten(bsym.kwargs)
    return any(isinstance(p, Proxy) and p.name == name for p in flat)


def _handoff_refusal(n: NumberProxy, src: TensorProxy, readers: Sequence[BoundSymbol]) -> str | None:
    for r in readers:
        base = r.sym.name.rsplit(".", 1)[-1]
        if base not in _ELEMENTWISE or _in_kwargs(r, n.name):
            return f"{r.sym.name} reads {n.name}: only some elementwise ops take a 0-d tensor in its place exactly"
        for p in r.flat_proxy_args:
            if isinstance(p, TensorProxy) and p.name != src.name and p.dtype != src.dtype:
                return (f"{r.sym.name} mixes {n.name} (from a {src.dtype} tensor) with a {p.dtype} tensor: "
                        "its 0-d tensor would promote or round differently from a Python number")
        if not any(isinstance(p, TensorProxy) for p in r.flat_proxy_args):
            return f"{r.sym.name} computes with numbers only"
    return None


def buffer_plan(n: NumberProxy, readers: Sequence[BoundSymbol]) -> tuple[Any, Any] | str:
    """Return (thunder dtype, device) of an exact 0-d buffer for number ``n``, or why there is none.

    Exact means PyTorch computes the same values with the buffer as with the Python number: every
    reader is elementwise, its tensors share one dtype D, and D takes the number without rounding
    differently (f32/f64 for a float; any float or integer dtype for an int).
    """
    from thunder.core import dtypes

    py = getattr(n, "python_type", None)
    if py not in (float, int):
        return f"{n.name} is a {getattr(py, '__name__', py)}: only float and int numbers are handed over"
    if not readers:
        return f"{n.name} is not read inside the region"
    tensor_dtypes, devices = set(), set()
    for r in readers:
        base = r.sym.name.rsplit(".", 1)[-1]
        if base not in _ELEMENTWISE or _in_kwargs(r, n.name):
            return f"{r.sym.name} reads {n.name}: only some elementwise ops take a 0-d tensor in its place exactly"
        ts = [a for a in r.flat_proxy_args if isinstance(a, TensorProxy)]
        if not ts:
            return f"{r.sym.name} computes with numbers only"
        tensor_dtypes.update(t.dtype for t in ts)
        devices.update(t.device for t in ts)
    if len(tensor_dtypes) != 1 or len(devices) != 1:
        return f"{n.name} meets tensors of several dtypes or devices"
    (dt,) = tensor_dtypes
    (dev,) = devices
    if py is float and dt not in (dtypes.float32, dtypes.float64):
        return (f"{n.name} meets {dt} tensors: a Python float computes in float32 there, "
                "a 0-d buffer would round first (kept as a number)")
    if py is int and dtypes.is_boolean_dtype(dt):
        return f"{n.name} meets boolean tensors"
    return (dt if py is float else dtypes.int64), dev
