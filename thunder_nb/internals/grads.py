"""thunder's backward made to reduce a gradient to its 0-dim tensor's shape, as eager's autograd does: one change to
``thunder.core.transforms`` (lightning-thunder 0.2.6), installed once per process by `install` where
`thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`, which every entry point calls).

thunder treats a 0-dim tensor on the CPU as a number (``treat_cpu_scalar_tensors_as_numbers`` in its broadcasting): a
full reduction's result on the CPU (``x.sum()``, ``x.mean()``, ``x.amax()``, ``x.norm()``) meets a larger tensor in an
elementwise op with no broadcast in the trace, and thunder's rules for the elementwise prims (``add``, ``sub``,
``mul``, ``div``, ... in ``thunder.core.transforms``) hand that operand the larger gradient as it is. Then
``(x * 2 + x.sum()).sum()`` on the CPU gets a wrong gradient with no error (3 for each element of ``x`` where eager
gives 10: the sum's rule spreads each element's 1 back instead of their total), and ``x - x.mean()``, ``x * x.amax()``
and ``x / x.norm()`` fail in the backward. On a GPU the 0-dim result is a CUDA tensor, which thunder broadcasts in the
trace, and its broadcast rule sums the gradient: right there (from thunder's source). A 0-dim *input* is right too:
PyTorch's autograd engine reduces the gradients thunder returns for its inputs. Eager's autograd sums every gradient
to its tensor's shape (``sum_to``). `install` makes the ``put_grad`` those rules call do the same for a 0-dim tensor:
a gradient of more dimensions is summed first. Every ``thunder.jit`` traced in the process after it, thunder_nb's or
not (the magic's original side and the thunder-without-graphs references too), gets eager's gradient; one traced
before keeps thunder's. `uninstall` puts thunder's own back (for the test that shows the difference). Not covered: the
few binary rules thunder writes in its older form, a forward and a backward function whose gradients its autodiff puts
itself (``atan2``, ``fmod``, ``zeta``): ``torch.atan2(x, x.sum())`` keeps thunder's wrong gradient
(tests/test_grads.py holds it as an expected failure).
"""

from __future__ import annotations

from typing import Any

from .patches import ProcessPatch

__all__ = ["install", "uninstall", "installed"]


def _put_grad_summed_to_0_dim(put_grad: Any) -> Any:
    """``put_grad``, with the gradient of a 0-dim tensor summed to its shape first where it has another."""
    import thunder.torch as ltorch
    from thunder.core.proxies import TensorProxy

    def summed_put_grad(a: Any, g: Any) -> Any:
        if isinstance(a, TensorProxy) and isinstance(g, TensorProxy) and a.ndim == 0 and g.ndim > 0:
            g = ltorch.sum(g)
        return put_grad(a, g)

    return summed_put_grad


def _apply() -> dict[str, Any] | None:
    """``thunder.core.transforms.put_grad`` made `_put_grad_summed_to_0_dim`; what it was (None: not the module this
    was written for, unchanged)."""
    from thunder.core import transforms

    put_grad = getattr(transforms, "put_grad", None)
    if not callable(put_grad):
        return None
    transforms.put_grad = _put_grad_summed_to_0_dim(put_grad)
    return {"put_grad": put_grad}


def _restore(originals: dict[str, Any]) -> None:
    from thunder.core import transforms

    transforms.put_grad = originals["put_grad"]


#: thunder's backward changed as this module's docstring says, once per process (`thunder_nb.internals.patches`)
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
