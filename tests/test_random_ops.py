"""PyTorch's random ops that thunder 0.2.6 runs as opaque calls have the gradients of their own draws under thunder and
thunder-nb (`thunder_nb.internals.random_ops`, `thunder_nb.internals.attention`): thunder called them again for the
backward, which drew anew, so ``nn.Dropout2d``, ``nn.AlphaDropout``, ``F.gumbel_softmax`` and an attention's dropout
trained on the gradients of another mask than their outputs', silently.

The judge of a random op is its own derivative: with the same seed before each call, the compiled function is a
fixed function of its input, and its gradient along a direction must equal the central difference of its values
there (float64: equal to 1e-6 of their size where the gradient is the op's own)."""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_nb
from thunder_nb import internals
from thunder_nb.diagnosis.failures import known_limit
from thunder_nb.fix import EagerFallbackWarning
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.diagnosis.tolerances import EXACT, Tolerance
from thunder_nb.internals import attention, random_ops
from thunder_nb.testing.modes import emulate_runner, jit_capture

from gpu_or_emulated import CAPTURE, MODES, capturing, device_of

#: a float64 central difference against the gradient: rounding (1e-16 / 1e-6) and the step's square (1e-12) are far
#: below it; a gradient of another mask is off by its size
DERIVATIVE = Tolerance(1e-6, 1e-8)


class Attention(torch.nn.Module):
    """Self-attention with dropout, its weights asked for or not (the Transformer layers ask for none)."""

    def __init__(self, need_weights: bool):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(8, 2, dropout=0.3, batch_first=True)
        self.need_weights = need_weights

    def forward(self, x):
        return self.attn(x, x, x, need_weights=self.need_weights)[0]


def _module(f):
    return torch.nn.Sequential(torch.nn.Linear(8, 8), _Lambda(f))


class _Lambda(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


class DropPath(torch.nn.Module):
    """timm's ``drop_path`` on a residual branch: one Bernoulli draw per sample, by ``bernoulli_``."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.branch = p, torch.nn.Linear(8, 8)

    def forward(self, x):
        keep = 1 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x + self.branch(x) * mask.div_(keep)


class StochasticDepth(torch.nn.Module):
    """torchvision's ``StochasticDepth`` on a residual branch (its noise by ``torch.empty(...).bernoulli_``)."""

    def __init__(self, p: float):
        super().__init__()
        import torchvision.ops

        self.branch, self.depth = torch.nn.Linear(8, 8), torchvision.ops.StochasticDepth(p, "row")

    def forward(self, x):
        return x + self.depth(self.branch(x))


#: (input shape, module): each draws at random in training mode
CASES = {
    "timm's DropPath (bernoulli_)": ((6, 8), DropPath(0.5)),
    "torchvision's StochasticDepth": ((6, 8), StochasticDepth(0.5)),
    "nn.Dropout1d": ((3, 4, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout1d(0.5))),
    "nn.Dropout2d": ((2, 3, 4, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout2d(0.5))),
    "nn.Dropout3d": ((2, 3, 2, 2, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout3d(0.5))),
    "nn.AlphaDropout": ((4, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SELU(),
                                                    torch.nn.AlphaDropout(0.3))),
    "nn.FeatureAlphaDropout": ((2, 3, 8), torch.nn.Sequential(torch.nn.Linear(8, 8),
                                                              torch.nn.FeatureAlphaDropout(0.3))),
    "torch.dropout": ((4, 8), _module(lambda x: torch.dropout(x, 0.3, True))),
    "torch.native_dropout": ((4, 8), _module(lambda x: torch.native_dropout(x, 0.3, True)[0])),
    "F.gumbel_softmax": ((4, 8), _module(lambda x: F.gumbel_softmax(x, tau=0.5))),
    "attention's dropout, weights asked": ((3, 5, 8), Attention(need_weights=True)),
    "attention's dropout, no weights": ((3, 5, 8), Attention(need_weights=False)),
    "nn.TransformerEncoderLayer": ((3, 5, 8), torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2,
                                                                               batch_first=True)),
}


def _directional(fn, x, direction, seed, step=1e-6):
    """(the gradient of ``fn`` at ``x`` along ``direction``, the central difference there), each call seeded alike
    and needing a gradient alike (the same compiled forward: under capture, the same graph)."""
    values = []
    for at in (x, x + step * direction, x - step * direction):
        at = at.detach().requires_grad_()
        torch.manual_seed(seed)
        value = fn(at)
        values.append((value.detach(), torch.autograd.grad(value, [at])[0]))
    (_, grad), (after, _), (before, _) = values
    return (grad * direction).sum(), (after - before) / (2 * step)


def _compile(module, how, mode):
    if how == "thunder.jit":
        return thunder.jit(module)
    jitted = thunder_nb.jit(module, capture=jit_capture(CAPTURE[mode]))
    emulate_runner(internals.jit_transforms(jitted)[0], CAPTURE[mode])
    return jitted


#: the cases the fast tier leaves to the full suite (2 s: a whole encoder layer traced)
SLOW = ("nn.TransformerEncoderLayer",)
#: the cases also run under plain ``thunder.jit`` (the mends are thunder's tables, which thunder_nb.jit goes through)
PLAIN = ("nn.Dropout2d", "nn.AlphaDropout", "attention's dropout, weights asked", "torchvision's StochasticDepth")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case,how", [pytest.param(c, "thunder_nb.jit", marks=[pytest.mark.slow] if c in SLOW else [])
                                      for c in CASES] + [(c, "thunder.jit") for c in PLAIN])
def test_a_random_ops_gradient_is_that_of_its_own_draws(case, how, mode):
    """The compiled module's gradient along a direction equals the central difference of its seeded outputs, as
    eager's does (checked first: the judge itself holds)."""
    assert random_ops.installed() and attention.installed()  # NOTE: the session's conftest, as an entry point does
    shape, module = CASES[case]
    device = device_of(mode)
    torch.manual_seed(0)
    module = module.to(device, torch.float64).train()
    x = torch.randn(*shape, dtype=torch.float64, device=device)
    direction = torch.randn_like(x)
    weights = torch.randn_like(module(x))

    def eager(x):
        return (module(x) * weights).sum()

    assert_equal(*_directional(eager, x, direction, seed=1), tolerance=DERIVATIVE, label="eager's own")
    with capturing(mode):
        compiled = _compile(module, how, mode)

        def loss(x):
            return (compiled(x) * weights).sum()

        loss(x.requires_grad_()).backward()  # NOTE: recorded (under capture) before the seeded calls, which replay
        gradient, difference = _directional(loss, x, direction, seed=1)
    assert_equal(gradient, difference, tolerance=DERIVATIVE, label=f"{case}'s gradient along a direction")


def test_the_dropouts_keep_whole_channels_at_the_rate_asked_and_scale_as_eager():
    """Feature dropout zeroes whole channels, about ``p`` of them; a kept value is eager's ``x * (1 / (1 - p))``
    exactly, and the alpha dropouts' values are eager's formula for the same mask (ATen's ``Dropout.cpp``)."""
    torch.manual_seed(0)
    x = torch.rand(64, 256, 2, 2) + 0.5  # NOTE: no zero in the input: a zero out is a dropped value
    out = thunder.jit(lambda x: F.dropout2d(x, 0.25, training=True))(x)
    kept = out != 0
    assert torch.equal(kept.all(dim=(2, 3)), kept.any(dim=(2, 3))), "a channel partly dropped"
    rate = float(kept.float().mean())
    assert abs(rate - 0.75) < 5 * (0.25 * 0.75 / kept[..., 0, 0].numel()) ** 0.5, rate  # NOTE: five sigmas
    assert_equal(out, x * (kept.to(x.dtype) / 0.75), tolerance=EXACT, label="kept values")  # NOTE: ATen's order

    alpha, p = 1.7580993408473766, 0.3
    scale = (1 / ((alpha * alpha * p + 1) * (1 - p))) ** 0.5
    for name, fn, channel_wise in (("alpha", F.alpha_dropout, False), ("feature alpha", F.feature_alpha_dropout, True)):
        out = thunder.jit(lambda x: fn(x, p, training=True))(x)
        dropped = (torch.zeros((), dtype=x.dtype) - 1) * (alpha * scale) + alpha * scale * p  # NOTE: in float32
        noise = (out != dropped).to(x.dtype)
        if channel_wise:
            assert torch.equal(noise.amax(dim=(2, 3)), noise.amin(dim=(2, 3))), f"{name}: a channel partly dropped"
        eager = x * (noise * scale) + ((noise - 1) * (alpha * scale) + alpha * scale * p)
        assert_equal(out, eager, tolerance=EXACT, label=f"{name} dropout")
        assert abs(float(noise.mean()) - (1 - p)) < 0.01, name


def test_the_random_fills_draw_anew_at_each_call_as_eager_draws():
    """``bernoulli_(p)`` (a number or a tensor), ``torch.bernoulli(x, p)``, ``uniform_`` and ``normal_``, which thunder
    0.2.6 lacked: each call draws anew, from eager's distribution (five sigmas of 65,536 draws)."""
    fills = {"bernoulli_(0.7)": (lambda x: x.new_empty(x.shape).bernoulli_(0.7), 0.7, (0.7 * 0.3) ** 0.5),
             "bernoulli_(tensor)": (lambda x: x.new_empty(x.shape).bernoulli_(torch.full_like(x, 0.7)), 0.7,
                                    (0.7 * 0.3) ** 0.5),
             "torch.bernoulli(x, 0.7)": (lambda x: torch.bernoulli(x, 0.7), 0.7, (0.7 * 0.3) ** 0.5),
             "uniform_(-1, 3)": (lambda x: x.new_empty(x.shape).uniform_(-1, 3), 1.0, 4 / 12 ** 0.5),
             "normal_(1, 2)": (lambda x: x.new_empty(x.shape).normal_(1, 2), 1.0, 2.0)}
    x = torch.zeros(256, 256)
    for name, (fill, mean, std) in fills.items():
        compiled = thunder.jit(lambda x: fill(x) * 1)
        first, second = compiled(x), compiled(x)
        assert not torch.equal(first, second), f"{name}: the same draws twice"
        bound = 5 * std / x.numel() ** 0.5
        assert abs(float(first.mean()) - mean) < bound and abs(float(first.std()) - std) < 5 * bound, name
        if name.startswith("uniform"):
            assert float(first.min()) >= -1 and float(first.max()) < 3, name


def test_a_python_random_draw_is_refused_with_what_to_write_instead():
    """``random.random()`` and ``np.random.rand()`` in a traced forward ran once, while thunder traced, and every call
    kept the first draw (a layer skipped at random always skipped, or never), silently: now refused, with a note.
    A generator made and seeded in the traced code, which draws nothing, still traces."""
    import random

    import numpy as np

    warnings.simplefilter("ignore", EagerFallbackWarning)  # NOTE: on the CPU, regions run eagerly

    class SkippedAtRandom(torch.nn.Module):
        def __init__(self, draw):
            super().__init__()
            self.branch, self.draw = torch.nn.Linear(8, 8), draw

        def forward(self, x):
            return x if self.training and self.draw() < 0.5 else x + self.branch(x)

    for draw, name in ((random.random, "random.random"), (np.random.rand, "numpy.random.rand")):
        with pytest.raises(NotImplementedError, match=f"{name}\\(\\) draws a Python random number") as raised:
            thunder_nb.jit(SkippedAtRandom(draw))(torch.randn(2, 8))
        component, advice = known_limit(raised.value)
        assert "keeps its result for every call" in component and "StochasticDepth" in advice, advice
        (note,) = raised.value.__notes__
        assert note.startswith("thunder-nb:") and "bernoulli_" in note, note
    seeded = thunder_nb.jit(lambda x: x * (random.Random(0) is not None) * (np.random.default_rng(0) is not None))
    assert_equal(seeded(torch.ones(2)), torch.ones(2), tolerance=EXACT, label="seeded, no draw")


def test_a_hard_gumbel_softmax_is_one_hot_with_the_soft_ones_gradient():
    """``hard=True``: a one-hot forward, and the gradient of the soft sample of the same noise (the straight-through
    estimator PyTorch defines)."""
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, 6, dtype=torch.float64)
    grads = {}
    for hard in (True, False):
        fn = thunder.jit(lambda x: F.gumbel_softmax(x, tau=0.5, hard=hard))
        torch.manual_seed(3)
        out = fn(x)
        (grads[hard],) = torch.autograd.grad((out * weights).sum(), [x])
        if hard:
            assert torch.equal(out.detach().sum(-1), torch.ones(4, dtype=torch.float64))
            assert torch.equal(out.detach().amax(-1), torch.ones(4, dtype=torch.float64))
    assert_equal(grads[True], grads[False], tolerance=EXACT, label="hard sample's gradient")


def test_a_fractional_max_pool_runs_without_a_gradient_and_refuses_one_with_what_to_do():
    """Its windows are drawn at random, and thunder's opaque call cannot be given them: its gradient is refused with
    a note (it would be another draw's), its evaluation runs."""
    warnings.simplefilter("ignore", EagerFallbackWarning)  # NOTE: on the CPU, regions run eagerly
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1), torch.nn.FractionalMaxPool2d(2, output_size=(3, 3)))
    x = torch.randn(2, 2, 6, 6)
    with torch.no_grad():
        assert thunder_nb.jit(net)(x).shape == (2, 3, 3, 3)
    with pytest.raises(NotImplementedError, match="draws at random") as raised:
        thunder_nb.jit(net)(x)
    component, advice = known_limit(raised.value)
    assert "automatic registration" in component and "F.max_pool2d" in advice, advice
    (note,) = raised.value.__notes__
    assert note.startswith("thunder-nb:") and "F.adaptive_max_pool2d" in note, note


#: (name, module, its call on (queries, keys)): nn.MultiheadAttention's options and the Transformer layers
ATTENTION = {
    "weights averaged": (lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True), lambda m, q, k: m(q, k, k)),
    "padding and boolean causal masks, no weights": (
        lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True),
        lambda m, q, k: m(q, q, q, need_weights=False, key_padding_mask=(torch.arange(5, device=q.device) > 3)
                          .expand(3, 5), attn_mask=torch.ones(5, 5, dtype=torch.bool, device=q.device).triu(1))),
    "sequence first, kdim, vdim, bias_kv, zero_attn, weights per head": (
        lambda: torch.nn.MultiheadAttention(8, 2, kdim=6, vdim=4, add_bias_kv=True, add_zero_attn=True),
        lambda m, q, k: m(q.transpose(0, 1), k[..., :6].transpose(0, 1), k[..., :4].transpose(0, 1),
                          average_attn_weights=False)),
    "nn.Transformer, norm first, padding mask": (
        lambda: torch.nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True, norm_first=True,
                                     activation="gelu"),
        lambda m, q, k: m(q, k, src_key_padding_mask=torch.zeros(3, 5, dtype=torch.bool, device=q.device))),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [pytest.param(c, marks=[] if c.startswith("padding") else [pytest.mark.slow])
                                  for c in ATTENTION])  # NOTE: slow, 3-6 s each: the fast tier keeps the masks' case
def test_attention_modules_train_and_evaluate_as_eager(case, mode):
    """Outputs and gradients in training mode, then outputs under ``torch.no_grad()`` in evaluation mode (eager's fused
    inference path), of ``thunder_nb.jit(module)``: equal to eager's within the tolerance thunder without graphs needs
    on the same inputs (the same function computed by other kernels). thunder 0.2.6 failed the backward without
    attention weights, the boolean masks and every evaluation."""
    make, call = ATTENTION[case]
    device = device_of(mode)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # NOTE: nn.Transformer's, of no nested tensors with norm_first
        module = make().to(device)
    q, k = torch.randn(3, 5, 8, device=device), torch.randn(3, 4, 8, device=device)

    def trained(fn):
        module.zero_grad()
        out = fn(q, k)
        parts = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
        sum((o * (i + 1)).sum() for i, o in enumerate(parts)).backward()
        return parts, {n: p.grad.clone() for n, p in module.named_parameters()}

    def compiled_call(q, k):
        return call(jitted, q, k)

    eager = trained(lambda q, k: call(module, q, k))
    plain = thunder_nb.jit(module, capture=False)  # NOTE: the yardstick: the same executors, no graphs
    without_graphs = trained(lambda q, k: call(plain, q, k))
    with capturing(mode):
        jitted = _compile(module, "thunder_nb.jit", mode)
        assert_equal(trained(compiled_call), eager, without_graphs=without_graphs,
                     label=f"{case}: outputs and gradients")
        module.eval()
        jitted, plain = _compile(module, "thunder_nb.jit", mode), thunder_nb.jit(module, capture=False)
        with torch.no_grad():
            # NOTE: on the GPU eager's fused inference path differs from the Python path by more than float32's
            # rounding (1e-4 on the H100), thunder without graphs alike: the yardstick says so
            assert_equal(call(jitted, q, k), call(module, q, k), without_graphs=call(plain, q, k),
                         label=f"{case}: evaluation")
