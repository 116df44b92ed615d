"""What each claim of the oracle is judged against, eager PyTorch's run of a program and plain ``thunder.jit``'s
(`Reference`), and what the claims share: the report of a transform's traces (`report_of`) and the words of a
difference, a defect or an error."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from .calls import CallLog, Difference, differences, execute, yardstick_problem
from .programs import Program
from .rules import known_analyze_error
from .verdicts import ProgramOutcome

__all__ = ["Reference", "report_of", "first_text", "defect_text", "describe"]


class Reference:
    """Eager PyTorch's run, and plain ``thunder.jit``'s (made on demand): the one judge of "equal"
    (`thunder_nb.diagnosis.judge`) lets a run differ from eager's as far as plain thunder's does, while plain thunder
    is sane itself (``thunder_wrong`` says where it is not)."""

    def __init__(self, fn: Callable[..., Any], program: Program, device: str, outcome: ProgramOutcome):
        self._fn, self._program, self._device, self._outcome = fn, program, device, outcome
        self.eager = execute(program.eager(fn, device), program, device)
        self._plain: CallLog | None = None
        self.thunder_wrong: str | None = None  # why plain thunder is itself wrong here (not finite, far from eager)

    @property
    def plain(self) -> CallLog:
        if self._plain is None:
            jfn = self._program.jit(self._fn, self._device, fusion_type=self._program.fusion_type)
            self._plain = execute(jfn, self._program, self._device)
            self._outcome.thunder_differs = self._plain.error is None and bool(differences(self._plain, self.eager))
            if self._outcome.thunder_differs:
                self.thunder_wrong = yardstick_problem(self._plain, self.eager)
        return self._plain

    def disagrees(self, run: CallLog, *, settle: bool = True) -> list[Difference]:
        """How ``run`` differs from eager PyTorch; empty when it agrees (where thunder differs, within thunder's own
        difference).

        With ``settle=False`` plain thunder is not consulted (it costs a trace): for a first look.
        """
        found = differences(run, self.eager)
        if found and settle and self.plain.error is None and self._outcome.thunder_differs:
            # NOTE: where thunder itself differs from eager, the run may differ as far, and no further; a plain
            # thunder that is itself wrong excuses nothing
            return [Difference(f.kind, f"{f.text} (thunder without graphs differs from eager too)")
                    for f in differences(run, self.eager, without_graphs=self.plain)]
        return found


def first_text(failures: list[Difference]) -> str | None:
    return f"{failures[0].kind}: {failures[0].text}" if failures else None


def report_of(jfn: Any, kind: str, outcome: ProgramOutcome, error: BaseException | None = None) -> Any:
    """``thunder_nb.analyze(jfn)``; None when it raised (a known bug is counted, anything else is a problem)."""
    import thunder_nb

    try:
        return thunder_nb.analyze(jfn, error=error)
    except Exception as e:
        bug = known_analyze_error(e)
        if bug is None:
            outcome.problems.append(f"analyze() failed on the {kind} transform's traces: {describe(e)}\n"
                                    + "".join(traceback.format_exception(e)[-4:]))
        elif bug not in outcome.known_bugs:
            outcome.known_bugs += (bug,)
        return None


def defect_text(d: Any) -> str:
    return f"{d.rule} @ {d.trace}/{d.where()} ({d.value}): {d.message}"


def describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:200].rstrip(": ")

