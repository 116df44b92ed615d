"""Graph instances and the memory their replays write: reference-count guards, replay, copies and views."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import internals
from .notices import ViewCopyWarning

__all__ = [
    "Instance",
    "StorageEntry",
    "ObjectEntry",
    "replay",
    "SharedCopy",
    "byte_span",
    "byte_offset",
    "nonempty_storage",
    "shared_storages",
    "storage",
    "storage_use_count",
    "object_counts",
    "rebase",
    "span",
    "non_overlapping",
    "copy_together",
    "once_per_object",
    "view_plan",
]


@dataclass(slots=True, eq=False)
class StorageEntry:
    """A storage an instance's replays write: its StorageImpl pointer, and its use count with nothing outside the
    runner holding it (`Instance.settle`)."""

    handle: int
    uses: int = 0

    def counts(self, owner: Instance) -> tuple[int, ...]:
        """The counts `held` compares with ``uses``, as they are now."""
        return (storage_use_count(self.handle),)

    def rebase(self, now: tuple[int, ...], then: tuple[int, ...]) -> None:
        """Add what the counts rose by from ``then`` to ``now`` (references a recording keeps for good)."""
        self.uses += now[0] - then[0]


@dataclass(slots=True, eq=False)
class ObjectEntry:
    """An instance's own output object: its position among the outputs, and its Python refcount and C++ use count
    with nothing outside the runner holding it (`Instance.settle`)."""

    position: int
    refs: int = 0
    uses: int = 0

    def counts(self, owner: Instance) -> tuple[int, ...]:
        """The counts `held` compares with ``refs`` and ``uses``, as they are now."""
        return object_counts(owner.static_outputs, self.position)

    def rebase(self, now: tuple[int, ...], then: tuple[int, ...]) -> None:
        """Add what the counts rose by from ``then`` to ``now`` (references a recording keeps for good)."""
        self.refs += now[0] - then[0]
        self.uses += now[1] - then[1]


@dataclass(slots=True, eq=False)
class Instance:
    """One recorded copy of a region's graph, with the memory its replays write.

    Whether a replay may write that memory again is read from reference counts, as torch.compile's
    CUDA-graph trees do: when the instance is recorded (`settle`) the counts of its memory are taken,
    with nothing outside the runner holding it; a tensor handed out in that memory (`watch`) is left
    where it lies, and while any count it raised differs, the instance is held (`held`). A tensor
    autograd saves raises its object's count (``_use_count``), a view made of it (thunder detaches
    saved views) raises its storage's, a Python reference its object's refcount.
    """

    graph: Any
    static_inputs: tuple[Any, ...]
    static_outputs: tuple[Any, ...]
    views: tuple[tuple[int, int, tuple[int, ...], tuple[int, ...], int], ...]  # `view_plan`
    index: int
    copied: tuple[int, ...] = ()  # input positions copied into the runner's buffers before each replay
    write_back: tuple[int, ...] = ()  # copied inputs the region updates in place: copied back after each replay
    passthrough: tuple[tuple[int, int], ...] = ()  # (output, input) positions: outputs that are an input
    copy_targets: tuple[Any, ...] = ()  # the runner's buffers of the copied inputs, in `copied`'s order
    storages: dict[int, StorageEntry] = field(default_factory=dict)  # storage address of the memory the replays write
    objects: dict[int, ObjectEntry] = field(default_factory=dict)  # id of an own output
    watched_storages: list[StorageEntry] = field(default_factory=list)  # what `held` reads: storages handed out in
    watched_objects: list[ObjectEntry] = field(default_factory=list)  # own outputs handed out as they are
    watched: set[int] = field(default_factory=set)  # storage addresses and object ids in the two lists
    compiled: tuple | None = None  # `held`'s arrays of the two lists; None: remade at the next `held`
    lent: bool = False  # it lent gradients to autograd (`ThunderNBRunner.hand_out`'s "lend")
    rotates: bool = False  # the hand-out leaves its returned tensors where they lie, watched (rotation)
    rotated: bool = False  # it did so at least once
    pool: Any = None  # its graph's memory pool (a later instance of a rotating region records into it)
    nbytes: int = 0  # the memory it costs (`Recording`): its storages, or its graph pool's reservation
    cuda: bool = False  # recorded on a CUDA device (its cost is then weighed against the device's free memory)
    # NOTE: the copied inputs the replay copies one by one (`copy_targets` in this order); those that share a storage,
    # one of them updated in place, are copied in (and back) as each group's bytes whole: `shared`
    copy_from: tuple[int, ...] = ()
    shared: tuple[SharedCopy, ...] = ()
    # NOTE: outputs that lie in the memory of an input read in place that an instance writes (another graph's output,
    # say): each call hands out a fresh alias of each, so that whoever keeps one raises that storage's use count, which
    # its writer watches
    in_inputs: tuple[int, ...] = ()
    # NOTE: (position, earlier position) of an output object returned twice (`return t.flatten(), t` of a 1-D `t`)
    # that each replay re-makes (`in_inputs`, `views`): one new object at both, as eager returns one
    again: tuple[tuple[int, int], ...] = ()

    def settle(self) -> None:
        """Take the counts of this instance's memory: right after recording, when only the runner holds it."""
        self.compiled = None  # NOTE: first: `held`'s arrays hold a reference to each watched object
        for entry in self.storages.values():
            entry.uses = storage_use_count(entry.handle)
        outs = self.static_outputs
        mine = [(i, entry) for i in range(len(outs))
                if (entry := self.objects.get(id(outs[i]))) is not None and entry.position == i]
        objects = [outs[i] for i, _ in mine]
        # NOTE: read as `held` reads them: through `map` over a list that holds each object once
        for (_, entry), refs, uses in zip(mine, _refcounts(objects), _use_counts(objects)):
            entry.refs, entry.uses = refs, uses

    def watch_storage(self, ptr: int) -> None:
        """Storage ``ptr`` of this instance is handed out (in an alias of one of its tensors): hold while it is referenced."""
        if ptr not in self.watched:
            self.watched.add(ptr)
            entry = self.storages.get(ptr)
            if entry is not None:
                self.watched_storages.append(entry)
                self.compiled = None

    def watch(self, t: torch.Tensor, ptr: int) -> None:
        """``t``, in storage ``ptr`` of this instance, is handed out as it is (or as an alias): hold while it lives."""
        self.watch_storage(ptr)
        key = id(t)
        if key not in self.watched:
            known = self.objects.get(key)
            if known is not None and self.static_outputs[known.position] is t:
                self.watched.add(key)
                self.watched_objects.append(known)
                self.compiled = None

    def held(self) -> bool:
        """Whether a tensor handed out in memory the next replay writes is still referenced."""
        compiled = self.compiled
        if compiled is None:
            outs = self.static_outputs
            compiled = self.compiled = (
                [e.handle for e in self.watched_storages], [e.uses for e in self.watched_storages],
                [outs[e.position] for e in self.watched_objects],  # NOTE: the one list `settle` counted in
                [e.refs for e in self.watched_objects], [e.uses for e in self.watched_objects])
        storages, storage_bases, objects, ref_bases, use_bases = compiled
        # NOTE: C loops (map), compared as lists: this runs before every replay of an instance with hand-outs
        return (list(map(storage_use_count, storages)) != storage_bases or _refcounts(objects) != ref_bases
                or _use_counts(objects) != use_bases)


@dataclass
class SharedCopy:
    """The runner's one copy of copied inputs that share a storage (`shared_storages`, `copy_together`): ``members``,
    each ``(input position, byte offset from the first's)`` when recorded; ``raw``, the copy's bytes, those at
    ``delta`` bytes from the first member's first byte in the caller's storage; ``write_back``: copied back after each
    replay (the region writes one of them). Bytes, not each tensor: a copy into an expanded view (stride 0) raises."""

    members: tuple[tuple[int, int], ...]
    delta: int
    raw: torch.Tensor
    write_back: bool

    def caller_bytes(self, args: tuple[Any, ...]) -> torch.Tensor:
        a = args[self.members[0][0]]
        return torch.empty(0, dtype=torch.uint8, device=a.device).set_(
            a.untyped_storage(), byte_offset(a) + self.delta, (self.raw.numel(),), (1,))

    def check(self, args: tuple[Any, ...]) -> None:
        """Refuse a call whose members no longer share a storage as they did when recorded: their copies share one
        storage that way, and would give the caller other values than eager PyTorch."""
        (first, _), rest = self.members[0], self.members[1:]
        ptr, base = storage(args[first]), byte_offset(args[first])
        for i, delta in rest:
            if storage(args[i]) != ptr or byte_offset(args[i]) - base != delta:
                raise RuntimeError(
                    f"thunder-nb: inputs {first} and {i} of a region shared one storage when its CUDA graph was "
                    f"recorded ({delta} bytes apart) and do not now: the graph's copies of them share that storage, "
                    "so a replay would be wrong; pass tensors laid out as in the first call (or copies: .clone())")


def replay(inst: Instance, args: tuple[Any, ...]) -> list[Any]:
    """Replay ``inst`` on ``args`` (the key already matched): copy the copied inputs in, write back, re-make views."""
    static_inputs = inst.static_inputs
    for c in inst.shared:
        c.check(args)
        c.raw.copy_(c.caller_bytes(args))
    if inst.copy_from:
        internals.copy_into(inst.copy_targets, [args[pos] for pos in inst.copy_from])
    inst.graph.replay()
    for pos in inst.write_back:
        # NOTE: the replay updated the runner's copy of this input; the caller's tensor must see it
        args[pos].copy_(static_inputs[pos])
    for c in inst.shared:
        if c.write_back:
            c.caller_bytes(args).copy_(c.raw)
    outputs = list(inst.static_outputs)
    for pos in inst.in_inputs:
        # NOTE: the static output object is the graph's own and lives as long as it: a caller's reference to it (a
        # tensor saved for the backward) would raise no count that the instance writing its memory reads
        o = outputs[pos]
        outputs[pos] = o.as_strided(o.size(), o.stride(), o.storage_offset())
    for out_pos, in_pos, size, stride, delta in inst.views:
        # NOTE: an output that is a view of a copied input is a view of the runner's copy; the caller
        # must get the same view of its own tensor (in-place updates through it must reach the caller)
        a = args[in_pos]
        outputs[out_pos] = a.as_strided(size, stride, a.storage_offset() + delta)
    for out_pos, in_pos in inst.passthrough:
        outputs[out_pos] = args[in_pos]
    for pos, first in inst.again:
        outputs[pos] = outputs[first]
    return outputs


storage_use_count, tensor_use_count = internals.use_counters()
_getrefcount = sys.getrefcount


def _refcounts(objects: list[Any]) -> list[int]:
    return list(map(_getrefcount, objects))


def _use_counts(objects: list[Any]) -> list[int]:
    return list(map(tensor_use_count, objects))


def object_counts(outs: tuple[Any, ...], i: int) -> tuple[int, int]:
    """The Python refcount and the C++ use count of ``outs[i]``: `rebase` adds what they rose by between two readings."""
    o = outs[i]
    return sys.getrefcount(o), tensor_use_count(o)


def rebase(before: list[tuple[Instance, StorageEntry | ObjectEntry, tuple[int, ...]]]) -> None:
    """Add to each entry what its counts rose by since ``before`` (`GraphMemory.foreign`): references a new recording
    keeps for good."""
    for owner, entry, then in before:
        entry.rebase(entry.counts(owner), then)
    for owner, _, _ in before:
        # NOTE: after all readings: dropping `held`'s arrays drops a reference to each watched object
        owner.compiled = None


def shared_storages(args: Sequence[Any], positions: Sequence[int],
                    written: Sequence[int]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The tensors at ``positions`` of ``args`` that share a storage with another of them, one of them among ``written``
    (the inputs the region updates in place), by storage: each group's ``(position, byte offset from the group's
    first)``."""
    groups: dict[int, list[int]] = {}
    for i in positions:
        ptr = nonempty_storage(args[i])
        if ptr is not None:
            groups.setdefault(ptr, []).append(i)
    out = []
    for members in groups.values():
        if len(members) > 1 and any(i in written for i in members):
            first = byte_offset(args[members[0]])
            out.append(tuple((i, byte_offset(args[i]) - first) for i in members))
    return tuple(out)


def byte_offset(t: torch.Tensor) -> int:
    """Where ``t`` starts in its storage, in bytes."""
    return t.storage_offset() * t.element_size()


def nonempty_storage(a: Any) -> int | None:
    """The storage address of tensor ``a``, None for anything else or a tensor with no bytes (nothing to share)."""
    return storage(a) if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes() else None


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def span(t: torch.Tensor) -> tuple[int, int]:
    """The element range [lo, hi) of ``t``'s storage that ``t`` covers."""
    lo = t.storage_offset()
    hi = lo + 1 + sum((s - 1) * st for s, st in zip(t.size(), t.stride()) if s > 0)
    return lo, hi


def non_overlapping(t: torch.Tensor) -> bool:
    dims = sorted((st, s) for s, st in zip(t.size(), t.stride()) if s > 1)
    reach = 1
    for st, s in dims:
        if st < reach:
            return False
        reach = st * s
    return True


def byte_span(ts: Sequence[torch.Tensor]) -> tuple[int, int]:
    """The bytes [lo, hi) of their one storage that tensors ``ts`` cover, ``lo`` rounded down to 16 (every dtype's
    alignment)."""
    spans = [(byte_offset(t), span(t)[1] * t.element_size()) for t in ts]
    return min(a for a, _ in spans) // 16 * 16, max(b for _, b in spans)


def once_per_object(make: Any, ts: Sequence[Any]) -> list[Any]:
    """``make(t)`` for each of ``ts``, once per object: a tensor at two places gets one result at both, as eager
    PyTorch returns one tensor twice (``return t.flatten(), t`` of a 1-D ``t``)."""
    if len(ts) < 2:
        return list(map(make, ts))
    made: dict[int, Any] = {}
    return [made[id(t)] if id(t) in made else made.setdefault(id(t), make(t)) for t in ts]


def copy_together(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of tensors that share one storage, sharing one new storage the same way; one copy of a tensor given
    twice (`once_per_object`)."""
    if len(ts) == 1 or any(t.numel() == 0 for t in ts):
        return once_per_object(torch.Tensor.clone, ts)
    if len(set(map(id, ts))) < len(ts):
        unique = list({id(t): t for t in ts}.values())
        copies = dict(zip(map(id, unique), copy_together(unique)))
        return [copies[id(t)] for t in ts]
    lo, hi = byte_span(ts)
    raw = torch.empty(0, dtype=torch.uint8, device=ts[0].device).set_(ts[0].untyped_storage())
    chunk = raw[lo:hi].clone()
    out = []
    for t in ts:
        view = torch.empty(0, dtype=t.dtype, device=t.device)
        out.append(view.set_(chunk.untyped_storage(), (t.storage_offset() * t.element_size() - lo) // t.element_size(),
                             t.size(), t.stride()))
    return out


def view_plan(
    fn_name: str, args: Sequence[Any], mask: Sequence[bool], static_inputs: Sequence[Any], static_outputs: Sequence[Any]
) -> tuple[tuple[int, int, tuple[int, ...], tuple[int, ...], int], ...]:
    """Which outputs of a just-recorded graph are views of the runner's copy of an input, and which views.

    Each entry is ``(output position, input position, size, stride, storage offset delta)``: after a
    replay, ``args[input].as_strided(size, stride, args[input].storage_offset() + delta)`` is the same
    view of the caller's tensor (the cache key fixes the input's strides, and the copy keeps them).
    """
    plan = []
    for j, o in enumerate(static_outputs):
        if not isinstance(o, torch.Tensor) or o.untyped_storage().nbytes() == 0:
            continue
        ptr = storage(o)
        for i, (s, a, m) in enumerate(zip(static_inputs, args, mask)):
            if m or not isinstance(s, torch.Tensor) or storage(s) != ptr:
                continue
            if s.stride() != a.stride():
                warnings.warn(
                    f"thunder-nb: {fn_name} returns a view of its input {i}, whose copy has other strides "
                    f"({tuple(s.stride())} against {tuple(a.stride())}, an input with overlapping elements); "
                    "that output is copied out of the graph's memory when it leaves the function",
                    ViewCopyWarning,
                    stacklevel=4,
                )
                break
            plan.append((j, i, tuple(o.size()), tuple(o.stride()), o.storage_offset() - s.storage_offset()))
            break
    return tuple(plan)
