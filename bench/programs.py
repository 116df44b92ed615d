"""The benchmark programs (plain PyTorch), shared by bench_cudagraphs.py and the GPU tests."""

from __future__ import annotations

import torch


def seed(x):
    """Upstream #728/#727's reproducer."""
    return x.sum().item()


def island(x):
    """16 steps, `.item()` of the sum (an island), 16 more steps, times the scalar."""
    for _ in range(16):
        x = torch.tanh(x * 1.0001 + 0.0001)
    s = x.sum().item()
    for _ in range(16):
        x = torch.tanh(x * 1.0001 + 0.0001)
    return x * s


def island_device_scalar(x):
    """The island program written by hand with the scalar kept on the device (no `.item()`)."""
    for _ in range(16):
        x = torch.tanh(x * 1.0001 + 0.0001)
    s = x.sum()
    for _ in range(16):
        x = torch.tanh(x * 1.0001 + 0.0001)
    return x * s


def chain(x):
    """A launch-bound elementwise chain without islands (32 steps)."""
    for _ in range(32):
        x = torch.tanh(x * 1.0001 + 0.0001)
    return x


def matmul_chain(x, w):
    """12 steps of a 2048x2048 matmul chain (graph-pool memory: per-region dels matter)."""
    for _ in range(12):
        x = torch.tanh(x @ w)
    return x


def norm_chain(x):
    """A 12-step tanh chain whose two numbers from islands feed Python arithmetic (#13)."""
    for _ in range(6):
        x = torch.tanh(x * 1.0001 + 0.0001)
    s = x.norm().item()
    m = x.abs().max().item()
    x = x / (s + 1)
    for _ in range(6):
        x = torch.tanh(x * 1.0001 + m)
    return x


def fill_from_item(x):
    """torch.full_like from an island's number (#13)."""
    return torch.full_like(x, x.sum().item()) * x


def normalise_between_matmuls(x, w):
    """h / (h.mean().item() + 1e-3) between two matmuls (#13)."""
    h = torch.tanh(x @ w)
    h = h / (h.mean().item() + 1e-3)
    return torch.tanh(h @ w)
