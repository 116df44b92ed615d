"""thunder's cross entropy with label smoothing made to average as eager PyTorch does: one change to
``thunder.torch._cross_entropy_loss_label_smoothing`` (lightning-thunder 0.2.6), installed once per process by
`install` where `thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

``F.cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.1)`` (a language model's loss over padded
targets) is ``(1 - e) * nll + e / C * smooth``, where ``smooth`` is each counted target's sum of ``-log p`` over the
classes, averaged over the counted targets. thunder 0.2.6 summed ``-log p`` over every target, the ignored ones too,
and divided by the counted ones: a larger loss and a wrong gradient, silently (a batch of 4 with one ignored target:
3.7855 where eager gives 3.7158). `install` makes it sum the counted targets only, as PyTorch's own kernel does.
"""

from __future__ import annotations

from typing import Any

from .patches import attribute_patch

__all__ = ["install", "uninstall", "installed", "label_smoothed_cross_entropy"]


def label_smoothed_cross_entropy(a: Any, target: Any, weight: Any, ignore_index: int, reduction: str,
                                 label_smoothing: float) -> Any:
    """Cross entropy with label smoothing in thunder's ops, as ``torch.nn.functional.cross_entropy`` computes it: the
    smoothing term of an ignored target is 0, and the mean divides the counted targets' terms by their number (or,
    with ``weight``, by the sum of their classes' weights)."""
    import thunder.torch as ltorch

    class_dim = 1 if a.ndim >= 2 else 0
    classes = a.shape[class_dim]
    log_p = ltorch.log_softmax(a, dim=class_dim)
    class_weight = None if weight is None else ltorch.reshape(weight, [classes] + [1] * (a.ndim - 2))
    terms = -log_p if class_weight is None else -(log_p * class_weight)
    counted = target != ignore_index
    smooth = ltorch.where(counted, ltorch.sum(terms, dim=class_dim), 0)
    if reduction == "none":
        smoothed = smooth
    elif reduction == "sum":
        smoothed = ltorch.sum(smooth)
    elif weight is None:
        smoothed = ltorch.sum(smooth) / ltorch.sum(counted)
    else:
        index = ltorch.unsqueeze(ltorch.where(counted, target, 0), class_dim)  # NOTE: an ignored target reads class 0
        per_target = ltorch.take_along_dim(ltorch.expand(class_weight, a.shape), index, class_dim)
        smoothed = ltorch.sum(smooth) / ltorch.sum(ltorch.where(counted, ltorch.squeeze(per_target, class_dim), 0))
    nll = ltorch.nll_loss(log_p, target, weight, ignore_index, reduction)
    return nll * (1.0 - label_smoothing) + smoothed * (label_smoothing / classes)


def _thunder_torch() -> Any:
    import thunder.torch as ltorch

    return ltorch


#: thunder's label-smoothed cross entropy changed as this module's docstring says, once per process
_patch = attribute_patch(_thunder_torch, "_cross_entropy_loss_label_smoothing", lambda _: label_smoothed_cross_entropy)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
