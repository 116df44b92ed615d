"""thunder's backward made to reduce a gradient to its 0-dim tensor's shape, as eager's autograd does, and to give
``torch.clamp`` and ``torch.sigmoid`` eager's gradients: changes to ``thunder.core.transforms`` (lightning-thunder
0.2.6), installed once per process by `install` where `thunder_nb.internals.supported` (from
`thunder_nb.internals.check_versions`, which every entry point calls).

thunder treats a 0-dim tensor on the CPU as a number (``treat_cpu_scalar_tensors_as_numbers`` in its broadcasting): a
full reduction's result on the CPU (``x.sum()``, ``x.mean()``, ``x.amax()``, ``x.norm()``) meets a larger tensor in an
elementwise op with no broadcast in the trace, and thunder's rules for the elementwise prims (``add``, ``sub``,
``mul``, ``div``, ... in ``thunder.core.transforms``) hand that operand the larger gradient as it is. Then
``(x * 2 + x.sum()).sum()`` on the CPU gets a wrong gradient with no error (3 for each element of ``x`` where eager
gives 10: the sum's rule spreads each element's 1 back instead of their total), and ``x - x.mean()``, ``x * x.amax()``
and ``x / x.norm()`` fail in the backward. On a GPU the 0-dim result is a CUDA tensor, which thunder broadcasts in the
trace, and its broadcast rule sums the gradient: right there (from thunder's source). A 0-dim *input* is right too:
PyTorch's autograd engine reduces the gradients thunder returns for its inputs. Eager's autograd sums every gradient
to its tensor's shape (``sum_to``). `install` makes the ``put_grad`` those rules call do the same for a 0-dim tensor:
a gradient of more dimensions is summed first. Every ``thunder.jit`` traced in the process after it, thunder_nb's or
not (the magic's original side and the thunder-without-graphs references too), gets eager's gradient; one traced
before keeps thunder's. `uninstall` puts thunder's own back (for the test that shows the difference). Not covered: the
few binary rules thunder writes in its older form, a forward and a backward function whose gradients its autodiff puts
itself (``atan2``, ``fmod``, ``zeta``): ``torch.atan2(x, x.sum())`` keeps thunder's wrong gradient
(tests/test_grads.py holds it as an expected failure).

`install` also gives ``torch.clamp`` eager's gradient (`_clamp_grad`, registered as its rule: thunder 0.2.6 has none
and differentiates its decomposition ``where(a < max, a, max)``, which hands the gradient at a tie ``a == max`` to the
bound; eager's ``clamp_backward`` hands it to ``a``: ``x.clamp(max=x.max().item())`` got 0 where eager gets 1, the CPU
fuzzer's program 12). Its forward runs ``torch.clamp`` itself, one kernel where the decomposition took four. And
``torch.sigmoid`` eager's (`_sigmoid_grad`, from its output: thunder's gradient of ``1 / (1 + exp(-a))`` is NaN below
about -88, program 440; `thunder_nb.cudagraph.native_kernels.native_sigmoid`, where thunder_nb.jit names no fusion
executor, runs eager's kernels themselves and takes precedence). And ``prims.flip`` and ``prims.index_add`` a
gradient at all (`_flip_grad`, `_index_add_grad`: thunder 0.2.6 failed the backward of any ``torch.flip`` and
``torch.index_add``). And ``torch.index_put`` and ``prims.prod`` eager's (`_index_put_grad`, `_prod_grad`: thunder's
own rules lost the gradient of the values written, and gave NaN at a zero factor, silently); ``prims.round`` and
``prims.trunc`` eager's zero and ``prims.minimum`` eager's (`_zero_grad`, `_minimum_grad`: none in
thunder 0.2.6). `_REPLACED` puts eager's rule in place of thunder's ``prims.pow`` (NaN at a zero base, `_pow_grad`);
and ``hardtanh``, ``relu6``, ``hardsigmoid`` and ``hardswish`` get eager's gradient at their bounds (`_hard_grad`);
``torch.diagonal`` a rule of its own, so that it runs as PyTorch's view (`_diagonal_grad`: a write through it was lost).
"""

from __future__ import annotations

from typing import Any

from .patches import ProcessPatch

__all__ = ["install", "uninstall", "installed"]


def _put_grad_summed_to_0_dim(put_grad: Any) -> Any:
    """``put_grad``, with the gradient of a 0-dim tensor summed to its shape first where it has another."""
    import thunder.torch as ltorch
    from thunder.core.proxies import TensorProxy

    def summed_put_grad(a: Any, g: Any) -> Any:
        if isinstance(a, TensorProxy) and isinstance(g, TensorProxy) and a.ndim == 0 and g.ndim > 0:
            g = ltorch.sum(g)
        return put_grad(a, g)

    return summed_put_grad


def _clamp_grad(a: Any, min: Any = None, max: Any = None) -> Any:
    """``torch.clamp``'s gradient as eager's autograd gives it (``clamp_backward``): ``a`` gets the gradient where
    ``min <= a <= max`` (a tie included, NaN excluded), a tensor bound where ``a`` passed it. thunder differentiates its
    decomposition ``where(a < max, a, max)``, which hands a tie's gradient to the bound instead."""
    import thunder.torch as ltorch
    from thunder.core import transforms
    from thunder.core.proxies import TensorProxy

    fwd = ltorch.clamp(a, min, max)
    g = transforms.get_grad(fwd)
    kept = None
    for bound, keep, past in ((min, ltorch.ge, ltorch.lt), (max, ltorch.le, ltorch.gt)):
        if bound is None:
            continue
        inside = keep(a, bound)
        kept = inside if kept is None else ltorch.logical_and(kept, inside)
        if isinstance(bound, TensorProxy):
            transforms.put_grad(bound, transforms.sum_to(ltorch.where(past(a, bound), g, 0), bound.shape))
    transforms.put_grad(a, ltorch.where(kept, g, 0))
    return fwd


def _sigmoid_grad(a: Any) -> Any:
    """``torch.sigmoid``'s gradient from its output, as eager's ``sigmoid_backward``: ``g * (1 - y) * y``. thunder
    differentiates its decomposition ``1 / (1 + exp(-a))`` op by op, whose gradient is ``inf / inf = NaN`` below about
    -88 in float32, where eager's is 0."""
    import thunder.torch as ltorch
    from thunder.core import transforms

    fwd = ltorch.sigmoid(a)
    transforms.put_grad(a, transforms.get_grad(fwd) * (1 - fwd) * fwd)
    return fwd


def _flip_grad(a: Any, dims: Any) -> Any:
    """``prims.flip``'s gradient, the gradient flipped back along the same dimensions (eager's ``flip_backward``).
    thunder 0.2.6 has none, and a training step failed at any ``torch.flip`` (``x.flip(0)``), even of a tensor that
    needs no gradient: "Failed to find a gradient transform for bound symbol ... prims.flip"."""
    import thunder.core.prims as prims
    from thunder.core import transforms

    fwd = prims.flip(a, dims)
    transforms.put_grad(a, prims.flip(transforms.get_grad(fwd), dims))
    return fwd


def _index_add_grad(a: Any, index: Any, value: Any, dim: int) -> Any:
    """``prims.index_add``'s gradients, as eager's autograd gives them: ``a`` gets the gradient as it is, ``value``
    (the source) the gradient's rows at ``index`` along ``dim``. thunder 0.2.6 has none: a step with
    ``torch.index_add`` (a graph network's sum of messages into nodes) failed its backward."""
    import thunder.core.prims as prims
    from thunder.core import transforms, utils

    fwd = prims.index_add(a, index, value, dim)
    g = transforms.get_grad(fwd)
    transforms.put_grad(a, g)
    rows = index if index.ndim == 1 else prims.reshape(index, (1,))
    taken = prims.take(g, rows, utils.canonicalize_dim(a.ndim, dim))
    transforms.put_grad(value, taken if tuple(taken.shape) == tuple(value.shape) else prims.reshape(taken, value.shape))
    return fwd


def _index_put_grad(a: Any, indices: Any, values: Any, accumulate: bool = False) -> Any:
    """``torch.index_put``'s gradients, as eager's autograd gives them: ``a`` gets the gradient, zero at the indexed
    places unless ``accumulate``; ``values`` the gradient at the indexed places, summed to its shape (a broadcast
    value's). thunder 0.2.6's own rule (its older form) lost the one of ``values``: ``x.index_put((i,), x[:2] * 2)``
    trained on another gradient, silently, and a tensor only written into ``a`` got no gradient at all."""
    import thunder.torch as ltorch
    from thunder.core import transforms

    fwd = ltorch.index_put(a, indices, values, accumulate)
    g = transforms.get_grad(fwd)
    transforms.put_grad(a, g if accumulate else ltorch.index_put(g, indices, ltorch.zeros_like(values), False))
    taken = ltorch.getitem(g, tuple(indices))
    transforms.put_grad(values, transforms.sum_to(taken, values.shape))
    return fwd


def _prod_grad(a: Any, dims: Any) -> Any:
    """``prims.prod``'s gradient, as eager's ``prod_backward``: each element gets the product of the others, ``g *
    (result / a)`` where the reduced slice holds no zero, the product of the others where it holds one zero (at that
    element; 0 at the rest), 0 where it holds more. thunder 0.2.6's rule is ``result * g / a`` everywhere, ``0 / 0``
    at a zero: ``(x * mask).prod(1)`` trained on NaN gradients, silently."""
    import thunder.core.prims as prims
    import thunder.torch as ltorch
    from thunder.core import transforms

    fwd = prims.prod(a, dims)

    def spread(t: Any) -> Any:  # a reduced tensor broadcast back to a's shape
        return transforms.restore_reduced_dims(t, dims, a.shape)

    g = spread(transforms.get_grad(fwd))
    zero = ltorch.eq(a, 0)
    zeros = spread(ltorch.sum(zero, dims))
    others = spread(prims.prod(ltorch.where(zero, 1, a), dims))
    lone = ltorch.where(ltorch.logical_and(zero, ltorch.eq(zeros, 1)), g * others, 0)
    transforms.put_grad(a, ltorch.where(ltorch.eq(zeros, 0), g * (spread(fwd) / a), lone))
    return fwd


def _zero_grad(name: str) -> Any:
    """The rule of ``prims.<name>`` (``round``, ``trunc``): eager's gradient, zero. thunder 0.2.6 has none, and a step
    failed at any ``torch.round`` of a tensor that needs a gradient ("Failed to find a gradient transform ...
    prims.round"), even one whose result is detached after: the straight-through estimator ``h + (torch.round(h) -
    h).detach()`` of quantization-aware training and VQ-VAEs; so did ``torch.trunc`` and ``torch.div(a, b,
    rounding_mode="trunc")``."""

    def rule(a: Any) -> Any:
        import thunder.core.prims as prims
        import thunder.torch as ltorch
        from thunder.core import transforms

        fwd = getattr(prims, name)(a)
        transforms.put_grad(a, ltorch.zeros_like(transforms.get_grad(fwd)))  # NOTE: of the gradient: see `_pow_grad`
        return fwd

    return rule


def _minimum_grad(a: Any, b: Any) -> Any:
    """``prims.minimum``'s gradients, eager's: the smaller operand gets the gradient, a tie half each (as thunder's own
    ``maximum`` rule). thunder 0.2.6 has none: ``torch.minimum(x, t)`` failed the backward."""
    import thunder.core.prims as prims
    from thunder.core import transforms

    fwd = prims.minimum(a, b)
    g = transforms.get_grad(fwd)
    shared = prims.where(a == b, g / 2, g)
    transforms.put_grad(a, prims.where(b < a, 0.0, shared))
    transforms.put_grad(b, prims.where(a < b, 0.0, shared))
    return fwd


def _pow_grad(a: Any, b: Any) -> Any:
    """``prims.pow``'s gradients as eager's ``pow_backward_self`` / ``pow_backward_exponent``: the base's 0 where the
    exponent is 0, the exponent's 0 where the base is 0 and the exponent not negative, and in eager's order of
    operations. thunder 0.2.6's are ``0 * inf`` there: ``x ** 0`` at ``x == 0`` (polynomial features ``x **
    torch.arange(n)``) and a learnt exponent of a zero base trained on NaN, silently. A zero gradient is made from the
    incoming one (``zeros_like(g)``): a backward that reads no incoming gradient fails thunder's autograd function
    ("assert not args")."""
    import math

    import thunder.torch as ltorch
    from thunder.core import transforms
    from thunder.core.proxies import TensorProxy

    fwd = ltorch.pow(a, b)
    g = transforms.get_grad(fwd)
    if isinstance(a, TensorProxy):
        grad = ltorch.mul(g, ltorch.mul(b, ltorch.pow(a, ltorch.sub(b, 1))))
        if isinstance(b, TensorProxy):
            grad = ltorch.where(ltorch.eq(b, 0), 0, grad)
        transforms.put_grad(a, ltorch.zeros_like(g) if not isinstance(b, TensorProxy) and b == 0 else grad)
    if isinstance(b, TensorProxy):
        if isinstance(a, TensorProxy):
            zero = ltorch.logical_and(ltorch.eq(a, 0), ltorch.ge(b, 0))
            transforms.put_grad(b, ltorch.mul(g, ltorch.where(zero, 0, ltorch.mul(fwd, ltorch.log(a)))))
        elif a == 0:
            transforms.put_grad(b, ltorch.mul(g, ltorch.where(ltorch.ge(b, 0), 0, ltorch.mul(fwd, -math.inf))))
        else:
            transforms.put_grad(b, ltorch.mul(g, ltorch.mul(fwd, math.log(a))))
    return fwd


def _hard_grad(name: str, bounds: Any) -> Any:
    """The rule of thunder's ``name`` (``hardtanh``, ``relu6``, ``hardsigmoid``, ``hardswish``), a composite of
    ``clamp``: its forward as thunder's, its gradient as eager's kernel, which is 0 at the bounds themselves
    (`_clamp_grad` gives ``clamp`` eager's gradient, which keeps it there)."""

    def rule(a: Any, *args: Any, **kwargs: Any) -> Any:
        import thunder.torch as ltorch
        from thunder.core import transforms

        fwd = getattr(ltorch, name)(a, *args, **kwargs)  # NOTE: inplace=True too: thunder's own writes into a
        g = transforms.get_grad(fwd)
        low, high = bounds(*args, **kwargs)
        outside = ltorch.logical_or(ltorch.le(a, low), ltorch.ge(a, high))
        if name == "hardsigmoid":
            grad = ltorch.where(outside, 0, ltorch.true_divide(g, 6))
        elif name == "hardswish":  # NOTE: eager's: 0 at and below -3, the gradient at and above 3
            ramp = ltorch.mul(g, ltorch.add(ltorch.true_divide(a, 3), 0.5))
            grad = ltorch.where(ltorch.le(a, -3), 0, ltorch.where(ltorch.lt(a, 3), ramp, g))
        else:
            grad = ltorch.where(outside, 0, g)
        transforms.put_grad(a, grad)
        return fwd

    return rule


def _diagonal_grad(a: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    """``torch.diagonal``'s gradient, eager's ``diagonal_backward``: the gradient put on the diagonal of zeros. thunder
    0.2.6 has none and differentiates its decomposition, a gather (``index_select``) where eager's is a view: a write
    through ``h.diagonal()`` (``cov.diagonal().add_(eps)``) was lost from ``h``'s value and gradient, silently. With
    the rule, the diagonal runs as PyTorch's own, a view."""
    import thunder.torch as ltorch
    from thunder.core import transforms

    fwd = ltorch.diagonal(a, offset, dim1, dim2)
    g = transforms.get_grad(fwd)
    transforms.put_grad(a, ltorch.diagonal_scatter(ltorch.zeros_like(a), g, offset, dim1, dim2))
    return fwd


#: thunder's ops with no gradient rule of their own in 0.2.6 (or one that is wrong), given eager's
_RULES = {"torch.clamp": _clamp_grad, "torch.sigmoid": _sigmoid_grad, "torch.index_put": _index_put_grad,
          "torch.diagonal": _diagonal_grad,
          "torch.nn.functional.hardtanh": _hard_grad("hardtanh", lambda min_val=-1.0, max_val=1.0, inplace=False: (
              min_val, max_val)),
          "torch.relu6": _hard_grad("relu6", lambda inplace=False: (0.0, 6.0)),
          "torch.nn.functional.hardsigmoid": _hard_grad("hardsigmoid", lambda inplace=False: (-3.0, 3.0)),
          "torch.hardswish": _hard_grad("hardswish", lambda inplace=False: (-3.0, 3.0))}


def _lerp_grad(start: Any, end: Any, weight: Any) -> Any:
    """``prims.lerp``'s gradients, eager's ``lerp`` backward: ``start`` gets ``g * (1 - weight)``, ``end`` ``g *
    weight``, a tensor ``weight`` ``g * (end - start)``. thunder 0.2.6 has none ("Failed to find a gradient transform
    ... prims.lerp": a mixup of two activations, ``torch.lerp(a, b, lam)``)."""
    import thunder.torch as ltorch
    from thunder import clang
    from thunder.core import transforms
    from thunder.core.proxies import TensorProxy

    fwd = ltorch.lerp(start, end, weight)  # NOTE: torch's op (the torch executor runs no bare prims.lerp)
    g = transforms.get_grad(fwd)
    transforms.put_grad(start, clang.mul(g, clang.sub(1, weight)))
    transforms.put_grad(end, clang.mul(g, weight))
    if isinstance(weight, TensorProxy):
        transforms.put_grad(weight, clang.mul(g, clang.sub(end, start)))
    return fwd


def _remainder_grad(a: Any, b: Any) -> Any:
    """``prims.remainder``'s gradients, eager's: ``a`` gets the gradient as it is, a tensor ``b`` ``-g *
    floor(a / b)``. thunder 0.2.6 has none ("Failed to find a gradient transform ... prims.remainder": a periodic
    feature, ``torch.remainder(phase, 2 * pi)``)."""
    import thunder.torch as ltorch
    from thunder import clang
    from thunder.core import transforms
    from thunder.core.proxies import TensorProxy

    fwd = ltorch.remainder(a, b)  # NOTE: torch's op, as for lerp
    g = transforms.get_grad(fwd)
    if isinstance(a, TensorProxy):
        transforms.put_grad(a, g)
    if isinstance(b, TensorProxy):
        transforms.put_grad(b, clang.neg(clang.mul(g, clang.floor(clang.true_divide(a, b)))))
    return fwd


def _unfold_grad(a: Any, dim: int, size: int, step: int) -> Any:
    """``prims.unfold``'s gradient (``x.unfold(dim, size, step)``'s windows), eager's ``unfold_backward``: each
    window's gradient added back where the window lies, overlaps summed (an ``index_add`` of the windows' positions,
    made on the device). thunder 0.2.6 has none: a step with ``x.unfold`` (audio frames, image patches) failed."""
    import thunder.core.prims as prims
    import thunder.torch as ltorch
    from thunder.core import transforms, utils

    fwd = prims.unfold(a, dim, size, step)
    dim = utils.canonicalize_dim(a.ndim, dim)
    g = transforms.get_grad(fwd)  # NOTE: a's shape with dim holding the windows, and each window's size last
    windows = fwd.shape[dim]
    starts = ltorch.mul(ltorch.arange(windows, device=a.device), step)
    positions = ltorch.add(ltorch.unsqueeze(starts, 1), ltorch.unsqueeze(ltorch.arange(size, device=a.device), 0))
    spread = ltorch.movedim(g, -1, dim + 1)
    flat = ltorch.reshape(spread, (*a.shape[:dim], windows * size, *a.shape[dim + 1:]))
    transforms.put_grad(a, ltorch.index_add(ltorch.zeros_like(a), dim, ltorch.reshape(positions, (-1,)), flat))
    return fwd


#: thunder's primitives with none, by their ``thunder.core.prims.PrimIDs`` name
_PRIM_RULES = {"FLIP": _flip_grad, "INDEX_ADD": _index_add_grad, "LERP": _lerp_grad, "REMAINDER": _remainder_grad,
               "PROD": _prod_grad, "ROUND": _zero_grad("round"), "TRUNC": _zero_grad("trunc"), "MINIMUM": _minimum_grad,
               "UNFOLD": _unfold_grad}
#: thunder's primitives whose rule `install` replaces: {PrimIDs name: (the name of thunder's rule, eager's)}
_REPLACED = {"POW": ("_pow_grad", _pow_grad)}


def _rule_ids() -> dict[Any, Any]:
    """`_RULES` and `_PRIM_RULES`, keyed as ``thunder.core.transforms.register_grad`` takes them."""
    import thunder.core.prims as prims

    return {**_RULES, **{getattr(prims.PrimIDs, name): rule for name, rule in _PRIM_RULES.items()}}


def _replaced_ids() -> dict[Any, tuple[str, Any]]:
    """`_REPLACED`, keyed by ``PrimIDs``."""
    import thunder.core.prims as prims

    return {getattr(prims.PrimIDs, name): rules for name, rules in _REPLACED.items()}


def _apply() -> dict[str, Any] | None:
    """``thunder.core.transforms.put_grad`` made `_put_grad_summed_to_0_dim`, `_RULES` registered (thunder 0.2.6 has
    none for them) and `_REPLACED`'s rules put in place of thunder's; what was there (None: not the module this was
    written for, unchanged)."""
    from thunder.core import transforms

    put_grad, rules = getattr(transforms, "put_grad", None), getattr(transforms, "_grad_fn_map", None)
    if (not callable(put_grad) or not isinstance(rules, dict) or rules.keys() & _rule_ids().keys()
            or any(getattr(rules.get(op), "__wrapped__", None) is not getattr(transforms, own, None)
                   for op, (own, _) in _replaced_ids().items())):  # NOTE: register_grad wraps a rule in a langctx
        return None
    transforms.put_grad = _put_grad_summed_to_0_dim(put_grad)
    for op, rule in _rule_ids().items():
        transforms.register_grad(op, rule)
    replaced = {op: rules[op] for op in _replaced_ids()}
    for op, (_, rule) in _replaced_ids().items():
        transforms.register_grad(op, rule)
    return {"put_grad": put_grad, "replaced": replaced}


def _restore(originals: dict[str, Any]) -> None:
    from thunder.core import transforms

    transforms.put_grad = originals["put_grad"]
    for op in _rule_ids():
        transforms._grad_fn_map.pop(op, None)
    transforms._grad_fn_map.update(originals["replaced"])


#: thunder's backward changed as this module's docstring says, once per process (`thunder_nb.internals.patches`)
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
