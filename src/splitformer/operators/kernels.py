"""Attention kernels: how the score a(x,x') becomes the integral kernel g(x,x').

A kernel maps per-head Q, K, V (B, H, N_x, d_h) to int g(x,x') V(x',.) dx' (B, H, N_x, d_h).
The softmax kernel

    g(x,x') = exp(a(x,x')) / int exp(a(x,eta)) deta,   a = <Q(x), K(x')> / sqrt(d_h) + m(x,x')

is the standard one and runs through ``scaled_dot_product_attention`` (the fused path). The
others are values of the same type: Sinkhorn (doubly stochastic normalisation), Gaussian (RBF)
scores, linear (feature-map) kernels, and relative-position kernels k(x - x') (ALiBi, rotary).
A causal support x' <= x (``is_causal``) makes any of them a Volterra operator.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ALiBiKernel",
    "GaussianKernel",
    "KERNELS",
    "Kernel",
    "LinearKernel",
    "RotaryKernel",
    "SinkhornKernel",
    "SoftmaxKernel",
    "alibi_slopes",
    "set_kernel",
]


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
            # sdpa takes a mask or is_causal, not both: fold the causal support into the mask
            attn_mask = _additive_support(attn_mask, True, q.shape[-2], k.shape[-2], q.dtype,
                                          q.device)
            is_causal = False
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=self.scale,
        )


def _additive_support(attn_mask, is_causal, n_q, n_k, dtype, device):
    """The kernel support as an additive mask (0 on the support, -inf off it), or None."""
    m = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            m = torch.zeros(attn_mask.shape, dtype=dtype, device=device)
            m = m.masked_fill(~attn_mask, float("-inf"))
        else:
            m = attn_mask
    if is_causal:
        c = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)
        c = torch.zeros(n_q, n_k, dtype=dtype, device=device).masked_fill(~c, float("-inf"))
        m = c if m is None else m + c
    return m


def _scores(q, k, scale, attn_mask, is_causal):
    s = scale if scale is not None else q.shape[-1] ** -0.5
    a = torch.matmul(q, k.transpose(-2, -1)) * s
    m = _additive_support(attn_mask, is_causal, q.shape[-2], k.shape[-2], a.dtype, a.device)
    return a if m is None else a + m


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """A log-normaliser with -inf (empty support) replaced by 0, so the empty row stays -inf."""
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _dropout(p: torch.Tensor, dropout_p: float) -> torch.Tensor:
    return F.dropout(p, dropout_p) if dropout_p > 0 else p


class SinkhornKernel(Kernel):
    """Sinkhorn normalisation of exp(a): alternately normalise over x' (rows) and x (columns),
    ending on rows, ``iterations`` row normalisations in all:

        P_1 = softmax_x'(a)  (one iteration = the softmax kernel, exactly)
        P_{k+1} = row-normalise(column-normalise(P_k))   -> doubly stochastic as k -> infinity

    computed in the log domain; columns with no support are left alone.
    """

    name = "sinkhorn"

    def __init__(self, iterations: int = 3, scale: float | None = None) -> None:
        super().__init__()
        if not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
        self.iterations = iterations
        self.scale = scale

    def extra_repr(self) -> str:
        return f"iterations={self.iterations}"

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0):
        logp = _scores(q, k, self.scale, attn_mask, is_causal)
        logp = logp - _finite(torch.logsumexp(logp, dim=-1, keepdim=True))
        for _ in range(self.iterations - 1):
            logp = logp - _finite(torch.logsumexp(logp, dim=-2, keepdim=True))
            logp = logp - _finite(torch.logsumexp(logp, dim=-1, keepdim=True))
        # a row or column with empty support stays 0 (as scaled_dot_product_attention gives)
        return torch.matmul(_dropout(logp.exp(), dropout_p), v)


class GaussianKernel(Kernel):
    """Gaussian (RBF) scores: a(x,x') = -|Q(x) - K(x')|^2 * scale / 2, normalised over x'.

    Since -|q - k|^2/2 = <q,k> - |q|^2/2 - |k|^2/2 and the |q|^2 term cancels in the
    normalisation, this is the softmax kernel with the key bias -|K(x')|^2 scale / 2: equal to it
    when all keys have the same norm.
    """

    name = "gaussian"

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0):
        s = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        bias = (-0.5 * s) * k.pow(2).sum(-1).unsqueeze(-2)  # (B, H, 1, N_k)
        m = _additive_support(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.dtype, q.device)
        bias = bias if m is None else bias + m
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p,
                                              scale=s)


class LinearKernel(Kernel):
    """Feature-map (linear) attention:

        g(x,x') = phi(Q(x)).phi(K(x')) / sum_eta phi(Q(x)).phi(K(eta))

    with phi = elu + 1 (positive). Without a mask it costs O(N d^2): A = phi(Q) (phi(K)^T V) /
    (phi(Q) sum phi(K)); with a causal support it uses prefix sums; with a general mask it forms
    the N x N kernel. Boolean masks restrict the support; float masks are not meaningful here.
    """

    name = "linear"

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = eps

    @staticmethod
    def feature_map(x: torch.Tensor) -> torch.Tensor:
        return F.elu(x) + 1.0

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0):
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            raise ValueError("LinearKernel takes boolean attention masks only (a support)")
        fq, fk = self.feature_map(q), self.feature_map(k)
        if attn_mask is None and not is_causal and dropout_p == 0.0:
            kv = torch.matmul(fk.transpose(-2, -1), v)  # (B, H, d, d_v)
            z = torch.matmul(fq, fk.sum(-2, keepdim=True).transpose(-2, -1))  # (B, H, N, 1)
            return torch.matmul(fq, kv) / z.clamp_min(self.eps)
        w = torch.matmul(fq, fk.transpose(-2, -1))
        if attn_mask is not None:
            w = w * attn_mask
        if is_causal:
            n_q, n_k = q.shape[-2], k.shape[-2]
            w = w * torch.ones(n_q, n_k, dtype=torch.bool, device=w.device).tril(n_k - n_q)
        w = w / w.sum(-1, keepdim=True).clamp_min(self.eps)
        return torch.matmul(_dropout(w, dropout_p), v)


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
    slopes 0 give the softmax kernel. Runs through scaled_dot_product_attention.
    """

    name = "alibi"

    def __init__(self, num_heads: int, causal: bool = False, scale: float | None = None,
                 slopes: torch.Tensor | None = None) -> None:
        super().__init__()
        self.causal = causal
        self.scale = scale
        self.register_buffer("slopes", alibi_slopes(num_heads) if slopes is None
                             else torch.as_tensor(slopes, dtype=torch.float32), persistent=False)

    def bias(self, n_q: int, n_k: int, dtype, device) -> torch.Tensor:
        x = torch.arange(n_q, device=device, dtype=dtype).unsqueeze(-1) + (n_k - n_q)
        xp = torch.arange(n_k, device=device, dtype=dtype)
        dist = (x - xp).abs()
        return -self.slopes.to(dtype=dtype, device=device).view(-1, 1, 1) * dist  # (H, Nq, Nk)

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0):
        b = self.bias(q.shape[-2], k.shape[-2], q.dtype, q.device)
        m = _additive_support(attn_mask, is_causal or self.causal, q.shape[-2], k.shape[-2],
                              q.dtype, q.device)
        b = b if m is None else b + m
        return F.scaled_dot_product_attention(q, k, v, attn_mask=b, dropout_p=dropout_p,
                                              scale=self.scale)


class RotaryKernel(Kernel):
    """Rotary position kernel (RoPE): rotate Q(x) and K(x') by position-dependent angles, then
    the softmax kernel. <R_x q, R_x' k> = <q, R_(x'-x) k>: the score depends on x - x' only.

    Pairs (i, i + d/2) of a head's features rotate by angle x * base^(-2i/d) (the "rotate half"
    layout of GPT-NeoX / LLaMA).
    """

    name = "rotary"

    def __init__(self, head_dim: int, base: float = 10000.0, scale: float | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary positions, got {head_dim}")
        self.head_dim = head_dim
        self.base = base
        self.scale = scale

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

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0):
        n = max(q.shape[-2], k.shape[-2])
        cos, sin = self.angles(n, q.dtype, q.device)
        q = self.rotate(q, cos[n - q.shape[-2]:], sin[n - q.shape[-2]:])
        k = self.rotate(k, cos[n - k.shape[-2]:], sin[n - k.shape[-2]:])
        if is_causal and attn_mask is not None:
            attn_mask = _additive_support(attn_mask, True, q.shape[-2], k.shape[-2], q.dtype,
                                          q.device)
            is_causal = False
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=self.scale)


KERNELS = {
    "softmax": SoftmaxKernel,
    "sinkhorn": SinkhornKernel,
    "gaussian": GaussianKernel,
    "linear": LinearKernel,
}


def set_kernel(model: nn.Module, kernel: Kernel | str, **kwargs) -> nn.Module:
    """Put ``kernel`` into every attention operator of ``model`` (in place; returns model).

    A name builds a fresh kernel per operator: "softmax", "sinkhorn", "gaussian", "linear",
    "alibi" (num_heads from the operator), "rotary" (head_dim from the operator).
    """
    from .attention import NonlocalAttention

    for m in model.modules():
        if isinstance(m, NonlocalAttention):
            if isinstance(kernel, Kernel):
                m.kernel = kernel
            elif kernel == "alibi":
                m.kernel = ALiBiKernel(m.num_heads, **kwargs)
            elif kernel == "rotary":
                m.kernel = RotaryKernel(m.head_dim, **kwargs)
            elif kernel in KERNELS:
                m.kernel = KERNELS[kernel](**kwargs)
            else:
                raise ValueError(f"kernel must be a Kernel or one of "
                                 f"{sorted([*KERNELS, 'alibi', 'rotary'])}, got {kernel!r}")
    return model
