"""The oracle's call protocol: how a compiled program is called, what the calls leave, and how two runs differ."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...diagnosis.judge import yardstick_problem as judge_yardstick
from ...notebook.values import compare_values
from .programs import Program

__all__ = ["Call", "PROTOCOL", "FAILURE_KINDS", "CallLog", "Difference", "parameter_sets", "execute", "differences",
           "yardstick_problem"]


@dataclass(frozen=True, slots=True)
class Call:
    """One call of the protocol: its inputs' seed is its index; ``backward`` lists the calls backpropagated after it."""

    index: int
    layer: int  # which parameter set it gets
    backward: tuple[int, ...] = ()


#: The calls every version of a program goes through, each with fresh random inputs: call 0 with
#: parameter set 0 and call 1 with set 1, forward only, then one backward of the sum of both losses
#: (two forwards before one backward, as when two losses are summed); then call 2 with set 0 again
#: and its backward. A call's loss is the sum of its outputs that require grad. A module program's calls all take its
#: module's parameters (`parameter_sets`).
PROTOCOL: tuple[Call, ...] = (Call(0, 0), Call(1, 1, backward=(0, 1)), Call(2, 0, backward=(2,)))
LAYERS = 1 + max(c.layer for c in PROTOCOL)

#: How a run can differ from the reference, each a class of failure the checker's rules explain.
FAILURE_KINDS: dict[str, str] = {
    "error": "a call or backward raised",
    "output": "an output differs right after its call",
    "kept": "an output was right after its call, and changed before the caller was done with it",
    "alias": "returned tensors share memory differently (with each other, or with an argument)",
    "input": "an argument differs after the calls (an in-place update lost or misplaced, a parameter overwritten)",
    "gradient": "a gradient differs",
}


@dataclass(slots=True)
class CallLog:
    """What the calls of `PROTOCOL` left: per call its outputs (fresh copies and the objects kept), its aliasing, its
    inputs."""

    fresh: list[list[Any]] = field(default_factory=list)
    kept: list[list[Any]] = field(default_factory=list)
    aliasing: list[tuple[Any, ...]] = field(default_factory=list)
    inputs: list[list[Any]] = field(default_factory=list)
    parameters: list[list[Any]] = field(default_factory=list)  # per layer
    backward_ran: bool = False
    error: BaseException | None = None
    failed_at: str | None = None  # "call 1", "backward of calls 0, 1"

    def final(self) -> dict[str, Any]:
        """Copies of what the caller holds now: kept outputs, arguments, gradients."""
        import torch

        def grad(t: Any) -> Any:
            return (t.grad if t.grad is not None else torch.zeros_like(t)).detach().clone()

        calls = {f"call {c}": xs for c, xs in enumerate(self.inputs)}
        layers = {f"parameter set {i}": ps for i, ps in enumerate(self.parameters)}
        return {
            "kept": [[_copy(o) for o in outs] for outs in self.kept],
            "input": {k: [x.detach().clone() for x in xs] for k, xs in (calls | layers).items()},
            "gradient": {k: [grad(x) for x in xs if x.requires_grad] for k, xs in (calls | layers).items()},
        }


@dataclass(frozen=True, slots=True)
class Difference:
    """One way a run differs from the reference: its kind (`FAILURE_KINDS`) and the first such difference."""

    kind: str
    text: str


def _copy(o: Any) -> Any:
    import torch

    return o.detach().clone() if isinstance(o, torch.Tensor) else o


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def aliasing(outputs: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
    """Which memory each output lies in: an argument's (with the view's offset and strides), an earlier output's (or it
    is that very object, as eager returns ``t.flatten(), t`` of a 1-D ``t``), or its own."""
    import torch

    def storage(t: Any) -> int | None:
        if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
            return None
        return t.untyped_storage().data_ptr()

    facts: list[Any] = []
    arg_storage = [storage(a) for a in args]
    for j, o in enumerate(outputs):
        s = storage(o)
        if s is None:
            facts.append(None)
        elif (m := next((i for i in range(j) if outputs[i] is o), None)) is not None:
            facts.append(("object", m))
        elif s in arg_storage:
            k = arg_storage.index(s)
            facts.append(("argument", k, o.storage_offset() - args[k].storage_offset(), tuple(o.stride())))
        else:
            m = next((i for i in range(j) if storage(outputs[i]) == s), None)
            facts.append(("output", m) if m is not None else ("own",))
    return tuple(facts)


def _describe_alias(fact: Any) -> str:
    if fact is None:
        return "no tensor memory"
    if fact[0] == "argument":
        return f"a view of argument {fact[1]} (offset {fact[2]}, strides {fact[3]})"
    if fact[0] == "object":
        return f"output {fact[1]} itself"
    if fact[0] == "output":
        return f"the memory of output {fact[1]}"
    return "its own memory"


def parameter_sets(fn: Callable[..., Any], program: Program, device: str) -> list[list[Any]]:
    """The parameter sets of `PROTOCOL`'s calls: `LAYERS` fresh ones, or a module program's own (``distributed``): one
    set, the module's, which every call trains (a second set would be a second module, compiled apart)."""
    own = program.own_parameters(fn)
    return [own] if own is not None else [program.make_parameters(device, layer) for layer in range(LAYERS)]


def execute(fn: Callable[..., Any], program: Program, device: str) -> CallLog:
    """Run `PROTOCOL` on ``fn``; any exception ends the run and is kept in it (the caller judges it).

    Every result is kept: `differences` compares the outputs as they were right after their call
    (``fresh``) and as the caller holds them after all calls (``kept``: a later replay must not have
    overwritten them), which returned tensors share memory with each other or with an argument (and,
    for a view of an argument, which view), every argument after all calls (in-place updates;
    parameters shared by calls 0 and 2), and every gradient.
    """
    import torch

    run = CallLog(parameters=parameter_sets(fn, program, device))
    losses: dict[int, Any] = {}
    stage = "start"
    try:
        for call in PROTOCOL:
            stage = f"call {call.index}"
            inputs = program.make_inputs(device, seed=call.index)
            passed = program.passed(program.arguments(inputs, run.parameters[min(call.layer, len(run.parameters) - 1)]))
            run.inputs.append(inputs)
            out = _flat(fn(*passed))
            run.kept.append(out)
            run.fresh.append([_copy(o) for o in out])
            run.aliasing.append(aliasing(out, passed))
            grad_outputs = [o.sum() for o in out if isinstance(o, torch.Tensor) and o.requires_grad]
            if grad_outputs:
                losses[call.index] = sum(grad_outputs[1:], grad_outputs[0])
            pending = [losses.pop(i) for i in call.backward if i in losses]
            if pending:
                stage = f"backward of call{'s' if len(call.backward) > 1 else ''} {', '.join(map(str, call.backward))}"
                sum(pending[1:], pending[0]).backward()
                run.backward_ran = True
        if device != "cpu":
            torch.cuda.synchronize()
    except Exception as e:  # NOTE: every failure is data here; the caller judges it
        run.error, run.failed_at = e, stage
    return run


def _fact(log: CallLog, call: int, j: int) -> Any:
    """Where output ``j`` of call ``call`` lies in ``log`` (`aliasing`); None past its outputs."""
    facts = log.aliasing[call] if call < len(log.aliasing) else ()
    return facts[j] if j < len(facts) else None


def differences(run: CallLog, ref: CallLog, without_graphs: CallLog | None = None) -> list[Difference]:
    """Every kind of difference between ``run`` and the reference, with the first of each kind; empty when they agree.

    Each value is judged by the one judge of "equal" (`thunder_nb.diagnosis.judge`); with ``without_graphs`` (plain
    thunder's run of the same calls) a value may differ from the reference's as far as that run's does (its rule 4),
    and an output may lie where it lies in that run (thunder returns one object for eager's ``t.reshape(t.shape), t``).
    Both runs must be complete (no error); a run's own error is judged by the caller.
    """
    found: dict[str, str] = {}
    plain = without_graphs.final() if without_graphs is not None else None

    def note(kind: str, text: str | None) -> None:
        if text is not None and kind not in found:
            found[kind] = text

    def differ(got: Any, expected: Any, label: str, yardstick: Any = None) -> str | None:
        return compare_values(got, expected, label=label, without_graphs=yardstick).difference

    if len(run.fresh) != len(ref.fresh):
        note("output", f"{len(run.fresh)} calls returned, expected {len(ref.fresh)}")
    final, ref_final = run.final(), ref.final()
    for c, (outs, ref_outs) in enumerate(zip(run.fresh, ref.fresh)):
        fresh_why = differ(outs, ref_outs, f"call {c}: output",
                           without_graphs.fresh[c] if without_graphs is not None else None)
        note("output", fresh_why)
        if fresh_why is None:
            note("kept", differ(final["kept"][c], ref_final["kept"][c], f"call {c}: output kept",
                                plain["kept"][c] if plain is not None else None))
        for j, (a, b) in enumerate(zip(run.aliasing[c], ref.aliasing[c])):
            if a != b and (without_graphs is None or a != _fact(without_graphs, c, j)):
                note("alias", f"call {c}: output {j} lies in {_describe_alias(a)}, expected {_describe_alias(b)}")
    for kind in ("input", "gradient"):
        note(kind, differ(final[kind], ref_final[kind], kind, plain[kind] if plain is not None else None))
    if run.backward_ran != ref.backward_ran:
        note("gradient", f"backward ran: {run.backward_ran}, expected {ref.backward_ran}")
    return [Difference(k, found[k]) for k in FAILURE_KINDS if k in found]


def yardstick_problem(plain: CallLog, ref: CallLog) -> str | None:
    """Why plain thunder's run is no yardstick against the reference's (not finite where the reference is, far from
    it: `thunder_nb.diagnosis.judge.yardstick_problem`), or None."""
    final, ref_final = plain.final(), ref.final()
    parts = [(plain.fresh, ref.fresh, "output"), (final["kept"], ref_final["kept"], "output kept"),
             (final["input"], ref_final["input"], "input"), (final["gradient"], ref_final["gradient"], "gradient")]
    for got, expected, label in parts:
        problem = judge_yardstick(got, expected, label=label)
        if problem is not None:
            return problem
    return None
