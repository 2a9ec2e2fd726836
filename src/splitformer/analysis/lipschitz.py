"""The Lipschitz estimate of one step map: ``step_lipschitz`` (the Lanczos iteration on J^T J,
one torch.func.jvp and one vjp per iteration; ``analysis.diagnostics`` documents it).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ..operators.base import Context
from ..time import Evolution
from .checks import ArgumentError, check_seed
from .readings import has_own_state

__all__ = ["LIPSCHITZ_ITERATIONS", "LIPSCHITZ_TOL", "LipschitzEstimate", "check_int",
           "check_real", "step_lipschitz"]

LIPSCHITZ_ITERATIONS = 100  # the cap of the Lanczos iteration of each step


LIPSCHITZ_TOL = 1e-4  # stop when the estimate changes by less than this (relative)


@dataclass(frozen=True)
class LipschitzEstimate:
    """What ``step_lipschitz`` returns: ``value`` (the estimate of sigma_max; ``float()`` of
    the record), the ``iterations`` used, whether it ``converged`` (the relative change fell
    below the tolerance, or the Krylov space became invariant) and the relative ``change`` of
    the estimate at the last iteration (None after a single iteration)."""

    value: float
    iterations: int
    converged: bool
    change: float | None

    def __float__(self) -> float:
        return float(self.value)


def _tridiagonal_top(alphas: list[float], betas: list[float]) -> float:
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        off = torch.tensor(betas, dtype=torch.float64)
        t = t + torch.diag(off, 1) + torch.diag(off, -1)
    return float(torch.linalg.eigvalsh(t)[-1])


def check_real(value, argument: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(float(value)) and low <= float(value) < high):
        raise ArgumentError(argument, f"expected a number in [{low:g}, {high:g}), got "
                                      f"{value!r}")
    return float(value)


def step_lipschitz(evolution: Evolution, step: int, state: torch.Tensor,
                   context: Context | None = None, *, index: int = 0,
                   iterations: int = LIPSCHITZ_ITERATIONS, tol: float = LIPSCHITZ_TOL,
                   seed: int = 0) -> LipschitzEstimate:
    """An estimate of the largest singular value of the Jacobian J of the step map u^n ->
    u^{n+1} (step ``step`` of ``evolution``, run in eval mode: no dropout) at input ``index``
    of ``state`` (B, N_x, N_y), the other inputs held fixed.

    The Lanczos iteration on J^T J: v_1 a unit vector seeded by ``seed``; iteration k forms
    w = J^T J v_k (one torch.func.jvp and one vjp), alpha_k = <w, v_k>, orthogonalises w
    against v_1 .. v_k (twice, in float64), beta_k = ||w||, v_{k+1} = w / beta_k. The estimate
    is the square root of the largest eigenvalue of the tridiagonal matrix (alpha, beta): it
    never exceeds sigma_max(J) and increases with k. Stops when the estimate changes by less
    than ``tol`` (relative) from one iteration to the next, when beta_k vanishes (an invariant
    Krylov space: the estimate is exact), or after ``iterations`` (not converged). Bad
    arguments raise ArgumentError naming them."""
    if not isinstance(evolution, Evolution):
        raise ArgumentError("evolution", f"expected an Evolution, got {type(evolution).__name__}")
    if has_own_state(evolution.scheme):
        raise ArgumentError("evolution", f"scheme {evolution.scheme.name!r} has its own "
                                          "(doubled) state: its step map does not act on u alone")
    nsteps = int(evolution.num_steps)
    if not is_index(step) or not 0 <= step < nsteps:
        raise ArgumentError("step", f"expected a step index in [0, {nsteps - 1}] (the "
                                    f"evolution has {nsteps} step{'' if nsteps == 1 else 's'}), "
                                    f"got {step!r}")
    if not isinstance(state, torch.Tensor) or state.dim() != 3 or not state.is_floating_point():
        what = (f"{state.dtype} of shape {tuple(state.shape)}" if isinstance(state, torch.Tensor)
                else type(state).__name__)
        raise ArgumentError("state", f"expected a floating tensor (batch, tokens, features), "
                                     f"got {what}")
    batch = state.shape[0]
    if not is_index(index) or not 0 <= index < batch:
        raise ArgumentError("index", f"expected an input index in [0, {batch - 1}] (the batch "
                                     f"has {batch}), got {index!r}")
    iterations = check_int(iterations, "iterations", 1)
    tol = check_real(tol, "tol", 0.0, 1.0)
    seed = check_seed(seed)
    modes = {m: m.training for m in evolution.modules()}
    evolution.eval()
    try:
        return _lanczos(evolution, int(step), state.detach(), context, int(index), iterations,
                        tol, seed)
    finally:
        for m, mode in modes.items():
            m.training = mode


def _lanczos(evolution: Evolution, step: int, u: torch.Tensor, context, index: int,
             cap: int, tol: float, seed: int) -> LipschitzEstimate:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    x0 = u[index]

    def f(x: torch.Tensor) -> torch.Tensor:
        full = torch.cat((u[:index], x.unsqueeze(0), u[index + 1:]))
        return evolution.advance(step, full, context)[index]

    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(x0.numel(), generator=gen, dtype=torch.float64).to(x0.device)
    v = v / v.norm()
    basis: list[torch.Tensor] = []
    alphas: list[float] = []
    betas: list[float] = []
    estimate, change = 0.0, None
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        _, vjp_fn = torch.func.vjp(f, x0)
        for k in range(1, cap + 1):
            basis.append(v)
            # grad mode on inside the jvp, as torch.func.vjp has it: the operators' fused
            # lifts (operators.feature.StackedProduct) run only without grad mode and read the
            # input's data pointer, which forward-mode's wrapped tensors do not have
            with torch.enable_grad():
                _, jv = torch.func.jvp(f, (x0,), (v.to(x0.dtype).reshape(x0.shape),))
            jv = jv.detach()
            (w,) = vjp_fn(jv)
            w = w.detach().double().flatten()
            if not bool(torch.isfinite(w).all()):
                return LipschitzEstimate(float("nan"), k, False, None)
            size = float(w.norm())
            alphas.append(float(w @ v))
            vs = torch.stack(basis)
            for _ in range(2):  # full reorthogonalisation
                w = w - vs.T @ (vs @ w)
            beta = float(w.norm())
            previous = estimate
            estimate = math.sqrt(max(_tridiagonal_top(alphas, betas), 0.0))
            if k > 1:
                change = abs(estimate - previous) / estimate if estimate > 0 else 0.0
            if beta <= 1e-10 * size or k == x0.numel():  # invariant Krylov space: exact
                return LipschitzEstimate(estimate, k, True, change if change is not None
                                         else 0.0)
            if change is not None and change < tol:
                return LipschitzEstimate(estimate, k, True, change)
            betas.append(beta)
            v = w / beta
    return LipschitzEstimate(estimate, cap, False, change)


def is_index(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value, argument: str, low: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ArgumentError(argument, f"expected an integer >= {low}, got {value!r}")
    return int(value)
