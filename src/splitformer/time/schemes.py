"""Splitting schemes as data: an ordered list of stages applied once per time step.

A ``Stage`` names an operator of the control set theta^n and says how to apply it:

    integrator "euler" | "heun" | "rk4":  u <- u + h F(u) (or the RK2/RK4 update), h = fraction*tau
    integrator "project":                 u <- P(u)        (exact, independent of tau)
    integrator "map":                     u <- s(u)        (a pointwise map applied as is)
    integrator "relax":                   u <- w u + (1 - w) u_saved  (averaging with a saved state)

``pre`` composes operators inside the field: F(P(u)) for pre-norm, where the projection enters
the vector field instead of being a substep (MATH.md 3.2). ``post`` composes after it:
D(F(u)), e.g. LayerScale D = diag(gamma(y)), read as a per-feature step size
tau(y) = tau gamma(y). ``then`` applies projections to the result within the same substep
(ReLU(u + h(W u + b)) in the paper's FFN substeps). ``save`` keeps the state after the stage
under a name for a later relaxation.

Schemes are values: build one from stages, from a short string, or by name. The string form is
a whitespace- or comma-separated list of tokens

    [pre>]operator[<post][:integrator][*fraction][|then][@save]   or   relax(saved[,weight])

e.g. the post-LN Lie scheme is "attention norm1:project ffn norm2:project" and pre-LN is
"norm1>attention norm2>ffn".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..operators.base import Context
from .integrators import INTEGRATORS

__all__ = ["Scheme", "Stage", "lie", "paper_lie", "prenorm", "scheme_from_string"]

_FIELD_INTEGRATORS = tuple(INTEGRATORS)
_KINDS = (*_FIELD_INTEGRATORS, "project", "map", "relax")


@dataclass(frozen=True)
class Stage:
    """One substep: which operator, which integrator, which fraction of tau."""

    operator: str
    integrator: str = "euler"
    fraction: float = 1.0
    pre: tuple[str, ...] = ()
    post: tuple[str, ...] = ()
    then: tuple[str, ...] = ()
    save: str | None = None
    weight: float = 0.5

    def __post_init__(self) -> None:
        if self.integrator not in _KINDS:
            raise ValueError(f"Stage.integrator must be one of {_KINDS}, got {self.integrator!r}")
        for name in ("pre", "post", "then"):
            if not isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def is_field(self) -> bool:
        return self.integrator in _FIELD_INTEGRATORS

    def __str__(self) -> str:
        if self.integrator == "relax":
            return f"relax({self.operator},{self.weight:g})"
        s = ">".join(self.pre) + ">" if self.pre else ""
        s += self.operator
        if self.post:
            s += "<" + "<".join(self.post)
        if self.integrator != "euler":
            s += f":{self.integrator}"
        if self.fraction != 1.0:
            s += f"*{self.fraction:g}"
        if self.then:
            s += "|" + "|".join(self.then)
        if self.save:
            s += f"@{self.save}"
        return s


@dataclass(frozen=True)
class Scheme:
    """An ordered tuple of stages; one application is one time step."""

    stages: tuple[Stage, ...]
    name: str = "custom"
    description: str = ""
    order: float | None = None  # formal order where known; measure it (analysis.convergence)
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        stages = tuple(self.stages)
        if not stages:
            raise ValueError("a Scheme needs at least one stage")
        object.__setattr__(self, "stages", stages)
        saved: set[str] = set()
        for st in stages:
            if not isinstance(st, Stage):
                raise TypeError(f"Scheme.stages must hold Stage values, got {type(st).__name__}")
            if st.integrator == "relax" and st.operator not in saved:
                raise ValueError(f"relax({st.operator}) refers to a state no earlier stage saves")
            if st.save:
                saved.add(st.save)

    def __str__(self) -> str:
        return " ".join(str(s) for s in self.stages)

    def operators(self) -> list[str]:
        """Every operator name the scheme reads from a control set."""
        out: list[str] = []
        for st in self.stages:
            names = [*st.pre, st.operator, *st.post, *st.then] if st.integrator != "relax" else []
            for n in names:
                if n not in out:
                    out.append(n)
        return out

    def check_controls(self, theta: Mapping[str, nn.Module]) -> None:
        missing = [n for n in self.operators() if n not in theta]
        if missing:
            raise ValueError(
                f"scheme {self.name!r} needs operators {missing} that the controls do not have "
                f"(they have {list(theta.keys())})"
            )

    def step(
        self,
        u: torch.Tensor,
        theta: Mapping[str, nn.Module],
        tau: float,
        context: Context | None = None,
        check: Callable[[torch.Tensor, int], None] | None = None,
    ) -> torch.Tensor:
        """Advance u by one step of size tau with the controls theta."""
        saved: dict[str, torch.Tensor] = {}
        for j, st in enumerate(self.stages):
            u = _apply(st, u, theta, tau, context, saved)
            if st.save:
                saved[st.save] = u
            if check is not None:
                check(u, j)
        return u


def _apply(st: Stage, u, theta, tau, context, saved):
    u = _advance(st, u, theta, tau, context, saved)
    for name in st.then:
        u = theta[name](u, context)
    return u


def _advance(st: Stage, u, theta, tau, context, saved):
    kind = st.integrator
    if kind == "relax":
        w = st.weight
        return w * u + (1.0 - w) * saved[st.operator]
    op = theta[st.operator]
    if kind == "project" or kind == "map":
        return _post(st, op(_pre(st, u, theta, context), context), theta, context)
    if st.pre or st.post:
        def f(v):
            return _post(st, op(_pre(st, v, theta, context), context), theta, context)
    else:
        def f(v):
            return op(v, context)
    return INTEGRATORS[kind](f, u, st.fraction * tau, op.embed)


def _pre(st: Stage, u, theta, context):
    for name in st.pre:
        u = theta[name](u, context)
    return u


def _post(st: Stage, u, theta, context):
    for name in st.post:
        u = theta[name](u, context)
    return u


_TOKEN = re.compile(
    r"^(?:(?P<pre>[\w.>]+)>)?(?P<op>[\w.]+)(?:<(?P<post>[\w.<]+))?(?::(?P<int>\w+))?"
    r"(?:\*(?P<frac>[0-9.eE+-]+))?(?:\|(?P<then>[\w.|]+))?(?:@(?P<save>\w+))?$"
)
_RELAX = re.compile(r"^relax\((?P<ref>\w+)(?:,(?P<w>[0-9.eE+-]+))?\)$")


def scheme_from_string(text: str, name: str = "custom") -> Scheme:
    """Parse the short string form (see the module docstring)."""
    stages = []
    for tok in re.split(r"[\s,;]+(?![^()]*\))", text.strip()):
        if not tok:
            continue
        m = _RELAX.match(tok)
        if m:
            stages.append(Stage(m["ref"], "relax", weight=float(m["w"] or 0.5)))
            continue
        m = _TOKEN.match(tok)
        if not m:
            raise ValueError(f"cannot parse scheme token {tok!r} in {text!r}")
        stages.append(
            Stage(
                m["op"],
                m["int"] or "euler",
                float(m["frac"]) if m["frac"] else 1.0,
                pre=tuple(m["pre"].split(">")) if m["pre"] else (),
                post=tuple(m["post"].split("<")) if m["post"] else (),
                then=tuple(m["then"].split("|")) if m["then"] else (),
                save=m["save"],
            )
        )
    return Scheme(tuple(stages), name=name)


def lie() -> Scheme:
    """The network's Lie scheme (post-LN): u += tau A(u); P1; u += tau G(u); P2."""
    return Scheme(
        (
            Stage("attention"),
            Stage("norm1", "project"),
            Stage("ffn"),
            Stage("norm2", "project"),
        ),
        name="lie",
        description="Lie splitting, FFN as a vector field (post-LN encoder at tau = 1)",
        order=1,
    )


def prenorm() -> Scheme:
    """Pre-LN: explicit Euler for u_t = A(P1 u) + G(P2 u), split in two (MATH.md 3.2)."""
    return Scheme(
        (Stage("attention", pre=("norm1",)), Stage("ffn", pre=("norm2",))),
        name="prenorm",
        description="Lie splitting of u_t = A(P1 u) + G(P2 u): projection inside the field",
        order=1,
    )


def paper_lie(num_ffn_stages: int = 2) -> Scheme:
    """The paper's literal Lie scheme with M = 4 + J substeps (MATH.md section 2).

    Operators: attention, norm1, ffn1..ffnJ (weights in the (I + W_j) form), relu, norm2.
    """
    J = num_ffn_stages
    if J < 1:
        raise ValueError(f"num_ffn_stages must be >= 1, got {J!r}")
    stages: list[Stage] = [Stage("attention"), Stage("norm1", "project", save="U2")]
    for j in range(1, J):
        stages.append(Stage(f"ffn{j}", then=("relu",)))
    stages += [Stage(f"ffn{J}"), Stage("U2", "relax", weight=0.5), Stage("norm2", "project")]
    return Scheme(
        tuple(stages),
        name="paper",
        description=f"the paper's literal Lie scheme, M = {4 + J} substeps (exact at tau = 1)",
        order=None,
    )


NAMED: dict[str, Callable[..., Scheme]] = {"lie": lie, "prenorm": prenorm, "paper": paper_lie}


def resolve(scheme: str | Scheme | Iterable[Stage]) -> Scheme:
    """A Scheme from a Scheme, a registered name, a string form or a list of stages."""
    if isinstance(scheme, Scheme):
        return scheme
    if isinstance(scheme, str):
        if scheme in NAMED:
            return NAMED[scheme]()
        if any(c in scheme for c in " ,:>"):
            return scheme_from_string(scheme)
        raise ValueError(f"unknown scheme {scheme!r}; named schemes: {sorted(NAMED)}")
    return Scheme(tuple(scheme))
