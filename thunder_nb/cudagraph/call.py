"""thunder.jit's call path on a cache hit: the same steps with less around them (`fast_call`).

On every call, the function ``thunder.jit`` returns (thunder 0.2.6's ``fn_``) goes through five wrappers that count
and time the call, sets three context variables (the cache-info dict, the compile data, the language context) by
two decorators and a context manager per cache entry, fills the cache-info dict the prologues check
(``torch.get_default_device()`` walks the torch-function mode stack in Python; the aliasing of the tensor arguments
goes through a pytree flatten and a defaultdict), tries each cache entry's prologue from the newest, copies the hit's
entry to wrap its computation in a timer, runs it, connects it to autograd, runs the epilogue and sets grad mode back.
Under CUDA graphs the GPU work of a small step (a one-token decode) takes less time than the host's call, so the host's
time is what the step takes, and these wrappers are a large part of it (`bench/host_profile.py`; the figures are in
bench/results/README.md, "Figures behind the defaults").

`fast_call` wraps a jitted function so that a call takes the same steps in the same order: the same cache-info
entries with the same values, the prologues tried newest first under the same context variables, the hit's
computation, autograd connection and epilogue, grad mode set back, and the same statistics in
``thunder.compile_stats`` (calls, cache hits, the last traces, prologue and computation, the host timestamps).
Under ``no_grad`` it runs the computation without thunder's ``@torch.no_grad() @no_autocast``, which there set off
what is off and back (`_undecorated`), and it does not call an epilogue that only returns its argument. It
hands the call to thunder's own path wherever that path does more: inside a trace, under autocast (thunder pushes
the autocast dtype for tracing), for a distributed module (DDP's and FSDP's no-sync flag), under a cache option
other than thunder's default, on every call where thunder or torch is not the version it reads the private parts of
(`thunder_nb.internals.supported`), and on a cache miss, where thunder tries the prologues again, traces, and adds the
entry that later calls hit. Its calls of thunder's path keep Python's cyclic garbage collector off meanwhile
(`thunder_nb.internals.cyclic_gc_off`: a collection inside thunder's tracing can fail the trace).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import internals
from ..diagnosis.failures import explain_trace_failure

__all__ = ["fast_call", "without_cyclic_gc", "autocast_of_each_call", "cache_info", "tensor_aliases"]

_Tensor = torch.Tensor
_STRIDED = torch.strided
_MISSING = object()
_LEAVES = (torch.Tensor, int, float, bool, str, type(None))  # NOTE: what thunder's pytree takes as one leaf each


def tensor_aliases(args: tuple, kwargs: dict) -> str:
    """thunder's ``cache_info["alias_tensor_indices"]`` for a call: the flat positions of the plain strided tensors
    among ``(args, kwargs)``'s leaves that share a storage, ``","``-joined per storage with more than one, the
    storages ``"-"``-joined in order of first appearance; ``""`` where none share."""
    if not kwargs and all(type(a) in _LEAVES for a in args):
        flat: Any = args  # NOTE: the leaves are the arguments themselves: no pytree flatten
    else:
        flat = internals.flatten((args, kwargs))
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(flat):
        # NOTE: as thunder: exactly ``torch.Tensor`` (a subclass may refuse ``data_ptr``), strided layout
        if type(t) is _Tensor and t.layout is _STRIDED:
            groups.setdefault(t.untyped_storage().data_ptr(), []).append(i)
    return "-".join(",".join(map(str, v)) for v in groups.values() if len(v) > 1)


def cache_info(args: tuple, kwargs: dict, check_aliases: bool = True) -> dict[str, Any]:
    """The cache-info dict thunder's ``populate_cache_info`` makes for a call outside autocast and distributed
    modules, in its order: default dtype and device, autocast off, the tensor aliases (`tensor_aliases`; left out
    under thunder's ``skip_inplace_alias_updates``), grad mode, no DDP no-sync."""
    info = {"default_dtype": torch.get_default_dtype(), "default_device": internals.default_device(),
            "is_autocast_enabled": False}
    if check_aliases:
        info["alias_tensor_indices"] = tensor_aliases(args, kwargs)
    info["is_grad_enabled"] = torch.is_grad_enabled()
    info["no_grad_sync"] = False
    return info


def _undecorated(fn: Any) -> Callable[..., Any] | None:
    """The function thunder's ``@torch.no_grad() @no_autocast`` decorate, where ``fn`` is exactly those two around it;
    else None. ``no_autocast`` sets autocast off for the call and then back to what it was when the function was made:
    a call outside autocast of an entry made outside autocast (its prologue checks it), under ``no_grad``, is the same
    without them."""
    inner = getattr(fn, "__wrapped__", None)
    bare = getattr(inner, "__wrapped__", None)
    if (getattr(getattr(fn, "__code__", None), "co_name", None) != "decorate_context"
            or getattr(getattr(inner, "__code__", None), "co_name", None) != "no_autocast_fn"
            or getattr(bare, "__wrapped__", None) is not None or not callable(bare)):
        return None
    cells = dict(zip(inner.__code__.co_freevars, inner.__closure__ or ()))
    try:
        if cells["prev_cpu"].cell_contents or cells["prev"].cell_contents:
            return None  # NOTE: made under autocast: its decorator turns autocast back on after each call
    except (KeyError, ValueError):
        return None
    return bare


def _returns_its_argument(traces: Any) -> bool:
    """Whether an epilogue (its last trace) does nothing but return its one argument (``def epilogue(t): return t``):
    no module state to write back, nothing to wrap."""
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import Proxy

    if not traces:
        return False
    trace = traces[-1]
    # NOTE: ``unpack_trivial`` only names an argument
    bsyms = [b for b in trace.bound_symbols if b.sym.id != PrimIDs.UNPACK_TRIVIAL]
    args = trace.args
    if len(bsyms) != 1 or bsyms[0].sym.id != PrimIDs.RETURN or len(args) != 1 or trace.kwargs:
        return False
    returned = bsyms[0].args
    return (len(returned) == 1 and not bsyms[0].kwargs and isinstance(returned[0], Proxy)
            and isinstance(args[0], Proxy) and returned[0].name == args[0].name)


def fast_call(jfn: Any) -> Any:
    """``jfn`` (what ``thunder.jit`` returned) with its calls made by `fast_call`'s path on a cache hit (see the
    module): a `thunder.ThunderModule`'s forward function is replaced and the module returned; a function is wrapped
    (its attributes, thunder's compile data and statistics among them, copied). `without_cyclic_gc` where thunder's
    path is taken on every call (a distributed module, a cache option without prologue lookups, a thunder or torch
    thunder-nb does not support: `thunder_nb.internals.supported`)."""
    import thunder

    cd, cs = thunder.compile_data(jfn), thunder.compile_stats(jfn)
    path = internals.call_path(cd)
    options = cd.compile_options
    if (path is None or getattr(cd.fn, "use_ddp", False) or getattr(cd.fn, "use_fsdp", False)
            or cd.cache_option not in path.caching):
        return without_cyclic_gc(jfn)
    module = isinstance(jfn, torch.nn.Module)
    slow: Callable[..., Any] = internals.module_forward(jfn) if module else jfn
    call = _hit_path(cd, cs, path, slow, check_aliases=not options.get("skip_inplace_alias_updates", False),
                     split_autograd=not options.get("thunderfx_disable_split_autograd", False),
                     differentiable=options.get("is_differentiable_outputs", None))
    if module:
        internals.set_module_forward(jfn, call)
        return jfn
    return functools.wraps(jfn)(call)


def autocast_of_each_call(module: Any) -> None:
    """Make the `thunder.ThunderModule` ``module`` call its forward function with thunder's autocast stack emptied
    first (`thunder_nb.internals.under_own_autocast`): a module jitted by thunder alone (``thunder.jit(model,
    transforms=[FixedCUDAGraphTransform()])``, or again by ``thunder.distributed.ddp``), whose calls no other wrapper
    of thunder-nb's makes. Nothing with another thunder."""
    import thunder

    internals.set_module_forward(module, internals.under_own_autocast(internals.module_forward(module),
                                                                      thunder.compile_data(module)))


def without_cyclic_gc(jfn: Any) -> Any:
    """``jfn`` (what ``thunder.jit`` returned) with each call of thunder's own path made with Python's cyclic garbage
    collector off (`thunder_nb.internals.cyclic_gc_off`: on a miss thunder traces, and a collection inside its
    tracing can fail the trace): a function is wrapped (its attributes copied), a `thunder.ThunderModule`'s forward
    function replaced and the module returned (itself, unguarded, on a thunder thunder-nb does not support)."""
    import thunder

    module = isinstance(jfn, torch.nn.Module)
    if module and not internals.supported():
        return jfn
    # NOTE: each call under its own autocast state alone (`internals.under_own_autocast`)
    cd = thunder.compile_data(jfn)
    thunders_path = _thunders_path(internals.under_own_autocast(internals.module_forward(jfn) if module else jfn, cd),
                                   cd)
    if module:
        internals.set_module_forward(jfn, thunders_path)
        return jfn
    return functools.wraps(jfn)(thunders_path)


def _thunders_path(slow: Callable[..., Any], cd: Any) -> Callable[..., Any]:
    """``slow`` (thunder's own path, which traces on a miss) called with Python's cyclic garbage collector off
    (`thunder_nb.internals.cyclic_gc_off`: a collection inside thunder's tracing can fail the trace), adding to what it
    raises, where thunder cannot trace an op or meets a known limit of its own, a note with what to do
    (`thunder_nb.diagnosis.failures.explain_trace_failure`): thunder's error alone is a registration's internals, or
    for ``nn.Embedding(max_norm=...)`` a bare ``NotImplementedError()``."""
    gc_off = internals.cyclic_gc_off()
    name = getattr(cd.fn, "__name__", type(cd.fn).__name__)

    def thunders_path(*args: Any, **kwargs: Any) -> Any:
        with gc_off:
            try:
                return slow(*args, **kwargs)
            except Exception as e:
                explain_trace_failure(e, name)
                raise

    return thunders_path


def _hit_path(cd: Any, cs: Any, path: internals.CallPath, slow: Callable[..., Any], *, check_aliases: bool,
              split_autograd: bool, differentiable: Any) -> Callable[..., Any]:
    """The call of `fast_call`: thunder's steps on a hit, ``slow`` (thunder's own path) everywhere else."""
    entries = cs.interpreter_cache
    pair = (cd, cs)
    info_var, data_var, lang_var, language = path.cache_info, path.compile_data, path.langctx, path.language
    is_tracing, connect = path.is_tracing, path.connect_to_autograd
    autocast_on = torch.is_autocast_enabled  # NOTE: ("cpu"), not the deprecated is_autocast_cpu_enabled: it warns
    grad_enabled, set_grad_enabled = torch.is_grad_enabled, torch.set_grad_enabled
    # NOTE: keyed by the functions themselves (hashed by identity, kept alive here: an id is never reused for another)
    identity: dict[Any, bool] = {}  # an entry's epilogue -> whether it returns its one argument as it is
    undecorated: dict[Any, Any] = {}  # an entry's computation -> it without thunder's decorators, or None
    now = time.perf_counter_ns
    # NOTE: each call of thunder's path under its own autocast state, the collector off, its errors explained
    thunders = _thunders_path(internals.under_own_autocast(slow, cd), cd)

    def call(*args: Any, **kwargs: Any) -> Any:
        if not entries or autocast_on() or autocast_on("cpu") or is_tracing():
            return thunders(*args, **kwargs)
        start = now()
        info = cache_info(args, kwargs, check_aliases)
        cd.is_grad_enabled = info["is_grad_enabled"]
        cache_start = now()
        info_token, lang_token, data_token = info_var.set(info), lang_var.set(language), data_var.set(pair)
        entry = None
        try:
            for e in reversed(entries):
                try:
                    inps, pro_to_epi = e.prologue_fn(*args, **kwargs)
                except Exception:  # NOTE: as thunder: a prologue that raises is a miss of its entry
                    continue
                entry = e
                break
        finally:
            data_var.reset(data_token)
            lang_var.reset(lang_token)
            info_var.reset(info_token)
        if entry is None:  # NOTE: a miss: thunder tries them again, then traces and adds the entry
            return thunders(*args, **kwargs)
        cs.calls += 1
        cs.cache_hits += 1
        cs.last_trace_host_start, cs.last_trace_cache_start = start, cache_start
        cs.last_traces = entry.computation_traces
        cs.last_interpreted_instructions = None
        cs.last_interpreter_log = None
        cs.last_prologue_traces = entry.prologue_traces
        cs.last_prologue = entry.prologue_fn
        cs.last_prologue_transformation_start = cs.last_prologue_transformation_stop = 0
        cs.last_computation_transformation_start = cs.last_computation_transformation_stop = 0
        computation = entry.computation_fn
        run = computation
        if not grad_enabled():
            # NOTE: grad and autocast already off: thunder's two decorators would set them off and back
            bare = undecorated.get(computation, _MISSING)
            if bare is _MISSING:
                bare = undecorated[computation] = _undecorated(computation)
            if bare is not None:
                run = bare
        cs.last_trace_host_execution_start = now()
        try:
            result = run(*inps)
        finally:
            cs.last_trace_host_execution_stop = now()
        if entry.backward_fn:
            data, (saved_tensors, saved_other) = result
            connect(backward_fn=entry.backward_fn, flat_args=data["flat_args"], flat_output=data["flat_output"],
                    saved_tensors=saved_tensors, saved_other=saved_other,
                    return_none_instead_of_grads=entry.return_none_instead_of_grads,
                    disable_split_autograd=not split_autograd, is_differentiable_outputs=differentiable)
            result = data["output"]
        epilogue = entry.epilogue_fn
        same = identity.get(epilogue)
        if same is None:
            same = identity[epilogue] = _returns_its_argument(entry.epilogue_traces)
        if same and len(pro_to_epi) + len(result) == 1:
            result = (*pro_to_epi, *result)[0]  # NOTE: what the epilogue would return, without its two decorators
        else:
            result = epilogue(*pro_to_epi, *result)
        if grad_enabled() != cd.is_grad_enabled:
            set_grad_enabled(cd.is_grad_enabled)
        cs.last_computation = computation
        cs.last_trace_host_stop = now()
        return result

    return call
