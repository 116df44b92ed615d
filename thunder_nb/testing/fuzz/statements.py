"""A generated program's body, statement by statement: the `Builder` that tracks names, shapes and aliases, the views
it makes, and the statement kinds with their weights."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .choices import Chooser

__all__ = ["TensorVar", "NumberVar", "Builder", "WEIGHTED_KINDS"]


@dataclass(slots=True)
class TensorVar:
    name: str
    shape: tuple[int, ...]
    grad_leaf: bool  # an input that requires grad (never updated in place, nor any view of it)
    root: str  # the input or intermediate whose storage it views
    contiguous: bool = True


@dataclass(slots=True)
class NumberVar:
    name: str
    kind: str  # "float" | "int"


_UNARY = ("sin", "cos", "tanh", "sigmoid", "abs", "neg", "relu")
_BINARY_METHOD = ("add", "sub", "mul")
_BINARY_TORCH = ("maximum", "minimum")
_REDUCE = ("sum", "mean", "amax")
_INPLACE_UNARY = ("relu_", "tanh_")
_INPLACE_BINARY = ("add_", "sub_", "mul_")


class Builder:
    """Builds one program statement by statement, tracking names, shapes and aliases."""

    def __init__(self, ch: Chooser, *, backward: bool):
        self.ch = ch
        self.backward = backward
        self.lines: list[str] = []
        self.tensors: list[TensorVar] = []
        self.numbers: list[NumberVar] = []
        self.last_read: TensorVar | None = None  # the tensor the latest island read
        self.late_views: list[TensorVar] = []  # views made right after an island (outside every region)
        self._count = 0

    # names -----------------------------------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def emit(self, line: str) -> None:
        self.lines.append(f"    {line}")

    def new_tensor(self, expr: str, shape: tuple[int, ...], *, view_of: TensorVar | None = None,
                   contiguous: bool = True) -> TensorVar:
        name = self._fresh("t")
        self.emit(f"{name} = {expr}")
        root = view_of.root if view_of is not None else name
        grad_leaf = view_of.grad_leaf if view_of is not None else False
        t = TensorVar(name, shape, grad_leaf, root, contiguous)
        self.tensors.append(t)
        return t

    def new_number(self, expr: str, kind: str) -> NumberVar:
        name = self._fresh("s" if kind == "float" else "n")
        self.emit(f"{name} = {expr}")
        n = NumberVar(name, kind)
        self.numbers.append(n)
        return n

    # operands -------------------------------------------------------------------------------------
    def pick_tensor(self, pred: Callable[[TensorVar], bool] = lambda t: True) -> TensorVar | None:
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

    def broadcast_partner(self, a: TensorVar, *, tensor_only: bool = False) -> str:
        """An operand that broadcasts to ``a``'s shape: same shape, a suffix shape, a 0-d tensor or a float."""
        same = [t for t in self.tensors if t.shape == a.shape]
        suffix = [t for t in self.tensors if 0 < len(t.shape) < len(a.shape) and t.shape == a.shape[-len(t.shape):]]
        scalar = [t for t in self.tensors if t.shape == ()]
        kinds = [k for k, ok in (("same", same), ("suffix", suffix), ("scalar", scalar), ("float", not tensor_only))
                 if ok]
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
        shape = (tuple(1 if i == dim else d for i, d in enumerate(a.shape)) if keep
                 else a.shape[:dim] + a.shape[dim + 1:])
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

    def view(self, a: TensorVar | None = None) -> bool:
        """A view or reshape of ``a`` (or of a tensor picked here)."""
        a = a or self.pick_tensor(lambda t: t.shape != ())
        if a is None or a.shape == ():
            return False
        expr, shape, is_view, contiguous = _view_expr(self.ch, a)
        self.new_tensor(expr, shape, view_of=a if is_view else None, contiguous=contiguous)
        return True

    def late_view(self) -> bool:
        """A view, right after an island, of a tensor a region made: made outside every region.

        Such a view of a region's output lies in that graph's memory; the program may return it, or a
        later op may read it (and save it for the backward).
        """
        made = [t for t in self.tensors if not t.name.startswith("x") and t.shape != ()]
        if not made:
            return False
        a = made[-1] if self.ch.boolean(0.5) else self.ch.choice(made)
        self.view(a)
        self.late_views.append(self.tensors[-1])
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

    # the return -------------------------------------------------------------------------------------
    def outputs(self) -> list[str]:
        """The returned expressions: the last tensor, then others, views made after islands first.

        Some returned tensors alias each other or an input: the same tensor twice, a view of a
        returned tensor (``t5, t5.t()``), an input itself or a view of one (``x0[1:]``).
        """
        ch = self.ch
        made = [t for t in self.tensors if not t.name.startswith("x")]
        outputs = [made[-1].name] if made else [self.tensors[-1].name]
        for v in self.late_views:
            if v.name not in outputs and ch.boolean(0.6):
                outputs.append(v.name)
        others = [v.name for v in made[:-1]] + [v.name for v in self.numbers]
        for _ in range(ch.integer(0, 3)):
            if others:
                name = ch.choice(others)
                if name not in outputs:
                    outputs.append(name)
        if ch.boolean(0.3):
            tensors = {t.name: t for t in self.tensors}
            how = ch.choice(("twice", "view of an output", "input", "view of an input"))
            returned = [tensors[n] for n in outputs if n in tensors and tensors[n].shape != ()]
            inputs = [t for t in self.tensors if t.name.startswith("x") and t.shape != ()]
            if how == "twice":
                outputs.append(ch.choice(outputs))
            elif how == "view of an output" and returned:
                outputs.append(_view_expr(ch, ch.choice(returned))[0])
            elif how == "input" and inputs:
                outputs.append(ch.choice(inputs).name)
            elif inputs:
                outputs.append(_view_expr(ch, ch.choice(inputs))[0])
        return outputs


def _view_expr(ch: Chooser, a: TensorVar) -> tuple[str, tuple[int, ...], bool, bool]:
    """A view or reshape of ``a``: (expression, shape, whether it views ``a``, whether it is contiguous)."""
    numel = 1
    for d in a.shape:
        numel *= d
    # NOTE: slice only dimensions of 4 or more, so no tensor ever gets an empty dimension
    sliceable = [d for d in range(min(len(a.shape), 2)) if a.shape[d] >= 4]
    forms = ["reshape", "flatten", "unsqueeze"] + ["slice"] * bool(sliceable) + ["t"] * (len(a.shape) == 2)
    forms += ["view"] * a.contiguous
    form = ch.choice(forms)
    if form in ("reshape", "view"):
        shape = ch.choice(_factorizations(numel))
        arg = ", ".join(str(d) for d in shape) if len(shape) > 1 else "-1"
        return f"{a.name}.{form}({arg})", shape, form == "view" or a.contiguous, True
    if form == "flatten":
        return f"{a.name}.flatten()", (numel,), a.contiguous, True
    if form == "unsqueeze":
        dim = ch.integer(0, len(a.shape))
        return f"{a.name}.unsqueeze({dim})", a.shape[:dim] + (1,) + a.shape[dim:], True, a.contiguous
    if form == "slice":
        start = ch.integer(1, 2)
        if ch.choice(sliceable) == 0:
            return f"{a.name}[{start}:]", (a.shape[0] - start,) + a.shape[1:], True, a.contiguous
        return f"{a.name}[:, {start}:]", (a.shape[0], a.shape[1] - start) + a.shape[2:], True, False
    return f"{a.name}.t()", (a.shape[1], a.shape[0]), True, False


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
WEIGHTED_KINDS = tuple(k for k, w in _KINDS for _ in range(w))
