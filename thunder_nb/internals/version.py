"""The versions thunder-nb's private accesses were written for, and what it does on any other (`supported`)."""

from __future__ import annotations

import os
import re
import warnings

__all__ = ["THUNDER_VERSION", "TORCH_VERSION", "UNSUPPORTED_VARIABLE", "FALLBACK", "VersionWarning", "found_versions",
           "supported", "check_versions"]

#: The versions whose private names this package was written against: lightning-thunder 0.2.6, torch 2.11.x.
THUNDER_VERSION = "0.2.6"
TORCH_VERSION = "2.11"

#: An environment variable: set to anything but ``""`` or ``"0"`` before thunder-nb is imported, thunder-nb behaves as
#: on a thunder or torch it was not written for (`supported` is False). The tests run the fallback so
#: (tests/test_unsupported_versions.py); a user can too, to rule thunder-nb's fast paths out of a problem.
UNSUPPORTED_VARIABLE = "THUNDER_NB_UNSUPPORTED"

#: What thunder-nb does instead of its fast paths where `supported` is False: the warning says it.
FALLBACK = (
    "it takes thunder's own paths where its fast ones read private parts, which is slower: thunder's call path on "
    "every call (no fast_call), thunder's interpreter as it is (slower tracing), thunder's prologue (no module walks), "
    "thunder's torchcompile executors as they are (their islands and pooling backward unfixed), a region's key made "
    "afresh on every call (no C guard), and no graph memory handed out unguarded (no use counts: returned tensors, "
    "gradients and the tensors saved for the backward are copied out of graph memory, and nothing rotates); a "
    "compiled module keeps an attribute set on it to itself, as thunder's does, where its model's forward never reads "
    "it: set it on your model")


class VersionWarning(UserWarning):
    """thunder or torch is not the version thunder-nb's private accesses were written for: it falls back to thunder's
    own paths (`FALLBACK`)."""


_supported: bool | None = None
_warned = False


def found_versions() -> dict[str, str]:
    """The installed versions, by package name: ``{"lightning-thunder": "0.2.6", "torch": "2.11.0+cu130"}``."""
    import thunder
    import torch

    return {"lightning-thunder": str(getattr(thunder, "__version__", "?")), "torch": str(torch.__version__)}


def _matches(found: str, wanted: str) -> bool:
    """``found`` is release ``wanted`` or one of its patch releases, with a local label or none (``2.11.0+cu130`` for
    ``2.11``; not ``0.2.6.dev1`` nor ``0.2.7`` for ``0.2.6``)."""
    return re.fullmatch(rf"{re.escape(wanted)}(\.\d+)*(\+[\w.]+)?", found) is not None


def _forced() -> bool:
    return os.environ.get(UNSUPPORTED_VARIABLE, "") not in ("", "0")


def supported() -> bool:
    """Whether the installed lightning-thunder is 0.2.6 and torch 2.11.x, whose private API thunder-nb was written
    against, and `UNSUPPORTED_VARIABLE` is not set; asked once per process (the answer is kept).

    It gates the fast paths that read thunder's and torch's private parts: the faster tracing
    (`thunder_nb.internals.tracing`), `thunder_nb.cudagraph.call.fast_call`
    (`thunder_nb.internals.call_path` is None), the prologue's module walks (`thunder_nb.cudagraph.prologue`), the
    held-guard's use counts (`thunder_nb.internals.use_counters`), thunder-nb's torchcompile executor's implementations
    (`thunder_nb.internals.set_implementations`), and torch.compile's C guards (`thunder_nb.internals.metadata_guard`,
    `thunder_nb.internals.ObjectGuard.make`), and a compiled module's attribute writes reaching its model
    (`thunder_nb.internals.write_through`). Where it is False each takes thunder's own path (`FALLBACK`), and the
    entry points warn once (`check_versions`).
    """
    global _supported
    if _supported is None:
        found = found_versions()
        _supported = (not _forced() and _matches(found["lightning-thunder"], THUNDER_VERSION)
                      and _matches(found["torch"], TORCH_VERSION))
    return _supported


def check_versions() -> bool:
    """`supported`; where it is False, one `VersionWarning` per process, naming the versions found and expected and
    what is slower; where it is True, thunder's interpreter is made faster (`thunder_nb.internals.tracing.install`,
    once), its backward reduces a 0-dim tensor's gradient (`thunder_nb.internals.grads.install`, once) and its forward
    keeps what the backward reads from in-place writes (`thunder_nb.internals.saved.install`, once), and its dataflow
    ordering keeps a write after the reads of its memory (`thunder_nb.internals.ordering.install`, once), and its
    checkpointing warns where eager's differs (`thunder_nb.internals.checkpoint.install`, once), and its label-smoothed
    cross entropy averages over the counted targets (`thunder_nb.internals.losses.install`, once), and a buffer a
    forward sets again is set as eager sets it (`thunder_nb.internals.buffers.install`, once), and its instance norm
    updates the running statistics (`thunder_nb.internals.instance_norm.install`, once), and torch's named tuples
    have their fields while thunder traces (`thunder_nb.internals.named_tuples.install`, once), and ``F.pad`` traces
    in reflect, replicate and circular modes (`thunder_nb.internals.padding.install`, once), and the random ops
    thunder ran as opaque calls get the gradients of their own draws (`thunder_nb.internals.random_ops.install`,
    once), and PyTorch's attention modules trace as their Python writes them (`thunder_nb.internals.attention.install`,
    once), and a traced tensor's dtype is torch's (`thunder_nb.internals.torch_metadata.install`, once), and Python's
    and NumPy's random draws in traced code are refused (`thunder_nb.internals.python_random.install`, once), and
    ``F.interpolate`` traces as ATen computes it (`thunder_nb.internals.interpolate.install`, once), and
    ``F.nll_loss`` with PyTorch's signature (`thunder_nb.internals.nll_loss.install`, once), and pooling in ceil mode
    (`thunder_nb.internals.pooling.install`, once), and a call with ``*`` over a generator
    (`thunder_nb.internals.star_args.install`, once), and weight normalization
    (`thunder_nb.internals.weight_norm.install`, once), and ``x.H``, ``clone(memory_format=...)`` and
    ``F.normalize(out=...)`` (`thunder_nb.internals.tensor_api.install`, once), and a negative ``padding_idx`` of
    ``F.embedding`` (`thunder_nb.internals.embedding.install`, once), and ``var``/``std`` with ``unbiased``
    (`thunder_nb.internals.variance.install`, once). Every entry point calls it: the
    transforms, ``thunder_nb.jit``, ``jit_step``, ``analyze``."""
    global _warned
    if supported():
        from . import (attention, buffers, checkpoint, embedding, grads, instance_norm, interpolate, losses,
                       named_tuples, nll_loss, ordering, padding, pooling, python_random, random_ops, saved, star_args,
                       tensor_api, torch_metadata, tracing, variance, weight_norm)

        tracing.install()  # NOTE: thunder's interpreter, faster with the same traces (`thunder_nb.internals.tracing`)
        grads.install()  # NOTE: thunder's backward, right for a 0-dim tensor (`thunder_nb.internals.grads`)
        saved.install()  # NOTE: what it saves, kept from in-place writes (`thunder_nb.internals.saved`)
        ordering.install()  # NOTE: writes kept after the reads of their memory (`thunder_nb.internals.ordering`)
        checkpoint.install()  # NOTE: a warning where eager's checkpointing differs (`thunder_nb.internals.checkpoint`)
        losses.install()  # NOTE: label smoothing's mean over the counted targets (`thunder_nb.internals.losses`)
        buffers.install()  # NOTE: a buffer a forward sets again, set as eager sets it (`thunder_nb.internals.buffers`)
        instance_norm.install()  # NOTE: its running statistics updated (`thunder_nb.internals.instance_norm`)
        named_tuples.install()  # NOTE: x.max(dim=1).indices read while tracing (`thunder_nb.internals.named_tuples`)
        padding.install()  # NOTE: F.pad's reflect, replicate and circular modes (`thunder_nb.internals.padding`)
        random_ops.install()  # NOTE: a random op's gradients of its own draws (`thunder_nb.internals.random_ops`)
        attention.install()  # NOTE: nn.MultiheadAttention traced as its Python (`thunder_nb.internals.attention`)
        torch_metadata.install()  # NOTE: x.dtype == torch.float32 (`thunder_nb.internals.torch_metadata`)
        python_random.install()  # NOTE: random.random() refused, not fixed (`thunder_nb.internals.python_random`)
        interpolate.install()  # NOTE: F.interpolate as ATen computes it (`thunder_nb.internals.interpolate`)
        nll_loss.install()  # NOTE: F.nll_loss with PyTorch's signature (`thunder_nb.internals.nll_loss`)
        pooling.install()  # NOTE: ceil_mode, count_include_pad=False, max_pool1d's backward (`internals.pooling`)
        star_args.install()  # NOTE: f(*generator), as PyTorch's parametrizations call (`internals.star_args`)
        weight_norm.install()  # NOTE: torch._weight_norm from thunder's ops (`thunder_nb.internals.weight_norm`)
        tensor_api.install()  # NOTE: x.H, clone's memory format, F.normalize(out=) (`internals.tensor_api`)
        embedding.install()  # NOTE: F.embedding(padding_idx=-1) counted from the end (`internals.embedding`)
        variance.install()  # NOTE: x.var(1, unbiased=False) and PyTorch's other forms (`internals.variance`)
        return True
    if _warned:
        return False
    _warned = True
    found = found_versions()
    forced = f" ({UNSUPPORTED_VARIABLE} is set)" if _forced() else ""
    warnings.warn(
        f"thunder-nb was written for lightning-thunder {THUNDER_VERSION} and torch {TORCH_VERSION}.x, found "
        f"lightning-thunder {found['lightning-thunder']} and torch {found['torch']}{forced}: {FALLBACK}",
        VersionWarning,
        stacklevel=3,
    )
    return False
