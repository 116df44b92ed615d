"""Parts of PyTorch's tensor API that thunder 0.2.6 lacks, three of which PyTorch's spectral norm and orthogonal
parametrizations use at every forward: one change to thunder's tables and its ``clone`` symbol (lightning-thunder
0.2.6), installed once per process by `install` where `thunder_nb.internals.supported` (from
`thunder_nb.internals.check_versions`).

- ``x.H`` and ``x.mH`` (the conjugate transpose; ``nn.utils.parametrizations.spectral_norm``'s power iteration reads
  ``weight.H``): "Unknown attribute H";
- ``x.clone(memory_format=torch.contiguous_format)``: "only preserve_format is currently supported", where thunder
  models no strides (its clone is contiguous, the torch executor runs PyTorch's own with the format asked);
- ``F.normalize(x, out=u)`` (the power iteration's update of its vectors, in place): "out is not None which is
  currently unsupported"; `install` normalizes and copies into ``out``, as PyTorch's ``torch.div(..., out=out)``; and
  its gradient at a zero vector, NaN in thunder's (see `normalize`);
- ``nn.Softmin``, whose forward passes ``_stacklevel=5`` to ``F.softmin`` ("unexpected keyword argument
  '_stacklevel'": thunder 0.2.6 wrote a wrapper that takes it and maps ``F.softmin`` to the symbol that does not);
- ``x.unfold(dim, size, step)``, which thunder 0.2.6 traces as ``F.unfold`` (im2col: its automatic registration of
  ``F.unfold`` took the name of ``Tensor.unfold``'s symbol, in its method table and its id): "Exception encountered
  when doing automatic registration for unfold"; `install` traces it to ``prims.unfold``;
- ``torch.eye`` ("Trying to call function torch.eye, but it is not yet supported": an orthogonality penalty
  ``W @ W.T - torch.eye(n)``, a spatial transformer's identity): `install` compares two ``arange`` on the device,
  which a graph captures (no host data);
- 66 in-place tensor methods whose out-of-place op thunder has (``x.sigmoid_()``, ``x.clamp_min_(0)``,
  ``x.nan_to_num_()``, ``x.index_fill_(...)``, ``x.masked_scatter_(...)``, ``x.multiply_(y)``, ...) and ``x.fill_(v)``:
  "Unknown attribute sigmoid_"; `install` makes each as thunder makes its own (``mul_``): the op, copied into ``x``,
  tagged as in-place. The in-place view ops (``t_``, ``unsqueeze_``, ``transpose_``, ...) change no value and stay
  missing.

A property thunder lacks raised ``AttributeError`` inside the parametrization's ``weight`` property, which Python took
for a missing attribute: "'ParametrizedLinear' object has no attribute 'weight'". And ``a % b`` of tensors
(``torch.remainder``: "'NoneType' object is not callable", the method thunder's proxy looks up for ``%`` missing).
"""

from __future__ import annotations

from typing import Any

from .patches import ProcessPatch, composite_symbol, restore_table, swap_table

__all__ = ["install", "uninstall", "installed"]


def _conjugate_transpose(last_two: bool) -> Any:
    def transpose(a: Any) -> Any:
        """``x.mH`` (the last two dimensions), or ``x.H`` (a matrix; a vector or a number as it is)."""
        import thunder.torch as ltorch
        from thunder.core import dtypes

        if last_two or a.ndim == 2:
            a = ltorch.transpose(a, -2, -1)
        return ltorch.conj(a) if dtypes.is_complex_dtype(a.dtype) else a

    return transpose


def normalize(input: Any, p: float = 2.0, dim: Any = 1, eps: float = 1e-12, out: Any = None) -> Any:
    """``F.normalize`` as PyTorch computes it, ``input / vector_norm(input).clamp_min(eps)``, copied into ``out`` where
    one is given. thunder's own takes the norm as ``sum(|a| ** p) ** (1 / p)``, whose gradient at a zero vector is
    ``0 * inf``: NaN where eager's is 0 (an all-zero row of ReLU features, normalized, trained on NaN)."""
    import thunder.torch as ltorch

    denom = ltorch.clamp(ltorch.vector_norm(input, p, dim, keepdim=True), min=eps)
    result = ltorch.true_divide(input, denom)
    return result if out is None else ltorch.copy_(out, result)


def softmin(input: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
    """``F.softmin``: thunder's, with PyTorch's ``_stacklevel`` and its dimension where none is given."""
    import thunder.torch as ltorch

    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1  # NOTE: PyTorch's _get_softmax_dim, which warns of it
    return ltorch._softmin(input, dim=dim, dtype=dtype)


def tensor_unfold(a: Any, dimension: int, size: int, step: int) -> Any:
    """``x.unfold(dimension, size, step)``: the windows of ``size`` every ``step`` along ``dimension``."""
    from thunder import clang

    return clang.unfold(a, dimension, size, step)


def eye(n: int, m: Any = None, *, out: Any = None, dtype: Any = None, layout: Any = None, device: Any = None,
        pin_memory: bool = False, requires_grad: bool = False) -> Any:
    """``torch.eye``: ones where the row's index equals the column's."""
    import thunder.torch as ltorch
    import torch

    rows = ltorch.arange(n, device=device)
    cols = ltorch.arange(n if m is None else m, device=device)
    result = ltorch.to(ltorch.eq(ltorch.unsqueeze(rows, 1), ltorch.unsqueeze(cols, 0)),
                       dtype=torch.get_default_dtype() if dtype is None else dtype)
    return result if out is None else ltorch.copy_(out, result)


#: In-place tensor methods that change a tensor's shape or metadata, not its values: not made from their op
_NOT_VALUES = frozenset({"as_strided_", "conj_physical_", "detach_", "float_power_", "rename_", "resize_",
                         "resize_as_", "squeeze_", "swapaxes_", "swapdims_", "t_", "transpose_", "unsqueeze_"})


def _missing_in_place(methods: dict[str, Any]) -> list[str]:
    """The in-place methods of ``torch.Tensor`` that thunder's method table lacks where it has their op."""
    import torch

    return [name for name in dir(torch.Tensor) if name.endswith("_") and not name.startswith("_")
            and name[:-1] in methods and name not in methods and name not in _NOT_VALUES]


def _in_place(op: Any) -> Any:
    def method(a: Any, *args: Any, **kwargs: Any) -> Any:
        """``a.<op>_(...)``: ``<op>``'s result copied into ``a``, as thunder's own in-place methods."""
        import thunder.torch as ltorch

        return ltorch._copy_(a, op(a, *args, **kwargs))

    return method


def fill_(a: Any, value: Any) -> Any:
    """``x.fill_(value)``: a number, or a 0-dim tensor, written into every element."""
    import thunder.torch as ltorch
    from thunder.core.proxies import TensorProxy

    filled = ltorch.expand(value, a.shape) if isinstance(value, TensorProxy) else ltorch.full_like(a, value)
    return ltorch._copy_(a, filled)


def _cloning(original: Any) -> Any:
    import torch

    def clone(a: Any, *, memory_format: Any = torch.preserve_format) -> Any:
        """``x.clone()``: a contiguous format asked for is thunder's clone (which models no strides)."""
        if memory_format == torch.contiguous_format:
            memory_format = torch.preserve_format
        return original(a, memory_format=memory_format)

    return clone


def _apply() -> dict[str, Any] | None:
    import torch
    import torch.nn.functional as F
    import thunder.torch as ltorch
    from thunder.core import jit_ext
    from thunder.torch import _torch_to_thunder_function_map as table
    from thunder.torch.langctx import _method_name_to_fn_map as methods
    from thunder.torch.langctx import _property_name_to_fn_map as properties

    lookasides = getattr(jit_ext, "_general_jit_lookaside_map", None)
    clone_meta = getattr(ltorch.clone, "meta", None)
    if (not isinstance(lookasides, dict) or "H" in properties or "mH" in properties or "mod" in methods
            or "fill_" in methods or not callable(getattr(ltorch, "_copy_", None))
            or getattr(table.get(F.normalize), "id", None) != "torch.nn.functional.normalize" or torch.eye in table
            or table.get(F.softmin) is not getattr(ltorch, "_softmin", None)
            or getattr(methods.get("unfold"), "id", None) != "torch.nn.functional.unfold"
            or getattr(clone_meta, "__name__", None) != "clone"):
        return None  # NOTE: not the thunder this was written for: thunder's own stays
    saved = {"clone": clone_meta, "unfold": methods["unfold"]}
    unfold = composite_symbol("tensor_unfold", tensor_unfold)
    methods["unfold"] = unfold  # NOTE: F.unfold's symbol was there (see the module's docstring)
    properties["H"] = composite_symbol("H", _conjugate_transpose(False))
    properties["mH"] = composite_symbol("mH", _conjugate_transpose(True))
    methods["mod"] = ltorch.remainder  # NOTE: what the proxy's __mod__ and __rmod__ look up
    saved["in_place"] = _missing_in_place(methods) + ["fill_"]
    for name in saved["in_place"][:-1]:
        methods[name] = composite_symbol(name, _in_place(methods[name[:-1]]), in_place=True)
    methods["fill_"] = composite_symbol("fill_", fill_, in_place=True)
    saved["table"] = swap_table({F.normalize: composite_symbol("normalize", normalize),
                                 torch.eye: composite_symbol("eye", eye),
                                 F.softmin: composite_symbol("softmin", softmin), torch.Tensor.unfold: unfold})
    object.__setattr__(ltorch.clone, "meta", _cloning(clone_meta))  # NOTE: a frozen dataclass, as its __init__ sets it
    return saved


def _restore(originals: dict[str, Any]) -> None:
    import thunder.torch as ltorch
    from thunder.torch.langctx import _method_name_to_fn_map as methods
    from thunder.torch.langctx import _property_name_to_fn_map as properties

    methods.pop("mod", None)
    methods["unfold"] = originals["unfold"]
    for name in originals["in_place"]:
        methods.pop(name, None)
    properties.pop("H", None)
    properties.pop("mH", None)
    restore_table(originals["table"])
    object.__setattr__(ltorch.clone, "meta", originals["clone"])


#: thunder's tables and clone changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
