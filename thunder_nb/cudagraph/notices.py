"""The warnings the CUDA-graph runner gives: a region that ran without its graph, and why."""

from __future__ import annotations

__all__ = ["HeldOutputsWarning", "EagerFallbackWarning", "RecaptureWarning"]


class HeldOutputsWarning(UserWarning):
    """A region ran without a graph: every instance's outputs saved for the backward were still held."""


class EagerFallbackWarning(UserWarning):
    """Regions ran eagerly (no CUDA graph was captured)."""


class RecaptureWarning(UserWarning):
    """A region read too many values of a Python number to capture a graph for each: it runs without a graph."""
