"""Fitted coarse steps: what the step that absorbs a removed stretch computes (docs/math.md
3.20, docs/depth-llm.md "Methods").

A dropped grid (``Coarsening`` of ``drop_steps``) keeps some steps of the fine network; coarse
step j then covers the fine interval [p_j, p_(j+1)] of ``Coarsening.fine_points``, and where
p_(j+1) - p_j > 1 it is asked to do the work of the whole stretch: it *absorbs* the removed
steps. Which map it computes there is the choice this module makes, as a value
(``ABSORB``):

    keep      the kept step's own trained controls (plain deletion: ShortGPT, Gromov, SLEB)
    average   one step of tau = m over [p, p + m] with the average controls of the m fine
              steps it covers, m (theta^p + ... + theta^(p+m-1)) / m folded into the fields'
              output weights (``Operator.scale_``): for m = 2 the step of coarsen-linear,
              two unit steps merged into one of tau = 2 at the average controls
    linear    ReplaceMe's least-squares map (Shumitskaya et al. 2025): the absorbing step
              computes v = u + A(P1 u) and then v + M G(P2 v), M the (N_y, N_y) matrix that
              minimises the relative squared error to the teacher's u(p_(j+1)),
                  sum_x |v(x) + M g(x) - u_f(x, p_(j+1))|^2 / |u_f(x, p_(j+1))|^2,
              on calibration text (g = G(P2 v); weighted least squares in float64). M folds
              into the feature field's output weights exactly (W_d <- M W_d,
              ``Operator.compose_``), so the result is an ordinary decoder layer
    step      the absorbing step of the network's own form, started from its trained
              controls (or, ``init``, the ``average``'s, or the ``linear`` step's: its
              trained controls with ReplaceMe's map folded into W_d; that solve is not
              counted in ``budget``) and fitted by AdamW to map the teacher's u(p_j) to
              u(p_(j+1)): the relative squared error
                  mean_x |S_theta(u_f(p_j))(x) - u_f(x, p_(j+1))|^2 / |u_f(x, p_(j+1))|^2
              on cached teacher states (each token relative to its own norm: the sink
              token's norm grows far above the others'). This is multiple shooting:
              each absorbing step is fitted alone on its own interval, at the cost of one step,
              not of the network; the absorbing steps share nothing, so the budget is split
              between them

Every fit reads the teacher's states (``TeacherStates``: u_f at the grid points the absorbing
steps need, on calibration windows, computed once without gradients) and writes the absorbing
steps' controls of ``base`` in place (``base`` is the healed copy of the teacher, the
structure ``compression.store`` saves); the coarse model is still ``coarsening.apply(base)``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..control.healing import token_relative_error as relative_error
from ..operators.base import Operator
from ..time import SaveAt
from .coarsenings import Coarsening

__all__ = ["ABSORB", "INIT", "Absorber", "FitConfig", "TeacherStates", "absorbers",
           "average_controls_", "fields", "fit", "relative_error"]

ABSORB = {
    "keep": "the kept step's trained controls (plain deletion)",
    "average": "one step of tau = m at the average controls of the m steps it covers",
    "linear": "ReplaceMe's least-squares map M after the feature field, folded into W_d",
    "step": "the step of the network's own form fitted by AdamW on cached teacher states",
}

INIT = ("keep", "average", "linear")
"""Where the AdamW fit of absorb="step" starts: the kept step's controls, the average of the
steps it covers, or the kept step with ReplaceMe's map folded in (the module doc's rows)."""


@dataclass(frozen=True)
class Absorber:
    """Coarse step ``coarse`` runs the fine network's step ``step`` (its control set) over the
    fine interval [``start``, ``end``] of end - start > 1 unit steps."""

    coarse: int
    step: int
    start: int
    end: int

    @property
    def span(self) -> int:
        return self.end - self.start


def absorbers(coarsening: Coarsening) -> list[Absorber]:
    """The absorbing steps of a dropped grid (module doc); ValueError for a grid that is not a
    list of kept steps (refine, coarsen, parallel, merging: their steps are not fitted here)."""
    ops = coarsening.ops
    if any(name != "drop_steps" for name, _ in ops):
        raise ValueError(f"fitted steps need a grid of kept steps (drop_steps), got "
                         f"{coarsening}")
    drop = {i for _, arg in ops for i in arg}
    kept = [i for i in range(coarsening.fine_steps) if i not in drop]
    points = coarsening.fine_points
    out = []
    for j, k in enumerate(kept):
        p, q = points[j], points[j + 1]
        if p is None or q is None:
            raise ValueError(f"fitted steps: coarse step {j} approximates no fine interval "
                             f"({coarsening})")
        if q - p > 1:
            out.append(Absorber(j, k, p, q))
    return out


@dataclass(frozen=True)
class FitConfig:
    """How the absorbing steps are fitted: ``absorb`` (``ABSORB``); for "step": ``init``
    (``INIT``: "keep", "average" or "linear"), ``budget`` seconds and/or ``max_steps`` AdamW
    steps in all (split evenly between the absorbing steps), ``lr``, ``batch`` windows a
    step, ``seed``; for
    "linear": ``ridge``, a Tikhonov term ridge * trace(G^T G) / N_y on the normal
    equations (0: plain least squares)."""

    absorb: str = "keep"
    init: str = "keep"
    budget: float = 240.0
    max_steps: int | None = None
    lr: float = 2e-4
    batch: int = 4
    seed: int = 0
    ridge: float = 1e-6

    def __post_init__(self) -> None:
        if self.absorb not in ABSORB:
            raise ValueError(f"absorb must be one of {list(ABSORB)}, got {self.absorb!r}")
        if self.init not in INIT:
            raise ValueError(f"init must be one of {list(INIT)}, got {self.init!r}")
        for name in ("budget", "lr", "ridge"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.absorb == "step" and not self.lr > 0:
            raise ValueError("lr must be > 0 for absorb='step'")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {self.batch!r}")
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or not isinstance(
                self.max_steps, int) or self.max_steps < 0):
            raise ValueError(f"max_steps must be None or an int >= 0, got {self.max_steps!r}")
        if self.absorb == "step" and not self.budget and not self.max_steps:
            raise ValueError("absorb='step' needs a budget > 0 or max_steps > 0")


class TeacherStates:
    """u_f(t_p) of the teacher at the grid points ``points`` on calibration windows ``ids``
    ((M, n) token ids, no padding), computed once in batches of ``batch`` without gradients;
    ``state(p)`` is (M, n, N_y) float32 (or the model's dtype)."""

    def __init__(self, teacher: nn.Module, ids: torch.Tensor, points: Sequence[int], *,
                 batch: int = 4, say: Callable[[str], None] | None = None) -> None:
        if not (isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point()):
            raise ValueError(f"ids must be (M, n) integer token ids, got "
                             f"{_described(ids)}")
        self.ids = ids
        self.points = sorted(set(points))
        L = teacher.evolution.num_steps
        bad = [p for p in self.points if not 0 <= p <= L]
        if bad:
            raise ValueError(f"points {bad} are not grid points of the teacher (0 .. {L})")
        parts: dict[int, list[torch.Tensor]] = {p: [] for p in self.points}
        was = teacher.training
        teacher.eval()
        try:
            with torch.no_grad():
                for s in range(0, len(ids), batch):
                    if say is not None:
                        say(f"teacher states: windows {s + 1}-{min(s + batch, len(ids))} of "
                            f"{len(ids)}")
                    path = teacher.trajectory(input_ids=ids[s:s + batch],
                                              saveat=SaveAt(steps=True)).state_list
                    for p in self.points:
                        parts[p].append(path[p])
        finally:
            teacher.train(was)
        self._states = {p: torch.cat(v) for p, v in parts.items()}

    def state(self, p: int) -> torch.Tensor:
        return self._states[p]


def _single(base: nn.Module, step: int):
    """The one-step evolution of ``base``'s step ``step`` (parameters shared)."""
    L = len(base.evolution.controls)
    return base.evolution.drop_steps([i for i in range(L) if i != step])


def _context(base: nn.Module, ids: torch.Tensor):
    """The context of a forward of ``base`` over ``ids`` (the causal support, rotary angles)."""
    return base.initial_condition(input_ids=ids)[1]


def fields(evolution) -> list[str]:
    """The names of the scheme's field operators, in stage order (the scheme's declaration)."""
    names: list[str] = []
    for st in evolution.scheme.stages:
        if st.kind == "field":
            names += [n for n in st.fields() if n not in names]
    return names


@torch.no_grad()
def average_controls_(target: nn.ModuleDict, sources: Sequence[nn.ModuleDict],
                      fields: Sequence[str]) -> None:
    """``target`` <- the parameter-wise average of the control sets ``sources``, the outputs of
    its ``fields`` scaled by len(sources) (``Operator.scale_``): one Euler step of tau = m that
    reads the average controls of the m unit steps it covers."""
    for name, op in target.items():
        for key, p in op.named_parameters():
            mean = sum(dict(s[name].named_parameters())[key].detach().to(torch.float64)
                       for s in sources) / len(sources)
            p.copy_(mean.to(p.dtype))
    for name in fields:
        op = target[name]
        if not (isinstance(op, Operator) and op.has_scale):
            raise ValueError(f"absorb='average': field {name!r} ({type(op).__name__}) cannot "
                             "fold the step size into its weights (no Operator.scale_)")
        op.scale_(float(len(sources)))


def _average_(base: nn.Module, a: Absorber) -> None:
    """Absorber ``a``'s controls <- the average of the steps it covers (``average_controls_``).
    The sources are read before the target is written (the target is one of them)."""
    controls = base.evolution.controls
    sources = [copy.deepcopy(controls[i]) for i in range(a.start, a.end)]
    average_controls_(controls[a.step], sources, fields(base.evolution))


@torch.no_grad()
def _linear_(base: nn.Module, a: Absorber, states: TeacherStates, batch: int,
             ridge: float, who: str = "absorb='linear'") -> dict[str, float]:
    """ReplaceMe's map for absorber ``a`` (module doc), folded into its last field (``who``:
    the option named if it cannot be)."""
    names = fields(base.evolution)
    last = base.evolution.controls[a.step][names[-1]]
    if not (isinstance(last, Operator) and last.has_compose):
        raise ValueError(f"{who}: the last field {names[-1]!r} "
                         f"({type(last).__name__}) cannot fold a linear map into its output "
                         "(no Operator.compose_)")
    one = _single(base, a.step)
    u0, target = states.state(a.start), states.state(a.end)
    d = u0.shape[-1]
    gram = torch.zeros(d, d, dtype=torch.float64)
    cross = torch.zeros(d, d, dtype=torch.float64)
    rr = kept = 0.0
    for s in range(0, len(u0), batch):
        ids = states.ids[s:s + batch]
        traj = one(u0[s:s + batch], _context(base, ids), SaveAt(substeps=True))
        v = [sub for sub in traj.substeps if sub.step == 0][-2].state.double()
        g = traj.final.double() - v  # the last field's output, g = G(P2 v)
        y = target[s:s + batch].double()
        w = y.pow(2).sum(-1, keepdim=True).clamp_min(1e-30).rsqrt()  # 1 / |u_f(x)|
        gw, rw = (g * w).reshape(-1, d), ((y - v) * w).reshape(-1, d)
        gram += gw.T @ gw
        cross += gw.T @ rw
        rr += float(rw.pow(2).sum())
        kept += float((gw - rw).pow(2).sum())  # M = I: the kept step as it is
    reg = ridge * float(torch.diagonal(gram).sum()) / d
    m = torch.linalg.solve(gram + reg * torch.eye(d, dtype=gram.dtype), cross)
    # |R - G M|^2 = |R|^2 - 2 tr(M^T G^T R) + tr(M^T G^T G M), from the sums
    fitted = rr - 2 * float((m * cross).sum()) + float((m * (gram @ m)).sum())
    last.compose_(m.T)  # rows: g M; columns: M^T g, so W_d <- M^T W_d
    n = states.ids.numel()
    return {"relative_error_kept": kept / n, "relative_error_fitted": fitted / n}


@torch.no_grad()
def _error_on_all(base: nn.Module, a: Absorber, states: TeacherStates, batch: int) -> float:
    """mean over every calibration token of the relative squared error of absorber ``a``'s
    step from u_f(p_j) to u_f(p_(j+1)) (``relative_error``, token-weighted over batches)."""
    one = _single(base, a.step)
    u0, target = states.state(a.start), states.state(a.end)
    total = 0.0
    for s in range(0, len(u0), batch):
        ids = states.ids[s:s + batch]
        total += float(relative_error(one(u0[s:s + batch], _context(base, ids)),
                                      target[s:s + batch])) * ids.numel()
    return total / states.ids.numel()


def _step_(base: nn.Module, a: Absorber, states: TeacherStates, cfg: FitConfig,
           seconds: float, steps: int | None, say: Callable[[str], None] | None
           ) -> dict[str, float]:
    """AdamW on absorber ``a``'s controls (module doc) for ``seconds`` or ``steps``; the report
    holds the first and last batch's loss and, on every calibration window after the fit,
    ``relative_error_after_adam`` (comparable to the least-squares map's
    ``relative_error_fitted``)."""
    one = _single(base, a.step)
    params = [p for p in base.evolution.controls[a.step].parameters()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    u0, target = states.state(a.start), states.state(a.end)
    g = torch.Generator().manual_seed(cfg.seed * 1000 + a.step)
    count, start, first, last = 0, time.perf_counter(), None, None
    try:
        while True:
            if steps is not None and count >= steps:
                break
            if seconds and time.perf_counter() - start >= seconds:
                break
            idx = torch.randint(len(u0), (min(cfg.batch, len(u0)),), generator=g)
            ctx = _context(base, states.ids[idx])
            loss = relative_error(one(u0[idx], ctx), target[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            count += 1
            last = float(loss.detach())
            first = last if first is None else first
            if say is not None and count % 100 == 0:
                say(f"fitting step {a.step} over [{a.start}, {a.end}]: {count} AdamW steps, "
                    f"relative error {last:.4g} ({time.perf_counter() - start:.0f} s)")
    finally:
        for p, f in zip(params, flags, strict=True):
            p.requires_grad_(f)
        opt.zero_grad(set_to_none=True)
    return {"adam_steps": count, "seconds": round(time.perf_counter() - start, 3),
            "first_loss": first, "last_loss": last,
            "relative_error_after_adam": _error_on_all(base, a, states, cfg.batch)}


def fit(base: nn.Module, coarsening: Coarsening, cfg: FitConfig, *,
        teacher: nn.Module | None = None, calibration: torch.Tensor | None = None,
        say: Callable[[str], None] | None = None) -> dict[str, object]:
    """Fit the absorbing steps of ``coarsening`` in ``base`` (in place) as ``cfg`` says
    (module doc); ``teacher`` and ``calibration`` ((M, n) token ids) are read by "linear" and
    "step". Returns what was done, per absorbing step (JSON values)."""
    if not isinstance(cfg, FitConfig):
        raise TypeError(f"fit(cfg) takes a FitConfig, got {type(cfg).__name__}")
    spans = absorbers(coarsening)
    report: dict[str, object] = {"absorb": cfg.absorb,
                                 "absorbers": [[a.step, a.start, a.end] for a in spans]}
    if cfg.absorb == "keep" or not spans:
        return report
    if cfg.absorb == "average" or (cfg.absorb == "step" and cfg.init == "average"):
        for a in spans:
            _average_(base, a)
        if cfg.absorb == "average":
            return report
    if teacher is None or calibration is None:
        raise ValueError(f"absorb={cfg.absorb!r} fits on the teacher's states: give teacher "
                         "and calibration ids")
    states = TeacherStates(teacher, calibration,
                           [p for a in spans for p in (a.start, a.end)], batch=cfg.batch,
                           say=say)
    was = base.training
    base.eval()
    fits = {}
    try:
        for i, a in enumerate(spans):
            if cfg.absorb == "linear":
                fits[str(a.step)] = _linear_(base, a, states, cfg.batch, cfg.ridge)
            else:
                start = (_linear_(base, a, states, cfg.batch, cfg.ridge,
                                  "absorb='step', init='linear'")
                         if cfg.init == "linear" else {})
                share = cfg.budget / len(spans)
                steps = None if cfg.max_steps is None else (
                    cfg.max_steps // len(spans) + (i < cfg.max_steps % len(spans)))
                fits[str(a.step)] = {**start, **_step_(base, a, states, cfg, share, steps,
                                                       say)}
    finally:
        base.train(was)
    report["fits"] = fits
    return report


def _described(x) -> str:
    """A tensor's shape, or the type of anything else (for messages)."""
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
