"""The model zoo: models from packages at random init and small sizes, and the loops people run around them.

Shared by ``tests/`` and ``bench/``. Each `ZooModel` builds the same initial state for every configuration
(eager PyTorch, thunder, thunder's CUDA-graph transform, thunder-nb, torch.compile), and each protocol runs a
loop as a user writes it and returns what to compare with eager's run from that state. A probe that may
kill the process (thunder's transform on dropout attention) runs in a child process: ``python -m
thunder_nb.testing.zoo MODEL PROTOCOL CONFIG`` prints one JSON line, and `run_in_child` reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from .modes import CaptureMode, capturing, check_mode

__all__ = ["ZooModel", "MODELS", "PROTOCOLS", "CONFIGS", "ZooRun", "compile_with", "run_protocol", "run_in_child",
           "missing_package", "keep_rate", "TOLERANCES", "Judgement", "judge", "count_graphs"]


@dataclass(frozen=True)
class ZooModel:
    """A packaged model, how to build it, a batch maker and its training loss.

    ``build(device)`` seeds torch and returns the model, so every configuration starts from the same weights;
    ``batch(seed, device)`` returns the call's arguments and the targets; ``loss(model)`` returns the function
    configurations compile: ``step(*args, targets) -> loss``; ``infer(model)`` the eval function ``(*args) ->
    output``.
    """

    name: str
    package: str  # the module it comes from
    build: Callable[[Any], Any]
    batch: Callable[[int, Any], tuple[tuple, Any]]
    loss: Callable[[Any], Callable[..., Any]]
    infer: Callable[[Any], Callable[..., Any]]
    protocols: tuple[str, ...]  # the protocols that suit it
    needs: str | None = None  # a package to import first (the test skips with this name when it is missing)
    dropout: float = 0.0


def missing_package(model: ZooModel) -> str | None:
    """The package ``model`` needs that does not import here, or None."""
    if model.needs is None:
        return None
    try:
        __import__(model.needs)
    except ImportError:
        return model.needs
    return None


def _seeded(make: Callable[[], Any]) -> Callable[[Any], Any]:
    def build(device: Any) -> Any:
        import torch

        torch.manual_seed(0)
        return make().to(device)

    return build


def _tokens(vocab: int, batch: int, seq: int) -> Callable[[int, Any], tuple[tuple, Any]]:
    def make(seed: int, device: Any) -> tuple[tuple, Any]:
        import torch

        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, vocab, (batch, seq), generator=g)
        targets = torch.randint(0, vocab, (batch, seq), generator=g)
        return (idx.to(device),), targets.to(device)

    return make


def _images(batch: int, size: int, classes: int) -> Callable[[int, Any], tuple[tuple, Any]]:
    def make(seed: int, device: Any) -> tuple[tuple, Any]:
        import torch

        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, 3, size, size, generator=g)
        return (x.to(device),), torch.randint(0, classes, (batch,), generator=g).to(device)

    return make


def _cross_entropy(model: Any) -> Callable[..., Any]:
    import torch.nn.functional as F

    def step(idx, targets):
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    return step


def _called(model: Any) -> Callable[..., Any]:
    def infer(*args):
        return model(*args)

    return infer


def _nanogpt(dropout: float) -> Callable[[], Any]:
    def make() -> Any:
        from thunder.tests.nanogpt_model import GPT, GPTConfig

        return GPT(GPTConfig(block_size=64, vocab_size=128, n_layer=2, n_head=4, n_embd=64, dropout=dropout, bias=True))

    return make


def _nanogpt_loss(model: Any) -> Callable[..., Any]:
    def step(idx, targets):
        _, loss = model(idx, targets)
        return loss

    return step


def _llama2(dropout: float) -> Callable[[], Any]:
    def make() -> Any:
        from thunder.tests.llama2_model import ModelArgs, Transformer

        return Transformer(ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, multiple_of=32,
                                     max_seq_len=64, dropout=dropout))

    return make


def _llama2_loss(model: Any) -> Callable[..., Any]:
    import torch.nn.functional as F

    def step(idx, targets):
        logits = model(idx, targets)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return step


def _litgpt(name: str, **overrides: Any) -> Callable[[], Any]:
    def make() -> Any:
        from thunder.tests import litgpt_model

        return litgpt_model.GPT(litgpt_model.Config.from_name(name, **overrides))

    return make


def _torchvision(name: str) -> Callable[[], Any]:
    def make() -> Any:
        import torchvision

        return getattr(torchvision.models, name)(num_classes=10)

    return make


_LM = ("train", "logged", "kept", "inference", "autocast")

#: The zoo, by name.
MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("nanogpt-dropout", "thunder.tests.nanogpt_model", _seeded(_nanogpt(0.1)), _tokens(128, 1, 64),
             _nanogpt_loss, _called, ("dropout",), dropout=0.1),
    ZooModel("nanogpt", "thunder.tests.nanogpt_model", _seeded(_nanogpt(0.0)), _tokens(128, 2, 64),
             _nanogpt_loss, _called, _LM + ("zero-grad",)),
    ZooModel("llama2", "thunder.tests.llama2_model", _seeded(_llama2(0.0)), _tokens(128, 2, 32),
             _llama2_loss, _called, _LM),
    ZooModel("llama2-dropout", "thunder.tests.llama2_model", _seeded(_llama2(0.1)), _tokens(128, 2, 32),
             _llama2_loss, _called, ("dropout",), dropout=0.1),
    ZooModel("litgpt-falcon-7b-like", "thunder.tests.litgpt_model", _seeded(_litgpt("falcon-7b-like")),
             _tokens(128, 2, 32), _cross_entropy, _called, ("train", "kept", "inference"), needs="litgpt"),
    ZooModel("litgpt-llama2-like", "thunder.tests.litgpt_model", _seeded(_litgpt("llama2-like")),
             _tokens(128, 2, 32), _cross_entropy, _called, ("train", "logged", "inference"), needs="litgpt"),
    ZooModel("litgpt-pythia-14m", "litgpt.Config.from_name('pythia-14m', n_layer=2)",
             _seeded(_litgpt("pythia-14m", n_layer=2, block_size=64)), _tokens(128, 2, 32), _cross_entropy,
             _called, ("train", "inference", "decode"), needs="litgpt"),
    ZooModel("resnet18", "torchvision.models.resnet18", _seeded(_torchvision("resnet18")), _images(4, 32, 10),
             _cross_entropy, _called, ("inference", "batchnorm"), needs="torchvision"),
    ZooModel("mobilenet_v3_small", "torchvision.models.mobilenet_v3_small", _seeded(_torchvision("mobilenet_v3_small")),
             _images(4, 32, 10), _cross_entropy, _called, ("batchnorm",), needs="torchvision"),
)}

#: The configurations a protocol can run, in the order tables show them; "... no-sdpa": thunder's defaults without
#: its sdpa executor, the choice `thunder_nb.diagnosis.failures.LIMITS` offers where that executor refuses a model.
CONFIGS = ("eager", "thunder", "stock", "fixed", "thunder_nb.jit", "fused", "reduce-overhead", "thunder no-sdpa",
           "thunder_nb.jit no-sdpa")


def compile_with(config: str, fn: Callable[..., Any], capture: CaptureMode = True) -> tuple[Callable[..., Any], Any]:
    """``fn`` compiled the way ``config`` names it; returns (the callable, its CUDA-graph transform or None).

    ``capture``: real capture (True), regions run eagerly (False), or the emulated capture of
    `thunder_nb.testing.emulated_capture` (``"emulated"``: call inside ``capturing("emulated")``).
    """
    import thunder
    import torch

    from ..fix import FixedCUDAGraphTransform, jit
    from .modes import make_transform, stock_transform

    check_mode(capture)
    if config == "eager":
        return fn, None
    if config == "thunder":
        return thunder.jit(fn), None
    if config == "thunder no-sdpa":
        from ..cudagraph.executors import executor_list

        return thunder.jit(fn, executors=executor_list(["no-sdpa"])), None
    if config == "stock":
        transform = stock_transform(capture)
        return thunder.jit(fn, transforms=[transform]), transform
    if config == "fixed":
        transform = make_transform(FixedCUDAGraphTransform, capture)
        return thunder.jit(fn, transforms=[transform]), transform
    if config in ("thunder_nb.jit", "fused", "thunder_nb.jit no-sdpa"):
        names = {"fused": ["torchcompile"], "thunder_nb.jit no-sdpa": ["no-sdpa"]}.get(config, [])
        jfn = jit(fn, capture=capture is True, executors=names)
        transform = jfn._lc_transforms[0]
        if capture == "emulated":
            transform.cuda_graph_runner.capture = True
        return jfn, transform
    if config == "reduce-overhead":
        return torch.compile(fn, mode="reduce-overhead"), None
    raise ValueError(f"unknown configuration: {config!r} (must be one of {list(CONFIGS)})")


@dataclass
class ZooRun:
    """What one protocol did under one configuration: the values to compare with eager's, and its figures."""

    model: str
    protocol: str
    config: str
    values: Any = None  # nested tensors and numbers (compared with eager's by `thunder_nb.notebook.values.compare_values`)
    error: str | None = None  # the exception that stopped it, ``Type: first line``
    limit: str | None = None  # where it is one of thunder's known limits: the component, and what to try
    graphs: int | None = None  # CUDA graphs the transform recorded
    regions: int | None = None  # regions in its traces (`count_graphs`)


def _loss_value(loss: Any, logged: bool) -> Any:
    # NOTE: float32, as a logged number would be: under autocast eager's cross-entropy is float32, thunder's bfloat16.
    # A copy: torch.compile reduce-overhead's next replay overwrites the loss it returned (and says so when it is read);
    # keeping outputs is the "kept" protocol's question, not this one's
    return loss.item() if logged else loss.detach().float().clone()


def _snapshot(model: Any) -> dict[str, Any]:
    """Parameters and buffers (BatchNorm's running statistics and ``num_batches_tracked``), copied."""
    return {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}


def _train(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int, *, logged: bool = False,
           set_to_none: bool = True, optimizer: str = "adamw", autocast: bool = False) -> dict[str, Any]:
    """A training loop with the optimizer outside the compiled function: zero_grad, forward, backward, step."""
    import torch

    opt = (torch.optim.AdamW(net.parameters(), lr=1e-3) if optimizer == "adamw"
           else torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
    losses = []
    dtype = torch.bfloat16
    around = (lambda: torch.autocast(torch.device(device).type, dtype=dtype)) if autocast else contextlib.nullcontext
    for i in range(steps):
        args, targets = model.batch(i, device)
        opt.zero_grad(set_to_none=set_to_none)
        with around():
            loss = compiled(*args, targets)
        loss.backward()
        opt.step()
        losses.append(_loss_value(loss, logged))
    return {"losses": losses, "state": _snapshot(net)}


def _kept(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int) -> dict[str, Any]:
    """Three forwards kept, then a backward for each (gradients accumulate), for ``steps`` rounds."""
    out = []
    for r in range(steps):
        batches = [model.batch(3 * r + k, device) for k in range(3)]
        losses = [compiled(*args, targets) for args, targets in batches]
        for loss in losses:
            loss.backward()
        out.append([loss.detach().clone() for loss in losses])
    return {"losses": out, "grads": {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}}


def _inference(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int) -> dict[str, Any]:
    """Eval mode under ``no_grad``, every output kept until the end."""
    import torch

    net.eval()
    with torch.no_grad():
        outs = [compiled(*model.batch(i, device)[0]) for i in range(steps)]
    return {"outputs": outs}


def _decode(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int) -> dict[str, Any]:
    """KV-cache decoding, greedy: a prefill of 8 tokens, then ``2 * steps`` one-token calls with ``input_pos``
    advancing (the model's KV cache set up by `run_protocol`); every call's logits kept, and the tokens."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 128, (1, 8), generator=g).to(device)
    logits, tokens = [], []
    with torch.no_grad():
        out = compiled(prompt, torch.arange(8, device=device))
        for t in range(8, 8 + 2 * steps):
            logits.append(out)
            token = out[:, -1].argmax(-1, keepdim=True)
            tokens.append(int(token))
            out = compiled(token, torch.tensor([t], device=device))
    return {"logits": logits, "tokens": tokens}


def _dropout(model: ZooModel, net: Any, compiled: Callable[..., Any], device: Any, steps: int) -> dict[str, Any]:
    """Forward and backward of a model with dropout on one batch and fixed weights: only the masks change between
    calls, so the losses must differ from call to call, and stay finite."""
    args, targets = model.batch(0, device)
    losses, grads = [], []
    for _ in range(steps):
        net.zero_grad()
        loss = compiled(*args, targets)
        loss.backward()
        losses.append(loss.item())
        grads.append(float(sum(p.grad.float().norm() for p in net.parameters() if p.grad is not None)))
    finite = all(abs(v) < float("inf") for v in losses + grads)  # NOTE: NaN fails the comparison too
    return {"finite": finite, "distinct": len(set(losses)) == len(losses), "losses": losses}


def keep_rate(compiled_dropout: Callable[..., Any], device: Any, calls: int = 4) -> tuple[float, bool]:
    """(the fraction of elements kept, whether the mask changed on every call) of a compiled ``dropout(ones)``."""
    import torch

    x = torch.ones(1 << 16, device=device)
    masks = [compiled_dropout(x) != 0 for _ in range(calls)]
    kept = float(torch.stack(masks).float().mean())
    return kept, all(not torch.equal(a, b) for a, b in zip(masks, masks[1:]))


PROTOCOLS: dict[str, Callable[..., dict[str, Any]]] = {
    "train": _train,
    "logged": lambda m, n, c, d, s: _train(m, n, c, d, s, logged=True),
    "zero-grad": lambda m, n, c, d, s: _train(m, n, c, d, s, set_to_none=False, optimizer="sgd"),
    "autocast": lambda m, n, c, d, s: _train(m, n, c, d, s, autocast=True),
    "batchnorm": lambda m, n, c, d, s: _train(m, n, c, d, s, optimizer="sgd"),
    "kept": _kept,
    "inference": _inference,
    "decode": _decode,
    "dropout": _dropout,
}


def count_graphs(transform: Any) -> tuple[int | None, int | None]:
    """(graphs recorded, regions) of a CUDA-graph transform: regions of every trace it fused (forward, backward, and
    each input shape's, such as a prefill's and a decode step's)."""
    if transform is None:
        return None, None
    runner = transform.cuda_graph_runner
    graphs = getattr(runner, "graphs_captured", None)
    if graphs is None:  # NOTE: thunder's own runner
        graphs = len(runner.cuda_graph_cache)
    return graphs, len(runner.python_callables)


def run_protocol(model_name: str, protocol: str, config: str, *, device: Any = "cuda", capture: CaptureMode = True,
                 steps: int = 3) -> ZooRun:
    """Run ``protocol`` on a fresh ``model_name`` compiled by ``config``; errors are kept in the result, not raised."""
    model = MODELS[model_name]
    run = ZooRun(model_name, protocol, config)
    net = model.build(device)
    fn = model.infer(net) if protocol in ("inference", "decode") else model.loss(net)
    net.train(protocol not in ("inference", "decode"))
    if protocol == "decode":
        import torch

        net.set_kv_cache(batch_size=1, device=torch.device(device))
    with capturing(capture if config not in ("eager", "thunder", "thunder no-sdpa", "reduce-overhead") else False):
        try:
            compiled, transform = compile_with(config, fn, capture)
            run.values = PROTOCOLS[protocol](model, net, compiled, device, steps)
            if transform is not None:
                run.graphs, run.regions = count_graphs(transform)
            if protocol == "dropout":
                import torch.nn.functional as F

                p = model.dropout
                masked, _ = compile_with(config, lambda x: F.dropout(x.sin(), p, training=True) * 1.0, capture)
                run.values["keep rate"], run.values["masks change"] = keep_rate(masked, device)
        except Exception as e:  # NOTE: a configuration failing is a finding of the zoo, reported with the case
            from ..diagnosis.failures import error_line, known_limit

            run.error = error_line(e)
            limit = known_limit(e)
            run.limit = f"{limit[0]}: {limit[1]}" if limit else None
    return run


#: Tolerances against eager per protocol (rtol, atol): bfloat16 under autocast; parameters after optimizer steps
#: (AdamW's normalised update turns a gradient's last-bit difference into up to 1e-4 of a weight); else float32.
TOLERANCES: dict[str, tuple[float, float]] = {"autocast": (2e-2, 2e-2), "train": (1e-4, 1e-4), "logged": (1e-4, 1e-4),
                                              "zero-grad": (1e-4, 1e-4), "batchnorm": (1e-4, 1e-4)}
FLOAT32 = (1e-4, 1e-5)


@dataclass(frozen=True)
class Judgement:
    """How a run's values compare: with eager's, or, where plain thunder's differ from eager's too, with those."""

    matches: bool
    against: str  # "eager" or "plain thunder"
    difference: str | None
    max_abs_error: float | None
    thunder_differs: str | None = None  # plain thunder's own first difference from eager, when it has one


def judge(run: ZooRun, reference: ZooRun, plain: Callable[[], ZooRun]) -> Judgement:
    """Compare ``run``'s values with eager's (``reference``); if they differ, ask plain thunder (``plain()``, run
    only then): where thunder without graphs differs from eager as well, the difference is thunder's numerics,
    and ``run`` must equal plain thunder's values instead. Values of ``run.protocol`` use its `TOLERANCES`.
    """
    from ..notebook.values import compare_values

    rtol, atol = TOLERANCES.get(run.protocol, FLOAT32)
    c = compare_values(run.values, reference.values, rtol=rtol, atol=atol, reference="eager's")
    if c.matches:
        return Judgement(True, "eager", None, c.max_abs_error)
    base = plain()
    if base.error is not None:
        return Judgement(False, "eager", c.difference, c.max_abs_error, f"plain thunder fails: {base.error}")
    own = compare_values(base.values, reference.values, rtol=rtol, atol=atol, reference="eager's")
    if own.matches:
        return Judgement(False, "eager", c.difference, c.max_abs_error)
    t = compare_values(run.values, base.values, rtol=rtol, atol=atol, reference="plain thunder's")
    return Judgement(t.matches, "plain thunder", t.difference, t.max_abs_error, own.difference)


def _plain(x: Any) -> Any:
    """Values as JSON can hold them: tensors as nested lists (with dtype), numbers as they are."""
    import torch

    if isinstance(x, torch.Tensor):
        return {"tensor": x.detach().float().cpu().tolist(), "dtype": str(x.dtype)}
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def run_in_child(model_name: str, protocol: str, config: str, *, steps: int = 3, timeout: float = 600,
                 env: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | None, str]:
    """Run one zoo probe on the GPU in a child process (``faulthandler`` on): (return code, its JSON result, stderr).

    A negative return code is the signal that killed it (-11: SIGSEGV), and the result is then None.
    """
    cmd = [sys.executable, "-X", "faulthandler", "-m", "thunder_nb.testing.zoo", model_name, protocol, config,
           "--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv: list[str] | None = None) -> int:
    """``python -m thunder_nb.testing.zoo MODEL PROTOCOL CONFIG [--steps N]``: one real-capture probe, one JSON line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m thunder_nb.testing.zoo", description=main.__doc__)
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("protocol", choices=list(PROTOCOLS))
    parser.add_argument("config", choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    with _quiet():
        run = run_protocol(args.model, args.protocol, args.config, steps=args.steps)
    out = asdict(run)
    out["values"] = _plain(run.values)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
