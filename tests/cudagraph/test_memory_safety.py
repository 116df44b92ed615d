"""No silent wrong result under capture: one test per class of hazard, with emulated capture (CPU) and real capture (GPU).

Emulated capture (`thunder_nb.testing.emulated_capture`) replays by re-running the region and
writing its results into the recorded outputs' memory in place, without a version bump, as a real
replay does: a tensor that still points at graph memory sees the next call's values.
"""

from __future__ import annotations

import copy
import gc
import warnings

import pytest
import thunder
import torch

import thunder_nb
from gpu_or_emulated import CAPTURE, MODES, capturing, device_of, fixed, stock
from thunder_nb.fix import HeldOutputsWarning
from thunder_nb.testing.models import model_case
from thunder_nb.diagnosis.judge import assert_equal, judge


def randn(*shape, seed: int, device: str) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


# --- 1. a returned view of graph memory, made outside the region that owns it ----------------------


def last_row_after_island(x, w):
    logits = torch.tanh(x @ w)
    top = logits.abs().max().item()  # an island: what follows is outside the region
    return logits[-1], top


def last_row_in_a_region_of_views(x, w):
    logits = torch.tanh(x @ w)
    top = logits.abs().max().item()
    return logits[-1].unsqueeze(0).squeeze(0), top  # a later region made only of views


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", [last_row_after_island, last_row_in_a_region_of_views])
def test_a_returned_view_made_after_an_island_is_not_overwritten_by_the_next_call(mode, fn):
    device = device_of(mode)
    w = randn(16, 16, seed=0, device=device)
    xs = [randn(8, 16, seed=i, device=device) for i in (1, 2, 3)]
    with capturing(mode):
        t = fixed(mode)
        jfn = thunder.jit(fn, transforms=[t])
        kept = [jfn(x, w) for x in xs]
    assert t.graphs_captured >= 1
    for (row, top), x in zip(kept, xs):
        ref_row, ref_top = fn(x, w)
        assert_equal(row, ref_row)
        assert top == pytest.approx(ref_top)
    fwd = thunder_nb.analyze(jfn).forward
    # NOTE: each kept result copied out, or left where it lies while instances took turns (rotation)
    assert fwd.hand_out_stats.copied + fwd.hand_out_stats.rotated >= 3 and fwd.defects == ()


@pytest.mark.parametrize("mode", MODES)
def test_thunders_transform_returns_a_view_the_next_call_overwrites_and_the_checker_says_so(mode):
    """The hazard is real for thunder's transform (item kept out: a number-free variant), and predicted."""

    def last_row(x, w):
        logits = torch.tanh(x @ w)
        return logits[-1]

    device = device_of(mode)
    w = randn(16, 16, seed=0, device=device)
    x1, x2 = randn(8, 16, seed=1, device=device), randn(8, 16, seed=2, device=device)
    with capturing(mode):
        jfn = thunder.jit(last_row, transforms=[stock(mode)])
        jfn(x1, w)
        report = thunder_nb.analyze(jfn)
        kept = jfn(x1, w)  # a replay
        jfn(x2, w)
    assert [(d.rule, d.severity) for d in report.defects if d.is_error] == [("returned-graph-memory", "wrong result")]
    assert not judge(kept, last_row(x1, w)).equal  # overwritten by the third call
    assert_equal(kept, last_row(x2, w))


# --- 2. two forwards before one backward, the saved tensor a view made after an island ---------------


def reshaped_after_island(x, w):
    h = torch.tanh(x @ w)
    s = h.abs().max().item()
    r = h.reshape(-1)  # a view of graph memory, saved for the backward by the product below
    return (r * r).sum() * s


@pytest.mark.parametrize("mode", MODES)
def test_two_forwards_before_one_backward_with_a_saved_view_made_after_an_island(mode):
    device = device_of(mode)
    w0 = randn(16, 16, seed=0, device=device)
    x1, x2 = randn(8, 16, seed=1, device=device), randn(8, 16, seed=2, device=device)
    w_ref = w0.clone().requires_grad_()
    (reshaped_after_island(x1, w_ref) + reshaped_after_island(x2, w_ref)).backward()
    w = w0.clone().requires_grad_()
    with capturing(mode):
        t = fixed(mode)
        jfn = thunder.jit(reshaped_after_island, transforms=[t])
        jfn(x1, w).backward()  # capture
        w.grad = None
        with warnings.catch_warnings():
            warnings.simplefilter("error", HeldOutputsWarning)
            (jfn(x1, w) + jfn(x2, w)).backward()
    assert_equal(w.grad, w_ref.grad)
    report = thunder_nb.analyze(jfn)
    assert report.forward.hand_out_stats.guarded > 0 and report.defects == ()
    assert max(r.stats.instances for r in report.forward.regions) == 2


# --- 3. one jitted function over several parameter sets ---------------------------------------------


def layer(x, w, b):
    return torch.tanh(x @ w + b)


def parameter_sets(n: int, device: str) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    return [(torch.nn.Parameter(randn(16, 16, seed=10 + i, device=device) / 4),
             torch.nn.Parameter(randn(16, seed=20 + i, device=device))) for i in range(n)]


@pytest.mark.parametrize("mode", MODES)
def test_one_function_over_several_parameter_sets_keeps_each_layers_weights(mode):
    device = device_of(mode)
    params = parameter_sets(3, device)
    before = [(w.detach().clone(), b.detach().clone()) for w, b in params]
    x = randn(8, 16, seed=0, device=device)
    with capturing(mode):
        t = fixed(mode)
        jfn = thunder.jit(layer, transforms=[t])
        with torch.no_grad():  # NOTE: outputs kept with their autograd graphs would hold their graph instances
            outs = [[jfn(x, w, b) for w, b in params] for _ in range(2)]
    for out in outs:
        for o, (w, b) in zip(out, before):
            assert_equal(o, layer(x, w, b))
    for (w, b), (w0, b0) in zip(params, before):
        assert torch.equal(w.detach(), w0) and torch.equal(b.detach(), b0)
    (region,) = thunder_nb.analyze(jfn).forward.regions
    # NOTE: one graph per layer, and for each one more that took turns with it: the first call's result was still
    # held at the second (rotation, tests/cudagraph/test_rotation.py)
    assert region.stats.address_keys == 3 and len(region.graphs) == 6
    assert sorted(g.instance for g in region.graphs) == [0, 0, 0, 1, 1, 1]
    assert {i.name: i.role for i in region.plan.inputs}.get("w") == "static"


@pytest.mark.parametrize("mode", MODES)
def test_thunders_transform_over_several_parameter_sets_is_reported(mode):
    """thunder's runner copies layer 1's weights into layer 0's: the report names it."""
    device = device_of(mode)
    params = parameter_sets(2, device)
    w0_before = params[0][0].detach().clone()
    x = randn(8, 16, seed=0, device=device)
    with capturing(mode):
        jfn = thunder.jit(layer, transforms=[stock(mode)])
        for w, b in params:
            jfn(x, w, b)
    assert not torch.equal(params[0][0].detach(), w0_before)  # the corruption is real
    rules = {(d.rule, d.severity) for d in thunder_nb.analyze(jfn).defects}
    assert ("static-input-rebound", "wrong result") in rules


class Block(torch.nn.Module):
    def __init__(self, seed: int, device: str):
        super().__init__()
        self.w = torch.nn.Parameter(randn(16, 16, seed=seed, device=device) / 4)

    def forward(self, x):
        return torch.tanh(x @ self.w)


def block_apply(x, w):
    return torch.tanh(x @ w)


@pytest.mark.parametrize("mode", MODES)
def test_one_block_function_per_layer_trains_each_layer(mode):
    """A functional block applied with each layer's parameters, forward and backward, as a model would."""
    device = device_of(mode)
    blocks = [Block(i, device) for i in range(3)]
    ref_blocks = copy.deepcopy(blocks)
    x = randn(8, 16, seed=0, device=device)
    with capturing(mode):
        jfn = thunder.jit(block_apply, transforms=[fixed(mode)])
        for _ in range(2):
            h = x
            for blk in blocks:
                h = jfn(h, blk.w)
            h.sum().backward()
    for _ in range(2):
        h = x
        for blk in ref_blocks:
            h = block_apply(h, blk.w)
        h.sum().backward()
    for blk, ref in zip(blocks, ref_blocks):
        assert_equal(blk.w, ref.w)
        assert_equal(blk.w.grad, ref.w.grad)


# --- 4. aliasing as in eager ------------------------------------------------------------------------


def and_its_transpose(x):
    y = x.sin() * 2.0
    return y, y.t()


@pytest.mark.parametrize("mode", MODES)
def test_returned_tensors_that_share_memory_in_eager_share_it_after_the_copy_out(mode):
    device = device_of(mode)
    with capturing(mode):
        jfn = thunder.jit(and_its_transpose, transforms=[fixed(mode)])
        jfn(randn(4, 6, seed=0, device=device))
        y, yt = jfn(randn(4, 6, seed=1, device=device))  # a replay: copied out of graph memory
        jfn(randn(4, 6, seed=2, device=device))
    ref_y, ref_yt = and_its_transpose(randn(4, 6, seed=1, device=device))
    assert_equal(y, ref_y)
    assert_equal(yt, ref_yt)
    assert y.untyped_storage().data_ptr() == yt.untyped_storage().data_ptr()
    y.zero_()
    assert torch.count_nonzero(yt) == 0  # one memory, as in eager


def view_of_input(x):
    return x.cos() * 2.0, x.t()


@pytest.mark.parametrize("mode", MODES)
def test_a_view_of_a_strided_input_is_a_view_of_the_callers_tensor(mode):
    device = device_of(mode)
    with capturing(mode), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # NOTE: it used to warn and hand out a view of the runner's copy
        jfn = thunder.jit(view_of_input, transforms=[fixed(mode)])
        bases = [randn(4, 12, seed=i, device=device) for i in range(3)]
        outs = [jfn(b[:, ::2]) for b in bases]
    for base, (c, v) in zip(bases, outs):
        x = base[:, ::2]
        assert_equal(c, x.cos() * 2.0)
        assert v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        assert_equal(v, x.t())


def update_then_read_a_view(x):
    v = x[3, 1]  # a view of x, which the island reads
    s = v.item()  # an island: the region after it gets x and v, two inputs over one storage
    x.add_(0.25)  # updates v too
    return x.flatten(), v * s, v + 1


def fuzz_20261205(x0, x1):
    # NOTE: the program fuzzer's find, as it printed it: x1 and its view x1[7, 1] enter the region of x1.add_
    s1 = x1[7, 1].item()
    t2 = x1.clamp(max=0.25)
    t3 = x1 @ t2.t()
    s4 = t3.amax().item()
    t3.relu_()
    t5 = t2.t()
    x1.add_(0.25)
    t5.mul_(s1)
    t6 = t2 + 0.5
    t9 = x1.flatten()
    return t9, t5, t6, s4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", [update_then_read_a_view, fuzz_20261205])
def test_an_update_of_an_input_reaches_a_view_of_it_that_the_region_also_gets(mode, fn):
    """A region whose inputs are a tensor and a view of it (``x`` and ``x[3, 1]``, which an island read) updates the
    tensor in place: the view the region reads after the update, and the caller's tensor after the call, are eager's.
    The runner copied the two into separate buffers: the view kept its old value inside the graph, and one written
    back after the other undid it (the program fuzzer's seed 20261205, in processes whose string hashing ordered the
    view last)."""
    device = device_of(mode)
    with capturing(mode):
        jfn = thunder.jit(fn, transforms=[fixed(mode)])
        for i in range(3):  # NOTE: the recording call, then replays
            args = [randn(12, seed=i, device=device), randn(12, 12, seed=10 + i, device=device)]
            if fn is update_then_read_a_view:
                args = [randn(6, 4, seed=i, device=device)]
            eager_args = [a.clone() for a in args]
            got, want = jfn(*args), fn(*eager_args)
            for g, w in zip(got, want):
                assert_equal(g, w) if isinstance(w, torch.Tensor) else assert_equal(torch.tensor(g), torch.tensor(w))
            for a, e in zip(args, eager_args):
                assert_equal(a, e)


# --- 5. gradients kept by the caller ------------------------------------------------------------------


def mlp_loss(x, w1, w2):
    h = torch.tanh(x @ w1)
    return (h @ w2).pow(2).mean()


@pytest.mark.parametrize("lend", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_kept_from_autograd_grad_and_hooks_are_not_overwritten(mode, lend):
    """Whoever keeps a gradient keeps its values: ``torch.autograd.grad`` and hooks get the tensor autograd gets.

    The backward graph writes its gradients in place at every replay. Lent (the default), what autograd
    receives lies in graph memory, and the first kept one holds its instance: the backward records a
    second, and copies its gradients out from then on. Copied (``lend_gradients=False``), results kept
    over the next backwards stay as they were with one graph per region.
    """
    device = device_of(mode)
    w1, w2 = randn(16, 32, seed=0, device=device) / 4, randn(32, 8, seed=1, device=device) / 4
    xs = [randn(4, 16, seed=10 + i, device=device) for i in range(4)]

    def eager_grads(x):
        a, b = w1.clone().requires_grad_(), w2.clone().requires_grad_()
        return torch.autograd.grad(mlp_loss(x, a, b), [a, b])

    expected = [eager_grads(x) for x in xs]
    a, b = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    with capturing(mode):
        jfn = thunder.jit(mlp_loss, transforms=[fixed(mode, lend_gradients=lend)])
        torch.autograd.grad(jfn(xs[0], a, b), [a, b])  # capture
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HeldOutputsWarning)
            kept = [torch.autograd.grad(jfn(x, a, b), [a, b]) for x in xs]
            hooked = []
            handle = b.register_hook(hooked.append)
            for x in xs:
                jfn(x, a, b).backward()
            handle.remove()
        if device == "cuda":
            torch.cuda.synchronize()
    for got, want in zip(kept, expected):
        assert_equal(got, want)
    for got, (_, want) in zip(hooked, expected):
        assert_equal(got, want)
    assert_equal(b.grad, sum(e[1] for e in expected))
    report = thunder_nb.analyze(jfn)
    for region in report.forward.regions + report.backward.regions:
        want = 2 if lend and region in report.backward.regions else 1
        assert region.stats.instances == want and region.stats.held_calls == 0, region.name
    stats = report.backward.hand_out_stats
    assert stats.copied > 0
    assert (stats.lent > 0) == lend and jfn._lc_transforms[0].cuda_graph_runner.lending_stopped == lend


@pytest.mark.parametrize("lend", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_accumulated_into_grad(mode, lend):
    """Gradients accumulated over several backwards (no reset) are right.

    Lent, the first backward's gradients become the parameters' ``.grad`` in graph memory and hold that
    instance: the second backward records another and copies out from then on (the later gradients are
    added into the first ones); copied, one backward graph does it all.
    """
    device = device_of(mode)
    w1, w2 = randn(16, 32, seed=0, device=device) / 4, randn(32, 8, seed=1, device=device) / 4
    xs = [randn(4, 16, seed=10 + i, device=device) for i in range(5)]
    ref1, ref2 = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    for x in xs:
        mlp_loss(x, ref1, ref2).backward()
    a, b = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    with capturing(mode):
        jfn = thunder.jit(mlp_loss, transforms=[fixed(mode, lend_gradients=lend)])
        with warnings.catch_warnings():
            warnings.simplefilter("error", HeldOutputsWarning)
            for x in xs:
                jfn(x, a, b).backward()
        if device == "cuda":
            torch.cuda.synchronize()
    assert_equal((a.grad, b.grad), (ref1.grad, ref2.grad))
    report = thunder_nb.analyze(jfn)
    for region in report.forward.regions + report.backward.regions:
        want = 2 if lend and region in report.backward.regions else 1
        assert region.stats.instances == want and region.stats.held_calls == 0, region.name
    assert report.forward.hand_out_stats.guarded > 0  # the forward's saved tensors: left in place, watched


@pytest.mark.parametrize("mode", MODES)
def test_two_backwards_of_one_forward_add_up_and_zero_grad_in_place_keeps_them(mode):
    """``backward(retain_graph=True)`` twice, then ``zero_grad(set_to_none=False)`` and another step.

    The first backward's lent gradients become ``.grad``; the second finds them held, records another
    instance, and its gradients are added into them. Zeroed in place, ``.grad`` stays in that memory,
    and the next steps' gradients are added into it: every value as in eager PyTorch.
    """
    device = device_of(mode)
    w1, w2 = randn(16, 32, seed=0, device=device) / 4, randn(32, 8, seed=1, device=device) / 4
    xs = [randn(4, 16, seed=10 + i, device=device) for i in range(3)]
    models = []
    for _ in range(2):
        m = torch.nn.Module()
        m.w1, m.w2 = torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())
        models.append(m)
    got, ref = models
    with capturing(mode):
        jfn = thunder.jit(lambda x: mlp_loss(x, got.w1, got.w2), transforms=[fixed(mode)])
        for m, f in ((got, jfn), (ref, lambda x: mlp_loss(x, ref.w1, ref.w2))):
            loss = f(xs[0])
            loss.backward(retain_graph=True)
            loss.backward()
            twice = [p.grad.clone() for p in (m.w1, m.w2)]
            m.zero_grad(set_to_none=False)
            for x in xs[1:]:
                f(x).backward()
            m.result = twice + [p.grad.clone() for p in (m.w1, m.w2)]
        if device == "cuda":
            torch.cuda.synchronize()
    for a, b in zip(got.result, ref.result):
        assert_equal(a, b)
    assert jfn._lc_transforms[0].cuda_graph_runner.lending_stopped
    (backward,) = thunder_nb.analyze(jfn).backward.regions
    assert backward.stats.instances == 2 and backward.stats.held_calls == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_training_loop_gets_its_gradients_in_graph_memory_with_one_graph_per_region(mode):
    """Gradients reset before each backward (zero_grad's default): each backward lends them, nothing is copied.

    The parameters' ``.grad`` then lie in the backward graph's memory; the next backward replays the
    same instance over them, once they are reset. Losses, gradients and SGD updates match eager's.
    """
    device = device_of(mode)
    small = dict(layers=1, batch=2, seq=16, width=64) if mode == "emulated" else {}
    case = model_case("nanoGPT", device, **small)
    ref = model_case("nanoGPT", model=copy.deepcopy(case.model), **small)
    with capturing(mode):
        jfn = thunder_nb.jit(case.step, capture=CAPTURE[mode] is True)
        if mode == "emulated":
            jfn._lc_transforms[0].cuda_graph_runner.capture = True
        runner = jfn._lc_transforms[0].cuda_graph_runner
        with warnings.catch_warnings():
            warnings.simplefilter("error", HeldOutputsWarning)
            for step in range(4):
                batch = case.make_batch(step)
                losses = []
                for m, f in ((case, jfn), (ref, ref.step)):
                    for p in m.model.parameters():
                        p.grad = None
                    loss = f(*batch)
                    loss.backward()
                    losses.append(loss.detach())
                in_graph = [n for n, p in case.model.named_parameters() if runner.memory.where(p.grad)[1] is not None]
                # NOTE: the tied embedding/head weight gets two gradients, which autograd's engine adds out of place
                assert len(in_graph) == len(list(case.model.parameters())) - 1, in_graph
                assert_equal(*losses)
                for (n, p), q in zip(case.model.named_parameters(), ref.model.parameters()):
                    assert_equal(p.grad, q.grad, label=n)
                with torch.no_grad():
                    for m in (case, ref):
                        for p in m.model.parameters():
                            p -= 0.1 * p.grad
        if device == "cuda":
            torch.cuda.synchronize()
    report = thunder_nb.analyze(jfn)
    for region in report.forward.regions + report.backward.regions:
        assert region.stats.instances == 1 and region.stats.held_calls == 0, region.name
    stats = report.backward.hand_out_stats
    assert stats.copied == 0 and stats.lent >= 4 * len(in_graph) and not runner.lending_stopped


# --- 6. several jitted models alive in one process ---------------------------------------------------


def train(case, jfn, steps: int, seed: int, *, compiled: bool = False) -> list[torch.Tensor]:
    """Training steps as a loop writes them: gradients reset before each step (zero_grad's default)."""
    losses = []
    for i in range(steps):
        for p in case.model.parameters():
            p.grad = None
        if compiled:
            torch.compiler.cudagraph_mark_step_begin()  # NOTE: torch.compile's graphs need it in a training loop
        loss = jfn(*case.make_batch(seed + i))
        loss.backward()
        losses.append(loss.detach().clone())
    return losses


def reference(case, steps: int, seed: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Eager losses of ``steps`` steps from ``seed``, and the gradients of the last step."""
    ref = model_case(case.name, model=copy.deepcopy(case.model), vocab=case.vocab, batch=case.batch, seq=case.seq)
    losses = train(ref, ref.step, steps, seed)
    return losses, {n: p.grad for n, p in ref.model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("copy_outputs", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_several_jitted_models_alive_in_one_process(mode, copy_outputs):
    """nanoGPT and llama2 jitted side by side, another compiler's graphs recorded in between, results kept.

    On the GPU the middle model is torch.compile(mode="reduce-overhead"), whose CUDA-graph trees drop
    cuBLAS's workspaces when they record: a graph that recorded a workspace outside its own pool then
    replays into freed memory ("an illegal memory access", which kills the CUDA context). On the CPU
    it is a second thunder-nb model, emulated.
    """
    device = device_of(mode)
    small = dict(layers=1, batch=2, seq=16, width=64) if mode == "emulated" else {}
    a = model_case("llama2", device, **small)
    b = model_case("nanoGPT", device, seed=1, **small)
    kept = []
    with capturing(mode):
        ja = thunder.jit(a.step, transforms=[fixed(mode, copy_outputs=copy_outputs)])
        kept += train(a, ja, 3, seed=0)
        if mode == "gpu":
            other = model_case("llama2", device, model=copy.deepcopy(a.model))
            jb = torch.compile(other.step, mode="reduce-overhead")
            train(other, jb, 3, seed=100, compiled=True)
        jnano = thunder.jit(b.step, transforms=[fixed(mode, copy_outputs=copy_outputs)])
        train(b, jnano, 3, seed=200)
        gc.collect()
        kept += train(a, ja, 3, seed=3)
        if device == "cuda":
            torch.cuda.synchronize()
    ref_losses, ref_grads = reference(a, 6, seed=0)
    if copy_outputs:
        assert_equal(torch.stack(kept), torch.stack(ref_losses))
    else:
        assert_equal(kept[-1], ref_losses[-1])  # kept ones may be overwritten, as documented
    for n, p in a.model.named_parameters():
        assert_equal(p.grad, ref_grads[n], label=n)
