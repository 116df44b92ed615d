"""The cache key of a region's call (what the graph reads in place, keyed by address, and what it copies), its
proof in a few C calls when a call repeats the last key, and the words for why a new key was made."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from thunder.transforms.cudagraph import ArgsDescriptor

from .. import internals
from ..diagnosis.plans import GraphRecord, StaticInputChange
from .instances import nonempty_storage
from .memory import GraphMemory
from .notices import RecaptureWarning

__all__ = ["Keys", "KeyAgain", "RegionCounts", "AGAIN_MISSES", "descriptor", "input_name", "recapture_cause"]

_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter


@dataclass(slots=True)
class RegionCounts:
    """What the runner did with one region so far, and its last key (`ThunderNBRunner.counts`): what `region_stats`
    reports, and the state of its call path."""

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
    failed: str | None = None  # a recording that raised, as one line (``error_line``), while no graph was made
    capture_failed: bool = False  # ... and it was the capture that raised (`internals.raised_by_graph_capture`)
    last_key: Any = None
    last: Any = None  # the instance replayed last
    last_instances: Any = None  # the instances of `last_key` (the fixed runner)
    again: KeyAgain | None = None  # proves that a call's key is `last_key` without making it (the fixed runner)
    again_misses: int = 0  # calls whose `again` failed where `_key` then made `last_key` all the same

    def recording_raised(self, e: BaseException) -> None:
        """Keep what a recording that raised says: its error line, and whether the capture itself raised."""
        self.failed, self.capture_failed = internals.error_line(e), internals.raised_by_graph_capture(e)


#: Calls whose `KeyAgain` failed while `Keys.key` made the same key, before a region stops making them (a guard
#: stricter than the key on some input: each call would pay for both).
AGAIN_MISSES = 4


def _getter(positions: Sequence[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """``args -> tuple(args[i] for i in positions)`` in one C call."""
    if len(positions) == 1:
        (i,) = positions
        return lambda args: (args[i],)
    return operator.itemgetter(*positions) if positions else (lambda args: ())


@dataclass(frozen=True, slots=True)
class KeyAgain:
    """Whether a call's arguments make a region's last key again, proved in a few C calls instead of `Keys.key`'s pass.

    `Keys.key` reads each input's dtype, sizes and strides, and each static input's address, in Python,
    which grows with the inputs (a region of a deep model takes a hundred or more; bench/results/README.md, "Figures
    behind the defaults"). This proves the
    same key where it holds: the tensors by torch.compile's C guard on their metadata (Python type, dtype,
    device, ``requires_grad``, sizes, strides: the key's entries and more), the static ones' data addresses in
    one C call, the other arguments by equality and type, and each copied tensor by the question the key asks
    (`GraphMemory.reads_in_place`: where the key would read it in place, it is another key). A static input's address
    is the address of the tensor its instance holds (`Recording` keeps an alias), so the same address is the same
    memory. Anything that fails goes to `Keys.key`.
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

    def holds(self, args: tuple[Any, ...], memory: GraphMemory) -> bool:
        """Whether ``args`` make the key this proof was made for (``memory``: the runner's)."""
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
        if self.copied:
            in_place = memory.in_place  # NOTE: `GraphMemory.reads_in_place`, asked without a call per input
            for i in self.copied:
                if args[i].untyped_storage().data_ptr() in in_place:
                    return False
        return True


def input_name(inputs: Sequence[Any], i: int) -> str:
    """The name of a region's input ``i`` in its trace (``inputs``: its proxies), or ``input i``."""
    return getattr(inputs[i], "name", f"input {i}") if i < len(inputs) else f"input {i}"


def descriptor(entries: Any) -> ArgsDescriptor:
    """thunder's ``ArgsDescriptor`` of a key's inputs: as it is (thunder's key), or made of `Keys.key`'s entries."""
    if isinstance(entries, ArgsDescriptor):
        return entries
    if not entries:
        return ArgsDescriptor(None, None, None, None)
    full = [e if len(e) == 3 else (e[0], None, None) for e in entries]
    dtypes, sizes, strides = zip(*full)
    return ArgsDescriptor(dtypes, sizes, strides, tuple(None if len(e) == 3 else e[1] for e in entries))


def recapture_cause(old: Any, new: Any, inputs: Sequence[Any], args: Sequence[Any] = (),
                    memory: GraphMemory | None = None) -> str:
    """Why a new cache key was made: the first input whose value, dtype, shape, strides or address changed
    (``args`` and the runner's ``memory``, where given, tell an input in another graph instance's memory)."""
    if old is None:
        return "first call"
    old_args, new_args = descriptor(old[2]), descriptor(new[2])
    for i in range(len(inputs)):
        name = input_name(inputs, i)
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
            if a != b and i < len(args) and memory is not None and isinstance(args[i], torch.Tensor):
                inst = memory.owner_of(args[i].untyped_storage().data_ptr())
                if inst is not None:
                    return (f"{input_name(inputs, i)} lies in the memory of another graph's instance "
                            f"(what instance {inst.index} of that graph wrote, read where it lies)")
                return f"{input_name(inputs, i)} lies at another address (another tensor, e.g. another layer's weights)"
        return "a static input lies at another address (another tensor, e.g. another layer's weights)"
    return "cache key changed"


def _reads_copied_memory(args: tuple[Any, ...], mask: tuple[bool, ...], written: Sequence[int]) -> list[int]:
    """The static inputs (``mask``) that share a storage with a copied tensor input, where the region updates one of
    them in place (``written``): a graph that read them where they lie and the other in its copy would not see the
    update in the other (a view demoted to copied after taking many addresses, its base read in place: 2026-12-05,
    the test of the program fuzzer's seed 20261205). Inputs that are only read may lie apart."""
    copied = {nonempty_storage(a) for a, m in zip(args, mask) if not m} - {None}
    hit = {nonempty_storage(args[i]) for i in written} & copied
    return [i for i, (a, m) in enumerate(zip(args, mask)) if m and nonempty_storage(a) in hit]


class Keys:
    """`ThunderNBRunner`'s cache keys: made per call, proved again in C, and what a new one says.

    A part of `thunder_nb.cudagraph.runner.ThunderNBRunner`: it asks the runner's `GraphMemory` (``memory``) what is
    read in place, and keeps what it counts in the region's `RegionCounts` (``counts``); it reads the runner's options
    (``max_addresses``, ``max_values``) and what the transform told it (``stable_inputs``, ``write_back``, thunder's
    ``trace_symbols``).
    """

    def key(self, fn_name: str, args: tuple[Any, ...]) -> tuple[tuple[bool, ...], tuple]:
        """The static mask and the cache key region ``fn_name``'s call with ``args`` makes (`_key`)."""
        return self._key(fn_name, self.counts(fn_name), args)

    def key_again(self, fn_name: str, args: tuple[Any, ...], mask: tuple[bool, ...]) -> KeyAgain | None:
        """The `KeyAgain` that proves ``args``' key again (`key` made it, with ``mask``); None where torch has no guard."""
        return self._again(self.counts(fn_name), args, mask)

    def _key(self, fn_name: str, counts: RegionCounts, args: tuple[Any, ...]) -> tuple[tuple[bool, ...], tuple]:
        """Per call, in one pass over the inputs: which the graph reads where they lie, and the cache key.

        Static: a parameter, a module buffer or a view of one, or memory a graph of this runner owns, but what a
        forward handed to its caller there (`GraphMemory.reads_in_place`). Anything else is copied into the graph's
        own buffer. An input past `max_addresses` is copied too. The key is ``(fn_name, mask, entries, addresses)``:
        per input ``(dtype, size, stride)`` of a tensor or ``(type, value)`` of anything else (thunder's descriptor,
        `descriptor`), and the addresses of the static inputs.
        """
        memory, demoted = self.memory, counts.demoted
        in_place, stable, own, params = memory.in_place, memory.stable, memory.own_outputs, memory.params
        buffers = self.stable_inputs.get(fn_name, ())
        entries, mask, addresses = [], [], []
        entry, static_of, address = entries.append, mask.append, addresses.append
        for i, a in enumerate(args):
            cls = type(a)
            if cls is _Tensor:
                hit = own.get(id(a))
                if hit is not None and hit.tensor is a:
                    # NOTE: a graph's own output (what a forward saved, read by its backward): static, and its entry
                    # and address were taken when it was recorded (the runner's tensor; no code outside changes them).
                    # This branch and the parameters' end on their own tail, not the shared one below: one fewer test
                    # per input on the hot path, where a backward reads every tensor its forward saved
                    entry(hit.entry)
                    if demoted and i in demoted:
                        static_of(False)
                    else:
                        static_of(True)
                        address(hit.data_ptr)
                    continue
                ptr = a.untyped_storage().data_ptr()
                if buffers and i in buffers:
                    if ptr not in stable:
                        memory.keep(ptr)  # NOTE: a module buffer: read in place, like views of it
                    static = True
                else:
                    static = ptr in in_place
            elif cls is _Parameter:
                d = a.data_ptr()
                if params.get(id(a)) != d:  # NOTE: a parameter not seen yet at this address: its storage is stable
                    memory.add_parameter(a, d)
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
                    if ptr not in stable:
                        memory.keep(ptr)  # NOTE: views of it (a transposed weight saved for the backward) are static too
                    static = True
                else:
                    static = ptr in in_place
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

    def _again(self, counts: RegionCounts, args: tuple[Any, ...], mask: tuple[bool, ...]) -> KeyAgain | None:
        """The `KeyAgain` of this call's key (`_key` made it from ``args`` and ``mask``); None where torch has no guard."""
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
        return KeyAgain(_getter(once), metadata, tuple(repeats), ptrs, static, _getter(others), values,
                        tuple(map(type, values)), tuple(i for i in tensors if not mask[i] and i not in counts.demoted))

    def _too_many_values(self, fn_name: str, counts: RegionCounts, key: tuple) -> bool:
        """Past `max_values` values of the region's Python numbers, run it without a graph from now on."""
        values = tuple(v for v in (descriptor(key[2]).non_tensor_args or ()) if isinstance(v, (int, float, complex)))
        if not values:
            return False
        counts.values.add(values)
        if len(counts.values) <= self.max_values:
            return False
        names = [n for n, v in zip(self.trace_symbols[fn_name][1], descriptor(key[2]).non_tensor_args)
                 if isinstance(v, (int, float, complex))]
        counts.eager_reason = (f"{', '.join(getattr(n, 'name', '?') for n in names)} took more than {self.max_values} values "
                               "(each would capture a new graph): the region runs without a graph from now on")
        warnings.warn(f"thunder-nb: {fn_name}: {counts.eager_reason}", RecaptureWarning, stacklevel=4)
        return True

    def _new_key(self, fn_name: str, counts: RegionCounts, args: tuple[Any, ...], mask: tuple[bool, ...],
                 key: tuple) -> tuple[tuple[bool, ...], tuple]:
        """Count the addresses of a new key's static inputs; copy those that took too many, from now on."""
        demote = []
        for i, (a, m) in enumerate(zip(args, mask)):
            if not m:
                continue
            seen = counts.addresses.setdefault(i, set())
            seen.add(a.data_ptr())
            if len(seen) > self.max_addresses:
                name = input_name(self.trace_symbols[fn_name][1], i)
                counts.demoted[i] = StaticInputChange(name, i, "demoted", limit=self.max_addresses)
                demote.append(i)
        if demote:
            mask, key = self._key(fn_name, counts, args)
        written = self.write_back.get(fn_name)
        if written and not all(mask) and any(mask):
            shared = _reads_copied_memory(args, mask, written)
            if shared:
                names = self.trace_symbols[fn_name][1]
                for i in shared:
                    counts.demoted[i] = StaticInputChange(input_name(names, i), i, "shares-memory")
                mask, key = self._key(fn_name, counts, args)
        counts.keys.add(key[3])
        return mask, key
