"""What every operator of the evolution equation shares.

An operator is one term F of the right-hand side of

    u_t = A[u] + sum_j L_j[u] - dI_S1(u) - dI_S2(u)

or a projection P_S onto a constraint set S. It is a ``torch.nn.Module`` whose parameters are
(part of) the controls theta^n of one time interval, and whose ``forward(u, context)`` returns
F(u) for a vector field or P(u) for a projection. ``context`` carries what is not part of the
state but shapes an operator: the attention mask (the support of the kernel) and, for
cross-attention, a second field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["Context", "Operator"]


@dataclass
class Context:
    """Data an operator may read besides the state u.

    attn_mask: additive float mask or boolean mask in the convention of
        ``scaled_dot_product_attention`` (True = x' is in the support of the kernel at x),
        broadcastable to (B, H, N_x, N_x'); None for full support.
    is_causal: the kernel is supported on x' <= x (a Volterra operator).
    extra: free-form values for user-written operators (e.g. a memory field).
    """

    attn_mask: torch.Tensor | None = None
    is_causal: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Operator(nn.Module):
    """Base class: a term of the evolution equation, or a projection.

    Subclasses set ``kind`` to ``"field"`` (a vector field F, advanced by an integrator as
    u + h F(u)), ``"projection"`` (applied exactly, independent of the step h) or ``"map"``
    (a pointwise map applied as is, e.g. the affine part of a real LayerNorm).
    """

    kind: str = "field"

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        raise NotImplementedError

    def embed(self, u: torch.Tensor) -> torch.Tensor:
        """Identity from the input feature domain to the output one (u itself when equal)."""
        return u
