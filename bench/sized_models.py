"""Models at the sizes where the GPU, not the host, bounds a training step (issue 55): GPT-2 small and a 1B-class llama.

The zoo's models (`thunder_nb.testing.zoo`) are 2-layer toys, every configuration of the GPU zoo runs each of them,
and their step is bound by the host. These two are for the benches alone (`bench_step.py --models gpt2-small,llama-1b`),
at random init (nothing is downloaded), in the zoo's `ZooModel` form so that the benches take them by name:

- ``gpt2-small``: thunder's nanoGPT at GPT-2 small's shape (12 layers, 12 heads, 768 wide, 124M parameters with
  nanoGPT's padded vocabulary of 50304), batches of 8x256 tokens, float32;
- ``llama-1b``: litgpt's Llama-3.2-1B configuration (16 layers, 2048 wide, grouped-query attention; 1.5B parameters,
  the embedding and the head untied) at a 512-token context, batches of 4x512 tokens, trained under bfloat16 autocast
  (`AUTOCAST`);
- ``litgpt-pythia-14m-128``: the zoo's 2-layer ``litgpt-pythia-14m`` with a 128-token cache, so that decoding compares
  64 tokens with eager's (`bench_decode.py --model litgpt-pythia-14m-128 --tokens 64`; the zoo's holds 64 in all);
- ``llama2-7b``: litgpt's Llama-2-7b-hf configuration (32 layers, 4096 wide, 6.7B parameters: 13.5 GB in bfloat16)
  with a 256-token cache, for decoding (`bench_decode.py --model llama2-7b --dtypes bfloat16`): built on the device
  in bfloat16 (float32 first would take 27 GB a copy), each configuration its own copy.
"""

from __future__ import annotations

from typing import Any

from thunder_nb.testing.zoo_models import ZooModel, called, cross_entropy, litgpt, nanogpt_loss, seeded, tokens

__all__ = ["SIZED", "AUTOCAST", "model"]

#: The sized models whose steps run under ``torch.autocast(dtype=torch.bfloat16)``.
AUTOCAST = frozenset({"llama-1b"})


def _gpt2_small() -> Any:
    from thunder.tests.nanogpt_model import GPT, GPTConfig

    return GPT(GPTConfig(block_size=256, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=True))


def _llama2_7b(device: Any) -> Any:
    """`seeded`'s build, but made on the device in bfloat16 (float32 on the host first would take 27 GB)."""
    import torch

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            return litgpt("Llama-2-7b-hf", block_size=256)()
    finally:
        torch.set_default_dtype(default)


SIZED: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("gpt2-small", "thunder.tests.nanogpt_model", seeded(_gpt2_small), tokens(50304, 8, 256), nanogpt_loss,
             called, ("train",)),
    ZooModel("llama-1b", "litgpt.Config.from_name('Llama-3.2-1B', block_size=512)",
             seeded(litgpt("Llama-3.2-1B", block_size=512)), tokens(128256, 4, 512), cross_entropy, called,
             ("autocast",), needs="litgpt"),
    ZooModel("litgpt-pythia-14m-128", "litgpt.Config.from_name('pythia-14m', n_layer=2, block_size=128)",
             seeded(litgpt("pythia-14m", n_layer=2, block_size=128)), tokens(128, 2, 32), cross_entropy, called,
             ("decode",), needs="litgpt"),
    ZooModel("llama2-7b", "litgpt.Config.from_name('Llama-2-7b-hf', block_size=256)", _llama2_7b,
             tokens(32000, 1, 8), cross_entropy, called, ("decode",), needs="litgpt"),
)}


def model(name: str) -> ZooModel:
    """The zoo's model ``name``, or a sized one.

    Raises:
        KeyError: neither has it (the message lists both).
    """
    from thunder_nb.testing.zoo import MODELS

    found = MODELS.get(name) or SIZED.get(name)
    if found is None:
        raise KeyError(f"no model {name!r}: the zoo has {sorted(MODELS)}, the sized ones {sorted(SIZED)}")
    return found
