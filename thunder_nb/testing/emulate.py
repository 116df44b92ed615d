"""A CPU stand-in for CUDA-graph capture and replay, faithful to what a replay does to memory."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["EmulatedGraph", "emulated_capture"]


class EmulatedGraph:
    """A recorded region: its replay re-runs the region on the static inputs and writes the results in place.

    Like a real replay, it writes the very memory of the recorded outputs, without bumping any
    tensor's version counter: whoever holds one of those outputs, or a view of it made anywhere,
    sees the new values. Outputs that are views of a static input follow that input. Numbers a
    region returns keep their recorded values, as in a real graph.
    """

    def __init__(self, fn: Callable[..., Any], static_inputs: Sequence[Any]):
        self._fn, self._static_inputs = fn, tuple(static_inputs)
        self.static_outputs = fn(*static_inputs)

    def replay(self) -> None:
        import torch

        inputs = {a.untyped_storage().data_ptr() for a in self._static_inputs if isinstance(a, torch.Tensor)}
        written: set[int] = set()
        for static, new in zip(self.static_outputs, self._fn(*self._static_inputs)):
            if not isinstance(static, torch.Tensor):
                continue
            target = static.untyped_storage()
            ptr = target.data_ptr()
            if ptr in inputs or ptr in written or target.nbytes() == 0 or new.untyped_storage().data_ptr() == ptr:
                continue  # NOTE: the last: the region wrote it itself (an instance that copies its outputs out)
            written.add(ptr)
            source = new.untyped_storage()
            if source.nbytes() != target.nbytes() or new.storage_offset() != static.storage_offset():
                raise AssertionError(
                    "emulated replay: the region's output no longer has the recorded layout "
                    f"({source.nbytes()} bytes at offset {new.storage_offset()} against {target.nbytes()} "
                    f"at {static.storage_offset()})"
                )
            target.copy_(source)  # NOTE: a storage copy: no tensor's version counter moves, as in a replay


def _record(runner: Any, fn: Callable[..., Any], static_inputs: Sequence[Any], warmups: int,
            pool: Any = None) -> tuple[Any, Any]:
    for _ in range(warmups):
        fn(*static_inputs)
    graph = EmulatedGraph(fn, static_inputs)
    return graph, graph.static_outputs


def _build_stock(runner: Any, fn: Callable[..., Any], args: Sequence[Any], static_args_mask: Sequence[bool]):
    """thunder's ``CUDAGraphRunner.build_cuda_graph`` on CPU: static input copies, three warm-up calls, a recording."""
    static_inputs = tuple(a if static else runner.get_static_buffer(a) for a, static in zip(args, static_args_mask))
    graph, outputs = _record(runner, fn, static_inputs, 3)
    return graph, static_inputs, outputs


@contextlib.contextmanager
def emulated_capture() -> Iterator[None]:
    """Run every CUDA-graph runner's capture path on the CPU, with `EmulatedGraph` in place of a graph.

    What a captured run does to memory shows: inputs are copied into static buffers before each
    replay, outputs live in buffers that the next replay overwrites in place (views of them too),
    warm-up calls run for real. What only a GPU shows does not: a host sync inside a region just
    runs (no capture error), and no memory is freed under a graph. Runners must have ``capture``
    set to True to take this path (``thunder_nb.testing`` callers set ``runner.capture = True``).
    """
    from thunder.transforms.cudagraph import CUDAGraphRunner

    from ..cudagraph import runner as runner_module

    # NOTE: the dict itself, not the module's name for it: a capture left open until the interpreter exits is closed
    # after the module's globals were cleared ("'NoneType' object does not support item assignment" at exit)
    recorders = runner_module.RECORDERS
    saved = CUDAGraphRunner.build_cuda_graph, recorders["record"]
    CUDAGraphRunner.build_cuda_graph = _build_stock
    recorders["record"] = _record
    try:
        yield
    finally:
        CUDAGraphRunner.build_cuda_graph, recorders["record"] = saved
