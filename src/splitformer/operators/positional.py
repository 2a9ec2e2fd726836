"""Kernels on the token coordinates: relative-position kernels k(x - x') (docs/math.md 3.12, 3.18).

ALiBi (a linear penalty in |x - x'|) and rotary positions (RoPE: Q and K rotated by angles
proportional to the coordinate, so that <R_x q, R_x' k> depends on x - x' only). Both read the
token grid's coordinates when a ``grid`` gives them, the index otherwise (queries bottom-right
aligned with the keys, as every kernel of ``operators.kernels`` reads a causal support). They
are registered in ``operators.kernels.KERNELS`` with the others.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .kernel import Kernel, KernelSite, _grid_additive, _grid_sdpa_support, check_scale
from .sdpa import sdpa

__all__ = ["ALiBiKernel", "RotaryKernel", "alibi_slopes"]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's head slopes m_h: the geometric sequence 2^(-8 h / H) (Press et al. 2022), with the
    interleaving rule for head counts that are not powers of two."""

    def pow2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return torch.tensor(pow2(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = pow2(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(pow2(closest) + extra)


class ALiBiKernel(Kernel):
    """Relative-position kernel k(x - x'): softmax of a(x,x') - m_h |x - x'| (ALiBi).

    The bias depends on x - x' only (a convolution-type kernel in x). With ``causal=True`` the
    support is x' <= x and the bias is -m_h (x - x'). Slopes m_h from ``alibi_slopes``; all
    slopes 0 give the softmax kernel. Runs through scaled_dot_product_attention. On a token
    grid (``grid``) |x - x'| is the distance of the coordinates and the scores gain log w(x').
    """

    name = "alibi"
    takes_scale = True
    relative = True
    grid_aware = True
    caches = "keys_values"

    def __init__(self, num_heads: int, causal: bool = False, scale: float | None = None,
                 slopes: torch.Tensor | None = None) -> None:
        super().__init__()
        if not isinstance(causal, bool):
            raise TypeError(f"ALiBiKernel: causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        self.scale = check_scale(scale, "ALiBiKernel")
        self.register_buffer("slopes", alibi_slopes(num_heads) if slopes is None
                             else torch.as_tensor(slopes, dtype=torch.float32), persistent=False)
        if self.slopes.shape != (num_heads,):
            raise ValueError(f"slopes must have one entry per head ({num_heads}), got shape "
                             f"{tuple(self.slopes.shape)}")

    @classmethod
    def for_operator(cls, op: KernelSite, **options: Any) -> ALiBiKernel:
        return cls(op.num_heads, **options)

    def check_operator(self, op: KernelSite) -> None:
        super().check_operator(op)
        if self.slopes.numel() != op.num_heads:
            raise ValueError(f"the alibi kernel has {self.slopes.numel()} slopes (heads) but "
                             f"{type(op).__name__} has {op.num_heads} heads")

    def extra_repr(self) -> str:
        return f"heads={self.slopes.numel()}, causal={self.causal}, scale={self.scale}"

    @property
    def causal_support(self) -> bool:
        return self.causal

    def bias(self, n_q: int, n_k: int, dtype, device) -> torch.Tensor:
        x = torch.arange(n_q, device=device, dtype=dtype).unsqueeze(-1) + (n_k - n_q)
        xp = torch.arange(n_k, device=device, dtype=dtype)
        dist = (x - xp).abs()
        return -self.slopes.to(dtype=dtype, device=device).view(-1, 1, 1) * dist  # (H, Nq, Nk)

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0, grid=None):
        if grid is not None and grid.has_coords:
            dist = grid.offsets(q.shape[-2], k.shape[-2], q.dtype, q.device).abs()
            b = -self.slopes.to(dtype=q.dtype, device=q.device).view(-1, 1, 1) * dist
        else:
            b = self.bias(q.shape[-2], k.shape[-2], q.dtype, q.device)
        m = _grid_additive(attn_mask, is_causal or self.causal, q, k, grid)
        b = b if m is None else b + m
        return sdpa(q, k, v, attn_mask=b, dropout_p=dropout_p, scale=self.scale)


class RotaryKernel(Kernel):
    """Rotary position kernel (RoPE): rotate Q(x) and K(x') by position-dependent angles, then
    the softmax kernel. <R_x q, R_x' k> = <q, R_(x'-x) k>: the score depends on x - x' only.

    Pairs (i, i + d/2) of a head's features rotate by angle x * base^(-2i/d) (the "rotate half"
    layout of GPT-NeoX / LLaMA). On a token grid (``grid``) the angles are x_j base^(-2i/d) at
    the coordinates x_j (any real x_j), and the scores gain log w(x').
    """

    name = "rotary"
    takes_scale = True
    relative = True
    grid_aware = True
    # the unrotated K with the node coordinates (the tape keeps the coordinates as data;
    # operators.tape says why)
    caches = "keys_values"

    def __init__(self, head_dim: int, base: float = 10000.0, scale: float | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary positions, got {head_dim}")
        self.head_dim = head_dim
        self.base = base
        self.scale = check_scale(scale, "RotaryKernel")

    @classmethod
    def for_operator(cls, op: KernelSite, **options: Any) -> RotaryKernel:
        return cls(op.head_dim, **options)

    def check_operator(self, op: KernelSite) -> None:
        super().check_operator(op)
        if self.head_dim != op.head_dim:
            raise ValueError(f"the rotary kernel has head_dim={self.head_dim} but "
                             f"{type(op).__name__} has head_dim={op.head_dim}")

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, scale={self.scale}"

    def angles(self, n: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        inv = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64,
                                                 device=device) / self.head_dim))
        t = torch.arange(n, dtype=torch.float64, device=device)
        freqs = torch.outer(t, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rot * sin

    def angles_at(self, x: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the angles at the coordinates x (B|1, N): (B|1, 1, N, head_dim)."""
        inv = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64,
                                                 device=x.device) / self.head_dim))
        freqs = x.to(torch.float64)[..., None] * inv
        emb = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0, grid=None):
        if grid is not None and grid.has_coords:
            xq, xk = grid.positions(q.shape[-2], k.shape[-2], torch.float64, q.device)
            q = self.rotate(q, *self.angles_at(xq, q.dtype))
            k = self.rotate(k, *self.angles_at(xk, k.dtype))
        else:
            n = max(q.shape[-2], k.shape[-2])
            cos, sin = self.angles(n, q.dtype, q.device)
            q = self.rotate(q, cos[n - q.shape[-2]:], sin[n - q.shape[-2]:])
            k = self.rotate(k, cos[n - k.shape[-2]:], sin[n - k.shape[-2]:])
        attn_mask, is_causal = _grid_sdpa_support(attn_mask, is_causal, q, k, grid)
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=self.scale)
