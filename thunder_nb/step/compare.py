"""The whole step against eager PyTorch from the same state: `compare_step`, what ``%%thunder_cudagraph --whole-step``
runs (the user's model and optimizer are trained, then put back)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..cudagraph.capture import Capture, only, parse_capture, resolve
from ..diagnosis.judge import AUTOCAST, TRAINED, Judgement, Tolerance, judge
from .blockers import StepRefused, capturability, thunder_jit
from .graph import jit_step
from .report import StepComparison

__all__ = ["compare_step"]


def compare_step(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, *batch: Any,
                 replays: int = 2, warmup: int = 3, repeats: int = 20, rounds: int = 3,
                 capture: bool | str | Capture = "auto",
                 executors: Sequence[Any] = (), execute: bool = True,
                 progress: Callable[[str], None] | None = None) -> StepComparison:
    """Diagnose one training iteration, and when nothing stops it, run it as `jit_step` against eager PyTorch.

    First `capturability` (nothing runs). When it finds no blocker, eager PyTorch (``zero_grad``, ``loss_fn(*batch)``,
    ``backward``, ``optimizer.step()``) and `jit_step` each take ``warmup + 1 + replays`` steps on ``batch`` from the
    same state (parameters, buffers, optimizer state, torch's random state): ``warmup`` uncaptured steps, the
    recording, then replays. Their losses at every step and the parameters after the last are compared. On a GPU,
    ``rounds`` rounds of ``repeats`` consecutive steps of each are then timed (median round); the CPU stand-in
    (``capture="emulated"``, what ``"auto"`` picks without CUDA) is not timed.

    The model and the optimizer are the caller's own objects, trained here and put back: on return (or an
    exception) their parameters, buffers, optimizer state and hyperparameters, every ``.grad`` and torch's random
    state are what they were at the call.

    Args:
        model, loss_fn, optimizer: as `jit_step` takes them.
        batch: one batch, ``loss_fn(*batch) -> loss``; every step reuses it.
        capture: ``"auto"``, ``True`` (CUDA required) or ``"emulated"`` (or the `Capture` they stand for), as
            `jit_step` takes it.
        execute: False: the report only.
        progress: called with a short text before each stage.

    Raises:
        ValueError: ``capture`` asks for what this model cannot do (``True`` with the model on the CPU, ``False``).
        Exception: what eager PyTorch raises in ``loss_fn``, also when thunder fails to trace it because the
            user's code fails (the state is put back first).
    """
    say = progress or (lambda _: None)
    capture = only(parse_capture(capture), Capture.AUTO, Capture.CUDA, Capture.EMULATED,
                   who="compare_step (it runs the step captured)")
    params = _tensors_trained(model, optimizer)
    device = params[0].device if params else torch.device("cpu")
    mode = resolve(capture, device, what="the model", auto=Capture.EMULATED)
    device_text = str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    say(f"tracing {name} with thunder and reading what stops one graph…")
    report = capturability(model, loss_fn, optimizer, *batch, executors=executors, ddp=False)  # NOTE: one process
    if any(b.kind == "thunder" for b in report.blockers):
        _eager_forward(model, loss_fn, optimizer, batch)  # NOTE: a step that fails in eager too is the user's to fix
    if report.blockers or not execute:
        return StepComparison(report, device_text, None, 0)
    tolerance = _tolerance(params)
    n = warmup + 1 + replays
    saved = _Saved(model, optimizer, params)
    step = None
    try:
        say(f"running {n} steps of eager PyTorch…")
        eager_losses = [float(_eager_step(loss_fn, optimizer, batch)) for _ in range(n)]
        eager_params = [p.detach().clone() for p in params]
        saved.restore()
        say(f"running {n} steps of the whole step ({warmup} uncaptured, the recording, {replays} replays)…")
        step = jit_step(model, loss_fn, optimizer, capture=capture, warmup=warmup, executors=executors, ddp=False)
        notes = []
        try:
            whole_losses = [float(step(*batch)) for _ in range(n)]
        except StepRefused as e:
            return StepComparison(report, device_text, mode, n, graphs=step.graphs_recorded, error=str(e),
                                  notes=(_PUT_BACK,))
        whole_params = [p.detach().clone() for p in params]
        notes.extend(f"in the run: {note}" for note in step.notes)
        timings: list[tuple[str, float]] = []
        if mode is Capture.CUDA and repeats > 0:
            say(f"timing {rounds} rounds of {repeats} consecutive steps: the whole step…")
            timings.append(("eager", 0.0))
            timings.append(("whole step", _time_steps(lambda: step(*batch), repeats, rounds, device, say,
                                                      "the whole step")))
            saved.restore()
            say(f"timing {rounds} rounds of {repeats} consecutive steps: eager PyTorch…")
            for _ in range(2):
                _eager_step(loss_fn, optimizer, batch)
            timings[0] = ("eager", _time_steps(lambda: _eager_step(loss_fn, optimizer, batch), repeats, rounds, device,
                                               say, "eager PyTorch"))
        verdict = judge({"loss": whole_losses, "parameter": whole_params},
                        {"loss": eager_losses, "parameter": eager_params}, tolerance=tolerance)
        if not verdict.equal:
            # NOTE: the one judge's rule 4: as far from eager as thunder without graphs, with jit_step's executors
            say(f"running {n} steps of thunder without graphs (how far thunder's own numerics take it from eager)…")
            saved.restore()
            plain = _without_graphs(model, loss_fn, optimizer, batch, n, params, executors)
            if plain is not None:
                verdict = judge({"loss": whole_losses, "parameter": whole_params},
                                {"loss": eager_losses, "parameter": eager_params}, without_graphs=plain,
                                tolerance=tolerance)
            notes.append(_judged_note(verdict, plain is not None))
        return StepComparison(report, device_text, mode, n, (tuple(eager_losses), tuple(whole_losses)), len(params),
                              _largest(whole_losses, eager_losses), _largest(whole_params, eager_params),
                              (tolerance.rtol, tolerance.atol), verdict.equal, step.graphs_recorded,
                              tuple(timings), repeats if timings else 0, notes=(*notes, _PUT_BACK))
    finally:
        del step  # NOTE: the graph and its memory go before the state is put back
        saved.restore()


_PUT_BACK = ("your model and optimizer are as they were: this run trained them, then put back their parameters, "
             "buffers, optimizer state and hyperparameters, .grad and torch's random state")


class _Saved:
    """The state `compare_step` trains and puts back: parameters and buffers (in place), the optimizer's state dict,
    each ``.grad``, torch's random state."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]):
        import copy

        self._model, self._optimizer, self._params = model, optimizer, params
        self._tensors = [(t, t.detach().clone()) for t in (*params, *model.buffers())]
        self._grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
        self._opt = copy.deepcopy(optimizer.state_dict())
        self._cpu_rng = torch.get_rng_state()
        self._cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        import copy

        with torch.no_grad():
            for t, value in self._tensors:
                t.copy_(value)
        for p, g in zip(self._params, self._grads):
            p.grad = None if g is None else g.clone()
        # NOTE: a copy each time: load_state_dict keeps the tensors it is given, and the next steps update them in place
        self._optimizer.load_state_dict(copy.deepcopy(self._opt))
        torch.set_rng_state(self._cpu_rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state_all(self._cuda_rng)


def _tensors_trained(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The model's parameters that require grad, then any other tensor the optimizer updates (each once)."""
    seen: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        if p.requires_grad:
            seen.setdefault(id(p), p)
    for group in optimizer.param_groups:
        for p in group["params"]:
            seen.setdefault(id(p), p)
    return list(seen.values())


def _tolerance(params: Sequence[torch.Tensor]) -> Tolerance:
    """The one judge's base tolerance for the losses and parameters of a few training steps: `TRAINED` (float32
    parameters after optimizer steps), `AUTOCAST` for 16-bit parameters."""
    if any(p.dtype in (torch.float16, torch.bfloat16) for p in params):
        return AUTOCAST
    return TRAINED


def _largest(got: Sequence[Any], ref: Sequence[Any]) -> float:
    """The largest absolute difference over losses (numbers) or tensors, NaNs aside (the judge calls those wrong)."""
    worst = 0.0
    for a, b in zip(got, ref):
        diff = (torch.as_tensor(a).detach().double().cpu() - torch.as_tensor(b).detach().double().cpu()).abs()
        if diff.numel():
            worst = max(worst, float(diff.nan_to_num(nan=0.0).max()))
    return worst


def _without_graphs(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer,
                    batch: Sequence[Any], n: int, params: Sequence[torch.Tensor],
                    executors: Sequence[Any]) -> dict[str, Any] | None:
    """``n`` steps of the user's loop with ``loss_fn`` jitted by thunder, without graphs, with the executors jit_step
    takes (`jit_executors`), from the state put back: their losses and the parameters after the last; None where
    thunder fails (the base tolerance alone decides then)."""
    try:
        jloss = thunder_jit(loss_fn, executors)
        losses = [float(_eager_step(jloss, optimizer, batch)) for _ in range(n)]
    except Exception:  # NOTE: no yardstick; the whole step's own run was judged at the base tolerance
        return None
    return {"loss": losses, "parameter": [p.detach().clone() for p in params]}


def _judged_note(verdict: Judgement, measured: bool) -> str:
    """What the judge leaned on, or why it could not: a note of the comparison."""
    if not measured:
        return "thunder without graphs failed on this step: the whole step is judged at the base tolerance alone"
    if verdict.without_graphs_wrong is not None:
        return f"thunder without graphs is itself wrong on this step: {verdict.without_graphs_wrong}"
    if verdict.widened:
        return (f"thunder without graphs differs from eager too (by {verdict.without_graphs_error:.3g}): the whole "
                "step is judged within that difference")
    return f"thunder without graphs differs from eager by {verdict.without_graphs_error or 0.0:.3g}"


def _eager_forward(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer,
                   batch: Sequence[Any]) -> None:
    """Call ``loss_fn(*batch)`` once in eager PyTorch, state put back after; what it raises, raised."""
    saved = _Saved(model, optimizer, _tensors_trained(model, optimizer))
    try:
        with torch.no_grad():
            loss_fn(*batch)
    finally:
        saved.restore()


def _eager_step(loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, batch: Sequence[Any]) -> torch.Tensor:
    """One step of eager PyTorch, as the user writes it; the loss, detached (no host sync)."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(*batch)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _time_steps(run: Callable[[], Any], repeats: int, rounds: int, device: torch.device,
                say: Callable[[str], None] | None = None, what: str = "") -> float:
    """Milliseconds per step: the median of ``rounds`` rounds of ``repeats`` consecutive calls (no sync inside);
    ``say`` is told each round as it starts."""
    import statistics
    import time

    per_round = []
    for r in range(rounds):
        if say is not None:
            say(f"timing {what}: round {r + 1} of {rounds}, {repeats} consecutive steps each…")
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        torch.cuda.synchronize(device)
        per_round.append((time.perf_counter() - start) / repeats * 1e3)
    return statistics.median(per_round)
