"""How a step is recorded: one recorded iteration on CUDA (`record_cuda`, `CudaRecording`) and the CPU stand-in
(`EmulatedRecording`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import internals
from .blockers import StepRefused, where_from_traceback
from .report import Blocker

__all__ = ["record_cuda", "CudaRecording", "EmulatedRecording", "versions", "updated", "replay_on"]


class CudaRecording:
    """One recorded iteration: the graph, its static batch, and the loss and gradients it writes."""

    def __init__(self, graph: Any, static: list[Any], loss: torch.Tensor, grads: list[Any]):
        self.graph, self.static, self.loss, self.grads = graph, static, loss, grads
        self.replay = graph.replay


class EmulatedRecording:
    """The CPU stand-in: a replay runs the iteration eagerly on the static batch, then writes its loss and gradients
    into the memory the first replay made, as a graph's replay writes its own memory."""

    def __init__(self, run: Callable[[list[Any]], torch.Tensor], static: list[Any], params: list[torch.Tensor]):
        self._run, self.static, self._params = run, static, params
        self.loss: torch.Tensor | None = None
        self.grads: list[Any] = []

    def replay(self) -> None:
        for p in self._params:
            p.grad = None
        loss = self._run(self.static)
        if self.loss is None:
            self.loss, self.grads = loss, [p.grad for p in self._params]
            return
        with torch.no_grad():
            self.loss.copy_(loss)
            for p, g in zip(self._params, self.grads):
                if g is not None and p.grad is not None:
                    g.copy_(p.grad)
                p.grad = g


def record_cuda(iteration: Callable[..., torch.Tensor], static: list[Any], params: list[torch.Tensor],
                side_stream: Any, device: torch.device) -> CudaRecording:
    """Record ``iteration(static, capturing=True)`` as one ``torch.cuda.CUDAGraph`` on ``side_stream``; a failure is
    a `StepRefused` (the capture recovered, ``params``' gradients dropped first), a `StepRefused` raised inside
    passes as it is."""
    graph = torch.cuda.CUDAGraph()
    internals.clear_cublas_workspaces()
    stream = torch.cuda.current_stream(device)
    try:
        # NOTE: thread_local: the backward runs on autograd's device thread, which may create its cuBLAS
        # handle there during the capture (in a fresh process, on the H200: CUBLAS_STATUS_NOT_INITIALIZED at
        # cublasCreate, which global mode forbids to every thread); the capturing thread stays checked
        with torch.cuda.graph(graph, stream=side_stream, capture_error_mode="thread_local"):
            loss = iteration(static, capturing=True)
    except Exception as e:
        internals.recover_capture(stream)
        for p in params:
            p.grad = None
        if isinstance(e, StepRefused):
            raise
        raise StepRefused([Blocker("capture", type(e).__name__ + ": " + (str(e).splitlines() or [""])[0][:200],
                                   fix="see thunder_nb.step.capturability; run with capture=False to "
                                   "train uncaptured", **where_from_traceback(e))],
                          "failed while recording the graph") from e
    finally:
        internals.clear_cublas_workspaces()
    return CudaRecording(graph, static, loss, [p.grad for p in params])


def versions(batch: Sequence[Any]) -> list[int | None]:
    """The version counters of ``batch``'s tensors (None for anything else): an in-place update moves a tensor's."""
    return [internals.version_counter(b) if isinstance(b, torch.Tensor) else None for b in batch]


def updated(batch: Sequence[Any], before: Sequence[int | None]) -> frozenset[int]:
    """The positions of ``batch``'s tensors that an in-place update reached since `versions` gave ``before``."""
    return frozenset(i for i, (b, v) in enumerate(zip(batch, before))
                     if v is not None and internals.version_counter(b) != v)


def replay_on(rec: Any, batch: Sequence[Any], written: frozenset[int]) -> None:
    """Copy ``batch`` into ``rec``'s input buffers, replay it, and copy back the batch tensors that the step updates in
    place (``written``, `updated` in its uncaptured steps), so that the caller's see the update as in eager PyTorch
    (2026-12-05: a loss function's ``x.mul_(2.0)`` reached the caller's batch in the warm-up steps, and never after
    the recording)."""
    pairs = [(s, b) for s, b in zip(rec.static, batch) if isinstance(b, torch.Tensor) and b is not s]
    if pairs:
        internals.copy_into([s for s, _ in pairs], [b for _, b in pairs])
    rec.replay()
    for i in written:
        batch[i].copy_(rec.static[i])
