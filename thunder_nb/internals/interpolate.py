"""``F.interpolate`` traced by thunder as ATen computes it, in every form of its nearest and linear modes: one change
to the symbol ``thunder.torch.interpolate`` (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

Where thunder differentiates it (training), thunder 0.2.6 computes ``bilinear`` and ``nearest-exact`` with its own
decomposition, which maps output to input with ``in_size / out_size`` where PyTorch takes ``1 / scale_factor``: with a
scale factor that does not divide the size (1.5, or 0.5 of an odd size) the outputs and gradients were other values,
silently (without a gradient thunder calls PyTorch's kernel, which is right). It also refused ``align_corners`` even
where it is False ("Thunder does not yet support 'align_corners'": a segmentation head's, and ``nn.Upsample(...,
align_corners=True)``, a U-Net's decoder), the ``linear`` and ``trilinear`` modes, and ``recompute_scale_factor=True``.
`install` computes these modes as ATen's ``UpSample.h`` does, one spatial dimension after another, in the kernels'
accumulation dtype: each output index's source coordinate (``scale * index`` with corners aligned, else ``scale *
(index + 0.5) - 0.5`` held at 0; the nearest modes ``floor(index * scale)`` and ``floor((index + 0.5) * scale)``, in
float), the input values there gathered and, for the linear modes, weighted; a dimension whose size a linear mode
keeps is left as it is, as ATen leaves it. thunder differentiates the gathers. ``bicubic``, ``area`` and ``antialias``
stay thunder's own (which says it cannot).
"""

from __future__ import annotations

import math
from typing import Any

from .patches import attribute_patch

__all__ = ["install", "uninstall", "installed"]

#: The linear modes and how many spatial dimensions each interpolates.
_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3}
#: The nearest modes (any number of spatial dimensions).
_NEAREST = ("nearest", "nearest-exact")


def _output_sizes(a: Any, size: Any, scale_factor: Any, recompute: Any) -> tuple[list[int], list[float | None]]:
    """(each spatial dimension's output size, the scale factor ATen is handed for it: None where it computes one)."""
    spatial = list(a.shape[2:])
    if size is not None:
        sizes = list(size) if isinstance(size, (list, tuple)) else [size] * len(spatial)
        return [int(s) for s in sizes], [None] * len(spatial)
    factors = list(scale_factor) if isinstance(scale_factor, (list, tuple)) else [scale_factor] * len(spatial)
    sizes = [int(math.floor(n * float(f))) for n, f in zip(spatial, factors)]
    return sizes, [None] * len(spatial) if recompute else [float(f) for f in factors]


def _scale(n_in: int, n_out: int, factor: float | None, align_corners: bool, acc: Any) -> Any:
    """ATen's ``area_pixel_compute_scale`` (``compute_scales_value`` for the nearest modes: ``align_corners`` False),
    in the kernel's accumulation dtype ``acc``."""
    import torch

    if align_corners:
        return torch.tensor(n_in - 1, dtype=acc) / (n_out - 1) if n_out > 1 else torch.tensor(0.0, dtype=acc)
    if factor is not None and factor > 0:
        return torch.tensor(1.0 / factor, dtype=acc)  # NOTE: divided in double, then rounded, as ATen
    return torch.tensor(n_in, dtype=acc) / n_out


def _sources(n_in: int, n_out: int, factor: float | None, mode: str, align_corners: bool,
             acc: Any) -> tuple[list[int], list[int], list[float]]:
    """For each output index (ATen's ``UpSample.h``, in ``acc``): (the input index at or below its source coordinate,
    the one above it, the weight of the one above: 0 for the nearest modes)."""
    import torch

    acc = torch.float32 if mode in _NEAREST else acc  # NOTE: ATen's nearest kernels compute in float for every dtype
    index = torch.arange(n_out, dtype=acc)
    scale = _scale(n_in, n_out, factor, align_corners and mode not in _NEAREST, acc)
    if mode in _NEAREST:
        if mode == "nearest" and n_out == n_in:
            below = index.long()
        elif mode == "nearest" and n_out == 2 * n_in:
            below = index.long() // 2
        else:
            below = torch.floor((index + 0.5) * scale if mode == "nearest-exact" else index * scale).long()
        below = below.clamp(max=n_in - 1).tolist()
        return below, below, [0.0] * n_out
    source = scale * index if align_corners else (scale * (index + 0.5) - 0.5).clamp(min=0)
    low = source.long().clamp(max=n_in - 1)  # NOTE: a truncation of a non-negative coordinate, as the kernel's cast
    weight = (source - low.to(acc)).clamp(0, 1)
    high = torch.where(low < n_in - 1, low + 1, low)
    return low.tolist(), high.tolist(), weight.tolist()


def _resampled(a: Any, size: Any, scale_factor: Any, mode: str, align_corners: bool, recompute: Any) -> Any:
    """``a`` resampled along each spatial dimension, as ATen's upsample kernels: gathered, and for the linear modes
    weighted (in float32 for a low-precision ``a``, as their accumulation)."""
    import thunder.torch as ltorch
    import torch
    from thunder.core import dtypes

    sizes, factors = _output_sizes(a, size, scale_factor, recompute)
    acc = torch.float64 if dtypes.to_torch_dtype(a.dtype) == torch.float64 else torch.float32
    low_precision = mode not in _NEAREST and dtypes.is_low_precision_dtype(a.dtype)
    out = ltorch.to(a, torch.float32) if low_precision else a
    for k, (n_out, factor) in enumerate(zip(sizes, factors)):
        dim = 2 + k
        if n_out == a.shape[dim] and mode not in _NEAREST:
            continue  # NOTE: ATen's linear kernels leave a dimension of the same size as it is, whatever its factor
        below, above, weights = _sources(a.shape[dim], n_out, factor, mode, bool(align_corners), acc)
        low = ltorch.index_select(out, dim, ltorch.tensor(below, device=a.device, dtype=torch.int64))
        if mode in _NEAREST:
            out = low
            continue
        shape = [1] * a.ndim
        shape[dim] = n_out
        weight = ltorch.reshape(ltorch.tensor(weights, device=a.device, dtype=out.dtype), shape)
        high = ltorch.index_select(out, dim, ltorch.tensor(above, device=a.device, dtype=torch.int64))
        out = low * (1 - weight) + high * weight
    return ltorch.to(out, a.dtype) if low_precision else out


def _interpolating(original: Any) -> Any:
    def interpolate(a: Any, /, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                    align_corners: Any = None, recompute_scale_factor: Any = None, antialias: bool = False) -> Any:
        """``F.interpolate``: its nearest and linear modes as this module's docstring says; anything else by thunder's
        own."""
        if (((mode in _LINEAR and a.ndim == _LINEAR[mode] + 2) or (mode in _NEAREST and align_corners is None))
                and not antialias and (size is None) != (scale_factor is None) and a.ndim >= 3):
            return _resampled(a, size, scale_factor, mode, align_corners, recompute_scale_factor)
        return original(a, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)

    return interpolate


def _symbol() -> Any:
    import thunder.torch as ltorch

    return ltorch.interpolate


#: thunder's interpolate symbol changed as this module's docstring says, once per process
_patch = attribute_patch(_symbol, "meta", _interpolating,
                         expected=lambda meta: callable(meta) and getattr(meta, "__name__", None) == "interpolate")
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
