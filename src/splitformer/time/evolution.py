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

``merging`` (a ``operators.merging.TokenMerging``, or None) coarsens the token grid along the
way: r nodes merged per unit of time, in the first step of each unit interval, after its
attention substep or at its start (``time.plan.merge_plan``); each run starts a
``MergeTrace`` in the context (a fresh ``Context`` when none is given) and the merges update
the context's grid, so later steps and the read-out see the coarse grid. It is a stage of the
printed scheme and is kept by ``with_scheme``, ``refine``, ``with_controls_in_time`` and
``with_adjoint``; schemes and adjoints that cannot run it are refused by name.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings

import torch
from torch import nn

from ..operators.attention import AttentionOperator
from ..operators.base import Context, Operator
from ..operators.merging import TokenMerging, start_trace
from ..operators.superposition import Superposition
from .adjoints import Adjoint, Backprop, resolve_adjoint
from .controls import Controls
from .grid import TimeGrid, _is_int
from .plan import Plan, attention_stage, merge_plan
from .saveat import SaveAt, Substep, Trajectory
from .schemes import SCHEMES, Layout, Scheme, resolve
from .schemes.reversible import ReversibleScheme

_KEEP = object()  # Evolution._new: keep the evolution's own value

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
    ``evolution.adjoint = "checkpoint"``; ``with_adjoint`` gives a copy). ``merging``: a
    ``TokenMerging`` or None (the module doc; ``with_token_merging`` gives a copy).
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
        merging: TokenMerging | None = None,
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
        self.merging = merging

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
        if self.merging is not None:
            _check_merging(self.merging, self.scheme, self.controls, value, self.grid)
        self.__dict__["_adjoint"] = value

    @property
    def merging(self) -> TokenMerging | None:
        """Token merging along the evolution (``operators.merging.TokenMerging``), or None."""
        return self.__dict__.get("_merging")

    @merging.setter
    def merging(self, merging: TokenMerging | None) -> None:
        if merging is not None and not isinstance(merging, TokenMerging):
            raise TypeError(f"Evolution.merging must be a TokenMerging or None, got "
                            f"{type(merging).__name__}")
        if merging is not None:
            _check_merging(merging, self.scheme, self.controls, self.adjoint, self.grid)
        self.__dict__["_merging"] = merging
        self.__dict__.pop("_plans", None)  # plans hold the merge closures

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

    def signature(self) -> str:
        """What fixes the sequence of field evaluations of a forward, as text: the scheme,
        the time grid and the controls' interpolation in t (a KV tape recorded under one
        signature refuses a forward under another; ``operators.tape``)."""
        return (f"scheme [{self.scheme}], tau {self.tau:g}, {self.num_steps} steps, "
                f"{self.controls.interpolation} controls")

    def stage_text(self) -> str:
        """The scheme's stages as printed, with the merge at its place when there is one
        (e.g. "attention merge(r=16, metric=keys) norm1:project ffn norm2:project")."""
        labels = [str(st) for st in self.scheme.stages]
        merging = self.merging
        if merging is not None:
            theta = self.controls[0]
            at = 0 if merging.where == "step" else attention_stage(self.scheme, theta) + 1
            labels.insert(at, str(merging))
        return " ".join(labels)

    def extra_repr(self) -> str:
        text = f"scheme={self.scheme.name!r} [{self.stage_text()}], T={self.T:g}, " \
               f"tau={self.tau:g}"
        return text if self.adjoint.name == "backprop" else f"{text}, adjoint={self.adjoint}"

    def _new(self, scheme: Scheme | None = None, grid: TimeGrid | None = None,
             controls: Controls | None = None, adjoint: str | Adjoint | None = None,
             merging=_KEEP) -> Evolution:
        return Evolution(controls if controls is not None else self.controls,
                         scheme if scheme is not None else self.scheme,
                         grid if grid is not None else self.grid,
                         layout=self.layout, validate=self.validate,
                         adjoint=adjoint if adjoint is not None else self.adjoint,
                         merging=self.merging if merging is _KEEP else merging)

    def with_token_merging(self, merging: TokenMerging | None) -> Evolution:
        """The same evolution (shared parameters) with token merging ``merging`` (a
        ``TokenMerging``; None: none)."""
        return self._new(merging=merging)

    def merges_in(self, i: int) -> int:
        """The nodes merged in step i: the sum of r_n over the unit intervals [n, n + 1) that
        begin in [t_i, t_i + tau) (at tau = 1, r_i; after refine(k), r_n in every k-th step)."""
        merging = self.merging
        if merging is None:
            return 0
        t, tau = i * self.tau, self.tau
        first, last = math.ceil(t - 1e-9), math.ceil(t + tau - 1e-9)
        return sum(merging.r_at(n) for n in range(first, last))

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

    # -- coarsening in t (docs/math.md 3.13) ----------------------------------------------
    def coarsen(self, k: int) -> Evolution:
        """tau -> k tau, N_t -> N_t / k on the same [0, T] and controls (parameters shared):
        the inverse of ``refine(k)``. A coarse step over (t_i, t_i + k tau] reads the controls
        at its midpoint: with "constant" controls and k even the midpoint is the end of a
        unit interval (n - 1, n], whose controls theta^n it takes (the first of each pair at
        k = 2); with "linear" controls two unit steps merge into one of tau = 2 with the
        average (theta^n + theta^(n+1)) / 2. ValueError unless k divides N_t."""
        if not _is_int(k) or k < 1:
            raise ValueError(f"coarsen(k): k must be an int >= 1, got {k!r}")
        n = self.grid.num_steps
        if n % k:
            raise ValueError(f"coarsen(k={k}): k must divide the number of steps N_t={n} "
                             f"(tau={self.tau:g}); refine first or choose a divisor")
        return self._new(grid=TimeGrid(self.grid.T, n // k))

    def drop_steps(self, indices) -> Evolution:
        """The evolution without the steps ``indices`` (ShortGPT's layer removal, the other
        classical coarsening): the field is zero on the dropped unit intervals, which are cut
        out of [0, T], so T -> T - len(indices), one step per kept control set (shared
        parameters; a per-interval merge schedule keeps the kept intervals' r). Needs one step
        per control set (tau = 1: ``coarsen`` a refined evolution back first); the indices are
        distinct ints in [0, N_t) and leave at least one step."""
        n = len(self.controls)
        if self.grid.num_steps != n:
            raise ValueError(f"drop_steps: needs one step per control set (tau = 1), got "
                             f"tau={self.tau:g} with N_t={self.grid.num_steps} over {n} control "
                             f"sets; coarsen(k) or refine(k) back to tau = 1 first")
        drop = _step_indices(indices, n, "drop_steps(indices)")
        keep = [i for i in range(n) if i not in drop]
        if not keep:
            raise ValueError(f"drop_steps(indices): {sorted(drop)} drops every one of the {n} "
                             "steps; keep at least one")
        controls = Controls([self.controls[i] for i in keep], self.controls.interpolation)
        merging = self.merging
        if merging is not None and isinstance(merging.r, tuple):
            merging = dataclasses.replace(merging, r=tuple(merging.r[i] for i in keep))
        return Evolution(controls, self.scheme, TimeGrid(float(len(keep)), len(keep)),
                         layout=self.layout, validate=self.validate, adjoint=self.adjoint,
                         merging=merging)

    def parallel_steps(self, groups) -> Evolution:
        """The evolution with each group of consecutive steps run as one step of superposed
        fields ("Transformer layers as painters"' parallel layers; ``operators.superposition``):
        for a group a .. a + m - 1, one unit step whose every field is the sum of the group's
        m fields of that name (u + sum_k F_k(u): the state frozen at the group's start, the
        field integrated exactly in time over the m intervals) and whose projections and maps
        are those of the group's last step (its output is what the next step was trained
        on). T -> T - sum (m - 1), one step per control set, shared parameters. ``groups``: a
        sequence of groups, each a sequence of at least two consecutive step indices; the
        groups are disjoint. Needs one step per control set (tau = 1), control sets with the
        same operator names in a group, and no token merging (its metric reads an attention
        operator, not a sum)."""
        n = len(self.controls)
        if self.grid.num_steps != n:
            raise ValueError(f"parallel_steps: needs one step per control set (tau = 1), got "
                             f"tau={self.tau:g} with N_t={self.grid.num_steps} over {n} control "
                             f"sets; coarsen(k) or refine(k) back to tau = 1 first")
        if self.merging is not None:
            raise ValueError(f"parallel_steps: the evolution merges tokens ({self.merging}); "
                             "token merging reads the keys of one attention operator, which a "
                             "superposed step does not have; apply with_token_merging(None) "
                             "first")
        spans = _parallel_groups(groups, n)
        start = {g[0]: g for g in spans}
        sets: list[dict[str, nn.Module]] = []
        i = 0
        while i < n:
            group = start.get(i, (i,))
            thetas = [self.controls[k] for k in group]
            names = list(thetas[-1].keys())
            for k, th in zip(group, thetas, strict=True):
                if list(th.keys()) != names:
                    raise ValueError(f"parallel_steps: step {k} has the operators "
                                     f"{list(th.keys())}, step {group[-1]} {names}; only "
                                     "steps with the same operators superpose")
            theta: dict[str, nn.Module] = {}
            for name in names:
                op = thetas[-1][name]
                if len(group) > 1 and isinstance(op, Operator) and op.kind == "field":
                    theta[name] = Superposition([th[name] for th in thetas])
                else:
                    theta[name] = op
            sets.append(theta)
            i += len(group)
        controls = Controls(sets, self.controls.interpolation)
        return Evolution(controls, self.scheme, TimeGrid(float(len(sets)), len(sets)),
                         layout=self.layout, validate=self.validate, adjoint=self.adjoint)

    @property
    def is_network(self) -> bool:
        """Whether each step is one layer of the controls: tau = 1, constant controls, and
        no superposed fields (``parallel_steps``: a sum of layers' fields is no layer)."""
        return self.tau == 1.0 and self.controls.interpolation == "constant" \
            and not self.superposed_steps

    @property
    def superposed_steps(self) -> list[int]:
        """The control sets holding a superposition of fields (``parallel_steps``)."""
        return [i for i, theta in enumerate(self.controls)
                if any(isinstance(op, Superposition) for op in theta.values())]

    def as_network(self) -> Evolution:
        """The same discrete evolution as a network: tau = 1, one control set per step, the
        controls of step i being theta(t_i + tau / 2) (copies, not shared) with every field's
        output scaled by tau (``Operator.scale_``: u + tau F(u) = u + F_tau(u) with F_tau =
        tau F, e.g. a post-LN step LN(u + tau A(u)) is an ordinary layer whose W_O and b_O are
        tau times the controls'). The evolution itself when it is one already (tau = 1,
        constant controls), whatever its scheme: one step per layer is then the network's own
        function, and an exporter checks that the scheme is its network's (``to_hf`` of a
        Strang model is refused there, by name). Otherwise refused by name: a scheme whose
        field stages are not one Euler substep of the whole step each (Strang, Heun,
        relaxations, parallel, reversible: not an ordinary layer), a field operator without
        ``scale_``, a post map of a field that is not linear (``Operator.is_linear``:
        LayerScale and stochastic depth are; a norm after the field is not, and the fold
        would change the function). Each distinct field module of a step is scaled once,
        however many stages name it."""
        if self.superposed_steps:
            raise ValueError(f"as_network: control sets {self.superposed_steps} hold a "
                             "superposition of fields (parallel_steps), which no ordinary "
                             "layer computes")
        if self.is_network:  # the network's own function; its exporter checks the scheme
            return self
        scheme = self.scheme
        _check_layer_scheme(scheme)
        tau = self.tau
        sets = []
        for i in range(self.grid.num_steps):
            theta = self.controls.frozen_at((i + 0.5) * tau)
            scaled: set[int] = set()
            for st in scheme.stages:
                if st.kind != "field":
                    continue
                for name in st.post:
                    post = theta[name]
                    if not (isinstance(post, Operator) and post.is_linear):
                        raise ValueError(f"as_network: stage {str(st)!r} applies {name!r} "
                                         f"({type(post).__name__}) after its field, which is "
                                         "not a linear map (Operator.is_linear): tau cannot "
                                         "fold into the field's weights through it")
                for name in st.fields():
                    op = theta[name]
                    if not (isinstance(op, Operator) and op.has_scale):
                        raise ValueError(f"as_network: field {name!r} ({type(op).__name__}) "
                                         "cannot fold the step size into its weights (it "
                                         "declares no Operator.scale_)")
                    if tau != 1.0 and id(op) not in scaled:
                        op.scale_(tau)
                        scaled.add(id(op))
            sets.append(theta)
        controls = Controls(sets)
        return Evolution(controls, scheme, TimeGrid(float(len(sets)), len(sets)),
                         layout=self.layout, validate=self.validate, adjoint=self.adjoint,
                         merging=None if self.merging is None else self._network_merging())

    def _network_merging(self) -> TokenMerging:
        """The merge schedule of ``as_network``: the nodes merged in each step, per layer."""
        return dataclasses.replace(self.merging, r=tuple(self.merges_in(i)
                                                         for i in range(self.num_steps)))

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
        if self.merging is not None and self.merging.active:
            context = context if context is not None else Context()
            _refuse_causal_kernels(self.controls, self.merging)
            start_trace(u0, context, self.merging)
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
            return self._compiled(i, theta)
        plans = self.__dict__.setdefault("_plans", {})
        plan = plans.get(i)
        if plan is None or plan.scheme is not self.scheme or plan.tau != self.tau \
                or not plan.fits(theta):
            plan = plans[i] = self._compiled(i, theta)
        return plan

    def _compiled(self, i: int, theta) -> Plan:
        """The scheme's plan of step i, with the merge of the step inserted when it has one."""
        plan = self.scheme.plan(theta, self.tau)
        r = self.merges_in(i)
        return plan if r == 0 else merge_plan(plan, self.merging, r, i, theta)

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
        stages = self.plan(i).labels if self.merges_in(i) else self.scheme.stages

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


def _refuse_causal_kernels(controls: Controls, merging: TokenMerging) -> None:
    """ValueError naming the operator whose kernel brings its own causal support
    (``Kernel.causal_support``, e.g. ``ALiBiKernel(causal=True)``): a merged node would carry a
    later token into an earlier one. Checked at run time, since ``with_kernel`` may install
    such a kernel after the merging was set."""
    for theta in controls:
        for name, op in theta.items():
            kernel = op.kernel if isinstance(op, AttentionOperator) else None
            if kernel is not None and kernel.causal_support:
                raise ValueError(f"token merging {merging}: the kernel of {name!r} "
                                 f"({type(kernel).__name__}) has a causal support of its own "
                                 "(x' <= x): a merged node would carry a later token's state "
                                 "into an earlier one; refused")


def _check_merging(merging: TokenMerging, scheme: Scheme, controls: Controls, adjoint: Adjoint,
                   grid: TimeGrid) -> None:
    """ValueError, naming what, where ``merging`` cannot run in this evolution: the reversible
    scheme (its doubled state) and a scheme with a step of its own (no stages to place the
    merge among), the checkpoint and reversible adjoints (they recompute or invert a step from
    its start, where the grid was finer), a kernel with a causal support of its own, CvT's
    convolutional attention (a regular 2-D grid), a scheme without a top-level attention
    stage where one is needed (the keys, or where="attention"), a state saved before the merge
    for a relaxation after it, and a schedule whose length is not the number of unit intervals
    of [0, T]."""
    what = f"token merging {merging}"
    if merging.active:  # at the forward too: with_kernel may install such a kernel later
        _refuse_causal_kernels(controls, merging)
    if isinstance(scheme, ReversibleScheme) or type(scheme.plan(controls[0], 1.0)) is not Plan:
        raise ValueError(f"{what}: scheme {scheme.name!r} [{scheme}] runs a step of its own "
                         "(the reversible scheme's doubled state, or an overridden step), with "
                         "no stages to place a merge among; refused")
    if adjoint.name in ("checkpoint", "reversible"):
        raise ValueError(f"{what}: adjoint {adjoint.name!r} recomputes or inverts each step "
                         "from its start, where the grid was finer than the merge leaves it; "
                         "refused (use adjoint 'backprop')")
    for theta in controls:
        for name, op in theta.items():
            if isinstance(op, Operator) and op.needs_regular_grid:
                raise ValueError(f"{what}: {name!r} ({type(op).__name__}) needs the regular "
                                 "token grid (convolutions in x, as CvT's Q/K/V); refused")
    at = attention_stage(scheme, controls[0])
    if at is None and (merging.reads_keys or merging.where == "attention"):
        raise ValueError(f"{what} (where={merging.where!r}): scheme {scheme.name!r} "
                         f"[{scheme}] has no top-level stage with an attention field to read "
                         "the keys of or to merge after; use where='step', metric='state'")
    if merging.where == "attention":
        saved = [str(st) for st in scheme.stages[:at + 1] if st.save]
        if saved:
            raise ValueError(f"{what}: stages {saved} save a state before the merge on the "
                             "finer grid, which a relaxation after it cannot read; use "
                             "where='step'")
    merging.check_intervals(grid.T)


def _step_indices(indices, n: int, what: str) -> set[int]:
    """Distinct step indices in [0, n) (ints, not bools; a single int is one index)."""
    if isinstance(indices, numbers.Integral) and not isinstance(indices, bool):
        indices = [indices]
    try:
        items = list(indices)
    except TypeError:
        raise TypeError(f"{what}: expected step indices (ints in [0, {n})), got "
                        f"{type(indices).__name__}") from None
    out: set[int] = set()
    for i in items:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"{what}: step indices must be ints, got {type(i).__name__} {i!r}")
        if not 0 <= int(i) < n:
            raise ValueError(f"{what}: step index {int(i)} is outside [0, {n})")
        if int(i) in out:
            raise ValueError(f"{what}: step index {int(i)} is given twice")
        out.add(int(i))
    return out


def _parallel_groups(groups, n: int) -> list[tuple[int, ...]]:
    """``groups`` checked: disjoint runs of at least two consecutive step indices in [0, n)."""
    what = "parallel_steps(groups)"
    if isinstance(groups, (str, bytes)) or isinstance(groups, numbers.Integral):
        raise TypeError(f"{what}: expected a sequence of groups of step indices, e.g. "
                        f"[(1, 2, 3)], got {type(groups).__name__} {groups!r}")
    try:
        items = list(groups)
    except TypeError:
        raise TypeError(f"{what}: expected a sequence of groups of step indices, got "
                        f"{type(groups).__name__}") from None
    if not items:
        raise ValueError(f"{what}: no group given; each group is at least two consecutive "
                         "steps")
    seen: set[int] = set()
    out: list[tuple[int, ...]] = []
    for g in items:
        if isinstance(g, numbers.Integral):
            raise TypeError(f"{what}: each group is a sequence of step indices, got the int "
                            f"{g!r} (write [(1, 2, 3)], not [1, 2, 3])")
        idx = sorted(_step_indices(g, n, what))
        if len(idx) < 2 or idx != list(range(idx[0], idx[0] + len(idx))):
            raise ValueError(f"{what}: a group is at least two consecutive steps, got {idx}")
        if seen & set(idx):
            raise ValueError(f"{what}: step {min(seen & set(idx))} is in two groups")
        seen |= set(idx)
        out.append(tuple(idx))
    return out


def _check_layer_scheme(scheme: Scheme) -> None:
    """ValueError naming the stage unless every step of ``scheme`` is an ordinary layer: a
    stage list whose fields are each one explicit Euler substep over the whole step."""
    if type(scheme) is not Scheme:
        raise ValueError(f"as_network: the scheme {scheme.name!r} has a step of its own; "
                         "only a stage list of fields, projections and maps is a layer")
    for st in scheme.stages:
        if st.kind in ("project", "map"):
            continue
        if st.kind != "field" or st.integrator != "euler" or st.fraction != 1.0 \
                or st.tangent is not None or st.then:
            raise ValueError(f"as_network: stage {str(st)!r} of scheme {scheme.name!r} is "
                             "not one explicit Euler substep over the whole step; only "
                             "such steps (Lie, pre-norm) are ordinary layers")
