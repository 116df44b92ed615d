"""thunder's instance norm made to update its running statistics as eager PyTorch does: one change to the symbol
``thunder.torch.instance_norm`` (lightning-thunder 0.2.6; what ``torch.nn.InstanceNorm1d/2d/3d`` and
``F.instance_norm`` trace to), installed once per process by `install` where `thunder_nb.internals.supported` (from
`thunder_nb.internals.check_versions`).

With ``track_running_stats=True`` in training mode, eager's instance norm runs a batch norm over the ``b * c``
instances with the running statistics repeated ``b`` times, then writes each statistic's mean over the batch back
into ``running_mean`` and ``running_var``. thunder 0.2.6 updated the repeated copies and never wrote them back: the
running statistics stayed as they were, silently, and evaluation then normalised with them. `install` gives the
symbol eager's computation: the same output, and the running statistics written (grad disabled, as eager's kernel
writes them).
"""

from __future__ import annotations

from typing import Any

from .patches import attribute_patch

__all__ = ["install", "uninstall", "installed", "instance_norm"]


def instance_norm(a: Any, /, running_mean: Any = None, running_var: Any = None, weight: Any = None, bias: Any = None,
                  use_input_stats: bool = True, momentum: Any = 0.1, eps: Any = 1e-5) -> Any:
    """``F.instance_norm`` in thunder's ops, as ATen's ``instance_norm`` computes it: a batch norm of the input seen
    as one sample of ``b * c`` channels, with the running statistics, weight and bias repeated ``b`` times; in
    training mode each running statistic then becomes the mean over the batch of its repeated copies' update."""
    import thunder.core.prims as prims
    import thunder.torch as ltorch
    from thunder.core import utils

    shape = a.shape
    b, c = shape[0], shape[1]
    repeated = [None if t is None else ltorch.repeat(t, b) for t in (running_mean, running_var, weight, bias)]
    flat = ltorch.reshape(a, (1, b * c) + tuple(shape[2:]))
    tracked = use_input_stats and (running_mean is not None or running_var is not None)
    stats = (None, None) if tracked else repeated[:2]  # NOTE: updated below, from the input's own statistics
    out = ltorch.batch_norm(flat, *stats, *repeated[2:], use_input_stats, momentum, eps)
    if tracked:
        acc = ltorch.to(flat, utils.get_computation_dtype(a.dtype))
        dims = (0,) + tuple(range(2, flat.ndim))
        biased_var, mean = ltorch.var_mean(acc, dim=dims, correction=0)
        n = flat.numel() / (b * c)
        for running, rep, stat in ((running_mean, repeated[0], mean),
                                   (running_var, repeated[1], biased_var * (n / (n - 1)))):
            if running is None:
                continue
            new = (1 - momentum) * rep + momentum * stat
            new = ltorch.mean(ltorch.reshape(new, (b, c)), 0)
            prims.copy_(ltorch.to(new, running.dtype), running, grad_enabled=False)
    return ltorch.reshape(out, shape)


def _symbol() -> Any:
    import thunder.torch as ltorch

    return ltorch.instance_norm


#: thunder's instance_norm symbol changed as this module's docstring says, once per process
_patch = attribute_patch(_symbol, "meta", lambda _: instance_norm,
                         expected=lambda meta: callable(meta) and getattr(meta, "__name__", None) == "instance_norm")
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
