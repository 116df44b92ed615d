"""Rotation (#31.4): instances of a region take turns with the tensors a forward returns, instead of copying them out.

A loop that keeps its last result while it makes the next one (``y = f(x)``, ``x = f(x)``) then replays two
instances in turn; a loop that keeps every result stops rotating and copies. Each test checks the values
against eager first, with emulated capture (CPU) and real capture (GPU): a replay that wrote memory the
caller still held would show there as a wrong value.
"""

from __future__ import annotations

import gc

import pytest
import thunder
import torch

import thunder_nb
from gpu_or_emulated import MODES, capturing, device_of, fixed
from thunder_nb.diagnosis.judge import assert_equal


def chain(x):
    for _ in range(6):
        x = torch.tanh(x) * 1.5 + 0.1
    return x


def pair(x):
    y = torch.sin(x) + 1
    return y, y[1:]  # two views of one buffer: rotated together


def randn(*shape, seed: int, device: str) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def graphs(jfn) -> int:
    return sum(len(r.stats.graphs) for r in thunder_nb.analyze(jfn).forward.regions)


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_that_keeps_its_last_result_takes_turns_in_two_instances_without_copying(mode):
    device = device_of(mode)
    xs = [randn(64, 64, seed=i, device=device) for i in range(8)]
    with capturing(mode):
        jfn = thunder.jit(chain, transforms=[fixed(mode)])
        prev = None
        for x in xs:
            y = jfn(x)
            if prev is not None:  # NOTE: the last result, held across this call: still its own values
                assert_equal(prev[0], prev[1])
            prev = (y, chain(x))
    fwd = thunder_nb.analyze(jfn).forward
    stats = fwd.hand_out_stats
    assert stats.copied == 0 and stats.rotated == len(xs), stats
    assert stats.rotation_stopped == ()
    assert graphs(jfn) == 2  # NOTE: the first instance and one that takes turns with it, never more
    assert fwd.defects == ()


@pytest.mark.parametrize("mode", MODES)
def test_results_fed_back_as_inputs_keep_two_instances(mode):
    device = device_of(mode)
    x = randn(32, 32, seed=0, device=device)
    ref = x.clone()
    with capturing(mode):
        jfn = thunder.jit(chain, transforms=[fixed(mode)])
        for _ in range(10):
            x = jfn(x)  # NOTE: the caller's tensor comes back: copied in, not read where it lies (no key per address)
            ref = chain(ref)
            assert_equal(x, ref)
    assert graphs(jfn) == 2


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_that_keeps_every_result_stops_rotating_and_copies(mode):
    device = device_of(mode)
    xs = [randn(16, 16, seed=i, device=device) for i in range(7)]
    with capturing(mode):
        jfn = thunder.jit(chain, transforms=[fixed(mode)])
        kept = [jfn(x) for x in xs]
    for y, x in zip(kept, xs):
        assert_equal(y, chain(x))
    stats = thunder_nb.analyze(jfn).forward.hand_out_stats
    assert stats.rotated == 2 and stats.copied == len(xs) - 2, stats
    assert len(stats.rotation_stopped) == 1
    assert graphs(jfn) == 3  # NOTE: two took turns until both were held; one more serves every later call


@pytest.mark.parametrize("mode", MODES)
def test_views_of_one_buffer_rotate_together_and_stay_views_of_one_buffer(mode):
    device = device_of(mode)
    xs = [randn(8, 8, seed=i, device=device) for i in range(5)]
    with capturing(mode):
        jfn = thunder.jit(pair, transforms=[fixed(mode)])
        prev = None
        for x in xs:
            y, tail = jfn(x)
            assert tail.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
            if prev is not None:
                assert_equal(prev[0], prev[2][0])
                assert_equal(prev[1], prev[2][1])
            prev = (y, tail, pair(x))
    assert thunder_nb.analyze(jfn).forward.hand_out_stats.rotated > 0


@pytest.mark.parametrize("mode", MODES)
def test_rotation_0_copies_as_before(mode):
    device = device_of(mode)
    xs = [randn(16, 16, seed=i, device=device) for i in range(4)]
    with capturing(mode):
        jfn = thunder.jit(chain, transforms=[fixed(mode, rotation=0)])
        kept = [jfn(x) for x in xs]
    for y, x in zip(kept, xs):
        assert_equal(y, chain(x))
    stats = thunder_nb.analyze(jfn).forward.hand_out_stats
    assert stats.rotated == 0 and stats.copied == len(xs)
    assert graphs(jfn) == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_training_forward_copies_its_loss_instead_of_rotating_a_region_that_saves(mode):
    # NOTE: another instance of a region that saves for the backward would cost its saved tensors again: a region
    # that saves does not rotate, and its returned loss is copied (a few bytes)
    device = device_of(mode)
    w = torch.nn.Parameter(randn(16, 16, seed=0, device=device))

    def loss_fn(x, w):
        return torch.tanh(x @ w).sum()

    with capturing(mode):
        jfn = thunder.jit(loss_fn, transforms=[fixed(mode)])
        prev = None
        for i in range(4):
            loss = jfn(randn(4, 16, seed=i + 1, device=device), w)
            loss.backward()
            w.grad = None
            prev = loss
    assert prev is not None
    stats = thunder_nb.analyze(jfn).forward.hand_out_stats
    assert stats.rotated == 0 and stats.copied == 4, stats


def test_rotation_is_checked():
    with pytest.raises(ValueError, match="rotation"):
        thunder_nb.FixedCUDAGraphTransform(rotation=-1)


def _peaks_of_a_loop(transform, x0: torch.Tensor, calls: int) -> tuple[dict[str, int], list[float], str]:
    """Peak memory beyond what was there before, in a loop whose calls each keep the last result: allocated over the
    whole loop (compile and recordings included) and over its steady state (after 3 calls), and reserved (what the
    caching allocator holds from the GPU: the physical footprint) over the whole loop; the results; and the segments
    the loop made (`_new_segments`)."""
    # NOTE: the configuration measured before this one left graphs, pools and buffers in reference cycles (thunder's
    # compiled functions): freed by the collector in the middle of this loop, they made its figures too small (the H200
    # run of 2026-12-03 measured thunder's transform at 4 MiB steady, below its own input buffer and output, 8 MiB)
    gc.collect()
    torch.cuda.empty_cache()
    before = _segment_addresses()
    jfn = thunder.jit(chain, transforms=[transform])
    torch.cuda.synchronize()
    base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    y, results = None, []
    for i in range(calls):
        if i == 3:
            torch.cuda.synchronize()
            whole = torch.cuda.max_memory_allocated() - base
            reserved = torch.cuda.max_memory_reserved() - base_reserved
            torch.cuda.reset_peak_memory_stats()
        y = jfn(x0 + i)
        results.append(y[0, 0].item())
    torch.cuda.synchronize()
    steady = torch.cuda.max_memory_allocated() - base
    reserved = max(reserved, torch.cuda.max_memory_reserved() - base_reserved)
    return {"whole": max(whole, steady), "steady": steady, "reserved": reserved}, results, _new_segments(before)


def _segment_addresses() -> set[int]:
    return {s["address"] for s in torch.cuda.memory_snapshot()}


def _new_segments(before: set[int]) -> str:
    """The caching allocator's segments made since ``before`` (their addresses): size, pool, stream, blocks in use,
    for the message of a reserved-memory assertion."""
    return "; ".join(f"{s['total_size'] >> 20} MiB pool {s.get('segment_pool_id')} stream {s.get('stream')} in use "
                     f"{s['allocated_size'] >> 20} MiB in {sum(b['state'] == 'active_allocated' for b in s['blocks'])}"
                     for s in torch.cuda.memory_snapshot() if s["address"] not in before)


@pytest.mark.gpu
def test_gpu_rotation_holds_no_more_than_copying_and_one_output_more_than_thunders_transform():
    from thunder.transforms.cudagraph import CUDAGraphTransform

    x0 = randn(1024, 1024, seed=0, device="cuda")  # NOTE: 4 MiB a tensor
    out_bytes = x0.numel() * x0.element_size()
    peaks, new = {}, {}
    for name, make in (("rotation", lambda: fixed("gpu")), ("copy", lambda: fixed("gpu", rotation=0)),
                       ("thunder", CUDAGraphTransform)):
        peaks[name], results, new[name] = _peaks_of_a_loop(make(), x0, 10)
        assert results == pytest.approx([chain(x0 + i)[0, 0].item() for i in range(10)], rel=1e-5)
    whole, steady, reserved = ({k: v[m] for k, v in peaks.items()} for m in ("whole", "steady", "reserved"))
    print("peak MiB: " + ", ".join(f"{m} {({k: round(v[m] / 2**20, 1) for k, v in peaks.items()})}"
                                    for m in ("whole", "steady", "reserved")))
    # NOTE: rotation's second instance shares the first one's pool and input buffers: it costs its output buffer, where
    # copying costs a copy of each kept result; thunder's transform hands out its one buffer, which its next call
    # overwrites while the caller still holds it: one output more than thunder's is what not overwriting it costs
    assert steady["rotation"] <= steady["copy"], steady
    assert steady["rotation"] <= steady["thunder"] + out_bytes + 2**20, steady
    # NOTE: the second instance is recorded while the first one's output is held; its intermediates take blocks of
    # the shared pool (allocated while recording, but memory the pool already held: the reserved figure), and its
    # own output buffer is new. So, allocated: the held output and the new buffer above thunder's first call
    # (H200, 2026-12-03: rotation 24 MiB, copy 20, thunder 16)
    assert whole["rotation"] <= whole["thunder"] + 2 * out_bytes + 2**20, whole
    # NOTE: reserved memory grows in whole segments of the caching allocator (20 MiB for blocks of 1 to 10 MiB,
    # kLargeBuffer), and a segment serves one stream: rotation's two instances are recorded on two capture streams,
    # so the second takes segments of its own, as many as one instance takes, which is thunder's whole figure
    # (H100, 2026-12-06, new segments printed: thunder's transform one 20-MiB segment, rotation two on two streams;
    # reserved alone 42/22/22 MiB for rotation/copy/thunder, after other files in one process 40/20/20, in a worker
    # of 4 on the GPU 80/40/40: every figure doubled there, unexplained, the ratio the same). Plus 2 MiB of small
    # blocks
    print(f"new segments: {new}")
    assert reserved["rotation"] <= 2 * reserved["thunder"] + 2 * 2**20, (reserved, new)
