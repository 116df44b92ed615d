"""CUDA-graph transforms for thunder 0.2.6: the corrected deletion pass, and the July 2024 legacy one.

`FixedCUDAGraphTransform` is what a user drops into ``thunder.jit(fn, transforms=[...])``:

- ops that must not be captured (host syncs such as ``.item()``, device transfers, CPU ops of a
  CUDA trace) stay outside regions, as islands; `thunder_nb.analysis.classify_bsym` decides,
  the same code the checker uses;
- inside a region only values produced there and not among its outputs are deleted, right after
  their last use; a value from outside a region is never deleted inside it and is an input only if
  the region computes with it; top-level dels are regenerated after fusion, right after the last
  consumer;
- a Python number produced by an island and consumed by a region is handed over as the 0-d device
  tensor it came from, so new values do not capture new graphs (`handoff_scalars`);
- backward traces that receive non-tensor saved values work (thunder 0.2.6 asserts there);
- tensors returned to the caller are copied out of the runner's static output buffers;
- ``capture="auto"`` runs regions eagerly (with one warning) when there is no CUDA device.

`LegacyCUDAGraphTransform` reproduces the behaviour behind upstream issue #728, for teaching and
regression tests.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from thunder.core import prims, utils
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy, unvariableify
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace, reset_tracectx, set_tracectx
from thunder.core import vjp_utils
from thunder.executors.data_dependent_partition import Node, consecutive_fusion, dataflow_fusion
from thunder.executors.passes import _del_last_used
from thunder.executors.utils import Region
from thunder.transforms.cudagraph import CUDAGraphRunner, CUDAGraphTransform

from .analysis import IN_PLACE_NAMES, alias_root, classify_bsym
from .model import GraphRecord

__all__ = [
    "FixedCUDAGraphTransform",
    "LegacyCUDAGraphTransform",
    "ThunderNBRunner",
    "EagerFallbackWarning",
    "HeldOutputsWarning",
    "recover_from_failed_capture",
    "region_del_pass",
    "strip_top_level_dels",
    "handoff_scalars",
]

class HeldOutputsWarning(UserWarning):
    """A region ran without its graph: tensors that its last replay saved for the backward were still held."""


class EagerFallbackWarning(UserWarning):
    """Regions ran eagerly (no CUDA graph was captured)."""


def recover_from_failed_capture() -> None:
    """Leave CUDA's random number generators usable after a capture that failed.

    torch 2.11 ends a failed capture without its generator epilogue, so each default CUDA generator
    stays in capture mode and the next random op outside a capture raises "Offset increment
    outside graph capture encountered unexpectedly" (pytorch/pytorch#171263). A fresh copy of each
    generator's state (same seed and offset, not capturing) puts that right. Call it after thunder's
    own transform failed to capture; `FixedCUDAGraphTransform` and `LegacyCUDAGraphTransform` call it
    themselves.
    """
    if not torch.cuda.is_available():
        return
    for generator in torch.cuda.default_generators:
        try:
            generator.graphsafe_set_state(generator.clone_state())
        except RuntimeError:  # NOTE: a device still capturing, or one torch never initialised
            pass


# ---------------------------------------------------------------------------------------------------
# The runner: capture or eager, graph records, copy-out


class ThunderNBRunner(CUDAGraphRunner):
    """A `CUDAGraphRunner` that can run regions eagerly and records every graph it captures.

    Args:
        capture: ``"auto"`` (capture when the region's tensors are on a CUDA device), True (always
            capture), False (always run the region's Python function eagerly).
        share_mem_pool: as thunder's runner.
    """

    def __init__(self, *, capture: bool | str = "auto", share_mem_pool: bool = False):
        super().__init__(share_mem_pool=share_mem_pool)
        self.capture = capture
        self.copy_out: dict[str, tuple[bool, ...]] = {}  # fn_name -> which outputs reach the caller
        # fn_name -> ((arg position, torch dtype, torch device), ...): Python numbers fed through 0-d device buffers
        self.scalar_slots: dict[str, tuple[tuple[int, torch.dtype, torch.device], ...]] = {}
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}
        # fn_name -> input positions the region updates in place (copied back to the caller's tensor)
        self.write_back: dict[str, tuple[int, ...]] = {}
        # fn_name -> ((output position, input position), ...): outputs that are an input itself (update_aliases)
        self.passthrough: dict[str, tuple[tuple[int, int], ...]] = {}
        self.graph_records: dict[str, list[GraphRecord]] = {}
        self.eager_calls: dict[str, int] = {}
        self.replays: dict[str, int] = {}
        self._last_key: dict[str, Any] = {}
        # cache key -> ((output position, input position, size, stride, storage offset delta), ...):
        # outputs of that graph that are views of the static copy of an input (`_view_plan`)
        self._views: dict[Any, tuple[tuple[int, int, tuple[int, ...], tuple[int, ...], int], ...]] = {}
        # fn_name -> output positions saved for the backward (thunder keeps them after the call)
        self.saved_out: dict[str, tuple[int, ...]] = {}
        self._held: dict[Any, list[weakref.ref]] = {}  # cache key -> the saved outputs of its last replay
        self.held_calls: dict[str, int] = {}  # fn_name -> calls run without the graph (`call_cuda_graph`)
        self._warned = False
        self._warned_held = False

    def _should_capture(self, args: Sequence[Any]) -> bool:
        if self.capture is False:
            return False
        if self.capture is True:
            return True
        if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            return True
        if not self._warned:
            self._warned = True
            warnings.warn(
                "thunder-nb: no CUDA tensors in this region, so regions run eagerly and no CUDA graph is captured",
                EagerFallbackWarning,
                stacklevel=4,
            )
        return False

    def _slot_args(self, fn_name: str, args: tuple[Any, ...], *, capture: bool) -> tuple[Any, ...]:
        """Put each planned Python number into its 0-d device buffer (filled now, before the replay)."""
        slots = self.scalar_slots.get(fn_name)
        if not slots:
            return args
        args = list(args)
        for pos, dtype, device in slots:
            value = args[pos]
            if not capture:
                # NOTE: eager mode computes with a fresh 0-d tensor, so CPU runs check the same region code
                args[pos] = torch.tensor(value, dtype=dtype, device=device)
                continue
            buf = self._buffers.get((fn_name, pos))
            if buf is None:
                buf = self._buffers[(fn_name, pos)] = torch.empty((), dtype=dtype, device=device)
            buf.fill_(value)  # a kernel argument: no host sync, no copy from pageable memory
            args[pos] = buf
        return tuple(args)

    def make_static_inputs_mask(self, fn_name: str, *args: Any) -> tuple[bool, ...]:
        """thunder's mask, with the scalar buffers static (they are filled in place)."""
        mask = super().make_static_inputs_mask(fn_name, *args)
        slots = self.scalar_slots.get(fn_name)
        if slots:
            mask = list(mask)
            for pos, _, _ in slots:
                mask[pos] = True
            mask = tuple(mask)
        return mask

    def call_cuda_graph(self, fn_name: str, *args: Any) -> Any:
        """Run region ``fn_name``: replay (capturing on a cache miss), or call its function eagerly."""
        fn, _ = self.python_callables[fn_name]
        if not self._should_capture(args):
            self.eager_calls[fn_name] = self.eager_calls.get(fn_name, 0) + 1
            return fn(*self._slot_args(fn_name, args, capture=False))
        args = self._slot_args(fn_name, args, capture=True)
        key = self.make_cache_key(fn_name, *args)
        entry = self.cuda_graph_cache.get(key)
        if entry is None:
            mask = self.make_static_inputs_mask(fn_name, *args)
            before = torch.cuda.memory_allocated()
            try:
                entry = self.cuda_graph_cache[key] = self.build_cuda_graph(fn, args, mask)
            except BaseException:
                recover_from_failed_capture()
                raise
            pool = torch.cuda.memory_allocated() - before
            records = self.graph_records.setdefault(fn_name, [])
            records.append(
                GraphRecord(
                    index=len(records),
                    cause=_recapture_cause(self._last_key.get(fn_name), key, self.trace_symbols[fn_name][1]),
                    static_bytes=_static_bytes(args, mask),
                    pool_bytes=max(pool, 0),
                )
            )
            self._views[key] = _view_plan(fn_name, args, entry[1], entry[2])
        elif any(r() is not None for r in self._held.get(key, ())):
            # NOTE: a tensor the last replay saved for the backward is still held (a forward whose
            # backward has not run yet): a replay would overwrite it, and with it that backward's result
            self.held_calls[fn_name] = self.held_calls.get(fn_name, 0) + 1
            if not self._warned_held:
                self._warned_held = True
                warnings.warn(
                    f"thunder-nb: {fn_name} runs without its CUDA graph on this call: tensors its last replay "
                    "saved for the backward are still waiting for that backward, and a replay would overwrite "
                    "them (run the backward of each forward before the next forward to keep the graph)",
                    HeldOutputsWarning,
                    stacklevel=4,
                )
            return fn(*self._slot_args(fn_name, args, capture=False))
        self._last_key[fn_name] = key
        graph, static_inputs, static_outputs = entry
        for static_input, arg in zip(static_inputs, args):
            if static_input is not arg and isinstance(arg, torch.Tensor):
                static_input.copy_(arg)
        graph.replay()
        for pos in self.write_back.get(fn_name, ()):
            # NOTE: the replay updated the static copy of this input; the caller's tensor must see it
            if static_inputs[pos] is not args[pos]:
                args[pos].copy_(static_inputs[pos])
        self.replays[fn_name] = self.replays.get(fn_name, 0) + 1
        outputs = list(static_outputs)
        views = self._views.get(key, ())
        for out_pos, in_pos, size, stride, delta in views:
            # NOTE: an output that is a view of a copied input is a view of the runner's static copy;
            # the caller must get the same view of its own tensor, or later in-place updates through
            # it (thunder may apply them in the backward) and reads after updates of the input miss
            a = args[in_pos]
            outputs[out_pos] = a.as_strided(size, stride, a.storage_offset() + delta)
        rebased = {v[0] for v in views}
        saved = self.saved_out.get(fn_name)
        if saved:
            # NOTE: hand out aliases of the saved outputs and watch them: while one lives, thunder's
            # autograd still holds the tensor for a backward that has not run
            held = []
            for j in saved:
                if j not in rebased:
                    outputs[j] = outputs[j].detach()
                    held.append(weakref.ref(outputs[j]))
            self._held[key] = held
        for out_pos, in_pos in self.passthrough.get(fn_name, ()):
            # NOTE: an output that is an input (an alias thunder tracks with update_aliases) must be the
            # caller's tensor, not the graph's static copy of it, or later in-place updates miss the caller
            outputs[out_pos] = args[in_pos]
        mask = self.copy_out.get(fn_name)
        if not mask:
            return outputs
        # NOTE: the next replay overwrites static outputs; what the caller keeps must be its own
        return [o.clone() if c and j not in rebased else o for j, (o, c) in enumerate(zip(outputs, mask))]

    def region_stats(self, fn_name: str) -> dict[str, Any]:
        """Return ``{"graphs": (GraphRecord, ...), "captured": bool | None, "eager_calls": n, "replays": n, "held_calls": n}``."""
        graphs = tuple(self.graph_records.get(fn_name, ()))
        eager = self.eager_calls.get(fn_name, 0)
        captured = True if graphs else (False if eager else None)
        return {"graphs": graphs, "captured": captured, "eager_calls": eager, "replays": self.replays.get(fn_name, 0),
                "held_calls": self.held_calls.get(fn_name, 0)}

    @property
    def graphs_captured(self) -> int:
        """How many CUDA graphs this runner captured, all regions together."""
        return len(self.cuda_graph_cache)


def _view_plan(
    fn_name: str, args: Sequence[Any], static_inputs: Sequence[Any], static_outputs: Sequence[Any]
) -> tuple[tuple[int, int, tuple[int, ...], tuple[int, ...], int], ...]:
    """Which outputs of a just-captured graph are views of the static copy of an input, and which views.

    Each entry is ``(output position, input position, size, stride, storage offset delta)``: after a
    replay, ``args[input].as_strided(size, stride, args[input].storage_offset() + delta)`` is the same
    view of the caller's tensor (the cache key fixes the input's strides, and the copy keeps them).
    """
    plan = []
    for j, o in enumerate(static_outputs):
        if not isinstance(o, torch.Tensor) or o.untyped_storage().nbytes() == 0:
            continue
        ptr = o.untyped_storage().data_ptr()
        for i, (s, a) in enumerate(zip(static_inputs, args)):
            if not isinstance(s, torch.Tensor) or s is a or s.untyped_storage().data_ptr() != ptr:
                continue
            if s.stride() != a.stride():
                warnings.warn(
                    f"thunder-nb: {fn_name} returns a view of its input {i}, whose static copy has other strides "
                    f"({tuple(s.stride())} against {tuple(a.stride())}); that output is a view of the copy",
                    stacklevel=4,
                )
                break
            plan.append((j, i, tuple(o.size()), tuple(o.stride()), o.storage_offset() - s.storage_offset()))
            break
    return tuple(plan)


def _static_bytes(args: Sequence[Any], mask: Sequence[bool]) -> int:
    return sum(a.nbytes for a, s in zip(args, mask) if isinstance(a, torch.Tensor) and not s)


def _recapture_cause(old: Any, new: Any, inputs: Sequence[Any]) -> str:
    if old is None:
        return "first call"
    names = [getattr(p, "name", f"arg{i}") for i, p in enumerate(inputs)]
    od, nd = old[2], new[2]
    for i, name in enumerate(names):
        for field, label in (("non_tensor_args", "value"), ("dtypes", "dtype"), ("sizes", "shape"), ("strides", "strides")):
            a, b = getattr(od, field), getattr(nd, field)
            if a is not None and b is not None and i < len(a) and a[i] != b[i]:
                if label == "value":
                    return f"{name}: value {a[i]!r} -> {b[i]!r}"
                return f"{name}: {label} {tuple(a[i]) if label != 'dtype' else a[i]} -> {tuple(b[i]) if label != 'dtype' else b[i]}"
    if old[1] != new[1]:
        return "static-input mask changed"
    return "cache key changed"


# ---------------------------------------------------------------------------------------------------
# Pure passes over bound symbols


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
            b = _replace_args(b, swap_map)
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


def _buffer_plan(n: NumberProxy, readers: Sequence[BoundSymbol]) -> tuple[Any, Any] | str:
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


def _replace_args(bsym: BoundSymbol, swap: dict[str, Proxy]) -> BoundSymbol:
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
        subsymbols=[_replace_args(s, swap) for s in bsym.subsymbols],
    )


def _walk(bsyms: Sequence[BoundSymbol]):
    """Bound symbols and, depth first, their subsymbols."""
    for b in bsyms:
        yield b
        yield from _walk(b.subsymbols)


def _in_place_plan(
    bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Which inputs a region writes in place, and which outputs are inputs under another name.

    thunder names aliases with ``update_aliases``: ``(t10,) = update_aliases((x,))`` makes ``t10``
    the same tensor as ``x``, and ``copy_(t11, t10)`` then updates ``x``.

    Returns:
        (positions of inputs written by a ``copy_``, ((output position, input position), ...))
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
    # NOTE: one update_aliases call names a whole alias group (a tensor and its views): a copy_ into
    # any member writes the memory of every input in the group
    top = alias_root(
        [p.name for p in tree_flatten(b.args)[0] if isinstance(p, Proxy)] + [p.name for p in b.flat_proxy_outs]
        for b in bsyms
        if b.sym.name == "update_aliases"
    )
    dests = {top(b.flat_proxy_args[1].name) for b in _walk(bsyms) if b.sym.name == "copy_" and len(b.flat_proxy_args) > 1}
    position = {p.name: i for i, p in enumerate(inputs)}
    written = tuple(i for i, p in enumerate(inputs) if top(p.name) in dests)
    through = tuple(
        (j, position[find(o.name)]) for j, o in enumerate(outputs) if o.name in root and find(o.name) in position
    )
    return written, through


def _has_in_place(bsyms: Sequence[BoundSymbol]) -> bool:
    return any(b.sym.name == "copy_" for b in bsyms)


def _returned_names(trace: TraceCtx) -> set[str]:
    """Names of the tensors that reach the caller (the user's outputs; every output of a backward)."""
    out = trace.output
    if isinstance(out, dict) and "output" in out:
        out = out["output"]
    elif isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict) and "output" in out[0]:
        out = out[0]["output"]
    flat, _ = tree_flatten(out)
    return {p.name for p in flat if isinstance(p, TensorProxy)}


def _is_cuda_trace(trace: TraceCtx) -> bool:
    for b in trace.bound_symbols:
        for p in b.flat_proxy_outs:
            if isinstance(p, TensorProxy) and p.device.devicetype.name == "CUDA":
                return True
    return any(isinstance(a, TensorProxy) and a.device.devicetype.name == "CUDA" for a in trace.args)


# ---------------------------------------------------------------------------------------------------
# The transforms


def _check_capture(capture: Any) -> bool | str:
    if not (capture is True or capture is False or capture == "auto"):
        raise ValueError(f"capture must be one of ['auto', True, False], not {capture!r}")
    if capture is True and not torch.cuda.is_available():
        raise RuntimeError("capture=True needs a CUDA device, and torch sees none (use capture='auto' or False)")
    return capture


class _BaseTransform(CUDAGraphTransform):
    label = "base"
    safe_dataflow = True  # fall back to consecutive fusion when dataflow fusion could reorder in-place updates

    def __init__(self, *, capture: bool | str = "auto", copy_outputs: bool = True, share_mem_pool: bool = False):
        super().__init__(share_mem_pool=False)
        self.capture = _check_capture(capture)
        self.copy_outputs = copy_outputs
        self.cuda_graph_runner = ThunderNBRunner(capture=self.capture, share_mem_pool=share_mem_pool)
        self.scalar_handoffs: dict[str, list[str]] = {}  # region -> ["f20 -> t19"]
        self.handoff_refusals: dict[str, str] = {}  # number -> why it stays a Python number
        self._cuda = False
        self._returned: set[str] = set()
        self._saved: set[str] = set()  # names a forward trace saves for its backward
        self.notes: list[str] = []  # decisions the report should mention

    @property
    def graphs_captured(self) -> int:
        """CUDA graphs captured so far, all regions together."""
        return self.cuda_graph_runner.graphs_captured

    def _plan_scalar_slots(self, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy]):
        """Which Python-number inputs can be fed through a 0-d device buffer (no re-capture per value)."""
        return [], []

    def _make_fusion(self, bsyms: list[BoundSymbol], inputs: list[Proxy], outputs: list[Proxy]) -> BoundSymbol:
        runner = self.cuda_graph_runner
        fusion_callable, fusion_name = runner.make_cuda_graph_callable_from_symbols(bsyms, inputs, outputs)
        copy = tuple(isinstance(o, TensorProxy) and o.name in self._returned for o in outputs)
        if self.copy_outputs and any(copy):
            runner.copy_out[fusion_name] = copy
        saved = tuple(
            j for j, o in enumerate(outputs)
            if isinstance(o, TensorProxy) and o.name in self._saved and not (self.copy_outputs and copy[j])
        )
        if saved:
            runner.saved_out[fusion_name] = saved
        written, through = _in_place_plan(bsyms, inputs, outputs)
        if written:
            runner.write_back[fusion_name] = written
        if through:
            runner.passthrough[fusion_name] = through
            if fusion_name in runner.copy_out:
                keep = dict(through)
                runner.copy_out[fusion_name] = tuple(c and i not in keep for i, c in enumerate(runner.copy_out[fusion_name]))
            if fusion_name in runner.saved_out:
                runner.saved_out[fusion_name] = tuple(j for j in runner.saved_out[fusion_name] if j not in keep)
        slots, notes = self._plan_scalar_slots(bsyms, inputs)
        if slots:
            runner.scalar_slots[fusion_name] = tuple(slots)
        if notes:
            self.scalar_handoffs.setdefault(fusion_name, []).extend(notes)
        sym = Symbol(fusion_name, meta=None, is_fusion=True, executor=self)
        return BoundSymbol(sym, inputs, {}, outputs, bsyms, _call_ctx={fusion_name: fusion_callable})

    def _fuse_groups(self, trace: TraceCtx, groups: list[list[BoundSymbol]]) -> list[BoundSymbol]:
        producers, consumers = utils.producers_and_consumers(trace)
        out: list[BoundSymbol] = []
        for bsyms in groups:
            if len(bsyms) == 1 or not self.can_fuse(bsyms[0]):
                out.extend(bsyms)
                continue
            out.append(self.fuse(Region(producers, consumers, bsyms), 0))
        return out

    def _begin(self, trace: TraceCtx) -> bool:
        """Prepare for fusing ``trace``; return whether it is a backward trace.

        Unlike thunder's transform, saved tensors are not tagged as static inputs of the backward's
        graphs (read where the forward graph left them): a backward region copies them into its own
        static inputs. The forward may hand the backward tensors outside its graph's buffers (a call
        run without the graph while saved tensors were held, an output re-made as a view of the
        caller's tensor), and a graph that read the forward's buffers would then read stale values.
        """
        backward = trace.siginfo().name == "backward_fn"
        self._cuda = _is_cuda_trace(trace)
        return backward

    def _finish(self, fused: TraceCtx, start_ns: int, what: str) -> TraceCtx:
        """Record the pass in the provenance."""
        ms = (time.perf_counter_ns() - start_ns) // 1_000_000
        fused.set_provenance(TraceProvenance(f"{what} (took {ms} milliseconds)"))
        return fused

    def _fused_trace(self, trace: TraceCtx, work: TraceCtx, fusion_type: str | None) -> TraceCtx:
        """A trace like ``trace`` whose bound symbols are ``work``'s, grouped and fused into regions."""
        fused = from_trace(trace)
        # NOTE: thunder's can_fuse bookkeeping expects this attribute on the trace in context
        fused.clear_collection_names = set()
        tok = set_tracectx(fused)
        try:
            fused.bound_symbols = self._fuse_groups(work, self._groups(work, fusion_type))
        finally:
            delattr(fused, "clear_collection_names")
            reset_tracectx(tok)
        return fused

    def _groups(self, trace: TraceCtx, fusion_type: str | None) -> list[list[BoundSymbol]]:
        def should_fuse(a: Node, b: Node) -> bool:
            def ok(n: Node) -> bool:
                return len(n.group_bsyms) > 1 or self.can_fuse(n.group_bsyms[0])

            return ok(a) and ok(b)

        from thunder.core.compile_data import get_compile_option

        kind = fusion_type or get_compile_option("fusion_type", "Choose the type of fusion to use") or "consecutive"
        if kind == "dataflow" and self.safe_dataflow and _has_in_place(trace.bound_symbols):
            # NOTE: dataflow fusion follows producer -> consumer edges only; an in-place update is no
            # such edge for the other readers of its destination, which it may then be moved past
            self.notes.append("dataflow fusion replaced by consecutive: the trace updates tensors in place")
            kind = "consecutive"
        if kind == "dataflow":
            return dataflow_fusion(trace, should_fuse)
        if kind == "consecutive":
            return consecutive_fusion(trace, should_fuse)
        raise ValueError(f"unknown fusion_type {kind!r} (must be one of ['consecutive', 'dataflow'])")


class FixedCUDAGraphTransform(_BaseTransform):
    """thunder's CUDA-graph transform with islands kept out, a corrected deletion pass and no re-capture.

    Args:
        capture: ``"auto"`` (default: capture on CUDA, otherwise run regions eagerly with one
            `EagerFallbackWarning`), True (always capture; error without CUDA), False (always eager).
        scalar_handoff: hand island scalars to regions as 0-d device tensors (default True): the
            0-d tensor an ``item()`` read, or else a 0-d device buffer filled before each replay.
        copy_outputs: copy tensors returned to the caller out of the static output buffers
            (default True). False saves a copy per output and call, but the next call then
            overwrites what the previous one returned (as with thunder's transform).
        share_mem_pool: as thunder's transform.
    """

    label = "fixed"

    def __init__(
        self,
        *,
        capture: bool | str = "auto",
        scalar_handoff: bool = True,
        copy_outputs: bool = True,
        share_mem_pool: bool = False,
    ):
        super().__init__(capture=capture, copy_outputs=copy_outputs, share_mem_pool=share_mem_pool)
        self.scalar_handoff = scalar_handoff
        self._handed: dict[str, str] = {}  # number -> the 0-d tensor that replaced it (current trace)

    def _plan_scalar_slots(self, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy]):
        if not self.scalar_handoff:
            return [], []
        from thunder.core.devices import to_torch_device
        from thunder.core.dtypes import to_torch_dtype

        slots, notes = [], []
        for pos, p in enumerate(inputs):
            if not isinstance(p, NumberProxy):
                continue
            readers = [b for b in bsyms if b.sym.id != prims.PrimIDs.DEL and any(a.name == p.name for a in b.flat_proxy_args)]
            plan = _buffer_plan(p, readers)
            if isinstance(plan, str):
                self.handoff_refusals[p.name] = plan
                continue
            dtype, device = plan
            slots.append((pos, to_torch_dtype(dtype), to_torch_device(device)))
            notes.append(f"{p.name} -> 0-d {to_torch_dtype(dtype)} buffer".replace("torch.", ""))
        return slots, notes

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        """Whether ``bsym`` may join a region: never a del, a host sync, a transfer or a CPU op of a CUDA trace."""
        if bsym.sym.id == prims.PrimIDs.DEL or bsym.sym.id == "clear_mutable_collection":
            return False
        if bsym.sym.id in (
            prims.PrimIDs.UNPACK_TRIVIAL,
            prims.PrimIDs.UNPACK_KEY,
            prims.PrimIDs.UNPACK_EMPTY_DICT,
            prims.PrimIDs.UNPACK_SEQUENCE,
            prims.PrimIDs.RETURN,
            prims.PrimIDs.ITEM,
        ):
            return False
        if bsym.sym.name in IN_PLACE_NAMES:
            # NOTE: inside a graph an in-place update writes the runner's static copy of a tensor, and
            # its result leaves the region as a static buffer; run it on the real tensors instead
            return False
        return classify_bsym(bsym, cuda_trace=self._cuda) is None

    def region_dels(self, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]):
        """The region's del pass (`region_del_pass`); override to study memory without it."""
        return region_del_pass(bsyms, inputs, outputs)

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        """Make one region's fusion symbol, with the corrected region del pass."""
        inputs = [unvariableify(i) for i in region.inputs]
        outputs = [unvariableify(o) for o in region.outputs]
        bsyms = self.region_dels(region.bound_symbols, inputs, outputs)
        fusion = self._make_fusion(bsyms, inputs, outputs)
        hand = [f"{n} -> {t}" for n, t in self._handed.items() if any(p.name == t for p in inputs)]
        if hand:
            self.scalar_handoffs[fusion.sym.name] = hand
        return fusion

    def transform_trace_post_optimization(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        """Fuse regions into CUDA graphs and regenerate the dels of the top level."""
        start = time.perf_counter_ns()
        backward = self._begin(trace)
        self._returned = _returned_names(trace) if not backward else {
            p.name for p in tree_flatten(trace.output)[0] if isinstance(p, TensorProxy)
        }
        self._saved = (
            {p.name for p in vjp_utils.get_saved_for_backward_tensors(trace) if isinstance(p, TensorProxy)}
            if TraceTag.AUGMENTED_FORWARD in trace.tags else set()
        )
        work = from_trace(trace)
        work.bound_symbols = strip_top_level_dels(trace.bound_symbols, collections=backward)
        self._handed = {}
        if self.scalar_handoff:
            work.bound_symbols, self._handed, refused = handoff_scalars(work.bound_symbols, self.can_fuse)
            self.handoff_refusals.update(refused)

        fused = self._fused_trace(trace, work, None)
        flat_out, _ = tree_flatten(utils.sequencify(trace.output))
        fused.bound_symbols = _del_last_used(fused.bound_symbols, flat_out, clear_mutable_collections=backward)
        return self._finish(fused, start, "thunder-nb corrected CUDAGraph fusion")


class LegacyCUDAGraphTransform(_BaseTransform):
    """The July 2024 behaviour behind upstream issue #728, for teaching and regression tests.

    The del pass runs before fusion and its dels are fused into regions as they are (no per-region
    regeneration); fusion is ``"dataflow"``; the torch executor's ``item`` is kept out of regions.
    On ``x.sum().item()`` its region deletes and then returns the same name (UnboundLocalError).
    """

    label = "legacy"
    safe_dataflow = False  # July 2024 behaviour, reordering included

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        """thunder's rule of the time, plus the torch executor's ``item`` kept out."""
        if bsym.sym.name == "item":
            return False
        return super().can_fuse(bsym)

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        """Make the fusion symbol with the region's bound symbols as they are, dels included."""
        inputs = [unvariableify(i) for i in region.inputs]
        outputs = [unvariableify(o) for o in region.outputs]
        return self._make_fusion(list(region.bound_symbols), inputs, outputs)

    def transform_trace_post_optimization(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        """Fuse along dataflow over a trace that already has its dels (as in July 2024)."""
        start = time.perf_counter_ns()
        self._begin(trace)
        self._returned = set()
        fused = self._fused_trace(trace, trace, "dataflow")
        return self._finish(fused, start, "thunder-nb legacy (July 2024) CUDAGraph fusion")
