"""Max and average pooling with ``ceil_mode=True`` and ``count_include_pad=False`` traced by thunder (torchvision's
GoogLeNet, Inception v3 and SqueezeNet pool so): one change to the tables by which thunder's interpreter maps torch
functions to thunder symbols (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

thunder 0.2.6 refuses both ("{ceil_mode=} is not supported"), and its max pooling symbols take ``return_indices``
before ``ceil_mode``, where PyTorch's functions take ``ceil_mode`` first (``torch.max_pool2d(x, 3, 2, 1, 1, True)``
asked it for indices). `install` traces ``F.max_pool1d/2d/3d``, ``torch.max_pool1d/2d/3d``, ``F.avg_pool1d/2d/3d`` and
``torch.avg_pool1d`` to symbols with PyTorch's signatures that call thunder's with every argument named.
A 1-d max pooling is a 2-d one of height 1, whose backward is ATen's kernel: thunder differentiated its own
decomposition of ``max_pool1d`` (a ``-inf`` pad and a one-hot convolution), whose gradient is NaN wherever a window
overlaps the padding (``nn.MaxPool1d(3, 2, padding=1)`` trained into NaN, silently).
PyTorch's ceil mode adds an output wherever a window
starts inside the input or its left padding; `install` pads the input on the right as far as those windows reach
(with -inf for max, 0 for average) and pools it with thunder's own floor-mode pooling. An average then divides each
window's sum as PyTorch does (``aten/src/ATen/native/AvgPoolKernel.cpp``): by the window clipped at the padded input
(the ceil region not counted), or with ``count_include_pad=False`` by the input elements it covers, or by
``divisor_override``.
"""

from __future__ import annotations

import math
from typing import Any

from .patches import composite_symbol, table_patch

__all__ = ["install", "uninstall", "installed"]


def _per_dim(value: Any, dims: int) -> list[int]:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * dims


def _outputs(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """PyTorch's ``pooling_output_shape``: the number of windows along a dimension of ``n``."""
    span = n + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n + p:  # NOTE: the last window must start inside the input or its left padding
        out -= 1
    return out


def _geometry(a: Any, dims: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
              ceil: bool) -> tuple[list[int], ...]:
    """(kernel, stride, padding, dilation, windows, right padding beyond ``padding``) per spatial dimension."""
    k = _per_dim(kernel_size, dims)
    s = _per_dim(stride if stride not in (None, (), []) else kernel_size, dims)
    p, d = _per_dim(padding, dims), _per_dim(dilation, dims)
    n = list(a.shape[-dims:])
    out = [_outputs(*args, ceil) for args in zip(n, k, s, p, d)]
    extra = [max(0, (o - 1) * si + di * (ki - 1) + 1 - (ni + 2 * pi))
             for o, si, di, ki, ni, pi in zip(out, s, d, k, n, p)]
    return k, s, p, d, out, extra


def _padded(a: Any, dims: int, left: list[int], right: list[int], value: float) -> Any:
    """``a`` padded by ``left`` and ``right`` along its last ``dims`` dimensions with ``value``."""
    import thunder.torch as ltorch

    widths = []
    for lo, hi in zip(reversed(left), reversed(right)):
        widths += [lo, hi]
    return ltorch.pad(a, widths, mode="constant", value=value) if any(widths) else a


def _max_pooling(dims: int) -> Any:
    def max_pool(a: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 ceil_mode: bool = False, return_indices: bool = False) -> Any:
        """PyTorch's max pooling: ceil mode as floor mode on the input padded on the right with -inf."""
        import thunder.torch as ltorch

        if dims == 1 and not return_indices:  # NOTE: as a 2-d pooling of height 1, whose backward is ATen's
            k, s, p, d = (_per_dim(v, 1)[0] for v in (kernel_size, stride if stride not in (None, (), []) else
                                                      kernel_size, padding, dilation))
            two_d = _max_pooling(2)(ltorch.unsqueeze(a, -2), (1, k), (1, s), (0, p), (1, d), ceil_mode)
            return ltorch.squeeze(two_d, -2)
        pool = getattr(ltorch, f"max_pool{dims}d")
        if not ceil_mode or return_indices:
            return pool(a, kernel_size, stride, padding, dilation, return_indices=return_indices, ceil_mode=ceil_mode)
        k, s, p, d, _, extra = _geometry(a, dims, kernel_size, stride, padding, dilation, True)
        wide = _padded(a, dims, p, [pi + e for pi, e in zip(p, extra)], -math.inf)
        return pool(wide, k, s, 0, d, return_indices=False, ceil_mode=False)

    return max_pool


def _divisors(n: int, k: int, s: int, p: int, out: int, count_pad: bool) -> list[int]:
    """Each window's divisor along one dimension, as ATen's average pooling: clipped at the padded input, and at the
    input itself without ``count_include_pad``."""
    sizes = []
    for o in range(out):
        start = o * s - p
        end = min(start + k, n + p)
        size = end - start
        if not count_pad:
            size = min(end, n) - max(start, 0)
        sizes.append(size)
    return sizes


def _avg_pooling(dims: int) -> Any:
    def avg_pool(a: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: Any = None) -> Any:
        """PyTorch's average pooling: with ceil mode or ``count_include_pad=False``, window sums (thunder's floor-mode
        average of the zero-padded input times the window's size) divided as PyTorch divides them."""
        import thunder.torch as ltorch
        import torch

        pool = getattr(ltorch, f"avg_pool{dims}d")
        if not ceil_mode and count_include_pad:
            return pool(a, kernel_size, stride, padding, ceil_mode=False, count_include_pad=True,
                        divisor_override=divisor_override)
        k, s, p, _, out, extra = _geometry(a, dims, kernel_size, stride, padding, 1, ceil_mode)
        wide = _padded(a, dims, p, [pi + e for pi, e in zip(p, extra)], 0.0)
        sums = pool(wide, k, s, 0, ceil_mode=False, count_include_pad=True, divisor_override=None) * math.prod(k)
        if divisor_override is not None:
            return sums / divisor_override
        n = list(a.shape[-dims:])
        divisor = None
        for i in range(dims):
            sizes = _divisors(n[i], k[i], s[i], p[i], out[i], count_include_pad)
            shape = [1] * dims
            shape[i] = out[i]
            part = ltorch.reshape(ltorch.tensor(sizes, device=a.device, dtype=torch.float32), shape)
            divisor = part if divisor is None else divisor * part
        return sums / ltorch.to(divisor, sums.dtype)

    return avg_pool


def _replacements() -> dict[Any, Any]:
    """{torch function: the symbol thunder traces it to now}."""
    import torch
    import torch.nn.functional as F

    own = {}
    for dims in (1, 2, 3):
        max_symbol = composite_symbol(f"max_pool{dims}d", _max_pooling(dims))
        own[getattr(F, f"max_pool{dims}d")] = own[getattr(torch, f"max_pool{dims}d")] = max_symbol
        own[getattr(F, f"avg_pool{dims}d")] = composite_symbol(f"avg_pool{dims}d", _avg_pooling(dims))
    own[torch.avg_pool1d] = own[F.avg_pool1d]
    return own


#: thunder's tables changed as this module's docstring says, once per process
_patch = table_patch(_replacements, lambda fn, symbol, lookaside: lookaside is not None
                     and getattr(symbol, "id", "").startswith("torch.nn.functional."))
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
