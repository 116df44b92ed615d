"""The hand-out: each tensor leaving a trace checked by its storage, copied out of graph memory, guarded or lent."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from thunder.core import prims, utils
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten, tree_map
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, reset_tracectx, set_tracectx

from .. import internals
from ..diagnosis.plans import HAND_OUT_NAME, HandOutAction, HandOutPlan, HandOutStats
from .instances import Instance, copy_together, once_per_object
from .passes import written_argument

__all__ = ["HandOut", "insert_hand_out"]

_Tensor = torch.Tensor
_detach = torch.Tensor.detach


@dataclass(frozen=True, slots=True)
class _HandOutMemo:
    """`HandOut._memo`: one hand-out's work on the graphs' own outputs, valid while its ids stay the same."""

    own: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None  # the tensors at the positions of own outputs
    own_ids: list[int]  # their ids when made
    recordings: int  # the runner's recordings when made
    saved: frozenset[int]  # storage addresses of the own outputs guarded
    guarded: int  # how many own outputs are guarded (watched)
    loose_guard: tuple[int, ...]  # guard positions that are not own outputs: looked up at each call
    copy: tuple[tuple[int, int, Any], ...]  # per copy position: (position, storage address, owner); owner None: look up
    # `_copy_groups` of ``copy`` worked out once (singles, shared, lent, rotated): all are own outputs, none in a saved
    # one's memory (None: per call)
    groups: tuple[tuple[int, ...], tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...]] | None
    rotate: bool  # made for a forward's hand-out with rotation on


#: Hand-out memos kept per plan: one per instance that takes turns (rotation), and a spare.
_MEMOS = 4


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
    guard, as_is, lend = HandOutAction.GUARD, HandOutAction.AS_IS, HandOutAction.LEND
    if not internals.supported():
        # NOTE: no use counts to guard with (`internals.use_counters`): what a hand-out would guard is copied out, so
        # that the graph that wrote it can replay again (a guarded tensor would hold it for good)
        guard = None
    return (tuple(j for j, a in enumerate(actions) if a == guard),
            tuple(j for j, a in enumerate(actions) if a != guard and a != as_is),
            frozenset() if lending_stopped else frozenset(j for j, a in enumerate(actions) if a == lend))


class HandOut:
    """`ThunderNBRunner`'s hand-out (`hand_out`), called by the generated code before each trace returns, and what it
    did (`hand_out_stats`).

    A part of `thunder_nb.cudagraph.runner.ThunderNBRunner`: it asks the runner's `GraphMemory` (``memory``) which
    instance writes a tensor's memory and hands rotated storage to the caller through it; it reads the runner's
    ``rotation`` option. Lending and rotation stop here (`_stop_lending`, `_stop_rotation`) when the call path finds
    a caller keeping what they handed out.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hand_out_counts: dict[str, dict[str, int]] = {}  # trace kind -> calls, copied, guarded, lent, rotated
        # per (actions, number of tensors, lending stopped): its `_hand_out_plan`, and its latest `_memo`s
        self._hand_outs: dict[tuple, tuple[tuple, list[_HandOutMemo]]] = {}
        # a lent gradient was still held at its instance's next call: "lend" hand-outs copy from then on
        self.lending_stopped = False
        self.rotation_stopped: set[str] = set()  # regions whose returned tensors the caller kept past `rotation`

    def hand_out(self, kind: str, actions: Sequence[str], *tensors: Any) -> list[Any]:
        """Check each tensor leaving a trace by its storage: copy out (``"copy"``), guard (``"guard"``) or lend (``"lend"``).

        A returned tensor in memory a replay writes is copied, with the tensors that share its buffer
        copied together so that they still share one copy; in a forward, one whose instance rotates
        (`thunder_nb.diagnosis.plans.rotates`: its region saves nothing for a backward) goes out as a fresh alias
        instead, watched, with those that share its buffer. A tensor saved for the backward in such
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
            counts = self._hand_out_counts[kind] = {"calls": 0, "copied": 0, "guarded": 0, "lent": 0, "rotated": 0}
        counts["calls"] += 1
        which = (actions if type(actions) is tuple else tuple(actions), len(tensors), self.lending_stopped)
        known = self._hand_outs.get(which)
        if known is None:
            known = self._hand_outs[which] = (_hand_out_plan(*which), [])
        plan, memos = known
        rotate = kind == "forward" and self.rotation > 0
        memory = self.memory
        recordings = memory.recordings
        for memo in memos:
            # NOTE: one memo per instance whose outputs come back here (instances that take turns alternate)
            if memo.recordings == recordings and (
                    not memo.own or list(map(id, memo.own(tensors))) == memo.own_ids) and memo.rotate == rotate:
                break
        else:
            memo = self._memo(plan, tensors, rotate)
            if len(memos) >= _MEMOS or (memos and memos[-1].recordings != recordings):
                memos.clear()
            memos.append(memo)
        # NOTE: a returned tensor that shares memory with a saved one stays with it (guarded, not copied): thunder
        # may update the saved tensor in the backward, and in eager PyTorch the returned one would see it
        saved, guarded = memo.saved, memo.guarded
        grown = False
        if memo.loose_guard:
            owners = memory.owner
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
            # NOTE: only own outputs to copy, lend or rotate, none sharing memory with a saved one; the lent and
            # rotated ones' storages were watched when the memo was made
            singles, shared, lent, rotated = memo.groups
            lent_at = rotated_at = ()
        else:
            singles, shared, lent, rotated, aliased, lent_at, rotated_at = self._copy_groups(
                memo.copy, tensors, saved, out, plan[2], rotate)
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
        if rotated:
            # NOTE: a fresh alias, watched: while the caller holds it (or a view of it), its instance does not replay
            for ptr, owner in rotated_at:  # NOTE: the per-call path's; the memo's were watched when it was made
                memory.rotate(ptr, owner)
            if len(rotated) == 1:  # NOTE: the usual case (a loss) without `once_per_object`'s 2 µs
                out[rotated[0]] = _detach(tensors[rotated[0]])
            else:
                for j, alias in zip(rotated, once_per_object(_detach, [tensors[j] for j in rotated])):
                    out[j] = alias
            counts["rotated"] += len(rotated)
        if singles:
            for j, c in zip(singles, internals.copy_all([tensors[j] for j in singles])):
                out[j] = c
        for js in shared:
            for j, c in zip(js, copy_together([tensors[j] for j in js])):
                out[j] = c
        counts["copied"] += len(singles) + sum(map(len, shared))
        return out

    def _copy_groups(self, copies: tuple[tuple[int, int, Any], ...], tensors: tuple[Any, ...],
                     saved: frozenset[int] | set[int], out: list[Any], lend: frozenset[int], rotate: bool,
                     ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...], int,
                                tuple[tuple[int, Any], ...], tuple[tuple[int, Any], ...]]:
        """The copy positions (`_HandOutMemo.copy`) in graph memory, grouped by storage:
        ``(singles, shared, lent, rotated, aliased, lent_at, rotated_at)``.

        One in memory a saved tensor shares goes out as a fresh alias instead (into ``out``), watched;
        ``aliased`` counts those. With ``rotate``, the positions in the memory of an instance that rotates
        (`Instance.rotates`) are ``rotated`` instead, each storage's together. Of the singles left, those in
        ``lend`` are ``lent`` instead (`hand_out`); ``lent_at`` and ``rotated_at`` give each lent or rotated
        storage's address and the `Instance` whose replay writes it.
        """
        groups: dict[int, list[int]] = {}
        placed: dict[int, tuple[int, Any]] = {}  # position -> (storage address, its instance), of the grouped ones
        where = self.memory.where
        aliased, made = 0, {}
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
                t = tensors[j]
                alias = made.get(id(t))  # NOTE: one alias of a tensor returned twice (`once_per_object`)
                if alias is None:
                    alias = made[id(t)] = t.detach()
                    owner.watch(alias, ptr)
                out[j] = alias
                aliased += 1
            else:
                groups.setdefault(ptr, []).append(j)
                placed[j] = (ptr, owner)
        rotated: list[int] = []
        rotated_at = []
        if rotate:
            for ptr in [ptr for ptr, js in groups.items() if placed[js[0]][1].rotates]:
                js = groups.pop(ptr)
                rotated.extend(js)
                rotated_at.append(placed[js[0]])
        singles, shared, lent = _groups(groups, lend)
        return singles, shared, lent, tuple(rotated), aliased, tuple(placed[j] for j in lent), tuple(rotated_at)

    def _memo(self, plan: tuple[tuple[int, ...], tuple[int, ...]], tensors: tuple[Any, ...], rotate: bool) -> _HandOutMemo:
        """What a hand-out of these very tensors does with the graphs' own outputs among them, worked out once.

        A tensor whose id is among the graphs' own outputs is that output (both are alive, and the runner
        holds its own outputs for good), so while the same ids come back at those positions, and nothing
        new was recorded, the same own outputs come back, already watched: a forward's saved tensors and
        a backward's gradients, call after call. The others (``loose``: inputs, views made outside a
        region) are looked up by storage at each call.
        """
        guard, copy, lend = plan
        memory = self.memory
        own = memory.own_outputs
        ids = list(map(id, tensors))
        saved: set[int] = set()
        guarded, loose_guard = 0, []
        for j in guard:
            hit = own.get(ids[j])
            if hit is None:
                loose_guard.append(j)
                continue
            ptr, owner = hit.storage, hit.instance
            owner.watch(tensors[j], ptr)
            saved.add(ptr)
            guarded += 1
        copies = []
        for j in copy:
            hit = own.get(ids[j])
            copies.append((j, hit.storage, hit.instance) if hit is not None else (j, 0, None))
        positions = [j for j in (*guard, *copy) if ids[j] in own]
        # NOTE: itemgetter gives a tuple for two positions or more, the item itself for one
        get = operator.itemgetter(*positions) if len(positions) > 1 else (
            (lambda ts, j=positions[0]: (ts[j],)) if positions else None)
        copies = tuple(copies)
        groups = None
        if all(owner is not None and ptr not in saved for _, ptr, owner in copies):
            # NOTE: none goes out as an alias (none is in a saved one's memory), so `out` stays untouched
            singles, shared, lent, rotated, _, lent_at, rotated_at = self._copy_groups(
                copies, tensors, saved, [], lend, rotate)
            groups = (singles, shared, lent, rotated)
            for ptr, owner in lent_at:  # NOTE: the lent ones: the same storages at every call this memo serves
                owner.watch_storage(ptr)
                owner.lent = True
            for ptr, owner in rotated_at:  # NOTE: likewise the rotated ones
                memory.rotate(ptr, owner)
        return _HandOutMemo(get, [ids[j] for j in positions], memory.recordings, frozenset(saved), guarded,
                            tuple(loose_guard), copies, groups, rotate)

    def _stop_lending(self) -> None:
        """A gradient lent to autograd outlived its step: "lend" hand-outs copy from now on."""
        self.lending_stopped = True
        self._hand_outs.clear()

    def _stop_rotation(self, fn_name: str, instances: list[Instance]) -> None:
        """The caller keeps the returned tensors of every instance of region ``fn_name``: copy them out from now on."""
        self.rotation_stopped.add(fn_name)
        for inst in instances:
            inst.rotates = False
        self._hand_outs.clear()

    def hand_out_stats(self, kind: str) -> HandOutStats:
        """What the hand-outs of ``kind`` ("forward", "backward") did so far."""
        counts = self._hand_out_counts.get(kind, {})
        return HandOutStats(**counts, lending_stopped=self.lending_stopped and counts.get("lent", 0) > 0,
                            rotation_stopped=tuple(sorted(self.rotation_stopped)) if counts.get("rotated") else (),
                            rotation=self.rotation if kind == "forward" and not self.stock else 0)


# ---------------------------------------------------------------------------------------------------
# The call the transform inserts before each trace returns


def insert_hand_out(fused: TraceCtx, runner: Any, executor: Any, *, backward: bool, saving: bool, copy_outputs: bool,
                    lend_gradients: bool) -> HandOutPlan:
    """Route every tensor that leaves ``fused`` and may lie in graph memory through ``runner``'s hand-out (`HandOut.hand_out`),
    a call of ``executor``'s (the transform's) inserted before the return; return the trace's `HandOutPlan`.

    Returned tensors get the action "copy" (or "as-is" with ``copy_outputs=False``; a backward's,
    "lend" with ``lend_gradients``), tensors saved for the backward "guard"; the runner decides per
    call, by storage, whether a tensor lies in memory a replay writes. A name both returned and saved
    is handed out twice.
    """
    graph = _graph_derived(fused.bound_symbols, runner.passthrough)
    ret = fused.bound_symbols[-1]
    utils.check(ret.sym.id == prims.PrimIDs.RETURN, lambda: "the fused trace does not end with its return")
    value = ret.args[0] if len(ret.args) == 1 else ret.args
    saved_part = None
    if not backward and saving and isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
        returned_part, saved_part = value
    else:
        returned_part = value
    copies = copy_outputs or backward
    # NOTE: with copy_outputs=False returned tensors go out as they are (the checker reports them)
    returned = [p for p in _tensors(returned_part) if p.name in graph] if copies else []
    saved = [p for p in _tensors(saved_part) if p.name in graph] if saved_part is not None else []
    plan = HandOutPlan(
        returned=tuple(p.name for p in _tensors(returned_part)),
        saved=tuple(p.name for p in _tensors(saved_part)) if saved_part is not None else (),
        graph_memory=tuple(dict.fromkeys(p.name for p in returned + saved)),
        copy_outputs=copies,
        lend=backward and lend_gradients,
    )
    if not returned and not saved:
        return plan
    tok = set_tracectx(fused)
    try:
        fresh_returned = {p.name: TensorProxy(like=p) for p in returned}
        fresh_saved = {p.name: TensorProxy(like=p) for p in saved}
    finally:
        reset_tracectx(tok)
    ins = list(returned) + list(saved)
    outs = list(fresh_returned.values()) + list(fresh_saved.values())
    given = HandOutAction.LEND if plan.lend else HandOutAction.COPY
    actions = (given.value,) * len(returned) + (HandOutAction.GUARD.value,) * len(saved)
    call = functools.partial(runner.hand_out, "backward" if backward else "forward", actions)
    hand = internals.fusion_symbol(HAND_OUT_NAME, executor, call, ins, outs)

    def swap(names: dict[str, TensorProxy]):
        return lambda x: names.get(x.name, x) if isinstance(x, TensorProxy) else x

    new_returned = tree_map(swap(fresh_returned), returned_part)
    new_value = (new_returned, tree_map(swap(fresh_saved), saved_part)) if saved_part is not None else new_returned
    new_ret = ret.from_bsym(args=(new_value,) if len(ret.args) == 1 else new_value)
    fused.bound_symbols = fused.bound_symbols[:-1] + [hand, new_ret]
    return plan


def _tensors(x: Any) -> list[TensorProxy]:
    """The distinct tensor proxies in ``x``, in order."""
    if x is None:
        return []
    found: dict[str, TensorProxy] = {}
    for p in tree_flatten(x)[0]:
        if isinstance(p, TensorProxy):
            found.setdefault(p.name, p)
    return list(found.values())


def _graph_derived(bsyms: Sequence[BoundSymbol], passthrough: dict[str, tuple[tuple[int, int], ...]]) -> set[str]:
    """Names that may lie in graph memory: region outputs, and anything an op outside regions makes from one.

    An in-place update's result is its destination's memory: graph memory only when the destination is. So is a
    region's output that is one of its inputs updated in place (``passthrough``: region name -> (output position,
    input position) pairs, as the runner hands them out).
    """
    graph: set[str] = set()
    for b in bsyms:
        if b.sym.id in (prims.PrimIDs.DEL, prims.PrimIDs.RETURN):
            continue
        args = b.flat_proxy_args
        if (dst := written_argument(b)) is not None:
            derived = dst.name in graph
        elif b.sym.name == "update_aliases":
            graph.update(o.name for o, a in zip(b.flat_proxy_outs, args) if a.name in graph)
            continue
        elif b.sym.name in passthrough and getattr(b.sym, "is_fusion", False):
            through = dict(passthrough[b.sym.name])
            outs, ins = b.flat_proxy_outs, b.flat_proxy_args
            graph.update(o.name for j, o in enumerate(outs) if isinstance(o, TensorProxy)
                         and (j not in through or ins[through[j]].name in graph))
            continue
        else:
            derived = getattr(b.sym, "is_fusion", False) or any(p.name in graph for p in args)
        if derived:
            graph.update(p.name for p in b.flat_proxy_outs if isinstance(p, TensorProxy))
    return graph
