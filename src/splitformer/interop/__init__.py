"""Exact weight maps between splitformer and other libraries (both directions)."""

from .torch_nn import from_torch, to_torch

__all__ = ["from_torch", "to_torch"]
