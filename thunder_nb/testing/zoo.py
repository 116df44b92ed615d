"""The model zoo: models from packages at random init and small sizes, and the loops people run around them.

Shared by ``tests/`` and ``bench/``. Each `ZooModel` builds the same initial state for every configuration
(eager PyTorch, thunder, thunder's CUDA-graph transform, thunder-nb, torch.compile), and each protocol runs a
loop as a user writes it and returns what to compare with eager's run from that state, through the one judge of
"equal" (`judge`, `thunder_nb.diagnosis.judge`). A probe that may
kill the process (thunder's transform on dropout attention) runs in a child process: ``python -m
thunder_nb.testing.zoo MODEL PROTOCOL CONFIG`` prints one JSON line, and `run_in_child` reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from .. import internals
from ..diagnosis.judge import AUTOCAST, EXACT, MODEL, TRAINED, Tolerance
from ..diagnosis.protocols import GraphTransform, RecordingRunner
from .modes import CaptureMode, capturing, check_mode, emulate_runner, jit_capture
from .zoo_models import MODELS, ZooModel, missing_package
from .zoo_protocols import (FIRST_STEP, PROTOCOLS, TRAINING_OPTIMIZERS, keep_rate, training_optimizer,
                            whole_step_training)

__all__ = ["ZooModel", "MODELS", "PROTOCOLS", "TRAINING_OPTIMIZERS", "training_optimizer", "CONFIGS", "ZooRun",
           "compile_with", "run_protocol", "run_in_child", "missing_package", "keep_rate", "TOLERANCES", "ZooJudgement",
           "judge", "DROPOUT_CHECKS", "dropout_problem", "count_graphs", "plain_config", "judged_numerics",
           "GRAPH_CONFIGS", "STEP_CONFIGS", "applies", "AMPLIFIED", "FIRST_STEP"]


#: The configurations a protocol can run, in the order tables show them; "... no-sdpa": thunder's defaults without
#: its sdpa executor, the choice `thunder_nb.diagnosis.failures.LIMITS` offers where that executor refuses a model;
#: "... fused": with thunder-nb's torchcompile executor (inductor's fusions); "fixed ...": thunder.jit with the fixed
#: transform (and, with an executor choice, the executors `thunder_nb.jit` takes); "jit_step ...": the whole training
#: step as one graph (`thunder_nb.step.jit_step`, the training protocols only); "thunder fused": thunder with
#: inductor's fusions (its torchcompile executor) and no graphs, the numerics "fused" has; "thunder nb-executors":
#: thunder with the executors `thunder_nb.jit` chooses (`jit_executors`: PyTorch's own convolution backward,
#: training BatchNorm, layer_norm and gelu, the checked sdpa) and no graphs, the numerics "thunder_nb.jit" and
#: ``jit_step`` have. These three "thunder ..." configurations take their executors as thunder_nb.jit does
#: (`jit_executors`); "thunder" is thunder.jit as a user calls it.
CONFIGS = ("eager", "thunder", "stock", "fixed", "thunder_nb.jit", "fused", "reduce-overhead", "thunder no-sdpa",
           "thunder_nb.jit no-sdpa", "thunder fused", "thunder nb-executors", "fixed fused", "fixed no-sdpa",
           "jit_step", "jit_step fused")

#: The documented configurations with CUDA graphs, each judged against eager through the one judge with thunder
#: without graphs (`plain_config`) as its yardstick: `thunder_nb.jit` with its default, torchcompile and no-sdpa
#: executors, the fixed transform with the same three, and `jit_step` default and fused (issue 50).
GRAPH_CONFIGS = ("fixed", "fixed fused", "fixed no-sdpa", "thunder_nb.jit", "fused", "thunder_nb.jit no-sdpa",
                 "jit_step", "jit_step fused")
#: The configurations that run a whole training step (`jit_step`), not a compiled loss: training protocols only.
STEP_CONFIGS = ("jit_step", "jit_step fused")

#: The configuration without graphs whose numerics a configuration has: its executors, none of its capture.
_PLAIN = {"thunder_nb.jit": "thunder nb-executors", "fused": "thunder fused",
          "thunder_nb.jit no-sdpa": "thunder no-sdpa", "fixed fused": "thunder fused",
          "fixed no-sdpa": "thunder no-sdpa", "jit_step": "thunder nb-executors", "jit_step fused": "thunder fused"}
#: The executor names (`thunder_nb.cudagraph.executors.executor_list`) of each configuration that chooses some.
_EXECUTORS = {"fused": ["torchcompile"], "thunder fused": ["torchcompile"], "thunder_nb.jit no-sdpa": ["no-sdpa"],
              "thunder no-sdpa": ["no-sdpa"], "fixed fused": ["torchcompile"], "fixed no-sdpa": ["no-sdpa"],
              "jit_step fused": ["torchcompile"]}
#: The configurations that run no CUDA graph (judged runs of theirs run outside `capturing`).
_WITHOUT_GRAPHS = ("eager", "thunder", "reduce-overhead", "thunder no-sdpa", "thunder fused", "thunder nb-executors")


def applies(config: str, protocol: str) -> bool:
    """Whether ``config`` can run ``protocol``: a whole-step configuration only a training protocol."""
    return config not in STEP_CONFIGS or protocol in TRAINING_OPTIMIZERS


def plain_config(config: str) -> str:
    """The configuration that runs ``config``'s thunder trace (the same executors) without CUDA graphs: the yardstick
    `judge` measures ``config``'s difference from eager with. Inductor's fusions round otherwise than eager
    PyTorch's kernels, so "fused" answers to thunder with the torchcompile executor, not to plain thunder; and
    `thunder_nb.jit`'s convolution backward and BatchNorm are PyTorch's, not thunder's, so it answers to thunder with
    its executors (``jit_step`` too: "thunder nb-executors")."""
    return _PLAIN.get(config, "thunder")


def compile_with(config: str, fn: Callable[..., Any], capture: CaptureMode = True) -> tuple[Callable[..., Any], Any]:
    """``fn`` compiled the way ``config`` names it; returns (the callable, its CUDA-graph transform or None).

    ``capture``: real capture (True), regions run eagerly (False), or the emulated capture of
    `thunder_nb.testing.emulated_capture` (``"emulated"``: call inside ``capturing("emulated")``). The whole-step
    configurations (`STEP_CONFIGS`) compile a model, loss and optimizer together: `run_protocol` runs them.

    The configurations on ``thunder.jit``'s own call path (thunder, its transform, the fixed transform) run with
    Python's cyclic garbage collector off, as `thunder_nb.jit` traces (`thunder_nb.cudagraph.call.without_cyclic_gc`):
    a collection inside thunder's tracing can fail any of them at random ("dictionary changed size during
    iteration", `thunder_nb.diagnosis.failures.LIMITS["interpreter-gc"]`), and a comparison of two of them would
    then judge a race instead of a transform.
    """
    import torch

    from ..cudagraph.call import without_cyclic_gc
    from ..fix import FixedCUDAGraphTransform, jit
    from .modes import make_transform, stock_transform

    def thunder_jit(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        import thunder

        return without_cyclic_gc(thunder.jit(fn, **options))

    check_mode(capture)
    if config == "eager":
        return fn, None
    if config == "thunder":
        return thunder_jit(fn), None
    if config in _PLAIN.values():
        from ..cudagraph.executors import jit_executors

        # NOTE: the executors thunder_nb.jit puts together, so that each has the numerics of its graphs counterpart
        return thunder_jit(fn, executors=jit_executors(_EXECUTORS.get(config, []))), None
    if config == "stock":
        transform = stock_transform(capture)
        return thunder_jit(fn, transforms=[transform]), transform
    if config in ("fixed", "fixed fused", "fixed no-sdpa"):
        transform = make_transform(FixedCUDAGraphTransform, capture)
        if config == "fixed":
            return thunder_jit(fn, transforms=[transform]), transform
        from ..cudagraph.executors import jit_executors

        return thunder_jit(fn, transforms=[transform], executors=jit_executors(_EXECUTORS[config])), transform
    if config in STEP_CONFIGS:
        raise ValueError(f"{config!r} compiles a whole training step, not a function: `run_protocol` runs it")
    if config in ("thunder_nb.jit", "fused", "thunder_nb.jit no-sdpa"):
        jfn = jit(fn, capture=jit_capture(capture), executors=_EXECUTORS.get(config, []))
        return jfn, emulate_runner(internals.jit_transforms(jfn)[0], capture)
    if config == "reduce-overhead":
        return torch.compile(fn, mode="reduce-overhead"), None
    raise ValueError(f"unknown configuration: {config!r} (must be one of {list(CONFIGS)})")


@dataclass
class ZooRun:
    """What one protocol did under one configuration: the values to compare with eager's, and its figures."""

    model: str
    protocol: str
    config: str
    # nested tensors and numbers (compared with eager's by `thunder_nb.notebook.values.compare_values`)
    values: Any = None
    error: str | None = None  # the exception that stopped it, ``Type: first line``
    traceback: str | None = None  # its whole traceback, the chained ones included, for a test's failure message
    limit: str | None = None  # where it is one of thunder's known limits: the component, and what to try
    graphs: int | None = None  # CUDA graphs the transform recorded
    regions: int | None = None  # regions in its traces (`count_graphs`)


def count_graphs(transform: GraphTransform | None) -> tuple[int | None, int | None]:
    """(graphs recorded, regions) of a CUDA-graph transform: regions of every trace it fused (forward, backward, and
    each input shape's, such as a prefill's and a decode step's)."""
    if transform is None:
        return None, None
    runner = transform.cuda_graph_runner
    # NOTE: thunder's own runner counts no graphs: one per entry of its cache
    graphs = runner.graphs_captured if isinstance(runner, RecordingRunner) else len(runner.cuda_graph_cache)
    return graphs, len(runner.python_callables)


@contextlib.contextmanager
def judged_numerics() -> Iterator[None]:
    """cuDNN as the zoo's judged runs use it: deterministic algorithms, no autotuning, full float32 convolutions.

    resnet18's BatchNorm training at the zoo's size amplifies a last-bit difference to 5e-3 of a loss in three steps
    (bench/results/2026-12-03-evening-h200.md). With cuDNN's defaults, its backward-filter algorithms may add in any
    order and its convolutions round through TF32, so eager did not reproduce its own first loss on the H200. Every
    judged run, the eager reference included, runs inside this; the timed loops keep torch's defaults.
    """
    import torch

    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False):
        yield


def _whole_step(net: Any, loss: Callable[..., Any], protocol: str, capture: CaptureMode, executors: list[str]) -> Any:
    """`jit_step` of ``net``'s loss and ``protocol``'s optimizer, recording at its second call (one uncaptured step
    first, so that a protocol's three steps are one uncaptured, the recording, one replay)."""
    from ..step import jit_step

    opt = training_optimizer(TRAINING_OPTIMIZERS[protocol], net.parameters())
    return jit_step(net, loss, opt, capture=capture, warmup=1, executors=executors)


def run_protocol(model_name: str, protocol: str, config: str, *, device: Any = "cuda", capture: CaptureMode = True,
                 steps: int = 3) -> ZooRun:
    """Run ``protocol`` on a fresh ``model_name`` compiled by ``config``; errors are kept in the result, not raised.
    It runs under `judged_numerics`. A whole-step configuration (`STEP_CONFIGS`) runs a training protocol's loop as
    `jit_step`: one uncaptured step, the recording, then replays."""
    model = MODELS[model_name]
    run = ZooRun(model_name, protocol, config)
    net = model.build(device)
    fn = model.infer(net) if protocol in ("inference", "decode") else model.loss(net)
    net.train(protocol not in ("inference", "decode"))
    if protocol == "decode":
        import torch

        net.set_kv_cache(batch_size=1, device=torch.device(device))
    stream = internals.current_stream()
    with capturing(capture if config not in _WITHOUT_GRAPHS else False), judged_numerics():
        try:
            if config in STEP_CONFIGS:
                step = _whole_step(net, fn, protocol, capture, _EXECUTORS.get(config, []))
                run.values = whole_step_training(model, step, device, steps, protocol)
                run.graphs, run.regions = step.graphs_recorded, 1
                return run
            compiled, transform = compile_with(config, fn, capture)
            run.values = PROTOCOLS[protocol](model, net, compiled, device, steps)
            if transform is not None:
                run.graphs, run.regions = count_graphs(transform)
            if protocol == "dropout":
                import torch.nn.functional as F

                p = model.dropout
                masked, _ = compile_with(config, lambda x: F.dropout(x.sin(), p, training=True) * 1.0, capture)
                run.values["keep rate"], run.values["masks change"] = keep_rate(masked, device)
        except Exception as e:  # NOTE: a configuration failing is a finding of the zoo, reported with the case
            from ..diagnosis.failures import error_line, known_limit

            internals.recover_capture(stream)  # NOTE: thunder's transform failing at capture leaves its stream current
            run.error = error_line(e)
            run.traceback = "".join(traceback.format_exception(e))
            limit = known_limit(e)
            run.limit = f"{limit[0]}: {limit[1]}" if limit else None
    return run


#: The one judge's base tolerance against eager per protocol (`thunder_nb.diagnosis.judge`): bfloat16 under autocast;
#: parameters after optimizer steps (AdamW's normalised update turns a gradient's last-bit difference into up to 1e-4
#: of a weight); a model's float32 outputs otherwise (`FLOAT32`).
TOLERANCES: dict[str, Tolerance] = {"autocast": AUTOCAST, "train": TRAINED, "logged": TRAINED, "zero-grad": TRAINED,
                                    "batchnorm": TRAINED}
FLOAT32 = MODEL


@dataclass(frozen=True)
class ZooJudgement:
    """How a run's values compare with eager's, as the one judge says (`thunder_nb.diagnosis.judge.judge`).

    ``against``: "eager", "eager, within thunder without graphs' own difference" (thunder's own numerics take it that
    far from eager, and the run no further), or `DROPOUT_CHECKS`. ``thunder_differs``: thunder without graphs' own
    first difference from eager, or why it could not be asked (it fails). ``thunder_wrong``: why thunder without
    graphs is itself wrong here (not finite where eager is, or beyond the judge's sane bound): then it excuses
    nothing, and the run answers to eager alone.
    """

    matches: bool
    against: str
    difference: str | None
    max_abs_error: float | None
    thunder_differs: str | None = None
    thunder_wrong: str | None = None


#: What a dropout run is judged against: its masks are random numbers, which no two configurations draw alike.
DROPOUT_CHECKS = "the dropout checks"


def dropout_problem(run: ZooRun) -> str | None:
    """What a dropout run gets wrong, or None: every loss and gradient finite, the losses different from call to call,
    the masks different from call to call, and the kept fraction within 0.01 of ``1 - p`` (the model's dropout)."""
    v, keep = run.values, 1 - MODELS[run.model].dropout
    if not v.get("finite"):
        return "a loss or gradient is not finite"
    if not v.get("distinct"):
        return f"the same loss twice: {v.get('losses')}"
    if not v.get("masks change"):
        return "the same dropout mask on two calls"
    if abs(v.get("keep rate", -1.0) - keep) >= 0.01:
        return f"keep rate {v.get('keep rate')}, expected {keep:.2f}"
    return None


def judge(run: ZooRun, reference: ZooRun, plain: Callable[[], ZooRun]) -> ZooJudgement:
    """The one judge (`thunder_nb.diagnosis.judge.judge`) of ``run``'s values against eager's (``reference``), at
    ``run.protocol``'s `TOLERANCES`; where they differ beyond it, with thunder without graphs (``plain()``, run only
    then: `plain_config`'s configuration) as the yardstick: ``run`` may differ from eager as far as it does, and no
    further, while it is sane itself. A thunder that is itself wrong (NaN where eager is finite, or far off) excuses
    nothing: the run is then wrong, and ``thunder_wrong`` says why.

    A dropout run is judged by `dropout_problem` alone: its losses follow its random masks, so they equal eager's
    only where the configuration draws its random numbers as eager does (eager itself), never by design.
    """
    from ..diagnosis.judge import judge as judge_values

    if run.protocol == "dropout":
        problem = dropout_problem(run)
        return ZooJudgement(problem is None, DROPOUT_CHECKS, problem, None)
    tolerance = TOLERANCES.get(run.protocol, FLOAT32)
    first = judge_values(run.values, reference.values, tolerance=tolerance)
    if first.equal:
        return ZooJudgement(True, first.against, None, first.max_abs_error)
    base = plain()
    if base.error is not None:
        return ZooJudgement(False, first.against, first.difference, first.max_abs_error,
                         f"thunder without graphs fails: {base.error}")
    j = judge_values(run.values, reference.values, without_graphs=base.values, tolerance=tolerance)
    if not j.equal and _amplified_rounding(run, reference, base, tolerance):
        return ZooJudgement(True, AMPLIFIED, None, j.max_abs_error, j.without_graphs_differs)
    return ZooJudgement(j.equal, j.against, j.difference, j.max_abs_error, j.without_graphs_differs,
                     j.without_graphs_wrong)


#: What a training run that `_amplified_rounding` clears was found equal to.
AMPLIFIED = ("thunder without graphs, bit for bit; its first step equals eager's, and training amplified that step's "
             "last-bit difference")


def _amplified_rounding(run: ZooRun, reference: ZooRun, base: ZooRun, tolerance: Tolerance) -> bool:
    """Whether a training run's difference from eager is thunder's rounding, amplified by the steps after the first.

    A few SGD steps of resnet18, whose last BatchNorms see four values a channel at the zoo's size, turn a last-bit
    difference into a loss 1% off and weights 10% off: a ReLU or a max tips the other way, and a BatchNorm's gradient
    over four samples moves by a quarter. thunder without graphs, with its default executors, lands 0.04 from eager's
    ``conv1.weight`` on the CPU after three steps (its first step's gradients within 1e-4), beyond the one judge's sane
    bound, so that it stands as no yardstick. Such a run is cleared where nothing else can explain it: it equals
    thunder without graphs bit for bit (the graphs ran the same kernels and added nothing), thunder without graphs is
    finite wherever eager is, and its first step (`FIRST_STEP`: the loss, and the weights after one update from the
    same start) equals eager's at the protocol's tolerance. An executor that computes something else is caught there:
    the torchcompile executor's resnet18 was 0.1 off in its first loss, its gradients not finite.
    """
    from ..diagnosis.judge import judge as judge_values

    if not isinstance(reference.values, dict) or FIRST_STEP not in reference.values:
        return False
    if not judge_values(run.values, base.values, tolerance=EXACT).equal:
        return False
    first = judge_values(base.values[FIRST_STEP], reference.values[FIRST_STEP], tolerance=tolerance)
    finite = judge_values(base.values, reference.values, tolerance=Tolerance(float("inf"), float("inf")))
    return first.equal and finite.equal


def _plain(x: Any) -> Any:
    """Values as JSON can hold them: tensors as nested lists (with dtype), numbers as they are."""
    import torch

    if isinstance(x, torch.Tensor):
        return {"tensor": x.detach().float().cpu().tolist(), "dtype": str(x.dtype)}
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def run_in_child(model_name: str, protocol: str, config: str, *, steps: int = 3, timeout: float = 600,
                 env: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | None, str]:
    """Run one zoo probe on the GPU in a child process (``faulthandler`` on): (return code, its JSON result, stderr).

    A negative return code is the signal that killed it (-11: SIGSEGV), and the result is then None.
    """
    cmd = [sys.executable, "-X", "faulthandler", "-m", "thunder_nb.testing.zoo", model_name, protocol, config,
           "--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv: list[str] | None = None) -> int:
    """``python -m thunder_nb.testing.zoo MODEL PROTOCOL CONFIG [--steps N]``: one real-capture probe, one JSON line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m thunder_nb.testing.zoo", description=main.__doc__)
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("protocol", choices=list(PROTOCOLS))
    parser.add_argument("config", choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    with _quiet():
        run = run_protocol(args.model, args.protocol, args.config, steps=args.steps)
    out = asdict(run)
    out["values"] = _plain(run.values)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
