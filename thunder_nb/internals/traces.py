"""thunder's traces, read and made: the del pass, trace building, saved-for-backward, a trace's outputs and signature,
fusion symbols, pytrees and proxies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["del_last_used", "build_traces", "has_traces", "saved_for_backward", "compile_option", "bound_call",
           "fusion_symbol", "source_line", "flatten", "flat_output", "is_joint_trace", "is_tensor_proxy",
           "signature_info", "drop_signature_args"]


def del_last_used(bsyms: Sequence[Any], protected: Sequence[Any], *,
                  clear_mutable_collections: bool = False) -> list[Any]:
    """thunder's del pass over bound symbols (``thunder.executors.passes._del_last_used``)."""
    from thunder.executors.passes import _del_last_used

    return _del_last_used(bsyms, protected, clear_mutable_collections=clear_mutable_collections)


def build_traces(jfn: Any, *args: Any, **kwargs: Any) -> None:
    """Build ``jfn``'s traces for these inputs without running the computation (the cyclic collector off
    meanwhile: `thunder_nb.internals.jitted.cyclic_gc_off`), under the caller's autocast state alone (earlier calls'
    emptied: `thunder_nb.internals.jitted.under_own_autocast`)."""
    import thunder

    from .jitted import cyclic_gc_off, under_own_autocast

    cd = thunder.compile_data(jfn)
    with cyclic_gc_off():
        under_own_autocast(cd._get_computation_and_inputs, cd)(*args, **kwargs)


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


def compile_option(name: str, description: str) -> Any:
    """A ``thunder.jit`` compile option of the function being compiled (None outside compilation)."""
    from thunder.core.compile_data import get_compile_option

    return get_compile_option(name, description)


def bound_call(sym: Any, args: Any, output: Any, fn: Callable[..., Any], subsymbols: Sequence[Any] = (),
               header: Any = "") -> Any:
    """A bound symbol of the symbol ``sym`` whose generated code calls ``fn`` under ``sym.name`` (its call context,
    ``_call_ctx``), with these arguments, output, subsymbols and header: how thunder calls a fusion."""
    from thunder.core.symbol import BoundSymbol

    return BoundSymbol(sym, args, {}, output, subsymbols, header=header, _call_ctx={sym.name: fn})


def fusion_symbol(name: str, executor: Any, fn: Callable[..., Any], inputs: Sequence[Any], outputs: Sequence[Any],
                  subsymbols: Sequence[Any] = ()) -> Any:
    """A bound symbol that calls ``fn`` under ``name`` in generated code (how thunder calls a region)."""
    from thunder.core.symbol import Symbol

    sym = Symbol(name, meta=None, is_fusion=True, executor=executor)
    return bound_call(sym, tuple(inputs), tuple(outputs), fn, list(subsymbols))


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


def signature_info(trace: Any) -> Any:
    """``trace``'s record of its signature (the arguments it takes), None where thunder kept none."""
    return getattr(trace, "_siginfo", None)


def drop_signature_args(trace: Any, source: Any, names: Any) -> None:
    """Give ``trace`` a copy of ``source``'s signature record without the arguments ``names``."""
    import copy

    trace._siginfo = copy.copy(source._siginfo)
    trace._siginfo.args = [(name, default) for name, default in source._siginfo.args if name not in names]

