"""Random straight-line PyTorch programs that thunder 0.2.6 traces, built from small reproducible choices."""

from __future__ import annotations

import hashlib
import linecache
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .choices import Chooser, HypothesisChooser, RandomChooser
from .collectives import WRAPPERS, data_parallel, module_of
from .statements import WEIGHTED_KINDS, Builder, TensorVar

__all__ = ["Chooser", "RandomChooser", "InputSpec", "Program", "generate", "programs"]


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One argument of a generated program.

    ``parameter``: the argument is an ``nn.Parameter`` that belongs to a parameter set (a layer's
    weights), not a fresh tensor per call.
    """

    name: str
    shape: tuple[int, ...]
    requires_grad: bool = False
    parameter: bool = False


@dataclass(frozen=True)
class Program:
    """A generated program: its source text and how to make its arguments.

    ``repr`` is the source itself, so hypothesis prints a falsifying program as readable code.
    """

    source: str
    inputs: tuple[InputSpec, ...]
    fusion_type: str = "consecutive"  # thunder's compile option for the fixed and the stock transform
    name: str = "prog"
    # NOTE: "ddp" or "fsdp": the parameters are a module's, trained under thunder.distributed's wrapper of that name in
    # a process group of one rank (`collectives`); None: a function called with every argument
    distributed: str | None = None

    def __repr__(self) -> str:
        grads = [i.name for i in self.inputs if i.requires_grad]
        params = [i.name for i in self.inputs if i.parameter]
        shapes = ", ".join(f"{i.name}: {list(i.shape)}" for i in self.inputs)
        head = f"# inputs {shapes}" + (f"; requires_grad: {', '.join(grads)}" if grads else "")
        head += f"; parameters: {', '.join(params)}" if params else ""
        head += f"; fusion_type={self.fusion_type!r}"
        head += f"; a module under thunder.distributed.{self.distributed} (one rank)" if self.distributed else ""
        return f"\n{head}\n{self.source}"

    @property
    def backward(self) -> bool:
        """Whether some input requires grad (then the outputs are summed and backpropagated)."""
        return any(i.requires_grad for i in self.inputs)

    @property
    def has_parameters(self) -> bool:
        """Whether some input is an ``nn.Parameter`` (then the oracle calls it with several parameter sets)."""
        return any(i.parameter for i in self.inputs)

    @property
    def updates_in_place(self) -> bool:
        """Whether a statement updates a tensor in place (``t.add_(...)``, ``x0.relu_()``)."""
        return re.search(r"\.[a-z]+_\(", self.source) is not None

    @property
    def filename(self) -> str:
        """A stable pseudo file name for the source (thunder quotes it in trace comments)."""
        digest = hashlib.sha1(self.source.encode()).hexdigest()[:10]
        return f"fuzz_{digest}.py"

    def function(self) -> Callable[..., Any]:
        """Compile the source into a function (its lines are registered so tracebacks show them)."""
        import torch

        filename = self.filename
        lines = self.source.splitlines(keepends=True)
        linecache.cache[filename] = (len(self.source), None, lines, filename)
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.source, filename, "exec"), namespace)
        return namespace[self.name]

    def make_inputs(self, device: str = "cpu", seed: int = 0) -> list[Any]:
        """Fresh random tensors for the arguments that are not parameters (the same for the same ``seed``)."""
        import torch

        g = torch.Generator().manual_seed(seed)
        return [torch.randn(s.shape, generator=g).to(device).requires_grad_(s.requires_grad)
                for s in self.inputs if not s.parameter]

    def make_parameters(self, device: str = "cpu", layer: int = 0) -> list[Any]:
        """Parameter set number ``layer``: one ``nn.Parameter`` per parameter argument (the same for the same
        ``layer``)."""
        import torch

        g = torch.Generator().manual_seed(1_000_003 + layer)
        return [torch.nn.Parameter(torch.randn(s.shape, generator=g).to(device), requires_grad=s.requires_grad)
                for s in self.inputs if s.parameter]

    def arguments(self, inputs: Sequence[Any], parameters: Sequence[Any]) -> list[Any]:
        """The call's arguments in order, from `make_inputs` and `make_parameters` results."""
        fresh, params = iter(inputs), iter(parameters)
        return [next(params) if s.parameter else next(fresh) for s in self.inputs]

    def passed(self, arguments: Sequence[Any]) -> list[Any]:
        """What a call passes of its `arguments`: all of them, or a module program's (``distributed``) others than its
        parameters, which are its module's own."""
        return [a for a, s in zip(arguments, self.inputs) if not (self.distributed and s.parameter)]

    def own_parameters(self, callee: Any) -> list[Any] | None:
        """A module program's parameters, as ``callee`` (its module, compiled or not) holds them, in argument order;
        None for a function."""
        if not self.distributed:
            return None
        return [callee.get_parameter(s.name) for s in self.inputs if s.parameter]

    def eager(self, fn: Callable[..., Any], device: str = "cpu") -> Callable[..., Any]:
        """What eager PyTorch calls: ``fn``, or a module program's module (`collectives.module_of`)."""
        return module_of(self, fn, device) if self.distributed else fn

    def jit(self, fn: Callable[..., Any], device: str = "cpu", **options: Any) -> Any:
        """``thunder.jit(fn, **options)``; a module program's module (`collectives.module_of`) compiled so and wrapped
        in thunder's ``ddp`` or ``fsdp`` (`collectives.data_parallel`: inside `collectives.world_of_one`)."""
        import thunder

        if not self.distributed:
            return thunder.jit(fn, **options)
        return data_parallel(self, thunder.jit(module_of(self, fn, device), **options), device)


def generate(ch: Chooser, *, backward: bool | None = None, max_statements: int = 10,
             collectives: bool = False) -> Program:
    """Generate one program from the choices of ``ch``.

    A program is Python source text (``def prog(x0, x1): ...``) built from elementwise ops,
    reductions, matmuls, views and reshapes, in-place updates of intermediates (and of inputs that
    need no gradient), ``.item()`` islands whose numbers flow into later ops and the return, views
    made right after an island (outside every region) that are returned or read by later ops, and
    one or more outputs, some of which alias each other or an input. An input may be an
    ``nn.Parameter`` (a layer's weight): the oracle calls the function with several parameter sets.
    Shapes are small (dimensions 4..16), so a program runs in milliseconds on a CPU. The same
    choices give the same program, from `RandomChooser` (program number ``seed``) or from
    hypothesis (`programs`, which shrinks).

    With ``collectives`` the program is a module's (``Program.distributed``, `collectives`): it trains (some inputs
    require grad), ``x0`` is its input and ``x1`` a parameter (``x2``, where drawn, either), and it goes under
    ``thunder.distributed.ddp`` or ``fsdp``.

    Args:
        ch: where the random choices come from.
        backward: True: some inputs require grad; False: none does; None: chosen.
        max_statements: the most statements besides the ``.item()`` islands and the views right after them.
        collectives: a module's program, trained under thunder's data parallelism.
    """
    if collectives:
        backward = True
    elif backward is None:
        backward = ch.boolean(0.5)
    b = Builder(ch, backward=backward)
    dims = [ch.integer(4, 16) for _ in range(ch.integer(1, 3))]
    specs: list[InputSpec] = []
    count = ch.integer(1, 3)
    for i in range(max(count, 2) if collectives else count):
        shape = tuple(ch.choice(dims) for _ in range(ch.integer(1, 2)))
        # NOTE: a parameter of a backward program is a trained weight (requires grad); otherwise frozen
        parameter = ch.boolean(0.35)
        if collectives:  # NOTE: a module's input and at least one weight, whose gradient the backward reduces
            parameter = i == 1 or (i > 1 and parameter)
        grad = backward and (i == 0 or parameter or ch.boolean(0.6))
        specs.append(InputSpec(f"x{i}", shape, grad, parameter))
        b.tensors.append(TensorVar(f"x{i}", shape, grad, f"x{i}"))

    n = ch.integer(1, max_statements)
    islands = sorted({ch.integer(0, n) for _ in range(ch.integer(1, 3))})
    for step in range(n + 1):
        if step in islands:
            b.item()
            if ch.boolean(0.4) and b.late_view() and ch.boolean(0.4):
                b.item()  # NOTE: a second island right after keeps the view alone between two regions
        if step == n:
            break
        kind = ch.choice(WEIGHTED_KINDS)
        if not getattr(b, kind)():
            b.unary()

    outputs = b.outputs()
    one = len(outputs) == 1
    ret = outputs[0] if one and ch.boolean(0.5) else ", ".join(outputs) + ("," if one else "")
    params = ", ".join(s.name for s in specs)
    source = f"def prog({params}):\n" + "\n".join(b.lines) + f"\n    return {ret}\n"
    fusion_type = ch.choice(("consecutive", "dataflow"))
    return Program(source, tuple(specs), fusion_type=fusion_type,
                   distributed=ch.choice(WRAPPERS) if collectives else None)


def programs(*, backward: bool | None = None, max_statements: int = 10, collectives: bool = False):
    """A hypothesis strategy of `Program` objects (see `generate`)."""
    from hypothesis import strategies as st

    @st.composite
    def _programs(draw):
        return generate(HypothesisChooser(draw), backward=backward, max_statements=max_statements,
                        collectives=collectives)

    return _programs()
