"""What to keep along the path u(t): the one way to say it (diffrax's ``SaveAt``).

An evolution always returns u(T). ``SaveAt`` adds states along the way:

    SaveAt()                      u(T) only (the forward pass of a network)
    SaveAt(steps=True)            u(t_0), ..., u(t_N): every grid point (BERT's hidden states)
    SaveAt(ts=(0.0, 1.5, 3.0))    the grid points at the chosen times
    SaveAt(substeps=True)         the state after every substep of every step, labelled

``Trajectory`` holds what was kept: ``times`` and ``states`` (stacked, grid points), and
``substeps`` (a list of ``Substep`` records) when asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["SaveAt", "Substep", "Trajectory"]


@dataclass(frozen=True)
class SaveAt:
    """Which states of the path to keep besides u(T).

    steps: every grid point t_i = i tau, i = 0..N_t (t_0 is the initial condition).
    ts: chosen times; each must be a grid point (a multiple of tau in [0, T]).
    substeps: the state after every substep j of every step i (``Trajectory.substeps``).
    """

    steps: bool = False
    ts: tuple[float, ...] = ()
    substeps: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "substeps"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"SaveAt.{name} must be a bool, got {getattr(self, name)!r}")
        ts = self.ts
        if isinstance(ts, (int, float)):
            ts = (ts,)
        try:
            ts = tuple(float(t) for t in ts)
        except (TypeError, ValueError):
            raise TypeError(f"SaveAt.ts must be a sequence of times, got {self.ts!r}") from None
        if any(not math.isfinite(t) for t in ts):
            raise ValueError(f"SaveAt.ts must be finite times, got {ts}")
        object.__setattr__(self, "ts", ts)

    @property
    def keeps_states(self) -> bool:
        return self.steps or bool(self.ts)

    def indices(self, grid) -> list[int]:
        """The grid indices i whose u(t_i) is kept (sorted, unique)."""
        if self.steps:
            return list(range(grid.num_steps + 1))
        out = set()
        for t in self.ts:
            i = round(t / grid.tau)
            if not (0 <= i <= grid.num_steps) or abs(i * grid.tau - t) > 1e-9 * max(1.0, grid.T):
                raise ValueError(f"SaveAt.ts: t = {t:g} is not a grid point of this evolution "
                                 f"(T = {grid.T:g}, tau = {grid.tau:g})")
            out.add(i)
        return sorted(out)


@dataclass(frozen=True)
class Substep:
    """The state after substep ``stage`` (index j, its text ``label``) of step ``step``."""

    step: int
    stage: int
    label: str
    state: torch.Tensor


@dataclass
class Trajectory:
    """u at the kept grid points: ``states[k]`` is u(``times[k]``) (stacked on first use;
    ``state_list`` is the unstacked tuple); ``final`` is u(T)."""

    times: torch.Tensor
    state_list: tuple[torch.Tensor, ...]
    final: torch.Tensor
    substeps: list[Substep] = field(default_factory=list)

    @property
    def states(self) -> torch.Tensor:
        """(K, B, N_x, N_y): the kept states stacked."""
        if not self.state_list:
            return self.final.new_empty((0, *self.final.shape))
        return torch.stack(self.state_list)

    def __len__(self) -> int:
        return len(self.state_list)
