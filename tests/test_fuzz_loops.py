"""The training-loop fuzzer (`thunder_nb.testing.fuzz.loops`): loops as users write them, eager against thunder-nb.

Each loop runs in eager PyTorch and under ``thunder_nb.jit`` (of its loss function, and of its model) and ``jit_step``,
regions run eagerly and through emulated capture; every run must equal eager's at every step (loss, parameters, buffers,
optimizer state), within the base tolerance or as far as thunder without graphs differs (the reference, run where a step
needs it), or refuse with a clear error. A failure prints the loop and the first diverging step of each wrong run.

- the fast tier: the loops of issue 50 (a head added mid-run with a ``hasattr`` branch, a frozen layer), each in the
  runs that went wrong;
- the fixed slice (slow): five loops from fixed seeds that together have every feature of `loops.FEATURES`, so
  that every feature runs in every CI;
- the date run (slow): hypothesis draws new loops every day from a seed of today's date
  (``THUNDER_NB_FUZZ_SEED=<seed>`` replays one; ``THUNDER_NB_LOOP_EXAMPLES`` sets how many, default 3).
"""

from __future__ import annotations

import datetime
import os

import pytest
from hypothesis import HealthCheck, Phase, given, note, seed, settings

from thunder_nb.testing.fuzz import loops
from thunder_nb.testing.fuzz.choices import RandomChooser

EXAMPLES = int(os.environ.get("THUNDER_NB_LOOP_EXAMPLES", "3"))
DATE_SEED = int(os.environ.get("THUNDER_NB_FUZZ_SEED") or datetime.date.today().strftime("%Y%m%d"))
#: The runs of every loop: each configuration without inductor, regions run eagerly and through emulated capture, and
#: the compiled model (which the loop holds) through emulated capture.
RUNS = [(c, m) for c in ("thunder_nb.jit", "jit_step") for m in (False, "emulated")] + [("thunder_nb.jit(model)",
                                                                                        "emulated")]


def _check(verdict: loops.LoopVerdict) -> None:
    errors = {k: r.error for k, r in verdict.runs.items() if r.error}
    if verdict.eager.error or verdict.eager.refused:
        pytest.skip(f"eager PyTorch itself fails this loop: {verdict.eager.error or verdict.eager.refused}")
    assert not verdict.wrong and not verdict.false_alarms and not errors, verdict.report() + "".join(
        f"\n  {c} (capture={m!r}) raised {e}" for (c, m), e in errors.items())


def test_a_head_added_mid_run_with_a_hasattr_branch_is_trained_as_eager_trains_it():
    loop = loops.Loop(model="mlp", optimizer="AdamW", steps=5, events=((2, "add-head"),), seed=11)
    _check(loops.judge(loop, [("thunder_nb.jit", "emulated"), ("jit_step", "emulated")]))


def test_a_layer_frozen_then_unfrozen_is_left_alone_while_frozen_in_every_mode():
    loop = loops.Loop(model="embed", optimizer="AdamW", steps=6, events=((2, "freeze"), (4, "unfreeze")), seed=12)
    _check(loops.judge(loop, [("jit_step", False), ("jit_step", "emulated")]))


#: The fixed slice: five loops that together have every feature of `loops.FEATURES` (one scheduler each).
SLICE = (
    ("lambda", "eval", "clip", "conv-bn", "logged", "unfreeze", "inplace-batch", "param-groups"),
    ("step", "accumulate", "embed", "load", "freeze", "inplace-batch", "hook"),
    ("onecycle", "bf16", "ragged", "eval", "param-groups", "eval-fp32", "tied", "buffer"),
    ("cosine", "fp16-scaler", "freeze", "eval", "conv-bn", "ema"),
    ("manual", "add-head", "load", "clip", "logged", "ema", "checkpoint"),
)


def _slice_loop(i: int) -> loops.Loop:
    return loops.generate(RandomChooser(1000 + i), seed=i, require=SLICE[i])


def test_the_fixed_slice_has_every_feature():
    seen: set[str] = set()
    for i, features in enumerate(SLICE):
        loop = _slice_loop(i)
        assert set(features) <= loop.features(), (features, loop)
        seen |= loop.features()
    assert seen == set(loops.FEATURES)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(SLICE)), ids=lambda i: "+".join(SLICE[i]))
def test_fixed_slice(i):
    _check(loops.judge(_slice_loop(i), RUNS))


@pytest.mark.slow
def test_batchnorm_trained_under_inductors_fusions_equals_eager():
    """Issue 50's first point: thunder-nb's torchcompile executor trained resnet18's first convolution and BatchNorm
    into NaN; the loop with BatchNorm under inductor's fusions, SGD with momentum and weight decay."""
    loop = loops.Loop(model="conv-bn", optimizer="SGD", steps=3, seed=3)
    _check(loops.judge(loop, [("fused", False), ("jit_step fused", "emulated")]))


@pytest.mark.slow
def test_date_run():
    @seed(DATE_SEED)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate))
    @given(loop=loops.loops())
    def judge(loop):
        note(f"replay: THUNDER_NB_FUZZ_SEED={DATE_SEED}")
        _check(loops.judge(loop, RUNS))

    judge()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(SLICE)), ids=lambda i: "+".join(SLICE[i]))
def test_fixed_slice_under_real_capture(i):
    """The fixed slice on the GPU: every configuration (inductor's fusions too) under real capture."""
    from thunder_nb.testing.zoo import judged_numerics

    with judged_numerics():
        _check(loops.judge(_slice_loop(i), [(c, True) for c in loops.CONFIGS], device="cuda"))
