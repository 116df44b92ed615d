"""Sharded data parallelism inside the whole-step graph (``jit_step(..., shard=True)``): ZeRO-2, FSDP's
SHARD_GRAD_OP without parameter resharding (`GradientShard`).

At ``jit_step`` the trained parameters are partitioned among the ranks by whole parameter, greedily by size (largest
first, each to the rank with the fewest elements of its dtype and device so far), the same on every rank; rank r
"owns" its part (`partition`). After the backward, per dtype and device, every gradient is copied into a static flat
buffer laid out rank-major (segment r holds rank r's owned gradients, each segment padded to the same size S),
divided by the world size and summed by one ``reduce_scatter_tensor`` into a static shard of S elements: the owned
parameters' ``.grad`` are views of that shard, the others' ``.grad`` None, so torch's optimizers (which skip a
parameter whose ``.grad`` is None) update only the owned parameters and keep state (Adam's moments, SGD's momentum)
only for them: the optimizer state is sharded, each rank holding about 1/world of it. Clipping takes the global norm
(each rank's squared norm of its shard, one ``all_reduce``, the square root, then torch's rule, never read on the
host). After the optimizer's step each rank copies its owned parameters into a static shard and one
``all_gather_into_tensor`` into the flat buffer gives every rank every updated parameter, copied back in place.

The buffers are made by the uncaptured warm-up steps (never inside a capture) and kept per gradient layout, as
`thunder_nb.step.ranks.GradientAverage` keeps its buckets: a replay reads and writes the addresses its recording saw.
Parameters are never sharded between steps: FSDP's FULL_SHARD needs each parameter gathered before its use in the
forward and again in the backward and freed after, inside thunder's trace of the loss function, and in one CUDA graph
the gathered parameters would live in the graph's static memory for the whole replay, so nothing would be saved
(``thunder.distributed.fsdp(thunder_nb.jit(model))`` shards parameters, its collectives outside the graphs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import internals
from .ranks import GradientAverage, same_gradients_on_every_rank

__all__ = ["GradientShard", "partition"]


def partition(tensors: Sequence[torch.Tensor], world: int,
              loads: dict[tuple, list[int]] | None = None) -> list[int]:
    """The rank that owns each of ``tensors``: greedily by numel, largest first (ties in order), each to the rank
    with the fewest elements of its dtype and device so far (ties: the lowest rank). ``loads``, (dtype, device) ->
    each rank's elements, is updated in place: a later call places more tensors beside the earlier ones."""
    loads = {} if loads is None else loads
    owners = [0] * len(tensors)
    for i in sorted(range(len(tensors)), key=lambda i: (-tensors[i].numel(), i)):
        t = tensors[i]
        load = loads.setdefault((t.dtype, t.device), [0] * world)
        owners[i] = min(range(world), key=lambda r: (load[r], r))
        load[owners[i]] += t.numel()
    return owners


class _Kind:
    """One dtype and device of a layout: the flat buffer (``world`` segments of ``size``), the gradient shard and
    the parameter shard, and the views of each member in them."""

    def __init__(self, members: list[int], owners: list[int], tensors: list[torch.Tensor], rank: int, world: int):
        counts = [sum(t.numel() for t, o in zip(tensors, owners) if o == r) for r in range(world)]
        self.size = max(counts)
        like = tensors[0]
        self.flat = torch.zeros(world * self.size, dtype=like.dtype, device=like.device)
        self.shard = torch.zeros(self.size, dtype=like.dtype, device=like.device)  # the owned gradients
        self.param_shard = torch.zeros(self.size, dtype=like.dtype, device=like.device)  # the owned parameters
        self.members, self.views = members, []  # positions among the parameters; each one's view of ``flat``
        self.mine: list[int] = []  # positions of the owned ones
        self.grad_views: list[torch.Tensor] = []  # their views of ``shard``: their ``.grad``
        self.param_views: list[torch.Tensor] = []  # their views of ``param_shard``
        self.others: list[int] = []  # positions of the ones other ranks own
        self.other_views: list[torch.Tensor] = []  # their views of ``flat``
        at = [r * self.size for r in range(world)]
        for i, t, o in zip(members, tensors, owners):
            n, shape = t.numel(), t.shape
            view = self.flat[at[o]:at[o] + n].view(shape)
            self.views.append(view)
            if o == rank:
                local = at[o] - o * self.size
                self.mine.append(i)
                self.grad_views.append(self.shard[local:local + n].view(shape))
                self.param_views.append(self.param_shard[local:local + n].view(shape))
            else:
                self.others.append(i)
                self.other_views.append(view)
            at[o] += n


class GradientShard(GradientAverage):
    """The gradients' mean across the ranks of ``group``, each rank keeping the part of the parameters it owns
    (`partition`): reduce_scatter after the backward, all_gather of the updated parameters after the step."""

    def __init__(self, group: Any, world: int, params: Sequence[torch.Tensor]):
        super().__init__(group, world)
        self.rank = torch.distributed.get_rank(group)
        self._loads: dict[tuple, list[int]] = {}
        self._owner: dict[int, int] = {}  # NOTE: id of a parameter -> its rank; ``_kept`` keeps the ids alive
        self._kept: list[torch.Tensor] = []
        self._own(params)
        self._shards: dict[tuple, list[_Kind]] = {}  # NOTE: by layout; never dropped (a recording reads them)
        self._last: list[_Kind] = []

    def _own(self, params: Sequence[torch.Tensor]) -> None:
        new = [p for p in params if id(p) not in self._owner]
        for p, r in zip(new, partition(new, self.world, self._loads)):
            self._owner[id(p)] = r
            self._kept.append(p)

    def owns(self, p: torch.Tensor) -> bool:
        """Whether this rank updates ``p`` (its optimizer keeps state for it)."""
        return self._owner.get(id(p), self.rank) == self.rank

    @property
    def others(self) -> frozenset[int]:
        """The ids of the parameters other ranks own: this rank's optimizer never has state for them."""
        return frozenset(i for i, r in self._owner.items() if r != self.rank)

    def __call__(self, params: Sequence[torch.Tensor]) -> None:
        """Each owned parameter's ``.grad`` becomes its mean over the ranks (a view of the static shard); the others'
        None."""
        with_grad = [i for i, p in enumerate(params) if p.grad is not None]
        key = tuple(id(params[i]) for i in with_grad)
        layout = self._shards.get(key)
        if layout is None:
            layout = self._shards[key] = self._shard_layout(params, with_grad)
        for kind in layout:
            with torch.no_grad():
                internals.copy_into(kind.views, [params[i].grad for i in kind.members])
                kind.flat.div_(self.world)
                torch.distributed.reduce_scatter_tensor(kind.shard, kind.flat, group=self.group)
            self._count()
            for i, view in zip(kind.mine, kind.grad_views):
                params[i].grad = view
            for i in kind.others:
                params[i].grad = None
        self._last, self.buckets = layout, len(layout)

    def _shard_layout(self, params: Sequence[torch.Tensor], positions: list[int]) -> list[_Kind]:
        grads = same_gradients_on_every_rank([params[i].grad for i in positions], self.group, self.world)
        self._own([params[i] for i in positions])  # NOTE: a parameter trained since jit_step: the same on every rank
        kinds: dict[tuple, list[int]] = {}
        for i, g in zip(positions, grads):
            kinds.setdefault((g.dtype, g.device), []).append(i)
        return [_Kind(members, [self._owner[id(params[i])] for i in members], [params[i] for i in members],
                      self.rank, self.world) for members in kinds.values()]

    def clip(self, params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over every rank's gradients: the global 2-norm (each rank's shard's
        squared norm in float32, summed by one ``all_reduce``), each owned gradient multiplied by ``max_norm /
        (norm + 1e-6)`` clamped at 1; returns the norm (never read on the host)."""
        squares = [torch.linalg.vector_norm(k.shard, 2.0, dtype=torch.float32).square() for k in self._last]
        device = squares[0].device if squares else params[0].device  # NOTE: no gradient here: a norm of 0
        total = torch.stack([s.to(device) for s in squares]).sum() if squares else torch.zeros((), device=device)
        torch.distributed.all_reduce(total, group=self.group)
        self._count()
        total = total.sqrt()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        with torch.no_grad():
            for k in self._last:
                k.shard.mul_(coef.to(k.shard.device))
        return total

    def after_step(self, params: Sequence[torch.Tensor]) -> None:
        """Every rank's updated parameters to every rank: the owned ones into the static shard, one
        ``all_gather_into_tensor``, the other ranks' segments copied back into their parameters (in place)."""
        for kind in self._last:
            with torch.no_grad():
                internals.copy_into(kind.param_views, [params[i] for i in kind.mine])
                torch.distributed.all_gather_into_tensor(kind.flat, kind.param_shard, group=self.group)
                internals.copy_into([params[i] for i in kind.others], kind.other_views)
            self._count()

    def short(self) -> str:
        """``sharded across 2 ranks: 1 reduce_scatter + 1 all_gather a step``: for the step's repr."""
        n = self.buckets
        each = f"{n} reduce_scatter + {n} all_gather a step" if n else "reduce_scatter + all_gather in each step"
        graph = f" ({self.captured} collectives in a CUDA graph)" if self.captured else ""
        return f"sharded across {self.world} ranks: {each}{graph}"

    def text(self) -> str:
        """What the step does across the ranks, in words."""
        n = f"{self.buckets} of each, one" if self.buckets else "one of each"
        return (f"sharded across {self.world} ranks: reduce_scatter + all_gather per step ({n} per dtype and "
                "device, in static buffers): after the backward each rank keeps the mean of the gradients "
                "of the parameters it owns (ZeRO-2: optimizer state and gradients sharded, parameters whole), its "
                "optimizer steps those, and the updated parameters are gathered to every rank")

    def notes(self) -> list[str]:
        """What a user must know of the sharding, in words."""
        mine = sum(1 for r in self._owner.values() if r == self.rank)
        return [self.text(), f"rank {self.rank} owns {mine} of the {len(self._owner)} trained parameters: after a "
                "step, .grad of a parameter another rank owns is None, and optimizer.state_dict() holds this "
                "rank's shard only (a checkpoint saves each rank's)"]
