"""One CUDA graph per training iteration: forward, loss, backward and the optimizer's step, recorded and replayed.

The front door of the whole step: `jit_step` (`thunder_nb.step_graph`, its guards in `thunder_nb.step_guard`),
`capturability` (`thunder_nb.step_capture`) and `compare_step` (`thunder_nb.step_compare`).
"""

from __future__ import annotations

from .step_capture import StepRefused, capturability, trace_blockers
from .step_compare import compare_step
from .step_graph import RecordAgainWarning, Step, jit_step
from .step_report import Blocker, Capturability, StepComparison

__all__ = ["jit_step", "Step", "StepRefused", "RecordAgainWarning", "capturability", "Capturability", "Blocker",
           "compare_step", "StepComparison", "trace_blockers"]
