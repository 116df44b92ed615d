"""Tools for testing CUDA-graph code without a GPU: an emulated capture whose replay writes memory as a real one
does."""

from .emulate import EmulatedGraph, emulated_capture

__all__ = ["EmulatedGraph", "emulated_capture"]
