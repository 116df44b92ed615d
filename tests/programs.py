"""The test programs every layer is checked on (plain PyTorch functions and their inputs)."""

from __future__ import annotations

import torch


def seed(x):
    """Upstream #728/#727's reproducer: a data-dependent op at the end."""
    return x.sum().item()


def island(x):
    """An island (`.item()`) between two regions; its scalar feeds the second one."""
    y = x.sin().cos()
    s = y.sum().item()
    return (y * s).exp()


def mlp(x, w1, w2):
    """A small MLP's loss (forward + backward with requires_grad parameters)."""
    h = torch.relu(x @ w1)
    return (h @ w2).sum()


def saved_scalar(x, w):
    """A scalar from an island that the backward pass needs (thunder 0.2.6 asserts on it)."""
    y = (x * w).tanh()
    s = y.sum().item()
    return (y * s).sum()


def transfer(x):
    """A device round trip: CPU ops in the middle of a CUDA computation."""
    y = x.sin()
    z = y.cpu()
    w = z * 2
    return w.to("cuda") + y


def mlp_inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g).to(device)
    w1 = torch.randn(8, 16, generator=g).to(device).requires_grad_()
    w2 = torch.randn(16, 2, generator=g).to(device).requires_grad_()
    return x, w1, w2


def vec(n=8, device="cpu", seed_=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed_)
    return torch.randn(n, generator=g).to(device=device, dtype=dtype)


def assert_thunder_as_eager(fn, x, loss=torch.sum, gradient=None):
    """``fn`` under ``thunder.jit`` against eager, each on its own copy of ``x``: the values exact (the same kernels),
    and the gradients of ``loss(value)`` within ``gradient`` (exact where None; a tolerance where thunder
    differentiates its own decomposition, not eager's backward)."""
    import thunder
    from thunder_nb.diagnosis.judge import assert_equal
    from thunder_nb.diagnosis.tolerances import EXACT

    def value_and_grad(compiled):
        xg = x.clone().requires_grad_()
        y = compiled(fn)(xg)
        return y.detach(), torch.autograd.grad(loss(y), [xg])[0]

    (value, grad), (expected_value, expected_grad) = value_and_grad(thunder.jit), value_and_grad(lambda f: f)
    assert_equal(value, expected_value, tolerance=EXACT, label="value")
    assert_equal(grad, expected_grad, tolerance=EXACT if gradient is None else gradient, label="gradient")


def assert_jit_step_trains_as_eager(net, loss, steps: int = 4):
    """``thunder_nb.jit_step`` over ``net`` with ``loss(model, x)`` and AdamW, emulated capture, against eager's loop on
    a copy of ``net``: the losses of ``steps`` steps and the weights after them equal eager's."""
    import copy
    import warnings

    import thunder_nb
    from thunder_nb.diagnosis.judge import assert_equal

    ref = copy.deepcopy(net)
    batches = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(steps)]
    opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (net, ref))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = thunder_nb.jit_step(net, lambda x: loss(net, x), opt, capture="emulated")
        losses = [step(b) for b in batches]
    expected = []
    for b in batches:
        ref_opt.zero_grad()
        ref_loss = loss(ref, b)
        ref_loss.backward()
        ref_opt.step()
        expected.append(ref_loss.detach())
    assert_equal(losses, expected, label="losses")
    assert_equal(dict(net.named_parameters()), dict(ref.named_parameters()), label="weights")
