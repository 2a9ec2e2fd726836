"""Splitting schemes as data: an ordered list of stages applied once per time step.

A ``Stage`` names an operator of the control set theta^n and says, by its ``kind``, how to
apply it:

    kind "field":     u <- u + h F(u)  (integrator "euler"; "heun"/"rk2", "rk4"), h = fraction*tau
    kind "project":   u <- P(u)        (exact, independent of tau)
    kind "map":       u <- s(u)        (a pointwise map applied as is)
    kind "relax":     u <- w u + (1 - w) u_saved  (averaging with a saved state)
    kind "parallel":  u <- mean_i Phi_i(u), Phi_i a branch (a tuple of stages)

A field stage's operator "a+b" means the sum of fields F_a + F_b (an unsplit stage). ``tangent``
names a projection P whose tangent space the field is projected onto inside the integrator: the
update integrates Pi_T(v) F(v) (the projection method, docs/math.md 3.5) instead of the raw F.

``pre`` composes operators inside the field: F(P(u)) for pre-norm, where the projection enters
the vector field instead of being a substep (docs/math.md 3.2). ``post`` composes after it:
D(F(u)), e.g. LayerScale D = diag(gamma(y)), read as a per-feature step size
tau(y) = tau gamma(y). ``then`` applies projections to the result within the same substep
(ReLU(u + h(W u + b)) in the paper's FFN substeps). ``pre``, ``post`` and ``then`` are tuples
of operator names; a single name given as a str is read as a 1-tuple (``pre="norm1"`` is
``pre=("norm1",)``). ``save`` keeps the state after the stage
under a name for a later relaxation; only a top-level stage can save (a stage inside a parallel
branch cannot: the branches run on copies of u, so a state saved there would belong to one
branch only). ``fraction`` is a number in (0, MAX_FRACTION], MAX_FRACTION = 1e3: the substep
size is h = fraction * tau.

Schemes are values: build one from stages, from a short string, or by name. The string form is
a whitespace- or comma-separated list of tokens

    [pre>]operator[<post][:integrator|:project|:map][*fraction][~tangent][|then][@save]
    relax(saved[,weight])          parallel(stages | stages | ...)

where the ':suffix' is one of ``SUFFIXES`` (the integrators euler, heun, rk2, rk4, and project,
map).

e.g. the post-LN Lie scheme is "attention norm1:project ffn norm2:project" and pre-LN is
"norm1>attention norm2>ffn".

Named schemes are built on a *layout*: the fields of a family, each with the operators around
it and the projection after it (``Field``). A family declares its layout once, next to its
controls; ``SCHEMES`` maps every name to a builder ``(layout, **options) -> Scheme``, and
``resolve`` is the one way in. "prenorm" is a layout transform (each field's projection moves
inside it) followed by Lie.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..operators.base import Context, Operator
from .integrators import INTEGRATORS

__all__ = [
    "FORMS",
    "Field",
    "KINDS",
    "MAX_FRACTION",
    "POST_LN",
    "PRE_LN",
    "SCHEMES",
    "SUFFIXES",
    "Scheme",
    "Stage",
    "layout_of",
    "lie",
    "paper_lie",
    "parallel",
    "pre_norm_layout",
    "prenorm",
    "resolve",
    "scheme_from_string",
    "scheme_names",
    "strang",
    "unsplit",
]

KINDS = ("field", "project", "map", "relax", "parallel")
FORMS = ("raw", "tangent")  # substep forms: integrate F, or its tangential part Pi_T F
MAX_FRACTION = 1e3  # the largest fraction of tau a stage may take (h = fraction * tau)
# every ':suffix' of the string form: an integrator (a field stage) or a non-field kind
SUFFIXES = (*INTEGRATORS, "project", "map")
_NAME = re.compile(r"^[A-Za-z_][\w.]*$")
# which operator kinds (operators.base.OPERATOR_KINDS) each stage kind may apply
_FITS = {"field": ("field",), "project": ("projection",), "map": ("map", "projection")}
_AROUND = ("projection", "map")  # kinds allowed in pre / post / then


def _names(value, what: str) -> tuple[str, ...]:
    """A tuple of operator names from a tuple (or list) of them, or from one name as a str."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a tuple of operator names (or one name as a str), "
                        f"got {type(value).__name__} {value!r}")
    return tuple(value)


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what} must be an operator name (letters, digits, _ and .), got "
                         f"{name!r}")


@dataclass(frozen=True)
class Stage:
    """One substep: which operator, what kind of update, and (for fields) which integrator
    and which fraction of tau."""

    operator: str
    kind: str = "field"
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
        if not isinstance(self.operator, str):
            raise TypeError(f"Stage.operator must be a str (an operator name, 'a+b' for a sum of "
                            f"fields, or the saved state of a relax), got "
                            f"{type(self.operator).__name__} {self.operator!r}")
        if self.kind not in KINDS:
            hint = (f" ({self.kind!r} is an integrator: write Stage(operator, "
                    f"integrator={self.kind!r}))" if self.kind in INTEGRATORS else "")
            raise ValueError(f"Stage.kind must be one of {KINDS}, got {self.kind!r}{hint}; "
                             f"integrators: {tuple(INTEGRATORS)}")
        if self.integrator not in INTEGRATORS:
            raise ValueError(f"Stage.integrator must be one of {tuple(INTEGRATORS)}, got "
                             f"{self.integrator!r} (projections and maps: kind='project' or "
                             "kind='map')")
        for name in ("pre", "post", "then"):
            object.__setattr__(self, name, _names(getattr(self, name), f"Stage.{name}"))
        if isinstance(self.branches, (str, bytes)) or not isinstance(self.branches, Iterable):
            raise TypeError(f"Stage.branches must be a tuple of branches (tuples of Stage "
                            f"values), got {type(self.branches).__name__}")
        for b in self.branches:
            if isinstance(b, (Stage, str, bytes)) or not isinstance(b, Iterable):
                raise TypeError(f"Stage.branches must hold branches, each a tuple of Stage "
                                f"values, got a {type(b).__name__} (one stage st is the branch "
                                "(st,))")
        object.__setattr__(self, "branches", tuple(tuple(b) for b in self.branches))
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (
                math.isfinite(f) and 0 < f <= MAX_FRACTION):
            raise ValueError(f"Stage.fraction must be a number > 0 and <= {MAX_FRACTION:g} (a "
                             f"fraction of tau; h = fraction * tau), got {f!r}")
        if self.kind != "field":
            self._check_not_field()
        if self.kind == "parallel":
            if not self.branches or not all(self.branches):
                raise ValueError("a parallel Stage needs at least one branch, and every branch "
                                 "at least one stage (an empty branch is the identity)")
            for b in self.branches:
                for st in b:
                    if not isinstance(st, Stage):
                        raise TypeError(f"parallel branches hold Stage values, got "
                                        f"{type(st).__name__}")
            for st in _flat(tuple(x for b in self.branches for x in b)):
                if st.save:
                    raise ValueError(
                        f"stage '{st}' inside a parallel stage saves its state as "
                        f"{st.save!r}: a parallel branch cannot save (the branches run on "
                        "copies of u, so the state would belong to one branch only); put "
                        "the @save on a stage before or after the parallel one")
        elif self.branches:
            raise ValueError(f"only a parallel Stage has branches (kind={self.kind!r})")
        if self.kind == "relax":
            w = self.weight
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0:
                raise ValueError(f"Stage.weight must be in [0, 1], got {self.weight!r}")
            _check_name(self.operator, "relax(saved): the saved state")
        elif self.kind != "parallel":
            for op in self.fields():
                _check_name(op, "Stage.operator")
        for name in (*self.pre, *self.post, *self.then, *([self.tangent] if self.tangent else [])):
            _check_name(name, "a pre/post/then/tangent operator")
        if self.save is not None:
            _check_name(self.save, "Stage.save")

    def _check_not_field(self) -> None:
        wrong = [n for n, v in (("integrator", self.integrator != "euler"),
                                ("fraction", self.fraction != 1.0),
                                ("tangent", self.tangent is not None),
                                ("pre", bool(self.pre)), ("post", bool(self.post)))
                 if v]
        if wrong:
            raise ValueError(f"Stage {self.operator!r} of kind {self.kind!r}: {wrong} apply to "
                             "field stages only (a projection or map does not depend on tau)")

    def fields(self) -> list[str]:
        """The operator names summed in this stage's field ("a+b" -> ["a", "b"])."""
        return self.operator.split("+") if self.kind == "field" else [self.operator]

    def __str__(self) -> str:
        if self.kind == "relax":
            return f"relax({self.operator},{self.weight:g})"
        if self.kind == "parallel":
            return "parallel(" + " | ".join(" ".join(str(t) for t in b)
                                            for b in self.branches) + ")"
        s = ">".join(self.pre) + ">" if self.pre else ""
        s += self.operator
        if self.post:
            s += "<" + "<".join(self.post)
        if self.kind != "field":
            s += f":{self.kind}"
        elif self.integrator != "euler":
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
        if isinstance(self.stages, (str, bytes)) or not isinstance(self.stages, Iterable):
            raise TypeError(f"Scheme.stages must be a sequence of Stage values, got "
                            f"{type(self.stages).__name__}")
        stages = tuple(self.stages)
        if not stages:
            raise ValueError("a Scheme needs at least one stage")
        object.__setattr__(self, "stages", stages)
        saved: set[str] = set()
        for st in stages:
            if not isinstance(st, Stage):
                raise TypeError(f"Scheme.stages must hold Stage values, got {type(st).__name__}")
            for sub in _flat((st,)):  # a relax inside a parallel branch reads the same states
                if sub.kind == "relax" and sub.operator not in saved:
                    raise ValueError(f"relax({sub.operator}) refers to a state no earlier stage "
                                     "saves")
            if st.save:
                saved.add(st.save)

    def __str__(self) -> str:
        return " ".join(str(s) for s in self.stages)

    def __deepcopy__(self, memo) -> Scheme:
        return self  # an immutable value: copies of a model share it

    def operators(self) -> list[str]:
        """Every operator name the scheme reads from a control set."""
        out: list[str] = []
        for st in _flat(self.stages):
            if st.kind in ("relax", "parallel"):
                continue
            for n in [*st.pre, *st.fields(), *st.post, *st.then, *filter(None, [st.tangent])]:
                if n not in out:
                    out.append(n)
        return out

    def check_controls(self, theta: Mapping[str, nn.Module]) -> None:
        """Every operator the scheme names is in theta, is an ``Operator``, and its kind fits
        the stage that applies it (a field for an integrator, a projection for ``project`` and
        for ``tangent``, a projection or map around a field)."""
        missing = [n for n in self.operators() if n not in theta]
        if missing:
            raise ValueError(
                f"scheme {self.name!r} needs operators {missing} that the controls do not have "
                f"(they have {list(theta.keys())})"
            )
        for st in _flat(self.stages):
            if st.kind in ("relax", "parallel"):
                continue
            for n in st.fields():
                _fits(theta[n], n, st, _FITS[st.kind], "")
            for n in (*st.pre, *st.post, *st.then):
                _fits(theta[n], n, st, _AROUND, " around a field")
            if st.tangent:
                _fits(theta[st.tangent], st.tangent, st, ("projection",), " as its tangent")
                if not theta[st.tangent].has_tangent:
                    raise ValueError(f"stage '{st}': {st.tangent!r} "
                                     f"({type(theta[st.tangent]).__name__}) has no tangent "
                                     "space projection; use form='raw'")
            if st.kind == "field" and st.integrator != "euler" and any(
                    theta[n].changes_width for n in st.fields()):
                raise ValueError(f"stage '{st}': integrator {st.integrator!r} needs a field "
                                 "that keeps the feature width")

    def step(
        self,
        u: torch.Tensor,
        theta: Mapping[str, nn.Module],
        tau: float,
        context: Context | None = None,
        observe: Callable[[torch.Tensor, int], None] | None = None,
    ) -> torch.Tensor:
        """Advance u by one step of size tau with the controls theta; ``observe(u, j)`` sees
        the state after every substep j (validation, saving substeps)."""
        saved: dict[str, torch.Tensor] = {}
        for j, st in enumerate(self.stages):
            u = _apply(st, u, theta, tau, context, saved)
            if st.save:
                saved[st.save] = u
            if observe is not None:
                observe(u, j)
        return u


def _fits(op, name: str, st: Stage, kinds: tuple[str, ...], role: str) -> None:
    if not isinstance(op, Operator):
        raise TypeError(f"stage '{st}': {name!r} is a {type(op).__name__}, not a splitformer "
                        "Operator (subclass splitformer.operators.Operator and set its kind)")
    if op.kind not in kinds:
        raise ValueError(f"stage '{st}' applies {name!r} ({type(op).__name__}, kind "
                         f"{op.kind!r}){role}, which needs an operator of kind "
                         f"{' or '.join(map(repr, kinds))}")


def _apply(st: Stage, u, theta, tau, context, saved):
    return _compose(st.then, _advance(st, u, theta, tau, context, saved), theta, context)


def _advance(st: Stage, u, theta, tau, context, saved):
    kind = st.kind
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
    if kind != "field":  # project, map: applied exactly
        return theta[st.operator](u, context)
    ops = [theta[n] for n in st.fields()]

    def field(v):  # post(sum_i F_i(pre(v)))
        w = _compose(st.pre, v, theta, context)
        out = ops[0](w, context)
        for o in ops[1:]:
            out = out + o(w, context)
        return _compose(st.post, out, theta, context)

    f = field
    if st.tangent:
        proj = theta[st.tangent]

        def f(v):
            return proj.tangent(v, field(v))
    embed = ops[0].embed if ops[0].changes_width else None
    return INTEGRATORS[st.integrator](f, u, st.fraction * tau, embed)


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


# -- the string form -----------------------------------------------------------------------
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
        if depth < 0:
            raise ValueError(f"unbalanced ')' in scheme string {text!r}")
        cur += ch
    if depth:
        raise ValueError(f"unbalanced '(' in scheme string {text!r}")
    if cur:
        out.append(cur)
    return out


def _token_stage(tok: str, text: str) -> Stage:
    m = _TOKEN.match(tok)
    if not m:
        raise ValueError(f"cannot parse scheme token {tok!r} in {text!r}")
    slot = m["int"] or "euler"
    if slot not in SUFFIXES:
        raise ValueError(f"unknown ':{slot}' in scheme token {tok!r} of {text!r}: the suffix "
                         f"must be one of {', '.join(SUFFIXES)} (an integrator, or project / "
                         "map)")
    kind, integrator = (slot, "euler") if slot in ("project", "map") else ("field", slot)
    try:
        fraction = float(m["frac"]) if m["frac"] else 1.0
    except ValueError:
        raise ValueError(f"Stage.fraction must be a number > 0 and finite (a fraction of tau), "
                         f"got {m['frac']!r} in {tok!r}") from None
    return Stage(
        m["op"], kind, integrator, fraction,
        pre=tuple(m["pre"].split(">")) if m["pre"] else (),
        post=tuple(m["post"].split("<")) if m["post"] else (),
        then=tuple(m["then"].split("|")) if m["then"] else (),
        save=m["save"], tangent=m["tan"],
    )


def _parse_stages(text: str) -> list[Stage]:
    stages = []
    for tok in _tokens(text.strip()):
        if tok.startswith("parallel(") and tok.endswith(")"):
            # branches are separated by " | " (a bare "|" inside a token is a `then` projection)
            inner = tok[len("parallel("):-1]
            branches = [b for b in re.split(r"\s+\|\s+", inner)]
            stages.append(Stage("parallel", "parallel",
                                branches=tuple(tuple(_parse_stages(b)) for b in branches)))
            continue
        m = _RELAX.match(tok)
        if m:
            try:
                weight = float(m["w"] or 0.5)
            except ValueError:
                raise ValueError(f"Stage.weight must be in [0, 1], got {m['w']!r} in "
                                 f"{tok!r}") from None
            stages.append(Stage(m["ref"], "relax", weight=weight))
            continue
        stages.append(_token_stage(tok, text))
    return stages


def scheme_from_string(text: str, name: str = "custom") -> Scheme:
    """Parse the short string form (see the module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"a scheme string must be a str, got {type(text).__name__}")
    return Scheme(tuple(_parse_stages(text)), name=name)


# -- layouts and named schemes ---------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """One term of a layout: a field operator, what composes around it, the projection after."""

    operator: str
    pre: tuple[str, ...] = ()
    post: tuple[str, ...] = ()
    projection: str | None = None


Layout = tuple[Field, ...]
POST_LN: Layout = (Field("attention", projection="norm1"), Field("ffn", projection="norm2"))
PRE_LN: Layout = (Field("attention", pre=("norm1",)), Field("ffn", pre=("norm2",)))


def pre_norm_layout(layout: Layout) -> Layout:
    """The layout transform of pre-norm: each field's projection moves inside it,
    P(u + tau F(u)) -> u + tau F(P u) (docs/math.md 3.2). Idempotent."""
    return tuple(Field(f.operator, (f.projection,) if f.projection else f.pre, f.post, None)
                 for f in layout)


def layout_of(scheme: Scheme) -> Layout:
    """The fields of a scheme: ``scheme.meta["layout"]`` when the scheme was built from one
    (every named scheme is), else read off a Lie-type stage list (each field stage, and the
    projection right after it)."""
    if scheme.meta.get("layout"):
        return tuple(scheme.meta["layout"])
    fields: list[Field] = []
    stages = list(scheme.stages)
    for j, st in enumerate(stages):
        if st.kind == "field":
            if st.then or st.save or "+" in st.operator:
                fields = []  # not a plain layout (the paper's literal scheme, sums): none
                break
            proj = None
            if j + 1 < len(stages) and stages[j + 1].kind == "project":
                proj = stages[j + 1].operator
            if any(f.operator == st.operator for f in fields):
                continue
            fields.append(Field(st.operator, st.pre, st.post, proj))
        elif st.kind in ("relax", "map"):
            fields = []
            break
    if not fields:
        raise ValueError(
            f"scheme {scheme.name!r} has no plain field layout to rebuild named schemes from "
            "(write the new scheme as stages or a string instead)"
        )
    return tuple(fields)


def _field_stage(f: Field, integrator: str, fraction: float, form: str) -> list[Stage]:
    if form == "tangent" and f.projection is None:
        raise ValueError(f"form='tangent' needs a projection after field {f.operator!r}; this "
                         "layout has the projection inside the field (pre-norm)")
    out = [Stage(f.operator, "field", integrator, fraction, pre=f.pre, post=f.post,
                 tangent=f.projection if form == "tangent" else None)]
    if f.projection:
        out.append(Stage(f.projection, "project"))
    return out


def _check_options(integrator: str, form: str) -> None:
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator must be one of {tuple(INTEGRATORS)}, got {integrator!r}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")


def _named(stages, name, description, order, integrator, form, layout) -> Scheme:
    return Scheme(tuple(stages), name=name, description=description, order=order,
                  meta={"integrator": integrator, "form": form, "layout": tuple(layout)})


def lie(layout: Layout = POST_LN, integrator: str = "euler", form: str = "raw") -> Scheme:
    """Lie splitting: each field in turn over the full step, each followed by its projection.

    Post-LN layout, explicit Euler, raw form: u += tau A(u); P1; u += tau G(u); P2 (the post-LN
    encoder at tau = 1). First order.
    """
    _check_options(integrator, form)
    stages = [st for f in layout for st in _field_stage(f, integrator, 1.0, form)]
    return _named(stages, "lie", "Lie splitting: fields in turn, each over the full step", 1,
                  integrator, form, layout)


def prenorm(layout: Layout = POST_LN, integrator: str = "euler", form: str = "raw") -> Scheme:
    """Pre-norm: Lie on ``pre_norm_layout(layout)``, explicit Euler for u_t = A(P1 u) + G(P2 u)
    split in two on the default layout (docs/math.md 3.2). No projection substeps, so the only
    form is "raw"."""
    if form != "raw":
        raise ValueError("prenorm has no projection substeps: form must be 'raw'")
    s = lie(pre_norm_layout(layout), integrator)
    return _named(s.stages, "prenorm", "Lie splitting with each projection inside its field: "
                  "u += tau F(P u)", 1, integrator, form, s.meta["layout"])


def strang(layout: Layout = POST_LN, integrator: str = "heun", form: str = "raw") -> Scheme:
    """Strang (symmetric) splitting: the last field over tau/2, ..., the first over tau, ...,
    the last over tau/2. Two fields (attention A, FFN G): G/2, A, G/2 -- Macaron's layout.
    Second order for the unprojected ODE with second-order substeps; with projections, second
    order only in the tangent form (docs/math.md 3.5)."""
    _check_options(integrator, form)
    first, rest = layout[0], list(layout[1:])
    stages: list[Stage] = []
    for f in reversed(rest):
        stages += _field_stage(f, integrator, 0.5, form)
    stages += _field_stage(first, integrator, 1.0, form)
    for f in rest:
        stages += _field_stage(f, integrator, 0.5, form)
    return _named(stages, "strang", "Strang splitting: symmetric half steps around the first "
                  "field", 2, integrator, form, layout)


def parallel(layout: Layout = POST_LN, integrator: str = "euler", form: str = "raw") -> Scheme:
    """Parallel (additive) splitting, Tai-Glowinski: with m fields,

        u <- P( (1/m) sum_i Phi_i(u) ),   Phi_i = field i over m tau (then its projection),

    P the last field's projection (post-LN layouts). First order; the branches are independent.
    """
    _check_options(integrator, form)
    m = len(layout)
    branches = tuple(tuple(_field_stage(f, integrator, float(m), form)) for f in layout)
    stages = [Stage("parallel", "parallel", branches=branches)]
    if layout[-1].projection:
        stages.append(Stage(layout[-1].projection, "project"))
    return _named(stages, "parallel", "parallel splitting: average of the fields over m tau "
                  "each", 1, integrator, form, layout)


def unsplit(layout: Layout = POST_LN, integrator: str = "rk4", form: str = "tangent") -> Scheme:
    """No splitting: the sum of all fields in one stage, then the (common) projection.

    With form="tangent" and RK4 this integrates the projected ODE u_t = Pi_T(u)(A + G)(u) to
    fourth order (used as the reference of convergence studies). Needs fields without pre/post
    operators, so pre-norm layouts (ViT, GPT-2, pre-LN encoders) are refused.
    """
    _check_options(integrator, form)
    if any(f.pre or f.post for f in layout):
        raise ValueError("unsplit needs fields without pre/post operators (a pre-norm layout "
                         "puts its projections inside the fields)")
    proj = layout[-1].projection
    if form == "tangent" and proj is None:
        raise ValueError("unsplit with form='tangent' needs a projection after the last field")
    ops = "+".join(f.operator for f in layout)
    stages = [Stage(ops, "field", integrator, tangent=proj if form == "tangent" else None)]
    if proj:
        stages.append(Stage(proj, "project"))
    return _named(stages, "unsplit", "the full field in one stage", None, integrator, form,
                  layout)


def paper_lie(num_ffn_stages: int = 2) -> Scheme:
    """The paper's literal Lie scheme with M = 4 + J substeps (docs/math.md section 2).

    Operators: attention, norm1, ffn1..ffnJ (weights in the (I + W_j) form), relu, norm2.
    """
    J = num_ffn_stages
    if isinstance(J, bool) or not isinstance(J, int) or J < 1:
        raise ValueError(f"num_ffn_stages must be an int >= 1, got {J!r}")
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


def _paper(layout: Layout | None = None, num_ffn_stages: int = 2) -> Scheme:
    """Registry entry of "paper": its own operators (ffn1..ffnJ, relu), no layout."""
    return paper_lie(num_ffn_stages)


# name -> builder(layout, **options); every entry is a value users and the CLI can name
SCHEMES: dict[str, Callable[..., Scheme]] = {
    "lie": lie,
    "prenorm": prenorm,
    "strang": strang,
    "parallel": parallel,
    "unsplit": unsplit,
    "paper": _paper,
}


def scheme_names() -> list[str]:
    """Every name ``resolve`` accepts (the registry the CLI and the tests read)."""
    return sorted(SCHEMES)


def _options_of(builder: Callable[..., Scheme]) -> tuple[str, ...]:
    code = builder.__code__
    return code.co_varnames[1:code.co_argcount]


def resolve(
    scheme: str | Scheme | Iterable[Stage],
    layout: Layout | None = None,
    **options,
) -> Scheme:
    """A Scheme from a Scheme, a name (built on ``layout``, default post-LN; options:
    integrator, form), a string form or a list of stages."""
    if isinstance(scheme, str):
        text = scheme.strip()
        if text in SCHEMES:
            builder = SCHEMES[text]
            bad = sorted(set(options) - set(_options_of(builder)))
            if bad:
                raise ValueError(f"scheme {text!r} takes the options "
                                 f"{list(_options_of(builder))}, got {bad}")
            return builder(layout if layout is not None else POST_LN, **options)
        if options:
            raise ValueError(f"options {sorted(options)} apply to named schemes only "
                             f"({scheme_names()}); {scheme!r} is not one of them")
        if not any(c in text for c in " ,:>(~|*@<+") and not (
                layout is not None and text in {f.operator for f in layout}):
            raise ValueError(f"unknown scheme {scheme!r}; named schemes: {scheme_names()} (or "
                             "a scheme string such as 'attention norm1:project ffn "
                             "norm2:project')")
        return scheme_from_string(text)
    if options:
        raise ValueError(f"options {sorted(options)} apply to named schemes only "
                         f"({scheme_names()}), not to a {type(scheme).__name__}")
    if isinstance(scheme, Scheme):
        return scheme
    if scheme is None or isinstance(scheme, (bytes, Stage)) or not isinstance(scheme, Iterable):
        raise TypeError(f"scheme must be a name ({scheme_names()}), a scheme string, a Scheme "
                        f"or a list of Stage values, got {scheme!r}")
    return Scheme(tuple(scheme))
