"""thunder's executors as thunder-nb chooses them: fusion executors by name, inductor's that leaves islands out of its
fusions, thunder's sdpa executor with a checker that refuses what its kernels cannot run, and PyTorch's own kernels
for convolutions' backward, training BatchNorm, and (where no fusion executor is named) layer_norm, gelu, silu,
sigmoid, mean, unbind and broadcasts' backward (`thunder_nb.cudagraph.native_kernels` and `native_tensor_ops`,
re-exported here)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from .. import internals
from .native_kernels import (native_batch_norm, native_convolution, native_gelu, native_layer_norm, native_sigmoid,
                             native_silu)
from .native_tensor_ops import native_broadcast, native_mean, native_unbind

__all__ = ["EXECUTOR_NAMES", "executor_names", "executor_list", "jit_executors", "checked_sdpa", "training_sdpa",
           "native_convolution", "native_batch_norm", "native_layer_norm", "native_gelu", "native_silu",
           "native_sigmoid", "native_mean", "native_unbind", "native_broadcast"]


#: Names of the fusion executors thunder-nb can put before thunder's defaults (``--executors``), and ``no-sdpa``:
#: thunder's defaults without its sdpa executor (fused attention), which refuses some calls (a KV cache's
#: broadcast batch, autocast's mixed dtypes); attention then runs as thunder's decomposition.
EXECUTOR_NAMES = ("torchcompile", "torchcompile_cat", "nvfuser", "no-sdpa")

#: The fusion executors that keep layer_norm, gelu, silu, sigmoid, mean, unbind and broadcasts (`jit_executors`), by
#: name, thunder's and thunder-nb's own.
_FUSING = frozenset(n for name in ("torchcompile", "torchcompile_cat", "nvfuser") for n in (name, f"thunder_nb_{name}"))


def executor_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` checked, each once (no thunder import).

    Raises:
        ValueError: an unknown name.
    """
    for name in names:
        if name not in EXECUTOR_NAMES:
            raise ValueError(f"unknown executor: {name!r} (must be one of {list(EXECUTOR_NAMES)})")
    return tuple(dict.fromkeys(names))  # NOTE: a name given twice is one executor


@functools.cache  # NOTE: one executor per name, registered once
def _island_aware_torch_compile(name: str) -> Any:
    """thunder's torch_compile executor ``name`` that leaves islands, and arithmetic on numbers, out of its fusions,
    differentiates every op as thunder's torch executor would, and never loses an in-place update; thunder's own on a
    thunder thunder-nb does not support (`thunder_nb.internals.set_implementations` refuses).

    thunder's own fuses ``.item()`` into the kernel group in front of it, and an island's number into the
    ops that read it. A fusion holding an island cannot be captured; one reading an island's number
    would bake the number into the graph (thunder-nb's scalar hand-off rewrites the ops that read it,
    which it cannot do inside a compiled fusion). So those stay plain symbols between fusions.

    Three of thunder 0.2.6's ways of computing something else than eager PyTorch, silently, are closed here:

    - its autodiff takes an op's backward from the first executor that can execute *or fuse* the op, and a fusion
      executor can fuse an op through its decomposition: thunder's executor, with no backward of its own, then had
      thunder differentiate ``max_pool2d``'s decomposition (a ``-inf`` pad and a one-hot convolution, whose
      ``-inf * 0`` is NaN in every window that overlaps the padding) instead of the torch executor's
      ``max_pool2d_with_indices``. resnet18's stem pools so: its loss was wrong from the first step and the gradients
      before the pooling NaN. The ops the torch executor alone differentiates (`_backward_in_torch_executor`) are
      refused to autodiff here; the fusions still run them (as PyTorch's own op) where no backward is traced;
    - thunder fuses a forward and its backward in one trace, then splits it, and a fusion goes to the forward only
      if the forward reads one of its results: an in-place update nobody reads, fused, ran in the backward.
      `native_batch_norm` writes the running statistics back so; such updates stay out of the fusions of a trace
      with a backward (`_unread_updates`);
    - a fusion none of whose results is read outside it has no outputs, and thunder's dead-code elimination drops a
      symbol without outputs even when it writes in place (``remove_duplicate_number_proxies`` keeps none of them):
      the running statistics' updates, fused on their own, vanished. Such a fusion returns what its in-place updates
      return, so that it stays.
    """
    from thunder.core import prims
    from thunder.core.proxies import NumberProxy, variableify
    from thunder.core.symbol import has_tags
    from thunder.executors import torch_compile

    from ..diagnosis.ops import capture_hazard, classify_bsym

    original = torch_compile.torch_compile_ex if name == "torchcompile" else torch_compile.torch_compile_cat_ex

    class IslandAwareTorchCompile(torch_compile.TorchCompileExecutor):
        _kept_bare: frozenset[int] = frozenset()  # NOTE: the ids of the updates `_unread_updates` keeps unfused

        def can_fuse(self, bsym: Any) -> bool:
            if (classify_bsym(bsym) is not None or capture_hazard(bsym) is not None
                    or any(isinstance(a, NumberProxy) for a in bsym.flat_proxy_args) or id(bsym) in self._kept_bare):
                return False
            return super().can_fuse(bsym)

        def fusion_pass(self, trace: Any) -> Any:
            self._kept_bare = _unread_updates(trace)
            try:
                return super().fusion_pass(trace)
            finally:
                self._kept_bare = frozenset()

        def can_execute_or_fuse(self, bsym: Any) -> bool:
            # NOTE: thunder's autodiff alone asks this, of each executor in turn, to choose whose backward an op takes
            if bsym.sym.id in _backward_in_torch_executor():
                return False
            return super().can_execute_or_fuse(bsym)

        def fuse(self, region: Any, fusion_counter: int) -> Any:
            if not region.outputs:
                for b in region.bound_symbols:
                    if has_tags(b, {prims.OpTags.DONT_DCE}):
                        region.outputs.update(variableify(o) for o in b.flat_proxy_outs)
            bsym = super().fuse(region, fusion_counter)
            internals.wrap_fusion_callable(bsym, _counting_kernels)
            return bsym

    ex = IslandAwareTorchCompile(f"thunder_nb_{name}", original.required_ops, mode=original.mode)
    if not internals.set_implementations(ex, {op: info for op, info in original.implmap.items()
                                              if op not in _backward_in_torch_executor()}):
        return original  # NOTE: a thunder thunder-nb does not support: thunder's own executor, as it is
    return ex


def _unread_updates(trace: Any) -> frozenset[int]:
    """The ids of the in-place updates that no symbol reads, in a trace thunder splits into a forward and a backward
    after fusing it: they stay out of the fusions (thunder's torch executor runs them between fusions). Empty for any
    other trace.

    thunder's split keeps a bare ``copy_`` into a forward tensor in the forward, but a fusion goes to the forward only
    when the forward reads one of its results; otherwise to the backward, or nowhere when nothing needs a backward
    (a call under ``no_grad`` of a function whose parameters require grad is split so too). A fusion that holds such
    an update and nothing the forward reads took the update with it. `native_batch_norm` writes the running
    statistics so, after a kernel inductor does not take. A trace thunder does not split keeps such updates in its
    fusions (`_island_aware_torch_compile`'s ``fuse`` keeps a fusion that nobody reads from): a KV cache's write, say.
    """
    from thunder.core import prims
    from thunder.core.symbol import has_tags
    from thunder.core.utils import consumers

    if not internals.is_joint_trace(trace):
        return frozenset()
    readers = consumers(trace)
    unread = set()
    for bsym in trace.bound_symbols:
        outs = bsym.flat_proxy_outs
        if outs and has_tags(bsym, {prims.OpTags.DONT_DCE}) and not any(
                b.sym.id != prims.PrimIDs.DEL for o in outs for b in readers.get(o, ())):
            unread.add(id(bsym))
    return frozenset(unread)


def _backward_in_torch_executor() -> frozenset[str]:
    """The ops whose backward only thunder's torch executor carries (its own grad transform; thunder has no global one).

    thunder's autodiff asks the first executor that claims an op for its backward and stops there: thunder's
    torchcompile executor claims every op the torch executor runs, with no backward of its own, so a training step
    with one of these ops failed to trace ("Failed to find a gradient transform for bound symbol ...
    adaptive_avg_pool2d", torchvision's resnet18), with thunder's own executor as with thunder-nb's; and an op it
    claims through its decomposition (max_pool2d: all of its decomposition's ops are fusible) had that decomposition
    differentiated instead, silently. thunder-nb's fused executor leaves them to the torch executor: it does not run
    them as an operator of its own, and refuses them when autodiff asks which executor claims them (max_pool2d,
    max_pool3d and adaptive_avg_pool2d in thunder 0.2.6).
    """
    from thunder.executors.torchex import ex as torch_ex

    rules = internals.grad_rules()
    return frozenset(op for op, info in torch_ex.implmap.items() if info.grad_transform is not None and op not in rules)


def _counting_kernels(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a fusion torch.compile compiles at its first call) that notes the kernels inductor generated then.

    ``wrapper.thunder_nb_kernels``: ``torch._inductor.metrics.generated_kernel_count`` across the first call, or
    None when that compiled nothing here (inductor's caches, another thread) or the metric is missing: then
    inductor decided, and the count is not known.
    """
    import functools

    from ..diagnosis.plans import KERNELS_ATTRIBUTE

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        if wrapper.thunder_nb_first:
            wrapper.thunder_nb_first = False
            before = internals.inductor_kernel_count()
            if before is None:
                return fn(*args)
            out = fn(*args)
            n = internals.inductor_kernel_count() - before
            setattr(wrapper, KERNELS_ATTRIBUTE, n if n > 0 else None)
            return out
        return fn(*args)

    wrapper.thunder_nb_first = True
    setattr(wrapper, KERNELS_ATTRIBUTE, None)
    return wrapper


@functools.cache  # NOTE: registered with thunder once
def checked_sdpa() -> Any:
    """thunder's sdpa executor (fused attention) with a checker that refuses what its meta functions reject.

    thunder 0.2.6's checker asks torch which fused kernel would run, but not whether the attention mask's batch
    matches the query's: a KV-cache decode step (litgpt's mask broadcast over the batch) then fails while it is
    traced, "grad_forward_sdpa: Expected all inputs to have same batch_size", where thunder could have run
    attention with torch's own kernel; nor whether the mask has the query's and the key's lengths, which thunder
    hands the kernel unexpanded: ``nn.MultiheadAttention`` with a key padding mask (a mask of one query row)
    failed "attn_bias: wrong shape (seqlenQ dimension)". With this checker such a call goes to the next executor;
    every call the fused kernels take runs as with thunder's executor (the same transforms, the same symbols), but
    for the backward's incoming gradient, cast to the attention's dtype first (`internals.sdpa_grad_in_its_dtype`:
    under autocast thunder's own backward refuses a float32 gradient of a bfloat16 attention).
    """
    sdpa_checker, sdpa_fused = internals.sdpa_implementation()

    def checker(query, key, value, attn_mask, dropout_p, is_causal, *, scale=None) -> bool:
        tensors = [t for t in (query, key, value, attn_mask) if t is not None]
        if any(t.ndim != 4 for t in tensors) or any(t.shape[0] != query.shape[0] for t in tensors):
            return False
        if attn_mask is not None and tuple(attn_mask.shape[2:]) != (query.shape[2], key.shape[2]):
            return False  # NOTE: broadcast over the query's or the key's length: eager's sdpa expands it first
        return sdpa_checker(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)

    return _sdpa_executor("thunder_nb_sdpa", checker, sdpa_fused)


@functools.cache  # NOTE: registered with thunder once
def training_sdpa() -> Any:
    """`checked_sdpa` for a compilation with grad enabled only: the one before a fusion executor (`jit_executors`).

    A fusion executor claims ``scaled_dot_product_attention`` with no backward, so thunder differentiated attention's
    decomposition, matmuls and a softmax, slower than PyTorch's fused kernels in a training step. Without grad (a
    decode step under ``torch.no_grad()``) inductor's fusions around attention were the faster, so there this
    executor refuses and the fusion executor takes attention (both measured on the H100:
    bench/results/2026-12-07-kernels-gpt2-1b-h100.md).
    """
    import thunder.torch as ltorch

    inner = checked_sdpa().implmap[ltorch.scaled_dot_product_attention.id].checker

    def checker(*args: Any, **kwargs: Any) -> bool:
        return internals.compiling_with_grad() and inner(*args, **kwargs)

    return _sdpa_executor("thunder_nb_sdpa_training", checker, internals.sdpa_implementation()[1])


def _sdpa_executor(name: str, checker: Callable[..., bool], fused: Callable[..., Any]) -> Any:
    """A registered executor of thunder's fused attention (``fused``) under ``checker``, with thunder-nb's backward."""
    import thunder.torch as ltorch
    from thunder.executors import sdpaex
    from thunder.extend import OperatorExecutor, register_executor

    ex = OperatorExecutor(name, version=sdpaex.sdpa_ex.version)
    register_executor(ex)
    ex.register_implementation(ltorch.scaled_dot_product_attention, checker=checker, execution_transform=fused,
                               grad_transform=internals.sdpa_grad_in_its_dtype)
    return ex


def executor_list(names: Sequence[str], *, checked: bool = False) -> list[Any] | None:
    """thunder's executor list with the named fusion executors first (less sdpa for ``no-sdpa``); None (thunder's
    defaults) for no names, unless ``checked``: then thunder's sdpa executor is always `checked_sdpa` instead.

    Raises:
        ValueError: an unknown name, or an executor thunder cannot use here (nvFuser without its wheel).
    """
    if not names and not checked:
        return None
    import thunder

    chosen = []
    names = executor_names(names)
    for name in names:
        if name == "no-sdpa":
            continue
        if name.startswith("torchcompile"):
            chosen.append(_island_aware_torch_compile(name))
        else:
            ex = thunder.get_executor("nvfuser")
            if ex is None:
                raise ValueError("executor 'nvfuser' is not available: no nvFuser wheel matches this torch "
                                 "(see the README's development notes)")
            chosen.append(ex)
    rest = [ex for ex in thunder.get_default_executors() if ex not in chosen]
    if "no-sdpa" in names:
        return chosen + [ex for ex in rest if ex.name != "sdpa"]
    return chosen + [checked_sdpa() if checked and ex.name == "sdpa" else ex for ex in rest]


def _thunder_nb_executor(ex: Any) -> Any:
    """thunder-nb's executor in place of thunder's sdpa and torchcompile executors; any other as it is."""
    from thunder.executors import torch_compile

    if ex is torch_compile.torch_compile_ex:
        return _island_aware_torch_compile("torchcompile")
    if ex is torch_compile.torch_compile_cat_ex:
        return _island_aware_torch_compile("torchcompile_cat")
    return checked_sdpa() if getattr(ex, "name", None) == "sdpa" else ex


def jit_executors(executors: Sequence[Any]) -> list[Any]:
    """``thunder.jit``'s ``executors=`` list for a user's mix of names (`EXECUTOR_NAMES`) and thunder executors.

    `native_convolution` and `native_batch_norm` (PyTorch's own kernels) first, then `native_layer_norm`, `native_gelu`,
    `native_silu`, `native_sigmoid`, `native_mean`, `native_unbind` and `native_broadcast` where no fusion executor is
    given, named or among thunder's defaults (nvFuser, where it is installed), then the given executors, then the named
    ones, then thunder's defaults (less sdpa for ``no-sdpa``), each once; thunder's sdpa executor, given or default, is
    `checked_sdpa`, and thunder's torchcompile executors, given, are thunder-nb's (the same fusions, with
    `native_batch_norm`'s running statistics kept and the torch executor's backward for pooling). PyTorch's kernels come
    before every other: thunder asks the first executor that claims an op for its backward, and the fusion executors and
    thunder's torch executor claim ``prims.convolution``, ``batch_norm``, ``layer_norm``, ``gelu``, ``silu``,
    ``sigmoid``, ``mean`` and ``unbind`` with none of their own (thunder then differentiates its decomposition, op by
    op: on an H100 nanoGPT's layer norms and gelu took 294 µs of GPU time a step against eager's 44 µs:
    bench/results/2026-12-05-ddp-step-ops-h100.md), and ``broadcast_in_dim`` with thunder's rule, which copies where
    eager's views. A fusion executor (torchcompile, torchcompile_cat, nvFuser) keeps all of them but
    ``prims.convolution`` and ``batch_norm``: it fuses their decomposition, forward and backward, with the ops around
    them, and that configuration is already the fastest. Before a fusion executor also comes `training_sdpa` (unless
    ``no-sdpa``), which takes attention where grad is enabled: the fusion executor has no backward of it.
    `native_broadcast` only where `internals.supported`.
    `thunder_nb.jit` and `thunder_nb.step.jit_step` both take their executors this way, and so does the magic's fixed
    side.

    Raises:
        ValueError: an unknown name, or an executor thunder cannot use here (nvFuser without its wheel).
    """
    given = [_thunder_nb_executor(e) for e in executors if not isinstance(e, str)]
    named = executor_list([e for e in executors if isinstance(e, str)], checked=True)
    # NOTE: every name is in ``named`` as its executor, and thunder's defaults count too: with nvFuser installed they
    # hold it
    fused = any(getattr(e, "name", None) in _FUSING for e in (*given, *named))
    # NOTE: with a fusion executor first, attention goes to PyTorch's fused kernels only from an executor before it
    # (the fusion executor claims it with no backward; thunder then differentiates matmuls and a softmax)
    attention = [training_sdpa()] if fused and checked_sdpa() in named else []
    native = [native_convolution(), native_batch_norm(), *attention] + ([] if fused else [
        native_layer_norm(), native_gelu(), native_silu(), native_sigmoid(), native_mean(), native_unbind()])
    # NOTE: native_broadcast runs thunder's torch executor's own transform (`internals.torch_executor_transform`): on a
    # thunder thunder-nb does not support, thunder's rule stays
    native += [] if fused or not internals.supported() else [native_broadcast()]
    return list(dict.fromkeys(native + given + named))
