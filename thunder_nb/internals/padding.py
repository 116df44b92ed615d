"""``F.pad`` in reflect, replicate and circular modes traced by thunder (``nn.ReflectionPad2d``,
``nn.ReplicationPad1d``, a circular convolution's padding): one change to the symbol ``thunder.torch.pad``
(lightning-thunder 0.2.6), installed once per process by `install` where `thunder_nb.internals.supported` (from
`thunder_nb.internals.check_versions`).

thunder 0.2.6 pads with a constant only ("Mode arguments other than constant are not supported"). `install` builds the
other modes from slices, flips and a concatenation along each padded dimension, as PyTorch defines them (a corner of a
2-d pad is the pad of the pad), which thunder differentiates; the constant mode, and what PyTorch refuses (a negative
pad, a reflection as wide as the dimension), stay thunder's own.
"""

from __future__ import annotations

from typing import Any

from .patches import attribute_patch

__all__ = ["install", "uninstall", "installed"]

_MODES = ("reflect", "replicate", "circular")


def _pad_dim(a: Any, dim: int, left: int, right: int, mode: str) -> Any:
    """``a`` padded by ``left`` and ``right`` along ``dim`` in ``mode``."""
    import thunder.torch as ltorch
    from thunder import clang

    n = a.shape[dim]
    parts = []
    for width, at_left in ((left, True), (right, False)):
        if width == 0:
            parts.append(None)
            continue
        if mode == "reflect":  # NOTE: the edge itself is not repeated: [3 2 | 1 2 3 4 | 3 2]
            start, stop = (1, width + 1) if at_left else (n - 1 - width, n - 1)
            part = ltorch.flip(clang.slice_in_dim(a, start, stop, dim=dim), dim)
        elif mode == "replicate":
            edge = clang.slice_in_dim(a, 0, 1, dim=dim) if at_left else clang.slice_in_dim(a, n - 1, n, dim=dim)
            part = ltorch.expand(edge, *(width if d == dim else s for d, s in enumerate(a.shape)))
        else:  # NOTE: circular: the other end's values
            part = clang.slice_in_dim(a, n - width, n, dim=dim) if at_left else clang.slice_in_dim(a, 0, width, dim=dim)
        parts.append(part)
    return ltorch.cat([p for p in (parts[0], a, parts[1]) if p is not None], dim)


def _supported(a: Any, pad_widths: Any, mode: Any) -> bool:
    if mode not in _MODES or len(pad_widths) % 2 or len(pad_widths) > 2 * a.ndim:
        return False
    for k in range(len(pad_widths) // 2):
        n, (left, right) = a.shape[a.ndim - 1 - k], pad_widths[2 * k: 2 * k + 2]
        if not (isinstance(left, int) and isinstance(right, int)) or left < 0 or right < 0:
            return False
        if (mode == "reflect" and max(left, right) >= n) or (mode == "circular" and max(left, right) > n):
            return False
    return True


def _padding(original: Any) -> Any:
    def pad(a: Any, /, pad: tuple[int, ...], mode: str | None = "constant", value: Any = None) -> Any:
        """``F.pad``: reflect, replicate and circular modes built from slices (`_pad_dim`), from the last dimension
        on; anything else by thunder's own ``pad``."""
        if not _supported(a, pad, mode):
            return original(a, pad, mode, value)
        out = a
        for k in range(len(pad) // 2):
            out = _pad_dim(out, a.ndim - 1 - k, pad[2 * k], pad[2 * k + 1], mode)
        return out

    return pad


def _symbol() -> Any:
    import thunder.torch as ltorch

    return ltorch.pad


#: thunder's pad symbol changed as this module's docstring says, once per process
_patch = attribute_patch(_symbol, "meta", _padding,
                         expected=lambda meta: callable(meta) and getattr(meta, "__name__", None) == "pad")
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
