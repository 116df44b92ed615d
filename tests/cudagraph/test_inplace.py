"""A KV cache's ``index_copy_`` runs in place inside the graph (`thunder_nb.cudagraph.inplace`).

thunder 0.2.6 functionalizes ``buf.index_copy_(dim, index, src)`` into an out-of-place ``index_copy`` of the whole
buffer and a ``copy_`` back: three kernels over the whole cache where one writes a row. The fixed transform folds
each such pair into one in-place ``index_copy_`` where that computes the same, and leaves it alone where it would
not. Real thunder traces, emulated capture on the CPU and real capture on the GPU (``-m gpu``); every result and
every buffer is compared with eager PyTorch's, bit for bit.
"""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch

import thunder_nb
from gpu_or_emulated import MODES, capturing, device_of
from thunder_nb.diagnosis.ops import INDEX_COPY_NAME
from thunder_nb.fix import EagerFallbackWarning


class Cache(torch.nn.Module):
    """Two cache buffers updated at a position each call, then read, as litgpt's ``KVCache`` does; ``variant`` picks
    the order of the program's reads and writes."""

    def __init__(self, variant: str, device: str):
        super().__init__()
        self.variant = variant
        self.register_buffer("k", torch.arange(64.0, device=device).reshape(1, 2, 8, 4))
        self.register_buffer("v", -torch.arange(64.0, device=device).reshape(1, 2, 8, 4))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.variant == "in place":  # NOTE: litgpt's KVCache.forward
            k = self.k.index_copy_(2, pos, x.sin())
            v = self.v.index_copy_(2, pos, x.cos())
            return (k * 2 + v).sum(2)
        new_k = self.k.index_copy(2, pos, x.sin())
        if self.variant == "read between":  # NOTE: the cache read as it was, between the new rows and the copy back
            before = self.k.sum(2)
            self.k.copy_(new_k)
            return before + self.k.sum(2)
        if self.variant == "updated between":  # NOTE: the copy back discards this update; in place would keep it
            self.k.mul_(2)
            self.k.copy_(new_k)
            return self.k.sum(2)
        if self.variant == "new rows kept":  # NOTE: the out-of-place result read after the copy back
            self.k.copy_(new_k)
            self.k.add_(1)
            return new_k.sum(2)
        raise AssertionError(self.variant)


def _region_ops(jfn) -> list[str]:
    names = []
    for b in thunder.last_traces(jfn)[-1].bound_symbols:
        names += [s.sym.name for s in b.subsymbols] if b.sym.name.startswith("CUDAGraph") else [b.sym.name]
    return [n for n in names if n != "python_del"]


def _decode(variant: str, mode: str, calls: int = 5, **options):
    """The variant jitted and eager side by side over ``calls`` calls at advancing positions: the jitted function, and
    for each call whether its result and both buffers equal eager's bit for bit."""
    device = device_of(mode)
    jitted, eager = Cache(variant, device), Cache(variant, device)
    with capturing(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        jfn = thunder_nb.jit(jitted, **options)
        equal = []
        with torch.no_grad():
            for p in range(calls):
                x = torch.randn(1, 2, 1, 4, generator=torch.Generator().manual_seed(p)).to(device)
                pos = torch.tensor([p % 8], device=device)
                got, expected = jfn(x, pos), eager(x, pos)
                equal.append((torch.equal(got, expected), torch.equal(jitted.k, eager.k),
                              torch.equal(jitted.v, eager.v)))
    return jfn, equal


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", ["in place", "read between"])
def test_a_cache_update_runs_as_one_in_place_index_copy_with_eagers_results(variant, mode):
    jfn, equal = _decode(variant, mode)
    assert all(all(e) for e in equal), equal  # NOTE: (result, k, v) per call
    ops = _region_ops(jfn)
    updates = 2 if variant == "in place" else 1
    assert ops.count(INDEX_COPY_NAME) == updates, ops
    assert "index_copy" not in ops and "copy_" not in ops, ops
    # NOTE: the cache is a module buffer the region writes: written in place, read where it lies
    transform = jfn._lc_transforms[0]
    (plan,) = transform.cuda_graph_runner.plans.values()
    assert len(plan.write_back) == updates, plan
    assert any("in-place index_copy_" in n for n in transform.notes), transform.notes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", ["updated between", "new rows kept"])
def test_an_index_copy_stays_out_of_place_where_in_place_would_change_the_result(variant, mode):
    jfn, equal = _decode(variant, mode)
    assert all(all(e) for e in equal), equal
    ops = _region_ops(jfn)
    assert INDEX_COPY_NAME not in ops and "index_copy" in ops, ops


def test_without_the_fold_the_trace_keeps_thunders_out_of_place_pair_and_the_same_results():
    """The oracle: ``in_place_index_copy=False`` is thunder's functionalized form, with the same results."""
    jfn, equal = _decode("in place", "emulated", in_place_index_copy=False)
    assert all(all(e) for e in equal), equal
    ops = _region_ops(jfn)
    assert INDEX_COPY_NAME not in ops and ops.count("index_copy") == ops.count("copy_") == 2, ops


def test_litgpt_kv_cache_decoding_updates_its_caches_in_place():
    """The zoo's litgpt pythia-14m decode step: each layer's key and value cache, one in-place update each."""
    pytest.importorskip("litgpt", reason="needs litgpt (the zoo extra: bash dev.sh installs it)")
    from thunder_nb.testing import zoo

    model = zoo.MODELS["litgpt-pythia-14m"]
    net = model.build("cpu").eval()
    net.set_kv_cache(batch_size=1, device=torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        jfn = thunder_nb.jit(model.infer(net))
        with torch.no_grad():
            jfn(torch.zeros(1, 4, dtype=torch.long), torch.arange(4))  # NOTE: the prefill
            jfn(torch.zeros(1, 1, dtype=torch.long), torch.tensor([4]))  # NOTE: one decoded token
    ops = _region_ops(jfn)
    layers = len(net.transformer.h)
    assert ops.count(INDEX_COPY_NAME) == 2 * layers and "index_copy" not in ops, ops
