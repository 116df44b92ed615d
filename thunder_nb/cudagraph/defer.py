"""A host sync whose number is only returned moves from the computation into thunder's epilogue.

``return loss, loss.item()`` (logging the loss) makes the host wait inside the forward for the GPU to
finish it. Thunder runs a jitted call as prologue, computation, the autograd connection, then the
epilogue; an ``.item()`` of a returned tensor, read by nothing but the return, gives the same number
when it runs in the epilogue instead, after the host has connected the outputs to autograd while the
GPU still runs the forward.
"""

from __future__ import annotations

from thunder.core import prims
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace

from .. import internals

__all__ = ["defer_returned_items"]

_ITEM_NAMES = frozenset({"item"})


def defer_returned_items(computation: TraceCtx, epilogue: TraceCtx | None) -> tuple[TraceCtx, TraceCtx, list[str]] | None:
    """The two traces with each deferrable ``.item()`` moved to the epilogue, and the moved numbers' names.

    Deferrable: its number is read by the return alone, its tensor is returned too, and the return is
    a flat tuple or list whose items the epilogue receives as its own arguments (the shape thunder
    gives a function returning ``loss, loss.item()``). None when there is nothing to move.
    """
    if epilogue is None or internals.signature_info(epilogue) is None or not computation.bound_symbols:
        return None  # NOTE: an epilogue without thunder's signature record cannot be given new arguments
    ret = computation.bound_symbols[-1]
    if ret.sym.id is not prims.PrimIDs.RETURN or len(ret.args) != 1:
        return None
    # NOTE: thunder's computation returns {"output": <the function's result>, "flat_args": [...]}
    structure = ret.args[0]
    outputs = structure.get("output") if isinstance(structure, dict) else None
    if not isinstance(outputs, (tuple, list)):
        return None
    returned = {p.name for p in outputs if isinstance(p, TensorProxy)}
    epi_args = list(epilogue.args)
    epi_names = [getattr(a, "name", None) for a in epi_args]
    if len(epi_names) < len(outputs) or epi_names[len(epi_names) - len(outputs):] != [
            getattr(o, "name", None) for o in outputs]:
        return None  # NOTE: thunder calls epilogue(*pro_to_epi, *output): the outputs must be its last arguments, in order
    readers: dict[str, int] = {}
    for b in computation.bound_symbols:
        for p in b.flat_proxy_args:
            readers[p.name] = readers.get(p.name, 0) + 1
    moved: list[BoundSymbol] = []
    for b in computation.bound_symbols[:-1]:
        if b.sym.name not in _ITEM_NAMES or len(b.flat_proxy_outs) != 1:
            continue
        (n,) = b.flat_proxy_outs
        (t,) = b.flat_proxy_args or (None,)
        if (isinstance(n, NumberProxy) and isinstance(t, TensorProxy) and t.name in returned
                and readers.get(n.name) == 1 and sum(o is n for o in outputs) == 1 and n.name in epi_names
                and t.name in epi_names):
            moved.append(b)
    if not moved:
        return None
    gone = {b.flat_proxy_outs[0].name for b in moved}

    comp = from_trace(computation)
    kept = tuple(o for o in outputs if not (isinstance(o, NumberProxy) and o.name in gone))
    comp.bound_symbols = [b for b in computation.bound_symbols[:-1] if all(b is not m for m in moved)]
    comp.bound_symbols.append(ret.from_bsym(args=({**structure, "output": type(outputs)(kept)},)))

    epi = from_trace(epilogue)
    epi.args = [a for a in epi_args if getattr(a, "name", None) not in gone]
    internals.drop_signature_args(epi, epilogue, gone)
    from thunder.executors.torchex import item

    body = [b for b in epilogue.bound_symbols
            if not (b.sym.id is prims.PrimIDs.UNPACK_TRIVIAL and b.flat_proxy_outs and b.flat_proxy_outs[0].name in gone)]
    at = next(i for i, b in enumerate(body) if b.sym.id is not prims.PrimIDs.UNPACK_TRIVIAL)
    epi.bound_symbols = body[:at] + [item.bind(b.flat_proxy_args[0], output=b.flat_proxy_outs[0]) for b in moved] + body[at:]
    return comp, epi, sorted(gone)

