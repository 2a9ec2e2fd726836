"""Controls theta(t): the operators' parameters as functions of depth t.

theta(t) = theta^n on (n-1, n] (piecewise constant on the paper's unit grid): layer n of a
network IS theta^n. ``Controls`` holds the L sets theta^1..theta^L, each a ModuleDict from an
operator name (the names a scheme's stages refer to) to the operator carrying its parameters.

A step of a grid with step tau covers (t_i, t_i + tau]; it uses the controls of the unit
interval that holds its midpoint t_i + tau / 2, which is exact whenever tau divides 1.

``interpolation="linear"`` gives a smooth-in-time version of the same network: theta(t) is the
piecewise linear interpolant of theta^n placed at the interval midpoints n - 1/2 (constant before
the first and after the last midpoint), frozen over each step at its midpoint. At tau = 1 it
equals the piecewise constant network exactly.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Iterable, Mapping

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils.stateless import _reparametrize_module

__all__ = ["Controls", "operator_of"]


class Controls(nn.Module):
    """theta^1..theta^L, each a mapping operator name -> operator (piecewise constant in t).

    ``interpolation``: "constant" or "linear" (surrounding whitespace is ignored).
    """

    def __init__(
        self,
        sets: Iterable[Mapping[str, nn.Module] | nn.ModuleDict],
        interpolation: str = "constant",
    ) -> None:
        super().__init__()
        if isinstance(interpolation, str):
            interpolation = interpolation.strip()  # names are read like scheme names
        if interpolation not in ("constant", "linear"):
            raise ValueError(f"interpolation must be 'constant' or 'linear', got "
                             f"{interpolation!r}")
        self.interpolation = interpolation
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

    def at(self, t: float) -> Mapping[str, nn.Module]:
        """theta(t), t in [0, T].

        "constant": theta^n for t in (n-1, n] (t = 0 takes theta^1). "linear": the interpolant
        of theta^n placed at the midpoints n - 1/2, constant outside [1/2, L - 1/2]. Steps ask
        at their midpoint, which never falls on an interval end when tau divides 1.
        """
        last = len(self.sets) - 1
        if self.interpolation == "constant":
            return self.sets[min(max(math.ceil(t) - 1, 0), last)]
        s = t - 0.5  # position on the grid of midpoints 1/2, 3/2, ...
        if s <= 0:
            return self.sets[0]
        if s >= last:
            return self.sets[last]
        n = math.floor(s)
        a = s - n
        if a == 0.0:
            return self.sets[n]
        return {k: _Interpolated(self.sets[n][k], self.sets[n + 1][k], a)
                for k in self.sets[n].keys()}

    def frozen_at(self, t: float) -> nn.ModuleDict:
        """New operators (copies, parameters detached from these) with the parameters
        theta(t): the set itself copied under "constant", the blend (1 - a) theta^n +
        a theta^(n+1) written into a copy of theta^n under "linear"."""
        theta = self.at(t)
        if isinstance(theta, nn.ModuleDict):
            return copy.deepcopy(theta)
        out = nn.ModuleDict()
        for name, op in theta.items():
            module = copy.deepcopy(op.module)
            values = dict(module.named_parameters()) | dict(module.named_buffers())
            with torch.no_grad():
                for key, blend in op.params.items():
                    values[key].copy_(blend)
            out[name] = module
        return out

    def with_interpolation(self, interpolation: str) -> Controls:
        """The same control sets (shared parameters) with another interpolation in t."""
        return Controls(self.sets, interpolation)


class _Interpolated:
    """An operator evaluated with parameters (1 - a) theta^n + a theta^(n+1)."""

    def __init__(self, left: nn.Module, right: nn.Module, a: float) -> None:
        self.module = left
        lp, rp = dict(left.named_parameters()), dict(right.named_parameters())
        self.params = {k: torch.lerp(lp[k], rp[k], a) for k in lp}
        # floating buffers (e.g. BatchNorm running statistics) are interpolated too
        lb, rb = dict(left.named_buffers()), dict(right.named_buffers())
        for k, b in lb.items():
            if b is not None and b.is_floating_point() and k in rb:
                self.params[k] = torch.lerp(b, rb[k], a)

    def __call__(self, *args, **kwargs):
        return functional_call(self.module, self.params, args, kwargs)

    def __getattr__(self, name):
        attr = getattr(self.module, name)
        if not inspect.ismethod(attr):
            return attr

        def bound(*args, **kwargs):  # any method (tangent, embed, ...) sees the blend too
            with _reparametrize_module(self.module, self.params):
                return attr(*args, **kwargs)

        return bound


def operator_of(op):
    """The operator module behind a control: ``op`` itself, or for a blend of two control sets
    (piecewise-linear controls between grid points) the module it is evaluated as, so that
    what it is (an attention operator, a projection) can be asked of it."""
    return op.module if isinstance(op, _Interpolated) else op
