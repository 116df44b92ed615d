"""What the runner's graph replays write, owned in one place: `GraphMemory` (which instance writes each storage, the
graphs' own output tensors, the storage read where it lies) and `OwnOutput`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .. import internals
from .instances import Instance, ObjectEntry, StorageEntry, nonempty_storage, storage

__all__ = ["GraphMemory", "OwnOutput"]

_Tensor = torch.Tensor


@dataclass(frozen=True, slots=True)
class OwnOutput:
    """One output tensor of a recorded graph instance, as it was recorded: what the cache key and the hand-out read of
    it without making a storage object per call (looked up by the tensor's id, checked by identity: ids are reused)."""

    tensor: torch.Tensor  # the instance's own output object
    storage: int  # its storage's address
    instance: Instance  # the instance whose replay writes it
    entry: tuple  # its entry in a cache key: (dtype, size, stride), taken when recorded (no code outside changes them)
    data_ptr: int  # its data address: its address in a cache key


class GraphMemory:
    """The one owner of what the runner's replays write, and of the storage its graphs read where it lies.

    A storage is read in place (static: keyed by address, not copied) when a graph instance writes it (``owner``), but
    not where a forward handed it to its caller (``rotated``: the caller's tensor, which may come back call after
    call, each time from another instance), or when it is stable (``stable``: a parameter's, a module buffer's). That
    one decision is kept as a set, ``in_place``, which the methods here keep equal to ``(owner - rotated) | stable``
    (entries are only ever added), so the cache key and its proof ask one question per input (`reads_in_place`).

    The containers are public for the per-call paths that read them (the cache key's pass over the inputs, the
    hand-out's memo): they are written only through the methods.
    """

    __slots__ = ("owner", "own_outputs", "stable", "params", "rotated", "in_place", "recordings")

    def __init__(self) -> None:
        self.owner: dict[int, Instance] = {}  # storage address -> the instance whose replay writes it
        self.own_outputs: dict[int, OwnOutput] = {}  # id of a graph's own output tensor -> what it was recorded as
        self.stable: set[int] = set()  # storage addresses of parameters and module buffers seen (views read in place)
        self.params: dict[int, int] = {}  # id of a parameter -> its data address when its storage was made stable
        self.rotated: set[int] = set()  # storage addresses of graph memory a forward handed to its caller (rotation)
        self.in_place: set[int] = set()  # storage addresses read in place: (owner - rotated) | stable
        self.recordings = 0  # instances recorded so far (a hand-out's memo made before a recording is stale)

    # --- questions ----------------------------------------------------------------------------------

    def reads_in_place(self, ptr: int) -> bool:
        """Whether a graph reads the storage at ``ptr`` where it lies (a static input) rather than copying it."""
        return ptr in self.in_place

    def where(self, t: torch.Tensor) -> tuple[int, Instance | None]:
        """``t``'s storage address and the instance whose replay writes it (None: no graph's)."""
        hit = self.own_outputs.get(id(t))
        if hit is not None and hit.tensor is t:
            return hit.storage, hit.instance
        ptr = t.untyped_storage().data_ptr()
        return ptr, self.owner.get(ptr)

    def owner_of(self, ptr: int) -> Instance | None:
        """The instance whose replay writes the storage at ``ptr`` (None: no graph's)."""
        return self.owner.get(ptr)

    def owned(self, ptrs: Iterable[int]) -> set[int]:
        """Those of the storage addresses ``ptrs`` that a graph instance writes."""
        return {ptr for ptr in ptrs if ptr in self.owner}

    def foreign(self, args: Iterable[Any]) -> list[tuple[Instance, StorageEntry | ObjectEntry, tuple[int, ...]]]:
        """``(instance, entry, its counts now)`` for each distinct entry of an instance's memory that a tensor in
        ``args`` lies in: a graph recorded on them may keep references to that memory for good (its static inputs are
        aliases of it), and `rebase` then moves the counts the instance's `Instance.held` compares with."""
        # NOTE: counted once the entries are found, with no local name left on a tensor (it would count as a reference)
        now, seen = [], set()
        for inst, entry in self._entries(args):
            if id(entry) not in seen:
                seen.add(id(entry))
                now.append((inst, entry, entry.counts(inst)))
        return now

    def _entries(self, args: Iterable[Any]) -> list[tuple[Instance, StorageEntry | ObjectEntry]]:
        found = []
        for a in args:
            if isinstance(a, _Tensor):
                ptr, inst = self.where(a)
                if inst is not None:
                    found += [(inst, e) for e in (inst.storages.get(ptr), inst.objects.get(id(a))) if e is not None]
        return found

    # --- changes ------------------------------------------------------------------------------------

    def own(self, ptr: int, inst: Any) -> None:
        """The storage at ``ptr`` is written by ``inst``'s replays: read in place from now on, but where rotated."""
        self.owner[ptr] = inst
        if ptr not in self.rotated:
            self.in_place.add(ptr)

    def keep(self, ptr: int) -> None:
        """The storage at ``ptr`` is stable (a parameter's, a module buffer's): read in place, views of it too."""
        self.stable.add(ptr)
        self.in_place.add(ptr)

    def add_parameter(self, p: torch.Tensor, data_ptr: int) -> None:
        """Parameter ``p``, seen at ``data_ptr`` for the first time: its storage is stable."""
        self.keep(p.untyped_storage().data_ptr())
        self.params[id(p)] = data_ptr

    def register(self, inst: Instance, copies: Iterable[torch.Tensor], inputs_memory: set[int]) -> None:
        """A recorded instance's memory: ``copies``, its buffers of copied inputs, and its outputs that lie outside
        ``inputs_memory`` (its inputs' storages), each watched by its reference counts (`Instance.settle`); the
        positions of those that lie inside memory an instance writes (another graph's output read in place, or a copy
        of its own) are its `Instance.in_inputs`. An output in memory no instance writes (a parameter's: a transposed
        weight saved for the backward) goes out as it is: no count needs raising there, and a transformer's forward
        hands out one such view per weight, where an alias each call is host time (2026-12-06-host-profile-cpu.md)."""
        for s in copies:
            ptr = storage(s)
            self.own(ptr, inst)
            inst.storages[ptr] = StorageEntry(internals.storage_handle(s))
        written = self.owned(inputs_memory)
        in_inputs = []
        for i, o in enumerate(inst.static_outputs):
            ptr = nonempty_storage(o)
            if ptr is None:
                continue
            if ptr in inputs_memory:
                if ptr in written:
                    in_inputs.append(i)  # NOTE: watched memory: handed out as a fresh alias at each replay
                continue
            self.own(ptr, inst)
            self.own_outputs[id(o)] = OwnOutput(o, ptr, inst, (o.dtype, o.size(), o.stride()), o.data_ptr())
            if ptr not in inst.storages:
                inst.storages[ptr] = StorageEntry(internals.storage_handle(o))
            if id(o) not in inst.objects:
                inst.objects[id(o)] = ObjectEntry(i)
        inst.in_inputs = tuple(in_inputs)
        remade, first = {*in_inputs, *(view[0] for view in inst.views)}, {}
        inst.again = tuple((i, first[id(o)]) for i, o in enumerate(inst.static_outputs)
                           if first.setdefault(id(o), i) != i and i in remade)
        self.recordings += 1

    def rotate(self, ptr: int, inst: Instance) -> None:
        """``inst``'s storage at ``ptr`` goes to the caller where it lies (rotation): watched, and no longer read in
        place (the caller's tensor may come back as an input, each time from another instance)."""
        inst.watch_storage(ptr)
        inst.rotated = True
        self.rotated.add(ptr)
        if ptr not in self.stable:
            self.in_place.discard(ptr)
