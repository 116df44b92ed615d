"""Every private thunder and torch name thunder-nb relies on, behind one version check."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, NamedTuple

__all__ = [
    "graph_pool_bytes",
    "THUNDER_VERSION",
    "TORCH_VERSION",
    "check_versions",
    "del_last_used",
    "build_traces",
    "CallPath",
    "call_path",
    "default_device",
    "has_traces",
    "saved_for_backward",
    "clear_cublas_workspaces",
    "copy_all",
    "copy_into",
    "storage_use_count",
    "metadata_guard",
    "ObjectGuard",
    "thunder_module_class",
    "THUNDER_MODULE_LOOKUPS",
    "data_ptrs_equal",
    "recover_generators",
    "compile_option",
    "fusion_symbol",
    "executors",
    "error_line",
    "raised_by_cuda_init",
    "raised_by_graph_capture",
    "untraceable_op",
    "UNTRACEABLE_REASONS",
    "thunder_limit",
    "source_line",
    "flat_output",
    "is_joint_trace",
    "flatten",
    "is_tensor_proxy",
    "own_parameters",
    "own_buffers",
    "own_modules",
    "use_counters",
    "storage_handle",
    "is_view",
    "fusion_callable",
    "wrap_fusion_callable",
    "set_implementations",
    "grad_rules",
    "sdpa_implementation",
    "inductor_kernel_count",
    "batch_norm_functional",
    "signature_info",
    "drop_signature_args",
    "module_forward",
    "set_module_forward",
    "is_jitted",
    "jit_transforms",
]

#: The versions whose private names this module was written against.
THUNDER_VERSION = "0.2.6"
TORCH_VERSION = "2.11"

_checked = False


class VersionWarning(UserWarning):
    """thunder or torch is not the version thunder-nb's private accesses were written for."""


def check_versions() -> None:
    """Warn once when thunder or torch differs from the pinned versions (private names may have moved)."""
    global _checked
    if _checked:
        return
    _checked = True
    import thunder
    import torch

    found = {"lightning-thunder": getattr(thunder, "__version__", "?"), "torch": torch.__version__}
    wanted = {"lightning-thunder": THUNDER_VERSION, "torch": TORCH_VERSION}
    for name, version in found.items():
        if not str(version).startswith(wanted[name]):
            warnings.warn(
                f"thunder-nb was written for {name} {wanted[name]}, found {version}: "
                "its private accesses (runner internals, del pass, capture) may not hold",
                VersionWarning,
                stacklevel=2,
            )


def del_last_used(bsyms: Sequence[Any], protected: Sequence[Any], *, clear_mutable_collections: bool = False) -> list[Any]:
    """thunder's del pass over bound symbols (``thunder.executors.passes._del_last_used``)."""
    from thunder.executors.passes import _del_last_used

    return _del_last_used(bsyms, protected, clear_mutable_collections=clear_mutable_collections)


def build_traces(jfn: Any, *args: Any, **kwargs: Any) -> None:
    """Build ``jfn``'s traces for these inputs without running the computation."""
    import thunder

    thunder.compile_data(jfn)._get_computation_and_inputs(*args, **kwargs)


class CallPath(NamedTuple):
    """The private parts of ``thunder.jit``'s call path that a call on a cache hit goes through (thunder 0.2.6's
    ``fn_`` and ``get_computation_and_inputs``), for `thunder_nb.cudagraph.call`."""

    cache_info: Any  # ContextVar: the dict the prologue reads its ``cache_info[...]`` entries from
    compile_data: Any  # ContextVar: (CompileData, CompileStats) while a prologue runs (``get_thunder_module``)
    langctx: Any  # ContextVar: the language context the prologue runs under
    language: Any  # the LanguageContext of ``jfn``'s compile data
    caching: tuple[Any, ...]  # the cache options under which thunder looks entries up by their prologues
    is_tracing: Callable[[], bool]  # inside a thunder trace: thunder calls the function itself there
    connect_to_autograd: Callable[..., None]


def call_path(cd: Any) -> CallPath:
    """`CallPath` for a jitted function's compile data ``cd``."""
    import thunder
    import thunder.core.compile_data as compile_data
    import thunder.core.langctxs as langctxs
    from thunder.core.options import CACHE_OPTIONS
    from thunder.core.trace import is_tracing
    from thunder.executors.torch_autograd import connect_to_autograd

    return CallPath(thunder._cache_info_ctx, compile_data._compile_data, langctxs._langctx,
                    langctxs.langctx(cd.langctx).langctx,
                    (CACHE_OPTIONS.CONSTANT_VALUES, CACHE_OPTIONS.SYMBOLIC_VALUES), is_tracing, connect_to_autograd)


_CPU: Any = None


def default_device() -> Any:
    """``torch.get_default_device()``, without its Python walk of the torch-function mode stack (on every call of
    `cudagraph.call.fast_call`) where that stack is empty and no default device was set (``torch.set_default_device`` and ``with
    torch.device(...)`` both push a mode): then it is the CPU."""
    import torch

    global _CPU
    if torch._C._len_torch_function_stack() == 0 and getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context",
                                                              None) is None:
        if _CPU is None:
            _CPU = torch.device("cpu")
        return _CPU
    return torch.get_default_device()


def has_traces(jfn: Any) -> bool:
    """Whether ``jfn`` has been traced at least once."""
    import thunder

    cs = thunder.compile_stats(jfn)
    return cs is not None and bool(cs.last_traces)


def saved_for_backward(trace: Any) -> tuple[Any, ...]:
    """The tensors an augmented forward trace saves for its backward (empty for other traces)."""
    from thunder.core import vjp_utils
    from thunder.core.trace import TraceTag

    out = trace.output
    # NOTE: a trace keeps its AUGMENTED_FORWARD tag where thunder returns no (outputs, saved) pair: under
    # no_grad, or when no output depends on an input that requires grad (it reaches them through .item())
    if TraceTag.AUGMENTED_FORWARD not in trace.tags or not (
        isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict) and isinstance(out[1], (tuple, list))
    ):
        return ()
    return tuple(vjp_utils.get_saved_for_backward_tensors(trace))


def copy_all(tensors: Sequence[Any]) -> list[Any]:
    """Copies of ``tensors``, each laid out as ``clone()`` lays it out, made by one `copy_into`.

    Tensor subclasses, and tensors whose copies autograd would record, are ``clone()``d.
    """
    import torch

    if len(tensors) < 2 or any(type(t) is not torch.Tensor for t in tensors) or (
            torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return [t.clone() for t in tensors]
    out = [torch.empty_like(t) for t in tensors]  # NOTE: preserve_format: clone's strides, dense or not
    copy_into(out, tensors)
    return out


def copy_into(targets: Sequence[Any], sources: Sequence[Any]) -> None:
    """``targets[i].copy_(sources[i])`` for each i, in one ``torch._foreach_copy_`` (a few kernel launches, not one
    each).

    Where autograd would record a copy, each is a ``copy_`` of its own.
    """
    import torch

    if len(targets) < 2 or (torch.is_grad_enabled() and any(t.requires_grad for t in sources)):
        for t, s in zip(targets, sources):
            t.copy_(s)
        return
    torch._foreach_copy_(list(targets), list(sources))


def compile_option(name: str, description: str) -> Any:
    """A ``thunder.jit`` compile option of the function being compiled (None outside compilation)."""
    from thunder.core.compile_data import get_compile_option

    return get_compile_option(name, description)


def clear_cublas_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces, so that the next matmul allocates a fresh one.

    Called right before and after recording a graph: the workspace the recording allocates then lies
    in the graph's private pool, which lives as long as the graph. Without it the graph records a
    workspace from the ordinary allocator that anyone may free later (torch.compile's CUDA-graph
    trees clear these workspaces when they record), and a replay then writes freed memory.
    """
    import torch

    torch._C._cuda_clearCublasWorkspaces()


def storage_use_count(t: Any) -> int:
    """How many tensors (and storage handles) share ``t``'s storage."""
    import torch

    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def metadata_guard(tensors: Sequence[Any]) -> Callable[..., bool] | None:
    """A C function ``check(*ts)``: whether each ``ts[i]`` has ``tensors[i]``'s Python type, dtype, device index,
    ``requires_grad``, dispatch keys, sizes and strides (torch.compile's guard on its tensor inputs).

    Made and called under the same grad-independent dispatch state (a region's call site); None where torch has none.
    """
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:  # pragma: no cover - a torch without dynamo's C guards
        return None
    return TensorGuards(*tensors, dynamic_dims_sizes=[list(t.size()) for t in tensors],
                        dynamic_dims_strides=[list(t.stride()) for t in tensors]).check


class ObjectGuard:
    """A C check over objects reached from one root (torch.compile's guard trees, ``RootGuardManager``).

    Build it with `ObjectGuard.make`, then describe what must still hold through `Node` s: ``node.item(key)``
    reads an item of the dict the node is, ``node.instance_dict()`` its object's ``__dict__``, ``node.type()`` its
    type, ``node.mro()`` a type's ``__mro__``, ``node.tuple_item(i)``, ``node.type_dict()`` a type's own dict;
    ``is_(obj)``, ``type_is(cls)``, ``equals(value)``, ``lacks(key)`` and ``unchanged(d)`` (no write to the dict
    since: its version tag) check the node's value. ``check(root)`` is then one C call, False where a read fails.
    Each node is made once per path (``name``), so its reads are made once per check.
    """

    class Node:
        __slots__ = ("_manager", "_name", "_children")

        def __init__(self, manager: Any, name: str):
            self._manager, self._name, self._children = manager, name, {}

        def _child(self, kind: str, key: Any, example: Any, make: Callable[..., Any]) -> ObjectGuard.Node:
            node = self._children.get((kind, key))
            if node is None:
                from torch._dynamo.guards import GuardManagerType

                name = f"{self._name}{kind}{key!r}"
                manager = make(source=name, example_value=example, guard_manager_enum=GuardManagerType.GUARD_MANAGER)
                node = self._children[(kind, key)] = ObjectGuard.Node(manager, name)
            return node

        def item(self, key: Any, example: Any) -> ObjectGuard.Node:
            return self._child("[]", key, example, lambda **kw: self._manager.dict_getitem_manager(key=key, **kw))

        def instance_dict(self, example: dict) -> ObjectGuard.Node:
            return self._child(".__dict__", "", example, self._manager.get_generic_dict_manager)

        def type(self, example: type) -> ObjectGuard.Node:
            return self._child(".__class__", "", example, self._manager.type_manager)

        def mro(self, example: tuple) -> ObjectGuard.Node:
            return self._child(".__mro__", "", example, self._manager.type_mro_manager)

        def tuple_item(self, i: int, example: Any) -> ObjectGuard.Node:
            return self._child("()", i, example, lambda **kw: self._manager.tuple_getitem_manager(key=i, **kw))

        def type_dict(self, example: dict) -> ObjectGuard.Node:
            return self._child(".tp_dict", "", example, self._manager.type_dict_manager)

        def is_(self, obj: Any) -> None:
            self._manager.add_id_match_guard(id(obj), [f"{self._name} is the same object"], None)

        def type_is(self, cls: type) -> None:
            self._manager.add_type_match_guard(id(cls), [f"type({self._name}) is {cls.__qualname__}"], None)

        def lacks(self, key: Any) -> None:
            self._manager.add_dict_contains_guard(False, key, [f"{key!r} not in {self._name}"], None)

        def unchanged(self, d: dict) -> None:
            self._manager.add_dict_version_guard(d, [f"{self._name} unchanged"], None)

        def equals(self, value: Any) -> None:
            self._manager.add_equals_match_guard(value, [f"{self._name} == {value!r}"], None)

    def __init__(self, manager: Any):
        self.root = ObjectGuard.Node(manager, "root")
        self.check: Callable[[Any], bool] = manager.check

    @staticmethod
    def make() -> ObjectGuard | None:
        """An empty guard (every check passes until nodes add reads); None where torch has no guard trees."""
        try:
            from torch._C._dynamo.guards import RootGuardManager
            from torch._dynamo.guards import GuardManagerType  # noqa: F401
        except ImportError:  # pragma: no cover - a torch without dynamo's C guards
            return None
        return ObjectGuard(RootGuardManager())

    @staticmethod
    def type_dict_of(cls: type) -> dict:
        """The dict behind ``cls.__dict__`` (a read-only proxy of it)."""
        import gc

        (d,) = [r for r in gc.get_referents(cls.__dict__) if type(r) is dict]
        return d


#: The dicts a ``thunder.ThunderModule`` reads first in its ``get_submodule``, ``get_parameter`` and ``get_buffer``
#: (thunder 0.2.6: its module cache and its parameter and buffer overrides, filled when it is made), by lookup kind.
THUNDER_MODULE_LOOKUPS = {"submodule": "_module_cache", "parameter": "_overrides_parameters",
                          "buffer": "_overrides_buffers"}


def thunder_module_class() -> type:
    """``thunder.core.module.ThunderModule``."""
    from thunder.core.module import ThunderModule

    return ThunderModule


def data_ptrs_equal(tensors: list[Any], ptrs: list[int | None], indices: list[int]) -> bool:
    """Whether ``tensors[i].data_ptr() == ptrs[i]`` for each i in ``indices``, in one C call (as torch.compile's
    CUDA-graph trees check their static inputs)."""
    import torch

    return torch._C._tensors_data_ptrs_at_indices_equal(tensors, ptrs, indices)


def recover_generators() -> None:
    """Leave CUDA's random number generators usable after a capture that failed.

    torch 2.11 ends a failed capture without its generator epilogue, so each default CUDA generator
    stays in capture mode and the next random op outside a capture raises "Offset increment outside
    graph capture encountered unexpectedly" (pytorch/pytorch#171263). A fresh copy of each
    generator's state (same seed and offset, not capturing) puts that right.
    """
    import torch

    if not torch.cuda.is_available():
        return
    for generator in torch.cuda.default_generators:
        try:
            generator.graphsafe_set_state(generator.clone_state())
        except RuntimeError:  # NOTE: a device still capturing, or one torch never initialised
            pass


def current_stream() -> Any:
    """The current CUDA stream, or None where CUDA is not initialised (nothing to put back then but the default)."""
    import torch

    return torch.cuda.current_stream() if torch.cuda.is_available() and torch.cuda.is_initialized() else None


def recover_stream(stream: Any = None) -> None:
    """Make ``stream`` current again after a capture that failed (the device's default stream for None).

    ``torch.cuda.graph.__exit__`` (torch 2.11) ends the capture before it leaves its stream context: when
    ``capture_end`` raises ("operation failed due to a previous error during capture", after an ``.item()`` inside
    the capture, say), the capture's side stream stays current, and every later op of the thread runs on it:
    eager steps after a failed capture warned that AccumulateGrad's stream did not match, and their timings ran
    on that stream.
    """
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    target = stream if stream is not None else torch.cuda.default_stream()
    if torch.cuda.current_stream() != target:
        torch.cuda.set_stream(target)


def recover_capture(stream: Any = None) -> None:
    """After a capture that failed: the generators (`recover_generators`) and ``stream`` current again
    (`recover_stream`; the device's default stream for None)."""
    recover_generators()
    recover_stream(stream)


def fusion_symbol(name: str, executor: Any, fn: Callable[..., Any], inputs: Sequence[Any], outputs: Sequence[Any],
                  subsymbols: Sequence[Any] = ()) -> Any:
    """A bound symbol that calls ``fn`` under ``name`` in generated code (how thunder calls a region)."""
    from thunder.core.symbol import BoundSymbol, Symbol

    sym = Symbol(name, meta=None, is_fusion=True, executor=executor)
    return BoundSymbol(sym, tuple(inputs), {}, tuple(outputs), list(subsymbols), _call_ctx={name: fn})


# --- telling failures apart -------------------------------------------------------------------------


def error_line(e: BaseException) -> str:
    """``ValueError: boom``: the exception's type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def raised_by_cuda_init(e: BaseException) -> bool:
    """Whether ``e`` (or an error it was raised from) came out of torch's lazy CUDA initialisation: no usable GPU.

    torch raises a plain RuntimeError ("Found no NVIDIA driver", "no CUDA GPUs are available") or an
    AssertionError ("Torch not compiled with CUDA enabled") there; where it was raised tells them apart.
    """
    return _raised_in(e, "torch.cuda", ("_lazy_init",))


def raised_by_graph_capture(e: BaseException) -> bool:
    """Whether ``e`` (or an error it was raised from) came out of torch beginning or ending a CUDA-graph capture.

    An op that is illegal under capture (a host sync) invalidates it, and torch then raises a plain
    ``torch.AcceleratorError`` when the capture ends ("operation failed due to a previous error during
    capture"), from `torch.cuda.graphs`.
    """
    return _raised_in(e, "torch.cuda.graphs", ("capture_begin", "capture_end", "__enter__", "__exit__"))


def _raised_in(e: BaseException, module: str, functions: Sequence[str]) -> bool:
    return any(f.f_globals.get("__name__") == module and f.f_code.co_name in functions
               for err in _chain(e) for f in _frames(err.__traceback__))


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e`` and the errors it was raised from or while handling, each once."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


#: Why thunder 0.2.6 refuses to trace an op (`untraceable_op`).
UNTRACEABLE_REASONS = ("data-dependent-shape", "boolean-mask", "data-dependent-value", "to-python", "python-scalar",
                       "unsupported")

# NOTE: thunder 0.2.6 raises a bare NotImplementedError for every op it cannot trace and names the op only in
# its message, so this table reads the message's first line: (pattern, reason; None: the error's cause decides)
_UNTRACEABLE_MESSAGES: tuple[tuple[str, str | None], ...] = (
    (r"registration for (\w+),", None),
    (r"(boolean) advanced indexing", "boolean-mask"),
    (r"casting a TensorProxy to a Python (\w+)", "python-scalar"),
    (r"Trying to call function ([\w.]+), but it is not yet supported", "unsupported"),
)
#: Python's name for the type thunder's message names ("casting a TensorProxy to a Python boolean").
_PYTHON_TYPES = {"boolean": "bool"}


#: thunder 0.2.6's own limits that packaged models meet, read from its messages (the first line of the error or of
#: any exception it chained): (pattern, `thunder_nb.diagnosis.failures.LIMITS` key).
_LIMIT_MESSAGES: tuple[tuple[str, str], ...] = (
    (r"torch\.where\(\) does not support only specifying a condition", "where-condition"),
    (r"Only inplace=False is currently supported in dropout", "dropout-inplace"),
    (r"grad_forward_sdpa: Expected all inputs to have same batch_size", "sdpa-batch"),
    (r"query and dout must have the same dtype", "sdpa-dtype"),
    (r"'wrapper_descriptor' object has no attribute '__self__'", "interpreter-slot-wrapper"),
    (r"Failed to find a gradient transform for bound symbol", "no-grad-transform"),
)


def thunder_limit(e: BaseException) -> str | None:
    """The key of a known limit of thunder that ``e`` (or an exception it chains) reports, or None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).strip()
        for pattern, key in _LIMIT_MESSAGES:
            if re.search(pattern, text):
                return key
        e = e.__cause__ or e.__context__
    return None


def untraceable_op(e: BaseException) -> tuple[str, str] | None:
    """``(op, reason)`` when ``e`` is thunder refusing to trace an op: ``("nonzero", "data-dependent-shape")``.

    ``op`` is the name the user called (``nonzero``, ``tolist``, ``float`` for ``float(x)``, ``torch._unique2``)
    and ``reason`` one of `UNTRACEABLE_REASONS`; None when ``e`` is something else.
    """
    if not isinstance(e, NotImplementedError):
        return None
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    for pattern, reason in _UNTRACEABLE_MESSAGES:
        m = re.search(pattern, first)
        if m is None:
            continue
        op = _PYTHON_TYPES.get(m.group(1), m.group(1))
        reason = reason or _registration_reason(e.__cause__, op)
        return (op, reason) if reason is not None else None
    return None


def _registration_reason(cause: BaseException | None, op: str) -> str | None:
    """Why running an op on thunder's fake tensors failed, from the exception it raised there."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    if isinstance(cause, DynamicOutputShapeException):
        return "data-dependent-shape"
    if isinstance(cause, DataDependentOutputException):
        return "data-dependent-value"
    if op in ("tolist", "numpy"):  # NOTE: a plain RuntimeError from the fake tensor: these never trace
        return "to-python"
    return None


# --- executors --------------------------------------------------------------------------------------


def graph_pool_bytes(graph: Any) -> int | None:
    """The bytes of the segments the caching allocator holds in ``graph``'s private pool (its outputs and
    intermediates), read as torch.compile's CUDA-graph trees read them (``segment_pool_id``); None without a pool."""
    pool = getattr(graph, "pool", None)
    if pool is None:
        return None
    import torch

    pid = tuple(pool())
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == pid)


# --- traces and modules, as jit_step reads them -----------------------------------------------------


def source_line(bsym: Any) -> tuple[str, int] | None:
    """``(file, line)`` of the user's code that made the bound symbol ``bsym``; None where thunder kept none."""
    pos = getattr(bsym, "source_positions", None)
    filename = getattr(bsym, "source_filename", None)
    return (filename, pos.lineno) if filename and pos is not None else None


def flatten(tree: Any) -> list[Any]:
    """The leaves of a thunder pytree (``thunder.core.pytree.tree_flatten``)."""
    from thunder.core.pytree import tree_flatten

    return tree_flatten(tree)[0]


def flat_output(trace: Any) -> tuple[Any, ...] | None:
    """The flattened outputs of the user's function in a forward trace that returns ``({"flat_output": ...}, saved)``
    (thunder's split forward); None for a trace of another form."""
    out = trace.output
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict) and "flat_output" in out[0]:
        return tuple(flatten(out[0]["flat_output"]))
    return None


def is_joint_trace(trace: Any) -> bool:
    """Whether ``trace`` is thunder's trace of a forward and its backward together, which thunder splits in two after
    its fusion passes (``split_into_forward_and_backward`` reads the forward's outputs from its ``"fw_flat_out"``)."""
    out = trace.output
    return isinstance(out, dict) and "fw_flat_out" in out


def is_tensor_proxy(x: Any) -> bool:
    """Whether ``x`` is a thunder tensor proxy (a tensor in a trace)."""
    from thunder.core.proxies import TensorProxy

    return isinstance(x, TensorProxy)


def own_parameters(module: Any) -> dict[str, Any]:
    """``module``'s own parameters by name, the live dict (None for one registered as None): ``module._parameters``."""
    return module._parameters


def own_buffers(module: Any) -> dict[str, Any]:
    """``module``'s own buffers by name, the live dict: ``module._buffers``."""
    return module._buffers


def own_modules(module: Any) -> dict[str, Any]:
    """``module``'s direct submodules by name, the live dict: ``module._modules``."""
    return module._modules


# --- the keys of a dict in a guard (`thunder_nb.cudagraph.prologue`'s guard of a module's members, issue 50) -------


def guard_dict_keys(node: ObjectGuard.Node, d: dict, keys: Any) -> None:
    """Add to ``node``, a guard's node of the dict ``d``, that the dict still has ``len(d)`` keys and each of ``keys``
    (torch.compile's dict length and dict-contains guards)."""
    manager = node._manager
    manager.add_dict_length_check_guard(len(d), [f"len({node._name}) == {len(d)}"], None)
    for key in keys:
        manager.add_dict_contains_guard(True, key, [f"{key!r} in {node._name}"], None)


def compiling_now() -> Any:
    """The compile data of the function thunder is compiling now (its ``transforms``, ``fn``, ``is_module``), or None
    outside a compilation."""
    from thunder.core.compile_data import get_compile_data

    return get_compile_data()


def thunder_modules_of(cd: Any) -> list[Any]:
    """The modules thunder made for a compilation's function: its ``fn`` and the ThunderModules it maps."""
    return [cd.fn, *getattr(cd, "_thunder_module_map", {}).values()]


# --- the runtime's other private reads: memory counts, fusions, executors, signatures, jitted functions -----------


def use_counters() -> tuple[Callable[[int], int], Callable[[Any], int]]:
    """torch's C functions that count the users of memory, for the replay guards' C loops: (a storage's use count by
    its handle, `storage_handle`; a tensor object's C++ use count)."""
    import torch

    return torch._C._storage_Use_Count, torch.Tensor._use_count


def storage_handle(t: Any) -> int:
    """The handle of ``t``'s storage that `use_counters`' first function reads (``untyped_storage()._cdata``)."""
    return t.untyped_storage()._cdata


def is_view(t: Any) -> bool:
    """Whether the tensor ``t`` is a view of another (``t._base``)."""
    return t._base is not None


def fusion_callable(bsym: Any) -> Callable[..., Any] | None:
    """The callable a fusion bound symbol runs under its own name (None: not a fusion)."""
    return (getattr(bsym, "_call_ctx", None) or {}).get(bsym.sym.name)


def wrap_fusion_callable(bsym: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Make the fusion bound symbol ``bsym`` run ``wrap(f)`` in place of its callable ``f``."""
    name = bsym.sym.name
    bsym._call_ctx = {name: wrap(bsym._call_ctx[name])}


def set_implementations(ex: Any, implmap: dict[Any, Any]) -> None:
    """Give the executor ``ex`` these implementations (its ``implmap``, which thunder exposes read-only)."""
    ex._implmap = implmap


def grad_rules() -> dict[Any, Any]:
    """thunder's own backward rules by symbol id (``thunder.core.transforms._grad_fn_map``)."""
    from thunder.core.transforms import _grad_fn_map

    return _grad_fn_map


def sdpa_implementation() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """thunder's sdpa executor's (checker, execution transform, grad transform) of fused attention."""
    from thunder.executors import sdpaex

    return (sdpaex._scaled_dot_product_attention_checker, sdpaex._scaled_dot_product_attention_fused,
            sdpaex._scaled_dot_product_attention_grad)


def inductor_kernel_count() -> int | None:
    """How many kernels inductor has generated in this process (None: torch has no such metric)."""
    try:
        from torch._inductor import metrics
    except ImportError:
        return None
    return metrics.generated_kernel_count


def batch_norm_functional() -> Any:
    """``aten._native_batch_norm_legit_functional``: a training batch norm that returns its new running statistics."""
    import torch

    return torch.ops.aten._native_batch_norm_legit_functional


def signature_info(trace: Any) -> Any:
    """``trace``'s record of its signature (the arguments it takes), None where thunder kept none."""
    return getattr(trace, "_siginfo", None)


def drop_signature_args(trace: Any, source: Any, names: Any) -> None:
    """Give ``trace`` a copy of ``source``'s signature record without the arguments ``names``."""
    import copy

    trace._siginfo = copy.copy(source._siginfo)
    trace._siginfo.args = [(name, default) for name, default in source._siginfo.args if name not in names]


def module_forward(jfn: Any) -> Callable[..., Any]:
    """The function a `thunder.ThunderModule` calls as its forward."""
    return jfn._forward_fn


def set_module_forward(jfn: Any, fn: Callable[..., Any]) -> None:
    """Make the `thunder.ThunderModule` ``jfn`` call ``fn`` as its forward."""
    jfn._forward_fn = fn


def is_jitted(fn: Any) -> bool:
    """Whether ``fn`` is what ``thunder.jit`` returned (it carries thunder's compile data)."""
    return hasattr(fn, "_lc_cd")


def jit_transforms(jfn: Any) -> list[Any]:
    """The transforms ``thunder.jit`` was given for ``jfn``, in order."""
    return jfn._lc_transforms
