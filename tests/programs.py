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
