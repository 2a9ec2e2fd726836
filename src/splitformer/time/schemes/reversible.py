"""The reversible scheme (docs/math.md 3.9): a splitting on a doubled state (u, v), the
RevNet/Reformer coupling written as a scheme with a state of its own.

With the fields F_1, ..., F_m of the layout (attention A and the FFN G for an encoder), each with
its projection *inside* it (the pre-norm reading: a projection substep cannot be inverted), one
step is

    v <- v + h_1 F_1(P_1 u);   u <- u + h_2 F_2(P_2 v);   v <- v + h_3 F_3(P_3 u);  ...

(odd fields update v from u, even fields u from v; h_j = tau). Each substep x <- x + h F(y)
leaves y unchanged, so it is inverted exactly by x <- x - h F(y) (``time.adjoints.Reversible``
rebuilds the path backwards that way). The scheme declares its own state:

    lift(f)       = (f, f)            the initial map: v(0) = u(0) = f
    read((u, v))  = (u + v) / 2       the read-out (symmetric in the two components; w(0) = f)
    plan(theta, tau)                  ``ReversiblePlan``: the coupled substeps as closures

In the limit tau -> 0 this integrates the coupled system v_t = A(P_1 u), u_t = G(P_2 v), not
the single-state equation u_t = A(P_1 u) + G(P_2 u): it is another model, on the same controls.
``form="tangent"`` integrates Pi_T(P y) F(P y) (the field's tangential part at the projected
state, docs/math.md 3.5) instead of F(P y). Every integrator gives the same substep: with y
frozen, x_t = F(y) is integrated exactly by Euler, Heun and RK4 alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ...operators.base import Context
from ..integrators import INTEGRATORS
from ..plan import Plan
from .layouts import POST_LN, Layout, pre_norm_layout
from .stages import FORMS, Scheme, Stage

__all__ = ["ReversiblePlan", "ReversibleScheme", "reversible"]

CoupledField = Callable[[torch.Tensor, Context | None], torch.Tensor]


class _CoupledStages(tuple):
    """The stages of a reversible scheme: equal only to the stages of another reversible
    scheme. The same field stages act on the doubled state here, so a check that recognises a
    network by its stages (``interop.weights.network_scheme``: pre-norm is "norm1>attention
    norm2>ffn") must not take a reversible evolution for that network."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CoupledStages) and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("reversible", tuple(self)))


def coupled_field(st: Stage, theta: Mapping[str, nn.Module]) -> CoupledField:
    """The field of stage ``st`` over the operators of theta: y -> post(sum_i F_i(pre(y))), or
    Pi_T(pre(y)) of it in the tangent form."""
    pre = tuple(theta[n] for n in st.pre)
    ops = tuple(theta[n] for n in st.fields())
    post = tuple(theta[n] for n in st.post)
    proj = theta[st.tangent] if st.tangent else None

    def field(y: torch.Tensor, context: Context | None) -> torch.Tensor:
        w = y
        for op in pre:
            w = op(w, context)
        out = None
        for op in ops:
            f = op(w, context)
            out = f if out is None else out + f
        for op in post:
            out = op(out, context)
        if proj is not None:
            out = proj.tangent(w, out)
        return out
    return field


@dataclass(frozen=True)
class ReversibleScheme(Scheme):
    """The reversible splitting on the doubled state (u, v), stacked as one tensor
    (2, B, N_x, N_y): stage j (a field stage, its projection in ``pre``) updates v for even j
    and u for odd j, x <- x + h F_j(y) (see the module docstring). ``lift(f) = (f, f)``,
    ``read((u, v)) = (u + v) / 2``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "stages", _CoupledStages(self.stages))
        for st in self.stages:
            if st.kind != "field" or st.then or st.save:
                raise ValueError(f"a reversible scheme holds field stages only (no then/save), "
                                 f"got '{st}'")
        if len(self.stages) < 2:
            raise ValueError("a reversible scheme needs at least two fields (one updates v "
                             "from u, the next u from v)")

    def __str__(self) -> str:
        return " ".join(f"{'uv'[self.target(j)]}+={st}" for j, st in enumerate(self.stages))

    @staticmethod
    def target(j: int) -> int:
        """The component stage j updates: 1 (v) for even j, 0 (u) for odd j."""
        return 1 if j % 2 == 0 else 0

    def lift(self, u0: torch.Tensor) -> torch.Tensor:
        """The initial map: (u, v)(0) = (f, f)."""
        return torch.stack((u0, u0))

    def read(self, state: torch.Tensor) -> torch.Tensor:
        """The read-out of the doubled state: (u + v) / 2 (as a mean, which saves no tensor
        for the backward pass: a checkpointed step reads substeps only in its first run)."""
        return state.mean(dim=0)

    def plan(self, theta: Mapping[str, nn.Module], tau: float) -> ReversiblePlan:
        """The step compiled: ``ReversiblePlan``."""
        return ReversiblePlan(self, theta, tau)

    def field(self, j: int, y: torch.Tensor, theta: Mapping[str, nn.Module],
              context: Context | None) -> torch.Tensor:
        """F_j(y) = post(sum_i F_i(pre(y))), or Pi_T(pre(y)) of it in the tangent form."""
        return coupled_field(self.stages[j], theta)(y, context)

    def step(self, u, theta, tau, context=None, observe=None):
        """One step read as data (the oracle of ``ReversiblePlan``)."""
        parts = list(u.unbind(0))
        for j, st in enumerate(self.stages):
            t = self.target(j)
            parts[t] = torch.add(parts[t], self.field(j, parts[1 - t], theta, context),
                                 alpha=st.fraction * tau)
            if observe is not None:
                observe(torch.stack(parts), j)
        return torch.stack(parts)


class ReversiblePlan(Plan):
    """A step of the reversible scheme compiled against one control set: per stage j, the
    component it updates, its field over the operators themselves and h_j = fraction * tau;
    ``plan(state, context, observe)`` is ``scheme.step(state, theta, tau, context, observe)``
    (the same operations in the same order)."""

    def compile(self, theta: Mapping[str, nn.Module]) -> tuple:
        scheme = self.scheme
        return tuple((scheme.target(j), coupled_field(st, theta), st.fraction * self.tau)
                     for j, st in enumerate(scheme.stages))

    def __call__(self, state: torch.Tensor, context: Context | None = None,
                 observe: Callable[[torch.Tensor, int], None] | None = None) -> torch.Tensor:
        parts = list(state.unbind(0))
        for j, (t, field, h) in enumerate(self.stages):
            parts[t] = torch.add(parts[t], field(parts[1 - t], context), alpha=h)
            if observe is not None:
                observe(torch.stack(parts), j)
        return torch.stack(parts)


def reversible(layout: Layout = POST_LN, integrator: str = "euler", form: str = "raw"
               ) -> ReversibleScheme:
    """The reversible splitting on the layout's fields, each with its projection inside it
    (``pre_norm_layout``): v += tau F_1(P_1 u), u += tau F_2(P_2 v), ... (module docstring).

    integrator: any of INTEGRATORS, all exact on x_t = F(y) with y frozen (the same scheme).
    form: "raw" (F(P y)) or "tangent" (Pi_T(P y) F(P y); needs a projection in the layout).
    """
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator must be one of {tuple(INTEGRATORS)}, got {integrator!r}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    layout = tuple(layout)
    if len(layout) < 2:
        raise ValueError(f"the reversible scheme needs at least two fields (one updates v from "
                         f"u, the next u from v); this layout has {len(layout)}")
    stages = []
    for f, g in zip(layout, pre_norm_layout(layout), strict=True):
        if form == "tangent" and f.projection is None:
            raise ValueError(f"form='tangent' needs a projection after field {f.operator!r}; "
                             "this layout has the projection inside the field (pre-norm)")
        stages.append(Stage(g.operator, "field", "euler", 1.0, pre=g.pre, post=g.post,
                            tangent=f.projection if form == "tangent" else None))
    return ReversibleScheme(
        tuple(stages), name="reversible",
        description="reversible (RevNet) splitting on (u, v): v += tau A(P u), u += tau G(P v)",
        order=1, meta={"integrator": integrator, "form": form,
                       "layout": pre_norm_layout(layout)})  # as prenorm: projections inside
