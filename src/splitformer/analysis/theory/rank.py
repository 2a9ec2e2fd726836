"""Check a: rank collapse of pure attention (Dong, Cordonnier, Loukas 2021).

Dong et al. prove that a self-attention network without skip connections and without FFN
loses rank doubly exponentially in depth: with res(U) = U - 1 mean_x(U) (the distance from the
rank-one states whose tokens are all equal),

    ||res(SAN_L(U))|| <= (c ||res(U)||)^(3^L)      (c depends on the weights),

so log(-log r_n) grows linearly in the number of layers n (slope log 3 in the bound), and skip
connections (and FFNs) stop the collapse. Measured here on the network's own attention
operators theta^0 .. theta^(N-1), applied in order to its u(0), with the relative residual
r_n = ||res(U_n)||_F / ||U_n||_F (in [0, 1], float64):

* pure attention: U_{n+1} = A_{theta^n}(U_n), the attention operator alone (no skip, no FFN,
  no projection). The scheme language has no update without the skip (every field stage is
  u + h F(u)), so this map is applied directly through the operator;
* attention with the skip: the scheme string "attention" (u + A(u));
* the full scheme: the network's own scheme (``evolution.scheme``).

Points with r_n below ``FLOOR`` (1e-12: float64 round-off of a rank-one state) are not fitted.
Verdict: pass when the pure-attention fit of log(-log r_n) against n has slope > 0 and
R^2 >= 0.9 and the full scheme keeps r_N / r_0 >= 1e-3; not applicable with fewer than 3
points above the floor, or when u(0) is already rank one.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from .core import (
    NOT_APPLICABLE,
    Check,
    Probe,
    assumption,
    attention_names,
    linear_fit,
    relative_residual,
)

__all__ = ["FLOOR", "KEEP", "R2_BAR", "rank_collapse"]

FLOOR = 1e-12  # relative residual at float64 round-off: not fitted
R2_BAR = 0.9
KEEP = 1e-3  # the full scheme's residual must stay above KEEP times its start

CLAIM = ("Pure self-attention (no skip connection, no FFN) loses rank doubly exponentially in "
         "depth: log(-log r_n) of the relative residual r_n = ||U_n - 1 mean(U_n)|| / ||U_n|| "
         "grows linearly in the number of steps n; with the skip connection and the FFN (the "
         "full scheme) it does not.")
CITATION = ("Dong, Cordonnier, Loukas, 'Attention is not all you need: pure attention loses "
            "rank doubly exponentially with depth', ICML 2021 (the residual bound for pure "
            "self-attention networks, and the role of skip connections).")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def _loglog(r: float) -> float | None:
    return math.log(-math.log(r)) if 0 < r < 1 and r >= FLOOR else None


def rank_collapse(probe: Probe) -> Check:
    """Check a (module docstring) on ``probe``'s evolution and u(0)."""
    evo, u0, ctx = probe.evolution, probe.u0, probe.context
    controls = evo.controls
    names = [attention_names(theta) for theta in controls]
    if not all(names):
        return _na(probe, _no_attention(evo, names), [])
    pure = [_mean(relative_residual(u0))]
    with torch.no_grad():
        u = u0
        for theta, ns in zip(controls, names, strict=True):
            u = theta[ns[0]](u, ctx)
            pure.append(_mean(relative_residual(u)))
        skip = _scheme_residuals(evo, "attention" if all(n[0] == "attention" for n in names)
                                 else None, u0, ctx)
        full = _scheme_residuals(evo, str(evo.scheme), u0, ctx)
    steps = list(range(len(pure)))
    loglog = [_loglog(r) for r in pure]
    fit = linear_fit(steps, loglog)
    start = pure[0]
    data: dict[str, Any] = {
        "steps": steps, "pure_attention": pure, "loglog_pure": loglog,
        "attention_with_skip": skip, "full_scheme": full,
        "floor": FLOOR, "scheme": str(evo.scheme), "skip_scheme": "attention"}
    full_ratio = full[-1] / full[0] if full and full[0] > 0 else float("nan")
    skip_ratio = skip[-1] / skip[0] if skip and skip[0] > 0 else None
    constants = {"slope": fit["slope"], "intercept": fit["intercept"],
                 "slope_bound": math.log(3.0), "fitted_points": fit["points"],
                 "pure_final_ratio": pure[-1] / start if start > 0 else None,
                 "skip_final_ratio": skip_ratio, "full_final_ratio": full_ratio,
                 "floor_reached_at": next((n for n, r in enumerate(pure) if r < FLOOR), None)}
    assumptions = [
        assumption("u(0) is not rank one", start > FLOOR, f"r_0 = {start:.3g}"),
        assumption("at least 3 steps above round-off", fit["points"] >= 3,
                   f"{fit['points']} of {len(pure)} residuals are in [1e-12, 1)"),
        assumption("every step has an attention operator", True,
                   f"operator {names[0][0]!r} of each of the {len(controls)} control sets")]
    run = (f"The network's {len(controls)} attention operators applied in order to its u(0) "
           f"({tuple(u0.shape[1:])[0]} tokens x {u0.shape[-1]} features, float64) without "
           "skip, FFN or projection (U <- A_n(U), applied through the operator: the scheme "
           "language has no update without the skip); the same steps under the scheme string "
           f"'attention' (with the skip) and under the network's scheme '{evo.scheme}'.")
    criterion = (f"pass if the fit of log(-log r_n) against n (points with r_n >= {FLOOR:g}) "
                 f"has slope > 0 and R^2 >= {R2_BAR}, and the full scheme keeps "
                 f"r_N / r_0 >= {KEEP:g}")
    if not all(a["holds"] for a in assumptions):
        failed = [a["name"] for a in assumptions if not a["holds"]]
        return Check("rank_collapse", "Rank collapse of pure attention", CLAIM, CITATION, run,
                     criterion, NOT_APPLICABLE, "; ".join(failed),
                     assumptions, constants, fit, data)
    ok_pure = fit["slope"] is not None and fit["slope"] > 0 and fit["r2"] is not None \
        and fit["r2"] >= R2_BAR
    ok_full = math.isfinite(full_ratio) and full_ratio >= KEEP
    verdict = "pass" if ok_pure and ok_full else "fail"
    r2 = "None" if fit["r2"] is None else f"{fit['r2']:.3f}"
    reason = (f"pure attention: slope {fit['slope']:.3g} per step, R^2 {r2} over "
              f"{fit['points']} points; full scheme: r_N / r_0 = {full_ratio:.3g}")
    return Check("rank_collapse", "Rank collapse of pure attention", CLAIM, CITATION, run,
                 criterion, verdict, reason, assumptions, constants, fit, data)


def _scheme_residuals(evo, scheme: str | None, u0, ctx) -> list[float]:
    """r_n along the network's steps under ``scheme`` (a scheme string); [] for None."""
    if scheme is None:
        return []
    from ...time import SaveAt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "attention" leaves the FFN unused
        other = evo.with_scheme(scheme)
    traj = other(u0, ctx, SaveAt(steps=True))
    return [_mean(relative_residual(s)) for s in traj.state_list]


def _no_attention(evo, names: list[list[str]]) -> str:
    """Why pure attention cannot be applied: steps superposing fields, or without one."""
    if evo.superposed_steps:
        return (f"steps {evo.superposed_steps} superpose several fields (parallel_steps): a "
                "sum of attention maps is no stochastic averaging, which the statement is about")
    return f"steps {[i for i, ns in enumerate(names) if not ns]} have no attention operator"


def _na(probe: Probe, why: str, assumptions) -> Check:
    return Check("rank_collapse", "Rank collapse of pure attention", CLAIM, CITATION,
                 "nothing was run", "", NOT_APPLICABLE, why,
                 [*assumptions, assumption(why, False, why)])
