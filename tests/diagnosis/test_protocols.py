"""What the diagnosis reads from a transform and its runner (`thunder_nb.diagnosis.protocols`): thunder's own have
the plain Protocols, thunder-nb's the planning and recording ones too, so a renamed attribute fails here first."""

from __future__ import annotations

from thunder.transforms.cudagraph import CUDAGraphTransform

from thunder_nb.cudagraph.runner import ThunderNBRunner
from thunder_nb.diagnosis.protocols import GraphRunner, GraphTransform, PlanningTransform, RecordingRunner
from thunder_nb.fix import FixedCUDAGraphTransform, LegacyCUDAGraphTransform


def test_thunders_own_transform_and_runner_have_the_plain_protocols_only():
    t = CUDAGraphTransform()
    assert isinstance(t, GraphTransform) and not isinstance(t, PlanningTransform)
    assert isinstance(t.cuda_graph_runner, GraphRunner) and not isinstance(t.cuda_graph_runner, RecordingRunner)


def test_thunder_nbs_transforms_plan_and_their_runners_record():
    for cls in (FixedCUDAGraphTransform, LegacyCUDAGraphTransform):
        t = cls(capture=False)
        assert isinstance(t, PlanningTransform), cls
        assert isinstance(t.cuda_graph_runner, RecordingRunner), cls


def test_the_stock_side_runner_records_too():
    assert isinstance(ThunderNBRunner(capture=False, stock=True), RecordingRunner)
