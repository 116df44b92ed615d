"""Real models for tests, benchmarks and notebooks: thunder's bundled nanoGPT and llama2, and their training steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MODELS", "ModelCase", "model_case"]

#: The models thunder's wheel ships (``thunder.tests``), by the name benchmarks and notebooks use.
MODELS = ("nanoGPT", "llama2")


@dataclass(frozen=True)
class ModelCase:
    """A model, a batch maker and a training step over it (forward, cross-entropy; the caller runs backward).

    ``step(idx, targets)`` returns the loss, or ``(loss, loss.item())`` when made with ``log_loss``:
    the logging habit that puts a host sync inside the compiled function.
    """

    name: str
    model: Any
    vocab: int
    batch: int
    seq: int
    step: Callable[..., Any]

    def make_batch(self, seed: int, device: Any = None) -> tuple[Any, Any]:
        """A fresh random batch ``(idx, targets)``."""
        import torch

        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, self.vocab, (self.batch, self.seq), generator=g)
        targets = torch.randint(0, self.vocab, (self.batch, self.seq), generator=g)
        device = device or next(self.model.parameters()).device
        return idx.to(device), targets.to(device)


def model_case(name: str, device: Any = "cpu", *, layers: int = 2, width: int = 128, heads: int = 4,
               vocab: int = 512, batch: int = 8, seq: int = 64, seed: int = 0, log_loss: bool = False,
               model: Any = None) -> ModelCase:
    """Build ``name`` (one of `MODELS`) with these sizes, and its training step.

    Args:
        model: use this model (e.g. a deep copy of another case's) instead of building one.
    """
    import torch
    import torch.nn.functional as F

    if model is None:
        torch.manual_seed(seed)
        if name == "nanoGPT":
            from thunder.tests.nanogpt_model import GPT, GPTConfig

            model = GPT(GPTConfig(block_size=seq, vocab_size=vocab, n_layer=layers, n_head=heads, n_embd=width,
                                  dropout=0.0, bias=True))
        elif name == "llama2":
            from thunder.tests.llama2_model import ModelArgs, Transformer

            model = Transformer(ModelArgs(dim=width, n_layers=layers, n_heads=heads, n_kv_heads=max(heads // 2, 1),
                                          vocab_size=vocab, multiple_of=32, max_seq_len=seq, dropout=0.0))
        else:
            raise ValueError(f"unknown model: {name!r} (must be one of {list(MODELS)})")
        model = model.to(device)

    if name == "nanoGPT":

        def loss_of(idx, targets):
            _, loss = model(idx, targets)
            return loss

    else:

        def loss_of(idx, targets):
            logits = model(idx, targets)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    if log_loss:

        def step(idx, targets):
            loss = loss_of(idx, targets)
            return loss, loss.item()

    else:
        step = loss_of
    step.__name__ = f"{name}_step" + ("_logged" if log_loss else "")
    return ModelCase(name, model, vocab, batch, seq, step)
