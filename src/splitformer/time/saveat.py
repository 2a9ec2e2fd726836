"""What to keep along the path u(t): the one way to say it (diffrax's ``SaveAt``).

An evolution always returns u(T). ``SaveAt`` adds states along the way:

    SaveAt()                      u(T) only (the forward pass of a network)
    SaveAt(steps=True)            u(t_0), ..., u(t_N): every grid point (BERT's hidden states)
    SaveAt(ts=(0.0, 1.5, 3.0))    the grid points at the chosen times
    SaveAt(substeps=True)         the state after every substep of every step, labelled

``Trajectory`` holds what was kept: ``times`` and ``states`` (stacked, grid points), and
``substeps`` (a list of ``Substep`` records) when asked for. Under token merging the states of
an evolution live on grids of shrinking size (``state_list`` holds them; a model's ``solve``
and ``trajectory`` read them back on the input grid unless ``unmerge=False``); substep states
stay on the grid they were computed on.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

__all__ = ["SaveAt", "Substep", "Trajectory"]


@dataclass(frozen=True)
class SaveAt:
    """Which states of the path to keep besides u(T).

    steps: every grid point t_i = i tau, i = 0..N_t (t_0 is the initial condition).
    ts: chosen times, a number, a sequence of numbers or a 1-D real tensor (not a str, not a
        bool); each must be a grid point (a multiple of tau in [0, T]). It is checked against
        the grid whenever it is given, also with ``steps=True`` (which keeps every grid point,
        so ts adds nothing there).
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
        if isinstance(ts, torch.Tensor) and ts.dim() <= 1 and not (
                ts.dtype == torch.bool or ts.is_complex()):
            ts = ts.detach().reshape(-1).tolist()  # a tensor of times (grid.times())
        if _is_time(ts):
            ts = (ts,)
        elif isinstance(ts, (str, bytes, bool)) or not isinstance(ts, Iterable):
            raise TypeError(f"SaveAt.ts must be a number or a sequence of numbers (times), got "
                            f"{type(ts).__name__} {ts!r}")
        ts = tuple(ts)
        bad = [t for t in ts if not _is_time(t)]
        if bad:
            raise TypeError(f"SaveAt.ts must hold numbers (times), got {bad[0]!r} "
                            f"({type(bad[0]).__name__}) in {self.ts!r}")
        ts = tuple(float(t) for t in ts)
        if any(not math.isfinite(t) for t in ts):
            raise ValueError(f"SaveAt.ts must be finite times, got {ts}")
        object.__setattr__(self, "ts", ts)

    def union(self, other: SaveAt) -> SaveAt:
        """What this SaveAt or ``other`` asks for: one run keeps both (``select`` carves each
        out again)."""
        if not isinstance(other, SaveAt):
            raise TypeError(f"SaveAt.union(other): other must be a SaveAt, got "
                            f"{type(other).__name__}")
        return SaveAt(steps=self.steps or other.steps, ts=tuple(sorted({*self.ts, *other.ts})),
                      substeps=self.substeps or other.substeps)

    def select(self, trajectory: Trajectory, kept: SaveAt, grid) -> Trajectory:
        """The part of ``trajectory`` (a run that kept what ``kept`` asks for, a SaveAt that
        includes this one, e.g. ``self.union(other)``) this SaveAt asks for: its grid points,
        and the substeps only if it asks for them."""
        position = {i: k for k, i in enumerate(kept.indices(grid))}
        try:
            keep = [position[i] for i in self.indices(grid)]
        except KeyError as e:
            raise ValueError(f"SaveAt.select: grid point {e.args[0]} is not in the trajectory "
                             f"(kept by {kept}); pass the SaveAt it was run with") from None
        return Trajectory(trajectory.times[keep], tuple(trajectory.state_list[k] for k in keep),
                          trajectory.final,
                          substeps=list(trajectory.substeps) if self.substeps else [])

    def indices(self, grid) -> list[int]:
        """The grid indices i whose u(t_i) is kept (sorted, unique). Every time of ``ts`` must
        be a grid point, also when ``steps`` keeps them all (ValueError naming it)."""
        out = set()
        for t in self.ts:
            i = round(t / grid.tau)
            if not (0 <= i <= grid.num_steps) or abs(i * grid.tau - t) > 1e-9 * max(1.0, grid.T):
                raise ValueError(f"SaveAt.ts: t = {t:g} is not a grid point of this evolution "
                                 f"(T = {grid.T:g}, tau = {grid.tau:g})")
            out.add(i)
        if self.steps:
            return list(range(grid.num_steps + 1))
        return sorted(out)


def _is_time(t) -> bool:
    """A real number that is not a bool (True would read as t = 1)."""
    return isinstance(t, numbers.Real) and not isinstance(t, bool)


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
        shapes = {tuple(s.shape) for s in self.state_list}
        if len(shapes) > 1:
            raise ValueError(f"Trajectory.states: the kept states live on token grids of "
                             f"different sizes {sorted(s[1] for s in shapes if len(s) > 1)} "
                             "(token merging without unmerge); read them one by one from "
                             "state_list")
        return torch.stack(self.state_list)

    def __len__(self) -> int:
        return len(self.state_list)
