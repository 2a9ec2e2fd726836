"""Projections onto the constraint sets S1 and S2, and pointwise activations.

S1(s1, s2) = { u : mean_y u(x,.) = s1, var_y u(x,.) = s2^2 for every x }. Its Euclidean
projection (Theorem 3.1 of the paper) is

    P_S1(v) = s2 (v - mean_y v) / sqrt(var_y v) + s1        (var_y v > 0),

and ``SphereProjection`` implements it exactly (scalar s1, s2, eps = 0). At var_y v = 0 every
point of S1 is a closest point (the projection is set-valued); we return s1, the limit of the
eps-regularised projection as eps -> 0+, which is also what LayerNorm gives on a constant row.

A real LayerNorm, LN(v) = gamma * (v - mean v) / sqrt(var v + eps) + beta, with per-feature
gamma(y), beta(y) and eps > 0, is not a projection onto S1. ``LayerNormProjection`` implements
it exactly and reads it as two substeps (docs/math.md 3.1):

  (b) the eps term is a ghost feature point: with N = N_y, (v - mean v) / sqrt(var v + eps)
      equals the first N coordinates of the Euclidean projection of (v - mean v, sqrt(N eps))
      onto the sphere of radius sqrt(N) in R^(N+1) (``ghost_projection``), a projection onto
      S1(0, 1) of the lifted field;
  (a) the per-feature gain and bias are a pointwise affine map u -> gamma u + beta.

Scale invariance holds only up to eps: LN_eps(z / c) = LN_{c^2 eps}(z).

S2 = { u >= 0 } and P_S2 = ReLU (``ProjectionS2``). A general scalar activation s is the
proximal map of a convex function iff it is nondecreasing and 1-Lipschitz; ``Activation``
says whether that reading applies (ReLU, leaky ReLU, tanh, hard-tanh: yes; GELU, SiLU: no).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .base import Context, Operator, has_hooks

__all__ = ["Activation", "LayerNormProjection", "ProjectionS2", "RMSNormProjection",
           "SphereProjection"]


class SphereProjection(Operator):
    """P_S1(v) = s2 (v - mean_y v) / sqrt(var_y v) + s1: the paper's exact projection (eps = 0)."""

    kind = "projection"

    def __init__(self, dim: int, s1: float = 0.0, s2: float = 1.0, *, device=None,
                 dtype=None) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        self.dim = dim
        self.s1 = nn.Parameter(torch.tensor(float(s1), device=device, dtype=dtype))
        self.s2 = nn.Parameter(torch.tensor(float(s2), device=device, dtype=dtype))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps=0"

    def forward(self, v: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        centred = v - v.mean(dim=-1, keepdim=True)
        var = centred.pow(2).mean(dim=-1, keepdim=True)
        positive = var > 0
        scale = torch.where(positive, var, torch.ones_like(var)).rsqrt()
        return self.s2 * torch.where(positive, centred * scale, torch.zeros_like(centred)) + self.s1

    def tangent(self, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Pi_T(v) w: the orthogonal projection of w onto the tangent space of S1 at v.

        The normal space of S1 at v (per token) is spanned by the constant 1 and the centred
        v - mean v; Pi_T removes both components. Used by the projection method (docs/math.md 3.5).
        """
        return _remove_normal(w, torch.ones_like(v), v - v.mean(-1, keepdim=True))

    def distance(self, v: torch.Tensor) -> torch.Tensor:
        """dist(v, S1) per token: sqrt(N) * sqrt((mean v - s1)^2 + (std v - |s2|)^2).

        From |v - P(v)|^2 = N (m - s1)^2 + N (sigma - s2)^2 with m, sigma the mean and standard
        deviation of v over y (for s2 >= 0).
        """
        n = v.shape[-1]
        m = v.mean(dim=-1)
        sigma = (v - m.unsqueeze(-1)).pow(2).mean(dim=-1).sqrt()
        return math.sqrt(n) * torch.sqrt((m - self.s1) ** 2 + (sigma - self.s2.abs()) ** 2)


class LayerNormProjection(Operator):
    """LN(v) = gamma (v - mean v) / sqrt(var v + eps) + beta (ghost-point projection + affine)."""

    kind = "projection"

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        self.dim = dim
        self.eps = float(eps)
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(dim, **kw)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(dim, **kw)) if elementwise_affine and bias else None

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}, affine={self.weight is not None}"

    def forward(self, v: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        return F.layer_norm(v, (self.dim,), self.weight, self.bias, self.eps)

    def tangent(self, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Pi_T(v) w for the eps = 0 constraint set {gamma z + beta : mean z = 0, var z = 1}.

        Normal space at v: span{1 / gamma, z / gamma} with z = (v - beta) / gamma centred. With
        eps > 0 the image of LN is not this manifold (var z < 1): the tangent form then uses the
        eps = 0 manifold as an approximation.
        """
        g = self.weight if self.weight is not None else torch.ones_like(v[..., :1])
        b = self.bias if self.bias is not None else 0.0
        z = (v - b) / g
        z = z - z.mean(-1, keepdim=True)
        return _remove_normal(w, (1.0 / g).expand_as(v), z / g)

    def ghost_projection(self, v: torch.Tensor) -> torch.Tensor:
        """Substep (b): project (v - mean v, sqrt(N eps)) onto |w| = sqrt(N) in R^(N+1), keep N.

        Written out as the sphere projection (no call to layer_norm), for checking the reading.
        """
        n = v.shape[-1]
        centred = v - v.mean(dim=-1, keepdim=True)
        ghost = torch.full_like(centred[..., :1], math.sqrt(n * self.eps))
        lifted = torch.cat([centred, ghost], dim=-1)
        projected = math.sqrt(n) * lifted / lifted.norm(dim=-1, keepdim=True)
        return projected[..., :n]

    def affine(self, u: torch.Tensor) -> torch.Tensor:
        """Substep (a): the pointwise map u -> gamma u + beta."""
        if self.weight is not None:
            u = u * self.weight
        if self.bias is not None:
            u = u + self.bias
        return u


class RMSNormProjection(Operator):
    """RMS(v) = g * v / sqrt(mean_y v^2 + eps): the projection onto a sphere, then a gain.

    Without eps, v -> sqrt(N) v / |v| is the nearest point of the sphere {|v|^2 = N} (one
    constraint; LayerNorm's S1 has two, the mean and the variance). With eps, v / sqrt(mean v^2
    + eps) is exactly the first N coordinates of the projection of (v, sqrt(N eps)) onto the
    sphere of radius sqrt(N) in R^(N+1) (the ghost feature point of LayerNorm's reading, without
    the centring; ``ghost_projection``), docs/math.md 3.15. The gain is a pointwise affine
    substep u -> g u, with g = ``offset`` + weight (Gemma stores g - 1: ``offset`` = 1).

    Precision, as transformers computes it (exactness needs it): ``upcast`` computes the
    normalisation in float32 whatever the input's dtype (float64 too: transformers' RMSNorm
    casts to float32) and casts back before the gain (Llama, Qwen, Mistral); with
    ``gain_in_float32`` the gain is applied in float32 before the cast (Gemma). ``upcast=False``
    computes in the input's dtype (a float64 study of the evolution).
    """

    kind = "projection"

    def __init__(self, dim: int, *, eps: float = 1e-6, offset: float = 0.0,
                 elementwise_affine: bool = True, upcast: bool = True,
                 gain_in_float32: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0
                and math.isfinite(eps)):
            raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
        self.dim = dim
        self.eps = float(eps)
        self.offset = float(offset)
        self.upcast = bool(upcast)
        self.gain_in_float32 = bool(gain_in_float32)
        init = 1.0 - self.offset
        self.weight = nn.Parameter(torch.full((dim,), init, device=device, dtype=dtype)) \
            if elementwise_affine else None

    def extra_repr(self) -> str:
        extra = f", offset={self.offset:g}" if self.offset else ""
        return (f"dim={self.dim}, eps={self.eps}, affine={self.weight is not None}{extra}, "
                f"upcast={self.upcast}")

    def gain(self) -> torch.Tensor | None:
        """g = offset + weight (None without a gain: g = 1)."""
        if self.weight is None:
            return None
        return self.weight + self.offset if self.offset else self.weight

    def forward(self, v: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        dtype = v.dtype
        x = v.to(torch.float32) if self.upcast and dtype != torch.float32 else v
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        w = self.weight
        if w is None:
            return x if x.dtype == dtype else x.to(dtype)
        if self.gain_in_float32:
            w = w.to(x.dtype)
            return (x * (self.offset + w) if self.offset else x * w).to(dtype)
        if x.dtype != dtype:
            x = x.to(dtype)
        return x * (self.offset + w) if self.offset else w * x

    def ghost_projection(self, v: torch.Tensor) -> torch.Tensor:
        """Project (v, sqrt(N eps)) onto |w| = sqrt(N) in R^(N+1) and keep the first N
        coordinates: v / sqrt(mean v^2 + eps), written as the sphere projection."""
        n = v.shape[-1]
        ghost = torch.full_like(v[..., :1], math.sqrt(n * self.eps))
        lifted = torch.cat([v, ghost], dim=-1)
        return (math.sqrt(n) * lifted / lifted.norm(dim=-1, keepdim=True))[..., :n]

    def affine(self, u: torch.Tensor) -> torch.Tensor:
        """The gain substep u -> g u."""
        g = self.gain()
        return u if g is None else u * g

    def tangent(self, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Pi_T(v) w on the eps = 0 constraint set {g z : |z|^2 = N}: the normal at v = g z is
        z / g (the gradient of |v / g|^2), removed from w."""
        g = self.gain()
        n = v / g if g is not None else v
        n = n / g if g is not None else n
        e = n / n.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(n.dtype).tiny)
        return w - (w * e).sum(-1, keepdim=True) * e

    def distance(self, v: torch.Tensor) -> torch.Tensor:
        """dist(v, {|v|^2 = N}) per token: | |v| - sqrt(N) | (the sphere before the gain)."""
        return (v.norm(dim=-1) - math.sqrt(v.shape[-1])).abs()

    def radius(self) -> float:
        """A bound on |RMS(v)| for every v: sqrt(N) max_y |g(y)| (|v / rms_eps(v)| <= sqrt(N))."""
        g = self.gain()
        top = 1.0 if g is None else float(g.detach().abs().max())
        return math.sqrt(self.dim) * top


def _remove_normal(w: torch.Tensor, n1: torch.Tensor, n2: torch.Tensor) -> torch.Tensor:
    """w minus its orthogonal projection on span{n1, n2} (per token, Gram-Schmidt)."""
    e1 = n1 / n1.norm(dim=-1, keepdim=True)
    n2 = n2 - (n2 * e1).sum(-1, keepdim=True) * e1
    nn2 = n2.norm(dim=-1, keepdim=True)
    e2 = torch.where(nn2 > 0, n2 / torch.where(nn2 > 0, nn2, torch.ones_like(nn2)),
                     torch.zeros_like(n2))
    w = w - (w * e1).sum(-1, keepdim=True) * e1
    return w - (w * e2).sum(-1, keepdim=True) * e2


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# module-level functions (no lambdas): every model pickles and deep-copies
_PROXIMAL = {
    # name: (is the proximal map of a convex function, function)
    "relu": (True, F.relu),
    "leaky_relu": (True, F.leaky_relu),
    "tanh": (True, torch.tanh),
    "hardtanh": (True, F.hardtanh),
    "identity": (True, _identity),
    "gelu": (False, F.gelu),
    "gelu_tanh": (False, _gelu_tanh),
    "silu": (False, F.silu),
}


class Activation(Operator):
    """A pointwise map s(u) on a (possibly lifted) feature domain.

    ``is_proximal`` is True when s is nondecreasing and 1-Lipschitz, i.e. the proximal map of a
    convex function (ReLU is the projection onto S2); ``reading`` says which reading applies.
    """

    kind = "map"

    def __init__(self, name: str = "relu") -> None:
        super().__init__()
        if name not in _PROXIMAL:
            raise ValueError(f"activation must be one of {sorted(_PROXIMAL)}, got {name!r}")
        self.name = name
        self.is_proximal, self._fn = _PROXIMAL[name]

    @property
    def reading(self) -> str:
        if self.name == "relu":
            return "projection onto S2 = {u >= 0}"
        if self.is_proximal:
            return "proximal map of a convex function (nondecreasing, 1-Lipschitz)"
        return "not a proximal map (non-monotone); a nonlinear pointwise map in the vector field"

    def extra_repr(self) -> str:
        return f"{self.name}, proximal={self.is_proximal}"

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        return self._fn(u)

    def apply_(self, u: torch.Tensor) -> torch.Tensor:
        """s(u), written into u where s has an in-place form whose gradient needs only its
        output (ReLU: max(u, 0) in place); else s(u) as a new tensor. For a hidden field that
        nothing else holds (the FFN's W_1 h + b_1): it saves one allocation of the lifted
        field, and autograd still sees the same function. Not in place on a view that
        autograd tracks (its gradient would copy the whole base)."""
        if (self.name == "relu" and self._fn is F.relu and type(self).forward is Activation.forward
                and not has_hooks(self) and (u._base is None or not u.requires_grad)):
            return torch.relu_(u)
        return self(u)


class ProjectionS2(Operator):
    """P_S2(u) = max(u, 0) = ReLU(u): projection onto the nonnegative functions."""

    kind = "projection"

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        return F.relu(u)
