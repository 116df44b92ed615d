"""`thunder_nb.jit_decode`: k greedy tokens per CUDA-graph replay, equal to eager greedy generation (issue #55).

The zoo's litgpt pythia-14m (2 layers) at random init; eager decoding is the oracle, token for token, with and
without an EOS inside a replay's k tokens. Emulated capture on the CPU; real capture on the GPU (``-m gpu``). One
decoder per mode is traced once and shared: its step's trace serves every k and every EOS id.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import thunder_nb
from gpu_or_emulated import MODES, capturing, device_of
from thunder_nb.fix import EagerFallbackWarning

PROMPT, NEW = 8, 24


def _model(device: str):
    from thunder_nb.testing import zoo

    net = zoo.MODELS["litgpt-pythia-14m"].build(device).eval()
    net.set_kv_cache(batch_size=1, device=torch.device(device))
    return net


def _prompt(device: str) -> torch.Tensor:
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(0)).to(device)


def _eager(device: str, eos_id: int | None = None) -> list[int]:
    """Eager greedy generation of `NEW` tokens, stopping after ``eos_id`` (included)."""
    net, prompt, out = _model(device), _prompt(device), []
    with torch.no_grad():
        logits = net(prompt, torch.arange(PROMPT, device=device))
        for pos in range(PROMPT, PROMPT + NEW):
            token = logits[:, -1:].argmax(-1)
            out.append(int(token))
            if out[-1] == eos_id:
                break
            logits = net(token, torch.tensor([pos], device=device))
    return out


@pytest.fixture(scope="module")
def decoders():
    """mode -> (decoder, eager tokens): one traced decoder per mode for the whole file."""
    pytest.importorskip("litgpt", reason="needs litgpt (the zoo extra: bash dev.sh installs it)")
    made = {}

    def get(mode: str):
        if mode not in made:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", EagerFallbackWarning)
                made[mode] = (thunder_nb.jit_decode(_model(device_of(mode)), tokens=4, capture=mode if mode ==
                                                    "emulated" else True), _eager(device_of(mode)))
        return made[mode]

    return get


def _generate(decoder, mode: str, k: int, eos_id: int | None = None) -> list[int]:
    decoder.tokens = k
    with capturing(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        out = decoder.generate(_prompt(device_of(mode)), NEW, eos_id=eos_id)
    assert out.shape[0] == 1
    return out[0].tolist()


@pytest.mark.slow  # NOTE: the decoders fixture traces litgpt's GPT (seconds), once for the file
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", [1, 4, 8])
def test_k_tokens_per_replay_equal_eager_greedy_generation(decoders, mode, k):
    decoder, expected = decoders(mode)
    replays = decoder.replays
    assert _generate(decoder, mode, k) == expected
    assert decoder.replays - replays == -(-(NEW - 1) // k)  # NOTE: the prefill makes the first token
    assert len(set(expected)) > 4  # NOTE: the oracle decodes something, not one token over and over


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", [1, 4, 8])
def test_an_eos_inside_a_replay_ends_the_tokens_as_eager_generation_stops(decoders, mode, k):
    decoder, expected = decoders(mode)
    eos = expected[10]  # NOTE: the 11th token: inside the 3rd replay of 4, the 2nd of 8, and a 1-token replay
    expected_eos = _eager(device_of(mode), eos)
    assert expected_eos == expected[: expected.index(eos) + 1]
    replays = decoder.replays
    assert _generate(decoder, mode, k, eos) == expected_eos
    assert decoder.replays - replays == -(-(len(expected_eos) - 1) // k)  # NOTE: stopped at the replay with EOS
    assert _generate(decoder, mode, k) == expected  # NOTE: the same graph, no EOS: the whole generation again


@pytest.mark.slow
def test_one_trace_serves_every_k_and_eos_and_the_cache_is_updated_in_place(decoders):
    import thunder

    decoder, expected = decoders("emulated")
    for k in (2, 4):
        assert _generate(decoder, "emulated", k) == expected
    assert len(thunder.last_traces(decoder.step)) and thunder.cache_misses(decoder.step) == 1
    ops = [s.sym.name for b in thunder.last_traces(decoder.step)[-1].bound_symbols
           if b.sym.name.startswith("CUDAGraph") for s in b.subsymbols]
    assert ops.count("thunder_nb_index_copy_") == 4 and "index_copy" not in ops, ops  # NOTE: k and v, 2 layers


class _HostWork(torch.nn.Module):
    """A decode step with host work in it: its logits through the host (``"transfer"``), or its position read back
    as a Python int and used as a size (``"item"``, as litgpt's sliding-window cache does)."""

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, idx, input_pos):
        x = self.head(self.emb(idx))
        if self.variant == "transfer":
            return x.cpu().to(x.device)
        return x[..., : input_pos.max().item() + 8]


@pytest.mark.parametrize("variant, words", [("transfer", ["test_decode.py", "x.cpu().to(x.device)", "device-transfer"]),
                                            ("item", ["could not trace", ".item()", "input_pos_maxp1"])])
def test_a_step_with_host_work_is_refused_saying_what_to_change(variant, words):
    decoder = thunder_nb.jit_decode(_HostWork(variant), tokens=2, capture="emulated")
    with capturing("emulated"), pytest.raises(thunder_nb.step.DecodeRefused) as e:
        decoder.generate(torch.zeros(1, 3, dtype=torch.long), 4)
    assert all(w in str(e.value) for w in words), str(e.value)
