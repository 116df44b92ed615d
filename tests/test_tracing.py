"""thunder's interpreter as `thunder_nb.internals.tracing` changes it: the same traces, the same tracebacks, faster.

Every entry point installs the change (`thunder_nb.internals.check_versions`); these tests put thunder's own back
(`tracing.uninstall`) to trace the same functions both ways in one process. How much faster: ``bench/tracing.py``.
(The fallback, where nothing is changed: tests/test_unsupported_versions.py.)
"""

from __future__ import annotations

import dis
import inspect
import re
import traceback

import pytest
import thunder
import torch
from thunder.core import interpreter
from torch import nn

from thunder_nb import internals
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.internals import tracing

pytestmark = pytest.mark.skipif(not internals.supported(), reason="thunder-nb changes thunder's interpreter only where "
                                "internals.supported() (lightning-thunder 0.2.6, torch 2.11)")


@pytest.fixture
def both_ways():
    """Run the test's body with thunder's own interpreter, then with thunder-nb's change: ``both_ways(fn)`` returns
    ``[fn() with thunder's, fn() with the change]``; the change stays installed after, as every entry point leaves
    it."""

    def run(fn):
        tracing.uninstall()
        try:
            own = fn()
        finally:
            assert tracing.install()
        return [own, fn()]

    yield run
    assert tracing.install()


class _Net(nn.Module):
    """A loop over a ModuleList, a ``hasattr`` that fails (an exception inside the interpreter, caught), a
    ``try``/``except`` and a method of a nested module: the frames and exceptions a model's trace goes through."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        if hasattr(self, "extra"):
            x = self.extra(x)
        try:
            scale = self.missing_scale
        except AttributeError:
            scale = 0.5
        return self.head(x * scale).logsumexp(-1).mean()


def _text(trace) -> str:
    """A trace's text without how long each pass took (the one part that differs between two equal traces)."""
    return re.sub(r"\(took \d+ millisec\w*\)", "", str(trace))


def _traced(net: nn.Module, x: torch.Tensor) -> tuple[str, str, torch.Tensor, list[torch.Tensor]]:
    """(the forward trace, the backward trace, the loss, the gradients) of one jitted call and its backward."""
    net.zero_grad(set_to_none=True)
    jfn = thunder.jit(net)
    loss = jfn(x)
    loss.backward()
    texts = [_text(trace) for trace in (thunder.last_traces(jfn)[-1], thunder.last_backward_traces(jfn)[-1])]
    return (*texts, loss.detach(), [p.grad.clone() for p in net.parameters()])


def test_a_models_traces_and_gradients_are_the_same_both_ways(both_ways):
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(4, 8)
    (fw, bw, loss, grads), (fw2, bw2, loss2, grads2) = both_ways(lambda: _traced(net, x))
    assert fw2 == fw and bw2 == bw
    assert torch.equal(loss2, loss) and all(torch.equal(a, b) for a, b in zip(grads2, grads))
    assert interpreter.dis.kept, "no instructions kept: the change did not run"


def _raises(x: torch.Tensor) -> torch.Tensor:
    x = x * 2
    raise ValueError("the user's own error")


def _calls_raises(x: torch.Tensor) -> torch.Tensor:
    return _raises(x + 1)


def test_an_error_inside_the_traced_code_has_the_users_frames_both_ways(both_ways):
    """thunder makes a Python frame for each interpreted frame an exception leaves (`tracing._python_frame` with the
    change): the traceback names the user's functions and lines, the same both ways."""

    def frames():
        with pytest.raises(ValueError, match="the user's own error") as caught:
            thunder.jit(_calls_raises)(torch.randn(3))
        return [(f.name, f.lineno) for f in traceback.extract_tb(caught.value.__traceback__)
                if f.filename == __file__]

    own, changed = both_ways(frames)
    assert changed == own
    names = [name for name, _ in changed]
    assert "_calls_raises" in names and "_raises" in names, changed
    line = _raises.__code__.co_firstlineno + 2  # NOTE: the raise
    assert ("_raises", line) in changed, changed


def test_the_instructions_kept_are_diss_and_every_other_name_is_diss_own():
    assert tracing.install()
    copy = interpreter.dis
    assert copy is not dis and copy.Instruction is dis.Instruction
    assert copy._parse_exception_table is dis._parse_exception_table and copy.opmap is dis.opmap
    for code in (_Net.forward.__code__, _traced.__code__, (lambda d, k: d[k]).__code__):
        first = list(copy.get_instructions(code))
        assert first == list(dis.get_instructions(code))
        assert code in copy.kept and list(copy.get_instructions(code)) == first
    assert list(copy.get_instructions(_raises)) == list(dis.get_instructions(_raises))  # NOTE: not a code object


def _log_of_a_call() -> list:
    """The interpreter's history of one call of a lambda, recorded (``record_history``): its ``InterpreterCall``
    entry names the call site, the frame `InterpreterRuntimeCtx` reads from ``inspect.stack()[2]``."""
    fn = interpreter.interpret(lambda x: x * 2, record_history=True)
    fn(3)
    return [item for item in interpreter.last_interpreter_log(fn) if isinstance(item, dict)]


def test_the_call_site_a_recorded_history_names_is_the_same_both_ways(both_ways):
    own, changed = both_ways(_log_of_a_call)
    assert changed == own
    call = next(item for item in own if item["kind"] == "InterpreterCall")
    assert call["fn_filename"] == __file__ and call["prev_frame"] == "_log_of_a_call", call


def _stacks(context: int) -> tuple[list, list, list, object, int]:
    """inspect.stack(context) and, read while the frames further out are at the same line, the interpreter's: each
    entry, a slice, the last entry, the length."""
    full, lazy = inspect.stack(context), interpreter.inspect.stack(context)
    return full, [lazy[i] for i in range(len(lazy))], lazy[1:3], lazy[-1], len(lazy)


def test_the_stack_the_interpreter_reads_is_inspects_read_one_frame_at_a_time():
    """`tracing._OuterFrames`: every entry, slice and negative index is ``inspect.stack()``'s, positions included;
    every other name of the interpreter's ``inspect`` is inspect's own."""
    assert tracing.install()
    assert interpreter.inspect is not inspect and interpreter.inspect.signature is inspect.signature
    for context in (1, 3):
        full, entries, two, last, length = _stacks(context)
        assert length == len(entries) == len(full) > 3
        # NOTE: entry 0 is _stacks itself, at two lines
        for i in range(1, len(full)):
            assert entries[i] == full[i] and entries[i].positions == full[i].positions, i
        assert two == full[1:3] and last == full[-1]
    with pytest.raises(IndexError):
        interpreter.inspect.stack()[10_000]


_WEIGHT = torch.randn(4, 4)
_SCALE = 0.5


def _reads_globals(x: torch.Tensor) -> torch.Tensor:
    """Globals of every kind the change reads: a tensor (an input of the trace), a float (guarded in the prologue), a
    module (``torch``), a function, and builtins (``len``, ``isinstance``, ``max``)."""
    y = torch.tanh(x @ _WEIGHT) * _SCALE
    if isinstance(y, torch.Tensor) and len(y.shape) == 2:
        y = y + max(1, len(y))
    return _traced.__name__.__len__() * y.sum(-1)


def _traces_of_calls(fn) -> tuple[list[str], list[torch.Tensor], set[str]]:
    """Each trace's prologue and computation (after the first call, and after ``_SCALE`` and ``_WEIGHT`` change), the
    results, and the names of the interpreted frames."""
    global _SCALE, _WEIGHT
    scale, weight = _SCALE, _WEIGHT
    frames: set[str] = set()
    run_frame = interpreter._run_frame

    def recording(frame, *args, **kwargs):
        frames.add(frame.code.co_qualname)
        return run_frame(frame, *args, **kwargs)

    texts, results = [], []
    interpreter._run_frame = recording
    try:
        x = torch.arange(12.0).reshape(3, 4) / 12
        jfn = thunder.jit(fn)
        for new_scale, new_weight in ((scale, weight), (2.0, weight), (2.0, weight * 3)):
            _SCALE, _WEIGHT = new_scale, new_weight
            results.append(jfn(x))
            texts += [_text(thunder.last_prologue_traces(jfn)[-1]), _text(thunder.last_traces(jfn)[-1])]
            assert_equal(results[-1], fn(x), reference="eager's, with the new globals")
    finally:
        interpreter._run_frame = run_frame
        _SCALE, _WEIGHT = scale, weight
    return texts, results, frames


def test_globals_are_read_without_interpreting_a_lookup_with_the_same_traces_and_guards(both_ways):
    """`tracing._globals_lookup`: the same prologues (a changed float global guarded, a changed tensor global read
    afresh) and computations both ways, without the frames thunder interprets for each global read."""
    (own, own_results, own_frames), (changed, results, frames) = both_ways(lambda: _traces_of_calls(_reads_globals))
    assert changed == own and "_SCALE" in "".join(changed)
    assert all(torch.equal(a, b) for a, b in zip(results, own_results))
    assert "globals_lookup.<locals>.<lambda>" in own_frames
    assert "globals_lookup.<locals>.<lambda>" not in frames and "_reads_globals" in frames


def test_a_name_not_found_and_a_module_as_builtins_go_thunders_way(both_ways):
    """A global that is not defined raises the same NameError both ways; a function whose globals hold the
    ``builtins`` module itself as ``__builtins__`` (a notebook's ``__main__``) reads ``len`` as thunder does."""
    import builtins

    namespace = {"__builtins__": builtins, "torch": torch}
    exec("def from_main(x):\n    return x * len(x.shape)\n\ndef undefined(x):\n    return x * not_defined\n", namespace)

    def calls():
        traced = thunder.jit(namespace["from_main"])
        value = traced(torch.ones(2, 3))
        with pytest.raises(NameError) as caught:
            thunder.jit(namespace["undefined"])(torch.ones(2))
        return _text(thunder.last_traces(traced)[-1]), value, str(caught.value)

    (own_text, own_value, own_error), (text, value, error) = both_ways(calls)
    assert text == own_text and torch.equal(value, own_value) and torch.equal(value, torch.full((2, 3), 2.0))
    assert error == own_error and "not_defined" in error
