"""Per-feature diagonal operators: D u = gamma(y) u (LayerScale).

A diagonal operator in the feature variable,

    (D u)(x, y) = gamma(y) u(x, y),

is local in x and pointwise in y. It is a ``map``: applied as is, independently of the step.
Used as a Stage ``post`` operator after a vector field F (the LayerScale of CaiT, DeiT-III and
timm's ``init_values``), the explicit Euler substep reads

    u + tau * gamma * F(P u)  =  u + tau(y) F(P u),      tau(y) = tau * gamma(y):

a per-feature step size. The pre-LN block with LayerScale is therefore still explicit Euler for
u_t = A(P1 u) + G(P2 u), on a time grid whose step differs per feature coordinate y (or,
equivalently, explicit Euler with step tau for the rescaled field D (A(P1 u) + ...)). gamma is
part of the controls theta^n: piecewise constant in t like every other weight.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .base import Context, Operator

__all__ = ["DiagonalScaling", "LayerScale"]


class DiagonalScaling(Operator):
    """D u = gamma(y) * u: a per-feature step size tau(y) = tau gamma(y) when used as ``post``."""

    kind = "map"
    is_linear = True  # diag(gamma) u

    def __init__(
        self,
        dim: int,
        init_value: float = 1.0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if isinstance(init_value, bool) or not isinstance(init_value, numbers.Real) or \
                not math.isfinite(float(init_value)):
            raise ValueError(f"init_value must be a finite number (gamma's initial value), got "
                             f"{init_value!r}")
        self.dim = dim
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value), device=device,
                                             dtype=dtype))

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        return u * self.gamma

    def step_sizes(self, tau: float) -> torch.Tensor:
        """tau(y) = tau * gamma(y): the per-feature step this operator stands for."""
        return tau * self.gamma.detach()


LayerScale = DiagonalScaling
"""The network name of the diagonal operator (CaiT / DeiT-III / timm ``init_values``)."""
