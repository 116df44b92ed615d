"""Which thunder ops must never be captured, how types read, and which names alias: shared by the transform and the
checker (and the collectives of thunder's data parallelism, which run outside every graph: `is_collective`)."""

from __future__ import annotations

import functools

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .model import TypeInfo

__all__ = [
    "HOST_SYNC_NAMES",
    "TRANSFER_NAMES",
    "METADATA_NAMES",
    "BOOKKEEPING_NAMES",
    "COLLECTION_NAMES",
    "IN_PLACE_NAMES",
    "WRITES_ARGUMENT",
    "IN_PLACE_FORMS",
    "VIEW_NAMES",
    "parse_type",
    "type_of_proxy",
    "classify_op",
    "classify_bsym",
    "capture_hazard",
    "CAPTURE_DEPENDENT",
    "CAPTURE_DEPENDENT_ATEN",
    "CaptureDependent",
    "HOST_DATA_NAMES",
    "RANDOM_NAMES",
    "COLLECTIVE_NAMES",
    "collective_names",
    "is_collective",
    "is_future",
    "collective_op",
    "alias_root",
    "base_name",
    "returned_names",
]

#: Ops whose result is read by the host: never capturable, whatever their tags say.
HOST_SYNC_NAMES = frozenset(
    {
        "item",
        "_local_scalar_dense",
        "tolist",
        "numpy",
        "nonzero",
        "masked_select",
        "unique",
        "bincount",
        "equal",
        "get_and_update_rng_state",
    }
)
#: Ops that draw random numbers (thunder's names, and the torch executor's): a compiled run draws other numbers
#: than eager PyTorch, so its values cannot be held against eager's.
RANDOM_NAMES = frozenset({"uniform", "uniform_philox", "bernoulli", "randn", "rand", "randint", "normal", "randn_like",
                          "rand_like", "randint_like", "multinomial", "dropout", "native_dropout", "randperm",
                          "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d",
                          "dropout3d", "gumbel_softmax", "fractional_max_pool2d", "fractional_max_pool3d",
                          "fractional_max_pool2d_with_indices", "fractional_max_pool3d_with_indices", "poisson",
                          "binomial", "bernoulli_", "uniform_", "normal_", "exponential_", "exponential"})
#: Ops that change device by name.
TRANSFER_NAMES = frozenset({"cpu", "cuda", "device_put"})
#: Ops that take a tensor and yield numbers from metadata only (no host sync).
METADATA_NAMES = frozenset(
    {"shape", "size", "numel", "dim", "ndim", "stride", "is_contiguous", "element_size", "storage_offset", "get_device"}
)
#: Trace bookkeeping that stays at top level.
BOOKKEEPING_NAMES = frozenset(
    {"unpack_trivial", "unpack_sequence", "unpack_key", "unpack_empty_dict", "unpack_attr", "return", "python_return"}
)
COLLECTION_NAMES = frozenset({"clear_mutable_collection"})

#: Ops that copy data from host memory onto the device (a list index ``x[:, [-1]]``, ``torch.tensor(list)``, a numpy
#: constant): a pageable host-to-device copy, which CUDA refuses during capture. thunder puts a
#: ``prims.tensor_from_sequence`` among their subsymbols, and the torch executor then runs the whole op
#: (``Tensor.__getitem__`` with the list) as one call.
HOST_DATA_NAMES = frozenset({"tensor_from_sequence", "from_numpy", "as_tensor", "tensor", "numpy_array_to_torch_tensor"})


@functools.cache  # NOTE: at the first question, not at import: `import thunder_nb` does not import thunder
def collective_names() -> frozenset[str]:
    """`COLLECTIVE_NAMES`: the symbols of ``thunder.distributed.prims`` that never enter a region, by name, with the
    torch executor's implementations of them: the collectives (``all_reduce``, ``all_gather``, ``reduce_scatter``,
    ``broadcast``), the ``wait`` on their result, ``synchronize`` (a no-op in a replicated forward),
    ``update_bucket_view`` (reads a Python dict of buckets) and ``stash_grad_for_fsdp`` (sets an attribute of the
    parameter). A graph replays none of what they do on the host: a collective recorded into one would be launched
    again at each replay without its process group (no handle to wait for, no timeout watching it), and each new
    recording's warm-up calls would launch it on that rank alone, out of step with the others. Outside the graphs
    every rank launches and waits for each one itself, in the same order. Made from thunder's distributed prims at
    the first question, not at import (``import thunder_nb`` imports no thunder)."""
    from thunder.distributed.prims import PrimIDs

    # NOTE: pack, unpack and their FSDP forms only reshape and copy tensors: they may join a region
    kept_in = {PrimIDs.PACK, PrimIDs.UNPACK, PrimIDs.PACK_FOR_FSDP, PrimIDs.UNPACK_FOR_FSDP}
    names = set()
    for pid in PrimIDs:
        if pid in kept_in:
            continue
        name = pid.name.lower()
        names.add(name)  # NOTE: the prim itself, before an executor claims it
        names.add(f"torch_{name}_prim_impl")  # NOTE: thunder's torch executor's implementation
    return frozenset(names)


def __getattr__(name: str) -> Any:
    if name == "COLLECTIVE_NAMES":
        return collective_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def collective_op(name: str) -> str:
    """The collective a symbol's name runs: ``"torch_all_reduce_prim_impl"`` -> ``"all_reduce"``."""
    base = name.rsplit(".", 1)[-1]
    if base.startswith("torch_") and base.endswith("_prim_impl"):
        return base[len("torch_"):-len("_prim_impl")]
    return base


def is_future(t: TypeInfo) -> bool:
    """Whether a value is a communication handle: what a collective launched asynchronously returns and its
    ``wait`` takes (thunder's ``FutureTensorProxy``; its type comment reads ``FUTURE ... f32[8]``)."""
    return t.kind == "other" and t.text.lower().startswith("future")


def is_collective(bsym: Any) -> bool:
    """Whether thunder's bound symbol ``bsym`` is one of `COLLECTIVE_NAMES`, or takes or makes a future tensor (what a
    collective launched asynchronously returns and its ``wait`` takes)."""
    from thunder.core.proxies import FutureTensorProxy

    if bsym.sym.name in collective_names():
        return True
    return any(isinstance(p, FutureTensorProxy) for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs))


@dataclass(frozen=True, slots=True)
class CaptureDependent:
    """An op some of whose tensors are host memory when it runs outside a capture and device memory inside one.

    torch's ``Note [Seed and Offset]`` (``torch/_meta_registrations.py``): fused attention with dropout returns
    its random generator's philox seed and offset as CPU tensors outside a capture and as CUDA tensors during
    one, and its backward reads them as the memory it expects for its own mode. thunder types them as
    device tensors either way. A backward run outside a graph (a warm-up, an eager call) on a seed a forward
    graph wrote dereferences a device pointer on the host: SIGSEGV, the process dies. A backward graph on a
    seed an eager forward made reads host memory on the device.
    """

    # NOTE: the transform keeps the whole op out of graphs; the positions say which tensors carry the hazard (the
    # tests check them against thunder's signatures, and the GPU test shows the crash they explain)
    outputs: tuple[int, ...] = ()  # positions of the capture-dependent outputs (a forward)
    inputs: tuple[int, ...] = ()  # positions of the capture-dependent arguments (a backward)
    dropout: int = 0  # position of ``dropout_p``: with a literal 0 no seed is made nor read


#: thunder's symbols with capture-dependent tensors, by name. `tests/diagnosis/test_capture_hazards.py` checks that
#: every aten op torch's note names maps to them (`CAPTURE_DEPENDENT_ATEN`) and that the positions are thunder's;
#: `tests/test_gpu_zoo.py` that thunder's transform dies where the checker says.
CAPTURE_DEPENDENT: dict[str, CaptureDependent] = {
    # sdpaex: memory-efficient attention, forward (out, logsumexp, seed, offset) and backward
    "sdpaex_grad_forward_scaled_dot_product_efficient_attention": CaptureDependent(outputs=(2, 3), dropout=4),
    "sdpaex_scaled_dot_product_efficient_attention_backward": CaptureDependent(inputs=(7, 8), dropout=9),
    # sdpaex: flash attention (thunder's name says "efficient"), forward and backward
    "sdpafx_grad_forward_scaled_dot_product_efficient_attention": CaptureDependent(outputs=(6, 7), dropout=3),
    "sdpafx_scaled_dot_product_efficient_attention_backward": CaptureDependent(inputs=(12, 13), dropout=10),
}

#: The aten ops of torch's note and the thunder symbols that run them (an empty tuple: thunder has none).
CAPTURE_DEPENDENT_ATEN: dict[str, tuple[str, ...]] = {
    "_scaled_dot_product_efficient_attention": ("sdpaex_grad_forward_scaled_dot_product_efficient_attention",),
    "_scaled_dot_product_flash_attention": ("sdpafx_grad_forward_scaled_dot_product_efficient_attention",),
    "_scaled_dot_product_cudnn_attention": (),
    "_scaled_dot_product_fused_attention_overrideable": (),
    "_efficient_attention_forward": (),
    "_flash_attention_forward": (),
}

_TENSOR_TYPE = re.compile(r"^(?P<device>\S+) (?P<dtype>[a-z]+\d*)\[(?P<shape>[^\]]*)\]$")
_NUMBER_TYPES = {"float", "int", "bool", "complex"}


def parse_type(text: str) -> TypeInfo:
    """Parse a thunder type comment such as ``"cuda:0 f32[8, 16]"``, ``"float ?"`` or ``"Collection"``."""
    text = text.strip()
    m = _TENSOR_TYPE.match(text)
    if m:
        dims = tuple(int(d) for d in m.group("shape").replace(" ", "").split(",") if d.strip().lstrip("-").isdigit())
        return TypeInfo("tensor", m.group("dtype"), dims, m.group("device"), text)
    head = text.split(" ", 1)[0]
    if head in _NUMBER_TYPES:
        return TypeInfo("number", head, None, None, text)
    if head == "Collection":
        return TypeInfo("collection", None, None, None, text)
    return TypeInfo("other", None, None, None, text)


def type_of_proxy(p: Any) -> TypeInfo:
    """Return the `TypeInfo` of a thunder proxy (or a constant)."""
    from thunder.core.proxies import CollectionProxy, FutureTensorProxy, NumberProxy, TensorProxy

    if isinstance(p, FutureTensorProxy):  # NOTE: a communication handle, not a tensor (`is_future`)
        dtype = getattr(p.dtype, "shortname", lambda: str(p.dtype))()
        dims = ",".join(str(s) for s in p.shape)
        return TypeInfo("other", dtype, None, None, f"future {dtype}[{dims}]")
    if isinstance(p, TensorProxy):
        dtype = getattr(p.dtype, "shortname", lambda: str(p.dtype))()
        dev = str(p.device.device_str()) if hasattr(p.device, "device_str") else str(p.device)
        shape = tuple(int(s) if isinstance(s, int) else -1 for s in p.shape)
        dims = ", ".join(str(s) for s in shape)
        return TypeInfo("tensor", dtype, shape, dev, f"{dev} {dtype}[{dims}]")
    if isinstance(p, NumberProxy):
        py = getattr(p, "python_type", None)
        name = py.__name__ if isinstance(py, type) else "number"
        return TypeInfo("number", name, None, None, f"{name} ?")
    if isinstance(p, CollectionProxy):
        return TypeInfo("collection", None, None, None, "Collection")
    if isinstance(p, (bool, int, float, complex)):
        return TypeInfo("number", type(p).__name__, None, None, f"{type(p).__name__} {p}")
    return TypeInfo("other", None, None, None, type(p).__name__)


def classify_op(
    name: str,
    in_types: Sequence[TypeInfo],
    out_types: Sequence[TypeInfo],
    *,
    sync_tag: bool = False,
    cuda_trace: bool = False,
) -> tuple[str, str] | None:
    """Decide whether an op must stay outside CUDA graphs.

    Args:
        name: the op's name as thunder prints or names it (``"Tensor.item"``, ``"item"``, ``"torch.sin"``).
        in_types: types of its arguments.
        out_types: types of its results.
        sync_tag: the op (or a subsymbol) carries thunder's DEVICE_SYNC_OP tag.
        cuda_trace: the trace computes on a CUDA device (then CPU tensor ops cannot be replayed).

    Returns:
        ``(reason, detail)`` with reason one of ``"collective"`` (detail: the collective, ``"all_reduce"`` or
        ``"wait"``; `COLLECTIVE_NAMES`, or an op that takes or makes a communication handle), ``"host-sync"``,
        ``"device-transfer"``, ``"cpu-op"``; None when the op can be captured. (`classify_bsym` adds
        `capture_hazard`'s reasons, which names and types alone do not show.)
    """
    base = name.rsplit(".", 1)[-1]
    if _bookkeeping(base):
        return None
    if base in collective_names() or any(is_future(t) for t in (*in_types, *out_types)):
        return ("collective", collective_op(base))
    tensors_in = [t for t in in_types if t.kind == "tensor"]
    tensors_out = [t for t in out_types if t.kind == "tensor"]
    if sync_tag or base in HOST_SYNC_NAMES:
        return ("host-sync", base)
    if tensors_in and any(t.kind == "number" for t in out_types) and base not in METADATA_NAMES:
        return ("host-sync", base)
    devs_in = sorted({t.device for t in tensors_in if t.device})
    devs_out = sorted({t.device for t in tensors_out if t.device})
    if devs_in and devs_out and devs_in != devs_out:
        return ("device-transfer", f"{','.join(devs_in)} -> {','.join(devs_out)}")
    if base in TRANSFER_NAMES and tensors_in:
        return ("device-transfer", base)
    if cuda_trace and any(t.device == "cpu" for t in tensors_in + tensors_out):
        return ("cpu-op", base)
    return None


def _bookkeeping(base: str) -> bool:
    """Whether an op of this name is trace bookkeeping, never classified: unpacking, returning, clearing, deleting."""
    return base in BOOKKEEPING_NAMES or base in COLLECTION_NAMES or base in ("del", "python_del")


def _literal_zero(x: Any) -> bool:
    return type(x) in (int, float) and x == 0


def _makes_host_data(bsym: Any) -> bool:
    """Whether ``bsym`` or any of its subsymbols copies host data onto the device (`HOST_DATA_NAMES`)."""
    if bsym.sym.name in HOST_DATA_NAMES:
        return True
    return any(_makes_host_data(s) for s in bsym.subsymbols)


def capture_hazard(bsym: Any) -> tuple[str, str] | None:
    """What makes ``bsym`` unsafe in a graph that types and tags do not show, as ``(reason, detail)``; None if nothing.

    ``"capture-dependent"``: an op of `CAPTURE_DEPENDENT` with dropout that is not a literal 0 (its seed and offset
    must be made and read in the same mode: outside graphs). ``"host-data"``: a copy of host data onto the device
    (`HOST_DATA_NAMES`), which capture refuses.
    """
    dep = CAPTURE_DEPENDENT.get(bsym.sym.name)
    if dep is not None:
        args = bsym.args
        dropout = args[dep.dropout] if dep.dropout < len(args) else bsym.kwargs.get("dropout_p", 0.0)
        if not _literal_zero(dropout):
            return ("capture-dependent", bsym.sym.name)
    if not getattr(bsym.sym, "is_fusion", False) and _makes_host_data(bsym):
        return ("host-data", bsym.sym.name)
    return None


def classify_bsym(bsym: Any, *, cuda_trace: bool = False) -> tuple[str, str] | None:
    """`classify_op` for a thunder bound symbol (what `thunder_nb.fix` calls), and its `capture_hazard` on CUDA."""
    from thunder.core.prims import OpTags
    from thunder.core.symbol import has_tags

    if is_collective(bsym) and not _bookkeeping(bsym.sym.name):  # NOTE: ``del ft1`` takes a handle, and is a del
        return ("collective", collective_op(bsym.sym.name))
    if cuda_trace:
        hazard = capture_hazard(bsym)
        if hazard is not None:
            return hazard

    try:
        tagged = has_tags(bsym, {OpTags.DEVICE_SYNC_OP})
    except Exception:  # NOTE: a symbol without tag info is judged by name and types alone
        tagged = False
    return classify_op(
        bsym.sym.name,
        [type_of_proxy(a) for a in bsym.flat_proxy_args],
        [type_of_proxy(o) for o in bsym.flat_proxy_outs],
        sync_tag=tagged,
        cuda_trace=cuda_trace,
    )


#: Ops whose result may be a view of (or the very same tensor as) an argument: no new memory.
VIEW_NAMES = frozenset(
    {
        "reshape", "view", "view_as", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose", "permute",
        "t", "movedim", "swapaxes", "expand", "expand_as", "broadcast_to", "broadcast_in_dim", "getitem",
        "__getitem__", "select", "narrow", "slice", "slice_prim", "split", "chunk", "tensor_split", "unbind",
        "diagonal", "as_strided", "real", "imag", "detach", "alias", "contiguous", "to", "type_as", "float",
        "reshape_prim", "T", "mT", "mH", "H", "view_as_real",
    }
)
#: thunder's torch executor's out-of-place partial updates -> thunder-nb's in-place form of each
#: (`thunder_nb.cudagraph.inplace`): ``r = thunder_nb_index_copy_(dst, dim, index, src)`` writes ``dst``, returns it.
IN_PLACE_FORMS = {
    "index_copy": "thunder_nb_index_copy_",
    "index_put": "thunder_nb_index_put_",
    "index_add": "thunder_nb_index_add_",
    "scatter": "thunder_nb_scatter_",
    "scatter_add": "thunder_nb_scatter_add_",
    "copy_with_setitem_impl": "thunder_nb_setitem_",  # NOTE: ``buf[key] = value``
}
#: Ops that write one argument in place and return it: name -> that argument's position (``copy_(src, dst)``).
WRITES_ARGUMENT = {"copy_": 1, **{name: 0 for name in IN_PLACE_FORMS.values()}}
#: Ops whose result is (an alias of) an argument updated in place: no new memory.
IN_PLACE_NAMES = frozenset({"update_aliases", *WRITES_ARGUMENT})


def base_name(callee: str) -> str:
    """``"torch.Tensor.item"`` -> ``"item"``."""
    return callee.rsplit(".", 1)[-1]


def alias_root(groups: Iterable[Sequence[str]]) -> Callable[[str], str]:
    """A function from a name to the root of its alias group, where each of ``groups`` is one group.

    thunder passes a whole alias group to each ``update_aliases`` call (a tensor and its views), so
    every argument and result of one call is the same memory, or part of it: pass each call's names.
    """
    parent: dict[str, str] = {}

    def find(n: str) -> str:
        while parent.get(n, n) != n:
            n = parent[n]
        return n

    for names in groups:
        for n in names[1:]:
            a, b = find(names[0]), find(n)
            if a != b:
                parent[a] = b
    return find


def returned_names(trace: Any) -> set[str]:
    """Names of the tensors that reach the caller (the user's outputs; every output of a backward)."""
    from thunder.core.proxies import TensorProxy
    from thunder.core.pytree import tree_flatten

    out = trace.output
    if isinstance(out, dict) and "output" in out:
        out = out["output"]
    elif isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict) and "output" in out[0]:
        out = out[0]["output"]
    flat, _ = tree_flatten(out)
    return {p.name for p in flat if isinstance(p, TensorProxy)}
