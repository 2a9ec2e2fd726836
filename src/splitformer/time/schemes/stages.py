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

What a scheme declares (and all an evolution asks of it, ``time.evolution``):

    lift(u0) -> state        the initial map onto the scheme's state (identity here)
    read(state) -> u         the read-out of the state (identity here)
    plan(theta, tau) -> Plan one step S_tau(theta) compiled (``time.plan.Plan``); what runs
    step(u, theta, tau)      the same step read as data: the interpreter, the plan's oracle
    layout                   its fields (``time.schemes.layouts.Field``), or None
    unused_fields(controls)  the field operators of the controls it never applies

A scheme with a state of its own (``time.schemes.reversible``: the doubled state (u, v))
overrides lift, read, plan and step; the evolution never probes for them.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ...operators.base import Context, Operator
from ..integrators import INTEGRATORS
from ..plan import Plan, StepPlan
from .layouts import Field, Layout

__all__ = [
    "FORMS",
    "KINDS",
    "MAX_FRACTION",
    "SUFFIXES",
    "Scheme",
    "Stage",
    "layout_of",
    "scheme_from_string",
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
        self._check_kind()
        for name in ("pre", "post", "then"):
            object.__setattr__(self, name, _names(getattr(self, name), f"Stage.{name}"))
        self._check_branches()
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (
                math.isfinite(f) and 0 < f <= MAX_FRACTION):
            raise ValueError(f"Stage.fraction must be a number > 0 and <= {MAX_FRACTION:g} (a "
                             f"fraction of tau; h = fraction * tau), got {f!r}")
        if self.kind != "field":
            self._check_not_field()
        if self.kind == "parallel":
            self._check_parallel()
        elif self.branches:
            raise ValueError(f"only a parallel Stage has branches (kind={self.kind!r})")
        self._check_names()

    def _check_kind(self) -> None:
        """operator is a str, kind one of KINDS, integrator one of INTEGRATORS."""
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

    def _check_branches(self) -> None:
        """branches is a tuple of branches, each an iterable of stages (made tuples here)."""
        if isinstance(self.branches, (str, bytes)) or not isinstance(self.branches, Iterable):
            raise TypeError(f"Stage.branches must be a tuple of branches (tuples of Stage "
                            f"values), got {type(self.branches).__name__}")
        for b in self.branches:
            if isinstance(b, (Stage, str, bytes)) or not isinstance(b, Iterable):
                raise TypeError(f"Stage.branches must hold branches, each a tuple of Stage "
                                f"values, got a {type(b).__name__} (one stage st is the branch "
                                "(st,))")
        object.__setattr__(self, "branches", tuple(tuple(b) for b in self.branches))

    def _check_parallel(self) -> None:
        """A parallel stage: at least one branch, none empty, Stage values only, none saving."""
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

    def _check_names(self) -> None:
        """Every operator name is a name; a relax's weight is in [0, 1]."""
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

    # -- what the scheme declares (module docstring) -------------------------------------------
    def lift(self, u0: torch.Tensor) -> torch.Tensor:
        """The initial map onto the scheme's state: u(0) itself (a scheme with a state of its
        own overrides it)."""
        return u0

    def read(self, state: torch.Tensor) -> torch.Tensor:
        """u from the scheme's state: the state itself (overridden with ``lift``)."""
        return state

    def plan(self, theta: Mapping[str, nn.Module], tau: float) -> Plan:
        """One step S_tau(theta) compiled against the control set ``theta`` (``time.plan``):
        what the evolution runs. ``plan(theta, tau)(u, context, observe)`` equals
        ``step(u, theta, tau, context, observe)``. A subclass that overrides ``step`` but
        not ``plan`` has its ``step`` run (``StepPlan``): the evolution never bypasses it."""
        if type(self).step is not Scheme.step:
            return StepPlan(self, theta, tau)
        return Plan(self, theta, tau)

    @property
    def layout(self) -> Layout | None:
        """The fields named schemes are rebuilt on: the layout the scheme was built on, or the
        one read off a Lie-type stage list; None when it has no plain layout."""
        return _read_layout(self)

    def unused_fields(self, controls: Iterable[Mapping[str, nn.Module]]) -> list[str]:
        """The names of the field operators (kind "field") of the control sets ``controls``
        that the scheme never applies, in the order they appear."""
        used = set(self.operators())
        unused: list[str] = []
        for theta in controls:
            for name, op in theta.items():
                if isinstance(op, Operator) and op.kind == "field" and name not in used \
                        and name not in unused:
                    unused.append(name)
        return unused

    def warn_unused_fields(self, controls: Iterable[Mapping[str, nn.Module]],
                           stacklevel: int = 1) -> None:
        """Warn (UserWarning) when the scheme applies none of some field operators of the
        controls (``unused_fields``): the evolution would drop those terms of the equation.
        Unused projections and maps are not reported. ``stacklevel`` as seen from the caller
        (1: the line that calls this method)."""
        unused = self.unused_fields(controls)
        if unused:
            warnings.warn(
                f"scheme {self.name!r} [{self}] leaves the field operators {unused} of the "
                "controls unused: the evolution drops those terms of the equation; name them in "
                "the scheme if they belong to it",
                UserWarning, stacklevel=stacklevel + 1,
            )

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
                                     "space projection; use form='raw' (in a scheme string: "
                                     f"the stage without '~{st.tangent}')")
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
        """Advance u by one step of size tau with the controls theta, reading the scheme as
        data (the interpreter: the oracle ``plan`` is checked against, tests/test_plan.py);
        ``observe(u, j)`` sees the state after every substep j (validation, saving substeps)."""
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



def _read_layout(scheme: Scheme) -> Layout | None:
    """The fields of a scheme: ``scheme.meta["layout"]`` when the scheme was built from one
    (every named scheme is), else read off a Lie-type stage list (each field stage, and the
    projection right after it); None when it has no plain layout."""
    if scheme.meta.get("layout"):
        return tuple(scheme.meta["layout"])
    fields: list[Field] = []
    stages = list(scheme.stages)
    for j, st in enumerate(stages):
        if st.kind == "field":
            if st.then or st.save or "+" in st.operator:
                return None  # not a plain layout (the paper's literal scheme, sums): none
            proj = None
            if j + 1 < len(stages) and stages[j + 1].kind == "project":
                proj = stages[j + 1].operator
            if any(f.operator == st.operator for f in fields):
                continue
            fields.append(Field(st.operator, st.pre, st.post, proj))
        elif st.kind in ("relax", "map"):
            return None
    return tuple(fields) if fields else None


def layout_of(scheme: Scheme) -> Layout:
    """``scheme.layout``, or ValueError when the scheme has none (named schemes need one)."""
    layout = scheme.layout
    if layout is None:
        raise ValueError(
            f"scheme {scheme.name!r} has no plain field layout to rebuild named schemes from "
            "(write the new scheme as stages or a string instead)"
        )
    return layout
