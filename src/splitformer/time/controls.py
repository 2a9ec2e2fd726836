"""Controls theta(t): the operators' parameters as functions of depth t.

theta(t) = theta^n on (n-1, n] (piecewise constant on the paper's unit grid): layer n of a
network IS theta^n. ``Controls`` holds the L sets theta^1..theta^L, each a ModuleDict from an
operator name (the names a scheme's stages refer to) to the operator carrying its parameters.

A step of a grid with step tau covers (t_i, t_i + tau]; it uses the controls of the unit
interval that holds its midpoint t_i + tau / 2, which is exact whenever tau divides 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from torch import nn

__all__ = ["Controls"]


class Controls(nn.Module):
    """theta^1..theta^L, each a mapping operator name -> operator (piecewise constant in t)."""

    def __init__(self, sets: Iterable[Mapping[str, nn.Module] | nn.ModuleDict]) -> None:
        super().__init__()
        self.sets = nn.ModuleList(
            s if isinstance(s, nn.ModuleDict) else nn.ModuleDict(dict(s)) for s in sets
        )
        if len(self.sets) == 0:
            raise ValueError("Controls needs at least one control set (L >= 1)")

    def __len__(self) -> int:
        return len(self.sets)

    def __getitem__(self, n: int) -> nn.ModuleDict:
        return self.sets[n]

    def __iter__(self):
        return iter(self.sets)

    @property
    def T(self) -> float:
        """The final time: one unit interval per control set."""
        return float(len(self.sets))

    def names(self) -> list[str]:
        """Operator names present in every control set."""
        common = set(self.sets[0].keys())
        for s in self.sets[1:]:
            common &= set(s.keys())
        return [k for k in self.sets[0].keys() if k in common]

    def index(self, t_mid: float) -> int:
        """n - 1 for t_mid in (n-1, n]: the control set of the step whose midpoint is t_mid."""
        n = math.floor(t_mid)
        return min(max(n, 0), len(self.sets) - 1)

    def at(self, t: float) -> nn.ModuleDict:
        """theta(t) for t in [0, T] (t = 0 takes theta^1)."""
        return self.sets[min(max(math.ceil(t) - 1, 0), len(self.sets) - 1)]
