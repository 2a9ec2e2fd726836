"""Substep integrators: how one stage of a scheme advances u by a step h.

For a vector field F (a term of the equation, u_t = F(u)):

    euler:  u + h F(u)                                         (first order)
    heun:   k1 = F(u), k2 = F(u + h k1);  u + h (k1 + k2) / 2   (RK2, second order)
    rk4:    classical fourth-order Runge-Kutta

``embed`` is the identity between the input and output feature grids of F; it matters only for
the paper's literal FFN substeps, whose operators change the feature width (u + h(W u + b) with
the rectangular identity). Projections and pointwise maps have no integrator: they are applied
exactly, independently of h.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["INTEGRATORS", "ORDERS", "euler", "heun", "rk4"]

Field = Callable[[torch.Tensor], torch.Tensor]


def euler(f: Field, u: torch.Tensor, h: float, embed: Field | None = None) -> torch.Tensor:
    """Explicit Euler: embed(u) + h F(u)."""
    du = f(u)
    base = u if embed is None else embed(u)
    return base + du if h == 1.0 else torch.add(base, du, alpha=h)


def heun(f: Field, u: torch.Tensor, h: float, embed: Field | None = None) -> torch.Tensor:
    """Heun's method (explicit trapezoid, RK2)."""
    if embed is not None:
        raise ValueError("integrator 'heun' needs a field that keeps the feature width")
    k1 = f(u)
    k2 = f(u + h * k1)
    return u + (0.5 * h) * (k1 + k2)


def rk4(f: Field, u: torch.Tensor, h: float, embed: Field | None = None) -> torch.Tensor:
    """Classical fourth-order Runge-Kutta."""
    if embed is not None:
        raise ValueError("integrator 'rk4' needs a field that keeps the feature width")
    k1 = f(u)
    k2 = f(u + (0.5 * h) * k1)
    k3 = f(u + (0.5 * h) * k2)
    k4 = f(u + h * k3)
    return u + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


INTEGRATORS: dict[str, Callable[..., torch.Tensor]] = {"euler": euler, "heun": heun, "rk2": heun,
                                                      "rk4": rk4}
ORDERS = {"euler": 1, "heun": 2, "rk2": 2, "rk4": 4}
