"""The gated feature field of a step (SwiGLU, GeGLU: ``operators.feature.GatedFeedForward``)
read as docs/math.md 3.16 says: not a projection (it is a product of two lifts, a reaction
term), but Lipschitz on the ball the pre-norm projects into, with a computable bound. Measured
here beside that bound on the states the text puts there.

For a field substep u + tau G(P u) whose field is a ``GatedFeedForward`` G and whose ``pre``
holds a projection with a ``radius()`` (``RMSNormProjection``: |P v| <= R = sqrt(N) max |g|
for every v), the points v = P u of the tokens lie in the ball |v| <= R, and

    bound       G.lipschitz_bound(R): a bound of Lip(G) on that ball (the operator's docstring)
    quotient    max over pairs of distinct tokens x, x' of |G(v_x) - G(v_x')| / |v_x - v_x'|
                (every token of every input, at most ``MAX_TOKENS`` evenly spaced; pairs with
                |v_x - v_x'| = 0 are skipped): a lower estimate of Lip(G) on the convex hull of
                the points, a subset of the ball
    jacobian    max over a few tokens x (``JACOBIAN_TOKENS`` evenly spaced tokens of input
                ``index``, token 0 among them) of the largest singular value of DG(v_x), by
                the Lanczos iteration on DG^T DG (DG applied in closed form, from a seeded
                random vector, full reorthogonalisation, until the estimate changes by less
                than ``LANCZOS_TOL`` (relative), at most ``LANCZOS_ITERATIONS`` times; the
                largest Ritz value, square-rooted): never above sigma_max(DG(v_x)), itself a
                lower estimate of Lip(G) on any neighbourhood of v_x in the ball
    measured    max(quotient, jacobian); ratio = measured / bound, <= 1 when the bound holds

computed in float64 from the operator's own weights (G(v) = W_d (s(W_g v + b_g) *
(W_u v + b_u)) + b_d, no dropout), and ``state_norm_max`` = max_x |v_x| (how far out in the ball
the tokens sit). The paper's FFN analysis (ReLU: a projection of the lifted field) does not
cover a gated field: the record's ``reading`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..operators.feature import GatedFeedForward
from .lipschitz import _tridiagonal_top
from .readings import compose, module_of, plain

__all__ = ["JACOBIAN_TOKENS", "MAX_TOKENS", "READING", "decoder_lines", "difference_quotient",
           "gated_apply", "gated_fields", "gated_record", "jacobian_norms"]

MAX_TOKENS = 512  # tokens of the difference quotients (all pairs among them)
JACOBIAN_TOKENS = 8  # tokens whose Jacobian's spectral norm is computed
LANCZOS_ITERATIONS = 100  # the cap of each token's Lanczos iteration
LANCZOS_TOL = 1e-6  # stop when the estimate changes by less than this (relative)
READING = "not a projection; Lipschitz on the sphere with this bound"


class _Field:
    """G of a ``GatedFeedForward`` in float64: its weights read once (a module, or an operator
    of interpolated controls read with ``plain``), no dropout."""

    def __init__(self, op: GatedFeedForward) -> None:
        def parts(stage) -> tuple[torch.Tensor, torch.Tensor | None]:
            b = stage.bias.detach().double() if stage.bias is not None else None
            return stage.weight.detach().double(), b

        self.gate, self.up, self.down = parts(op.gate), parts(op.up), parts(op.down)
        self.activation = op.activation

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        v = v.double()
        hidden = self.activation(F.linear(v, *self.gate)) * F.linear(v, *self.up)
        return F.linear(hidden, *self.down)

    def linearised(self, x: torch.Tensor):
        """(w -> DG(x) w, z -> DG(x)^T z) at one point x (D,): DG(x) w = W_d (s'(a) b (W_g w)
        + s(a) (W_u w)), a = W_g x + b_g, b = W_u x + b_u (s' by forward mode: s is
        pointwise)."""
        a, b = F.linear(x, *self.gate), F.linear(x, *self.up)
        s, ds = torch.func.jvp(self.activation, (a,), (torch.ones_like(a),))
        wg, wu, wd = self.gate[0], self.up[0], self.down[0]
        left, right = ds * b, s

        def matvec(w: torch.Tensor) -> torch.Tensor:
            return wd @ (left * (wg @ w) + right * (wu @ w))

        def rmatvec(z: torch.Tensor) -> torch.Tensor:
            h = wd.T @ z
            return wg.T @ (left * h) + wu.T @ (right * h)

        return matvec, rmatvec


def gated_apply(op: GatedFeedForward, v: torch.Tensor) -> torch.Tensor:
    """G(v) in float64 from the weights of ``op`` (a module, or an operator of interpolated
    controls read with ``plain``): W_d (s(W_g v + b_g) * (W_u v + b_u)) + b_d, no dropout."""
    return _Field(op)(v)


def difference_quotient(op: GatedFeedForward, v: torch.Tensor) -> tuple[float | None, int]:
    """(max over the pairs of distinct points of v (M, D) of |G(v_i) - G(v_j)| / |v_i - v_j|,
    the number of pairs used); (None, 0) without a pair at positive distance."""
    v = v.detach().double()
    g = gated_apply(op, v)
    mode = "donot_use_mm_for_euclid_dist"  # exact differences, not |a|^2 + |b|^2 - 2 <a, b>
    d_in = torch.cdist(v, v, compute_mode=mode)
    d_out = torch.cdist(g, g, compute_mode=mode)
    upper = torch.triu(torch.ones_like(d_in, dtype=torch.bool), diagonal=1) & (d_in > 0)
    pairs = int(upper.sum())
    if not pairs:
        return None, 0
    return float((d_out[upper] / d_in[upper]).max()), pairs


def jacobian_norms(op: GatedFeedForward, v: torch.Tensor, *, seed: int = 0,
                   iterations: int = LANCZOS_ITERATIONS, tol: float = LANCZOS_TOL
                   ) -> list[float]:
    """The largest singular value of DG at each point of v (K, D), float64, by the Lanczos
    iteration on DG^T DG (module docstring): each value is at most sigma_max(DG(v_x))."""
    field = _Field(op)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in v.detach().double():
        matvec, rmatvec = field.linearised(x)
        start = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.device)
        out.append(_top_singular(matvec, rmatvec, start, iterations, tol))
    return out


def _top_singular(matvec, rmatvec, start: torch.Tensor, cap: int, tol: float) -> float:
    """sqrt of the largest Ritz value of the Lanczos iteration on J^T J from ``start`` (full
    reorthogonalisation), until it changes by less than ``tol`` (relative), the Krylov space is
    invariant, or ``cap`` iterations: never above sigma_max(J)."""
    v = start / start.norm()
    basis: list[torch.Tensor] = []
    alphas: list[float] = []
    betas: list[float] = []
    estimate = 0.0
    for k in range(1, cap + 1):
        basis.append(v)
        w = rmatvec(matvec(v))
        size = float(w.norm())
        alphas.append(float(w @ v))
        vs = torch.stack(basis)
        for _ in range(2):
            w = w - vs.T @ (vs @ w)
        beta = float(w.norm())
        previous, estimate = estimate, math.sqrt(max(_tridiagonal_top(alphas, betas), 0.0))
        if beta <= 1e-10 * size or k == v.numel() or (
                k > 1 and abs(estimate - previous) <= tol * estimate):
            break
        betas.append(beta)
        v = w / beta
    return estimate


def _spread(n: int, k: int) -> list[int]:
    """k indices of range(n) evenly spaced, 0 and n - 1 among them (all of them when n <= k)."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def gated_fields(stages, theta) -> list[tuple[Any, str, Any]]:
    """(stage, operator name, operator) of each gated feature field of ``stages``."""
    return [(st, n, theta[n]) for st in stages for n in st.fields()
            if isinstance(module_of(theta[n]), GatedFeedForward)]


def _radius(st, theta) -> tuple[float | None, str | None]:
    """(R, the projection's name) of the last projection of the stage's ``pre`` with a
    radius() (|P v| <= R), or (None, None)."""
    for name in reversed(list(st.pre)):
        op = module_of(theta[name])
        radius = getattr(op, "radius", None)
        if callable(radius):
            with plain(theta[name]) as m:
                return float(m.radius()), name
    return None, None


def gated_record(st, name: str, op, theta, before: torch.Tensor, context, index: int,
                 notes: Any, where: str) -> dict[str, Any]:
    """The record of the gated field ``name`` of field stage ``st`` at the state ``before``
    entering it (module docstring); ``notes.add`` says why a number is None."""
    v = compose(st.pre, before, theta, context).detach()
    radius, proj = _radius(st, theta)
    rec: dict[str, Any] = {"operator": name, "activation": None, "projection": proj,
                           "radius": radius, "bound": None, "state_norm_max": None,
                           "quotient": None, "quotient_pairs": 0, "quotient_tokens": 0,
                           "jacobian": None, "jacobian_tokens": [], "measured": None,
                           "ratio": None, "reading": READING}
    with plain(op) as m:
        rec["activation"] = m.activation.name
        if radius is None:
            notes.add(f"{where}: the bound of the gated field '{name}' is None: no projection "
                      "with a radius (a pre-norm RMSNorm) enters it, so no ball bounds its "
                      "input")
        else:
            try:
                rec["bound"] = _finite(m.lipschitz_bound(radius))
            except ValueError as e:
                notes.add(f"{where}: the bound of the gated field '{name}' is None: {e}")
        flat = v.double().reshape(-1, v.shape[-1])
        rec["state_norm_max"] = _finite(flat.norm(dim=-1).max())
        keep = _spread(flat.shape[0], MAX_TOKENS)
        rec["quotient"], rec["quotient_pairs"] = difference_quotient(m, flat[keep])
        rec["quotient_tokens"] = len(keep)
        if rec["quotient"] is None:
            notes.add(f"{where}: the difference quotient of the gated field '{name}' is None: "
                      "no two tokens at a positive distance")
        tokens = _spread(int(v.shape[1]), JACOBIAN_TOKENS)
        norms = jacobian_norms(m, v[index, tokens])
        rec["jacobian"] = _finite(max(norms)) if norms else None
        rec["jacobian_tokens"] = tokens
    known = [x for x in (rec["quotient"], rec["jacobian"]) if x is not None]
    rec["measured"] = max(known) if known else None
    if rec["measured"] is not None and rec["bound"]:
        rec["ratio"] = rec["measured"] / rec["bound"]
    return rec


def _finite(x: Any) -> float | None:
    v = float(x)
    return v if math.isfinite(v) else None


def decoder_lines(steps: list[Mapping[str, Any]], fmt: Callable[[Any], str]) -> list[str]:
    """The analyze summary's lines on the attention sink and the gated fields (when
    measured), numbers shown by ``fmt``."""
    lines = []
    sinks = [(s["step"], s["attention_sink"]) for s in steps
             if s.get("attention_sink") is not None]
    if sinks:
        top = max(sinks, key=lambda p: p[1])
        first = next(s for s in steps if s.get("attention_sink") is not None)
        uniform = first["attention"][0].get("first_token_mass_uniform")
        lines.append(f"  attention sink (mass on the first token, mean over heads and queries "
                     f"x >= 1): {fmt(sinks[0][1])} at step {fmt(sinks[0][0])}, "
                     f"{fmt(sinks[-1][1])} at step {fmt(sinks[-1][0])}, at most "
                     f"{fmt(top[1])} (step {fmt(top[0])}); a uniform kernel on the support "
                     f"gives {fmt(uniform)}")
    gated = [s["gated_field"] for s in steps if s.get("gated_field") is not None]
    if gated:
        g = gated[0]
        bounds = [r["bound"] for r in gated if r["bound"] is not None]
        measured = [r["measured"] for r in gated if r["measured"] is not None]
        ratios = [r["ratio"] for r in gated if r["ratio"] is not None]
        lines.append(f"  gated field '{g['operator']}' ({g['activation']}): {g['reading']}: "
                     f"bound {_span(bounds, fmt)} per step, measured {_span(measured, fmt)}, "
                     f"measured / bound at most {fmt(max(ratios)) if ratios else 'n/a'}")
    return lines


def _span(values: list[float], fmt: Callable[[Any], str]) -> str:
    return f"{fmt(min(values))} .. {fmt(max(values))}" if values else "n/a"
