"""Differential fuzzing of training loops: the loops people write around a model, run eagerly and under thunder-nb.

A `Loop` composes the features of real training loops: a model (an MLP, a convolution with BatchNorm, an embedding), any
``torch.optim`` optimizer, an lr scheduler or an lr edited by hand, gradient clipping and accumulation, switches to eval
mode for a validation loss (under autocast training, in float32 too), freezing and unfreezing a layer, a head and its
param group added mid-run, a checkpoint of the model, optimizer and scheduler saved and loaded back, bf16 autocast or
fp16 with a GradScaler, a logged ``loss.item()``, a ragged last batch, a loss function that updates its batch in place,
param groups (weights with weight decay, biases and norms without, the head at half the learning rate), a moving average
of the weights, a forward hook registered and removed mid-run, a layer tied to another's weight, activation
checkpointing, and a running statistic the forward keeps in a buffer (written in place in training mode). `run` runs one under a configuration (`CONFIGS`) and records every step; `judge` runs it eagerly and
under each configuration (and without graphs where a step needs that yardstick), and names each run's first step that
leaves eager's, and each run that warned falsely that thunder gets a gradient wrong. The loops and their generator are
in `loop_features`, running one in `loop_run`; this module judges.

Dropout's masks come from different random streams under thunder and eager PyTorch, so no loop trains with active
dropout: BatchNorm is what makes train and eval mode differ here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .loop_features import EVENTS, FEATURES, MODELS, OPTIMIZERS, PRECISIONS, SCHEDULERS, Loop, generate, loops
from .loop_run import CONFIGS, FLOAT32, REFERENCES, LoopRun, run

__all__ = ["Loop", "LoopRun", "CONFIGS", "MODELS", "OPTIMIZERS", "SCHEDULERS", "PRECISIONS", "EVENTS", "FEATURES",
           "REFERENCES", "generate", "loops", "run", "judge", "LoopVerdict"]


#: The base tolerance of each precision (`thunder_nb.diagnosis.judge`): beyond it a run may differ from eager as far
#: as thunder without graphs does on the same loop, value by value, while that reference is itself sane.
def _tolerance(precision: str) -> Any:
    from ...diagnosis.judge import AUTOCAST, MODEL

    return MODEL if precision == "fp32" else AUTOCAST


@dataclass
class LoopVerdict:
    """A loop judged: each (configuration, capture mode) run's first divergence from eager, or its refusal."""

    loop: Loop
    eager: LoopRun
    runs: dict[tuple[str, Any], LoopRun]
    wrong: dict[tuple[str, Any], str]  # the first divergence of each run that left eager's
    references: dict[str, LoopRun]  # the runs without graphs that `judge` needed
    reference_problems: dict[str, str]  # where thunder without graphs itself leaves eager: thunder's own gap
    # NOTE: a loop writes in place only its batch, with values that need no gradient: a warning that thunder gets a
    # gradient wrong there is false
    false_alarms: dict[tuple[str, Any], str] = field(default_factory=dict)

    def report(self) -> str:
        """Every wrong run with its first diverging step, and every false alarm, under the loop."""
        lines = [str(self.loop)]
        lines += [f"  {c} (capture={m!r}): {why}" for (c, m), why in self.wrong.items()]
        lines += [f"  {c} (capture={m!r}) warned falsely: {why}" for (c, m), why in self.false_alarms.items()]
        lines += [f"  ({name}, the reference: {why})" for name, why in self.reference_problems.items()]
        return "\n".join(lines)


#: The warning that thunder gets a gradient wrong (`thunder_nb.internals.saved.InPlaceGradientWarning`), as a run
#: records it: no loop writes an input so.
_GRADIENT_ALARM = "InPlaceGradientWarning:"


def _difference(a: dict[str, Any], b: dict[str, Any], ref: dict[str, Any] | None, precision: str) -> str | None:
    """The first difference of step record ``a`` from eager's ``b`` (a value missing from either, or one the judge
    calls unequal, given thunder-without-graphs' record ``ref`` of the same step); None when they are equal."""
    from ...diagnosis.judge import judge as judge_values

    missing, more = [k for k in b if k not in a], [k for k in a if k not in b]
    if missing or more:
        extra = len(missing) + len(more) - 1
        return (f"{missing[0]} missing (eager has it)" if missing else f"{more[0]} (eager has none)") + (
            f", and {extra} more" if extra else "")
    if ref is not None and set(ref) != set(b):
        ref = None  # NOTE: thunder without graphs lacks a value eager has: no yardstick (reported on its own)
    # NOTE: a value computed without autocast (a validation loss in float32) has float32's tolerance in any loop
    exact = [k for k in b if k.endswith(FLOAT32)] if precision != "fp32" else []
    for keys, tolerance in ((exact, _tolerance("fp32")), ([k for k in b if k not in exact], _tolerance(precision))):
        if keys:
            j = judge_values({k: a[k] for k in keys}, {k: b[k] for k in keys},
                             without_graphs=None if ref is None else {k: ref[k] for k in keys}, tolerance=tolerance,
                             label="")
            if not j.equal:
                return j.difference.lstrip(" ")
    return None


def judge(loop: Loop, runs: Sequence[tuple[str, Any]], device: Any = "cpu") -> LoopVerdict:
    """Run ``loop`` eagerly and in each (configuration, capture mode) of ``runs``; each run must equal eager's at every
    step, by `thunder_nb.diagnosis.judge`'s rule with the reference's record of the same step (without graphs:
    `REFERENCES`) as its yardstick.

    A reference runs only where it can change a verdict or explain one: a step beyond the base tolerance (the judge
    reads the yardstick only there), or a run that failed; a run equal to eager within the base tolerance needs none."""
    eager = run(loop, "eager", device=device)
    refs: dict[str, LoopRun] = {}

    def reference(config: str) -> LoopRun:
        name = REFERENCES[config]
        if name not in refs:
            refs[name] = run(loop, name, device=device)
        return refs[name]

    done: dict[tuple[str, Any], LoopRun] = {}
    wrong: dict[tuple[str, Any], str] = {}
    for config, mode in runs:
        got = run(loop, config, capture=mode, device=device)
        done[(config, mode)] = got
        if got.refused or got.error:
            continue  # NOTE: not silent: the caller tallies refusals and errors
        for i, (a, b) in enumerate(zip(got.steps, eager.steps)):
            if _difference(a, b, None, loop.precision) is None:
                continue  # NOTE: within the base tolerance, whatever thunder without graphs does
            ref = reference(config)
            diff = _difference(a, b, ref.steps[i] if i < len(ref.steps) else None, loop.precision)
            if diff is not None:
                wrong[(config, mode)] = f"step {i}: {diff}"
                break
        else:
            if len(got.steps) != len(eager.steps):
                wrong[(config, mode)] = f"{len(got.steps)} steps run, eager ran {len(eager.steps)}"
    if wrong or any(r.refused or r.error for r in done.values()):
        for config, _ in runs:  # NOTE: what thunder without graphs does, for the report of what went wrong
            reference(config)
    problems = {}
    for name, ref in refs.items():
        if ref.error or ref.refused:
            problems[name] = f"thunder without graphs failed: {ref.error or ref.refused}"
            continue
        for i, (a, b) in enumerate(zip(ref.steps, eager.steps)):
            why = _difference(a, b, None, loop.precision)
            if why is not None:
                problems[name] = f"thunder without graphs leaves eager at step {i}: {why}"
                break
    alarms = {key: next(w for w in got.warnings if w.startswith(_GRADIENT_ALARM)) for key, got in done.items()
              if any(w.startswith(_GRADIENT_ALARM) for w in got.warnings)}
    return LoopVerdict(loop, eager, done, wrong, refs, problems, alarms)
