"""Training as optimal control (docs/math.md 3.8): the objective of one batch and its parts.

    min_theta  J(theta) = mean_i loss(R(u_i(T)), y_i) + sum_k w_k C_k(u, theta)
    subject to u_i(0) = E(x_i) (the initial map),   u^{n+1} = S_tau(theta^n) u^n (the evolution)

``ControlProblem(model, loss, running_costs, adjoint)`` holds these pieces as values;
``problem(inputs, target)`` runs the model's skeleton once (``EvolutionModel.solve``, or
``solve_along`` with ``SaveAt(steps=True)`` when a cost needs the path) and returns an
``Objective``:

    u0, ctx = model.initial_condition(*inputs)          E
    path    = model.evolution(u0, ctx, SaveAt(...))     every grid point if a cost needs the
                                                        path (``KineticEnergy``), else u(T)
    out     = model.read_out(u(T), ctx)                 R
    terminal = loss(logits(out), target)                ``logits``: an adapter, default none
    total    = terminal + sum_k w_k C_k(model, path)

``Objective.parts`` holds the terminal loss and each running cost by name; they add up to
``total`` (the sum is taken in that order). ``Objective.output`` is the read-out (for
accuracy, without a second forward pass).

``ControlProblem`` is an ``nn.Module`` holding the model: ``problem.train()`` / ``.eval()``
reach the model, ``problem.parameters()`` are the model's, and it can be wrapped in
DistributedDataParallel (its output, an Objective, is a dataclass of tensors).

The adjoint (``time.adjoints``: "backprop", "checkpoint", "reversible", or a value) is set *in
place* on every evolution of the model (``set_adjoint``), as ``validating`` sets validation
mode: it changes how gradients are computed, never a value. ``adjoint=None`` keeps the model's.
``with_adjoint(model, adjoint)`` is the copy that shares the parameters instead.

A model that is not an evolution model (not an ``models.base.EvolutionModel``, the skeleton that
declares ``initial_condition``, ``read_out`` and ``evolution_owners()``) is called as
``model(*inputs)``; it has no path and no controls, so running costs are refused for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..models.base import EvolutionModel, skeleton_of
from ..time import SaveAt, Trajectory
from ..time.adjoints import Adjoint, resolve_adjoint
from .costs import ControlRegularity, RunningCost, evolutions_of

__all__ = ["ControlProblem", "Objective", "set_adjoint", "with_adjoint"]


@dataclass
class Objective:
    """J = terminal + running costs. ``parts``: "terminal" and each running cost's name, in
    the order they are summed into ``total``; ``output``: the model's read-out."""

    total: torch.Tensor
    terminal: torch.Tensor
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    output: Any = None


def _owners(model: nn.Module, what: str) -> list[EvolutionModel]:
    model = skeleton_of(model)
    if model is None or not evolutions_of(model):
        raise ValueError(f"{what}: model {type(model).__name__} has no evolution to set an "
                         "adjoint on")
    return list(model.evolution_owners())


def set_adjoint(model: nn.Module, adjoint: str | Adjoint) -> nn.Module:
    """Set ``adjoint`` on every evolution of ``model`` in place (CvT's stages, the
    encoder-decoder pair: all of them); returns the model. Nothing is changed when any
    evolution refuses it (e.g. "reversible" on a scheme other than the reversible one)."""
    value = resolve_adjoint(adjoint)
    owners = _owners(model, "set_adjoint")
    for o in owners:
        value.check(o.evolution.scheme)
    for o in owners:
        o.evolution.adjoint = value
    return model


def with_adjoint(model: nn.Module, adjoint: str | Adjoint) -> nn.Module:
    """A copy of ``model`` sharing every parameter and buffer whose evolutions run ``adjoint``
    (the value-style counterpart of ``set_adjoint``; the copy has its own train/eval flags)."""
    value = resolve_adjoint(adjoint)
    _owners(model, "with_adjoint")
    return model._map_evolutions(lambda e, i: e.with_adjoint(value))


def _inputs(inputs: Any) -> tuple[tuple, dict]:
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


class ControlProblem(nn.Module):
    """The control problem of ``model`` with a terminal ``loss`` and ``running_costs``.

    model: any splitformer model (``initial_condition`` -> evolution -> ``read_out``), or any
        nn.Module (then without running costs).
    loss: ``loss(logits(output), target) -> scalar tensor``.
    running_costs: RunningCost values (``KineticEnergy(w)``, ``ControlRegularity(w)``), each
        name at most once.
    adjoint: None (the model's own), a name of ``time.adjoints.ADJOINTS`` or an Adjoint value;
        set in place on every evolution of the model.
    logits: an adapter from the read-out to what the loss reads, e.g. ``lambda out:
        out.logits`` for a read-out that is not a tensor; None: the read-out itself.

    forward(inputs, target) -> Objective. ``inputs``: the model's positional inputs (a tuple or
    list), its keyword inputs (a dict), or one tensor.
    """

    def __init__(
        self,
        model: nn.Module,
        loss: Callable[[Any, Any], torch.Tensor],
        running_costs: Iterable[RunningCost] = (),
        adjoint: str | Adjoint | None = None,
        *,
        logits: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"ControlProblem(model): model must be an nn.Module (a splitformer "
                            f"model), got {type(model).__name__}")
        if not callable(loss):
            raise TypeError(f"ControlProblem(loss): loss must be callable as loss(logits, "
                            f"target) -> scalar tensor, got {type(loss).__name__}")
        if logits is not None and not callable(logits):
            raise TypeError(f"ControlProblem(logits): logits must be None or callable (an "
                            f"adapter such as lambda out: out.logits), got "
                            f"{type(logits).__name__}")
        if isinstance(running_costs, (RunningCost, str, bytes)) or not isinstance(
                running_costs, Iterable):
            raise TypeError(f"ControlProblem(running_costs): running_costs must be a sequence "
                            f"of RunningCost values (KineticEnergy(w), ControlRegularity(w)), "
                            f"got {type(running_costs).__name__}")
        costs = tuple(running_costs)
        names: set[str] = set()
        for c in costs:
            if not isinstance(c, RunningCost):
                raise TypeError(f"ControlProblem(running_costs): each running cost must be a "
                                f"RunningCost (KineticEnergy(w), ControlRegularity(w)), got "
                                f"{type(c).__name__} {c!r}")
            if c.name in names or c.name == "terminal":
                raise ValueError(f"ControlProblem(running_costs): the name {c.name!r} is given "
                                 "twice (each running cost at most once, none named "
                                 "'terminal')")
            names.add(c.name)
        evolution_model = skeleton_of(model) is not None
        for c in costs:
            if c.needs_path and not (evolution_model and evolutions_of(model)):
                raise ValueError(f"ControlProblem(running_costs): {type(c).__name__} needs the "
                                 f"path u(t_n) of an evolution, but model "
                                 f"{type(model).__name__} has no initial_condition/evolution/"
                                 "read_out")
            if isinstance(c, ControlRegularity) and not evolutions_of(model):
                raise ValueError(f"ControlProblem(running_costs): ControlRegularity needs "
                                 f"control sets theta^m, but model {type(model).__name__} has "
                                 "no evolution")
        if adjoint is not None:
            try:
                set_adjoint(model, resolve_adjoint(adjoint, "ControlProblem(adjoint): adjoint"))
            except ValueError as e:
                msg = str(e)
                raise ValueError(msg if msg.startswith("ControlProblem(adjoint)")
                                 else f"ControlProblem(adjoint): {msg}") from None
        self.model = model
        self.loss = loss
        self.running_costs = costs
        self.logits = logits
        self._evolution_model = evolution_model

    @property
    def needs_path(self) -> bool:
        """Whether a running cost (of weight > 0) reads u along the path."""
        return any(c.needs_path and c.weight > 0 for c in self.running_costs)

    def extra_repr(self) -> str:
        costs = ", ".join(f"{type(c).__name__}({c.weight:g})" for c in self.running_costs)
        evos = evolutions_of(self.model)
        adjoints = sorted({str(e.adjoint) for e in evos})
        return f"running_costs=[{costs}], adjoint={'/'.join(adjoints) or None}"

    def forward(self, inputs: Any, target: Any) -> Objective:
        """J on one batch: the terminal loss and the running costs (module docstring)."""
        args, kwargs = _inputs(inputs)
        path: Trajectory | None = None
        if self._evolution_model:
            output, path = self._solve(args, kwargs)
        else:
            output = self.model(*args, **kwargs)
        read = self.logits(output) if self.logits is not None else output
        terminal = self.loss(read, target)
        if not isinstance(terminal, torch.Tensor) or terminal.numel() != 1:
            shape = tuple(terminal.shape) if isinstance(terminal, torch.Tensor) else None
            raise ValueError(f"ControlProblem(loss): loss must return a scalar tensor, got "
                             f"{type(terminal).__name__}"
                             + (f" of shape {shape}" if shape is not None else ""))
        terminal = terminal.reshape(())
        parts = {"terminal": terminal}
        total = terminal
        for c in self.running_costs:
            value = c(self.model, path) if c.weight > 0 else terminal.new_zeros(())
            parts[c.name] = value
            total = total + value
        return Objective(total=total, terminal=terminal, parts=parts, output=output)

    def _solve(self, args: tuple, kwargs: dict) -> tuple[Any, Trajectory | None]:
        """read_out(evolution(initial_condition(inputs))) through the model's own spine,
        keeping every grid point when a running cost needs the path (the model keeps what it
        asks for itself: hidden states)."""
        model = skeleton_of(self.model)
        if not self.needs_path:
            return model.solve(*args, **kwargs), None
        return model.solve_along(*args, saveat=SaveAt(steps=True), **kwargs)
