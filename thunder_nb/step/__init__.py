"""One CUDA graph per training iteration: forward, loss, backward and the optimizer's step, recorded and replayed.

The front door of the whole step: `jit_step` (`graph`: the call path; `recording`: the capture; `guard`: what a
replay is guarded on; `optimizer`: what each optimizer needs; `ranks`: the gradients' all-reduce across ranks;
`shard`: their reduce-scatter, ZeRO-2), `capturability` (`blockers`: what keeps a step from one graph) and
`compare_step` (`compare`); `report` holds their records.
"""

from __future__ import annotations

from .blockers import StepRefused, capturability, trace_blockers
from .compare import compare_step
from .decode import DecodeRefused, Decoder
from .graph import RecordAgainWarning, Step, jit_step
from .report import Blocker, Capturability, StepComparison

__all__ = ["jit_step", "Step", "StepRefused", "RecordAgainWarning", "capturability", "Capturability", "Blocker",
           "compare_step", "StepComparison", "trace_blockers",
           "Decoder", "DecodeRefused"]
