"""Feature-integral operators L_j and the J-stage feed-forward field.

A feature-integral operator is local in x and integral in y:

    L[u](x,z) = int W(xi,z) u(x,xi) dxi + b(z)          (discrete: U W^T + b)

Its output feature domain may differ from the input one: the hidden stage of a feed-forward
block lives on a lifted feature grid of width N_h. The identity between the two grids
(``embed``) is the rectangular identity E: zero padding when lifting, truncation when
restricting; it is what the paper's (I + W_j) form means when widths differ.

The feed-forward vector field with J stages (docs/math.md section 3.4) is

    G(u) = L_J( s( ... s(L_1 u) ... ) )

with s an activation applied pointwise on the lifted domain (ReLU = projection onto S2 of
the hidden field). J = 2 is the standard FFN: G(u) = W_2 s(W_1 u + b_1) + b_2.

The gated field (SwiGLU, GeGLU; docs/math.md 3.16) is a product of two feature integrals,

    G(u)(x) = W_d ( s(W_g u(x) + b_g) * (W_u u(x) + b_u) ) + b_d,

pointwise in x: a reaction term of degree two in the lifted features, not a projection and not
globally Lipschitz (``GatedFeedForward``, with its Lipschitz bound on a ball).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .base import Context, Operator, apply_dropout, tree_has_hooks
from .projections import Activation

__all__ = ["ACTIVATION_BOUNDS", "FeatureIntegral", "FeedForward", "GatedFeedForward"]


class FeatureIntegral(Operator):
    """L[u] = U W^T + b: an integral transform in the feature variable y."""

    kind = "field"

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        for name, val in (("in_dim", in_dim), ("out_dim", out_dim)):
            if not isinstance(val, int) or val <= 0:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        self.in_dim, self.out_dim = in_dim, out_dim
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_dim, device=device, dtype=dtype)) if bias else None
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_dim)
            nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return f"in_dim={self.in_dim}, out_dim={self.out_dim}, bias={self.bias is not None}"

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        return apply_dropout(self.dropout, F.linear(u, self.weight, self.bias))

    @torch.no_grad()
    def scale_(self, c: float) -> None:
        """L <- c L: W and b times c."""
        self.weight.mul_(c)
        if self.bias is not None:
            self.bias.mul_(c)

    @property
    def changes_width(self) -> bool:
        return self.in_dim != self.out_dim

    def embed(self, u: torch.Tensor) -> torch.Tensor:
        """E u: the identity between the input and output feature grids (pad or truncate)."""
        if self.in_dim == self.out_dim:
            return u
        if self.out_dim > self.in_dim:
            return F.pad(u, (0, self.out_dim - self.in_dim))
        return u[..., : self.out_dim]

    def identity_matrix(self) -> torch.Tensor:
        """E as an (out_dim, in_dim) matrix: ones on the diagonal."""
        return torch.eye(self.out_dim, self.in_dim, dtype=self.weight.dtype,
                         device=self.weight.device)


class FeedForward(Operator):
    """G(u) = L_J(s(... s(L_1 u))): the feed-forward vector field with J >= 1 stages.

    ``widths`` lists the feature grids [N_y, N_1, ..., N_{J-1}, N_y]; the activation s acts
    on every hidden grid. Dropout, when set, acts on each hidden field (``dropout``) and on
    the output (``out_dropout``), as in torch.nn.TransformerEncoderLayer.

    The field acts on each token alone: ``forward`` flattens u to a (tokens, N_y) matrix, so
    its ``FeatureIntegral`` stages and activation see 2-D tensors (hooks on them too), and each
    W_j h + b_j is a new matrix that ReLU overwrites in place (``Activation.apply_``; not where
    a hook on the stage may hold it).
    """

    kind = "field"

    def __init__(
        self,
        widths: Sequence[int],
        *,
        activation: str | Activation = "relu",
        bias: bool = True,
        dropout: float = 0.0,
        out_dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        widths = list(widths)
        if len(widths) < 2:
            raise ValueError(f"widths must list at least [in, out] (J >= 1), got {widths!r}")
        self.widths = widths
        self.stages = nn.ModuleList(
            FeatureIntegral(a, b, bias=bias, device=device, dtype=dtype)
            for a, b in zip(widths[:-1], widths[1:], strict=True)
        )
        self.activation = activation if isinstance(activation, Activation) else Activation(
            activation)
        self.dropout = nn.Dropout(dropout)
        self.out_dropout = nn.Dropout(out_dropout)

    @property
    def num_stages(self) -> int:
        """J, the number of feature-integral operators."""
        return len(self.stages)

    def extra_repr(self) -> str:
        return f"widths={self.widths}, J={self.num_stages}"

    returns_new = True  # W_J h + b_J, a new tensor (operators.base.returns_new)

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        lead = u.shape[:-1]
        h = u.reshape(-1, u.shape[-1])  # tokens x features: each W_j h + b_j is a new matrix,
        last = len(self.stages) - 1      # not a view, which the activation may overwrite
        for j, stage in enumerate(self.stages):
            h = stage(h)
            if j < last:  # in place only where no hook of the stage may hold W_j h + b_j
                s = self.activation.apply_(h) if not tree_has_hooks(stage) else \
                    self.activation(h)
                h = apply_dropout(self.dropout, s)
        return apply_dropout(self.out_dropout, h.view(*lead, h.shape[-1]))

    @torch.no_grad()
    def scale_(self, c: float) -> None:
        """G <- c G: the last stage's W_J and b_J times c (G(u) = W_J h + b_J)."""
        last = self.stages[-1]
        last.weight.mul_(c)
        if last.bias is not None:
            last.bias.mul_(c)


# sup |s'| and the growth bound c with |s(z)| <= c |z| of each activation a gated field takes
# (SiLU: max s' = 1.0998 at z = 2.3994; GELU: max s' = 1.1289 at z = sqrt(2); tanh-GELU within
# 1e-3 of it, bounded by 1.13; ReLU and identity 1)
ACTIVATION_BOUNDS: dict[str, tuple[float, float]] = {
    "silu": (1.0999, 1.0),
    "gelu": (1.1290, 1.0),
    "gelu_tanh": (1.1300, 1.0),
    "relu": (1.0, 1.0),
    "identity": (1.0, 1.0),
}


class GatedFeedForward(Operator):
    """G(u) = W_d (s(W_g u + b_g) * (W_u u + b_u)) + b_d: the gated feature field.

    SwiGLU (s = SiLU; Llama, Qwen, Mistral) and GeGLU (s = tanh-GELU; Gemma). Two lifts of u
    onto the hidden grid of width N_h (``gate`` W_g, ``up`` W_u), multiplied pointwise, and one
    feature integral back (``down`` W_d): pointwise in x. It is bilinear in the two lifts (a
    reaction term), not a projection, and its Lipschitz constant grows with |u|: on the ball
    |v| <= R, which a pre-norm's sphere lies in (``RMSNormProjection.radius``),

        Lip(G) <= |W_d|_2 ( L_s |W_g|_2 (r_u R + |b_u|_inf) + c_s |W_u|_2 (r_g R + |b_g|_inf) ),

    r_g, r_u the largest row norms of W_g, W_u, L_s = sup |s'|, |s(z)| <= c_s |z|
    (``lipschitz_bound``): from DG(v) w = W_d (s'(a) (W_g w) b + s(a) (W_u w)), a = W_g v + b_g,
    b = W_u v + b_u, with |a_i| <= r_g R + |b_g|_inf. The paper's FFN analysis (ReLU, a
    projection of the lifted field) does not cover it.
    """

    kind = "field"
    returns_new = True

    def __init__(self, dim: int, hidden: int, *, activation: str = "silu", bias: bool = False,
                 out_dropout: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate = FeatureIntegral(dim, hidden, **kw)
        self.up = FeatureIntegral(dim, hidden, **kw)
        self.down = FeatureIntegral(hidden, dim, **kw)
        self.activation = Activation(activation)
        self.out_dropout = nn.Dropout(out_dropout)
        self.dim, self.hidden = dim, hidden

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, activation={self.activation.name}"

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        return apply_dropout(self.out_dropout,
                             self.down(self.activation(self.gate(u)) * self.up(u)))

    @torch.no_grad()
    def scale_(self, c: float) -> None:
        """G <- c G: W_d and b_d times c."""
        self.down.scale_(c)

    @torch.no_grad()
    def lipschitz_bound(self, radius: float) -> float:
        """An upper bound of the Lipschitz constant of G on the ball |v| <= ``radius`` (class
        docstring); ValueError for an activation without known constants."""
        if self.activation.name not in ACTIVATION_BOUNDS:
            raise ValueError(f"no Lipschitz constants for the activation "
                             f"{self.activation.name!r}; known: {sorted(ACTIVATION_BOUNDS)}")
        slope, growth = ACTIVATION_BOUNDS[self.activation.name]
        wg, wu, wd = (m.weight.double() for m in (self.gate, self.up, self.down))

        def reach(stage: FeatureIntegral, w: torch.Tensor) -> float:
            r = float(w.norm(dim=1).max()) * radius
            return r + (float(stage.bias.abs().max()) if stage.bias is not None else 0.0)

        def norm(w):
            return (float(torch.linalg.matrix_norm(w, ord=2)))
        return norm(wd) * (slope * norm(wg) * reach(self.up, wu)
                           + growth * norm(wu) * reach(self.gate, wg))
