"""What every theory check shares: the result value ``Check``, the ``Probe`` (a model, its first
evolution and its initial state, in float64), least-squares fits, cluster counts, frozen
autonomous evolutions and score-scaled attention operators.

    Check              name, title, claim, citation, run, criterion, assumptions, verdict,
                       constants, fit, data, notes, figure; ``as_dict()``
    Probe.from_model   the model (a float64 copy, token merging off), its first evolution, u(0)
                       and the context
    linear_fit         y = a + b x by least squares: slope, intercept, r2, points
    cluster_count      components of the graph cos(u(x), u(x')) > threshold
    frozen_evolution   Evolution(Controls([theta] * t_max), scheme, TimeGrid(t_max, t_max))
                       refined k times: one step theta^n continued as an autonomous system
    rescale_scores     an attention operator's score scale times beta, its kernel otherwise kept
    scaled_attention   a copy of an attention operator whose score scale is beta times its own
    attention_names    the operators of a control set that are attention operators
    relative_residual  ||U - 1 mean_x U||_F / ||U||_F per input (Dong et al.'s res, normalised)

Verdicts are "pass", "fail", "inconclusive" or "not applicable": a check whose assumptions the
model violates says which and is never passed; one whose measured effect is not larger than
what the measurement resolves (a dwell time to within a substep, a slope within the flat band,
a difference within the spread of the untrained references) says "inconclusive", whichever
way the criterion would go (``Check.verdict``).

A model that merges tokens (``Evolution.merging``) is probed with merging off: every check
reads a frozen step as one attention field on a fixed token grid, which a merge changes along
the way. ``Probe.merging`` keeps the merge and ``Probe.scheme_text()`` prints the scheme with
it, so that a report says what was turned off.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...operators.attention import AttentionOperator
from ...operators.base import Context
from ...operators.kernels import check_scale
from ...operators.merging import TokenMerging
from ...time import Evolution, TimeGrid
from ...time.controls import Controls
from ..checks import ArgumentError

__all__ = ["INCONCLUSIVE", "NOT_APPLICABLE", "VERDICTS", "Check", "Probe", "attention_names",
           "cluster_count", "frozen_evolution", "linear_fit", "mean_cosine", "min_cosine",
           "one_field_steps", "relative_residual", "rescale_scores", "scaled_attention"]

VERDICTS = ("pass", "fail", "inconclusive", "not applicable")
NOT_APPLICABLE = "not applicable"
INCONCLUSIVE = "inconclusive"
CLUSTER_COSINE = 0.99  # two tokens are in one cluster when a chain of cosines > 0.99 joins them


@dataclass
class Check:
    """One prediction tested on one model: what it claims (``claim``, ``citation``), what was
    run (``run``), the criterion of the verdict (``criterion``), the assumptions of the theory
    and whether the model meets them (``assumptions``: records ``name``, ``holds``, ``detail``),
    the ``verdict`` ("pass", "fail", "inconclusive", "not applicable") and its ``reason``
    (one line: the measured numbers, or the assumptions that fail), the fitted ``constants``,
    the headline ``fit`` (with ``r2``, None where there was nothing to fit), the measured series
    (``data``), ``notes`` and, once drawn, the ``figure`` record (name, title, caption, png,
    svg)."""

    name: str
    title: str
    claim: str
    citation: str
    run: str
    criterion: str
    verdict: str
    reason: str
    assumptions: list[dict[str, Any]] = field(default_factory=list)
    constants: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=lambda: {"r2": None})
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    figure: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Check.verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if "r2" not in self.fit:
            raise ValueError("Check.fit must hold 'r2' (None where nothing was fitted)")

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-friendly (floats as floats, NaN and infinities as None)."""
        return _plain(dataclasses.asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, torch.Tensor):
        return _plain(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def assumption(name: str, holds: bool, detail: str) -> dict[str, Any]:
    """One assumption of a theorem and whether the model meets it."""
    return {"name": name, "holds": bool(holds), "detail": detail}


# -- the probe --------------------------------------------------------------------------------
@dataclass
class Probe:
    """A model ready for the checks: a float64 copy (``model``, eval mode), the evolution the
    checks run (``evolution``: the first the model calls), its initial state ``u0`` (B, N, D)
    and ``context`` for the model's inputs, ``label`` (which evolution) and ``lengths``: a
    function n -> (u0, context) of the same text at n tokens (text models; None otherwise),
    with ``max_tokens`` the most it can give; ``trained``: whether the weights were trained
    (False for a random-weight model: a claim about training is then not applicable);
    ``merging``: the token merging the model's evolution runs (``TokenMerging``), turned off in
    the probe's copy (module doc), or None."""

    model: nn.Module
    evolution: Evolution
    u0: torch.Tensor
    context: Context | None
    label: str = "evolution"
    evolutions: int = 1
    lengths: Callable[[int], tuple[torch.Tensor, Context | None]] | None = None
    max_tokens: int | None = None
    trained: bool = True
    merging: TokenMerging | None = None

    @classmethod
    def from_model(cls, model: nn.Module, inputs: Any,
                   lengths: Callable[[int], Any] | None = None,
                   max_tokens: int | None = None, trained: bool = True) -> Probe:
        """The probe of ``model`` at ``inputs`` (a tuple of positional or a dict of keyword
        inputs, as ``model(...)`` takes them); ``lengths(n)``, when given, returns the inputs
        of the same text at n tokens (converted to (u0, context) here). Token merging is
        turned off in the copy (module doc; the first evolution's merge is ``merging``)."""
        from ..capture import capture, check_finite, check_inputs

        args, kwargs = check_inputs(inputs)
        m = copy.deepcopy(model).double().eval()
        merges = _merging_off(m)
        args, kwargs = _double(args), _double(kwargs)
        check_finite(m, args, kwargs)
        calls = capture(m, args, kwargs)
        if not calls:
            raise ArgumentError("model", "the model ran no Evolution (nothing to test)")
        first = calls[0]

        def at_length(n: int):
            a, k = check_inputs(lengths(n))
            found = capture(m, _double(a), _double(k))
            return found[0].u0, found[0].context

        return cls(m, first.evolution, first.u0, first.context, first.name, len(calls),
                   at_length if lengths is not None else None, max_tokens, bool(trained),
                   merges.get(id(first.evolution)))

    def scheme_text(self) -> str:
        """The evolution's stages as printed (``Evolution.stage_text``), with the model's token
        merge at its place when it has one (``merging``: the checks run without it)."""
        evo = self.evolution
        if self.merging is not None:
            evo = evo.with_token_merging(self.merging)
        return evo.stage_text()

    @property
    def steps(self) -> int:
        """The number of control sets theta^n (the network's steps)."""
        return len(self.evolution.controls)

    def first(self) -> tuple[torch.Tensor, Context | None]:
        """u(0) and the context of the first input alone (the dynamics checks run one)."""
        return self.u0[:1], _first_context(self.context)


def _merging_off(model: nn.Module) -> dict[int, TokenMerging]:
    """Turn off the token merging of every evolution of ``model`` (the probe's own copy), in
    place; returns id(evolution) -> the merging it had."""
    found: dict[int, TokenMerging] = {}
    for m in model.modules():
        if isinstance(m, Evolution) and m.merging is not None:
            found[id(m)] = m.merging
            m.merging = None
    return found


def one_field_steps(evo: Evolution) -> tuple[list[int], list[int]]:
    """(the steps whose control set holds one field per name, the superposed ones): a step of
    ``parallel_steps`` sums several attention fields (``Superposition``), which is not the
    single attention field of a particle system, so the per-step checks leave it out."""
    superposed = list(evo.superposed_steps)
    return [n for n in range(len(evo.controls)) if n not in superposed], superposed


def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, Mapping):
        return {k: _double(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_double(v) for v in value)
    return value


def _first_context(ctx: Context | None) -> Context | None:
    if ctx is None:
        return None
    mask = ctx.attn_mask
    if isinstance(mask, torch.Tensor) and mask.dim() >= 3 and mask.shape[0] > 1:
        mask = mask[:1]
    w, c = ctx.token_weights, ctx.token_coords
    w = w[:1] if isinstance(w, torch.Tensor) and w.dim() == 2 else w
    c = c[:1] if isinstance(c, torch.Tensor) and c.dim() == 2 else c
    return dataclasses.replace(ctx, attn_mask=mask, token_weights=w, token_coords=c)


# -- fits and measures --------------------------------------------------------------------------
def linear_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
    """y = intercept + slope x by least squares over the finite pairs: slope, intercept, r2
    (1 - SS_res / SS_tot; None with fewer than 3 points or constant y) and ``points``."""
    pts = [(float(a), float(b)) for a, b in zip(x, y, strict=True)
           if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    n = len(pts)
    out: dict[str, Any] = {"slope": None, "intercept": None, "r2": None, "points": n}
    if n < 2:
        return out
    mx = sum(a for a, _ in pts) / n
    my = sum(b for _, b in pts) / n
    sxx = sum((a - mx) ** 2 for a, _ in pts)
    if sxx == 0:
        return out
    slope = sum((a - mx) * (b - my) for a, b in pts) / sxx
    intercept = my - slope * mx
    out.update(slope=slope, intercept=intercept)
    sst = sum((b - my) ** 2 for _, b in pts)
    if n >= 3 and sst > 0:
        ssr = sum((b - intercept - slope * a) ** 2 for a, b in pts)
        out["r2"] = 1.0 - ssr / sst
    return out


def relative_residual(u: torch.Tensor) -> list[float]:
    """||u_b - 1 mean_x u_b||_F / ||u_b||_F of every input b of u (B, N, D): the distance of
    the tokens from their mean (rank one) relative to the state's size, in [0, 1]."""
    v = u.detach().double()
    res = v - v.mean(dim=-2, keepdim=True)
    norm = v.flatten(1).norm(dim=1)
    return [float(r / n) if n > 0 else 0.0
            for r, n in zip(res.flatten(1).norm(dim=1), norm, strict=True)]


def cluster_count(u: torch.Tensor, threshold: float = CLUSTER_COSINE) -> int:
    """The number of clusters of the tokens of u (N, D) (or of the first input of (B, N, D)):
    the connected components of the graph whose edges join tokens x, x' with
    cos(u(x), u(x')) > ``threshold``."""
    v = u[0] if u.dim() == 3 else u
    v = torch.nn.functional.normalize(v.detach().double(), dim=-1)
    adj = (v @ v.T) > threshold
    n = adj.shape[0]
    labels = torch.arange(n)
    big = torch.full((n, n), n, dtype=labels.dtype)
    while True:  # label propagation: each token takes the smallest label among its neighbours
        new = torch.minimum(labels, torch.where(adj, labels[None, :], big).min(dim=1).values)
        if torch.equal(new, labels):
            break
        labels = new
    return int(labels.unique().numel())


def min_cosine(u: torch.Tensor) -> float:
    """The smallest cosine between two tokens of the first input: above 0.99 the tokens are one
    cluster in the strict sense (no chain of close tokens spanning a wide set)."""
    v = u[0] if u.dim() == 3 else u
    v = torch.nn.functional.normalize(v.detach().double(), dim=-1)
    return float((v @ v.T).min())


def mean_cosine(u: torch.Tensor) -> float:
    """Mean cosine of the distinct token pairs of the first input (``geometry``)."""
    from ..geometry import cosine_similarity

    v = u[0] if u.dim() == 3 else u
    return float(cosine_similarity(v.detach()))


def attention_names(theta: Mapping[str, nn.Module]) -> list[str]:
    """The names of the attention operators of a control set, in order."""
    from ..readings import module_of

    return [n for n, op in theta.items() if isinstance(module_of(op), AttentionOperator)]


def rescale_scores(op: AttentionOperator, beta: float) -> None:
    """Multiply the score scale of ``op`` by beta, in place: a(x, x') = beta s <Q, K> (s the
    operator's score scale, 1/sqrt(d_h) by default). The kernel is a copy of its own with only
    the scale changed, so that its other options (ALiBi's causal support and slopes, Sinkhorn's
    iterations, the rotary base) stay as they were. ArgumentError("model") for a kernel without
    a score scale (linear)."""
    kernel = op.kernel
    if not kernel.takes_scale:
        raise ArgumentError("model", f"the {kernel.name!r} kernel has no score scale to "
                                     "multiply by beta")
    s = op.score_scale()
    s = op.head_dim ** -0.5 if s is None else s
    new = copy.deepcopy(kernel)
    new.scale = check_scale(float(beta) * s, f"beta = {beta!r}")
    new.check_operator(op)
    op.install_kernel(new)


def scaled_attention(op: AttentionOperator, beta: float) -> AttentionOperator:
    """A copy of ``op`` whose kernel scores are beta times its own (``rescale_scores``)."""
    new = copy.deepcopy(op)
    rescale_scores(new, beta)
    return new


def frozen_evolution(theta: Mapping[str, nn.Module], scheme: str, t_max: int, k: int
                     ) -> Evolution:
    """One control set theta^n continued as an autonomous evolution to t_max at tau = 1 / k:
    ``Evolution(Controls([theta] * t_max), scheme, TimeGrid(t_max, t_max)).refine(k)``
    (the scheme may leave fields of theta unused on purpose: no warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        evo = Evolution(Controls([dict(theta)] * int(t_max)), scheme,
                        TimeGrid(float(t_max), int(t_max)))
        return evo.refine(int(k)) if k != 1 else evo


def run_frozen(evo: Evolution, u: torch.Tensor, context: Context | None, k: int,
               every: Callable[[float, torch.Tensor], Any],
               stop: Callable[[torch.Tensor], bool] | None = None) -> list[Any]:
    """Run ``evo`` from u, calling ``every(t, u)`` at t = 0 and at every unit of time (each k
    substeps); stop early once ``stop(u)`` holds at a unit time. Returns what ``every``
    returned, in order."""
    out = [every(0.0, u)]
    with torch.no_grad():
        for i in range(evo.num_steps):
            u = evo.advance(i, u, context)
            if (i + 1) % k == 0:
                out.append(every((i + 1) / k, u))
                if stop is not None and stop(u):
                    break
    return out
