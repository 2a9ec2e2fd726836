"""Time: the grid, the controls theta(t), the integrators, the schemes, the evolution."""

from .controls import Controls
from .evolution import Evolution, NonFiniteError, Trajectory
from .grid import TimeGrid
from .integrators import INTEGRATORS
from .schemes import Scheme, Stage, lie, paper_lie, prenorm, resolve, scheme_from_string

__all__ = [
    "INTEGRATORS",
    "Controls",
    "Evolution",
    "NonFiniteError",
    "Scheme",
    "Stage",
    "TimeGrid",
    "Trajectory",
    "lie",
    "paper_lie",
    "prenorm",
    "resolve",
    "scheme_from_string",
]
