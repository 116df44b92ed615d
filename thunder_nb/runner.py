"""The CUDA-graph runner: capture and replay, with the memory each graph writes known by storage."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from thunder.transforms.cudagraph import ArgsDescriptor, CUDAGraphRunner

from . import internals
from .instances import (
    Instance,
    copy_together,
    foreign_counts,
    non_overlapping,
    rebase,
    replay,
    span,
    storage,
    view_plan,
)
from .model import GraphRecord, HandOutStats, RegionPlan, RegionStats, StaticInputChange

__all__ = [
    "ThunderNBRunner",
    "EagerFallbackWarning",
    "HeldOutputsWarning",
    "RecaptureWarning",
    "record_graph",
    "RECORDERS",
]


def _check_instance_memory(budget: Any) -> float | int:
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"instance_memory must be a fraction (a float) or bytes (an int), not {budget!r}")
    if isinstance(budget, float) and not 0.0 <= budget <= 1.0:
        raise ValueError(f"instance_memory as a float is a fraction of the free device memory, in [0, 1]: {budget}")
    if budget < 0:
        raise ValueError(f"instance_memory must not be negative: {budget}")
    return budget


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class HeldOutputsWarning(UserWarning):
    """A region ran without a graph: every instance's outputs saved for the backward were still held."""


class EagerFallbackWarning(UserWarning):
    """Regions ran eagerly (no CUDA graph was captured)."""


class RecaptureWarning(UserWarning):
    """A region read too many values of a Python number to capture a graph for each: it runs without a graph."""


def record_graph(runner: CUDAGraphRunner, fn: Callable[..., Any], static_inputs: Sequence[Any], warmups: int) -> tuple[Any, Any]:
    """Warm ``fn`` up on a side stream, then record it into a CUDA graph; return (graph, static outputs).

    cuBLAS's workspaces are dropped right before and after the recording, so the workspace the
    graph's matmuls use is allocated inside the graph's own pool and lives as long as the graph
    (`internals.clear_cublas_workspaces` says why).
    """
    torch.cuda.synchronize()
    device = next((a.device.index for a in static_inputs if isinstance(a, torch.Tensor) and a.is_cuda), None)
    if device is None:  # NOTE: a region without tensor inputs (factory ops only) records on the current device
        device = torch.cuda.current_device()
    if runner.stream:
        stream, pool = runner.stream[device], runner.mem_pool[device]
    else:
        stream, pool = torch.cuda.Stream(), None
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



@dataclass(slots=True)
class _Counts:
    graphs: list[GraphRecord] = field(default_factory=list)
    replays: int = 0
    eager_calls: int = 0
    held_calls: int = 0
    keys: set = field(default_factory=set)
    addresses: dict[int, set[int]] = field(default_factory=dict)  # static input position -> addresses seen
    demoted: dict[int, StaticInputChange] = field(default_factory=dict)  # input position -> copied from now on
    rebound: dict[int, StaticInputChange] = field(default_factory=dict)  # input position -> rebound (stock runner)
    values: set = field(default_factory=set)  # the Python-number values keys were made for
    eager_reason: str | None = None  # why the region now runs without a graph on every call
    last_key: Any = None
    last: Any = None  # the instance replayed last
    last_instances: Any = None  # the instances of `last_key` (the fixed runner)
    again: _KeyAgain | None = None  # proves that a call's key is `last_key` without making it (the fixed runner)
    again_misses: int = 0  # calls whose `again` failed where `_key` then made `last_key` all the same


#: Calls whose `_KeyAgain` failed while `_key` made the same key, before a region stops making them (a guard stricter
#: than the key on some input: each call would pay for both).
_AGAIN_MISSES = 4


def _getter(positions: Sequence[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """``args -> tuple(args[i] for i in positions)`` in one C call."""
    if len(positions) == 1:
        (i,) = positions
        return lambda args: (args[i],)
    return operator.itemgetter(*positions) if positions else (lambda args: ())


@dataclass(frozen=True, slots=True)
class _KeyAgain:
    """Whether a call's arguments make a region's last key again, proved in a few C calls instead of `_key`'s pass.

    `ThunderNBRunner._key` reads each input's dtype, sizes and strides, and each static input's address, in Python:
    about a microsecond per input on the GPU host, 200 inputs a step on a 6-layer nanoGPT. This proves the
    same key where it holds: the tensors by torch.compile's C guard on their metadata (Python type, dtype,
    device, ``requires_grad``, sizes, strides: the key's entries and more), the static ones' data addresses in
    one C call, the other arguments by equality and type, and each copied tensor by the test `_key` makes (its
    memory not a graph's nor a parameter's, where `_key` would read it in place). A static input's address is
    the address of the tensor its instance holds (`ThunderNBRunner._record` keeps an alias), so the same
    address is the same memory. Anything that fails goes to `_key`.
    """

    tensors: Callable[[tuple[Any, ...]], tuple[Any, ...]]  # args -> the tensor arguments (each object once)
    metadata: Callable[..., bool]  # `internals.metadata_guard` over them (it refuses a tensor given twice)
    repeats: tuple[tuple[int, int], ...]  # (position, earlier position of the same tensor): a tied weight
    ptrs: list[int | None]  # per argument position: the data address of a static input
    static: list[int]  # positions of static inputs
    values: Callable[[tuple[Any, ...]], tuple[Any, ...]]  # args -> the other arguments
    expected: tuple[Any, ...]  # their values
    types: tuple[type, ...]  # their types
    copied: tuple[int, ...]  # positions of tensors copied in (demoted ones aside)

    def holds(self, args: tuple[Any, ...], owner: dict[int, Any], stable: set[int]) -> bool:
        if not self.metadata(*self.tensors(args)):
            return False
        for i, j in self.repeats:
            if args[i] is not args[j]:
                return False
        if self.static and not internals.data_ptrs_equal(list(args), self.ptrs, self.static):
            return False
        values = self.values(args)
        if values != self.expected or tuple(map(type, values)) != self.types:
            return False
        for i in self.copied:
            ptr = args[i].untyped_storage().data_ptr()
            if ptr in owner or ptr in stable:  # NOTE: now memory `_key` reads in place: a different key
                return False
        return True


@dataclass(frozen=True, slots=True)
class _HandOutMemo:
    """`ThunderNBRunner._memo`: one hand-out's work on the graphs' own outputs, valid while its ids stay the same."""

    own: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None  # the tensors at the positions of own outputs
    own_ids: list[int]  # their ids when made
    recordings: int  # the runner's recordings when made
    saved: frozenset[int]  # storage addresses of the own outputs guarded
    guarded: int  # how many own outputs are guarded (watched)
    loose_guard: tuple[int, ...]  # guard positions that are not own outputs: looked up at each call
    copy: tuple[tuple[int, int, Any], ...]  # per copy position: (position, storage address, owner); owner None: look up
    # `_copy_groups` of ``copy`` worked out once (singles, shared, lent): all are own outputs, none in a saved one's
    # memory (None: per call)
    groups: tuple[tuple[int, ...], tuple[tuple[int, ...], ...], tuple[int, ...]] | None


class ThunderNBRunner(CUDAGraphRunner):
    """A `CUDAGraphRunner` that never hands out memory a later replay writes, and can run regions eagerly.

    The memory model: each graph instance owns the storages its replays write (its outputs, its
    copies of inputs). A static input is read where it lies and is keyed by address, so another
    tensor gets its own graph; parameters and memory another graph owns are static, everything else
    is copied. At each hand-out (`hand_out`) a returned tensor in owned memory is copied out (views
    of one buffer stay views of one copy) and a tensor saved for the backward is guarded: while it
    is held, the next call replays another instance, recorded while the memory it costs fits
    (`instance_memory`, `max_instances`), and only past that runs the region without a graph.

    Args:
        capture: ``"auto"`` (capture when the region's tensors are on a CUDA device), True, or False
            (always run the region's Python function eagerly).
        share_mem_pool: as thunder's runner.
        stock: behave exactly like thunder's runner (static slots by position, outputs handed out as
            they are), recording graphs and hazards; how thunder's own transform is shown.
        max_instances: graph instances per cache key at most (a bound on recordings; memory bounds them first).
        instance_memory: what a further instance may cost: a fraction of the device's free memory (a float, default
            0.25: an instance that would take more than a quarter of what is free is not recorded), or bytes (an int:
            all of a key's instances together, the first one included). A held call with no room runs without a graph.
        max_addresses: addresses one static input may take before it is copied instead.
        max_values: values of the region's Python numbers (each its own graph) before it runs without a graph.
    """

    def __init__(self, *, capture: bool | str = "auto", share_mem_pool: bool = False, stock: bool = False,
                 max_instances: int = 16, instance_memory: float | int = 0.25, max_addresses: int = 32,
                 max_values: int = 8):
        super().__init__(share_mem_pool=share_mem_pool)
        self.capture = capture
        self.stock = stock
        self.max_instances = max_instances
        self.instance_memory = _check_instance_memory(instance_memory)
        self.max_addresses = max_addresses
        self.max_values = max_values
        self.plans: dict[str, RegionPlan] = {}
        self.write_back: dict[str, tuple[int, ...]] = {}  # fn_name -> input positions updated in place
        # fn_name -> ((output position, input position), ...): outputs that are an input (update_aliases)
        self.passthrough: dict[str, tuple[tuple[int, int], ...]] = {}
        self.cuda_regions: dict[str, bool] = {}  # fn_name -> the region computes on a CUDA device (set by the transform)
        self._capture_of: dict[str, bool] = {}  # fn_name -> capture (decided at its first call)
        self._owner: dict[int, Any] = {}  # storage address -> the `Instance` whose replay writes it
        # id of a graph's own output tensor -> (that tensor, its storage address, its `Instance`, its key entry, its
        # data address): the hand-out's and the key's lookup without making a storage object per tensor (the tensor
        # is checked by identity, ids are reused)
        self._own_outputs: dict[int, tuple[torch.Tensor, int, Any, tuple, int]] = {}
        self._stable: set[int] = set()  # storage addresses of parameters and module buffers seen (views read in place)
        self._params: dict[int, int] = {}  # id of a parameter -> its data address when its storage was added to _stable
        self.stable_inputs: dict[str, frozenset[int]] = {}  # fn_name -> input positions of module buffers
        self._counts: dict[str, _Counts] = {}
        self._hand_out_counts: dict[str, dict[str, int]] = {}  # trace kind -> calls, copied, guarded
        self._hand_out_plans: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # `_hand_out_plan`s
        self._hand_out_memo: dict[tuple, _HandOutMemo] = {}  # per hand-out plan: the latest `_memo`
        self._recordings = 0  # graphs recorded so far (a memo made before a recording is stale)
        # a lent gradient was still held at its instance's next call: "lend" hand-outs copy from then on
        self.lending_stopped = False
        self._warned = False
        self._warned_held = False

    # --- the call path ----------------------------------------------------------------------------

    def _should_capture(self, fn_name: str, args: Sequence[Any]) -> bool:
        """Capture or run eagerly: decided once per region (``"auto"``: by the device the trace computes on)."""
        decided = self._capture_of.get(fn_name)
        if decided is not None:
            return decided
        if self.capture is False or self.capture is True:
            decided = self.capture
        else:
            cuda = self.cuda_regions.get(fn_name)
            if cuda is None:  # NOTE: a runner not told by its transform judges by the arguments
                cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            decided = cuda
            if not cuda and not self._warned:
                self._warned = True
                warnings.warn(
                    "thunder-nb: no CUDA tensors in this region, so regions run eagerly and no CUDA graph is captured",
                    EagerFallbackWarning,
                    stacklevel=5,
                )
        self._capture_of[fn_name] = decided
        return decided

    def _count(self, fn_name: str) -> _Counts:
        counts = self._counts.get(fn_name)
        if counts is None:
            counts = self._counts[fn_name] = _Counts()
        return counts

    def call_cuda_graph(self, fn_name: str, *args: Any) -> Any:
        """Run region ``fn_name``: replay a free instance (capturing on a miss), or call its function eagerly."""
        counts = self._count(fn_name)
        if counts.eager_reason is not None or not self._should_capture(fn_name, args):
            counts.eager_calls += 1
            return self.python_callables[fn_name][0](*args)
        if self.stock:
            return self._call_stock(fn_name, counts, args)
        again = counts.again
        if again is not None and again.holds(args, self._owner, self._stable):
            key, instances = counts.last_key, counts.last_instances
        else:
            mask, key = self._key(fn_name, counts, args)
            # NOTE: the same key as the last call's (the usual case) is found by comparing, not by hashing it again:
            # the entries of graphs' own outputs are the very objects, and the cache never drops a key
            if key == counts.last_key:
                instances = counts.last_instances
                if again is not None:
                    counts.again_misses += 1
                # NOTE: the second call with this key: prove it from now on (not where proving keeps failing)
                counts.again = self._again(counts, args, mask) if counts.again_misses < _AGAIN_MISSES else None
            else:
                counts.again = None
                instances = self.cuda_graph_cache.get(key)
            if instances is None:
                if self._too_many_values(fn_name, counts, key):
                    counts.eager_calls += 1
                    return self.python_callables[fn_name][0](*args)
                mask, key = self._new_key(fn_name, counts, args, mask, key)
                instances = self.cuda_graph_cache.setdefault(key, [])
        for inst in instances:
            if not inst.watched or not inst.held():
                break
        else:
            fn = self.python_callables[fn_name][0]
            lent = any(inst.lent for inst in instances)
            if lent and not self.lending_stopped:
                # NOTE: a gradient lent to autograd outlived its step (accumulated into .grad, kept by a name): this
                # instance stays held while it lives, and so would the next one's; copy them out from now on
                self.lending_stopped = True
                self._hand_out_memo.clear()
            full = self._no_room(instances)
            if full is not None:
                counts.held_calls += 1
                self._warn_held(fn_name, lent, len(instances), full)
                return fn(*args)
            cause = _recapture_cause(counts.last_key, key, self.trace_symbols[fn_name][1], args,
                                     self._owner) if not instances else (
                f"outputs of {len(instances)} instance{'' if len(instances) == 1 else 's'} still held "
                + ("(gradients lent to autograd, not reset)" if lent else "for a backward"))
            before = foreign_counts(self._foreign(args))
            inst = self._record(fn_name, fn, args, key[1], cause, len(instances))
            inst.settle()
            rebase(before)
            instances.append(inst)
        counts.last_key, counts.last, counts.last_instances = key, inst, instances
        outputs = replay(inst, args)
        counts.replays += 1
        return outputs

    def _key(self, fn_name: str, counts: _Counts, args: tuple[Any, ...]) -> tuple[tuple[bool, ...], tuple]:
        """Per call, in one pass over the inputs: which the graph reads where they lie, and the cache key.

        Static: a parameter, a module buffer or a view of one, or memory a graph of this runner owns. Anything else
        is copied into the graph's own buffer. An input past `max_addresses` is copied too. The key is
        ``(fn_name, mask, entries, addresses)``: per input ``(dtype, size, stride)`` of a tensor or
        ``(type, value)`` of anything else (thunder's descriptor, `_descriptor`), and the addresses of
        the static inputs.
        """
        owner, stable, demoted, own, params = self._owner, self._stable, counts.demoted, self._own_outputs, self._params
        buffers = self.stable_inputs.get(fn_name, ())
        entries, mask, addresses = [], [], []
        entry, static_of, address = entries.append, mask.append, addresses.append
        for i, a in enumerate(args):
            cls = type(a)
            if cls is _Tensor:
                hit = own.get(id(a))
                if hit is not None and hit[0] is a:
                    # NOTE: a graph's own output (what a forward saved, read by its backward): static, and its entry
                    # and address were taken when it was recorded (the runner's tensor; no code outside changes them).
                    # This branch and the parameters' end on their own tail, not the shared one below: one fewer test
                    # per input on the hot path (about 4 µs per backward call of the nanoGPT step, CPU)
                    entry(hit[3])
                    if demoted and i in demoted:
                        static_of(False)
                    else:
                        static_of(True)
                        address(hit[4])
                    continue
                ptr = a.untyped_storage().data_ptr()
                if buffers and i in buffers:
                    stable.add(ptr)  # NOTE: a module buffer: read in place, like views of it
                    static = True
                else:
                    static = ptr in owner or ptr in stable
            elif cls is _Parameter:
                d = a.data_ptr()
                if params.get(id(a)) != d:  # NOTE: a parameter not seen yet at this address: its storage is stable
                    stable.add(a.untyped_storage().data_ptr())
                    params[id(a)] = d
                entry((a.dtype, a.size(), a.stride()))
                if demoted and i in demoted:
                    static_of(False)
                else:
                    static_of(True)
                    address(d)
                continue
            elif isinstance(a, _Tensor):
                ptr = a.untyped_storage().data_ptr()
                if isinstance(a, _Parameter):  # NOTE: a subclass of either
                    stable.add(ptr)  # NOTE: views of it (a transposed weight saved for the backward) are static too
                    static = True
                else:
                    static = ptr in owner or ptr in stable
            else:
                entry((cls, a))
                static_of(False)
                continue
            entry((a.dtype, a.size(), a.stride()))
            if static and demoted and i in demoted:
                static = False
            static_of(static)
            if static:
                address(a.data_ptr())
        mask = tuple(mask)
        return mask, (fn_name, mask, tuple(entries), tuple(addresses))

    def _again(self, counts: _Counts, args: tuple[Any, ...], mask: tuple[bool, ...]) -> _KeyAgain | None:
        """The `_KeyAgain` of this call's key (`_key` made it from ``args`` and ``mask``); None where torch has no guard."""
        tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        first: dict[int, int] = {}  # id of a tensor -> its first position
        once, repeats = [], []
        for i in tensors:
            j = first.setdefault(id(args[i]), i)
            if j == i:
                once.append(i)
            else:
                repeats.append((i, j))
        metadata = internals.metadata_guard([args[i] for i in once])
        if metadata is None:
            return None
        ptrs: list[int | None] = [None] * len(args)
        static = [i for i in tensors if mask[i]]
        for i in static:
            ptrs[i] = args[i].data_ptr()
        others = tuple(i for i, a in enumerate(args) if not isinstance(a, torch.Tensor))
        values = _getter(others)(args)
        return _KeyAgain(_getter(once), metadata, tuple(repeats), ptrs, static, _getter(others), values,
                         tuple(map(type, values)), tuple(i for i in tensors if not mask[i] and i not in counts.demoted))

    def _too_many_values(self, fn_name: str, counts: _Counts, key: tuple) -> bool:
        """Past `max_values` values of the region's Python numbers, run it without a graph from now on."""
        values = tuple(v for v in (_descriptor(key[2]).non_tensor_args or ()) if isinstance(v, (int, float, complex)))
        if not values:
            return False
        counts.values.add(values)
        if len(counts.values) <= self.max_values:
            return False
        names = [n for n, v in zip(self.trace_symbols[fn_name][1], _descriptor(key[2]).non_tensor_args)
                 if isinstance(v, (int, float, complex))]
        counts.eager_reason = (f"{', '.join(getattr(n, 'name', '?') for n in names)} took more than {self.max_values} values "
                               "(each would capture a new graph): the region runs without a graph from now on")
        warnings.warn(f"thunder-nb: {fn_name}: {counts.eager_reason}", RecaptureWarning, stacklevel=4)
        return True

    def _new_key(self, fn_name: str, counts: _Counts, args: tuple[Any, ...], mask: tuple[bool, ...],
                 key: tuple) -> tuple[tuple[bool, ...], tuple]:
        """Count the addresses of a new key's static inputs; copy those that took too many, from now on."""
        demote = []
        for i, (a, m) in enumerate(zip(args, mask)):
            if not m:
                continue
            seen = counts.addresses.setdefault(i, set())
            seen.add(a.data_ptr())
            if len(seen) > self.max_addresses:
                name = _input_name(self.trace_symbols[fn_name][1], i)
                counts.demoted[i] = StaticInputChange(name, i, "demoted", limit=self.max_addresses)
                demote.append(i)
        if demote:
            mask, key = self._key(fn_name, counts, args)
        counts.keys.add(key[3])
        return mask, key

    def _record(self, fn_name: str, fn: Callable[..., Any], args: tuple[Any, ...], mask: tuple[bool, ...],
                cause: str, index: int) -> Instance:
        # NOTE: a static input is held as a fresh alias: it keeps the memory the graph reads alive, and
        # not the caller's tensor object (a guarded hand-out is watched by its identity)
        static_inputs = tuple(
            a if not isinstance(a, torch.Tensor) else (a.detach() if m else self.get_static_buffer(a))
            for a, m in zip(args, mask)
        )
        cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        before, reserved = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) if cuda else (0, 0)
        # NOTE: the warm-up calls (and an emulated recording) run the region for real: what it updates in place where
        # it lies (a module buffer: BatchNorm's running statistics, num_batches_tracked) is put back afterwards, so
        # that the call's own replay applies the update once
        written = [static_inputs[i] for i in self.write_back.get(fn_name, ()) if mask[i]]
        kept = [t.clone() for t in written]
        try:
            graph, static_outputs = RECORDERS["record"](self, fn, static_inputs, 3 if index == 0 else 1)
        except BaseException:
            internals.recover_generators()
            raise
        finally:
            for t, k in zip(written, kept):
                t.copy_(k)
        pool = torch.cuda.memory_allocated() - before if cuda else None
        reserved = torch.cuda.memory_reserved() - reserved if cuda else 0
        inputs_memory = {storage(a) for a in static_inputs if isinstance(a, torch.Tensor)}
        static_outputs = _unviewed(static_outputs, {ptr for ptr in inputs_memory if ptr in self._owner})
        copied = tuple(i for i, (a, m) in enumerate(zip(args, mask)) if isinstance(a, torch.Tensor) and not m)
        inst = Instance(graph, static_inputs, tuple(static_outputs),
                         view_plan(fn_name, args, mask, static_inputs, static_outputs), index, copied,
                         tuple(i for i in self.write_back.get(fn_name, ()) if i in copied),
                         self.passthrough.get(fn_name, ()), tuple(static_inputs[i] for i in copied))
        for s, a, m in zip(static_inputs, args, mask):
            if isinstance(s, torch.Tensor) and not m:
                self._owner[storage(s)] = inst
                inst.storages[storage(s)] = [s.untyped_storage()._cdata, 0]
        for i, o in enumerate(inst.static_outputs):
            if isinstance(o, torch.Tensor) and o.untyped_storage().nbytes() and storage(o) not in inputs_memory:
                self._owner[storage(o)] = inst
                self._own_outputs[id(o)] = (o, storage(o), inst, (o.dtype, o.size(), o.stride()), o.data_ptr())
                inst.storages.setdefault(storage(o), [o.untyped_storage()._cdata, 0])
                inst.objects.setdefault(id(o), [i, 0, 0])
        # NOTE: what it costs: the storages it owns, or on a GPU what its private pool reserved (its intermediates too)
        inst.nbytes = max(sum(s.untyped_storage().nbytes() for s in static_inputs if isinstance(s, torch.Tensor)
                              and storage(s) in inst.storages)
                          + sum(o.untyped_storage().nbytes() for o in {id(o): o for o in inst.static_outputs
                                                                       if isinstance(o, torch.Tensor)
                                                                       and id(o) in inst.objects}.values()),
                          reserved)
        inst.cuda = cuda
        self._recordings += 1
        counts = self._count(fn_name)
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
        """Why no further instance of a key may be recorded (None: one may), by `max_instances` and `instance_memory`."""
        n = len(instances)
        if n == 0:
            return None
        if n >= self.max_instances:
            return f"max_instances={self.max_instances}"
        cost = instances[0].nbytes  # NOTE: another instance of the same key costs what the first one did
        budget = self.instance_memory
        if isinstance(budget, int):
            have = sum(inst.nbytes for inst in instances)
            if have + cost > budget:
                return f"another would take {_mib(cost)} beyond instance_memory={budget} bytes ({_mib(have)} taken)"
        elif instances[0].cuda:
            free = torch.cuda.mem_get_info()[0]
            if cost > budget * free:
                return (f"another would take {_mib(cost)}, more than instance_memory={budget} of the {_mib(free)} "
                        "free on the device")
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

    # --- thunder's own behaviour, recorded --------------------------------------------------------

    def _call_stock(self, fn_name: str, counts: _Counts, args: tuple[Any, ...]) -> Any:
        """thunder's call path as it is (static slots by position), with its graphs and rebound slots recorded."""
        key = self.make_cache_key(fn_name, *args)
        entry = self.cuda_graph_cache.get(key)
        if entry is not None:
            names = self.trace_symbols[fn_name][1]
            for i, (s, a, m) in enumerate(zip(entry[1], args, key[1])):
                if m and isinstance(a, torch.Tensor) and s is not a and i not in counts.rebound:
                    counts.rebound[i] = StaticInputChange(_input_name(names, i), i, "rebound")
        else:
            counts.graphs.append(GraphRecord(
                index=len(counts.graphs),
                cause=_recapture_cause(counts.last_key, key, self.trace_symbols[fn_name][1]),
                static_bytes=sum(a.nbytes for a, m in zip(args, key[1]) if isinstance(a, torch.Tensor) and not m),
            ))
        counts.last_key = key
        try:
            out = CUDAGraphRunner.call_cuda_graph(self, fn_name, *args)
        except BaseException:
            internals.recover_generators()
            raise
        if entry is not None:
            counts.replays += 1
        return out

    # --- hand-out ---------------------------------------------------------------------------------

    def hand_out(self, kind: str, actions: Sequence[str], *tensors: Any) -> list[Any]:
        """Check each tensor leaving a trace by its storage: copy out (``"copy"``), guard (``"guard"``) or lend (``"lend"``).

        A returned tensor in memory a replay writes is copied, with the tensors that share its buffer
        copied together so that they still share one copy. A tensor saved for the backward in such
        memory goes out as it is, and its graph instance watches it (`Instance.watch`): while anything
        references it, that instance does not replay. A returned tensor sharing memory with a saved one
        goes out as a fresh alias, watched too. A lent one (a backward's gradient) alone in its memory
        goes out as a fresh alias, watched: autograd can then make it the parameter's ``.grad`` as it
        is, which holds that instance until the gradient is reset; lent ones sharing memory are copied
        together. Anything else goes out as it is.
        """
        out = list(tensors)
        counts = self._hand_out_counts.get(kind)
        if counts is None:
            counts = self._hand_out_counts[kind] = {"calls": 0, "copied": 0, "guarded": 0, "lent": 0}
        counts["calls"] += 1
        which = (actions if type(actions) is tuple else tuple(actions), len(tensors), self.lending_stopped)
        plan = self._hand_out_plans.get(which)
        if plan is None:
            plan = self._hand_out_plans[which] = _hand_out_plan(*which)
        memo = self._hand_out_memo.get(which)
        if memo is None or memo.recordings != self._recordings or (
                memo.own and list(map(id, memo.own(tensors))) != memo.own_ids):
            memo = self._hand_out_memo[which] = self._memo(plan, tensors)
        # NOTE: a returned tensor that shares memory with a saved one stays with it (guarded, not copied): thunder
        # may update the saved tensor in the backward, and in eager PyTorch the returned one would see it
        saved, guarded = memo.saved, memo.guarded
        grown = False
        if memo.loose_guard:
            owners = self._owner
            for j in memo.loose_guard:
                t = tensors[j]
                if isinstance(t, _Tensor):
                    ptr = t.untyped_storage().data_ptr()
                    owner = owners.get(ptr)
                    if owner is not None:
                        # NOTE: every time: a loose position may hold a graph's own output on a later call (its
                        # region ran without a graph when the memo was made), whose object must be watched too
                        owner.watch(t, ptr)
                        guarded += 1
                        if not grown:
                            saved, grown = set(saved), True
                        saved.add(ptr)
        if memo.groups is not None and not grown:
            # NOTE: only own outputs to copy or lend, none sharing memory with a saved one; the lent ones' storages
            # were watched when the memo was made
            singles, shared, lent = memo.groups
            lent_at = ()
        else:
            singles, shared, lent, aliased, lent_at = self._copy_groups(memo.copy, tensors, saved, out, plan[2])
            guarded += aliased
        counts["guarded"] += guarded
        if lent:
            # NOTE: a fresh alias, referenced by nothing else: autograd's AccumulateGrad then makes it the parameter's
            # .grad as it is (a tensor referenced elsewhere it would clone)
            for ptr, owner in lent_at:  # NOTE: the per-call path's; the memo's were watched when it was made
                owner.watch_storage(ptr)
                owner.lent = True
            for j in lent:
                out[j] = _detach(tensors[j])
            counts["lent"] += len(lent)
        if singles:
            for j, c in zip(singles, internals.copy_all([tensors[j] for j in singles])):
                out[j] = c
        for js in shared:
            for j, c in zip(js, copy_together([tensors[j] for j in js])):
                out[j] = c
        counts["copied"] += len(singles) + sum(map(len, shared))
        return out

    def _copy_groups(self, copies: tuple[tuple[int, int, Any], ...], tensors: tuple[Any, ...],
                     saved: frozenset[int] | set[int], out: list[Any], lend: frozenset[int],
                     ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], tuple[int, ...], int,
                                tuple[tuple[int, Any], ...]]:
        """The copy positions (`_HandOutMemo.copy`) in graph memory, grouped by storage: ``(singles, shared, lent, aliased, lent_at)``.

        One in memory a saved tensor shares goes out as a fresh alias instead (into ``out``), watched;
        ``aliased`` counts those. Of the singles, those in ``lend`` are ``lent`` instead (`hand_out`);
        ``lent_at`` gives each lent one's storage address and the `Instance` whose replay writes it.
        """
        groups: dict[int, list[int]] = {}
        placed: dict[int, tuple[int, Any]] = {}  # position -> (storage address, its instance), of the grouped ones
        where = self._where
        aliased = 0
        for j, ptr, owner in copies:
            if owner is None:  # NOTE: not a graph's own output: looked up at each call
                t = tensors[j]
                if not isinstance(t, _Tensor):
                    continue
                ptr, owner = where(t)
                if owner is None:
                    continue
            if ptr in saved:
                # NOTE: a fresh alias: autograd makes a returned tensor its function's output, and the graph's
                # own tensor must not become one
                alias = tensors[j].detach()
                owner.watch(alias, ptr)
                out[j] = alias
                aliased += 1
            else:
                groups.setdefault(ptr, []).append(j)
                placed[j] = (ptr, owner)
        singles, shared, lent = _groups(groups, lend)
        return singles, shared, lent, aliased, tuple(placed[j] for j in lent)

    def _memo(self, plan: tuple[tuple[int, ...], tuple[int, ...]], tensors: tuple[Any, ...]) -> _HandOutMemo:
        """What a hand-out of these very tensors does with the graphs' own outputs among them, worked out once.

        A tensor whose id is among the graphs' own outputs is that output (both are alive, and the runner
        holds its own outputs for good), so while the same ids come back at those positions, and nothing
        new was recorded, the same own outputs come back, already watched: a forward's saved tensors and
        a backward's gradients, call after call. The others (``loose``: inputs, views made outside a
        region) are looked up by storage at each call.
        """
        guard, copy, lend = plan
        own = self._own_outputs
        ids = list(map(id, tensors))
        saved: set[int] = set()
        guarded, loose_guard = 0, []
        for j in guard:
            hit = own.get(ids[j])
            if hit is None:
                loose_guard.append(j)
                continue
            ptr, owner = hit[1], hit[2]
            owner.watch(tensors[j], ptr)
            saved.add(ptr)
            guarded += 1
        copies = []
        for j in copy:
            hit = own.get(ids[j])
            copies.append((j, hit[1], hit[2]) if hit is not None else (j, 0, None))
        positions = [j for j in (*guard, *copy) if ids[j] in own]
        # NOTE: itemgetter gives a tuple for two positions or more, the item itself for one
        get = operator.itemgetter(*positions) if len(positions) > 1 else (
            (lambda ts, j=positions[0]: (ts[j],)) if positions else None)
        copies = tuple(copies)
        groups = None
        if all(owner is not None and ptr not in saved for _, ptr, owner in copies):
            # NOTE: none goes out as an alias (none is in a saved one's memory), so `out` stays untouched
            singles, shared, lent, _, lent_at = self._copy_groups(copies, tensors, saved, [], lend)
            groups = (singles, shared, lent)
            for ptr, owner in lent_at:  # NOTE: the lent ones: the same storages at every call this memo serves
                owner.watch_storage(ptr)
                owner.lent = True
        return _HandOutMemo(get, [ids[j] for j in positions], self._recordings, frozenset(saved), guarded,
                            tuple(loose_guard), copies, groups)

    def _foreign(self, args: tuple[Any, ...]) -> list[tuple[Instance, list[int] | None, list[int] | None]]:
        """For each tensor in ``args`` in memory an instance writes: that instance, its storage's and object's entries.

        A graph recorded on them may keep references to that memory for good (its static inputs are
        aliases of it): `rebase` then moves the counts the owner's `held` compares with.
        """
        found = []
        for a in args:
            if isinstance(a, _Tensor):
                ptr, owner = self._where(a)
                if owner is not None:
                    found.append((owner, owner.storages.get(ptr), owner.objects.get(id(a))))
        return found

    def _where(self, t: torch.Tensor) -> tuple[int, Any]:
        """``t``'s storage address and the `Instance` whose replay writes it (None: no graph's)."""
        hit = self._own_outputs.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1], hit[2]
        ptr = t.untyped_storage().data_ptr()
        return ptr, self._owner.get(ptr)

    # --- records ----------------------------------------------------------------------------------

    def region_stats(self, fn_name: str) -> RegionStats:
        """What this runner did with region ``fn_name`` so far."""
        c = self._counts.get(fn_name) or _Counts()
        instances = max((len(v) for k, v in self.cuda_graph_cache.items() if k[0] == fn_name and isinstance(v, list)),
                        default=0)
        return RegionStats(
            graphs=tuple(c.graphs),
            replays=c.replays,
            eager_calls=c.eager_calls,
            held_calls=c.held_calls,
            instances=instances,
            address_keys=len(c.keys),
            demoted=tuple(c.demoted.values()),
            rebound=tuple(c.rebound.values()),
            eager_reason=c.eager_reason,
            copied=tuple(_input_name(self.trace_symbols[fn_name][1], i) for i in c.last.copied) if c.last else (),
        )

    def hand_out_stats(self, kind: str) -> HandOutStats:
        """What the hand-outs of ``kind`` ("forward", "backward") did so far."""
        counts = self._hand_out_counts.get(kind, {})
        return HandOutStats(**counts, lending_stopped=self.lending_stopped and counts.get("lent", 0) > 0)

    @property
    def graphs_captured(self) -> int:
        """How many CUDA graphs this runner captured, all regions and instances together."""
        return sum(len(v) if isinstance(v, list) else 1 for v in self.cuda_graph_cache.values())


# ---------------------------------------------------------------------------------------------------
# Memory helpers


_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
_detach = torch.Tensor.detach


def _unviewed(outputs: Sequence[Any], graph_inputs: set[int]) -> tuple[Any, ...]:
    """A graph's outputs with each view (``_base`` set) replaced by a plain alias of the same memory, but in ``graph_inputs``.

    The memory, sizes and strides are the same; only autograd's view link to the base goes. thunder's
    autograd connection detaches every saved tensor that is a view, on every call (48 of the 80 saved
    tensors of the nanoGPT step: about 35 µs of host time per forward on a CPU); an output that is no
    view it saves as it is. Nothing the runner does with its outputs reads ``_base``. One alias per object.

    ``graph_inputs``: storage addresses of the graph's inputs that lie in memory an instance writes (another
    region's output, read in place). A view of those stays a view: that instance watches its memory by
    the storage's use count alone, and only the alias thunder's connection makes of a saved view raises
    it. The graph's own outputs (watched object by object, `Instance.watch`) and views of memory no
    instance writes (a transposed weight) go without their view link.
    """
    plain: dict[int, Any] = {}
    out = []
    for o in outputs:
        if (isinstance(o, _Tensor) and o._base is not None and o.untyped_storage().nbytes()
                and storage(o) not in graph_inputs):
            alias = plain.get(id(o))
            if alias is None:
                alias = plain[id(o)] = _detach(o)
            o = alias
        out.append(o)
    return tuple(out)


def _groups(groups: dict[int, list[int]], lend: frozenset[int]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...],
                                                                        tuple[int, ...]]:
    """Positions grouped by storage as ``(singles, shared, lent)``: copied one by one (`internals.copy_all`), copied
    together, or lent (a single whose position is in ``lend``)."""
    singles = [js[0] for js in groups.values() if len(js) == 1]
    return (tuple(j for j in singles if j not in lend),
            tuple(tuple(js) for js in groups.values() if len(js) > 1),
            tuple(j for j in singles if j in lend))


def _hand_out_plan(actions: tuple[str, ...], n: int, lending_stopped: bool,
                   ) -> tuple[tuple[int, ...], tuple[int, ...], frozenset[int]]:
    """The positions a hand-out of ``n`` tensors guards, those it copies or lends (any action but "guard" and
    "as-is"), and of those the ones it lends (none once ``lending_stopped``)."""
    actions = actions[:n]
    return (tuple(j for j, a in enumerate(actions) if a == "guard"),
            tuple(j for j, a in enumerate(actions) if a != "guard" and a != "as-is"),
            frozenset() if lending_stopped else frozenset(j for j, a in enumerate(actions) if a == "lend"))


def _input_name(inputs: Sequence[Any], i: int) -> str:
    return getattr(inputs[i], "name", f"input {i}") if i < len(inputs) else f"input {i}"


def _descriptor(entries: Any) -> ArgsDescriptor:
    """thunder's ``ArgsDescriptor`` of a key's inputs: as it is (thunder's key), or made of `ThunderNBRunner._key`'s entries."""
    if isinstance(entries, ArgsDescriptor):
        return entries
    if not entries:
        return ArgsDescriptor(None, None, None, None)
    full = [e if len(e) == 3 else (e[0], None, None) for e in entries]
    dtypes, sizes, strides = zip(*full)
    return ArgsDescriptor(dtypes, sizes, strides, tuple(None if len(e) == 3 else e[1] for e in entries))


def _recapture_cause(old: Any, new: Any, inputs: Sequence[Any], args: Sequence[Any] = (),
                     owner: dict[int, Any] | None = None) -> str:
    """Why a new cache key was made: the first input whose value, dtype, shape, strides or address changed
    (``args`` and the runner's ``owner`` map, where given, tell an input in another graph instance's memory)."""
    if old is None:
        return "first call"
    old_args, new_args = _descriptor(old[2]), _descriptor(new[2])
    for i in range(len(inputs)):
        name = _input_name(inputs, i)
        for attr, label in (("non_tensor_args", "value"), ("dtypes", "dtype"), ("sizes", "shape"), ("strides", "strides")):
            a, b = getattr(old_args, attr), getattr(new_args, attr)
            if a is not None and b is not None and i < len(a) and a[i] != b[i]:
                if label == "value":
                    return f"{name}: value {a[i]!r} -> {b[i]!r}"
                if label == "dtype":
                    return f"{name}: dtype {a[i]} -> {b[i]}"
                return f"{name}: {label} {tuple(a[i])} -> {tuple(b[i])}"
    if old[1] != new[1]:
        return "static-input mask changed"
    if len(old) > 3 and old[3] != new[3]:
        static = [i for i, m in enumerate(new[1]) if m]
        for i, a, b in zip(static, old[3], new[3]):
            if a != b and i < len(args) and owner is not None and isinstance(args[i], torch.Tensor):
                inst = owner.get(args[i].untyped_storage().data_ptr())
                if inst is not None:
                    return (f"{_input_name(inputs, i)} lies in the memory of another graph's instance "
                            f"(what instance {inst.index} of that graph wrote, read where it lies)")
                return f"{_input_name(inputs, i)} lies at another address (another tensor, e.g. another layer's weights)"
        return "a static input lies at another address (another tensor, e.g. another layer's weights)"
    return "cache key changed"
