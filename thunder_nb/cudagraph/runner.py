"""The CUDA-graph runner: capture and replay, with the memory each graph writes known by storage.

The runner's jobs live in modules of their own, each a part of `ThunderNBRunner`: the cache key and its proof
(`keys`), recording an instance (`record`), the hand-out (`handout`). Below them all, `memory`'s `GraphMemory` owns
what the replays write (the runner's ``memory``; they read and change it through its methods), over the instances
(`instances`). Here: the call path, thunder's own call path (``stock``), and the records."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from thunder.transforms.cudagraph import CUDAGraphRunner

from .. import internals
from ..diagnosis.plans import GraphRecord, RegionPlan, RegionStats, StaticInputChange, rotates
from .capture import Capture, parse_capture, resolve
from .handout import HandOut
from .instances import rebase, replay
from .keys import AGAIN_MISSES, Keys, RegionCounts, input_name, recapture_cause
from .memory import GraphMemory
from .notices import EagerFallbackWarning, HeldOutputsWarning, RecaptureWarning
from .record import RECORDERS, Recording, check_instance_budget, record_graph

__all__ = [
    "ThunderNBRunner",
    "RunnerOptions",
    "EagerFallbackWarning",
    "HeldOutputsWarning",
    "RecaptureWarning",
    "record_graph",
    "RECORDERS",
]


@dataclass(frozen=True)
class RunnerOptions:
    """The runner's bounds and choices, declared once: `ThunderNBRunner` and the transforms take their defaults here
    (`ThunderNBRunner`'s docstring says what each does)."""

    share_mem_pool: bool = False
    max_instances: int = 16
    instance_memory: float = 0.25
    instance_bytes: int | None = None
    max_addresses: int = 32
    max_values: int = 8
    rotation: int = 2


_DEFAULTS = RunnerOptions()


class ThunderNBRunner(Keys, Recording, HandOut, CUDAGraphRunner):
    """A `CUDAGraphRunner` that never hands out memory a later replay writes, and can run regions eagerly.

    The memory model: each graph instance owns the storages its replays write (its outputs, its
    copies of inputs). A static input is read where it lies and is keyed by address, so another
    tensor gets its own graph; parameters and memory another graph owns are static, everything else
    is copied. At each hand-out (`hand_out`) a returned tensor in owned memory is copied out (views
    of one buffer stay views of one copy) and a tensor saved for the backward is guarded: while it
    is held, the next call replays another instance, recorded while the memory it costs fits
    (`instance_memory`, `max_instances`), and only past that runs the region without a graph.
    A forward's returned tensor whose region saves nothing for a backward is handed out where it
    lies instead, watched (rotation): while the caller holds it, the next call replays another
    instance, which shares the first one's pool and copies its outputs, inside its graph, into
    buffers of its own; up to ``rotation`` instances take turns so, and past that the hand-out
    copies again.

    Args:
        capture: a `Capture` (or its spellings, `parse_capture`): AUTO (capture when the region computes on a CUDA
            device), CUDA and EMULATED (always take the capture path; EMULATED's graphs are
            `thunder_nb.testing.emulated_capture`'s), OFF (always run the region's Python function eagerly).
        share_mem_pool: as thunder's runner.
        stock: behave exactly like thunder's runner (static slots by position, outputs handed out as
            they are), recording graphs and hazards; how thunder's own transform is shown.
        max_instances: graph instances per cache key at most (a bound on recordings; memory bounds them first).
        instance_memory: the fraction of the device's free memory a further instance may take (default 0.25: one that
            would take more than a quarter of what is free is not recorded). The first instance is always recorded.
        instance_bytes: a cap in bytes on a key's further instances together (None, the default: no cap). A held
            call with no room for another instance runs without a graph.
        max_addresses: addresses one static input may take before it is copied instead.
        max_values: values of the region's Python numbers (each its own graph) before it runs without a graph.
        rotation: instances of a region that take turns with the tensors a forward returns, instead of copying
            them out (default 2: a loop that keeps the last call's result while it makes the next one); 0 copies.
    """

    def __init__(self, *, capture: bool | str | Capture = Capture.AUTO, share_mem_pool: bool = _DEFAULTS.share_mem_pool,
                 stock: bool = False, max_instances: int = _DEFAULTS.max_instances,
                 instance_memory: float = _DEFAULTS.instance_memory, instance_bytes: int | None = _DEFAULTS.instance_bytes,
                 max_addresses: int = _DEFAULTS.max_addresses, max_values: int = _DEFAULTS.max_values,
                 rotation: int = _DEFAULTS.rotation):
        super().__init__(share_mem_pool=share_mem_pool)
        self.capture = capture
        self.stock = stock
        self.max_instances = max_instances
        self.instance_memory, self.instance_bytes = check_instance_budget(instance_memory, instance_bytes)
        self.max_addresses = max_addresses
        self.max_values = max_values
        if isinstance(rotation, bool) or not isinstance(rotation, int) or rotation < 0:
            raise ValueError(f"rotation is a number of graph instances (an int, 0 or more), not {rotation!r}")
        self.rotation = rotation
        self.plans: dict[str, RegionPlan] = {}
        self.write_back: dict[str, tuple[int, ...]] = {}  # fn_name -> input positions updated in place
        # fn_name -> ((output position, input position), ...): outputs that are an input (update_aliases)
        self.passthrough: dict[str, tuple[tuple[int, int], ...]] = {}
        self.cuda_regions: dict[str, bool] = {}  # fn_name -> the region computes on a CUDA device (set by the transform)
        self.stable_inputs: dict[str, frozenset[int]] = {}  # fn_name -> input positions of module buffers
        self.memory = GraphMemory()  # what the replays write, and the storage read in place
        self._capture_of: dict[str, bool] = {}  # fn_name -> capture (decided at its first call)
        self._counts: dict[str, RegionCounts] = {}
        self._warned = False

    @property
    def capture(self) -> Capture:
        """How this runner captures (a `Capture`); set it with any of its spellings (`parse_capture`)."""
        return self._capture

    @capture.setter
    def capture(self, value: Any) -> None:
        self._capture = parse_capture(value)

    # --- the call path ----------------------------------------------------------------------------

    def _should_capture(self, fn_name: str, args: Sequence[Any]) -> bool:
        """Capture or run eagerly: decided once per region (``"auto"``: by the device the trace computes on)."""
        decided = self._capture_of.get(fn_name)
        if decided is not None:
            return decided
        if self.capture is not Capture.AUTO:
            decided = self.capture is not Capture.OFF  # NOTE: CUDA and EMULATED take the capture path alike
        else:
            cuda = self.cuda_regions.get(fn_name)
            if cuda is None:  # NOTE: a runner not told by its transform judges by the arguments
                cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            decided = resolve(Capture.AUTO, "cuda" if cuda else "cpu") is Capture.CUDA
            if not cuda and not self._warned:
                self._warned = True
                warnings.warn(
                    "thunder-nb: no CUDA tensors in this region, so regions run eagerly and no CUDA graph is captured",
                    EagerFallbackWarning,
                    stacklevel=5,
                )
        self._capture_of[fn_name] = decided
        return decided

    def counts(self, fn_name: str) -> RegionCounts:
        """Region ``fn_name``'s `RegionCounts`: what the runner did with it so far, and its last key."""
        counts = self._counts.get(fn_name)
        if counts is None:
            counts = self._counts[fn_name] = RegionCounts()
        return counts

    def call_cuda_graph(self, fn_name: str, *args: Any) -> Any:
        """Run region ``fn_name``: replay a free instance (capturing on a miss), or call its function eagerly."""
        counts = self.counts(fn_name)
        if counts.eager_reason is not None or not self._should_capture(fn_name, args):
            counts.eager_calls += 1
            return self.python_callables[fn_name][0](*args)
        if self.stock:
            return self._call_stock(fn_name, counts, args)
        again = counts.again
        if again is not None and again.holds(args, self.memory):
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
                counts.again = self._again(counts, args, mask) if counts.again_misses < AGAIN_MISSES else None
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
                self._stop_lending()
            rotated = any(inst.rotated for inst in instances)
            if rotated and len(instances) >= self.rotation and fn_name not in self.rotation_stopped:
                # NOTE: the caller keeps the returned tensors of every instance (a list of results): copy them out
                # from now on, so that one more instance serves every later call
                self._stop_rotation(fn_name, instances)
            full = self._no_room(instances)
            if full is not None:
                counts.held_calls += 1
                self._warn_held(fn_name, lent, len(instances), full)
                return fn(*args)
            cause = recapture_cause(counts.last_key, key, self.trace_symbols[fn_name][1], args,
                                    self.memory) if not instances else (
                f"outputs of {len(instances)} instance{'' if len(instances) == 1 else 's'} still held "
                + ("(gradients lent to autograd, not reset)" if lent else
                   "by the caller (rotation)" if rotated else "for a backward"))
            before = self.memory.foreign(args)
            try:
                # NOTE: rotation stopped counts as rotating here: the caller holds what the instances handed out
                share = instances[0] if rotated and rotates(fn_name, self.plans.get(fn_name), self.rotation) else None
                inst = self._record(fn_name, fn, args, key[1], cause, len(instances), share=share)
            except BaseException as e:
                counts.recording_raised(e)
                raise
            inst.settle()
            rebase(before)
            instances.append(inst)
        counts.last_key, counts.last, counts.last_instances = key, inst, instances
        outputs = replay(inst, args)
        counts.replays += 1
        return outputs

    # --- thunder's own behaviour, recorded --------------------------------------------------------

    def _call_stock(self, fn_name: str, counts: RegionCounts, args: tuple[Any, ...]) -> Any:
        """thunder's call path as it is (static slots by position), with its graphs and rebound slots recorded."""
        key = self.make_cache_key(fn_name, *args)
        entry = self.cuda_graph_cache.get(key)
        if entry is not None:
            names = self.trace_symbols[fn_name][1]
            for i, (s, a, m) in enumerate(zip(entry[1], args, key[1])):
                if m and isinstance(a, torch.Tensor) and s is not a and i not in counts.rebound:
                    counts.rebound[i] = StaticInputChange(input_name(names, i), i, "rebound")
        record = None if entry is not None else GraphRecord(
            index=len(counts.graphs),
            cause=recapture_cause(counts.last_key, key, self.trace_symbols[fn_name][1]),
            static_bytes=sum(a.nbytes for a, m in zip(args, key[1]) if isinstance(a, torch.Tensor) and not m),
        )
        counts.last_key = key
        stream = internals.current_stream() if entry is None else None  # NOTE: only a call that records captures
        try:
            out = CUDAGraphRunner.call_cuda_graph(self, fn_name, *args)
        except BaseException as e:
            internals.recover_generators()
            if entry is None:
                internals.recover_stream(stream)
                if key not in self.cuda_graph_cache:  # NOTE: the recording raised, not the first replay after it
                    counts.recording_raised(e)
            raise
        finally:
            # NOTE: a graph counts once thunder cached it (its first replay may still have raised); a capture that
            # raised made none
            if record is not None and key in self.cuda_graph_cache:
                counts.graphs.append(record)
        if entry is not None:
            counts.replays += 1
        return out

    # --- records ----------------------------------------------------------------------------------

    def region_stats(self, fn_name: str) -> RegionStats:
        """What this runner did with region ``fn_name`` so far."""
        c = self._counts.get(fn_name) or RegionCounts()
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
            failed=c.failed,
            capture_failed=c.capture_failed,
            copied=tuple(input_name(self.trace_symbols[fn_name][1], i) for i in c.last.copied) if c.last else (),
        )

    @property
    def graphs_captured(self) -> int:
        """How many CUDA graphs this runner captured, all regions and instances together."""
        return sum(len(v) if isinstance(v, list) else 1 for v in self.cuda_graph_cache.values())
