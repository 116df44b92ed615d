"""The fuzzer's programs with collectives: a program's parameters become a module's, trained under
``thunder.distributed.ddp`` or ``fsdp`` in a gloo process group of one rank made in this process (`world_of_one`), so
that the backward all-reduces (``ddp``) or reduce-scatters (``fsdp``) each gradient and the forward all-gathers each
parameter (``fsdp``), each with its ``wait``.

A world of one runs every collective for real, through gloo on the CPU, but each is an identity (an all-reduce of one
rank, divided by one) or a copy (an all-gather, a reduce-scatter): what a collective recorded into a graph does to
other ranks (a rank recording alone launches its collectives alone, and the ranks hang or add up the wrong tensors)
cannot show. A handle a replay hands out could (a wait on it gives the recording's result), but thunder's traces of
these programs never wait on one (`rules.SHOWING` says where the handles go); every rule of the plain programs can.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["WRAPPERS", "world_of_one", "module_of", "data_parallel"]

#: thunder's data-parallel wrappers a program's module goes under (`thunder.distributed`).
WRAPPERS: tuple[str, ...] = ("ddp", "fsdp")


@contextlib.contextmanager
def world_of_one() -> Iterator[None]:
    """A gloo process group of one rank, made in this process on a ``HashStore`` (no file, no network, no other
    process) and destroyed on leaving, with every group made from it (``ddp`` and ``fsdp`` copy the default group).

    A group already made (by the caller) is used as it is, and left to its maker, where its world is one rank; a larger
    one is refused: the oracle judges in one process, and the other ranks would wait for its collectives.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError(f"the fuzzer's programs with collectives run in a world of one rank, and this process "
                               f"is rank {dist.get_rank()} of {dist.get_world_size()}")
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()  # NOTE: every group, the copies ddp and fsdp made among them


def module_of(program: Any, fn: Callable[..., Any], device: str = "cpu") -> Any:
    """A module whose parameters are ``program``'s parameter arguments (set 0, fresh:
    `programs.Program.make_parameters`) and whose ``forward`` takes the other arguments, in order, and calls ``fn``
    with all of them."""
    import torch

    class ProgramModule(torch.nn.Module):
        def __init__(self, parameters: Sequence[Any]):
            super().__init__()
            for spec, p in zip([s for s in program.inputs if s.parameter], parameters):
                self.register_parameter(spec.name, p)

        def forward(self, *inputs: Any) -> Any:
            fresh = iter(inputs)
            args = []
            for s in program.inputs:
                args.append(getattr(self, s.name) if s.parameter else next(fresh))
            return fn(*args)

    return ProgramModule(program.make_parameters(device, 0))


def data_parallel(program: Any, jitted: Any, device: str = "cpu") -> Any:
    """``thunder.distributed.ddp(jitted)`` or ``fsdp(jitted)``, as ``program.distributed`` names (in a process group:
    `world_of_one`)."""
    import torch
    from thunder.distributed import ddp, fsdp

    if program.distributed == "ddp":
        return ddp(jitted)
    if program.distributed == "fsdp":
        return fsdp(jitted, device=torch.device(device))
    raise ValueError(f"unknown data-parallel wrapper {program.distributed!r} (must be one of {list(WRAPPERS)})")
