"""Training as optimal control (docs/math.md 3.8, 3.9): the control problem, running costs and
adjoints as values.

    ControlProblem(model, loss, running_costs=(), adjoint=None, logits=None)
    problem(inputs, target) -> Objective(total, terminal, parts, output)
    KineticEnergy(weight), ControlRegularity(weight)          running costs
    "backprop" | "checkpoint" | "reversible" (time.adjoints)   adjoints
    set_adjoint(model, adjoint) (in place), with_adjoint(model, adjoint) (a shared copy)
    model.with_scheme("reversible")                           the reversible scheme on (u, v)
"""

from ..time.adjoints import (
    ADJOINTS,
    Adjoint,
    Backprop,
    Checkpoint,
    Reversible,
    ReversibleScheme,
    adjoint_names,
    resolve_adjoint,
    reversible,
)
from .costs import ControlRegularity, KineticEnergy, RunningCost, evolutions_of
from .problem import ControlProblem, Objective, set_adjoint, with_adjoint

__all__ = [
    "ADJOINTS",
    "Adjoint",
    "Backprop",
    "Checkpoint",
    "ControlProblem",
    "ControlRegularity",
    "KineticEnergy",
    "Objective",
    "Reversible",
    "ReversibleScheme",
    "RunningCost",
    "adjoint_names",
    "evolutions_of",
    "resolve_adjoint",
    "reversible",
    "set_adjoint",
    "with_adjoint",
]
