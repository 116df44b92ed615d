"""Data parallelism inside the whole-step graph: the gradients averaged across ranks after the backward, in static
buckets, one ``all_reduce`` per bucket (`GradientAverage`), and what `jit_step` refuses around it (`data_parallel`).

Each step's gradients are copied into preallocated flat buffers (one per dtype and device, split past
`BUCKET_BYTES`), divided by the world size, summed across the ranks by one ``all_reduce`` per buffer, and copied back
into the gradients: the same memory at every step, so a CUDA graph's replay reads and writes the addresses its
recording saw. The buffers are made by the uncaptured warm-up steps, whose all-reduces also make the communicator
(NCCL makes it at a group's first collective, which must not happen inside a capture) on the stream the capture uses.
Under real capture NCCL's ``all_reduce`` is recorded into the graph (NCCL 2.9.6 or newer) and every replay launches
it; under the CPU stand-in gloo's runs at each step, as every other op of the iteration does. With ``shard=True``
`thunder_nb.step.shard.GradientShard` reduce-scatters the gradients instead and gathers the updated parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import internals
from ..cudagraph.distributed import data_parallel_wrapper
from .guard import trained_parameters

__all__ = ["BUCKET_BYTES", "GradientAverage", "data_parallel", "ranks_of", "refuse_data_parallel_wrappers",
           "plan_buckets", "same_gradients_on_every_rank"]

#: The largest bucket, in bytes. Inside one graph nothing overlaps the all-reduces (they follow the whole backward),
#: so fewer, bigger buckets cost fewer launches; the cap bounds one message.
BUCKET_BYTES = 256 * 2**20


def plan_buckets(tensors: Sequence[torch.Tensor], cap: int = BUCKET_BYTES) -> list[list[int]]:
    """The indices of ``tensors`` in each bucket: in order, one dtype and device a bucket, at most ``cap`` bytes each
    (a tensor larger than ``cap`` alone)."""
    buckets: list[list[int]] = []
    open_: dict[tuple, tuple[int, int]] = {}  # NOTE: (dtype, device) -> (its open bucket, the bytes in it)
    for i, t in enumerate(tensors):
        kind, size = (t.dtype, t.device), t.numel() * t.element_size()
        at, used = open_.get(kind, (None, 0))
        if at is None or used + size > cap:
            buckets.append([])
            at, used = len(buckets) - 1, 0
        buckets[at].append(i)
        open_[kind] = (at, used + size)
    return buckets


class _Bucket:
    """One flat buffer and the views of it that each gradient is copied into and out of."""

    def __init__(self, grads: Sequence[torch.Tensor]):
        total = sum(g.numel() for g in grads)
        self.flat = torch.zeros(total, dtype=grads[0].dtype, device=grads[0].device)
        self.views, at = [], 0
        for g in grads:
            self.views.append(self.flat[at:at + g.numel()].view(g.shape))
            at += g.numel()


class GradientAverage:
    """The gradients' mean across the ranks of ``group`` (None: the default group), in static buckets."""

    def __init__(self, group: Any, world: int, cap: int = BUCKET_BYTES):
        self.group, self.world, self.cap = group, world, cap
        # NOTE: by which parameters have gradients; never dropped: a recording made with a layout reads and writes its
        # buffers at every replay, and a freed buffer's memory would be another tensor's
        self._layouts: dict[tuple, list[tuple[list[int], _Bucket]]] = {}
        self.launches = 0  # all_reduce calls made on the host (a replay of a CUDA graph makes none)
        self.captured = 0  # all_reduce calls recorded into a CUDA graph
        self.buckets = 0  # all_reduce calls of the last step

    #: The ids of the parameters another rank updates (`thunder_nb.step.shard.GradientShard`): none here.
    others: frozenset[int] = frozenset()

    def __call__(self, params: Sequence[torch.Tensor]) -> None:
        """Replace each parameter's ``.grad`` by its mean over the ranks (in place)."""
        with_grad = [i for i, p in enumerate(params) if p.grad is not None]
        key = tuple(id(params[i]) for i in with_grad)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = self._layout([params[i].grad for i in with_grad], with_grad)
        for members, bucket in layout:
            grads = [params[i].grad for i in members]
            with torch.no_grad():
                internals.copy_into(bucket.views, grads)
                bucket.flat.div_(self.world)
                torch.distributed.all_reduce(bucket.flat, group=self.group)
                internals.copy_into(grads, bucket.views)
            self._count()
        self.buckets = len(layout)

    def _count(self) -> None:
        """Count one collective call: recorded into a CUDA graph, or launched on the host."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            self.captured += 1
        else:
            self.launches += 1

    def _layout(self, grads: list[torch.Tensor], positions: list[int]) -> list[tuple[list[int], _Bucket]]:
        """The buckets of these gradients, after checking that every rank has the same ones."""
        same_gradients_on_every_rank(grads, self.group, self.world)
        return [([positions[i] for i in b], _Bucket([grads[i] for i in b])) for b in plan_buckets(grads, self.cap)]

    def clip(self, params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_``: every rank holds every averaged gradient."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def after_step(self, params: Sequence[torch.Tensor]) -> None:
        """Nothing after the optimizer's step: every rank updated every parameter alike."""

    def warm(self, device: torch.device) -> None:
        """Make the communicator before a capture: one uncaptured ``all_reduce`` on the current stream (the warm-up
        steps have made one already; this holds where a layout was dropped)."""
        t = torch.zeros(1, device=device)
        torch.distributed.all_reduce(t, group=self.group)

    def short(self) -> str:
        """``2 ranks, 1 all_reduce a step (1 in a CUDA graph)``: for the step's repr."""
        n = f"{self.buckets} all_reduce a step" if self.buckets else "all_reduce in each step"
        return f"{self.world} rank{'s' if self.world > 1 else ''}, {n}" + (f" ({self.captured} in a CUDA graph)" if self.captured else "")

    def text(self) -> str:
        """What the step does across the ranks, in words."""
        n = self.buckets or "its"
        return (f"gradients averaged across {self.world} ranks inside the step: {n} all_reduce per step, one per "
                "static bucket, after the backward and before clipping and the optimizer's step")

    def notes(self) -> list[str]:
        """What the step does across the ranks, for the step's notes."""
        return [self.text()]


def same_gradients_on_every_rank(grads: list[torch.Tensor], group: Any, world: int) -> list[torch.Tensor]:
    """``grads``, after checking that every rank has as many of the same shapes and dtypes (else the collectives would
    pair unlike buffers, or wait forever) and that no capture is under way (the static buffers made for them must be
    made by an uncaptured warm-up step)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("jit_step: the gradient buffers would be made inside a capture; a warm-up step must "
                           "come first")
    mine = (len(grads), [tuple(g.shape) for g in grads], [str(g.dtype) for g in grads])
    every: list[Any] = [None] * world
    torch.distributed.all_gather_object(every, mine, group=group)
    if any(other != mine for other in every):
        counts = ", ".join(f"rank {r}: {o[0]}" for r, o in enumerate(every))
        raise RuntimeError(f"jit_step: the ranks' gradients differ in number, shape or dtype ({counts} "
                           "gradients), so they cannot be averaged: every rank must train the same model on "
                           "batches of the same shapes, with the same parameters frozen")
    return grads


def _reached(fn: Callable[..., Any]) -> list[Any]:
    """The objects ``fn`` reaches directly: its closure's cells, the globals its code names, a bound method's self."""
    fn = getattr(fn, "__func__", fn)
    out = [getattr(fn, "__self__", None)]
    code, globals_ = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # NOTE: a cell not filled yet
            pass
    if code is not None:
        out += [globals_[n] for n in code.co_names if n in globals_]
    return out


def refuse_data_parallel_wrappers(model: Any, loss_fn: Callable[..., Any]) -> None:
    """Raise TypeError where ``model``, or a module ``loss_fn`` reaches, is wrapped for data parallelism: jit_step
    averages the gradients itself, inside its graph, and a wrapper's all-reduce would run twice or not at all."""
    for what, obj in [("the model", model)] + [("a module the loss function calls", o) for o in _reached(loss_fn)]:
        wrapper = data_parallel_wrapper(obj)
        if wrapper is not None:
            raise TypeError(
                f"jit_step was given {what} wrapped by {wrapper}: jit_step averages the gradients across the ranks "
                "itself, inside the step's graph, where the wrapper's hooks would run twice or not at all; pass the "
                "plain module (ddp_model.module) and a loss function that calls it: jit_step(model, loss_fn, "
                "optimizer) averages over torch.distributed's default group when its world size is above 1 "
                "(process_group=... for another group; shard=True shards the gradients and the optimizer state, "
                "not the parameters: FSDP's FULL_SHARD is not supported by jit_step)")


def ranks_of(ddp: bool | None, process_group: Any, shard: bool = False) -> int | None:
    """The number of ranks a step averages its gradients over (None: it does not average).

    ``ddp``: None averages where ``torch.distributed`` is initialized and the group has more than one rank; True
    always (a world of one too: its all_reduce is still in the graph); False never (each rank trains alone).
    ``shard=True`` is ``ddp=True`` with the gradients and the optimizer state sharded; with ``ddp=False`` it raises."""
    dist = torch.distributed
    if shard:
        if ddp is False:
            raise ValueError("jit_step: shard=True shards the data-parallel step across the ranks, and ddp=False "
                             "trains each rank alone; leave ddp out (shard=True implies ddp=True)")
        ddp = True
    if ddp is False:
        if process_group is not None:
            raise ValueError("jit_step: process_group was given with ddp=False; leave one out")
        return None
    if not (dist.is_available() and dist.is_initialized()):
        if ddp or process_group is not None:
            raise ValueError("jit_step(ddp=True, shard=True or process_group=...) needs torch.distributed "
                             "initialized first "
                             "(torch.distributed.init_process_group, as torchrun's scripts call it)")
        return None
    world = dist.get_world_size(process_group)
    return None if world == 1 and ddp is None and process_group is None else world


def data_parallel(model: torch.nn.Module, loss_fn: Callable[..., Any], ddp: bool | None, process_group: Any,
                  shard: Callable[[Any, int, list[torch.Tensor]], GradientAverage] | None = None
                  ) -> tuple[GradientAverage | None, list[str]]:
    """The averaging a `jit_step` does (None: none, `ranks_of`) and what it did, in words; rank 0's parameters and
    buffers are broadcast to the other ranks, as ``DistributedDataParallel`` does when it wraps a model. ``shard``:
    the sharded averaging (`thunder_nb.step.shard.GradientShard`, given by the caller: it imports this module),
    made with the group, the world size and the trained parameters; None averages every gradient on every rank."""
    refuse_data_parallel_wrappers(model, loss_fn)
    world = ranks_of(ddp, process_group, shard is not None)
    if world is None:
        return None, []
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(t, group=process_group, group_src=0)
    average = (GradientAverage(process_group, world) if shard is None
               else shard(process_group, world, trained_parameters(model)))
    return average, [*average.notes(), "rank 0's parameters and buffers broadcast to every rank at jit_step (as "
                     "DistributedDataParallel does when it wraps a model); buffers are not broadcast again"]
