"""What `thunder_nb.compare` gives back and raises, apart from the `Comparison` itself: each version's `Outcome`, the
errors that say what the user must change, and the names of its options' values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..diagnosis import failures
from ..diagnosis.failures import Failure, Where

__all__ = [
    "Outcome",
    "CompareError",
    "TraceError",
    "CaptureUnavailableError",
    "EagerError",
    "ORIGINALS",
    "EAGER_DEVICE",
    "PEER",
    "PEER_MODE",
]

#: The ``torch.compile`` mode of the peer run (``peers``), and how the run section and the verdict name it.
PEER_MODE = "reduce-overhead"
PEER = f"torch.compile {PEER_MODE}"


#: The transforms a fixed run can be compared against.
ORIGINALS = ("stock", "legacy")
#: `Comparison.device` when no input is on a CUDA device.
EAGER_DEVICE = "cpu (eager mode: no CUDA graphs)"


class CompareError(Exception):
    """`compare` cannot do what was asked (the user must act: fix the function, inputs or options).

    ``where`` is the line of the user's code it is about, if any; `render` words it.
    """

    def __init__(self, message: str, where: Where | None = None):
        self.template, self.where = message, where
        super().__init__(self.render())

    def render(self, where_text: Callable[[Where], str] = failures.where_text) -> str:
        """The message, with ``{where}`` filled in by ``where_text``."""
        if self.where is None:
            return self.template
        return self.template.replace("{where}", where_text(self.where))


class TraceError(CompareError):
    """thunder cannot trace the function (so neither transform has anything to work on)."""


class CaptureUnavailableError(CompareError):
    """``capture=True`` was asked for, but there is no CUDA device (or the inputs are not on it)."""


class EagerError(CompareError):
    """The function fails in eager PyTorch: the user's own code raised, so there is nothing to check against."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one compiled version (original or fixed) did against eager PyTorch."""

    ran: bool  # the call (and the backward, when training) returned
    failure: Failure | None = None  # how tracing or the call failed, when it did
    value: str = ""  # a one-line repr of the result
    matches: bool | None = None  # the result equals eager's (None: not run)
    max_abs_error: float | None = None
    mismatch: str | None = None  # the first difference, when it does not match
    grads_match: bool | None = None  # None unless training
    grads_max_abs_error: float | None = None
    eager_regions: bool = False  # regions ran as plain Python (no graph captured for them)
    params_match: bool | None = None  # after every SGD step (None unless lr, or when a step failed)
    params_max_abs_error: float | None = None
    # thunder-without-graphs' own largest difference from eager, where the verdict "equal" leaned on it (the one
    # judge's rule 4: `thunder_nb.diagnosis.judge`); None where the base tolerance sufficed
    thunder_error: float | None = None

    @property
    def error(self) -> str | None:
        """``UnboundLocalError: ...`` when tracing or the call failed."""
        return self.failure.error if self.failure is not None else None

    @property
    def stage(self) -> str | None:
        """Where it failed: ``"trace"`` or ``"run"`` (None: it did not fail)."""
        return self.failure.stage if self.failure is not None else None

    @property
    def ok(self) -> bool:
        """Ran, and its value (and gradients and parameters, when checked) match eager."""
        return self.ran and bool(self.matches) and self.grads_match is not False and self.params_match is not False
