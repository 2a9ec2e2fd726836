"""Exact weight maps between splitformer and other libraries (both directions)."""

from .hf import from_hf, to_hf
from .timm import from_timm, to_timm
from .torch_nn import from_torch, to_torch

__all__ = ["from_hf", "from_timm", "from_torch", "to_hf", "to_timm", "to_torch"]
