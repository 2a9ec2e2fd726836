"""Attention kernels: how the score a(x,x') becomes the integral kernel g(x,x').

A kernel maps per-head Q, K, V (B, H, N_x, d_h) to int g(x,x') V(x',.) dx' (B, H, N_x, d_h).
The softmax kernel

    g(x,x') = exp(a(x,x')) / int exp(a(x,eta)) deta,   a = <Q(x), K(x')> / sqrt(d_h) + m(x,x')

is the standard one and runs through ``scaled_dot_product_attention`` (the fused path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Kernel", "SoftmaxKernel"]


class Kernel(nn.Module):
    """Base class of attention kernels (a value plugged into NonlocalAttention)."""

    name = "kernel"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        raise NotImplementedError


class SoftmaxKernel(Kernel):
    """g = softmax_x'(<Q(x),K(x')> * scale + m(x,x')); scale defaults to 1/sqrt(d_h)."""

    name = "softmax"

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0):
        if is_causal and attn_mask is not None:
            # The mask already carries the causal support; sdpa takes one or the other.
            is_causal = False
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=self.scale,
        )
