"""The evolution: a scheme run over a time grid with controls theta(t).

    u^0 = f,   u^{i+1} = S_tau(theta(t_i + tau/2)) u^i,   i = 0 .. N_t - 1

where S_tau is one application of the splitting scheme. With L control sets, T = L and
tau = 1 this is the L-layer network; ``refine(k)`` gives tau = 1/k on the same controls (a finer
discretisation of the same equation).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..operators.base import Context
from .controls import Controls
from .grid import TimeGrid
from .schemes import NAMED, Scheme, layout_of, resolve

__all__ = ["Evolution", "NonFiniteError", "Trajectory"]


class NonFiniteError(FloatingPointError):
    """Raised in validation mode at the first substep that produced a NaN or an inf."""


@dataclass
class Trajectory:
    """u at every grid point: ``states[i]`` is u(t_i), ``times[i]`` is t_i."""

    times: torch.Tensor
    states: torch.Tensor

    @property
    def final(self) -> torch.Tensor:
        return self.states[-1]

    def __len__(self) -> int:
        return self.states.shape[0]


class Evolution(nn.Module):
    """Runs ``scheme`` over ``grid`` with ``controls``; forward(u0) returns u(T)."""

    def __init__(
        self,
        controls: Controls,
        scheme: str | Scheme,
        grid: TimeGrid | None = None,
        *,
        validate: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(controls, Controls):
            raise TypeError(f"controls must be a Controls, got {type(controls).__name__}")
        self.controls = controls
        self.scheme = resolve(scheme)
        for theta in controls:
            self.scheme.check_controls(theta)
        self.grid = grid if grid is not None else TimeGrid(controls.T, len(controls))
        if abs(self.grid.T - controls.T) > 1e-12:
            raise ValueError(f"grid.T={self.grid.T} must equal the controls' T={controls.T}")
        self.validate = validate

    # -- the contract of DESIGN.md ---------------------------------------------------------
    @property
    def tau(self) -> float:
        return self.grid.tau

    @property
    def num_steps(self) -> int:
        return self.grid.num_steps

    @property
    def T(self) -> float:
        return self.grid.T

    def extra_repr(self) -> str:
        return f"scheme={self.scheme.name!r} [{self.scheme}], T={self.T:g}, tau={self.tau:g}"

    def with_scheme(self, scheme: str | Scheme, **options) -> Evolution:
        """The same controls and grid under another scheme (parameters are shared).

        A name ("lie", "strang", "parallel", "unsplit", "prenorm") is built on the layout of the
        current scheme (its fields with their pre/post operators and projections), so that e.g.
        "strang" on a pre-LN model with LayerScale stays pre-LN with LayerScale. ``options``:
        integrator ("euler", "heun", "rk4") and form ("raw", "tangent").
        """
        if isinstance(scheme, str) and scheme in (*NAMED, "prenorm"):
            scheme = resolve(scheme, layout_of(self.scheme), **options)
        elif options:
            raise ValueError("integrator/form options apply to named schemes only")
        return Evolution(self.controls, scheme, self.grid, validate=self.validate)

    def refine(self, k: int) -> Evolution:
        """tau -> tau / k, N_t -> k N_t, same controls (parameters are shared)."""
        if self.scheme.name == "paper" and k != 1:
            warnings.warn(
                "the paper's literal scheme projects the state in its FFN substeps and has no "
                "limit as tau -> 0 (docs/math.md 3.4); use with_scheme('lie') before refining",
                stacklevel=2,
            )
        return Evolution(self.controls, self.scheme, self.grid.refine(k), validate=self.validate)

    def with_controls_in_time(self, interpolation: str) -> Evolution:
        """Piecewise constant ("constant": the network) or piecewise linear ("linear") controls
        in t, on the same parameters."""
        return Evolution(self.controls.with_interpolation(interpolation), self.scheme, self.grid,
                         validate=self.validate)

    # -- running ----------------------------------------------------------------------------
    def forward(
        self,
        u0: torch.Tensor,
        context: Context | None = None,
        *,
        return_trajectory: bool = False,
    ) -> torch.Tensor | Trajectory:
        u, states = self.run(u0, context, keep_states=return_trajectory)
        if states is not None:
            return Trajectory(self.grid.times(dtype=u0.dtype).to(u0.device), torch.stack(states))
        return u

    def run(self, u0: torch.Tensor, context: Context | None = None, *,
            keep_states: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """u(T), and the list [u(t_0), ..., u(t_N)] when ``keep_states`` (not stacked)."""
        u = u0
        states = [u0] if keep_states else None
        tau = self.tau
        for i in range(self.num_steps):
            theta = self.controls.at((i + 0.5) * tau)  # frozen at the step's midpoint
            check = self._checker(i) if self.validate else None
            u = self.scheme.step(u, theta, tau, context, check)
            if states is not None:
                states.append(u)
        return u, states

    def _checker(self, i: int):
        def check(u: torch.Tensor, j: int) -> None:
            if not torch.isfinite(u).all():
                st = self.scheme.stages[j]
                raise NonFiniteError(
                    f"non-finite value in u after step {i} (t = {self.grid.time(i):g} -> "
                    f"{self.grid.time(i + 1):g}), substep {j} '{st}' of scheme {self.scheme.name!r}"
                )
        return check
