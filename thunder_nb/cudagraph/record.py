"""Recording a region's graph instance: warm-up and capture, what it costs, and whether another may be recorded."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from thunder.transforms.cudagraph import CUDAGraphRunner

from .. import internals
from ..diagnosis.plans import GraphRecord, rotates
from .instances import (Instance, SharedCopy, byte_offset, byte_span, copy_together, non_overlapping, shared_storages,
                        once_per_object, span, storage, view_plan)
from .notices import HeldOutputsWarning

__all__ = ["record_graph", "RECORDERS", "Recording", "check_instance_budget"]

_Tensor = torch.Tensor


def check_instance_budget(fraction: Any, nbytes: Any) -> tuple[float, int | None]:
    """``instance_memory`` and ``instance_bytes`` checked (`ThunderNBRunner`'s options): ``(fraction, bytes)``."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"instance_memory is a fraction of the free device memory, in [0, 1], not {fraction!r}")
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0):
        raise ValueError(f"instance_bytes is a number of bytes (an int, 0 or more) or None, not {nbytes!r}")
    return float(fraction), nbytes


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def record_graph(runner: CUDAGraphRunner, fn: Callable[..., Any], static_inputs: Sequence[Any], warmups: int,
                 pool: Any = None) -> tuple[Any, Any]:
    """Warm ``fn`` up on a side stream, then record it into a CUDA graph; return (graph, static outputs).

    ``pool``: the memory pool of an earlier graph to record into (an instance that takes turns with it, whose
    outputs lie outside the pool: `Recording._record`); None: the runner's shared pool, or a new one.

    cuBLAS's workspaces are dropped right before and after the recording, so the workspace the
    graph's matmuls use is allocated inside the graph's own pool and lives as long as the graph
    (`internals.clear_cublas_workspaces` says why).
    """
    torch.cuda.synchronize()
    device = next((a.device.index for a in static_inputs if isinstance(a, torch.Tensor) and a.is_cuda), None)
    if device is None:  # NOTE: a region without tensor inputs (factory ops only) records on the current device
        device = torch.cuda.current_device()
    if runner.stream:
        stream, pool = runner.stream[device], runner.mem_pool[device] if pool is None else pool
    else:
        stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn(*static_inputs)
    stream.synchronize()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    internals.clear_cublas_workspaces()
    try:
        with torch.cuda.graph(graph, stream=stream, pool=pool):
            static_outputs = fn(*static_inputs)
    finally:
        internals.clear_cublas_workspaces()
    return graph, static_outputs


#: How graphs are recorded: `record_graph` on a GPU; `thunder_nb.testing.emulated_capture` swaps in a CPU stand-in.
RECORDERS: dict[str, Callable[..., tuple[Any, Any]]] = {"record": record_graph}


_detach = torch.Tensor.detach


class _LayoutChanged(Exception):
    """A region's outputs came back laid out otherwise than its first instance's (`_copying_out`)."""


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of ``t`` as a flat uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _out_buffers(first: Instance) -> list[tuple[tuple[int, ...], torch.Tensor, dict[int, torch.Tensor]]]:
    """Buffers of their own, outside any graph pool, for an instance that takes turns with ``first``: for each storage
    of ``first``'s own outputs, ``(its output positions, a fresh storage of its size as uint8, position -> the output
    laid out on it as on the first's)``."""
    groups: dict[int, list[int]] = {}
    for j, o in enumerate(first.static_outputs):
        if isinstance(o, _Tensor) and id(o) in first.objects:
            groups.setdefault(storage(o), []).append(j)
    out = []
    for js in groups.values():
        o = first.static_outputs[js[0]]
        raw = torch.empty(o.untyped_storage().nbytes(), dtype=torch.uint8, device=o.device)

        def laid_out(t: torch.Tensor, raw: torch.Tensor = raw) -> torch.Tensor:
            return torch.empty(0, dtype=t.dtype, device=t.device).set_(
                raw.untyped_storage(), t.storage_offset(), t.size(), t.stride())

        # NOTE: one view of an output at two positions, as the first has one object
        views = dict(zip(js, once_per_object(laid_out, [first.static_outputs[j] for j in js])))
        out.append((tuple(js), raw, views))
    return out


def _copying_out(fn: Callable[..., Any], buffers: list[tuple[tuple[int, ...], torch.Tensor, dict[int, torch.Tensor]]],
                 ) -> Callable[..., Any]:
    """``fn``, then each of its own outputs' storages copied whole into ``buffers`` (`_out_buffers`), which it returns
    in their place: recorded, the copies are the graph's last kernels, and the graph's outputs lie outside its pool."""

    def run(*args: Any) -> Any:
        outs = list(fn(*args))
        for js, raw, views in buffers:
            src = outs[js[0]]
            if not (isinstance(src, _Tensor) and src.untyped_storage().nbytes() == raw.numel()
                    and all(isinstance(outs[j], _Tensor) and storage(outs[j]) == storage(src)
                            and outs[j].storage_offset() == views[j].storage_offset()
                            and outs[j].size() == views[j].size() and outs[j].stride() == views[j].stride()
                            for j in js)):
                raise _LayoutChanged
            raw.copy_(_raw(src))
            for j in js:
                outs[j] = views[j]
        return outs

    return run


def _unviewed(outputs: Sequence[Any], graph_inputs: set[int]) -> tuple[Any, ...]:
    """A graph's outputs with each view (``_base`` set) replaced by a plain alias of the same memory, but in ``graph_inputs``.

    The memory, sizes and strides are the same; only autograd's view link to the base goes. thunder's
    autograd connection detaches every saved tensor that is a view, on every call (many of a transformer's
    saved tensors are views, so this is host time on every forward); an output that is no view it saves as it
    is. Nothing the runner does with its outputs reads ``_base``. One alias per object.

    ``graph_inputs``: storage addresses of the graph's inputs that lie in memory an instance writes (another
    region's output, read in place). A view of those stays a view: that instance watches its memory by
    the storage's use count alone, and only the alias thunder's connection makes of a saved view raises
    it. The graph's own outputs (watched object by object, `Instance.watch`) and views of memory no
    instance writes (a transposed weight) go without their view link.
    """
    plain: dict[int, Any] = {}
    out = []
    for o in outputs:
        if (isinstance(o, _Tensor) and internals.is_view(o) and o.untyped_storage().nbytes()
                and storage(o) not in graph_inputs):
            alias = plain.get(id(o))
            if alias is None:
                alias = plain[id(o)] = _detach(o)
            o = alias
        out.append(o)
    return tuple(out)


def _static_inputs(args: tuple[Any, ...], mask: tuple[bool, ...], copy: Callable[[Any], Any],
                   together: tuple[tuple[tuple[int, int], ...], ...]) -> tuple[Any, ...]:
    """A new instance's inputs: a static one (``mask``) as a fresh alias of itself, a copied tensor as the runner's
    ``copy`` of it, and copied tensors that share a storage one of which the region updates in place (``together``,
    `shared_storages`; a tensor and a view of it, ``x`` and ``x[7, 1]``) as copies that share one storage the same way
    (`copy_together`). Separate copies would let the graph update one without the other, and the last written back
    would undo the first on the caller's tensor (2026-12-05: the program fuzzer's ``x1.add_(0.25)`` left ``x1[7, 1]``,
    read by an ``.item()`` before it, at its old value, in the processes whose string hashing ordered the two inputs
    view last). Copies of inputs that are only read may lie apart."""
    shared = {}
    for group in together:
        members = [i for i, _ in group]
        shared.update(zip(members, copy_together([args[i] for i in members])))
    return tuple(a if not isinstance(a, torch.Tensor) else a.detach() if m else shared[i] if i in shared
                 else copy(a) for i, (a, m) in enumerate(zip(args, mask)))


def _shared_copy(group: tuple[tuple[int, int], ...], args: tuple[Any, ...], static_inputs: tuple[Any, ...],
                 written: Sequence[int]) -> SharedCopy:
    """The `SharedCopy` of a group of `shared_storages`: the bytes of the runner's one copy (`copy_together`)."""
    lo, hi = byte_span([args[i] for i, _ in group])
    first = group[0][0]
    copy = static_inputs[first]
    raw = torch.empty(0, dtype=torch.uint8, device=copy.device).set_(copy.untyped_storage(), 0, (hi - lo,), (1,))
    return SharedCopy(group, lo - byte_offset(args[first]), raw, any(i in written for i, _ in group))


class Recording:
    """`ThunderNBRunner`'s recording: a new graph instance for a key, its memory registered with the runner's
    `GraphMemory` (``memory``), what it cost noted in the region's `RegionCounts` (``counts``).

    A part of `thunder_nb.cudagraph.runner.ThunderNBRunner`: it reads the runner's options (``max_instances``,
    ``instance_memory``, ``instance_bytes``, ``rotation``) and what the transform told it (``write_back``,
    ``passthrough``, ``plans``).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._warned_held = False  # `HeldOutputsWarning` given (once per runner)

    def _record(self, fn_name: str, fn: Callable[..., Any], args: tuple[Any, ...], mask: tuple[bool, ...],
                cause: str, index: int, share: Instance | None = None) -> Instance:
        """Record an instance of region ``fn_name`` for a key; ``share``: the key's first instance, whose pool and input
        buffers the new one shares, its outputs copied whole into buffers of its own inside its graph (rotation: the
        region saves nothing for a backward, so nothing of another instance's lies in memory its replay writes but
        its outputs, which then lie outside the pool). Its cost is those buffers and what the pool grew by."""
        if share is not None:
            try:
                return self._record_one(fn_name, fn, args, mask, cause, index, share)
            except _LayoutChanged:
                pass  # NOTE: the outputs came back laid out otherwise: an instance of its own
        return self._record_one(fn_name, fn, args, mask, cause, index, None)

    def _record_one(self, fn_name: str, fn: Callable[..., Any], args: tuple[Any, ...], mask: tuple[bool, ...],
                    cause: str, index: int, share: Instance | None) -> Instance:
        # NOTE: a static input is held as a fresh alias: it keeps the memory the graph reads alive, and
        # not the caller's tensor object (a guarded hand-out is watched by its identity)
        writes = self.write_back.get(fn_name, ())
        copied = tuple(i for i, (a, m) in enumerate(zip(args, mask)) if isinstance(a, torch.Tensor) and not m)
        together = shared_storages(args, copied, writes)
        grouped = {i for group in together for i, _ in group}
        if share is None:
            static_inputs = _static_inputs(args, mask, self.get_static_buffer, together)
            buffers = []
        else:
            # NOTE: the first instance's input buffers: each replay copies its inputs in first, and replays never overlap
            static_inputs = tuple(
                a if not isinstance(a, torch.Tensor) else (
                    a.detach() if m else share.static_inputs[i] if i in grouped else share.static_inputs[i].copy_(a))
                for i, (a, m) in enumerate(zip(args, mask))
            )
            for c in share.shared:
                c.check(args)  # NOTE: as a replay of the first instance would
                c.raw.copy_(c.caller_bytes(args))
            buffers = _out_buffers(share)
            fn = _copying_out(fn, buffers)
        cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        # NOTE: the warm-up calls (and an emulated recording) run the region for real: what it updates in place where
        # it lies (a module buffer: BatchNorm's running statistics, num_batches_tracked) is put back afterwards, so
        # that the call's own replay applies the update once
        written = [static_inputs[i] for i in self.write_back.get(fn_name, ()) if mask[i]]
        kept = [t.clone() for t in written]
        before = torch.cuda.memory_allocated() if cuda else 0  # NOTE: after `kept`, which the recording does not keep
        pool_before = internals.graph_pool_bytes(share.graph) if cuda and share is not None else None
        stream = internals.current_stream()
        try:
            graph, static_outputs = RECORDERS["record"](self, fn, static_inputs, 3 if index == 0 else 1,
                                                        pool=share.pool if share is not None else None)
        except BaseException:
            internals.recover_capture(stream)
            raise
        finally:
            for t, k in zip(written, kept):
                t.copy_(k)
            del kept
        pool = torch.cuda.memory_allocated() - before if cuda else None
        inputs_memory = {storage(a) for a in static_inputs if isinstance(a, torch.Tensor)}
        memory = self.memory
        static_outputs = _unviewed(static_outputs, memory.owned(inputs_memory))
        alone = tuple(i for i in copied if i not in grouped)
        views = view_plan(fn_name, args, mask, static_inputs, static_outputs)
        # NOTE: an output that is an input itself (`x.flatten()` of a 1-D `x`: torch returns `x`), the runner's copy of
        # it or a static one's alias, is the caller's tensor itself, as in eager, not a view or an alias of it
        itself = tuple((j, i) for j, i, *_ in views if static_outputs[j] is static_inputs[i])
        itself += tuple((j, i) for j, o in enumerate(static_outputs) for i, a in enumerate(static_inputs)
                        if mask[i] and o is a and isinstance(a, torch.Tensor))
        inst = Instance(graph, static_inputs, tuple(static_outputs),
                         tuple(v for v in views if (v[0], v[1]) not in itself), index, copied,
                         tuple(i for i in writes if i in alone), self.passthrough.get(fn_name, ()) + itself,
                         tuple(static_inputs[i] for i in alone), copy_from=alone,
                         shared=tuple(_shared_copy(group, args, static_inputs, writes) for group in together))
        # NOTE: shared buffers stay the first's
        copies = [s for s, m in zip(static_inputs, mask) if isinstance(s, torch.Tensor) and not m] if share is None else []
        memory.register(inst, copies, inputs_memory)
        # NOTE: what it costs: its copies of inputs, and its graph's private pool on a GPU (outputs and intermediates:
        # the segments the allocator holds for it), or its outputs' storages where there is no pool (emulated)
        pool_segments = internals.graph_pool_bytes(graph) if cuda else None
        outputs = {id(o): o for o in inst.static_outputs if isinstance(o, torch.Tensor) and id(o) in inst.objects}
        if share is None:
            inst.nbytes = (sum({storage(static_inputs[i]): static_inputs[i].untyped_storage().nbytes()
                                for i in copied}.values())
                           + (pool_segments if pool_segments is not None
                              else sum(o.untyped_storage().nbytes() for o in outputs.values())))
        else:
            grew = pool_segments - pool_before if pool_segments is not None and pool_before is not None else 0
            inst.nbytes = sum(raw.numel() for _, raw, _ in buffers) + max(grew, 0)
        inst.cuda = cuda
        inst.pool = share.pool if share is not None else (graph.pool() if cuda and hasattr(graph, "pool") else None)
        inst.rotates = rotates(fn_name, self.plans.get(fn_name), self.rotation, self.rotation_stopped)
        counts = self.counts(fn_name)
        counts.graphs.append(GraphRecord(
            index=len(counts.graphs),
            cause=cause,
            static_bytes=sum(a.nbytes for a, m in zip(args, mask) if isinstance(a, torch.Tensor) and not m),
            pool_bytes=max(pool, 0) if pool is not None else None,
            instance=index,
        ))
        return inst

    def get_static_buffer(self, x: Any) -> Any:
        """A copy of ``x`` with ``x``'s strides (so views of it can be re-made on the caller's tensor)."""
        if not isinstance(x, torch.Tensor):
            return x
        if x.is_contiguous() or not non_overlapping(x):
            return torch.empty_like(x).copy_(x)
        lo, hi = span(x)
        base = torch.empty(hi - lo, dtype=x.dtype, device=x.device)
        buf = base.as_strided(x.size(), x.stride(), x.storage_offset() - lo)
        return buf.copy_(x)

    def _no_room(self, instances: list[Instance]) -> str | None:
        """Why no further instance of a key may be recorded (None: one may): `max_instances`, `instance_bytes`,
        `instance_memory`."""
        n = len(instances)
        if n == 0:
            return None
        if n >= self.max_instances:
            return f"max_instances={self.max_instances}"
        cost = instances[0].nbytes  # NOTE: another instance of the same key costs what the first one did
        if self.instance_bytes is not None:
            have = sum(inst.nbytes for inst in instances[1:])
            if have + cost > self.instance_bytes:
                return (f"another would take {_mib(cost)} beyond instance_bytes={self.instance_bytes} "
                        f"({_mib(have)} taken by further instances)")
        if instances[0].cuda:
            free = torch.cuda.mem_get_info()[0]
            if cost > self.instance_memory * free:
                return (f"another would take {_mib(cost)}, more than instance_memory={self.instance_memory} of the "
                        f"{_mib(free)} free on the device")
        return None

    def _warn_held(self, fn_name: str, lent: bool, n: int, full: str) -> None:
        if self._warned_held:
            return
        self._warned_held = True
        instances = f"{n} graph instance{'' if n == 1 else 's'}"
        if lent:
            why = (f"gradients that each of its {instances} lent to autograd are still "
                   "referenced (a parameter's .grad not reset, or a name), and a replay would overwrite them (reset "
                   "the gradients, optimizer.zero_grad(), before the next backward to keep the graph, or pass "
                   "lend_gradients=False to copy them out)")
        else:
            why = (f"tensors saved for the backward by each of its {instances} are still "
                   "waiting for that backward, and a replay would overwrite them (run each forward's backward "
                   "before the next forward to keep the graph)")
        why += f"; no further instance: {full}"
        warnings.warn(f"thunder-nb: {fn_name} runs without its CUDA graph on this call: {why}", HeldOutputsWarning,
                      stacklevel=4)
