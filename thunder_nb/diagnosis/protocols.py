"""What the diagnosis reads from a CUDA-graph transform and its runner, as Protocols: thunder's own
(`CUDAGraphTransform`, `CUDAGraphRunner`) have the plain ones, thunder-nb's (`thunder_nb.fix`,
`thunder_nb.cudagraph.runner.ThunderNBRunner`) the planning and recording ones too."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .plans import HandOutPlan, HandOutStats, RegionPlan, RegionStats

__all__ = ["GraphRunner", "RecordingRunner", "GraphTransform", "PlanningTransform"]


@runtime_checkable
class GraphRunner(Protocol):
    """A CUDA-graph runner, thunder's own too: each region's function and the symbols it was made from."""

    #: region name -> (its Python function, which of its inputs are static, or None)
    python_callables: Mapping[str, tuple[Callable[..., Any], Sequence[bool] | None]]
    #: region name -> (its bound symbols, inputs, outputs)
    trace_symbols: Mapping[str, tuple[Sequence[Any], Sequence[Any], Sequence[Any]]]


@runtime_checkable
class RecordingRunner(GraphRunner, Protocol):
    """thunder-nb's runner: the transform's plan of each region, and what the runner did with it."""

    plans: Mapping[str, RegionPlan]  # region name -> the transform's plan

    @property
    def graphs_captured(self) -> int:
        """CUDA graphs captured so far, all regions and instances together."""
        ...

    def region_stats(self, fn_name: str) -> RegionStats:
        """What the runner did with region ``fn_name`` so far."""
        ...

    def hand_out_stats(self, kind: str) -> HandOutStats:
        """What the hand-outs of ``kind`` ("forward", "backward") did so far."""
        ...


@runtime_checkable
class GraphTransform(Protocol):
    """A CUDA-graph transform, thunder's own too (the executor of its region symbols): its runner."""

    cuda_graph_runner: GraphRunner


@runtime_checkable
class PlanningTransform(GraphTransform, Protocol):
    """thunder-nb's transforms: their name in reports, what leaves each trace, and what the report should mention."""

    label: str  # "fixed", "legacy"
    hand_outs: Mapping[str, HandOutPlan]  # "forward" / "backward" -> the plan of the latest such trace
    handoff_refusals: Mapping[str, str]  # number -> why it stays a Python number
    notes: Sequence[str]  # decisions the report should mention
