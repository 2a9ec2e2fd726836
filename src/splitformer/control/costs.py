"""Running costs of the control problem, as values with a weight (docs/math.md 3.8).

    KineticEnergy(w)       w * sum_{n=0}^{N_t-1} tau ||(u^{n+1} - u^n) / tau||^2
                             = w * sum_n ||u^{n+1} - u^n||^2 / tau
    ControlRegularity(w)   w * sum_{m=1}^{L-1} ||theta^{m+1} - theta^m||^2 / Delta,  Delta = 1

Norms: ||u||^2 of a state (B, N_x, N_y) is the sum over tokens x and features y, averaged over
the batch (mean over b of sum_{x,y} u(b, x, y)^2), so the kinetic energy is per example, like a
mean loss. ||theta||^2 of a control set is the sum of the squares of all its parameters.

The kinetic energy is that of the discrete path u^n = u(t_n) on the grid t_n = n tau
(OT-Transformer, Kan et al. 2025): the integral of |u_t|^2 with u_t replaced by the difference
quotient. It needs the path (``needs_path``): ``ControlProblem`` then keeps every grid point.

Control regularity is defined on the control sets, not on the time grid: theta^1, ..., theta^L
are the controls of the unit intervals (m-1, m] (``time.controls``), spaced Delta = 1 apart
whatever tau is, so the regularity does not change under ``refine(k)`` (a difference over the
grid steps would be zero inside an interval and grow like 1/tau at the interval ends). It is
the H^1 seminorm int |theta'(t)|^2 dt of the piecewise linear interpolant of theta^m placed at
the midpoints m - 1/2 (``with_controls_in_time("linear")``), and the issue's
sum_n ||theta^{n+1} - theta^n||^2 / tau at tau = 1 (the network). Parameters are paired by
name between consecutive sets; a parameter that only one of two sets has does not count. A
model with several evolutions (CvT's stages, the encoder-decoder pair) sums over each.

A weight is a finite real number >= 0; a weight of 0 makes the cost 0 without computing it
(and without keeping the path).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..models.base import skeleton_of
from ..time import Evolution, Trajectory

__all__ = ["ControlRegularity", "KineticEnergy", "RunningCost", "evolutions_of"]


def _check_weight(weight: Any, cls: str) -> float:
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        raise TypeError(f"{cls}(weight): weight must be a real number >= 0, got "
                        f"{type(weight).__name__} {weight!r}")
    w = float(weight)
    if not math.isfinite(w) or w < 0:
        raise ValueError(f"{cls}(weight): weight must be a finite number >= 0, got {weight!r}")
    return w


def evolutions_of(model: Any) -> list[Evolution]:
    """Every evolution of a model: those of an ``EvolutionModel``'s ``evolution_owners()``; an
    Evolution is its own; anything else has none ([])."""
    if isinstance(model, Evolution):
        return [model]
    model = skeleton_of(model)
    if model is None:
        return []
    return [o.evolution for o in model.evolution_owners() if isinstance(o.evolution, Evolution)]


@dataclass(frozen=True)
class RunningCost:
    """A running cost: ``weight * value(model, path)``; ``name`` is its key in
    ``Objective.parts``, ``needs_path`` says whether it reads u along the path."""

    weight: float = 1.0
    name: ClassVar[str] = "running_cost"
    needs_path: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight", _check_weight(self.weight, type(self).__name__))

    def value(self, model: Any, path: Trajectory | None) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, model: Any, path: Trajectory | None = None) -> torch.Tensor:
        """weight * value(model, path)."""
        return self.weight * self.value(model, path)


@dataclass(frozen=True)
class KineticEnergy(RunningCost):
    """weight * sum_n ||u^{n+1} - u^n||^2 / (t_{n+1} - t_n) over the kept grid points of
    ``path`` (every grid point: sum_n tau ||(u^{n+1} - u^n) / tau||^2); ||.||^2 sums over
    tokens and features and averages over the batch (module docstring)."""

    name: ClassVar[str] = "kinetic"
    needs_path: ClassVar[bool] = True

    def value(self, model: Any, path: Trajectory | None) -> torch.Tensor:
        if not isinstance(path, Trajectory):
            raise ValueError(f"KineticEnergy needs the path u(t_n) (a Trajectory of every grid "
                             f"point), got {type(path).__name__}")
        if len(path) < 2:
            raise ValueError(f"KineticEnergy needs at least two states of the path, the "
                             f"trajectory has {len(path)}")
        states = path.states  # (K, B, N_x, N_y)
        du = states[1:] - states[:-1]
        dt = (path.times[1:] - path.times[:-1]).to(du.dtype)
        per = du.pow(2).flatten(2).sum(-1).mean(-1)  # (K - 1,): mean_b sum_{x,y}
        return (per / dt).sum()


@dataclass(frozen=True)
class ControlRegularity(RunningCost):
    """weight * sum_{m=1}^{L-1} ||theta^{m+1} - theta^m||^2 / Delta, Delta = 1 (the spacing of
    the control sets; independent of tau), over every evolution of the model."""

    name: ClassVar[str] = "control_regularity"
    needs_path: ClassVar[bool] = False

    def value(self, model: Any, path: Trajectory | None = None) -> torch.Tensor:
        evos = evolutions_of(model)
        if not evos:
            raise ValueError(f"ControlRegularity needs controls theta^m (an evolution); model "
                             f"{type(model).__name__} has none")
        total = None
        for evo in evos:
            sets = list(evo.controls)
            for a, b in zip(sets[:-1], sets[1:], strict=True):
                term = _distance2(a, b)
                if term is not None:
                    total = term if total is None else total + term
        if total is None:  # one control set (L = 1): nothing varies
            p = next(iter(evos[0].controls.parameters()), None)
            return torch.zeros((), dtype=p.dtype if p is not None else None,
                               device=p.device if p is not None else None)
        return total  # / Delta, Delta = 1


def _distance2(a: nn.Module, b: nn.Module) -> torch.Tensor | None:
    """sum over the parameters both sets have (by name, same shape) of ||p_b - p_a||^2."""
    pb = dict(b.named_parameters())
    out = None
    for name, p in a.named_parameters():
        q = pb.get(name)
        if q is None or q.shape != p.shape:
            continue
        d = (q - p).pow(2).sum()
        out = d if out is None else out + d
    return out
