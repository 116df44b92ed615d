"""``var``, ``std``, ``var_mean`` and ``std_mean`` with PyTorch's signatures, ``unbiased`` included: one change to the
tables by which thunder's interpreter maps torch functions and tensor methods to thunder symbols (lightning-thunder
0.2.6), installed once per process by `install` where `thunder_nb.internals.supported` (from
`thunder_nb.internals.check_versions`).

thunder 0.2.6 takes only ``(x, dim, *, keepdim, correction)``: ``x.var(1, unbiased=False)`` ("unexpected keyword
argument 'unbiased'"), ``x.std(1, False, True)`` and ``torch.var_mean(x, 1, False)`` (PyTorch's ``dim, unbiased,
keepdim`` by position) and ``x.var(False)`` failed: the population variance of a hand-written normalization (AdaIN,
StyleGAN's minibatch standard deviation) could not be traced. `install` reads PyTorch's three forms and calls
thunder's own with ``correction`` (``unbiased=False`` is 0).
"""

from __future__ import annotations

from typing import Any

from .patches import ProcessPatch, composite_symbol, restore_table, swap_table

__all__ = ["install", "uninstall", "installed"]

_NAMES = ("var", "std", "var_mean", "std_mean")


def _torch_signature(name: str) -> Any:
    def reduction(a: Any, *args: Any, dim: Any = None, unbiased: Any = None, keepdim: bool = False,
                  correction: Any = None) -> Any:
        """PyTorch's ``(x, unbiased)``, ``(x, dim, unbiased, keepdim)`` and ``(x, dim, *, correction, keepdim)``."""
        import thunder.torch as ltorch

        if args and isinstance(args[0], bool):
            unbiased, args = args[0], args[1:]
        names = ("dim", "unbiased", "keepdim")
        given = dict(zip(names, args))
        dim, unbiased, keepdim = given.get("dim", dim), given.get("unbiased", unbiased), given.get("keepdim", keepdim)
        if correction is None:
            correction = 0 if unbiased is False else 1
        return getattr(ltorch, name)(a, dim, keepdim=keepdim, correction=correction)

    return reduction


def _functions() -> dict[Any, str]:
    import torch

    return {**{getattr(torch, name): name for name in _NAMES}, torch.Tensor.var: "var", torch.Tensor.std: "std"}


def _apply() -> dict[str, Any] | None:
    import thunder.torch as ltorch
    from thunder.core import jit_ext
    from thunder.torch.langctx import _method_name_to_fn_map as methods

    table = ltorch._torch_to_thunder_function_map
    if (not isinstance(getattr(jit_ext, "_general_jit_lookaside_map", None), dict)
            or any(table.get(fn) is not getattr(ltorch, name, None) for fn, name in _functions().items())
            or any(methods.get(name) is not getattr(ltorch, name) for name in ("var", "std"))):
        return None  # NOTE: not the thunder this was written for: thunder's own stays
    symbols = {name: composite_symbol(name, _torch_signature(name)) for name in _NAMES}
    saved = {"table": swap_table({fn: symbols[name] for fn, name in _functions().items()}),
             "methods": {name: methods[name] for name in ("var", "std")}}
    for name in ("var", "std"):
        methods[name] = symbols[name]
    return saved


def _restore(originals: dict[str, Any]) -> None:
    from thunder.torch.langctx import _method_name_to_fn_map as methods

    restore_table(originals["table"])
    methods.update(originals["methods"])


#: thunder's tables changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
