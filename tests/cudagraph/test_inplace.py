"""A KV cache's update runs in place inside the graph (`thunder_nb.cudagraph.inplace`).

thunder 0.2.6 functionalizes an update of part of a tensor (``buf.index_copy_(dim, index, src)``, ``buf[:, :, pos] =
v`` and their kin) into an out-of-place copy of the whole tensor with that part changed and a ``copy_`` back: three
kernels over the whole cache where one writes a row. The fixed transform folds each such pair into one in-place
update where that computes the same, and leaves it alone where it would not. Real thunder traces, emulated capture on
the CPU and real capture on the GPU (``-m gpu``); every result and every buffer is compared with eager PyTorch's, bit
for bit.
"""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch

import thunder_nb
from gpu_or_emulated import MODES, capturing, device_of
from thunder_nb.diagnosis.ops import IN_PLACE_FORMS
from thunder_nb.fix import EagerFallbackWarning


def _rows(pos: torch.Tensor) -> torch.Tensor:
    return pos.view(1, 1, 1, 1).expand(1, 2, 1, 4)


#: Updates of a cache ``buf`` (1, 2, 8, 4) at position ``pos`` with ``x`` (1, 2, 1, 4), each as a program writes it,
#: with thunder's out-of-place op for it.
UPDATES = {
    "index_copy_": ("index_copy", lambda buf, pos, x: buf.index_copy_(2, pos, x)),  # NOTE: litgpt's KVCache
    "setitem": ("copy_with_setitem_impl", lambda buf, pos, x: buf.__setitem__((slice(None), slice(None), pos), x)),
    "index_put_": ("index_put", lambda buf, pos, x: buf.index_put_((torch.zeros_like(pos), torch.ones_like(pos), pos),
                                                                   x[0, 1])),
    "index_add_": ("index_add", lambda buf, pos, x: buf.index_add_(2, pos, x)),
    "scatter_": ("scatter", lambda buf, pos, x: buf.scatter_(2, _rows(pos), x)),
    "scatter_add_": ("scatter_add", lambda buf, pos, x: buf.scatter_add_(2, _rows(pos), x)),
}


class Cache(torch.nn.Module):
    """Two cache buffers updated at a position each call, then read, as litgpt's ``KVCache`` does; ``variant`` picks
    the update of ``k`` (a key of `UPDATES`) or an order of the program's reads and writes."""

    def __init__(self, variant: str, device: str):
        super().__init__()
        self.variant = variant
        self.register_buffer("k", torch.arange(64.0, device=device).reshape(1, 2, 8, 4))
        self.register_buffer("v", -torch.arange(64.0, device=device).reshape(1, 2, 8, 4))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.variant in UPDATES:
            UPDATES[self.variant][1](self.k, pos, x.sin())
            self.v.index_copy_(2, pos, x.cos())
            return (self.k * 2 + self.v).sum(2)
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


def _folded(ops: list[str]) -> list[str]:
    return [n for n in ops if n in IN_PLACE_FORMS.values()]


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
@pytest.mark.parametrize("variant", [*UPDATES, "read between"])
def test_a_cache_update_runs_in_place_with_eagers_results(variant, mode):
    jfn, equal = _decode(variant, mode)
    assert all(all(e) for e in equal), equal  # NOTE: (result, k, v) per call
    ops = _region_ops(jfn)
    op = UPDATES[variant][0] if variant in UPDATES else "index_copy"
    folded = [IN_PLACE_FORMS[op]] + (["thunder_nb_index_copy_"] if variant in UPDATES else [])
    assert sorted(_folded(ops)) == sorted(folded), ops
    assert not set(IN_PLACE_FORMS) & set(ops) and "copy_" not in ops, ops
    # NOTE: the caches are module buffers the region writes: written in place, read where they lie
    transform = jfn._lc_transforms[0]
    (plan,) = transform.cuda_graph_runner.plans.values()
    assert len(plan.write_back) == len(folded), plan
    assert any("run in place again" in n for n in transform.notes), transform.notes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", ["updated between", "new rows kept"])
def test_an_index_copy_stays_out_of_place_where_in_place_would_change_the_result(variant, mode):
    jfn, equal = _decode(variant, mode)
    assert all(all(e) for e in equal), equal
    ops = _region_ops(jfn)
    assert not _folded(ops) and "index_copy" in ops, ops


def test_without_the_fold_the_trace_keeps_thunders_out_of_place_pairs_and_the_same_results():
    """The oracle: ``in_place_updates=False`` is thunder's functionalized form, with the same results."""
    jfn, equal = _decode("index_copy_", "emulated", in_place_updates=False)
    assert all(all(e) for e in equal), equal
    ops = _region_ops(jfn)
    assert not _folded(ops), ops
    assert ops.count("index_copy") == ops.count("copy_") == 2, ops


@pytest.mark.slow  # NOTE: litgpt's GPT traced: seconds
def test_litgpt_kv_cache_decoding_updates_its_caches_in_place():
    """The zoo's litgpt pythia-14m decode step: each layer's key and value cache, one in-place update each. One layer
    of the zoo's two: a layer's caches are what is folded, and one layer's trace costs half the tracing."""
    pytest.importorskip("litgpt", reason="needs litgpt (the zoo extra: bash dev.sh installs it)")
    from thunder_nb.internals import build_traces
    from thunder_nb.testing import zoo
    from thunder_nb.testing.zoo_models import litgpt, seeded

    model = zoo.MODELS["litgpt-pythia-14m"]
    net = seeded(litgpt("pythia-14m", n_layer=1, block_size=64))("cpu").eval()
    net.set_kv_cache(batch_size=1, device=torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        jfn = thunder_nb.jit(model.infer(net))
        with torch.no_grad():
            # NOTE: the traces of one decoded token at position 4, built, not run: the ops are the trace's (a prefill
            # run first gives the decode step the same ones, at twice the tracing)
            build_traces(jfn, torch.zeros(1, 1, dtype=torch.long), torch.tensor([4]))
    ops = _region_ops(jfn)
    layers = len(net.transformer.h)
    assert ops.count("thunder_nb_index_copy_") == 2 * layers and "index_copy" not in ops, ops


def test_the_report_says_a_buffer_is_updated_where_it_lies_and_a_copied_input_is_written_back():
    """A module buffer is the caller's own tensor, read in place: the graph updates it and nothing is copied back.
    A function's argument is copied into the graph's buffer: the runner copies it back after each replay."""
    jfn, _ = _decode("index_copy_", "emulated")
    text = thunder_nb.analyze(jfn).to_text()
    assert "updated in place where it lies, by the graph: nothing to copy back" in text and "written back" not in text

    def bump(x, y):
        x.add_(1)
        return (x * y).sum()

    with capturing("emulated"), warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        jbump = thunder_nb.jit(bump)
        x, y = torch.zeros(4), torch.ones(4)
        for _ in range(3):
            jbump(x, y)
    assert torch.equal(x, torch.full((4,), 3.0))
    text = thunder_nb.analyze(jbump).to_text()
    assert "written back: x (updated in place: copied back to the caller's tensor after each replay)" in text, text
    assert "where it lies, by the graph" not in text
