"""The checker predicts thunder's graph-memory hazards from the traces: gradients in graph memory, static arguments.

Each hazard is shown for real first (thunder's transform gives a wrong number under emulated
capture on the CPU, or real capture on the GPU), then the checker must name it with severity
"wrong result", and must not name it for the fixed transform, which does not have it.
"""

from __future__ import annotations

import pytest
import thunder
import torch

import thunder_nb
from gpu_or_emulated import MODES, capturing, device_of, fixed, stock
from thunder_nb.diagnosis.model import Defect
from thunder_nb.testing import fuzz
from thunder_nb.diagnosis.judge import judge


def randn(*shape, seed: int, device: str, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device).requires_grad_(grad)


def found(jfn, rule: str) -> list[Defect]:
    return [d for d in thunder_nb.analyze(jfn).defects if d.rule == rule]


# --- a gradient handed to autograd in graph memory (fuzz program 59) -------------------------------


PROGRAM_59 = """\
def prog(x0, x1):
    s1 = x1.mean().item()
    t2 = x1.sin()
    s3 = t2.amax().item()
    t4 = t2.add(t2)
    n5 = (t4 > 0).sum().item()
    t6 = t4.mean(0)
    return t6,
"""


def program_59() -> fuzz.Program:
    program = fuzz.generate(fuzz.RandomChooser(59))
    assert program.source == PROGRAM_59 and program.fusion_type == "dataflow"  # NOTE: the H200 run's program
    return program


@pytest.mark.parametrize("mode", MODES)
def test_program_59_gradient_in_graph_memory_is_predicted(mode):
    """thunder's backward returns its graph's output buffer as the gradient: the next backward's replay overwrites it.

    The H200 fuzz run saw a wrong gradient here that no rule explained. ``.backward()`` adopts a
    copy on the CPU, but under real capture thunder's backward (autograd's CPU thread) can replay
    again before the device thread accumulates the gradient; ``torch.autograd.grad`` returns the
    buffer itself, on any device: two forwards, one ``grad`` call, and call 1's gradient is call 0's.
    """
    program = program_59()
    fn, device = program.function(), device_of(mode)
    x0 = randn(6, seed=0, device=device)
    xs = [randn(4, 4, seed=1 + i, device=device, grad=True) for i in range(2)]
    expected = torch.autograd.grad(sum(fn(x0, x)[0].sum() for x in xs), xs)
    with capturing(mode):
        results = {}
        for name, transform in (("stock", stock(mode)), ("fixed", fixed(mode))):
            jfn = thunder.jit(fn, transforms=[transform], fusion_type=program.fusion_type)
            losses = [jfn(x0, x)[0].sum() for x in xs]
            grads = torch.autograd.grad(losses[0] + losses[1], xs)
            results[name] = (jfn, [judge(g, e).equal for g, e in zip(grads, expected)])
    jstock, stock_right = results["stock"]
    jfixed, fixed_right = results["fixed"]
    assert not all(stock_right)  # the hazard is real: one gradient is another call's
    assert all(fixed_right)
    (defect,) = [d for d in found(jstock, "returned-graph-memory") if d.trace == "backward"]
    assert defect.severity == "wrong result" and "gradient" in defect.message
    assert fuzz.kinds_of(defect) == {"gradient"}
    assert not [d for d in found(jfixed, "returned-graph-memory") if d.trace == "backward"]


def test_a_gradient_in_graph_memory_explains_a_wrong_gradient_under_real_capture():
    def defect(trace):
        return Defect("returned-graph-memory", trace, None, "t1", 1, "", "")

    backward = fuzz.predict([defect("backward")], {"gradient"}, True)
    assert backward.may == ("returned-graph-memory",) and not backward.false_negative
    assert backward.may_shown == ("returned-graph-memory",)
    # NOTE: on the CPU the protocol's backward() accumulates each gradient before the next replay
    assert fuzz.predict([defect("backward")], {"gradient"}, "emulated").unexplained == ("gradient",)
    forward = fuzz.predict([defect("forward")], {"gradient"}, True)
    assert forward.unexplained == ("gradient",)  # NOTE: a kept result, not a gradient
    assert fuzz.predict([defect("backward")], {"kept"}, True).unexplained == ("kept",)


# --- a static input that is an argument: predicted before any call --------------------------------


def layer(x, w, b):
    return torch.tanh(x @ w + b)


def parameter(seed: int, *shape, device: str) -> torch.nn.Parameter:
    return torch.nn.Parameter(randn(*shape, seed=seed, device=device))


@pytest.mark.parametrize("mode", MODES)
def test_static_argument_is_predicted_before_the_first_call(mode):
    """Parameters passed as arguments are static for thunder: the checker names them from call 0's traces alone."""
    device = device_of(mode)
    x = randn(8, 16, seed=0, device=device)
    sets = [(parameter(10 + i, 16, 16, device=device), parameter(20 + i, 16, device=device)) for i in range(2)]
    jfn = thunder.jit(layer, transforms=[stock(mode)])
    thunder.compile_data(jfn)._get_computation_and_inputs(x, *sets[0])  # NOTE: traces only: nothing ran
    predicted = found(jfn, "static-input-rebound")
    assert {(d.trace, d.value) for d in predicted} == {("forward", "w"), ("forward", "b")}
    assert all(d.severity == "wrong result" and "argument" in d.message for d in predicted)
    w0 = sets[0][0].detach().clone()
    with capturing(mode):
        for w, b in sets:
            jfn(x, w, b)
    assert not torch.equal(sets[0][0].detach(), w0)  # the prediction comes true: set 1 was copied into set 0
    after = found(jfn, "static-input-rebound")
    assert {d.value for d in after} == {"w", "b"} and all("the runner did so" in d.message for d in after)


@pytest.mark.parametrize("mode", MODES)
def test_static_tensors_that_are_not_arguments_are_not_predicted(mode):
    """A jitted module's own parameters and a closure's are the same tensors on every call: nothing to rebind."""
    device = device_of(mode)
    x = randn(8, 16, seed=0, device=device)
    module = torch.nn.Linear(16, 16).to(device)
    w, b = parameter(10, 16, 16, device=device), parameter(20, 16, device=device)

    def closure(x):
        return torch.tanh(x @ w + b)

    for target in (module, closure):
        jfn = thunder.jit(target, transforms=[stock(mode)])
        thunder.compile_data(jfn)._get_computation_and_inputs(x)
        assert not found(jfn, "static-input-rebound"), target


@pytest.mark.parametrize("mode", MODES)
def test_the_fixed_transform_keys_static_arguments_by_address_and_is_not_flagged(mode):
    device = device_of(mode)
    x = randn(8, 16, seed=0, device=device)
    sets = [(parameter(10 + i, 16, 16, device=device), parameter(20 + i, 16, device=device)) for i in range(2)]
    before = [w.detach().clone() for w, _ in sets]
    with capturing(mode):
        jfn = thunder.jit(layer, transforms=[fixed(mode)])
        for w, b in sets + sets:
            jfn(x, w, b)
    assert all(torch.equal(w.detach(), w0) for (w, _), w0 in zip(sets, before))
    assert not found(jfn, "static-input-rebound")
