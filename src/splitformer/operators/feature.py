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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .base import Context, Operator, apply_dropout, tree_has_hooks
from .projections import Activation

__all__ = ["FeatureIntegral", "FeedForward"]


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
