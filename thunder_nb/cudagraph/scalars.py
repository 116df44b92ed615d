"""The scalar hand-off: Python numbers that regions read become 0-d device tensors, computed exactly as PyTorch would."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from thunder.core import dtypes, prims
from thunder.core.devices import to_torch_device
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, tracectx
from thunder.executors import torchex as tx

from ..diagnosis.plans import ScalarHandoff
from .passes import has_in_place

__all__ = ["Handoff", "handoff_numbers", "ARITHMETIC", "READERS"]

#: Python arithmetic on numbers that runs on 0-d device tensors (IEEE double or int64, as Python; an int past
#: int64's range wraps there where Python's grows: not handled).
ARITHMETIC = frozenset({"add", "sub", "mul", "true_divide", "neg", "abs"})
#: Tensor ops that can read a 0-d device tensor in place of a Python number, in an exact form.
READERS = frozenset({"add", "sub", "mul", "true_divide", "div", "full_like", "full"})


@dataclass
class Handoff:
    """The result of `handoff_numbers`."""

    bsyms: list[BoundSymbol]
    handoffs: list[ScalarHandoff] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # number -> why it stays a Python number
    keep_out: set[str] = field(default_factory=set)  # outputs of symbols that must stay outside regions


def handoff_numbers(trace: TraceCtx, bsyms: Sequence[BoundSymbol], can_fuse: Callable[[BoundSymbol], bool],
                    *, cuda: bool) -> Handoff:
    """Rewrite the capturable readers of Python numbers in ``bsyms`` to read 0-d device tensors.

    A region that reads a Python number bakes it into its graph, and each new value captures a new
    graph. Here a number from ``.item()`` becomes the 0-d tensor it came from (and the host sync goes
    when nothing else needs the number); Python arithmetic on such numbers runs on 0-d float64/int64
    tensors (IEEE double, as Python computes); any other number is filled into a 0-d tensor outside
    the regions. Each reader is rewritten into a form that gives the very bits PyTorch gives with the
    number (`_reader_form`). A reader with no such form refuses: a number from an island then stays
    outside the graphs with its reader (an island); any other number stays baked in.

    Args:
        trace: the trace the symbols belong to (new proxies are named in it).
        bsyms: its bound symbols, top-level dels stripped.
        can_fuse: whether a symbol may join a region.
        cuda: the trace computes on a CUDA device (the exact forms differ between CPU and CUDA kernels).
    """
    bsyms = list(bsyms)
    sources = _data_dependent_numbers(bsyms)
    result = Handoff(bsyms)
    planned: dict[int, list[NumberProxy]] = {}
    for i, r in enumerate(bsyms):
        if r.sym.id == prims.PrimIDs.DEL or _numbers_only(r) or not can_fuse(r):
            continue
        numbers = _distinct(p for p in r.flat_proxy_args if isinstance(p, NumberProxy))
        if not numbers:
            continue
        why = _refusal(r, numbers) or _updated_between(bsyms, sources, numbers, i)
        if why is None:
            planned[i] = numbers
            continue
        for n in numbers:
            result.refused[n.name] = why
        if any(n.name in sources for n in numbers):
            # NOTE: a number from an island changes every call: keep its reader out of the graph
            result.keep_out.update(p.name for p in r.flat_proxy_outs)
    if not planned:
        _keep_arithmetic_out(result, sources)
        return result

    # NOTE: a number filled outside the graphs is filled right where it is made (not at its reader),
    # so the fill does not cut a region in two
    fills: dict[int, list[tuple[NumberProxy, Any]]] = {}
    for i, numbers in planned.items():
        for n in _filled_leaves(numbers, sources):
            if all(n.name != f.name for fs in fills.values() for f, _ in fs):
                at = next((j for j, b in enumerate(bsyms) if n.name in {p.name for p in b.flat_proxy_outs}), -1)
                fills.setdefault(at, []).append((n, _device_of(bsyms[i])))
    out: list[BoundSymbol] = []
    made: dict[str, TensorProxy] = {}
    with tracectx(trace):
        for n, device in fills.get(-1, ()):
            made[n.name] = _device_number(n, sources, made, out, result, device)
        for i, b in enumerate(bsyms):
            if i not in planned:
                out.append(b)
            else:
                for n in planned[i]:
                    if n.name not in made:
                        made[n.name] = _device_number(n, sources, made, out, result, _device_of(b))
                out.extend(_reader_form(b, made, cuda))
            for n, device in fills.get(i, ()):
                made[n.name] = _device_number(n, sources, made, out, result, device)
    # NOTE: an item or Python arithmetic nobody reads any more goes, and with it its host sync
    result.bsyms = _drop_unread_numbers(out)
    still = {p.name for b in result.bsyms for p in b.flat_proxy_outs}
    _keep_arithmetic_out(result, sources)
    for name, d in made.items():
        src = sources.get(name)
        tensor = src[1].name if src is not None and src[0] == "item" else None
        how = None if tensor else ("arithmetic" if src is not None and src[0] == "arithmetic" else "fill")
        result.handoffs.append(ScalarHandoff(name, tensor=tensor, made=how, device_tensor=d.name, kept=name in still))
    return result


# ---------------------------------------------------------------------------------------------------
# Which numbers, which readers


def _distinct(ps) -> list[Any]:
    seen: dict[str, Any] = {}
    for p in ps:
        seen.setdefault(p.name, p)
    return list(seen.values())


def _numbers_only(b: BoundSymbol) -> bool:
    """Python arithmetic: numbers in, a number out."""
    outs = b.flat_proxy_outs
    return bool(outs) and all(isinstance(p, NumberProxy) for p in outs) and all(
        isinstance(p, NumberProxy) for p in b.flat_proxy_args)


def _data_dependent_numbers(bsyms: Sequence[BoundSymbol]) -> dict[str, tuple[str, Any]]:
    """Numbers read from a 0-d tensor by ``.item()``, and Python arithmetic on them: name -> how to make it."""
    sources: dict[str, tuple[str, Any]] = {}
    for b in bsyms:
        outs = b.flat_proxy_outs
        if b.sym.id == prims.PrimIDs.UNPACK_SEQUENCE:
            for p in outs:
                if isinstance(p, NumberProxy) and _python_type(p) in (float, int):
                    sources[p.name] = ("saved", None)
            continue
        if len(outs) != 1 or not isinstance(outs[0], NumberProxy) or _python_type(outs[0]) not in (float, int):
            continue
        args = b.flat_proxy_args
        if b.sym.name == "item" and len(args) == 1 and isinstance(args[0], TensorProxy) and not args[0].shape \
                and not dtypes.is_boolean_dtype(args[0].dtype):
            sources[outs[0].name] = ("item", args[0])
        elif _numbers_only(b) and any(p.name in sources for p in args):
            # NOTE: arithmetic with an exact device form runs on 0-d tensors; any other (pow, math.sqrt) runs on
            # the host, and its number is filled into a 0-d tensor outside the graphs: a graph never bakes it
            sources[outs[0].name] = ("arithmetic", b) if b.sym.name in ARITHMETIC else ("host", b)
    return sources


def _leaves(numbers: Sequence[NumberProxy], sources: dict) -> list[NumberProxy]:
    """What ``numbers`` are made from on the device: each number, or, for one device arithmetic makes, the numbers
    that arithmetic reads, down to numbers that are not device arithmetic (an item, an argument, a saved number,
    host arithmetic); each once."""
    leaves: list[NumberProxy] = []
    todo = list(numbers)
    while todo:
        n = todo.pop()
        src = sources.get(n.name)
        if src is not None and src[0] == "arithmetic":
            todo.extend(a for a in src[1].args if isinstance(a, NumberProxy))
        else:
            leaves.append(n)
    return _distinct(leaves)


def _filled_leaves(numbers: Sequence[NumberProxy], sources: dict) -> list[NumberProxy]:
    """The numbers that are filled into 0-d tensors to make ``numbers`` on the device: the `_leaves` not made from an
    item (an argument, a saved number, host arithmetic)."""
    return [n for n in _leaves(numbers, sources) if sources.get(n.name, ("",))[0] != "item"]


def _python_type(n: NumberProxy) -> type | None:
    py = getattr(n, "python_type", None)
    return py if isinstance(py, type) else None


def _refusal(r: BoundSymbol, numbers: Sequence[NumberProxy]) -> str | None:
    name = r.sym.name
    for n in numbers:
        if _python_type(n) not in (float, int):
            return f"{n.name} is {_a(getattr(_python_type(n), '__name__', 'number'))}: only float and int numbers are handed over"
    if name not in READERS:
        return f"{r.sym.name} reads {numbers[0].name}: it has no exact form with a device tensor"
    tensors = [p for p in r.flat_proxy_args if isinstance(p, TensorProxy)]
    if name in ("full", "full_like"):
        fill = r.args[1] if len(r.args) > 1 else r.kwargs.get("fill_value")
        if len(numbers) != 1 or fill is not numbers[0] or len(tensors) != (name == "full_like"):
            return f"{name} reads {numbers[0].name} as more than its fill value"
        return None
    if len(tensors) != 1 or len(r.args) != 2 or len(numbers) != 1:
        return f"{name} reads {numbers[0].name} with other operands than one tensor"
    if any(isinstance(v, Proxy) for v in r.kwargs.values()):
        return f"{name} reads a number as a keyword"
    alpha = r.kwargs.get("alpha", 1)
    if name in ("add", "sub") and alpha not in (1, None):
        return f"{name} with alpha={alpha!r}"
    if name == "div" and r.kwargs.get("rounding_mode") is not None:
        return f"div with rounding_mode={r.kwargs['rounding_mode']!r}"
    if dtypes.is_boolean_dtype(tensors[0].dtype) or dtypes.is_complex_dtype(tensors[0].dtype):
        return f"{name} of a {tensors[0].dtype} tensor"
    return None


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def _updated_between(bsyms: Sequence[BoundSymbol], sources: dict, numbers: Sequence[NumberProxy], at: int) -> str | None:
    """An in-place update between an ``item`` and its reader may write through an alias of the 0-d tensor: the
    reader would read the tensor after the update. That holds for a number made from an item by device arithmetic
    too (the arithmetic runs at the reader), so each number is followed down to the items it is made from."""
    for n in _leaves(numbers, sources):
        src = sources.get(n.name)
        if src is None or src[0] != "item":
            continue
        name, tensor = n.name, src[1]
        start = next(i for i, b in enumerate(bsyms) if name in {p.name for p in b.flat_proxy_outs})
        if has_in_place(bsyms[start:at]):
            return (f"an in-place update between {name} = item({tensor.name}) and its reader may write "
                    f"through an alias of {tensor.name}")
    return None


def _device_of(b: BoundSymbol) -> Any:
    for p in list(b.flat_proxy_outs) + list(b.flat_proxy_args):
        if isinstance(p, TensorProxy):
            return p.device
    raise AssertionError(f"{b.sym.name}: no tensor to take a device from")


# ---------------------------------------------------------------------------------------------------
# Building the device forms (under the trace's context: new proxies get fresh names)


def _emit(out: list[BoundSymbol], trace_fn: Callable[[], Any]) -> Any:
    """Call a torch-executor op under the trace context and append the bound symbol it records."""
    from thunder.core.trace import get_tracectx

    trace = get_tracectx()
    trace.push_scope([])
    try:
        value = trace_fn()
    finally:
        scope = trace.pop_scope()
    out.extend(scope)
    return value


def _to(out: list[BoundSymbol], t: TensorProxy, dtype: Any) -> TensorProxy:
    if t.dtype == dtype:
        return t
    return _emit(out, lambda: tx.to(t, dtypes.to_torch_dtype(dtype), copy=True))


def _exact_dtype(n: NumberProxy) -> Any:
    return dtypes.float64 if _python_type(n) is float else dtypes.int64


def _device_number(n: NumberProxy, sources: dict, made: dict, out: list[BoundSymbol], result: Handoff,
                   device: Any) -> TensorProxy:
    """A 0-d device tensor that holds exactly the value of number ``n``."""
    src = sources.get(n.name)
    if src is not None and src[0] == "item":
        return src[1]  # NOTE: item() of a 0-d tensor is exactly its value
    if src is not None and src[0] == "arithmetic":
        b = src[1]
        exact = _exact_dtype(b.flat_proxy_outs[0])
        operands = []
        for a in b.args:
            if isinstance(a, NumberProxy):
                if a.name not in made:
                    made[a.name] = _device_number(a, sources, made, out, result, device)
                operands.append(_to(out, made[a.name], exact))
            else:
                operands.append(_emit(out, lambda a=a: tx.full((), a, device=to_torch_device(device),
                                                               dtype=dtypes.to_torch_dtype(exact))))
        op = getattr(tx, b.sym.name)
        return _emit(out, lambda: op(*operands))
    # NOTE: any other number (an argument, a saved number in a backward) is written on the host side of
    # the graphs, one fill per call, like a kernel argument: no sync
    exact = _exact_dtype(n)
    d = _emit(out, lambda: tx.full((), n, device=to_torch_device(device), dtype=dtypes.to_torch_dtype(exact)))
    result.keep_out.add(d.name)
    return d


def _reader_form(r: BoundSymbol, made: dict[str, TensorProxy], cuda: bool) -> list[BoundSymbol]:
    """``r`` rewritten to read device tensors, bit for bit what PyTorch computes with the Python numbers.

    PyTorch computes ``tensor op number`` in the op's math type (float32 for bf16/fp16/fp32, float64
    for fp64), with the number converted to it, then rounds once to the result dtype. A 0-d CPU
    tensor takes the same path as a number in CPU kernels, so on the CPU the tensor simply stands
    in. A 0-d CUDA tensor does not: it is cast to the other operand's dtype first. So on CUDA,
    low-precision operands are widened to float32 and the result rounded once; and a number divisor
    becomes a multiplication by its reciprocal, as PyTorch's CUDA division does for a number: the
    reciprocal taken in double precision, then rounded to the math type (measured on the H200 with
    torch 2.11 over 300 divisors per dtype: ``x / d`` equals ``x * float(1.0 / d)`` bit for bit in
    float32, float16 and bfloat16, where ``x * (1.0f / float(d))`` is one ulp off for a quarter of
    the divisors that float32 cannot hold: `bench/cuda_scalar_division.py`; `tests/cudagraph/test_scalar_exactness.py`
    checks the hand-off on the GPU).
    """
    out: list[BoundSymbol] = []
    o = r.flat_proxy_outs[0]
    name = r.sym.name
    (n,) = [p for p in r.flat_proxy_args if isinstance(p, NumberProxy)] or [None]
    d = made[n.name]
    if name in ("full", "full_like"):
        value = _to(out, d, o.dtype)
        wide = _emit(out, lambda: tx.expand(value, tuple(o.shape)))
        out.append(tx.clone.bind(wide, output=o))
        return out
    x = next(p for p in r.flat_proxy_args if isinstance(p, TensorProxy))
    number_first = isinstance(r.args[0], NumberProxy)
    math = dtypes.float64 if o.dtype == dtypes.float64 else dtypes.float32
    if not cuda and x.shape:
        # NOTE: an integer tensor with a float number computes in the default dtype, not float64
        dn = _to(out, d, math) if dtypes.is_float_dtype(o.dtype) and not dtypes.is_float_dtype(x.dtype) else d
        args = (dn, x) if number_first else (x, dn)
        out.append(r.sym.bind(*args, **r.kwargs, output=o))
        return out
    # NOTE: past here the 0-d tensor cannot stand in as it is: a CUDA kernel, or a 0-d tensor operand on the CPU
    # (two 0-d tensors promote by dtype, where a number would not)
    if name in ("add", "sub", "mul") and o.dtype in (dtypes.float32, dtypes.float64) and x.dtype == o.dtype:
        # NOTE: the number is rounded to the tensor's dtype first, as a number is; a wider 0-d tensor would
        # be read as it is (measured on the H200: off by one ulp with a float64 0-d tensor)
        dx = _to(out, d, o.dtype) if dtypes.is_float_dtype(d.dtype) else d
        args = (dx, x) if number_first else (x, dx)
        out.append(r.sym.bind(*args, **r.kwargs, output=o))
        return out
    if not dtypes.is_float_dtype(o.dtype):  # integer tensor, integer number: wrapped to the tensor's dtype
        dx = _to(out, d, o.dtype)
        args = (dx, x) if number_first else (x, dx)
        out.append(r.sym.bind(*args, **r.kwargs, output=o))
        return out
    if name in ("true_divide", "div") and number_first and dtypes.is_float_dtype(x.dtype) and cuda:
        # NOTE: a number dividend goes through the division of the tensor's own dtype: rounded to it first
        out.append(tx.true_divide.bind(_to(out, d, x.dtype), x, output=o))
        return out
    xm = _to(out, x, math)
    if name in ("true_divide", "div") and not number_first and cuda:
        wide = _to(out, d, dtypes.float64)  # NOTE: exact for a float64 number; an int64 one as Python's float(n)
        inv = _to(out, _emit(out, lambda: tx.reciprocal(wide)), math)
        op, args, kwargs = tx.mul, (xm, inv), {}
    else:
        dm = _to(out, d, math)
        op = tx.true_divide if name == "div" else getattr(tx, name)
        args, kwargs = ((dm, xm) if number_first else (xm, dm)), ({} if name in ("div", "true_divide") else r.kwargs)
    if o.dtype == math:
        out.append(op.bind(*args, **kwargs, output=o))
    else:
        y = _emit(out, lambda: op(*args, **kwargs))
        out.append(tx.to.bind(y, dtypes.to_torch_dtype(o.dtype), copy=True, output=o))
    return out


def _keep_arithmetic_out(result: Handoff, sources: dict) -> None:
    """Python arithmetic on an island's number that stays (still read) runs outside the graphs, on the host."""
    for b in result.bsyms:
        if _numbers_only(b) and any(p.name in sources for p in b.flat_proxy_args):
            result.keep_out.update(p.name for p in b.flat_proxy_outs)


def _drop_unread_numbers(bsyms: list[BoundSymbol]) -> list[BoundSymbol]:
    """Drop ``item`` and Python arithmetic whose numbers nobody reads (repeatedly: chains go whole)."""
    while True:
        read = {p.name for b in bsyms if b.sym.id != prims.PrimIDs.DEL for p in b.flat_proxy_args}
        keep = [b for b in bsyms if not ((b.sym.name == "item" or _numbers_only(b)) and b.flat_proxy_outs
                                         and all(isinstance(p, NumberProxy) and p.name not in read
                                                 for p in b.flat_proxy_outs))]
        if len(keep) == len(bsyms):
            return keep
        bsyms = keep
