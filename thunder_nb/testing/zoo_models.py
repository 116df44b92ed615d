"""The zoo's models: packaged models at random init and small sizes, each with its batches, its training loss and
its eval call (`thunder_nb.testing.zoo` runs them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ZooModel", "MODELS", "missing_package", "seeded", "tokens", "cross_entropy", "called", "nanogpt_loss",
           "litgpt"]


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


def seeded(make: Callable[[], Any]) -> Callable[[Any], Any]:
    """A `ZooModel.build`: torch seeded with 0, then ``make()`` moved to the device (the same weights every time)."""

    def build(device: Any) -> Any:
        import torch

        torch.manual_seed(0)
        return make().to(device)

    return build


def tokens(vocab: int, batch: int, seq: int) -> Callable[[int, Any], tuple[tuple, Any]]:
    """A `ZooModel.batch` of ``batch`` x ``seq`` token ids below ``vocab`` and as many targets, seeded per batch."""

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


def cross_entropy(model: Any) -> Callable[..., Any]:
    """A `ZooModel.loss`: the cross-entropy of ``model(idx)``'s logits against the targets."""
    import torch.nn.functional as F

    def step(idx, targets):
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    return step


def called(model: Any) -> Callable[..., Any]:
    """A `ZooModel.infer`: the model called on the batch's arguments."""

    def infer(*args):
        return model(*args)

    return infer


def _nanogpt(dropout: float) -> Callable[[], Any]:
    def make() -> Any:
        from thunder.tests.nanogpt_model import GPT, GPTConfig

        return GPT(GPTConfig(block_size=64, vocab_size=128, n_layer=2, n_head=4, n_embd=64, dropout=dropout, bias=True))

    return make


def nanogpt_loss(model: Any) -> Callable[..., Any]:
    """A `ZooModel.loss` for thunder's nanoGPT, which computes its loss itself (``model(idx, targets)``)."""

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


def litgpt(name: str, **overrides: Any) -> Callable[[], Any]:
    """A maker of litgpt's GPT (through thunder's copy) for the configuration ``name`` with ``overrides``."""

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
    ZooModel("nanogpt-dropout", "thunder.tests.nanogpt_model", seeded(_nanogpt(0.1)), tokens(128, 1, 64),
             nanogpt_loss, called, ("dropout",), dropout=0.1),
    ZooModel("nanogpt", "thunder.tests.nanogpt_model", seeded(_nanogpt(0.0)), tokens(128, 2, 64),
             nanogpt_loss, called, _LM + ("zero-grad",)),
    ZooModel("llama2", "thunder.tests.llama2_model", seeded(_llama2(0.0)), tokens(128, 2, 32),
             _llama2_loss, called, _LM),
    ZooModel("llama2-dropout", "thunder.tests.llama2_model", seeded(_llama2(0.1)), tokens(128, 2, 32),
             _llama2_loss, called, ("dropout",), dropout=0.1),
    ZooModel("litgpt-falcon-7b-like", "thunder.tests.litgpt_model", seeded(litgpt("falcon-7b-like")),
             tokens(128, 2, 32), cross_entropy, called, ("train", "kept", "inference"), needs="litgpt"),
    ZooModel("litgpt-llama2-like", "thunder.tests.litgpt_model", seeded(litgpt("llama2-like")),
             tokens(128, 2, 32), cross_entropy, called, ("train", "logged", "inference"), needs="litgpt"),
    ZooModel("litgpt-pythia-14m", "litgpt.Config.from_name('pythia-14m', n_layer=2)",
             seeded(litgpt("pythia-14m", n_layer=2, block_size=64)), tokens(128, 2, 32), cross_entropy,
             called, ("train", "inference", "decode"), needs="litgpt"),
    ZooModel("resnet18", "torchvision.models.resnet18", seeded(_torchvision("resnet18")), _images(4, 32, 10),
             cross_entropy, called, ("inference", "batchnorm"), needs="torchvision"),
    ZooModel("mobilenet_v3_small", "torchvision.models.mobilenet_v3_small", seeded(_torchvision("mobilenet_v3_small")),
             _images(4, 32, 10), cross_entropy, called, ("batchnorm",), needs="torchvision"),
)}
