"""Each compiled run of `thunder_nb.compare` checked against eager PyTorch by the one judge and timed: its `Outcome`
(`check_and_time`), against eager's values (`reference`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..diagnosis.failures import Failure, error_line
from ..diagnosis.judge import Judgement, judge
from .outcome import PEER, CompareError, Outcome
from .runs import Plan, Ran, Run, Timings, checked_call, detached, eager_error, params, time_calls
from .values import short
from .without_graphs import WithoutGraphs

__all__ = ["reference", "check_and_time"]

#: How value differences name eager PyTorch's value: ``result: 3, eager's 4``.
EAGER = "eager's"
#: `Timings` keys of each run's label (any other label is the original).
_TIMING_KEYS = {"fixed": "fixed", PEER: "peer"}


def reference(eager: Run, plan: Plan) -> Ran:
    """Run eager PyTorch once (and its backward, when training): the values both versions are checked against.

    Raises:
        EagerError: the function raises.
        CompareError: training, and the result is not a scalar tensor that requires grad.
    """
    import torch

    try:
        value = eager.call(training=False)
    except Exception as e:
        raise eager_error(plan.name, e) from e
    if plan.training:
        if not (isinstance(value, torch.Tensor) and value.numel() == 1 and value.requires_grad):
            got = f"a {type(value).__name__}" if not isinstance(value, torch.Tensor) else (
                f"a tensor of shape {tuple(value.shape)}" + ("" if value.requires_grad else " that does not require grad")
            )
            raise CompareError(
                f"training needs {plan.name} to return a scalar tensor that requires grad; it returned {got}"
            )
        value.backward()
    ran = Ran(value=value, grads=eager.bound.grads() if plan.training else {})
    if plan.training:
        eager.after_step(plan.lr)
    return ran


def _judged(actual: Any, expected: Any, plain: Any, *, label: str = "result") -> Judgement:
    """The one judge (`thunder_nb.diagnosis.judge.judge`) against eager's values, first at the base tolerance, then,
    where that says they differ and ``plain()`` gives thunder-without-graphs' values, within their own difference."""
    first = judge(actual, expected, label=label, reference=EAGER)
    if first.equal or plain is None:
        return first
    yardstick = plain()
    if yardstick is None:
        return first
    return judge(actual, expected, without_graphs=yardstick, label=label, reference=EAGER)


def _thunder_note(*judgements: Judgement | None) -> float | None:
    """Thunder-without-graphs' own largest difference from eager, where a verdict leaned on it (else None)."""
    leaned = [j.without_graphs_error for j in judgements if j is not None and j.widened]
    return max((e for e in leaned if e is not None), default=None) if leaned else None


def _outcome(run: Run, eager: Ran, training: bool, plain: WithoutGraphs | None = None) -> Outcome:
    ran = run.ran
    eager_regions = run.transform is not None and any(
        run.runner.region_stats(name).eager_calls for name in run.runner.python_callables
    )
    if ran.error is not None:
        return Outcome(False, Failure.of(ran.error, "run"), eager_regions=eager_regions)
    value = detached(ran.value)

    def thunder_value() -> Any:
        ref = plain.checked()
        return None if ref is None else detached(ref.value)

    def thunder_grads() -> Any:
        ref = plain.checked()
        return None if ref is None else ref.grads

    result = _judged(value, detached(eager.value), thunder_value if plain is not None else None)
    grads = (_judged(ran.grads, eager.grads, thunder_grads if plain is not None else None, label="grad")
             if training else None)
    return Outcome(True, value=short(value), matches=result.equal, max_abs_error=result.max_abs_error,
                   mismatch=result.difference or (grads.difference if grads else None),
                   grads_match=grads.equal if grads else None,
                   grads_max_abs_error=grads.max_abs_error if grads else None,
                   eager_regions=eager_regions, thunder_error=_thunder_note(result, grads))


def check_and_time(run: Run, eager: Ran, eager_params: dict | None, timings: Timings, notes: list[str],
                   plan: Plan, say: Callable[[str], None], plain: WithoutGraphs | None = None) -> Outcome:
    """Check one compiled version against eager, time it, and (with ``lr``) compare its parameters after as many steps.

    ``plain``: thunder without graphs with this version's executors, asked only where the version differs from eager
    beyond the base tolerance (the one judge's rule 4)."""
    from .. import internals
    from ..fix import recover_from_failed_capture

    thunder_run = run.transform is not None
    what = f"the {run.label} transform" if thunder_run else run.label
    say(f"running {plan.name} with {what}…" + ("" if thunder_run else " (its first call compiles)"))
    stream = internals.current_stream() if plan.cuda else None  # NOTE: a failed capture leaves its stream current
    run.ran = checked_call(run, plan)
    if run.ran.error is not None and plan.cuda:
        recover_from_failed_capture(stream)
    outcome = _outcome(run, eager, plan.training, plain)
    if not outcome.ran:
        return outcome
    say(f"timing {plan.name} with {what} ({plan.repeats} calls)…")
    try:
        timings.add(_TIMING_KEYS.get(run.label, "original"), time_calls(run, plan, say, f"{plan.name} with {what}"))
    except Exception as e:  # NOTE: a later call failing is a finding too, not a crash of compare
        if plan.cuda:
            recover_from_failed_capture(stream)
        notes.append(f"{run.label}: a later call failed while timing: {error_line(e)}")
        return outcome
    if eager_params is None:
        return outcome

    def thunder_params() -> Any:
        found = plain.params_after(run.steps)
        return found

    checked = _judged(params(run), eager_params, thunder_params if plain is not None else None, label="parameter")
    if checked.difference:
        notes.append(f"{run.label}: after {run.steps} SGD steps, {checked.difference}")
    leaned = _thunder_note(checked)
    return dataclasses.replace(outcome, params_match=checked.equal, params_max_abs_error=checked.max_abs_error,
                               thunder_error=max((e for e in (outcome.thunder_error, leaned) if e is not None),
                                                 default=None))

