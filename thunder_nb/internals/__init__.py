"""Every private thunder and torch name thunder-nb relies on, adapted, behind one version check (`supported`); nothing
of thunder-nb's own.

The modules by job (each name is re-exported here, so ``from thunder_nb import internals`` then ``internals.x`` reads
any of them):

- `version`: the versions it was written for, `supported` (which gates the fast paths), `check_versions` (the one
  `VersionWarning` of an unsupported thunder or torch, from every entry point);
- `traces`: the del pass, trace building, saved-for-backward, a trace's outputs and signature, fusion symbols;
- `jitted`: a jitted function's call path on a cache hit, its compile data, a ThunderModule's forward and lookups, a
  module's own members, tracing without the cyclic collector;
- `memory`: copies in few launches, the held-guard's use counts, storage handles, cuBLAS's workspaces, a graph pool's
  size, CUDA's generators and stream after a failed capture;
- `guards`: torch.compile's C guards (a tensor's metadata, objects reached from a root);
- `executors`: a fusion's callable, an executor's implementations, thunder's backward rules and sdpa functions, the
  torch executor's transform of a prim;
- `errors`: where torch raised an error, thunder's message naming an op it cannot trace, thunder's own limits.
- `tracing`: thunder's interpreter made to trace faster with the same traces (`tracing.install`, from
  `check_versions`).
- `grads`: thunder's backward made to sum a 0-dim tensor's gradient to its shape, as eager does, and to give
  ``torch.clamp`` (at a tie), ``torch.sigmoid`` (far below zero), ``index_put``, ``prod`` and ``pow`` (at zeros), the
  clamp-made activations (at their bounds) and ``diagonal`` eager's gradients, and the primitives without one theirs
  (`grads.install`, from `check_versions`): thunder 0.2.6 gave ``x * 2 + x.sum()`` on the CPU a wrong gradient.
- `saved`: thunder's split into forward and backward made right about in-place writes (`saved.install`, from
  `check_versions`): a tensor the backward reads kept from a later write (thunder 0.2.6 gave ``t = x.sin();
  t.mul_(x)`` a wrong gradient), a returned view's write kept in the forward, and the warning where a view read after
  a write keeps thunder's gradient;
- `views`: a view read after a write into its base taken again from the written base, and a base written through
  its view (``copy_`` included, writes in turn) rebuilt, before the grad transform (for `saved`): thunder 0.2.6 gave
  ``v = t.unsqueeze(1); t.mul_(x); v.sum()`` a wrong gradient.
- `ordering`: thunder's dataflow ordering made to keep an in-place write after the reads of its memory
  (`ordering.install`, from `check_versions`): with ``fusion_type="dataflow"`` thunder 0.2.6 could move a write
  before a read of the same memory under another name.
- `checkpoint`: thunder's activation checkpointing made to warn where eager's differs (`checkpoint.install`, from
  `check_versions`): a BatchNorm trained inside ``torch.utils.checkpoint``, whose running statistics eager PyTorch
  updates again in the recomputation.
- `losses`: thunder's label-smoothed cross entropy made to average over the counted targets, as eager does
  (`losses.install`, from `check_versions`): with an ``ignore_index`` target, thunder 0.2.6's loss and gradient were
  wrong, silently.
- `buffers`: a buffer that a module's forward sets again (``self.ema = 0.9 * self.ema + ...``) set as eager sets it
  (`buffers.install`, from `check_versions`): thunder 0.2.6 kept the jitted module's own under a name nothing read
  (every call read the first value, silently), and never set the user's module.
- `instance_norm`: thunder's instance norm made to update its running statistics in training mode
  (`instance_norm.install`, from `check_versions`): thunder 0.2.6 left them as they were, silently.
- `named_tuples`: torch's named tuples (``x.max(dim=1)``, ``x.topk(k)``, ``x.sort()``, ...) with their fields while
  thunder traces (`named_tuples.install`, from `check_versions`): thunder 0.2.6 gave plain tuples, and
  ``.values``/``.indices`` failed the trace.
- `padding`: ``F.pad`` in reflect, replicate and circular modes (``nn.ReflectionPad2d``) built from slices, flips and
  a concatenation (`padding.install`, from `check_versions`): thunder 0.2.6 pads with a constant only.
- `random_ops`: the random ops thunder runs as opaque calls (``nn.Dropout2d``, ``nn.AlphaDropout``,
  ``F.gumbel_softmax``) made thunder's own, with the gradients of their own draws (`random_ops.install`, from
  `check_versions`): thunder 0.2.6 drew them anew for the backward (wrong gradients, silently); and the in-place
  fills it lacked (``bernoulli_``, ``uniform_``, ``normal_``: stochastic depth).
- `attention`: ``nn.MultiheadAttention`` and the Transformer layers traced as PyTorch's Python writes them
  (`attention.install`, from `check_versions`): thunder 0.2.6's opaque call failed with ``need_weights=False``, and
  their inference fast path could not be traced.
- `torch_metadata`: a traced tensor's ``.dtype`` read as torch's (`torch_metadata.install`, from `check_versions`):
  under thunder 0.2.6 ``x.dtype == torch.float32`` was False, and an ``if`` on it took the other branch, silently.
- `python_random`: Python's and NumPy's random draws refused in traced code (`python_random.install`, from
  `check_versions`): thunder 0.2.6 drew once, while tracing, and kept the number for every call, silently.
- `interpolate`: ``F.interpolate``'s nearest and linear modes as ATen computes them (`interpolate.install`, from
  `check_versions`): differentiated, thunder 0.2.6's bilinear took another scale than PyTorch's (wrong values,
  silently), and it refused ``align_corners``, ``linear`` and ``trilinear``.
- `nll_loss`: ``F.nll_loss`` traced with PyTorch's signature and defaults, and ``F.binary_cross_entropy_with_logits``
  with a ``pos_weight`` (`nll_loss.install`, from `check_versions`): thunder 0.2.6 failed ``F.nll_loss(F.log_softmax(x,
  1), target)`` and refused the weight.
- `pooling`: max and average pooling with ``ceil_mode=True`` or ``count_include_pad=False``, and ``max_pool1d``'s
  backward as ATen's (`pooling.install`, from `check_versions`): thunder 0.2.6 refused the first two and gave the
  last NaN gradients where a window overlaps the padding, silently.
- `star_args`: a call with ``*`` over a generator traced as Python makes it (`star_args.install`, from
  `check_versions`): thunder 0.2.6 failed PyTorch's parametrizations' ``self[0](*originals)``.
- `weight_norm`: ``torch._weight_norm`` (``nn.utils.parametrizations.weight_norm``) from thunder's ops
  (`weight_norm.install`, from `check_versions`): thunder 0.2.6 had no rule for it.
- `tensor_api`: ``x.H``/``x.mH``, ``clone(memory_format=torch.contiguous_format)``, ``F.normalize`` (``out=``, a
  zero vector's gradient), ``a % b``, ``torch.eye``, ``x.unfold``, ``nn.Softmin``, ``x.fill_`` and the in-place
  methods whose op thunder has (`tensor_api.install`, from `check_versions`): thunder 0.2.6 lacked them (spectral
  norm uses three).
- `embedding`: ``F.embedding``'s negative ``padding_idx`` counted from the end (`embedding.install`, from
  `check_versions`): thunder 0.2.6 read -1 as "no padding row" and trained that row, silently.
- `variance`: ``var``, ``std``, ``var_mean`` and ``std_mean`` with PyTorch's signatures, ``unbiased`` included
  (`variance.install`, from `check_versions`): thunder 0.2.6 took only ``correction``.
- `patches`: such a change made once per process and undone on demand (`ProcessPatch`), for `tracing`, `grads`,
  `saved`, `ordering`, `checkpoint`, `losses`, `buffers`, `instance_norm`, `named_tuples`, `padding`, `random_ops`,
  `attention`, `torch_metadata`, `python_random`, `interpolate`, `nll_loss`, `pooling`, `star_args`,
  `weight_norm`, `tensor_api`, `embedding` and `variance`; and the thunder symbols those make.
"""

from __future__ import annotations

from .errors import (UNTRACEABLE_REASONS, error_line, raised_by_cuda_init, raised_by_graph_capture, thunder_limit,
                     untraceable_op)
from .executors import (batch_norm_functional, fusion_callable, grad_rules, inductor_kernel_count,
                        sdpa_grad_in_its_dtype, sdpa_implementation, set_implementations, torch_executor_transform,
                        wrap_fusion_callable)
from .guards import ObjectGuard, guard_dict_keys, metadata_guard
from .jitted import (THUNDER_MODULE_LOOKUPS, CallPath, call_path, compiling_now, compiling_with_grad,
                     cyclic_gc_off, default_device,
                     is_jitted, jit_transforms, module_forward, own_buffers, own_modules, own_parameters,
                     set_module_forward, thunder_module_class, thunder_modules_of, write_through, hooks_made,
                     module_hook_dicts, global_hook_dicts, autocast_stack, under_own_autocast,
                     is_thunder_module)
from .memory import (clear_cublas_workspaces, copy_all, copy_into, current_stream, data_ptrs_equal, graph_pool_bytes,
                     is_view, recover_capture, recover_generators, recover_stream, storage_handle, storage_use_count,
                     use_counters, version_counter)
from .traces import (bound_call, build_traces, compile_option, del_last_used, drop_signature_args, flat_output, flatten,
                     fusion_symbol, has_traces, is_joint_trace, is_tensor_proxy, saved_for_backward, signature_info,
                     source_line)
from .version import (FALLBACK, THUNDER_VERSION, TORCH_VERSION, UNSUPPORTED_VARIABLE, VersionWarning, check_versions,
                      found_versions, supported)

__all__ = [
    # version
    "THUNDER_VERSION", "TORCH_VERSION", "UNSUPPORTED_VARIABLE", "FALLBACK", "VersionWarning", "found_versions",
    "supported", "check_versions",
    # traces
    "del_last_used", "build_traces", "has_traces", "saved_for_backward", "compile_option", "bound_call",
    "fusion_symbol", "source_line", "flatten", "flat_output", "is_joint_trace", "is_tensor_proxy", "signature_info",
    "drop_signature_args",
    # jitted
    "CallPath", "call_path", "default_device", "THUNDER_MODULE_LOOKUPS", "thunder_module_class", "own_parameters",
    "own_buffers", "own_modules", "compiling_now", "compiling_with_grad", "thunder_modules_of", "module_forward",
    "set_module_forward", "is_jitted", "jit_transforms", "cyclic_gc_off", "write_through", "hooks_made",
    "module_hook_dicts", "global_hook_dicts", "autocast_stack", "under_own_autocast",
    "is_thunder_module",
    # memory
    "copy_all", "copy_into", "clear_cublas_workspaces", "storage_use_count", "data_ptrs_equal", "recover_generators",
    "current_stream", "recover_stream", "recover_capture", "graph_pool_bytes", "use_counters", "storage_handle",
    "is_view", "version_counter",
    # guards
    "metadata_guard", "ObjectGuard", "guard_dict_keys",
    # executors
    "fusion_callable", "wrap_fusion_callable", "set_implementations", "grad_rules", "sdpa_implementation",
    "sdpa_grad_in_its_dtype", "inductor_kernel_count", "batch_norm_functional", "torch_executor_transform",
    # errors
    "error_line", "raised_by_cuda_init", "raised_by_graph_capture", "UNTRACEABLE_REASONS", "untraceable_op",
    "thunder_limit",
]
