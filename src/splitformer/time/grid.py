"""The time grid: t_i = i tau on [0, T], tau = T / N_t."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TimeGrid"]


@dataclass(frozen=True)
class TimeGrid:
    """A uniform grid on [0, T] with N_t steps. The network with L layers is T = L, N_t = L."""

    T: float
    num_steps: int

    def __post_init__(self) -> None:
        if not (isinstance(self.num_steps, int) and self.num_steps >= 1):
            raise ValueError(f"num_steps must be an int >= 1, got {self.num_steps!r}")
        if not self.T > 0:
            raise ValueError(f"T must be > 0, got {self.T!r}")

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
        if not (isinstance(k, int) and k >= 1):
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        return TimeGrid(self.T, self.num_steps * k)
