"""Convolutional projections and the attention built on them (CvT, docs/math.md 3.7).

In CvT the query, key and value fields are not feature integrals of u alone: u is first
smoothed by a depthwise convolution in the token variable x over the 2-D token grid, then
normalised per feature (BatchNorm), then integrated in the feature variable y:

    (k *_s u)(x, y)  = sum_{d in D} k(d, y) u(s x + d - p, y)                      (1)
    B[v](x, y)       = gamma(y) (v(x, y) - mu(y)) / sqrt(sigma^2(y) + eps) + beta(y)   (2)
    Q(x, z)          = sum_y W_Q(z, y) B_Q[k_Q *_{s_Q} u](x, y) + b_Q(z)              (3)

and K, V likewise with their own k, B, W, b and stride s_K = s_V. (1) is the discretisation of
the integral int k(x - x', y) u(x', y) dx' with a kernel of compact support (the stencil D, a
k x k square, zero padding p outside Omega_x); "depthwise" means the kernel is diagonal in y:
it smooths each feature over x and mixes no features. With stride s the result is sampled on
the coarse grid s Z^2. (2) is BatchNorm evaluated in eval mode: a per-feature affine map whose
coefficients are the controls gamma, beta and the running statistics mu, sigma^2 (kept as they
are, nothing folded, so that the weight map is exact both ways). In train mode mu and sigma^2
are the batch statistics over (batch, x) and the running statistics are updated, exactly as
``torch.nn.BatchNorm2d`` does; the operator is then nonlocal in the batch.

A class token (a point x_cls outside the grid) bypasses (1) and (2): Q(x_cls) = W_Q u(x_cls) + b_Q.

The attention field is then the nonlocal operator of docs/math.md section 1 with these Q, K, V:

    A[u](x, z) = sum_h W_O(z, h, .) sum_{x'} g_h(x, x') V_h(x', .) + b_O(z),
    g_h(x, x') = softmax_{x'}( <Q_h(x), K_h(x')> * scale ).

With stride 2 for K and V the integral over x' is a quadrature on the coarse grid 2 Z^2: the
smoothing (1) acts as the restriction of a multigrid method (a weighted local average) and the
softmax normalisation absorbs the quadrature weights. CvT's scale is dim**-1/2 (the whole
feature domain, |Omega_y|^(-1/2) in the paper's notation), not head_dim**-1/2.

The token grid (H, W) is read from ``context.grid_shape``; without it the grid is taken
square (N_x = H W with H = W) and anything else is an error.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionOperator
from .base import Context, Operator
from .kernels import Kernel, SoftmaxKernel

__all__ = [
    "BatchNormMap",
    "ConvolutionalAttention",
    "ConvolutionalProjection",
    "DepthwiseConvolution",
    "token_grid",
]


def pair(v: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """An int or a pair of ints >= 0 as a pair (grid sizes, strides, paddings); ``name`` for
    the error."""
    if isinstance(v, int):
        out = (v, v)
    else:
        out = tuple(int(a) for a in v)
    if len(out) != 2 or any(a < 0 for a in out):
        raise ValueError(f"{name} must be an int or a pair of ints >= 0, got {v!r}")
    return out  # type: ignore[return-value]


def split_grid(u: torch.Tensor, grid_shape: tuple[int, int], num_prefix_tokens: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """u (B, P + H W, C) -> (prefix tokens (B, P, C), grid (B, C, H, W))."""
    b, _, c = u.shape
    h, w = grid_shape
    return u[:, :num_prefix_tokens], u[:, num_prefix_tokens:].transpose(1, 2).reshape(b, c, h, w)


def token_grid(
    u: torch.Tensor, context: Context | None, num_prefix_tokens: int
) -> tuple[int, int]:
    """(H, W) of the token grid of u (B, P + H W, C), P prefix (class) tokens.

    Read from ``context.grid_shape``; without it the grid must be square.
    """
    n = u.shape[1] - num_prefix_tokens
    shape = None if context is None else context.grid_shape
    if shape is not None:
        h, w = (int(a) for a in shape)
        if h * w != n:
            raise ValueError(
                f"context.grid_shape={tuple(shape)} has {h * w} points but u has "
                f"{n} grid tokens (+{num_prefix_tokens} prefix tokens)"
            )
        return h, w
    side = math.isqrt(max(n, 0))
    if side * side != n or n == 0:
        raise ValueError(
            f"u has {n} grid tokens, not a square grid: pass "
            "Context(grid_shape=(H, W))"
        )
    return side, side


class DepthwiseConvolution(nn.Module):
    """(k *_s u)(x, y) = sum_{d in D} k(d, y) u(s x + d - p, y): a convolution in x per feature.

    ``weight`` is k with shape (C, 1, k_h, k_w) (the layout of a depthwise ``nn.Conv2d``);
    acts on a grid field (B, C, H, W). No bias (CvT's projections have none).
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int | tuple[int, int],
        *,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not isinstance(channels, int) or channels <= 0:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        self.channels = channels
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride = pair(stride, "stride")
        self.padding = pair(padding, "padding")
        if min(self.kernel_size) < 1 or min(self.stride) < 1:
            raise ValueError("kernel_size and stride must be >= 1")
        self.weight = nn.Parameter(
            torch.empty(channels, 1, *self.kernel_size, device=device, dtype=dtype)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def extra_repr(self) -> str:
        return (f"channels={self.channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        return F.conv2d(grid, self.weight, None, self.stride, self.padding, 1, self.channels)


class BatchNormMap(Operator):
    """B[v](x, y) = gamma(y) (v(x, y) - mu(y)) / sqrt(sigma^2(y) + eps) + beta(y).

    Eval mode: mu, sigma^2 are the running statistics (buffers), so B is a per-feature affine map
    (``affine_coefficients``). Train mode: mu, sigma^2 are the batch statistics over (batch, x)
    and the running statistics are updated with ``momentum`` (``None``: cumulative average), as
    ``torch.nn.BatchNorm2d`` does; ``num_batches_tracked`` counts the updates. Acts on a grid
    field (B, C, H, W).
    """

    kind = "map"

    def __init__(
        self,
        channels: int,
        *,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not isinstance(channels, int) or channels <= 0:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        kw = {"device": device, "dtype": dtype}
        self.channels = channels
        self.eps = float(eps)
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(channels, **kw)) if affine else None
        self.bias = nn.Parameter(torch.zeros(channels, **kw)) if affine else None
        self.register_buffer("running_mean", torch.zeros(channels, **kw))
        self.register_buffer("running_var", torch.ones(channels, **kw))
        self.register_buffer(
            "num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device)
        )

    def extra_repr(self) -> str:
        return f"channels={self.channels}, eps={self.eps}, momentum={self.momentum}"

    def affine_coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, c) with B[v] = a v + c in eval mode: a = gamma / sqrt(sigma^2 + eps)."""
        a = torch.rsqrt(self.running_var + self.eps)
        if self.weight is not None:
            a = a * self.weight
        c = -self.running_mean * a
        if self.bias is not None:
            c = c + self.bias
        return a, c

    def forward(self, v: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        return F.batch_norm(
            v, self.running_mean, self.running_var, self.weight, self.bias,
            self.training, momentum, self.eps,
        )


class ConvolutionalProjection(Operator):
    """Q(x, z) = sum_y W(z, y) B[k *_s u](x, y) + b(z) on the grid; W u(x_cls) + b on class tokens.

    u is (B, P + H W, C): P prefix (class) tokens, then the grid tokens in row-major order. The
    result is (B, P + H' W', C_out) with (H', W') the grid of the convolution's output (strided).
    Parts: ``conv`` (DepthwiseConvolution, eq. (1) of the module), ``norm`` (BatchNormMap,
    eq. (2)), ``weight``/``bias`` (the feature integral, eq. (3)).
    """

    kind = "field"

    def __init__(
        self,
        dim: int,
        *,
        kernel_size: int | tuple[int, int] = 3,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 1,
        bias: bool = True,
        num_prefix_tokens: int = 0,
        norm_eps: float = 1e-5,
        norm_momentum: float | None = 0.1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens must be an int >= 0, got {num_prefix_tokens!r}")
        kw = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_prefix_tokens = num_prefix_tokens
        self.conv = DepthwiseConvolution(dim, kernel_size, stride=stride, padding=padding, **kw)
        self.norm = BatchNormMap(dim, eps=norm_eps, momentum=norm_momentum, **kw)
        self.weight = nn.Parameter(torch.empty(dim, dim, **kw))
        self.bias = nn.Parameter(torch.empty(dim, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.conv.reset_parameters()
        nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, prefix={self.num_prefix_tokens}, bias={self.bias is not None}"

    def smooth(self, prefix: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        """B[k *_s u] on the grid tokens, prefix tokens passed through: (B, P + H' W', C)."""
        out = self.norm(self.conv(grid)).flatten(2).transpose(1, 2)
        return torch.cat((prefix, out), dim=1) if self.num_prefix_tokens else out

    def project(self, prefix: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        """The projection from u already split into prefix tokens and (B, C, H, W) grid."""
        return F.linear(self.smooth(prefix, grid), self.weight, self.bias)

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        shape = token_grid(u, context, self.num_prefix_tokens)
        return self.project(*split_grid(u, shape, self.num_prefix_tokens))


class ConvolutionalAttention(AttentionOperator):
    """A[u]: nonlocal attention whose Q, K, V are convolutional projections (CvT).

        A[u](x, z) = Concat_h( softmax_{x'}(Q_h(x) . K_h(x') * scale) V_h ) W_O^T + b_O

    with Q, K, V the ``ConvolutionalProjection`` s ``q``, ``k``, ``v`` (query stride s_Q keeps
    the grid; key/value stride s_KV > 1 samples x' on a coarser grid: a coarse quadrature of the
    kernel integral in x'). ``scale`` defaults to dim**-1/2 (CvT's choice); the kernel is any
    ``Kernel`` (softmax with that scale by default, through ``scaled_dot_product_attention``;
    ``set_kernel`` builds kernels by name with it). Relative-position kernels k(x - x') (ALiBi,
    rotary) need queries and keys on one token grid: only when the key/value convolution keeps
    the query grid (same stride, padding and size).
    """

    kind = "field"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        kernel_size: int = 3,
        stride_q: int = 1,
        padding_q: int = 1,
        stride_kv: int = 2,
        padding_kv: int = 1,
        qkv_bias: bool = True,
        num_prefix_tokens: int = 0,
        scale: float | None = None,
        kernel: Kernel | None = None,
        attn_dropout: float = 0.0,
        out_dropout: float = 0.0,
        norm_eps: float = 1e-5,
        norm_momentum: float | None = 0.1,
        device=None,
        dtype=None,
    ) -> None:
        scale = float(dim) ** -0.5 if scale is None else float(scale)
        super().__init__(dim, num_heads, attn_dropout=attn_dropout,
                         kernel=kernel if kernel is not None else SoftmaxKernel(scale=scale))
        kw = {"device": device, "dtype": dtype}
        common = {"bias": qkv_bias, "num_prefix_tokens": num_prefix_tokens,
                  "norm_eps": norm_eps, "norm_momentum": norm_momentum, **kw}
        self.num_prefix_tokens = num_prefix_tokens
        self.q = ConvolutionalProjection(dim, kernel_size=kernel_size, stride=stride_q,
                                         padding=padding_q, **common)
        self.k = ConvolutionalProjection(dim, kernel_size=kernel_size, stride=stride_kv,
                                         padding=padding_kv, **common)
        self.v = ConvolutionalProjection(dim, kernel_size=kernel_size, stride=stride_kv,
                                         padding=padding_kv, **common)
        self.scale = scale
        self._add_output(True, out_dropout, **kw)
        nn.init.xavier_uniform_(self.out_weight, gain=1.0 / math.sqrt(2.0))
        nn.init.zeros_(self.out_bias)

    def extra_repr(self) -> str:
        s = self.score_scale()
        return (f"dim={self.dim}, num_heads={self.num_heads}, kernel={self.kernel.name}, "
                f"scale={'1/sqrt(d_h)' if s is None else format(s, 'g')}, "
                f"prefix={self.num_prefix_tokens}")

    def _same_grids(self) -> bool:
        q, k = self.q.conv, self.k.conv
        return (q.stride, q.padding, q.kernel_size) == (k.stride, k.padding, k.kernel_size)

    @property
    def relative_positions(self) -> bool:
        return self._same_grids()

    def relative_positions_reason(self) -> str:
        q, k = self.q.conv, self.k.conv
        return (f"its keys lie on another token grid than its queries (key/value convolution "
                f"stride {k.stride}, padding {k.padding}; query stride {q.stride}, padding "
                f"{q.padding}), so x - x' is not a token offset")

    needs_regular_grid = True  # operators.base.Operator: convolutions in x

    def kernel_grid(self, context: Context | None, n_q: int, n_k: int, batch: int):
        """None: the convolutions of Q, K and V need the regular 2-D grid, where the quadrature
        weights are constant (they cancel). Constant ``token_weights`` are accepted; other
        weights, or any ``token_coords``, are refused by name."""
        if context is None or (context.token_weights is None and context.token_coords is None):
            return None
        w = context.token_weights
        if context.token_coords is not None or (
                w is not None and not bool((w == w.reshape(-1)[0]).all())):
            raise ValueError(
                "ConvolutionalAttention (CvT): token_weights other than constant and "
                "token_coords are refused: its convolutional Q/K/V projections need the regular "
                "2-D token grid (docs/math.md 3.7, 3.12)")
        return None

    def qkv(
        self, u: torch.Tensor, context: Context | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q (B, H, N_q, d_h), K and V (B, H, N_kv, d_h) on their (strided) grids."""
        # u on its grid once for the three projections
        prefix, grid = split_grid(u, token_grid(u, context, self.num_prefix_tokens),
                                  self.num_prefix_tokens)
        # K before Q before V: the order in which the reference updates BatchNorm statistics.
        k = self.k.project(prefix, grid)
        q = self.q.project(prefix, grid)
        v = self.v.project(prefix, grid)
        if q.shape[1] != u.shape[1]:
            raise ValueError(
                f"the query grid has {q.shape[1]} tokens but u has {u.shape[1]}: the query "
                "convolution must keep the grid (stride 1, padding (kernel_size - 1) / 2) for "
                "A[u] to be a field on the same grid"
            )
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)


