"""Time: the grid, the controls theta(t), the integrators, the schemes, the evolution."""

from .controls import Controls
from .evolution import Evolution, NonFiniteError
from .grid import TimeGrid
from .integrators import INTEGRATORS
from .plan import Plan
from .saveat import SaveAt, Substep, Trajectory
from .schemes import (
    FORMS,
    KINDS,
    SCHEMES,
    Field,
    Scheme,
    Stage,
    lie,
    paper_lie,
    prenorm,
    resolve,
    scheme_from_string,
    scheme_names,
)

__all__ = [
    "FORMS",
    "INTEGRATORS",
    "KINDS",
    "SCHEMES",
    "Controls",
    "Evolution",
    "Field",
    "NonFiniteError",
    "Plan",
    "SaveAt",
    "Scheme",
    "Stage",
    "Substep",
    "TimeGrid",
    "Trajectory",
    "lie",
    "paper_lie",
    "prenorm",
    "resolve",
    "scheme_from_string",
    "scheme_names",
]
