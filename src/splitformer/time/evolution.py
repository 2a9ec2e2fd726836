"""The evolution: a scheme run over a time grid with controls theta(t).

    u^0 = f,   u^{i+1} = S_tau(theta(t_i + tau/2)) u^i,   i = 0 .. N_t - 1

where S_tau is one application of the splitting scheme. With L control sets, T = L and
tau = 1 this is the L-layer network; ``refine(k)`` gives tau = 1/k on the same controls (a finer
discretisation of the same equation).

An evolution keeps the *layout* of the network it came from (its fields, with the operators
around them and the projections after them: ``time.schemes.Field``). Named schemes are always
rebuilt on that layout, whatever scheme the evolution runs now.

Building an evolution whose scheme leaves a field operator of the controls unused (an operator
of kind "field", e.g. the FFN under "attention norm1:project") warns, naming those operators:
the evolution then integrates an equation without those terms. Unused projections and maps are
not reported (a network may hold one it does not apply, e.g. a stochastic depth of rate 0).
``validate`` (a bool) turns on validation mode: NonFiniteError at the first substep that
produces a NaN or an inf.

``adjoint`` says how gradients are computed through the steps (``time.adjoints``): "backprop"
(autograd through every substep, the default), "checkpoint" (u kept at step boundaries only,
one step recomputed at a time in the backward pass) or "reversible" (the reversible scheme's
steps inverted in the backward pass; needs ``with_scheme("reversible")``). It changes memory,
never values: every adjoint gives the gradient of the same discrete evolution. Every scheme
declares its initial map ``lift``, its read-out ``read`` and its compiled step ``plan``
(``time.schemes.stages.Scheme``; identities and the stage closures on the base, the doubled
state (u, v) of the reversible scheme): the evolution runs ``lift``, then the plan of every
step, then ``read``, and takes u(0) and returns u(T) (and keeps read-out states in a
Trajectory), whatever the scheme's state.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..operators.base import Context
from .adjoints import Adjoint, Backprop, resolve_adjoint
from .controls import Controls
from .grid import TimeGrid
from .plan import Plan
from .saveat import SaveAt, Substep, Trajectory
from .schemes import SCHEMES, Layout, Scheme, resolve

__all__ = ["Evolution", "NonFiniteError", "Trajectory"]


def _finite(u: torch.Tensor) -> bool:
    """Whether u holds no NaN and no inf; outside autograd (isfinite is composite: it would
    save tensors, and a checkpointed step must save the same ones when it is recomputed)."""
    with torch.no_grad():
        return bool(torch.isfinite(u).all())


class NonFiniteError(FloatingPointError):
    """Raised in validation mode at the first substep that produced a NaN or an inf."""


class Evolution(nn.Module):
    """Runs ``scheme`` over ``grid`` with ``controls``; forward(u0) returns u(T).

    ``layout``: the fields of the network (default: read off the scheme, when it has one); a
    scheme name is built on it, here and in ``with_scheme``. ``validate``: a bool, validation
    mode (settable later: ``evolution.validate = True``; anything but a bool is refused).
    ``adjoint``: a name of ``time.adjoints.ADJOINTS`` or an ``Adjoint`` value (settable later:
    ``evolution.adjoint = "checkpoint"``; ``with_adjoint`` gives a copy).
    """

    def __init__(
        self,
        controls: Controls,
        scheme: str | Scheme,
        grid: TimeGrid | None = None,
        *,
        layout: Layout | None = None,
        validate: bool = False,
        adjoint: str | Adjoint = "backprop",
    ) -> None:
        super().__init__()
        if not isinstance(controls, Controls):
            raise TypeError(f"controls must be a Controls, got {type(controls).__name__}")
        self.controls = controls
        self.scheme = resolve(scheme, layout)
        for theta in controls:
            self.scheme.check_controls(theta)
        self.scheme.warn_unused_fields(controls, stacklevel=2)  # at the caller of Evolution()
        self.layout = tuple(layout) if layout is not None else self.scheme.layout
        self.grid = grid if grid is not None else TimeGrid(controls.T, len(controls))
        if not isinstance(self.grid, TimeGrid):
            raise TypeError(f"grid must be a TimeGrid, got {type(self.grid).__name__}")
        if abs(self.grid.T - controls.T) > 1e-12:
            raise ValueError(f"grid.T={self.grid.T} must equal the controls' T={controls.T}")
        self.validate = validate
        self.adjoint = adjoint

    @property
    def validate(self) -> bool:
        """Validation mode: raise NonFiniteError at the first substep with a NaN or an inf."""
        return self.__dict__.get("_validate", False)

    @validate.setter
    def validate(self, on: bool) -> None:
        if not isinstance(on, bool):
            raise TypeError(f"Evolution.validate must be a bool (validation mode on or off), "
                            f"got {type(on).__name__} {on!r}")
        self.__dict__["_validate"] = on

    @property
    def adjoint(self) -> Adjoint:
        """How gradients are computed through the steps (``time.adjoints``)."""
        return self.__dict__.get("_adjoint") or Backprop()  # Backprop: pickles from before

    @adjoint.setter
    def adjoint(self, adjoint: str | Adjoint) -> None:
        value = resolve_adjoint(adjoint)
        value.check(self.scheme)
        self.__dict__["_adjoint"] = value

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
        text = f"scheme={self.scheme.name!r} [{self.scheme}], T={self.T:g}, tau={self.tau:g}"
        return text if self.adjoint.name == "backprop" else f"{text}, adjoint={self.adjoint}"

    def _new(self, scheme: Scheme | None = None, grid: TimeGrid | None = None,
             controls: Controls | None = None, adjoint: str | Adjoint | None = None
             ) -> Evolution:
        return Evolution(controls if controls is not None else self.controls,
                         scheme if scheme is not None else self.scheme,
                         grid if grid is not None else self.grid,
                         layout=self.layout, validate=self.validate,
                         adjoint=adjoint if adjoint is not None else self.adjoint)

    def with_adjoint(self, adjoint: str | Adjoint) -> Evolution:
        """The same evolution (shared parameters) with another adjoint: "backprop",
        "checkpoint", "reversible" (needs the reversible scheme) or an Adjoint value."""
        return self._new(adjoint=resolve_adjoint(adjoint))

    def with_scheme(self, scheme: str | Scheme, **options) -> Evolution:
        """The same controls and grid under another scheme (parameters are shared).

        A name (``time.schemes.scheme_names()``) is built on the network's layout (its fields
        with their pre/post operators and projections), so that e.g. "strang" on a pre-LN model
        with LayerScale stays pre-LN with LayerScale, and "lie" after a user-written scheme is
        the network's Lie scheme again. ``options``: integrator ("euler", "heun", "rk4") and
        form ("raw", "tangent").
        """
        if isinstance(scheme, str) and scheme.strip() in SCHEMES and scheme.strip() != "paper" \
                and self.layout is None:
            raise ValueError(f"scheme {scheme!r}: this evolution has no field layout to build "
                             f"named schemes on (its scheme is {self.scheme.name!r} "
                             f"[{self.scheme}]); pass a Scheme or a scheme string")
        return self._new(scheme=resolve(scheme, self.layout, **options))

    def refine(self, k: int) -> Evolution:
        """tau -> tau / k, N_t -> k N_t, same controls (parameters are shared)."""
        if self.scheme.name == "paper" and k != 1:
            warnings.warn(
                "the paper's literal scheme projects the state in its FFN substeps and has no "
                "limit as tau -> 0 (docs/math.md 3.4); use a network-form model "
                "(from_torch(m)) with a named scheme before refining",
                stacklevel=2,
            )
        return self._new(grid=self.grid.refine(k))

    def with_controls_in_time(self, interpolation: str) -> Evolution:
        """Piecewise constant ("constant": the network) or piecewise linear ("linear") controls
        in t, on the same parameters."""
        return self._new(controls=self.controls.with_interpolation(interpolation))

    # -- running ----------------------------------------------------------------------------
    def forward(
        self,
        u0: torch.Tensor,
        context: Context | None = None,
        saveat: SaveAt | None = None,
    ) -> torch.Tensor | Trajectory:
        """u(T); with ``saveat``, a Trajectory holding what it asks for (and u(T))."""
        if saveat is None:
            return self._run(u0, context, None, None)
        if not isinstance(saveat, SaveAt):
            raise TypeError(f"saveat must be a SaveAt, got {type(saveat).__name__}")
        keep = set(saveat.indices(self.grid))
        states = [(0, u0)] if 0 in keep else []
        subs: list[Substep] | None = [] if saveat.substeps else None
        u = self._run(u0, context, (keep, states), subs)
        times = self.grid.times(dtype=u0.dtype).to(u0.device)
        return Trajectory(times[[i for i, _ in states]], tuple(s for _, s in states), u,
                          substeps=subs or [])

    def _run(self, u0, context, keep, subs) -> torch.Tensor:
        state = self.scheme.lift(u0)
        return self.scheme.read(self.adjoint.solve(self, state, context, keep, subs))

    # -- what an adjoint runs ---------------------------------------------------------------
    def theta(self, i: int):
        """The controls of step i, theta(t_i + tau / 2) (frozen at the step's midpoint)."""
        return self.controls.at((i + 0.5) * self.tau)

    def advance(self, i: int, state: torch.Tensor, context: Context | None, observe=None
                ) -> torch.Tensor:
        """Step i of the scheme on its state: S_tau(theta(t_i + tau / 2)) state, through the
        step's compiled plan (``plan``; the same values as ``scheme.step``), for every scheme."""
        return self.plan(i)(state, context, observe)

    def plan(self, i: int) -> Plan:
        """Step i compiled (``time.plan.Plan``): built once and kept while the scheme, tau and
        the operators of theta(t_i + tau / 2) stay the same; rebuilt when one of them changes."""
        theta = self.theta(i)
        if torch.compiler.is_compiling() or not isinstance(theta, nn.Module):
            # traced once, or a control set made for this time only (piecewise-linear controls
            # between two grid points): nothing to keep
            return self.scheme.plan(theta, self.tau)
        plans = self.__dict__.setdefault("_plans", {})
        plan = plans.get(i)
        if plan is None or plan.scheme is not self.scheme or plan.tau != self.tau \
                or not plan.fits(theta):
            plan = plans[i] = self.scheme.plan(theta, self.tau)
        return plan

    def _replicate_for_data_parallel(self):
        replica = super()._replicate_for_data_parallel()
        replica.__dict__.pop("_plans", None)  # its own operators: its own plans
        return replica

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_plans", None)  # closures over this object's operators: never copied
        return state

    def scheme_read(self, state: torch.Tensor) -> torch.Tensor:
        """u from the scheme's state (``scheme.read``: the identity but for schemes with their
        own state)."""
        return self.scheme.read(state)

    def observer(self, i: int, subs: list[Substep] | None):
        """What sees the state after every substep of step i (validation, kept substeps)."""
        return self._observer(i, subs)

    def _observer(self, i: int, subs: list[Substep] | None):
        if not self.validate and subs is None:
            return None
        stages = self.scheme.stages

        def observe(u: torch.Tensor, j: int) -> None:
            if self.validate and not _finite(u):
                raise NonFiniteError(
                    f"non-finite value in u after step {i} (t = {self.grid.time(i):g} -> "
                    f"{self.grid.time(i + 1):g}), substep {j} '{stages[j]}' of scheme "
                    f"{self.scheme.name!r}"
                )
            if subs is not None:
                subs.append(Substep(i, j, str(stages[j]), self.scheme_read(u)))
        return observe
