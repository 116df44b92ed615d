"""Random straight-line PyTorch programs that thunder 0.2.6 traces, and the differential oracle that judges them.

A program is Python source text (``def prog(x0, x1): ...``) built from small random choices:
elementwise ops, reductions, matmuls, views and reshapes, in-place updates of intermediates (and of
inputs that need no gradient), ``.item()`` islands whose numbers flow into later ops and the return,
and one or more outputs. With ``requires_grad`` inputs the caller sums the outputs to a loss and
runs backward. Shapes are small (dimensions 4..16), so a program runs in milliseconds on a CPU.

The choices come from a `Chooser`: `RandomChooser` (plain ``random.Random``, for the benchmark's
thousands of programs, each reproducible from its number) or the hypothesis strategy `programs()`
(shrinking, for the tests). The same choices give the same program either way.

`judge(program)` runs one program through eager PyTorch, plain ``thunder.jit``, the fixed, the
legacy and thunder's stock CUDA-graph transform, and returns an `Outcome` whose ``problems`` list is
empty when every claim holds:

1. fixed: results (outputs, inputs updated in place, ``.item()`` numbers, gradients) equal eager
   PyTorch's within ``torch.testing.assert_close``'s default tolerances, and no defect in its
   traces but ``scalar-region-input`` on a number whose hand-off it refused and explained;
2. legacy: it fails (raises, or computes wrong values) exactly when the checker reports an error
   rule that shows in the run's mode (`observable_rules`: eagerly, only the rules that make
   generated code read a deleted name; with capture, every error rule; `explaining_rules` for
   emulated capture, where capture-only rules may or may not show);
3. stock: the checker reports ``host-sync-in-region`` exactly when a region's code calls
   ``.item()``; with capture (GPU) it also fails exactly when the checker reports an error rule.

A program that PyTorch or plain thunder rejects is discarded. Where plain thunder's own numerics
differ from eager PyTorch, a transform may match either. Bugs already found are in `KNOWN_BUGS`:
counted, not reported again.
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import random
import re
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "Chooser",
    "RandomChooser",
    "Program",
    "InputSpec",
    "generate",
    "programs",
    "judge",
    "Outcome",
    "observable_rules",
    "explaining_rules",
    "EAGER_OBSERVABLE_RULES",
    "CAPTURE_ONLY_RULES",
    "MAY_SHOW_RULES",
    "KNOWN_BUGS",
    "KnownBug",
    "region_sources",
    "emulated_capture",
    "make_transform",
]


# ---------------------------------------------------------------------------------------------------
# Choices


class Chooser(Protocol):
    """Where a generator's random choices come from."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]`` (shrinks towards ``lo``)."""

    def choice(self, options: Sequence[Any]) -> Any:
        """One of ``options`` (shrinks towards the first)."""

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability about ``p`` (shrinks towards False)."""


class RandomChooser:
    """Choices from ``random.Random(seed)``: program number ``seed`` is always the same program."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self._rng.randrange(len(options))]

    def boolean(self, p: float = 0.5) -> bool:
        return self._rng.random() < p


class _HypothesisChooser:
    """Choices drawn from hypothesis (so failures shrink to small programs)."""

    def __init__(self, draw: Callable[[Any], Any]):
        from hypothesis import strategies as st

        self._draw = draw
        self._st = st

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(self._st.integers(lo, hi))

    def choice(self, options: Sequence[Any]) -> Any:
        return self._draw(self._st.sampled_from(list(options)))

    def boolean(self, p: float = 0.5) -> bool:
        # NOTE: an integer in [0, 999] shrinks to 0, i.e. to False
        return self._draw(self._st.integers(0, 999)) >= round(1000 * (1 - p))


# ---------------------------------------------------------------------------------------------------
# Programs


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One argument of a generated program."""

    name: str
    shape: tuple[int, ...]
    requires_grad: bool = False


@dataclass(frozen=True)
class Program:
    """A generated program: its source text and how to make its inputs.

    ``repr`` is the source itself, so hypothesis prints a falsifying program as readable code.
    """

    source: str
    inputs: tuple[InputSpec, ...]
    fusion_type: str = "consecutive"  # thunder's compile option for the fixed and the stock transform
    name: str = "prog"

    def __repr__(self) -> str:
        grads = [i.name for i in self.inputs if i.requires_grad]
        shapes = ", ".join(f"{i.name}: {list(i.shape)}" for i in self.inputs)
        head = f"# inputs {shapes}" + (f"; requires_grad: {', '.join(grads)}" if grads else "")
        head += f"; fusion_type={self.fusion_type!r}"
        return f"\n{head}\n{self.source}"

    @property
    def backward(self) -> bool:
        """Whether some input requires grad (then the outputs are summed and backpropagated)."""
        return any(i.requires_grad for i in self.inputs)

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
        """Fresh random inputs (the same for the same ``seed``)."""
        import torch

        g = torch.Generator().manual_seed(seed)
        return [
            torch.randn(spec.shape, generator=g).to(device).requires_grad_(spec.requires_grad)
            for spec in self.inputs
        ]


@dataclass(slots=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]
    grad_leaf: bool  # an input that requires grad (never updated in place, nor any view of it)
    root: str  # the input or intermediate whose storage it views
    contiguous: bool = True


@dataclass(slots=True)
class _Number:
    name: str
    kind: str  # "float" | "int"


_UNARY = ("sin", "cos", "tanh", "sigmoid", "abs", "neg", "relu")
_BINARY_METHOD = ("add", "sub", "mul")
_BINARY_TORCH = ("maximum", "minimum")
_REDUCE = ("sum", "mean", "amax")
_INPLACE_UNARY = ("relu_", "tanh_")
_INPLACE_BINARY = ("add_", "sub_", "mul_")


class _Builder:
    """Builds one program statement by statement, tracking names, shapes and aliases."""

    def __init__(self, ch: Chooser, *, backward: bool):
        self.ch = ch
        self.backward = backward
        self.lines: list[str] = []
        self.tensors: list[_Tensor] = []
        self.numbers: list[_Number] = []
        self.last_read: _Tensor | None = None  # the tensor the latest island read
        self._count = 0

    # names -----------------------------------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def emit(self, line: str) -> None:
        self.lines.append(f"    {line}")

    def new_tensor(self, expr: str, shape: tuple[int, ...], *, view_of: _Tensor | None = None,
                   contiguous: bool = True) -> _Tensor:
        name = self._fresh("t")
        self.emit(f"{name} = {expr}")
        root = view_of.root if view_of is not None else name
        grad_leaf = view_of.grad_leaf if view_of is not None else False
        t = _Tensor(name, shape, grad_leaf, root, contiguous)
        self.tensors.append(t)
        return t

    def new_number(self, expr: str, kind: str) -> _Number:
        name = self._fresh("s" if kind == "float" else "n")
        self.emit(f"{name} = {expr}")
        n = _Number(name, kind)
        self.numbers.append(n)
        return n

    # operands -------------------------------------------------------------------------------------
    def pick_tensor(self, pred: Callable[[_Tensor], bool] = lambda t: True) -> _Tensor | None:
        options = [t for t in self.tensors if pred(t)]
        if not options:
            return None
        # NOTE: prefer recent values, so programs are chains rather than fans of inputs
        if len(options) > 1 and self.ch.boolean(0.6):
            return options[-1]
        return self.ch.choice(options)

    def float_operand(self) -> str:
        """A float for a tensor op: a number from an island (when there is one) or a constant."""
        floats = [n for n in self.numbers if n.kind == "float"]
        if floats and self.ch.boolean(0.7):
            n = self.ch.choice(floats)
            return self.ch.choice((n.name, f"({n.name} * 0.5)", f"abs({n.name})"))
        return self.ch.choice(("0.5", "2.0", "-1.0", "0.25"))

    def broadcast_partner(self, a: _Tensor, *, tensor_only: bool = False) -> str:
        """An operand that broadcasts to ``a``'s shape: same shape, a suffix shape, a 0-d tensor or a float."""
        same = [t for t in self.tensors if t.shape == a.shape]
        suffix = [t for t in self.tensors if 0 < len(t.shape) < len(a.shape) and t.shape == a.shape[-len(t.shape):]]
        scalar = [t for t in self.tensors if t.shape == ()]
        kinds = [k for k, ok in (("same", same), ("suffix", suffix), ("scalar", scalar), ("float", not tensor_only)) if ok]
        kind = self.ch.choice(kinds)
        if kind == "same":
            return self.ch.choice(same).name
        if kind == "suffix":
            return self.ch.choice(suffix).name
        if kind == "scalar":
            return self.ch.choice(scalar).name
        return self.float_operand()

    # statements -----------------------------------------------------------------------------------
    def unary(self) -> bool:
        a = self.pick_tensor()
        op = self.ch.choice(_UNARY)
        form = self.ch.choice((f"{a.name}.{op}()", f"torch.{op}({a.name})"))
        self.new_tensor(form, a.shape)
        return True

    def binary(self) -> bool:
        a = self.pick_tensor(lambda t: t.shape != ())
        if a is None:
            return False
        # NOTE: thunder 0.2.6 has no gradient for maximum/minimum ("Failed to find a gradient transform")
        if self.backward or self.ch.boolean(0.7):
            b = self.broadcast_partner(a)
            op = self.ch.choice(_BINARY_METHOD)
            expr = self.ch.choice((f"{a.name}.{op}({b})", f"{a.name} {dict(add='+', sub='-', mul='*')[op]} {b}"))
        else:
            b = self.broadcast_partner(a, tensor_only=True)  # NOTE: torch.maximum takes no Python number
            expr = f"torch.{self.ch.choice(_BINARY_TORCH)}({a.name}, {b})"
        self.new_tensor(expr, a.shape)
        return True

    def scalar_op(self) -> bool:
        """A tensor op with a Python number: ``y * s``, ``s - y``, ``torch.where(y > s, y, ...)``."""
        a = self.pick_tensor()
        s = self.float_operand()
        form = self.ch.choice(("mul", "add", "rsub", "where", "clamp"))
        expr = {
            "mul": f"{a.name} * {s}",
            "add": f"{a.name} + {s}",
            "rsub": f"{s} - {a.name}",
            "where": f"torch.where({a.name} > {s}, {a.name}, {a.name} * 0.5)",
            "clamp": f"{a.name}.clamp(max={s})",
        }[form]
        self.new_tensor(expr, a.shape)
        return True

    def reduce(self) -> bool:
        a = self.pick_tensor(lambda t: t.shape != ())
        if a is None:
            return False
        op = self.ch.choice(_REDUCE)
        if len(a.shape) == 1 or self.ch.boolean(0.3):
            self.new_tensor(f"{a.name}.{op}()", ())
            return True
        dim = self.ch.integer(0, len(a.shape) - 1)
        keep = self.ch.boolean(0.3)
        shape = tuple(1 if i == dim else d for i, d in enumerate(a.shape)) if keep else a.shape[:dim] + a.shape[dim + 1:]
        self.new_tensor(f"{a.name}.{op}({dim}{', keepdim=True' if keep else ''})", shape)
        return True

    def matmul(self) -> bool:
        a = self.pick_tensor(lambda t: len(t.shape) in (1, 2))
        if a is None:
            return False
        k = a.shape[-1]
        partners = [t for t in self.tensors if len(t.shape) in (1, 2) and t.shape[0] == k]
        partners_t = [t for t in self.tensors if len(t.shape) == 2 and t.shape[1] == k]
        if len(a.shape) == 1 and not partners and not partners_t:
            return False
        options = ["direct"] * bool(partners) + ["transposed"] * bool(partners_t) + ["self"] * (len(a.shape) == 2)
        how = self.ch.choice(options)
        if how == "direct":
            b = self.ch.choice(partners)
            expr, bshape = f"{a.name} @ {b.name}", b.shape
        elif how == "transposed":
            b = self.ch.choice(partners_t)
            expr, bshape = f"{a.name} @ {b.name}.t()", (b.shape[1], b.shape[0])
        else:
            expr, bshape = f"{a.name} @ {a.name}.t()", (a.shape[1], a.shape[0])
        shape = a.shape[:-1] + bshape[1:]
        if self.ch.boolean(0.3):
            expr = f"torch.matmul({expr.replace(' @ ', ', ', 1)})"
        self.new_tensor(expr, shape)
        return True

    def view(self) -> bool:
        a = self.pick_tensor(lambda t: t.shape != ())
        if a is None:
            return False
        numel = 1
        for d in a.shape:
            numel *= d
        # NOTE: slice only dimensions of 4 or more, so no tensor ever gets an empty dimension
        sliceable = [d for d in range(min(len(a.shape), 2)) if a.shape[d] >= 4]
        forms = ["reshape", "flatten", "unsqueeze"] + ["slice"] * bool(sliceable) + ["t"] * (len(a.shape) == 2)
        forms += ["view"] * a.contiguous
        form = self.ch.choice(forms)
        if form in ("reshape", "view"):
            shape = self.ch.choice(_factorizations(numel))
            arg = ", ".join(str(d) for d in shape) if len(shape) > 1 else "-1"
            self.new_tensor(f"{a.name}.{form}({arg})", shape, view_of=a if (form == "view" or a.contiguous) else None)
        elif form == "flatten":
            self.new_tensor(f"{a.name}.flatten()", (numel,), view_of=a if a.contiguous else None)
        elif form == "unsqueeze":
            dim = self.ch.integer(0, len(a.shape))
            self.new_tensor(f"{a.name}.unsqueeze({dim})", a.shape[:dim] + (1,) + a.shape[dim:], view_of=a,
                            contiguous=a.contiguous)
        elif form == "slice":
            start = self.ch.integer(1, 2)
            if self.ch.choice(sliceable) == 0:
                self.new_tensor(f"{a.name}[{start}:]", (a.shape[0] - start,) + a.shape[1:], view_of=a,
                                contiguous=a.contiguous)
            else:
                self.new_tensor(f"{a.name}[:, {start}:]", (a.shape[0], a.shape[1] - start) + a.shape[2:], view_of=a,
                                contiguous=False)
        else:
            self.new_tensor(f"{a.name}.t()", (a.shape[1], a.shape[0]), view_of=a, contiguous=False)
        return True

    def inplace(self) -> bool:
        """Update a tensor in place (never an input that requires grad, nor a view of one).

        Half the time the target shares storage with the tensor the latest island read: reading a
        value and then updating its tensor is where reordering and aliasing bugs hide.
        """
        read = self.last_read
        a = None
        if read is not None and self.ch.boolean(0.5):
            a = self.pick_tensor(lambda t: not t.grad_leaf and t.root == read.root)
        if a is None:
            a = self.pick_tensor(lambda t: not t.grad_leaf)
        if a is None:
            return False
        form = self.ch.choice(("binary", "binary", "unary"))
        if form == "unary":
            self.emit(f"{a.name}.{self.ch.choice(_INPLACE_UNARY)}()")
        else:
            self.emit(f"{a.name}.{self.ch.choice(_INPLACE_BINARY)}({self.broadcast_partner(a)})")
        return True

    def item(self) -> bool:
        """An island: a number read from the device, ``s = y.sum().item()`` and the like."""
        zero_d = [t for t in self.tensors if t.shape == ()]
        a = self.pick_tensor()
        self.last_read = a
        form = self.ch.choice(("reduce", "reduce", "zero_d", "index", "count"))
        if form == "zero_d" and zero_d:
            self.last_read = self.ch.choice(zero_d)
            self.new_number(f"{self.last_read.name}.item()", "float")
        elif form == "index" and a.shape != ():
            idx = ", ".join(str(self.ch.integer(0, d - 1)) for d in a.shape)
            self.new_number(f"{a.name}[{idx}].item()", "float")
        elif form == "count":
            self.new_number(f"({a.name} > 0).sum().item()", "int")
        else:
            self.new_number(f"{a.name}.{self.ch.choice(_REDUCE)}().item()", "float")
        return True

    def arithmetic(self) -> bool:
        """Python arithmetic on island numbers (thunder traces it as number ops)."""
        if not self.numbers:
            return False
        n = self.ch.choice(self.numbers)
        same = [m for m in self.numbers if m.kind == n.kind]
        m = self.ch.choice(same)
        if n.kind == "int":
            self.new_number(self.ch.choice((f"{n.name} + 1", f"{n.name} * {m.name}", f"{n.name} - {m.name}")), "int")
        else:
            self.new_number(self.ch.choice((f"{n.name} * 0.5 + 1.0", f"{n.name} * {m.name}", f"{n.name} - {m.name}")),
                            "float")
        return True

    def int_into_tensor(self) -> bool:
        """An int number into a float tensor op: thunder 0.2.6 cannot trace it (the discard path)."""
        ints = [n for n in self.numbers if n.kind == "int"]
        if not ints:
            return False
        a = self.pick_tensor()
        self.new_tensor(f"{a.name} * {self.ch.choice(ints).name}", a.shape)
        return True


def _factorizations(numel: int) -> list[tuple[int, ...]]:
    """1-d and 2-d shapes of ``numel`` elements (both dimensions > 1)."""
    shapes: list[tuple[int, ...]] = [(numel,)]
    shapes += [(a, numel // a) for a in range(2, numel) if numel % a == 0 and numel // a > 1]
    return shapes


#: Statement kinds and their weights (a kind that does not apply falls back to `unary`).
_KINDS: tuple[tuple[str, int], ...] = (
    ("unary", 3),
    ("binary", 3),
    ("scalar_op", 3),
    ("reduce", 2),
    ("matmul", 2),
    ("view", 2),
    ("inplace", 2),
    ("arithmetic", 1),
    ("int_into_tensor", 1),
)
_WEIGHTED_KINDS = tuple(k for k, w in _KINDS for _ in range(w))


def generate(ch: Chooser, *, backward: bool | None = None, max_statements: int = 10) -> Program:
    """Generate one program from the choices of ``ch``.

    Args:
        ch: where the random choices come from.
        backward: True: some inputs require grad; False: none does; None: chosen.
        max_statements: the most statements besides the ``.item()`` islands.
    """
    if backward is None:
        backward = ch.boolean(0.5)
    b = _Builder(ch, backward=backward)
    dims = [ch.integer(4, 16) for _ in range(ch.integer(1, 3))]
    specs: list[InputSpec] = []
    for i in range(ch.integer(1, 3)):
        shape = tuple(ch.choice(dims) for _ in range(ch.integer(1, 2)))
        grad = backward and (i == 0 or ch.boolean(0.6))
        specs.append(InputSpec(f"x{i}", shape, grad))
        b.tensors.append(_Tensor(f"x{i}", shape, grad, f"x{i}"))

    n = ch.integer(1, max_statements)
    islands = sorted({ch.integer(0, n) for _ in range(ch.integer(1, 3))})
    for step in range(n + 1):
        if step in islands:
            b.item()
        if step == n:
            break
        kind = ch.choice(_WEIGHTED_KINDS)
        if not getattr(b, kind)():
            b.unary()

    # outputs: the last tensor, then a few other values (island numbers included)
    made = [t for t in b.tensors if not t.name.startswith("x")]
    outputs = [made[-1].name] if made else [b.tensors[-1].name]
    others = [v.name for v in made[:-1]] + [v.name for v in b.numbers]
    for _ in range(ch.integer(0, 3)):
        if others:
            name = ch.choice(others)
            if name not in outputs:
                outputs.append(name)
    ret = outputs[0] if len(outputs) == 1 and ch.boolean(0.5) else ", ".join(outputs) + ("," if len(outputs) == 1 else "")
    params = ", ".join(s.name for s in specs)
    source = f"def prog({params}):\n" + "\n".join(b.lines) + f"\n    return {ret}\n"
    return Program(source, tuple(specs), fusion_type=ch.choice(("consecutive", "dataflow")))


def programs(*, backward: bool | None = None, max_statements: int = 10):
    """A hypothesis strategy of `Program` objects (see `generate`)."""
    from hypothesis import strategies as st

    @st.composite
    def _programs(draw):
        return generate(_HypothesisChooser(draw), backward=backward, max_statements=max_statements)

    return _programs()


# ---------------------------------------------------------------------------------------------------
# The differential oracle

#: Error rules whose defect breaks an eager run: generated code reads or returns a deleted name
#: (UnboundLocalError). Thunder's traces are single-assignment, so a deleted name is never bound
#: again and the read always fails.
EAGER_OBSERVABLE_RULES = frozenset({"use-after-del", "region-deletes-output"})
#: Error rules that only real capture shows: with regions run eagerly (``capture=False``) an
#: ``.item()`` inside a region just reads the number, and a CPU op (or transfer) runs every time;
#: with capture the first fails the capture, the second replays a stale value.
CAPTURE_ONLY_RULES = frozenset({"host-sync-in-region", "cpu-op-in-region", "region-updates-input"})
#: Capture-only rules whose defect shows only when the spoiled value is read afterwards: an in-place
#: update of a region input lands in the runner's static copy, which matters for the caller's
#: tensor or a later reader, not for an intermediate nobody reads again.
MAY_SHOW_RULES = frozenset({"region-updates-input"})


def observable_rules(capture: bool | str) -> frozenset[str]:
    """The error rules whose defect must make a run fail (or compute wrong values): else a false positive.

    Every error rule is one or the other: eagerly (and with emulated capture, which runs region
    code on the CPU) only `EAGER_OBSERVABLE_RULES` must show, with real capture all of
    `thunder_nb.model.ERROR_RULES` but `MAY_SHOW_RULES`.
    """
    from thunder_nb.model import ERROR_RULES

    if EAGER_OBSERVABLE_RULES | CAPTURE_ONLY_RULES != ERROR_RULES or not MAY_SHOW_RULES <= CAPTURE_ONLY_RULES:
        raise AssertionError(f"classify every error rule as eager-observable or capture-only: {sorted(ERROR_RULES)}")
    return ERROR_RULES - MAY_SHOW_RULES if capture is True else EAGER_OBSERVABLE_RULES


def explaining_rules(capture: bool | str) -> frozenset[str]:
    """The error rules whose defect can explain a failed run: a failure without one is a false negative.

    With emulated capture a capture-only rule may show or not: an ``.item()`` inside an emulated
    graph reads its number once, at recording, which is wrong only when the warm-up calls changed
    the tensor it reads.
    """
    from thunder_nb.model import ERROR_RULES

    return ERROR_RULES if capture else observable_rules(False)


from thunder_nb.testing import emulated_capture  # noqa: E402  (re-exported for the fuzzer and its tests)


def make_transform(cls: type, capture: bool | str, **options: Any) -> Any:
    """A thunder-nb transform in mode ``capture``: True (real), False (eager regions) or ``"emulated"``."""
    transform = cls(capture=capture is True, **options)
    if capture == "emulated":
        transform.cuda_graph_runner.capture = True  # NOTE: the runner's capture path, on emulated graphs
    return transform


@dataclass(frozen=True)
class KnownBug:
    """A thunder_nb bug the fuzzer found, with its strict-xfail test in tests/test_fuzz_regressions.py.

    A hit is counted under the bug's name instead of failing the fuzz tests. ``defect`` recognises
    a wrong defect of the fixed transform's traces; ``variant`` names the fixed transform's options
    (``fusion_type``, ``scalar_handoff``) under which a program whose results are wrong comes out
    right, which pins the wrong results on this bug; ``wrong_values`` recognises the bug from how a
    captured run of one transform (``"fixed"``, ``"legacy"``, ``"stock"``) differs from eager.
    """

    name: str
    regression_test: str
    defect: Callable[[Any, Any], bool] | None = None  # (Defect, jitted function) -> hit?
    variant: dict[str, Any] | None = None
    wrong_values: Callable[[str, str, Program], bool] | None = None  # (transform, how values differ, program) -> hit?


#: Open bugs: add one with its strict-xfail regression test, delete it when the bug is fixed. None is
#: open; the fuzzer's findings stay as regression tests (tests/test_fuzz_regressions.py): never-freed
#: on ``_`` and on inputs updated in place (checker), dataflow fusion moving a read past an in-place
#: update, the scalar hand-off reading a 0-d tensor after an in-place update, in-place updates of
#: region inputs lost under capture (write-back, through ``update_aliases``), the checker's
#: missing rule for them (now ``region-updates-input``), and region outputs that were views of an
#: input's static copy (now re-made on the caller's tensor).
KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        "legacy (capture): in-place updates inside regions can land in static copies (July 2024 behaviour)",
        "test_capture_keeps_in_place_updates",
        wrong_values=lambda transform, why, program: transform == "legacy" and program.updates_in_place,
    ),
)


def _known_by_values(transform: str, why: str | None, program: Program, capture: bool | str) -> str | None:
    """The known bug that explains how a captured run of ``transform`` went wrong (``why``), if one does."""
    if why is None or not capture:
        return None
    return next((b.name for b in KNOWN_BUGS if b.wrong_values is not None and b.wrong_values(transform, why, program)),
                None)


@dataclass
class _Run:
    """What one call produced: flat outputs, the inputs afterwards (in-place updates), gradients."""

    outputs: list[Any] = field(default_factory=list)
    inputs_after: list[Any] = field(default_factory=list)
    grads: list[Any] = field(default_factory=list)
    error: BaseException | None = None
    backward_ran: bool = False


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _execute(fn: Callable[..., Any], program: Program, device: str) -> _Run:
    """Call ``fn`` on fresh inputs; with grad inputs, backpropagate the sum of the grad outputs."""
    import torch

    run = _Run()
    inputs = program.make_inputs(device)
    try:
        out = _flat(fn(*inputs))
        loss = None
        for o in out:
            if isinstance(o, torch.Tensor) and o.requires_grad:
                loss = o.sum() if loss is None else loss + o.sum()
        if loss is not None:
            loss.backward()
            run.backward_ran = True
        run.outputs = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in out]
        run.inputs_after = [x.detach().clone() for x in inputs]
        run.grads = [
            (x.grad if x.grad is not None else torch.zeros_like(x)).detach().clone()
            for x in inputs
            if x.requires_grad
        ]
        if device != "cpu":
            torch.cuda.synchronize()
    except Exception as e:  # NOTE: every failure is data here; the caller judges it
        run.error = e
    return run


def _close(a: Any, b: Any) -> str | None:
    """Why ``a`` and ``b`` differ (assert_close's default tolerances, float32's for numbers), or None."""
    import torch

    try:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, equal_nan=True)
        elif type(a) is not type(b):
            return f"{a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"
        elif isinstance(a, float):
            # NOTE: an item() number comes from a float32 tensor: float32's tolerances
            torch.testing.assert_close(a, b, rtol=1.3e-6, atol=1e-5, equal_nan=True)
        elif a != b:
            return f"{a!r} != {b!r}"
    except (AssertionError, TypeError, ValueError) as e:
        return str(e).strip().splitlines()[0] + ("" if "\n" not in str(e).strip() else " ...")
    return None


def _compare(run: _Run, ref: _Run) -> str | None:
    """The first difference between two runs, or None when they agree."""
    for what, xs, ys in (("output", run.outputs, ref.outputs), ("input after the call", run.inputs_after, ref.inputs_after),
                         ("gradient", run.grads, ref.grads)):
        if len(xs) != len(ys):
            return f"{len(xs)} {what}s, expected {len(ys)}"
        for i, (x, y) in enumerate(zip(xs, ys)):
            why = _close(x, y)
            if why:
                return f"{what} {i}: {why}"
    if run.backward_ran != ref.backward_ran:
        return f"backward ran: {run.backward_ran}, expected {ref.backward_ran}"
    return None


def _raised_while_compiling(e: BaseException) -> bool:
    """Whether thunder raised ``e`` while building the compiled function (not while running it)."""
    return "apply_transforms_and_build_cache_entry" in {f.name for f in traceback.extract_tb(e.__traceback__)}


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:200].rstrip(": ")


@dataclass
class Outcome:
    """How one program fared.

    ``problems`` lists every broken claim (empty: all claims hold); the other fields are the figures
    the benchmark sums.
    """

    program: Program
    capture: bool | str = False
    discarded: str | None = None  # why the program was thrown away ("thunder rejects: TypeError")
    problems: list[str] = field(default_factory=list)
    thunder_differs: bool = False  # plain thunder.jit disagrees with eager PyTorch (thunder's own numerics)
    known_bugs: tuple[str, ...] = ()  # names of `KNOWN_BUGS` hit
    # the fixed transform
    fixed_error: str | None = None
    fixed_mismatch: str | None = None
    fixed_defects: tuple[str, ...] = ()  # defects of its traces ("rule @ trace/where (value): message")
    fixed_fallbacks: tuple[str, ...] = ()  # numbers kept as region inputs, and why (refused hand-offs)
    # the legacy transform
    legacy_failure: str | None = None  # how it failed (exception or wrong values); None: it ran correctly
    legacy_error_rules: tuple[str, ...] = ()  # error-severity rules in its traces
    legacy_predicted: bool = False  # one of them must show (`observable_rules`)
    legacy_explained: bool = False  # one of them can explain a failure (`explaining_rules`)
    legacy_compile_crash: str | None = None  # thunder's dataflow fusion put a region after the return
    # thunder's stock transform
    stock_item_in_region: bool | None = None  # None: no stock traces to look at
    stock_host_sync_reported: bool | None = None
    stock_failure: str | None = None  # how its call failed (on CPU: always, at capture)
    stock_predicted: bool | None = None  # with capture (real or emulated): an error rule that must show
    stock_explained: bool | None = None  # ... one that can explain a failure
    stock_transform_crash: str | None = None  # thunder 0.2.6 raised while compiling (no trace to judge)

    @property
    def false_negative(self) -> bool:
        """Legacy failed, but the checker reported no error that could show."""
        return self.legacy_failure is not None and not self.legacy_explained

    @property
    def false_positive(self) -> bool:
        """Legacy ran correctly, but the checker reported an error that must show."""
        return self.discarded is None and self.legacy_failure is None and self.legacy_predicted


class _Reference:
    """Eager PyTorch's results, and plain ``thunder.jit``'s (computed on demand) where thunder's own numerics differ."""

    def __init__(self, fn: Callable[..., Any], program: Program, device: str, outcome: Outcome):
        self._fn, self._program, self._device, self._outcome = fn, program, device, outcome
        self.eager = _execute(fn, program, device)
        self._plain: _Run | None = None

    @property
    def plain(self) -> _Run:
        """Plain ``thunder.jit`` (same ``fusion_type``, no transform)."""
        import thunder

        if self._plain is None:
            jfn = thunder.jit(self._fn, fusion_type=self._program.fusion_type)
            self._plain = _execute(jfn, self._program, self._device)
            self._outcome.thunder_differs = self._plain.error is None and _compare(self._plain, self.eager) is not None
        return self._plain

    def disagrees(self, run: _Run) -> str | None:
        """How ``run`` differs from eager PyTorch; None when it agrees (or, where thunder differs, agrees with thunder)."""
        why = _compare(run, self.eager)
        if why is None:
            return None
        if self.plain.error is None and self._outcome.thunder_differs and _compare(run, self.plain) is None:
            return None
        return why


def judge(program: Program, *, device: str = "cpu", capture: bool | str = False) -> Outcome:
    """Run ``program`` through eager PyTorch and thunder (plain, fixed, legacy, stock) and judge the claims.

    Args:
        program: the program.
        device: where its inputs live (``"cpu"`` or ``"cuda"``).
        capture: True: capture CUDA graphs for real (needs ``device="cuda"``); False: regions run
            eagerly; ``"emulated"``: the runners' capture path on the CPU (`emulated_capture`).

    Returns:
        The `Outcome`; ``discarded`` says why when PyTorch or plain thunder rejects the program.
    """
    outcome = Outcome(program, capture=capture)
    fn = program.function()
    emulation = emulated_capture() if capture == "emulated" else contextlib.nullcontext()
    with warnings.catch_warnings(), emulation:
        warnings.simplefilter("ignore")
        ref = _Reference(fn, program, device, outcome)
        if ref.eager.error is not None:
            outcome.discarded = f"PyTorch rejects: {type(ref.eager.error).__name__}"
            return outcome
        if not _judge_fixed(fn, program, device, capture, outcome, ref):
            return outcome
        _judge_legacy(fn, program, device, capture, outcome, ref)
        _judge_stock(fn, program, device, capture, outcome, ref)
    return outcome


def _judge_fixed(fn, program: Program, device: str, capture: bool | str, outcome: Outcome, ref: _Reference) -> bool:
    """Claim 1: the fixed transform computes what eager PyTorch computes, and its traces have no defect.

    Returns False when the program is discarded (plain thunder cannot run it either).
    """
    import thunder

    from thunder_nb.fix import FixedCUDAGraphTransform

    transform = make_transform(FixedCUDAGraphTransform, capture)
    jfixed = thunder.jit(fn, transforms=[transform], fusion_type=program.fusion_type)
    run = _execute(jfixed, program, device)
    if run.error is not None:
        if ref.plain.error is not None:
            outcome.discarded = f"thunder rejects: {type(ref.plain.error).__name__}"
            return False
        outcome.fixed_error = _describe(run.error)
        outcome.problems.append(f"fixed raised where plain thunder ran: {outcome.fixed_error}\n"
                                + "".join(traceback.format_exception(run.error)[-6:]))
    else:
        outcome.fixed_mismatch = ref.disagrees(run)
        if outcome.fixed_mismatch:
            bug = _known_by_values("fixed", outcome.fixed_mismatch, program, capture)
            bugs = (bug,) if bug else _known_wrong_results(fn, program, device, capture, ref)
            if bugs:
                outcome.known_bugs += bugs
            else:
                outcome.problems.append(f"fixed differs from eager PyTorch: {outcome.fixed_mismatch}")
    _check_fixed_traces(jfixed, transform, outcome, run.error)
    return True


def _known_wrong_results(fn, program: Program, device: str, capture: bool | str, ref: _Reference) -> tuple[str, ...]:
    """The known bugs that explain the fixed transform's wrong results: those whose variant runs right.

    Variants are tried one bug at a time, then all together (several bugs at once).
    """
    import thunder

    from thunder_nb.fix import FixedCUDAGraphTransform

    default = {"fusion_type": program.fusion_type, "scalar_handoff": True}

    def right_with(options: dict[str, Any]) -> bool:
        opts = {**default, **options}
        if opts == default:
            return False  # NOTE: this variant is what already ran
        transform = make_transform(FixedCUDAGraphTransform, capture, scalar_handoff=opts["scalar_handoff"])
        run = _execute(thunder.jit(fn, transforms=[transform], fusion_type=opts["fusion_type"]), program, device)
        return run.error is None and ref.disagrees(run) is None

    bugs = [b for b in KNOWN_BUGS if b.variant is not None]
    for b in bugs:
        if right_with(b.variant):
            return (b.name,)
    combined: dict[str, Any] = {}
    for b in bugs:
        combined.update(b.variant)
    if right_with(combined):
        return tuple(b.name for b in bugs if {**default, **b.variant} != default)
    return ()


def _defect_text(d: Any) -> str:
    return f"{d.rule} @ {d.trace}/{d.where()} ({d.value}): {d.message}"


def _check_fixed_traces(jfixed: Any, transform: Any, outcome: Outcome, error: BaseException | None) -> None:
    """No defect in the fixed transform's traces, but a refused scalar hand-off that says why."""
    import thunder_nb

    try:
        report = thunder_nb.analyze(jfixed, error=error)
    except Exception as e:
        outcome.problems.append(f"analyze() failed on the fixed transform's traces: {_describe(e)}")
        return
    defects, known, fallbacks = [], [], []
    for d in report.defects:
        bug = next((b.name for b in KNOWN_BUGS if b.defect is not None and b.defect(d, jfixed)), None)
        if bug is not None:
            if bug not in known and bug not in outcome.known_bugs:
                known.append(bug)
        elif d.rule == "scalar-region-input" and d.value in transform.handoff_refusals:
            # NOTE: a documented fallback: the number stays a number where a 0-d tensor would not
            # compute the same values (handoff_refusals says why); it costs re-captures, not results
            fallbacks.append(f"{d.value}: {transform.handoff_refusals[d.value]}")
        else:
            defects.append(_defect_text(d))
    outcome.fixed_defects = tuple(defects)
    outcome.fixed_fallbacks = tuple(fallbacks)
    outcome.known_bugs += tuple(known)
    if defects:
        outcome.problems.append("defects in the fixed transform's traces:\n  " + "\n  ".join(defects))


def _judge_legacy(fn, program: Program, device: str, capture: bool | str, outcome: Outcome, ref: _Reference) -> None:
    """Claim 2: the legacy transform fails exactly when the checker reports an error that can show."""
    import thunder

    import thunder_nb
    from thunder_nb.fix import LegacyCUDAGraphTransform

    jleg = thunder.jit(fn, transforms=[make_transform(LegacyCUDAGraphTransform, capture)])
    run = _execute(jleg, program, device)
    if run.error is not None and _raised_while_compiling(run.error):
        frames = {f.name for f in traceback.extract_tb(run.error.__traceback__)}
        if "unwrap_return_value" in frames:
            # NOTE: legacy always fuses along dataflow, and thunder 0.2.6's dataflow fusion can order
            # the region of a dead in-place update after the return (plain thunder.jit with
            # fusion_type="dataflow" fails the same assertion on such programs): nothing ran to predict
            outcome.legacy_compile_crash = _describe(run.error) or "AssertionError"
            return
        outcome.problems.append(f"legacy crashed while compiling: {_describe(run.error)}\n"
                                + "".join(traceback.format_exception(run.error)[-6:]))
        return
    why = None if run.error is not None else ref.disagrees(run)
    if run.error is not None:
        outcome.legacy_failure = _describe(run.error)
    elif why:
        outcome.legacy_failure = f"wrong values: {why}"
    try:
        report = thunder_nb.analyze(jleg, error=run.error)
    except Exception as e:
        outcome.problems.append(f"analyze() failed on the legacy transform's traces: {_describe(e)}")
        return
    errors = sorted({d.rule for d in report.defects if d.severity == "error"})
    outcome.legacy_error_rules = tuple(errors)
    outcome.legacy_predicted = bool(set(errors) & observable_rules(capture))
    outcome.legacy_explained = bool(set(errors) & explaining_rules(capture))
    bug = _known_by_values("legacy", why, program, capture) if outcome.false_negative else None
    if bug:
        # NOTE: wrong values the checker cannot explain yet, from a known bug: counted, not judged
        outcome.known_bugs += (bug,) if bug not in outcome.known_bugs else ()
        outcome.legacy_failure = None
    if outcome.false_negative:
        outcome.problems.append(f"false negative: legacy failed ({outcome.legacy_failure}) and the checker "
                                f"reported no error rule of {sorted(explaining_rules(capture))} (errors: {errors})")
    if outcome.false_positive:
        outcome.problems.append(f"false positive: legacy ran correctly, the checker reported {errors}:\n  "
                                + "\n  ".join(_defect_text(d) for d in report.defects if d.severity == "error"))


def region_sources(jfn: Any) -> dict[str, str]:
    """``{region name: Python source}`` of the last forward and backward traces, read from the runner."""
    import inspect

    import thunder

    out: dict[str, str] = {}
    traces = list(thunder.last_traces(jfn)[-1:]) + list((thunder.last_backward_traces(jfn) or [])[-1:])
    for trace in traces:
        for b in trace.bound_symbols:
            runner = getattr(b.sym.executor, "cuda_graph_runner", None)
            if getattr(b.sym, "is_fusion", False) and runner is not None and b.sym.name in runner.python_callables:
                out[b.sym.name] = inspect.getsource(runner.python_callables[b.sym.name][0])
    return out


def _calls_item(source: str) -> bool:
    """Whether generated source calls ``.item()`` in code (not in the comments that quote user lines)."""
    return any(".item(" in line.split("#", 1)[0] for line in source.splitlines())


def _judge_stock(fn, program: Program, device: str, capture: bool | str, outcome: Outcome, ref: _Reference) -> None:
    """Claim 3: on thunder's stock traces, host-sync-in-region is reported exactly when a region calls ``.item()``.

    With capture (on a GPU) the stock transform really runs: then, as for legacy, it must fail
    exactly when the checker reports an error rule. A crash of thunder 0.2.6 while compiling (its
    AssertionError on a backward that saves a number) leaves no fused trace and is only counted.
    """
    import thunder
    from thunder.transforms.cudagraph import CUDAGraphTransform

    import thunder_nb

    jstock = thunder.jit(fn, transforms=[CUDAGraphTransform()], fusion_type=program.fusion_type)
    run = _execute(jstock, program, device)
    why = ref.disagrees(run) if run.error is None and capture else None
    if run.error is not None:
        outcome.stock_failure = _describe(run.error)
        if _raised_while_compiling(run.error):
            outcome.stock_transform_crash = outcome.stock_failure
    elif why:
        outcome.stock_failure = f"wrong values: {why}"
    try:
        report = thunder_nb.analyze(jstock, error=run.error)
        sources = region_sources(jstock)
    except Exception as e:
        outcome.problems.append(f"no stock traces to check ({_describe(e)}; the call: {outcome.stock_failure})")
        return
    outcome.stock_item_in_region = any(_calls_item(src) for src in sources.values())
    outcome.stock_host_sync_reported = any(d.rule == "host-sync-in-region" for d in report.defects)
    if outcome.stock_item_in_region != outcome.stock_host_sync_reported:
        outcome.problems.append(
            f"stock: .item() inside a region: {outcome.stock_item_in_region}, "
            f"host-sync-in-region reported: {outcome.stock_host_sync_reported}"
        )
    if capture and outcome.stock_transform_crash is None:
        errors = sorted({d.rule for d in report.defects if d.severity == "error"})
        outcome.stock_predicted = bool(set(errors) & observable_rules(capture))
        outcome.stock_explained = bool(set(errors) & explaining_rules(capture))
        bug = _known_by_values("stock", why, program, capture) if why and not outcome.stock_explained else None
        if bug:
            # NOTE: wrong values the checker cannot explain yet, from a known bug: counted, not judged
            outcome.known_bugs += (bug,) if bug not in outcome.known_bugs else ()
            outcome.stock_failure = None
        failed = outcome.stock_failure is not None
        if (failed and not outcome.stock_explained) or (not failed and outcome.stock_predicted):
            outcome.problems.append(f"stock with capture: failure {outcome.stock_failure!r}, checker errors {errors}")
