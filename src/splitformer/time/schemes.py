"""Splitting schemes as data: an ordered list of stages applied once per time step.

A ``Stage`` names an operator of the control set theta^n and says how to apply it:

    integrator "euler" | "heun" | "rk4":  u <- u + h F(u) (or the RK2/RK4 update), h = fraction*tau
    integrator "project":                 u <- P(u)        (exact, independent of tau)
    integrator "map":                     u <- s(u)        (a pointwise map applied as is)
    integrator "relax":                   u <- w u + (1 - w) u_saved  (averaging with a saved state)
    integrator "parallel":                u <- mean_i Phi_i(u), Phi_i a branch (a tuple of stages)

An operator name "a+b" means the sum of fields F_a + F_b (an unsplit stage). ``tangent`` names a
projection P whose tangent space the field is projected onto inside the integrator: the update
integrates Pi_T(v) F(v) (the projection method, docs/math.md 3.5) instead of the raw field F.

``pre`` composes operators inside the field: F(P(u)) for pre-norm, where the projection enters
the vector field instead of being a substep (docs/math.md 3.2). ``post`` composes after it:
D(F(u)), e.g. LayerScale D = diag(gamma(y)), read as a per-feature step size
tau(y) = tau gamma(y). ``then`` applies projections to the result within the same substep
(ReLU(u + h(W u + b)) in the paper's FFN substeps). ``save`` keeps the state after the stage
under a name for a later relaxation.

Schemes are values: build one from stages, from a short string, or by name. The string form is
a whitespace- or comma-separated list of tokens

    [pre>]operator[<post][:integrator][*fraction][~tangent][|then][@save]
    relax(saved[,weight])          parallel(stages | stages | ...)

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

__all__ = [
    "FORMS",
    "Field",
    "Scheme",
    "Stage",
    "layout_of",
    "lie",
    "paper_lie",
    "parallel",
    "prenorm",
    "resolve",
    "scheme_from_string",
    "scheme_names",
    "strang",
    "unsplit",
]

_FIELD_INTEGRATORS = tuple(INTEGRATORS)
FORMS = ("raw", "tangent")  # substep forms: integrate F, or its tangential part Pi_T F
_KINDS = (*_FIELD_INTEGRATORS, "project", "map", "relax", "parallel")


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
    tangent: str | None = None
    branches: tuple[tuple[Stage, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.integrator not in _KINDS:
            raise ValueError(f"Stage.integrator must be one of {_KINDS}, got {self.integrator!r}")
        if not isinstance(self.operator, str) or not self.operator:
            raise ValueError(f"Stage.operator must be a non-empty str, got {self.operator!r}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) \
                or not self.fraction > 0:
            raise ValueError(f"Stage.fraction must be a number > 0 (a fraction of tau), got "
                             f"{self.fraction!r}")
        if not 0.0 <= float(self.weight) <= 1.0:
            raise ValueError(f"Stage.weight must be in [0, 1], got {self.weight!r}")
        for name in ("pre", "post", "then"):
            if not isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "branches", tuple(tuple(b) for b in self.branches))
        if self.integrator == "parallel" and len(self.branches) < 1:
            raise ValueError("a parallel Stage needs branches (tuples of stages)")
        if self.tangent is not None and self.integrator not in _FIELD_INTEGRATORS:
            raise ValueError("Stage.tangent applies to field integrators only")

    @property
    def is_field(self) -> bool:
        return self.integrator in _FIELD_INTEGRATORS

    def fields(self) -> list[str]:
        """The operator names summed in this stage's field ("a+b" -> ["a", "b"])."""
        return self.operator.split("+")

    def __str__(self) -> str:
        if self.integrator == "relax":
            return f"relax({self.operator},{self.weight:g})"
        if self.integrator == "parallel":
            return "parallel(" + " | ".join(" ".join(str(t) for t in b)
                                            for b in self.branches) + ")"
        s = ">".join(self.pre) + ">" if self.pre else ""
        s += self.operator
        if self.post:
            s += "<" + "<".join(self.post)
        if self.integrator != "euler":
            s += f":{self.integrator}"
        if self.fraction != 1.0:
            s += f"*{self.fraction:g}"
        if self.tangent:
            s += f"~{self.tangent}"
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
        for st in _flat(self.stages):
            if st.integrator in ("relax", "parallel"):
                continue
            names = [*st.pre, *st.fields(), *st.post, *st.then]
            if st.tangent:
                names.append(st.tangent)
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
    return _compose(st.then, _advance(st, u, theta, tau, context, saved), theta, context)


def _advance(st: Stage, u, theta, tau, context, saved):
    kind = st.integrator
    if kind == "relax":
        return st.weight * u + (1.0 - st.weight) * saved[st.operator]
    if kind == "parallel":
        out = None
        for branch in st.branches:
            v = u
            for sub in branch:
                v = _apply(sub, v, theta, tau, context, saved)
            out = v if out is None else out + v
        return out / len(st.branches)
    ops = [theta[n] for n in st.fields()]

    def field(v):  # post(sum_i F_i(pre(v)))
        w = _compose(st.pre, v, theta, context)
        out = ops[0](w, context)
        for o in ops[1:]:
            out = out + o(w, context)
        return _compose(st.post, out, theta, context)

    if kind == "project" or kind == "map":
        return field(u)
    f = field
    if st.tangent:
        proj = theta[st.tangent]

        def f(v):
            return proj.tangent(v, field(v))
    embed = ops[0].embed if getattr(ops[0], "changes_width", False) else None
    return INTEGRATORS[kind](f, u, st.fraction * tau, embed)


def _flat(stages):
    for st in stages:
        yield st
        for b in st.branches:
            yield from _flat(b)


def _compose(names: tuple[str, ...], u, theta, context):
    """Apply the named operators of theta in order (pre, post and then lists)."""
    for name in names:
        u = theta[name](u, context)
    return u


_TOKEN = re.compile(
    r"^(?:(?P<pre>[\w.>]+)>)?(?P<op>[\w.+]+)(?:<(?P<post>[\w.<]+))?(?::(?P<int>\w+))?"
    r"(?:\*(?P<frac>[0-9.eE+-]+))?(?:~(?P<tan>[\w.]+))?(?:\|(?P<then>[\w.|]+))?"
    r"(?:@(?P<save>\w+))?$"
)
_RELAX = re.compile(r"^relax\((?P<ref>\w+)(?:,(?P<w>[0-9.eE+-]+))?\)$")


def _tokens(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in " \t\n,;" and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur:
        out.append(cur)
    return out


def _parse_stages(text: str) -> list[Stage]:
    stages = []
    for tok in _tokens(text.strip()):
        if tok.startswith("parallel(") and tok.endswith(")"):
            # branches are separated by " | " (a bare "|" inside a token is a `then` projection)
            branches = re.split(r"\s+\|\s+", tok[len("parallel("):-1])
            stages.append(Stage("parallel", "parallel",
                                branches=tuple(tuple(_parse_stages(b)) for b in branches)))
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
                tangent=m["tan"],
            )
        )
    return stages


def scheme_from_string(text: str, name: str = "custom") -> Scheme:
    """Parse the short string form (see the module docstring)."""
    return Scheme(tuple(_parse_stages(text)), name=name)


@dataclass(frozen=True)
class Field:
    """One term of a layout: a field operator, what composes around it, the projection after."""

    operator: str
    pre: tuple[str, ...] = ()
    post: tuple[str, ...] = ()
    projection: str | None = None


POST_LN: tuple[Field, ...] = (Field("attention", projection="norm1"),
                              Field("ffn", projection="norm2"))
PRE_LN: tuple[Field, ...] = (Field("attention", pre=("norm1",)), Field("ffn", pre=("norm2",)))


def layout_of(scheme: Scheme) -> tuple[Field, ...]:
    """The fields of a scheme: ``scheme.meta["layout"]`` when the scheme was built from one
    (every named scheme is), else read off a Lie-type stage list (each field stage, and the
    projection right after it)."""
    if scheme.meta.get("layout"):
        return tuple(scheme.meta["layout"])
    fields: list[Field] = []
    stages = list(scheme.stages)
    for j, st in enumerate(stages):
        if st.integrator in _FIELD_INTEGRATORS:
            if st.then or st.save or "+" in st.operator:
                break
            proj = None
            if j + 1 < len(stages) and stages[j + 1].integrator == "project":
                proj = stages[j + 1].operator
            if any(f.operator == st.operator for f in fields):
                continue
            fields.append(Field(st.operator, st.pre, st.post, proj))
        elif st.integrator in ("relax", "map"):
            fields = []
            break
    if not fields:
        raise ValueError(
            f"scheme {scheme.name!r} has no plain field layout to rebuild named schemes from "
            "(write the new scheme as stages or a string instead)"
        )
    return tuple(fields)


def _field_stage(f: Field, integrator: str, fraction: float, form: str) -> list[Stage]:
    if form not in ("raw", "tangent"):
        raise ValueError(f"form must be 'raw' or 'tangent', got {form!r}")
    if form == "tangent" and f.projection is None:
        raise ValueError(f"form='tangent' needs a projection after field {f.operator!r}; this "
                         "layout has the projection inside the field (pre-norm)")
    out = [Stage(f.operator, integrator, fraction, pre=f.pre, post=f.post,
                 tangent=f.projection if form == "tangent" else None)]
    if f.projection:
        out.append(Stage(f.projection, "project"))
    return out


def _check_integrator(integrator: str) -> None:
    if integrator not in _FIELD_INTEGRATORS:
        raise ValueError(f"integrator must be one of {_FIELD_INTEGRATORS}, got {integrator!r}")


def lie(layout: tuple[Field, ...] = POST_LN, integrator: str = "euler",
        form: str = "raw") -> Scheme:
    """Lie splitting: each field in turn over the full step, each followed by its projection.

    Post-LN layout, explicit Euler, raw form: u += tau A(u); P1; u += tau G(u); P2 (the post-LN
    encoder at tau = 1). First order.
    """
    _check_integrator(integrator)
    stages = [st for f in layout for st in _field_stage(f, integrator, 1.0, form)]
    is_pre = all(f.projection is None and f.pre for f in layout)
    name = "prenorm" if is_pre and integrator == "euler" and layout == PRE_LN else "lie"
    return Scheme(tuple(stages), name=name,
                  description="Lie splitting: fields in turn, each over the full step",
                  order=1, meta={"integrator": integrator, "form": form, "layout": layout})


def prenorm(integrator: str = "euler", form: str = "raw") -> Scheme:
    """Pre-LN: explicit Euler for u_t = A(P1 u) + G(P2 u), split in two (docs/math.md 3.2)."""
    if form != "raw":
        raise ValueError("prenorm has no projection substeps: form must be 'raw'")
    s = lie(PRE_LN, integrator)
    return Scheme(s.stages, name="prenorm",
                  description="Lie splitting of u_t = A(P1 u) + G(P2 u): projection inside the "
                  "field", order=1, meta=s.meta)


def strang(layout: tuple[Field, ...] = POST_LN, integrator: str = "heun",
           form: str = "raw") -> Scheme:
    """Strang (symmetric) splitting: the last field over tau/2, ..., the first over tau, ...,
    the last over tau/2. Two fields (attention A, FFN G): G/2, A, G/2 -- Macaron's layout.
    Second order for the unprojected ODE with second-order substeps; with projections, second
    order only in the tangent form (docs/math.md 3.5)."""
    _check_integrator(integrator)
    first, rest = layout[0], list(layout[1:])
    stages: list[Stage] = []
    for f in reversed(rest):
        stages += _field_stage(f, integrator, 0.5, form)
    stages += _field_stage(first, integrator, 1.0, form)
    for f in rest:
        stages += _field_stage(f, integrator, 0.5, form)
    return Scheme(tuple(stages), name="strang",
                  description="Strang splitting: symmetric half steps around the first field",
                  order=2, meta={"integrator": integrator, "form": form, "layout": layout})


def parallel(layout: tuple[Field, ...] = POST_LN, integrator: str = "euler",
             form: str = "raw") -> Scheme:
    """Parallel (additive) splitting, Tai-Glowinski: with m fields,

        u <- P( (1/m) sum_i Phi_i(u) ),   Phi_i = field i over m tau (then its projection),

    P the last field's projection (post-LN layouts). First order; the branches are independent.
    """
    _check_integrator(integrator)
    m = len(layout)
    branches = tuple(tuple(_field_stage(f, integrator, float(m), form)) for f in layout)
    stages = [Stage("parallel", "parallel", branches=branches)]
    if layout[-1].projection:
        stages.append(Stage(layout[-1].projection, "project"))
    return Scheme(tuple(stages), name="parallel",
                  description="parallel splitting: average of the fields over m tau each",
                  order=1, meta={"integrator": integrator, "form": form, "layout": layout})


def unsplit(layout: tuple[Field, ...] = POST_LN, integrator: str = "rk4",
            form: str = "tangent") -> Scheme:
    """No splitting: the sum of all fields in one stage, then the (common) projection.

    With form="tangent" and RK4 this integrates the projected ODE u_t = Pi_T(u)(A + G)(u) to
    fourth order (used as the reference of convergence studies). Needs fields without pre/post.
    """
    _check_integrator(integrator)
    if any(f.pre or f.post for f in layout):
        raise ValueError("unsplit needs fields without pre/post operators")
    proj = layout[-1].projection
    ops = "+".join(f.operator for f in layout)
    stages = [Stage(ops, integrator, tangent=proj if form == "tangent" else None)]
    if proj:
        stages.append(Stage(proj, "project"))
    return Scheme(tuple(stages), name="unsplit", description="the full field in one stage",
                  order=None, meta={"integrator": integrator, "form": form, "layout": layout})


def paper_lie(num_ffn_stages: int = 2) -> Scheme:
    """The paper's literal Lie scheme with M = 4 + J substeps (docs/math.md section 2).

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


NAMED: dict[str, Callable[..., Scheme]] = {
    "lie": lie,
    "strang": strang,
    "parallel": parallel,
    "unsplit": unsplit,
}


def scheme_names() -> list[str]:
    """Every name ``resolve`` accepts (the registry the CLI and the tests read)."""
    return sorted([*NAMED, "prenorm", "paper"])


def resolve(
    scheme: str | Scheme | Iterable[Stage],
    layout: tuple[Field, ...] | None = None,
    **options,
) -> Scheme:
    """A Scheme from a Scheme, a name (built on ``layout``; options: integrator, form), a string
    form or a list of stages. "prenorm" is Lie on the pre-LN layout; "paper" the literal scheme.
    """
    if isinstance(scheme, Scheme):
        return scheme
    if isinstance(scheme, str):
        if scheme == "paper":
            return paper_lie(**options)
        if scheme == "prenorm":
            if layout is None or layout == POST_LN:
                return prenorm(**options)
            # each field's projection moves inside it: F(P u) instead of P(u + tau F(u))
            pre_layout = tuple(
                Field(f.operator, (f.projection,) if f.projection else f.pre, f.post, None)
                for f in layout
            )
            s = lie(pre_layout, **options)
            return Scheme(s.stages, name="prenorm", description=s.description, order=1,
                          meta=s.meta)
        if scheme in NAMED:
            return NAMED[scheme](layout if layout is not None else POST_LN, **options)
        if any(c in scheme for c in " ,:>(~|*@<+") or (layout is not None and scheme in
                                                       {f.operator for f in layout}):
            return scheme_from_string(scheme)
        raise ValueError(f"unknown scheme {scheme!r}; named schemes: "
                         f"{sorted([*NAMED, 'prenorm', 'paper'])}")
    return Scheme(tuple(scheme))
