"""thunder-nb: see, fix and run Lightning Thunder's CUDA-graph regions from a Jupyter notebook."""

from __future__ import annotations

from typing import Any

from . import render  # NOTE: a Report shows itself through it (`diagnosis.model.VIEWS`); it never imports thunder
from .cudagraph.notices import install_warning_format
from .diagnosis.model import Defect, Outside, Region, Report, Site, TraceReport, Value

__all__ = [
    "Defect",
    "Outside",
    "Region",
    "Report",
    "Site",
    "TraceReport",
    "Value",
    "analyze",
    "analyze_trace",
    "check",
    "FixedCUDAGraphTransform",
    "LegacyCUDAGraphTransform",
    "jit",
    "jit_step",
    "jit_decode",
    "capturability",
    "compare_step",
    "recover_from_failed_capture",
    "compare",
    "Comparison",
    "judge",
    "Judgement",
    "load_ipython_extension",
]

__version__ = "0.1.0"

# NOTE: thunder-nb's warnings, printed as one line addressed to the user (`thunder-nb: RecaptureWarning: ...`) in plain
# Python too, not as the library file and line of code that raised them; every other warning keeps its format
install_warning_format()


def analyze(jfn: Any, *, error: BaseException | str | None = None) -> Report:
    """Build the `Report` of a ``thunder.jit`` function after a call (see `thunder_nb.diagnosis.analysis.analyze`)."""
    from .diagnosis.analysis import analyze as _analyze

    return _analyze(jfn, error=error)


def analyze_trace(trace: Any) -> Report:
    """Build the `Report` of one thunder trace (its only trace is ``report.forward``, whatever its kind)."""
    from .diagnosis.analysis import analyze_trace as _analyze_trace

    tr = _analyze_trace(trace)
    labels = {getattr(b.sym.executor, "label", None) for b in trace.bound_symbols if getattr(b.sym, "is_fusion", False)}
    labels.discard(None)
    transform = labels.pop() if len(labels) == 1 else ("stock" if tr.regions else "none")
    return Report(function=tr.name, transform=transform, forward=tr)


def check(x: Any) -> list[Defect]:
    """Find defects in a `Report`, a thunder trace, or generated source text."""
    from .diagnosis.analysis import check as _check

    return _check(x)


def jit_decode(model: Any, *, tokens: int = 8, forward: Any = None, capture: Any = "auto", **jit_options: Any) -> Any:
    """Greedy decoding of a KV-cache model, ``tokens`` decode steps per CUDA-graph replay.

    One replay runs ``tokens`` steps: each step's argmax is the next step's token and its position plus one the
    next position, on the device, with no host round trip between them; the KV cache is updated in place (the fixed
    transform's in-place updates, `thunder_nb.cudagraph.inplace`). The tokens equal eager greedy generation's.

    EOS (``generate(..., eos_id=...)``): stopped by masking. After a row's EOS every later token of the replay is the
    EOS id again and is discarded, so the result equals eager generation that stops at EOS; ``generate`` reads one
    flag after each replay to stop. Conditional graph nodes could stop a replay early, but
    torch 2.11 exposes none (``torch.cuda.CUDAGraph`` has capture, replay and the raw handles only; ``while_loop``
    has no CUDA-graph lowering): the steps after an EOS run and their tokens are dropped.

    Positions stay on the device: ``forward(model, token, input_pos)`` makes one step's logits, and the default
    (`thunder_nb.step.decode.litgpt_forward`) calls ``model(token, input_pos)`` without litgpt's ``input_pos_maxp1``,
    a Python int (``max(input_pos) + 1``) that a graph would freeze: the attention then reads the whole cache under
    its causal mask, one shape at every position. A step a replay would not repeat raises
    `thunder_nb.step.DecodeRefused`: a device transfer or host sync left outside the graph (naming the line), or a
    number read back with ``.item()`` and used as a size or an int (litgpt's sliding-window cache), which thunder
    cannot trace. A float read back and used as a factor is kept on the device (thunder-nb's scalar hand-off).

    Args:
        model: the model, its KV cache set up (litgpt: ``model.set_kv_cache(batch_size=B)``) and in eval mode.
        tokens: decode steps per replay (k); ``decoder.tokens = k`` later records another graph, with no new trace
            (the EOS id is a tensor too: one trace serves every k and EOS).
        forward: one step's call, ``(model, token (B, 1), input_pos (1,)) -> logits (B, 1, vocab)``.
        capture: ``"auto"`` (a CUDA graph on CUDA tensors; on the CPU the steps just run), True, False, or
            ``"emulated"`` for `thunder_nb.testing.emulated_capture`'s stand-in on the CPU (the tests').
        jit_options: `thunder_nb.jit`'s (``executors=["torchcompile"]``: fused kernels inside the graph).

    Returns:
        A `thunder_nb.step.Decoder`: ``generate(prompt, max_new_tokens, eos_id=None)``, or ``start(token,
        input_pos, eos_id)`` then ``replay()`` (``(B, tokens)`` tokens a replay, no host sync).

    Example::

        import litgpt, torch, thunder_nb
        model = litgpt.GPT(litgpt.Config.from_name("pythia-14m", n_layer=2, block_size=64)).eval()
        model.set_kv_cache(batch_size=1)
        decoder = thunder_nb.jit_decode(model, tokens=8)
        new = decoder.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=24, eos_id=0)  # (1, <= 24) token ids

    The graph is recorded at the first ``generate`` (or ``start``) for a batch size, before the prompt's prefill:
    its warm-up writes the cache from position 0, which the prefill then overwrites.
    """
    from .fix import jit
    from .step.decode import Decoder, litgpt_forward

    return Decoder(model, tokens, forward or litgpt_forward, capture, jit=jit, **jit_options)


def __getattr__(name: str) -> Any:
    # NOTE: the transforms import thunder (and torch); load them only when asked for
    if name in ("FixedCUDAGraphTransform", "LegacyCUDAGraphTransform", "recover_from_failed_capture", "jit"):
        from . import fix

        return getattr(fix, name)
    if name in ("jit_step", "capturability", "compare_step"):
        from . import step

        return getattr(step, name)
    if name in ("judge", "Judgement"):
        # NOTE: the one judge of "equal": every verdict of thunder-nb, the notebooks' included, asks it
        from .diagnosis import judge

        return getattr(judge, name)
    if name in ("compare", "Comparison"):
        from .notebook import comparison

        return getattr(comparison, name)
    raise AttributeError(f"module 'thunder_nb' has no attribute {name!r}")


def load_ipython_extension(ip: Any) -> None:
    """Register ``%%thunder_cudagraph`` (``%load_ext thunder_nb``)."""
    from .magics import ThunderCUDAGraphMagics

    ip.register_magics(ThunderCUDAGraphMagics)
