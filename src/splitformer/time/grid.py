"""The time grid: t_i = i tau on [0, T], tau = T / N_t."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

__all__ = ["TimeGrid"]


@dataclass(frozen=True)
class TimeGrid:
    """A uniform grid on [0, T] with N_t steps. The network with L layers is T = L, N_t = L.

    T: a finite real number > 0 (stored as a float); num_steps: an integer >= 1 (a Python or
    NumPy integer, stored as an int; not a bool).
    """

    T: float
    num_steps: int

    def __post_init__(self) -> None:
        if not _is_int(self.num_steps) or self.num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {self.num_steps!r}")
        object.__setattr__(self, "num_steps", int(self.num_steps))
        T = self.T
        if isinstance(T, bool) or not isinstance(T, numbers.Real):
            raise TypeError(f"T must be a real number > 0 (the final time), got "
                            f"{type(T).__name__} {T!r}")
        if not (math.isfinite(float(T)) and T > 0):
            raise ValueError(f"T must be a finite number > 0 (the final time), got {T!r}")
        object.__setattr__(self, "T", float(T))

    @property
    def tau(self) -> float:
        """The step size T / N_t."""
        return self.T / self.num_steps

    def time(self, i: int) -> float:
        """t_i = i tau."""
        return i * self.tau

    def times(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """All N_t + 1 grid points."""
        return torch.linspace(0.0, float(self.T), self.num_steps + 1, dtype=dtype)

    def refine(self, k: int) -> TimeGrid:
        """tau -> tau / k on the same [0, T]."""
        if not _is_int(k) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        return TimeGrid(self.T, self.num_steps * int(k))


def _is_int(n) -> bool:
    """An integer (int, NumPy's) that is not a bool (True would read as 1)."""
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)
