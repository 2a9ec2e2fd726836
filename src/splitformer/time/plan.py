"""A scheme compiled against one control set: the step S_tau(theta) as a list of closures.

``Scheme.step`` reads the scheme as data on every call: for each stage it looks up the operators
by name, builds the field function, picks the integrator and computes h = fraction * tau. All of
that depends only on (scheme, theta, tau), so ``Plan`` does it once and keeps, per stage, one
closure ``run(u, context, saved) -> u`` over the operators themselves:

    field      u <- then( I_h[post(sum_i F_i(pre(.)))](u) )     I the stage's integrator
               (one field, Euler, no embedding:  u <- then(u + h F(u)); at h = 1 without
               autograd, written into F(u)'s memory when the operator returns a new tensor:
               ``operators.base.returns_new``)
    project    u <- then(P(u)),   map  u <- then(s(u))
    relax      u <- w u + (1 - w) u_saved
    parallel   u <- (1/m) sum_b branch_b(u)

A plan computes exactly what ``Scheme.step`` computes (the same operations in the same order;
tests/test_plan.py checks equality for every named scheme and family) and holds its operators, so
``Plan.fits(theta)`` can tell when a control set was changed after it was built. A scheme makes
its plan (``Scheme.plan(theta, tau)``; the reversible scheme's is ``ReversiblePlan``) and the
evolution keeps one plan per control set (``Evolution.plan``) and always runs it.

Token merging (``operators.merging``) is one more closure in a step's plan: ``merge_plan``
inserts the merge at its place, after the attention substep (its input's keys read on the way
in) or at the start of the step; ``Plan.labels`` names every closure, the merge included.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import torch
from torch import nn

from ..operators.attention import AttentionOperator
from ..operators.base import Context, returns_new, tree_has_hooks
from ..operators.merging import TokenMerging, attention_keys, merge_tokens
from .controls import operator_of
from .integrators import INTEGRATORS, euler

__all__ = ["Plan", "StepPlan", "attention_stage", "merge_plan"]

Run = Callable[[torch.Tensor, Context | None, dict], torch.Tensor]


def _chain(ops: tuple[nn.Module, ...], run: Run) -> Run:
    """run, then the operators ``ops`` in order (a stage's ``then`` list)."""
    if not ops:
        return run

    def chained(u, ctx, saved):
        u = run(u, ctx, saved)
        for op in ops:
            u = op(u, ctx)
        return u
    return chained


def _writable(du: torch.Tensor, u: torch.Tensor, op: nn.Module) -> bool:
    """Whether u + h du may be written into du: no gradient is being recorded, du has u's
    dtype and shape (under autocast F(u) may be bfloat16: the sum must stay in u's dtype), and
    no hook on the operator or inside it may hold du."""
    return (not torch.is_grad_enabled() and du.dtype == u.dtype and du.shape == u.shape
            and not tree_has_hooks(op))


def _field(st, theta: Mapping[str, nn.Module], tau: float) -> Run:
    """A field stage: u <- I_h[post(sum_i F_i(pre(.)))](u), I the stage's integrator, h =
    fraction * tau, pre/post the operators around the field (a pre-norm's projection), Pi_T
    the tangent projection in the tangent form. Explicit Euler with one field is written out
    (u + h F(u), ``_euler``); everything else goes through ``time.integrators``."""
    ops = tuple(theta[n] for n in st.fields())
    pre = tuple(theta[n] for n in st.pre)
    post = tuple(theta[n] for n in st.post)
    proj = theta[st.tangent] if st.tangent else None
    integrate = INTEGRATORS[st.integrator]
    h = st.fraction * tau
    embed = ops[0].embed if ops[0].changes_width else None
    first, rest = ops[0], ops[1:]
    if integrate is euler and embed is None and proj is None and not rest:
        return _euler(first, pre, post, h)
    if not rest and not pre and not post and proj is None:
        def run(u, ctx, saved):
            return integrate(lambda v: first(v, ctx), u, h, embed)
        return run

    def run(u, ctx, saved):
        def field(v):  # post(sum_i F_i(pre(v)))
            for op in pre:
                v = op(v, ctx)
            out = first(v, ctx)
            for op in rest:
                out = out + op(v, ctx)
            for op in post:
                out = op(out, ctx)
            return out

        f = field if proj is None else (lambda v: proj.tangent(v, field(v)))
        return integrate(f, u, h, embed)
    return run


def _euler(first: nn.Module, pre: tuple[nn.Module, ...], post: tuple[nn.Module, ...],
           h: float) -> Run:
    """euler(F, u, h) = u + h F(u), F = post(F_1(pre(.))), written out; without autograd,
    written into F(u)'s memory when F(u) is new (operators.base.returns_new of the last
    operator): the same operation, the same bits."""
    last = post[-1] if post else first
    own = returns_new(last)
    if not pre and not post and h == 1.0:
        if own:
            def run(u, ctx, saved):
                du = first(u, ctx)
                if _writable(du, u, last):
                    return du.add_(u)
                return u + du
            return run

        def run(u, ctx, saved):
            return u + first(u, ctx)
        return run

    def run(u, ctx, saved):
        w = u
        for op in pre:
            w = op(w, ctx)
        du = first(w, ctx)
        for op in post:
            du = op(du, ctx)
        if h == 1.0:
            return du.add_(u) if own and _writable(du, u, last) else u + du
        return torch.add(u, du, alpha=h)  # (no out= form: forward AD, torch.func.jvp,
        # has no derivative for it, and du.mul_(h).add_(u) rounds differently)
    return run


def _stage(st, theta: Mapping[str, nn.Module], tau: float) -> Run:
    """One stage as a closure ``run(u, context, saved) -> u`` (the kinds of the module doc),
    followed by its ``then`` operators."""
    kind = st.kind
    if kind == "relax":
        w, ref = st.weight, st.operator

        def run(u, ctx, saved):
            return w * u + (1.0 - w) * saved[ref]
    elif kind == "parallel":
        branches = tuple(tuple(_stage(sub, theta, tau) for sub in b) for b in st.branches)
        m = len(branches)

        def run(u, ctx, saved):
            out = None
            for branch in branches:
                v = u
                for sub in branch:
                    v = sub(v, ctx, saved)
                out = v if out is None else out + v
            return out / m
    elif kind != "field":  # project, map: applied exactly
        op = theta[st.operator]

        def run(u, ctx, saved):
            return op(u, ctx)
    else:
        run = _field(st, theta, tau)
    return _chain(tuple(theta[n] for n in st.then), run)


class Plan:
    """S_tau(theta) for one scheme, control set and tau, compiled to closures (module doc).

    ``plan(u, context, observe)`` is ``scheme.step(u, theta, tau, context, observe)``. A
    scheme with a step of its own returns a subclass from ``Scheme.plan`` that overrides
    ``compile`` (what is built once from theta) and ``__call__`` (one step): e.g.
    ``time.schemes.reversible.ReversiblePlan``. ``fits`` and the kept operators are shared."""

    def __init__(self, scheme, theta: Mapping[str, nn.Module], tau: float) -> None:
        self.scheme = scheme
        self.tau = tau
        self.operators = tuple(theta.items())  # what it was built on (held: ids stay unique)
        self.stages = self.compile(theta)
        # what each closure is (the observer's substep labels); merge_plan adds its own
        self.labels = tuple(str(st) for st in scheme.stages)

    def compile(self, theta: Mapping[str, nn.Module]) -> tuple:
        """Per stage of the scheme: its closure ``run(u, context, saved)`` and its save name."""
        return tuple((_stage(st, theta, self.tau), st.save) for st in self.scheme.stages)

    def fits(self, theta: Mapping[str, nn.Module]) -> bool:
        """Whether ``theta`` still holds exactly the operators this plan was built on."""
        items = self.operators
        if len(theta) != len(items):
            return False
        for name, op in items:
            if name not in theta or theta[name] is not op:
                return False
        return True

    def __call__(self, u: torch.Tensor, context: Context | None = None,
                 observe: Callable[[torch.Tensor, int], None] | None = None) -> torch.Tensor:
        saved: dict[str, torch.Tensor] = {}
        for j, (run, save) in enumerate(self.stages):
            u = run(u, context, saved)
            if save:
                saved[save] = u
            if observe is not None:
                observe(u, j)
        return u


class StepPlan(Plan):
    """The plan of a scheme that defines its step by overriding ``Scheme.step`` only: each
    call runs ``scheme.step(u, theta, tau, context, observe)`` on the control set it was built
    on (nothing is compiled, so the user's step is never bypassed)."""

    def compile(self, theta: Mapping[str, nn.Module]) -> tuple:
        self.theta = theta
        return ()

    def __call__(self, u: torch.Tensor, context: Context | None = None,
                 observe: Callable[[torch.Tensor, int], None] | None = None) -> torch.Tensor:
        return self.scheme.step(u, self.theta, self.tau, context, observe)


# -- token merging: one more closure in the step -----------------------------------------------
_KEYS = "merge:keys"  # the attention input's keys, kept in the step's saved states


def attention_stage(scheme, theta: Mapping[str, nn.Module]) -> int | None:
    """The index of the first top-level stage whose field holds an attention operator (where
    a merge after the attention substep goes), or None."""
    for j, st in enumerate(scheme.stages):
        if st.kind == "field" and any(isinstance(operator_of(theta[n]), AttentionOperator)
                                      for n in st.fields()):
            return j
    return None


def _keys_of(st, theta: Mapping[str, nn.Module]) -> Callable[[torch.Tensor, Context], torch.Tensor]:
    """ToMe's metric at a stage's input u: the head-averaged keys of its attention operator at
    pre(u) (``operators.merging.attention_keys``), without gradient."""
    op = next(theta[n] for n in st.fields()
              if isinstance(operator_of(theta[n]), AttentionOperator))
    pre = tuple(theta[n] for n in st.pre)

    def keys(u, ctx):
        with torch.no_grad():
            for p in pre:
                u = p(u, ctx)
            return attention_keys(op, u, ctx)
    return keys


def merge_plan(plan: Plan, merging: TokenMerging, r: int, step: int,
               theta: Mapping[str, nn.Module]) -> Plan:
    """``plan`` with the merge of (at most) r nodes in step ``step`` inserted at its place:

        where="attention":  ... attention-stage  merge  ...   (the metrics that read keys,
                            "keys" and "keys+state": the keys of the attention stage's
                            input, read as it runs)
        where="step":       merge  stage_1 ... stage_m        (the keys of u at the start)

    The merge closure updates the context's grid (``operators.merging.merge_tokens``). The
    placement is checked when the evolution is built (``time.evolution``)."""
    stages, labels = list(plan.stages), list(plan.labels)
    at = attention_stage(plan.scheme, theta)
    keys = _keys_of(plan.scheme.stages[at], theta) if merging.reads_keys else None
    if merging.where == "attention":
        run, save = stages[at]
        if keys is not None:
            stages[at] = (_probed(run, keys), save)

        def merge(u, ctx, saved):
            return merge_tokens(u, ctx, r, saved.pop(_KEYS, None), step)
        position = at + 1
    else:
        def merge(u, ctx, saved):
            return merge_tokens(u, ctx, r, None if keys is None else keys(u, ctx), step)
        position = 0
    stages.insert(position, (merge, None))
    labels.insert(position, str(merging))
    new = copy.copy(plan)
    new.stages, new.labels = tuple(stages), tuple(labels)
    return new


def _probed(run: Run, keys: Callable[[torch.Tensor, Context], torch.Tensor]) -> Run:
    """``run``, keeping the keys of its input for the merge after it."""
    def probed(u, ctx, saved):
        saved[_KEYS] = keys(u, ctx)
        return run(u, ctx, saved)
    return probed
