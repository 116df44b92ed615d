"""PyTorch's random ops that thunder runs as opaque calls made thunder's own, so that their gradients are those of the
random numbers their outputs drew: one change to the tables by which thunder's interpreter maps torch functions to
thunder symbols (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

thunder 0.2.6 runs some 700 torch functions it has no rule for as opaque calls ("automatic registration",
``thunder.torch.register_default_torch_op``) and differentiates one by calling it again in the backward
(``torch.autograd.functional.vjp``). A function that draws random numbers draws new ones in that second call, so its
gradients were those of another mask than its output's, silently: ``nn.Dropout1d/2d/3d``, ``nn.AlphaDropout``,
``nn.FeatureAlphaDropout``, ``F.gumbel_softmax``, ``F.fractional_max_pool2d/3d``. `install`:

- makes the feature and alpha dropouts (``torch.feature_dropout``, ``torch.alpha_dropout``,
  ``torch.feature_alpha_dropout``, ``torch.dropout``, ``torch.native_dropout``) thunder's own ops, as ATen's
  ``Dropout.cpp`` defines them, with a mask drawn by thunder's ``uniform`` that the backward keeps, as thunder's
  ``F.dropout`` does; PyTorch's Python wrappers (``F.dropout2d`` and the like, with their checks of shape) are traced
  through to them;
- builds ``F.gumbel_softmax`` from thunder's ops;
- refuses to differentiate ``F.fractional_max_pool2d``/``3d``, with `REFUSAL` (its windows are drawn at random, and
  samples handed to the opaque call would be differentiated too, which torch refuses);
- adds the random fills thunder 0.2.6 lacks: ``Tensor.bernoulli_(p)`` (torchvision's ``StochasticDepth``, timm's
  ``DropPath``), ``Tensor.uniform_``, ``Tensor.normal_`` and ``torch.bernoulli(x, p)``.

``F.multi_head_attention_forward``, whose dropout was drawn twice so too, is traced through (`attention`).
"""

from __future__ import annotations

import math
from typing import Any

from .patches import ProcessPatch, auto_registered, composite_symbol, put, restore_table, swap_table

__all__ = ["install", "uninstall", "installed", "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
           "gumbel_softmax"]

#: ATen's SELU constant for the alpha dropouts (``aten/src/ATen/native/Dropout.cpp``)
_ALPHA = 1.7580993408473766


def _dropout(a: Any, p: Any, train: Any, *, feature: bool, alpha: bool) -> Any:
    """ATen's ``_dropout_impl``: ``a`` unchanged where it keeps everything, else ``a`` times a mask of keeps drawn with
    probability ``1 - p`` (one per sample and channel for the feature dropouts), scaled to keep the mean (and, for
    the alpha dropouts, shifted to keep the mean and variance of SELU's outputs)."""
    import thunder.torch as ltorch
    from thunder.core import utils

    utils.check(0 <= p <= 1, lambda: f"dropout probability has to be between 0 and 1, but got {p}")
    if p == 0 or not train or a.numel == 0:
        return a
    if p == 1:
        return a * 0.0
    if feature:
        utils.check(a.ndim >= 2, lambda: "Feature dropout requires at least 2 dimensions in the input")
    shape = (a.shape[0], a.shape[1]) + (1,) * (a.ndim - 2) if feature else tuple(a.shape)
    noise = ltorch.to(ltorch.uniform(shape, 0.0, 1.0, device=a.device, dtype=a.dtype) < 1 - p, a.dtype)
    if not alpha:
        return a * (noise / (1 - p))
    scale = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
    shift = (noise - 1) * (_ALPHA * scale) + _ALPHA * scale * p
    return a * (noise * scale) + shift


def feature_dropout(a: Any, p: Any, train: Any) -> Any:
    """``torch.feature_dropout`` (``F.dropout1d/2d/3d``): whole channels zeroed."""
    return _dropout(a, p, train, feature=True, alpha=False)


def alpha_dropout(a: Any, p: Any, train: Any) -> Any:
    """``torch.alpha_dropout`` (``F.alpha_dropout``, ``nn.AlphaDropout``)."""
    return _dropout(a, p, train, feature=False, alpha=True)


def feature_alpha_dropout(a: Any, p: Any, train: Any) -> Any:
    """``torch.feature_alpha_dropout`` (``F.feature_alpha_dropout``, ``nn.FeatureAlphaDropout``)."""
    return _dropout(a, p, train, feature=True, alpha=True)


def _plain_dropout(a: Any, p: Any, train: Any) -> Any:
    """``torch.dropout``: thunder's ``F.dropout``."""
    import thunder.torch as ltorch

    return ltorch.dropout(a, p, train)


def _native_dropout(a: Any, p: Any, train: Any) -> Any:
    """``torch.native_dropout``: the output and the boolean mask of what it kept (all kept out of training)."""
    import thunder.torch as ltorch
    import torch

    if not train or p == 0:
        return a * 1, ltorch.full_like(a, True, dtype=torch.bool)
    keep = ltorch.uniform(tuple(a.shape), 0.0, 1.0, device=a.device, dtype=a.dtype) < 1 - p
    return a * keep * (0.0 if p == 1 else 1.0 / (1 - p)), keep


def gumbel_softmax(logits: Any, tau: Any = 1.0, hard: bool = False, eps: Any = 1e-10, dim: int = -1) -> Any:
    """``F.gumbel_softmax`` as PyTorch computes it: a softmax of the logits plus Gumbel noise over ``tau``; with
    ``hard``, the one-hot of its largest entry, whose gradient is the softmax's. The noise is ``-log(E)`` with ``E``
    exponential, drawn as ``-log(U)`` from thunder's ``uniform`` (``U`` in [0, 1): never ``E = 0``)."""
    import thunder.torch as ltorch

    noise = -ltorch.log(-ltorch.log(ltorch.uniform_like(logits, 0.0, 1.0)))
    soft = ltorch.softmax((logits + noise) / tau, dim)
    if not hard:
        return soft
    index = ltorch.argmax(soft, dim, keepdim=True)
    one_hot = ltorch.scatter(ltorch.zeros_like(logits), dim, index, 1.0)
    return one_hot - ltorch.detach(soft) + soft


def _draw(a: Any, p: Any) -> Any:
    """Bernoulli draws of probability ``p`` (a number, or a tensor that broadcasts to ``a``) in ``a``'s shape and
    dtype."""
    import thunder.torch as ltorch
    import torch
    from thunder.core import dtypes

    dtype = a.dtype if dtypes.is_float_dtype(a.dtype) else torch.float32
    return ltorch.to(ltorch.uniform(tuple(a.shape), 0.0, 1.0, device=a.device, dtype=dtype) < p, a.dtype)


def bernoulli(a: Any, p: Any = None, *, generator: Any = None) -> Any:
    """``torch.bernoulli(probabilities)`` (thunder's own) and ``torch.bernoulli(a, p)``: draws of probability ``p``
    in ``a``'s shape."""
    import thunder.torch as ltorch
    from thunder.core import utils

    if p is None:
        return ltorch.bernoulli(a, generator=generator)
    utils.check(generator is None, lambda: "bernoulli: a generator is not supported", NotImplementedError)
    return _draw(a, p)


def bernoulli_(a: Any, p: Any = 0.5, *, generator: Any = None) -> Any:
    """``Tensor.bernoulli_(p)`` (torchvision's ``StochasticDepth``, timm's ``DropPath``): ``a`` filled with draws of
    probability ``p``."""
    import thunder.torch as ltorch
    from thunder.core import utils

    utils.check(generator is None, lambda: "bernoulli_: a generator is not supported", NotImplementedError)
    return ltorch._copy_(a, _draw(a, p))


def uniform_(a: Any, low: Any = 0.0, high: Any = 1.0, *, generator: Any = None) -> Any:
    """``Tensor.uniform_(low, high)``: ``a`` filled with uniform draws."""
    import thunder.torch as ltorch
    from thunder.core import utils

    utils.check(generator is None, lambda: "uniform_: a generator is not supported", NotImplementedError)
    return ltorch._copy_(a, ltorch.uniform_like(a, low, high))


def normal_(a: Any, mean: Any = 0.0, std: Any = 1.0, *, generator: Any = None) -> Any:
    """``Tensor.normal_(mean, std)``: ``a`` filled with normal draws."""
    import thunder.torch as ltorch
    from thunder.core import utils

    utils.check(generator is None, lambda: "normal_: a generator is not supported", NotImplementedError)
    return ltorch._copy_(a, ltorch.randn_like(a) * std + mean)


#: What a differentiated random opaque call raises (`_refusing`): `thunder_nb.diagnosis.failures.LIMITS`
#: "random-opaque-grad" reads it.
REFUSAL = ("{name} draws at random, and thunder 0.2.6 differentiates it by calling it again, which draws anew: its "
           "gradients would not be its output's")


def _refusing(name: str) -> Any:
    """An augmented forward (what thunder's grad transform calls for an op it differentiates) that raises
    `REFUSAL`: where thunder differentiates ``name``, and not where nothing needs its gradient."""

    def augmented_forward(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(REFUSAL.format(name=name))

    return augmented_forward


def _methods() -> dict[str, Any]:
    """{a tensor method thunder 0.2.6 has not, or has in part: the symbol it traces to now}."""
    return {"bernoulli_": composite_symbol("bernoulli_", bernoulli_, in_place=True),
            "uniform_": composite_symbol("uniform_", uniform_, in_place=True),
            "normal_": composite_symbol("normal_", normal_, in_place=True),
            "bernoulli": composite_symbol("bernoulli", bernoulli)}


def _replacements() -> tuple[dict[Any, Any], list[Any], list[Any]]:
    """({torch function: the symbol thunder traces it to now}, [the torch functions traced through their Python],
    [the torch functions thunder refuses to differentiate])."""
    import torch
    import torch.nn.functional as F

    own = {torch.feature_dropout: composite_symbol("feature_dropout", feature_dropout),
           torch.alpha_dropout: composite_symbol("alpha_dropout", alpha_dropout),
           torch.feature_alpha_dropout: composite_symbol("feature_alpha_dropout", feature_alpha_dropout),
           torch.dropout: composite_symbol("dropout", _plain_dropout),
           torch.native_dropout: composite_symbol("native_dropout", _native_dropout),
           F.gumbel_softmax: composite_symbol("gumbel_softmax", gumbel_softmax)}
    through = [F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout]
    refused = [F.fractional_max_pool2d, F.fractional_max_pool2d_with_indices, F.fractional_max_pool3d,
               F.fractional_max_pool3d_with_indices]
    return own, through, refused


def _apply() -> dict[str, Any] | None:
    import torch
    from thunder.core import jit_ext
    from thunder.core.transforms import augmented_forward_impls
    from thunder.torch import _torch_to_thunder_function_map as table
    from thunder.torch.langctx import _method_name_to_fn_map as method_table

    lookasides = getattr(jit_ext, "_general_jit_lookaside_map", None)
    if not isinstance(lookasides, dict) or not hasattr(jit_ext, "ensure_recursive_proxies"):
        return None
    own, through, refused = _replacements()
    if not all(auto_registered(table.get(fn)) and fn in lookasides for fn in [*own, *through, *refused]):
        return None  # NOTE: not the thunder this was written for: thunder's own stays
    if not all(table[fn].id in augmented_forward_impls for fn in refused):
        return None
    methods = _methods()
    if any(name in method_table for name in methods if name != "bernoulli") or getattr(
            table.get(torch.bernoulli), "id", None) != "torch.bernoulli":
        return None
    for name, symbol in methods.items():  # NOTE: x.bernoulli_(p) through the method table, torch.bernoulli(x, p) below
        own[getattr(torch.Tensor, name)] = symbol
    own[torch.bernoulli] = methods["bernoulli"]
    saved_methods = {name: method_table.get(name) for name in methods}
    method_table.update(methods)
    forwards = {table[fn].id: augmented_forward_impls[table[fn].id] for fn in refused}
    for fn in refused:
        augmented_forward_impls[table[fn].id] = _refusing(f"F.{fn.__name__}")
    # NOTE: through: no entry, so the interpreter runs PyTorch's Python function
    saved = swap_table({**own, **dict.fromkeys(through)})
    return {"saved": saved, "forwards": forwards, "methods": saved_methods}


def _restore(originals: dict[str, Any]) -> None:
    from thunder.core.transforms import augmented_forward_impls
    from thunder.torch.langctx import _method_name_to_fn_map as method_table

    augmented_forward_impls.update(originals["forwards"])
    restore_table(originals["saved"])
    for name, method in originals["methods"].items():
        put(method_table, name, method)


#: thunder's tables changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
