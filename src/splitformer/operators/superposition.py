"""The superposition of fields: F(u) = sum_k F_k(u) (docs/math.md 3.13, docs/depth.md).

A coarse step that stands for m consecutive unit intervals [a, a + m] of a network can read
the controls in two ways. Sequentially (the network, or ``coarsen``: one field at the
midpoint over the whole step), or in parallel: the state frozen at the start of the stretch
and the field integrated exactly in time,

    u(a + m) ~ u(a) + int_a^(a+m) F(u(a), theta(s)) ds = u(a) + sum_k F(u(a), theta^k),

one explicit Euler step of length m whose field is the mean (1/m) sum_k F_k, the time
average of the field rather than the field of the time-averaged controls. In the splitting
each field of a step becomes the sum of the m control sets' fields of that name (the
attention fields summed, then the FFN fields summed: a Lie step of the superposed fields);
this is "Transformer layers as painters"' parallel middle layers (Sun et al. 2024) in the
evolution's words. ``Evolution.parallel_steps`` builds such steps; this module is the field.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .base import Context, Operator

__all__ = ["Superposition"]


class Superposition(Operator):
    """F(u) = sum_k F_k(u): the fields ``fields`` (operators of kind "field", the same input
    and output feature grid) applied to the same state and added. The operators are the
    given modules themselves (shared, not copied), so training the superposition trains
    them. ``scale_(c)`` scales each summand (c F = sum_k c F_k); ``needs_regular_grid`` when
    any summand needs it."""

    kind = "field"
    returns_new = True  # the sum is a new tensor: F_0(u) + ... allocates it

    def __init__(self, fields: Iterable[nn.Module]) -> None:
        super().__init__()
        fields = list(fields)
        if len(fields) < 2:
            raise ValueError(f"Superposition(fields): needs at least two fields, got "
                             f"{len(fields)}")
        for k, f in enumerate(fields):
            if not isinstance(f, Operator) or f.kind != "field":
                kind = f.kind if isinstance(f, Operator) else "not an Operator"
                raise TypeError(f"Superposition(fields): summand {k} ({type(f).__name__}) must "
                                f"be an Operator of kind 'field', got {kind!r}")
            if f.changes_width:
                raise ValueError(f"Superposition(fields): summand {k} ({type(f).__name__}) "
                                 "changes the feature width; only fields from and to one "
                                 "feature grid add")
        self.fields = nn.ModuleList(fields)

    @property
    def needs_regular_grid(self) -> bool:  # type: ignore[override]
        return any(f.needs_regular_grid for f in self.fields)

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        out = self.fields[0](u, context)
        for f in self.fields[1:]:
            out = out + f(u, context)
        return out

    def scale_(self, c: float) -> None:
        for f in self.fields:
            if not f.has_scale:
                raise NotImplementedError(f"Superposition: summand {type(f).__name__} declares "
                                          "no scale_")
        for f in {id(f): f for f in self.fields}.values():  # a summand given twice: once
            f.scale_(c)

    def extra_repr(self) -> str:
        return f"{len(self.fields)} fields"
