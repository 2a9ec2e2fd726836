"""Checks b and c: clustering in long time and metastability of the frozen attention dynamics
(Geshkovski, Letrouit, Polyanskiy, Rigollet 2023, 2024; Geshkovski, Koubbi, Polyanskiy,
Rigollet 2024; Bruno, Pasqualotto, Agazzi 2025).

Each pretrained step theta^n, frozen (controls fixed at theta^n), is an autonomous system:
``core.frozen_evolution`` continues it to t_max at tau = 1 / k (refined, so that the path is
resolved). The field is the step's attention, the theorems' setting (no FFN), in two readings
of the constraint:

* ``sphere`` (the projection reading): "attention sphere:project", the state projected after
  every substep onto S1 = {mean_y u = 0, var_y u = 1} (``SphereProjection``: no gain, no bias),
  or, for a network that normalises with RMSNorm (the Llama family), onto the sphere
  {|u|^2 = N} that RMSNorm projects onto (``RMSNormProjection`` without eps and gain,
  docs/math.md 3.15); u(0) is projected first;
* ``layernorm``: the attention field with the network's own LayerNorm where the layout puts it
  (post-LN "attention norm1:project", pre-LN "norm1>attention"). With a per-feature gain the
  refined post-LN path is dominated by the iterated LayerNorm (docs/math.md 3.11), so the
  run also iterates the LayerNorm alone ("norm1:project", ``layernorm_alone``) as a control.

A step that superposes several fields (``parallel_steps``) is not one attention field: both
checks leave it out, say so in their reason and assumptions, and are not applicable when no
step is left.

Clusters: the components of the graph cos(u(x), u(x')) > 0.99 (``core.cluster_count``). The
limit geometry is compared with the spectrum of the value map M = W_O W_V (the map a token
applies to the tokens it attends to; all heads together, the key/value heads of grouped-query
attention read once per query head they serve): V = I predicts the vertices of a
polytope, a simple positive top eigenvalue at most 3 hyperplanes (Geshkovski et al. 2023, for
one head on R^d); ``hyperplanes`` counts the groups of the final tokens' projections onto the
top left eigenvector (gaps > 0.05 of the largest |projection|). The verdict is
inconclusive when every tested run starts as one cluster (nothing to cluster).

Metastability: the scores scaled by beta (``core.scaled_attention``) for at least four betas;
the dwell time of a run is its longest plateau of a constant cluster count c with
2 <= c < N (sampled every substep), censored when it lasts to t_max; the fit is of
log(median over the steps of the dwell) against beta (not applicable where that median is 0);
inconclusive when the medians differ by at most ``DWELL_RESOLUTION`` substeps (a dwell is the
difference of two times sampled every substep: such a change may be the sampling alone).
The Gegenbauer prediction of the number of metastable clusters (Bruno et al.: the degree l
maximising
l (l + d - 2) I_{l + d/2 - 1}(beta), the growth rate of the degree-l spherical harmonics of
the linearised mean-field equation at the uniform measure on S^{d-1}, I the modified Bessel
function) assumes Q = K = V = I, many tokens and a near-uniform start on the circle (d = 2)
for a count; it is tested on ``reference``: that system itself (64 tokens, 3 features: the
circle), and reported as not applicable to a trained network.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...operators.attention import AttentionOperator, GroupedQueryAttention, NonlocalAttention
from ...operators.projections import RMSNormProjection, SphereProjection
from ..readings import module_of
from .core import (
    CLUSTER_COSINE,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    Check,
    Probe,
    assumption,
    attention_names,
    cluster_count,
    frozen_evolution,
    linear_fit,
    mean_cosine,
    min_cosine,
    one_field_steps,
    run_frozen,
    scaled_attention,
)

__all__ = ["BETAS", "REFERENCE_BETAS", "clustering", "gegenbauer_mode", "metastability",
           "reference_run", "score_distance", "value_spectrum"]

BETAS = (0.5, 1.0, 2.0, 4.0)
REFERENCE_BETAS = (1.0, 2.0, 3.0, 4.0)
REFERENCE_EVERY = 10  # the reference's cluster counts are kept every 10 units of time
R2_BAR = 0.9
HYPERPLANE_GAP = 0.05
DWELL_RESOLUTION = 2  # substeps: a dwell is a difference of two times sampled every substep

CLAIM_B = ("A frozen attention step is an autonomous interacting-particle system; with the state "
           "on the sphere its tokens converge to clusters in long time, to a single cluster for "
           "generic parameters, and the limit geometry follows the spectrum of the value map "
           "(V = I: vertices of a polytope; a simple positive top eigenvalue: at most 3 "
           "hyperplanes).")
CITATION_B = ("Geshkovski, Letrouit, Polyanskiy, Rigollet, 'The emergence of clusters in "
              "self-attention dynamics', NeurIPS 2023; 'A mathematical perspective on "
              "Transformers', arXiv 2312.10794 (2023-2024).")
CLAIM_C = ("Before the final single cluster the dynamics dwell in metastable multi-cluster "
           "states whose lifetime grows exponentially in the inverse temperature beta (the "
           "score scale); the number of metastable clusters is set by the Gegenbauer mode of "
           "the kernel exp(beta <x, x'>) that grows fastest from the uniform state.")
CITATION_C = ("Geshkovski, Koubbi, Polyanskiy, Rigollet, 'Dynamic metastability in the "
              "self-attention model', arXiv 2410.06833 (2024); Bruno, Pasqualotto, Agazzi, "
              "'Emergence of meta-stable clustering in mean-field transformer models', ICLR "
              "2025 (arXiv 2410.23228).")


# -- the value map ------------------------------------------------------------------------------
def _grouped(w: torch.Tensor, m: GroupedQueryAttention) -> torch.Tensor:
    """A key/value weight (H_kv d_h, dim) read on the query heads: each key/value head's block
    repeated for the H / H_kv query heads it serves, (H d_h, dim)."""
    blocks = w.detach().double().view(m.num_kv_heads, m.head_dim, -1)
    return blocks.repeat_interleave(m.groups, dim=0).reshape(m.num_heads * m.head_dim, -1)


def _maps(op: AttentionOperator) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(M = W_O W_V, B = W_Q^T W_K or None) of an operator with one value map: a
    ``NonlocalAttention`` (its qkv weight), or a ``GroupedQueryAttention`` (the key/value heads
    read on the query heads, ``_grouped``; B is the score at offset x - x' = 0 of a rotary
    operator, where the rotations cancel; None with QK-norm, whose score is not bilinear).
    None for other attention operators."""
    m = module_of(op)
    if type(m) is NonlocalAttention:
        d = m.dim
        w = m.qkv_weight.detach().double()
        return m.out_weight.detach().double() @ w[2 * d:3 * d], w[:d].T @ w[d:2 * d]
    if isinstance(m, GroupedQueryAttention):
        value = m.out_weight.detach().double() @ _grouped(m.v_weight, m)
        score = None if m.q_norm is not None or m.k_norm is not None else (
            m.q_weight.detach().double().T @ _grouped(m.k_weight, m))
        return value, score
    return None


def value_spectrum(op: AttentionOperator) -> dict[str, Any] | None:
    """The spectrum of M = W_O W_V (d x d) of a ``NonlocalAttention`` or a
    ``GroupedQueryAttention`` (``_maps``): the eigenvalue of largest real part and the next
    one, whether it is real, positive and simple, the distance of M from a multiple of I
    (||M - (tr M / d) I||_F / ||M||_F), its prediction of the limit geometry and the top left
    eigenvector (``direction``, not serialised). None for other attention operators (no single
    value map)."""
    maps = _maps(op)
    if maps is None:
        return None
    mat = maps[0]
    d = mat.shape[0]
    eig = torch.linalg.eigvals(mat)
    order = torch.argsort(eig.real, descending=True)
    top, nxt = complex(eig[order[0]]), complex(eig[order[1]]) if d > 1 else complex(0)
    real = abs(top.imag) <= 1e-9 * max(abs(top), 1e-300)
    simple = top.real - nxt.real > 1e-6 * max(abs(top), 1e-300)
    positive = top.real > 0
    identity_dist = float((mat - torch.trace(mat) / d * torch.eye(d, dtype=mat.dtype)).norm()
                          / mat.norm()) if mat.norm() > 0 else float("nan")
    if identity_dist < 0.1:
        predicted = "polytope vertices (V close to a multiple of I)"
    elif real and positive and simple:
        predicted = "at most 3 hyperplanes (simple positive top eigenvalue)"
    else:
        predicted = "no prediction (top eigenvalue not real, positive and simple)"
    vals, vecs = torch.linalg.eig(mat.T)  # left eigenvectors of M
    j = int(torch.argmax(vals.real))
    direction = vecs[:, j].real
    direction = direction / direction.norm() if direction.norm() > 0 else direction
    return {"top_eigenvalue_real": top.real, "top_eigenvalue_imag": top.imag,
            "next_eigenvalue_real": nxt.real, "top_is_real": bool(real),
            "top_is_positive": bool(positive), "top_is_simple": bool(simple),
            "distance_from_identity": identity_dist, "predicted_geometry": predicted,
            "direction": direction}


def score_distance(op: AttentionOperator) -> float | None:
    """||B - (tr B / d) I||_F / ||B||_F for the score map B = W_Q^T W_K of a
    ``NonlocalAttention`` or a ``GroupedQueryAttention`` without QK-norm (the score of one head
    is <W_Q x, W_K x'> = x^T B x'; several heads: B sums theirs; rotary: at offset 0): 0 when
    Q^T K is a multiple of I, the theorems' setting up to the temperature. None for other
    attention operators."""
    maps = _maps(op)
    if maps is None or maps[1] is None:
        return None
    b = maps[1]
    d = b.shape[0]
    norm = b.norm()
    if norm == 0:
        return float("nan")
    return float((b - torch.trace(b) / d * torch.eye(d, dtype=b.dtype)).norm() / norm)


def hyperplanes(u: torch.Tensor, direction: torch.Tensor) -> int:
    """The number of groups of the projections <w, u(x) / |u(x)|> of the tokens (first input)
    onto ``direction``, split where consecutive sorted values differ by more than
    ``HYPERPLANE_GAP`` times the largest |projection|."""
    v = torch.nn.functional.normalize((u[0] if u.dim() == 3 else u).double(), dim=-1)
    p = torch.sort(v @ direction.to(v)).values
    scale = float(p.abs().max())
    if scale == 0:
        return 1
    return 1 + int(((p[1:] - p[:-1]) > HYPERPLANE_GAP * scale).sum())


# -- the frozen runs ------------------------------------------------------------------------------
def _attention_field(evo, step: int = 0
                     ) -> tuple[str, tuple[str, ...], tuple[str, ...], str | None]:
    """(operator, pre, post, projection) of the layout's attention field (the first field), as
    control set ``step`` (one that is not superposed) holds it."""
    theta = evo.controls[step]
    names = attention_names(theta)
    layout = evo.layout or ()
    for f in layout:
        if f.operator in names:
            return f.operator, tuple(f.pre), tuple(f.post), f.projection
    return names[0], (), (), None


def _scheme(op: str, pre: tuple[str, ...], post: tuple[str, ...], proj: str | None) -> str:
    s = (">".join(pre) + ">" if pre else "") + op + ("<" + "<".join(post) if post else "")
    return s + (f" {proj}:project" if proj else "")


def _rms(theta) -> bool:
    return any(isinstance(module_of(o), RMSNormProjection) for o in theta.values())


def _sphere(theta, dim: int):
    """The sphere of the projection reading: RMSNorm's {|u|^2 = N} (no eps, no gain) for a
    control set that normalises with RMSNorm, else S1 (``SphereProjection``)."""
    if _rms(theta):
        return RMSNormProjection(dim, eps=0.0, elementwise_affine=False, upcast=False).double()
    return SphereProjection(dim).double()


def sphere_name(theta) -> str:
    """What the projection reading projects onto, in words (``_sphere``)."""
    if _rms(theta):
        return "the sphere |u|^2 = N of RMSNorm (RMSNormProjection without eps and gain)"
    return "S1 (SphereProjection)"


def _sphere_theta(theta, op: str, post: tuple[str, ...], attention=None) -> dict[str, Any]:
    dim = int(module_of(theta[op]).dim)
    out = {op: attention if attention is not None else theta[op],
           "sphere": _sphere(theta, dim)}
    for n in post:
        out[n] = theta[n]
    return out


def _history(evo, u, ctx, k: int) -> dict[str, list]:
    """Cluster counts and mean cosines at every unit of time, stopping once the tokens are one
    cluster at cosine 1 - 1e-12."""
    counts: list[int] = []
    cosines: list[float] = []
    last: list[torch.Tensor] = [u]

    def every(t, v):
        counts.append(cluster_count(v))
        cosines.append(mean_cosine(v))
        last[0] = v

    run_frozen(evo, u, ctx, k, every, stop=lambda v: counts[-1] == 1 and cosines[-1] > 1 - 1e-12)
    return {"clusters": counts, "mean_cosine": cosines, "final": last[0]}


def _time_to_one(counts: list[int]) -> float | None:
    """The first unit time after which the count stays 1 (None if it does not end at 1)."""
    if not counts or counts[-1] != 1:
        return None
    t = len(counts) - 1
    while t > 0 and counts[t - 1] == 1:
        t -= 1
    return float(t)


def _superposed(superposed: list[int]) -> str:
    return (f"steps {superposed} superpose several fields (parallel_steps): a sum of attention "
            "fields is not one attention field, not run")


def _one_field(superposed: list[int], steps: int) -> dict[str, Any]:
    return assumption("every step is one attention field", not superposed,
                      _superposed(superposed) if superposed else f"all {steps} steps")


def clustering(probe: Probe, t_max: int = 100, k: int = 10) -> Check:
    """Check b (module docstring): every step frozen, to t_max at tau = 1 / k (a superposed
    step is left out: ``core.one_field_steps``)."""
    evo = probe.evolution
    steps, superposed = one_field_steps(evo)
    criterion = ("pass if the sphere run of every step with an attracting value map ends in one "
                 f"cluster by t = {t_max} and at least one starts in more than one; fail if one "
                 "does not end in one cluster; inconclusive when every such run starts as one "
                 "cluster (nothing to cluster); not applicable when no step has an attracting "
                 "value map")
    if not steps:
        return Check("clustering", "Clustering in long time", CLAIM_B, CITATION_B,
                     "nothing was run", criterion, NOT_APPLICABLE, _superposed(superposed),
                     [_one_field(superposed, len(evo.controls))])
    op, pre, post, proj = _attention_field(evo, steps[0])
    u0, ctx = probe.first()
    ln_scheme = _scheme(op, pre, post, proj)
    sphere_scheme = _scheme(op, (), post, "sphere")
    per_step = [_frozen_step(n, evo.controls[n], op, post, proj, sphere_scheme, ln_scheme, u0,
                             ctx, t_max, k)
                for n in steps]
    applicable = [r for r in per_step if r["attracting"]]
    assumptions = [*_clustering_assumptions(evo, op, u0, per_step, applicable, steps[0]),
                   _one_field(superposed, len(evo.controls))]
    fit, constants = _clustering_fit(per_step, applicable, t_max, k, int(u0.shape[1]))
    constants["superposed_steps"] = superposed
    run = _clustering_run(len(per_step), t_max, k, int(u0.shape[1]), sphere_scheme, ln_scheme,
                          proj, sphere_name(evo.controls[steps[0]])) + (
        f" {_superposed(superposed)}." if superposed else "")
    data = {"steps": per_step, "sphere_scheme": sphere_scheme, "layernorm_scheme": ln_scheme}
    verdict, reason = _clustering_verdict(per_step, applicable, t_max,
                                          constants["max_time_to_one_cluster"])
    if superposed:
        reason += f"; {_superposed(superposed)}"
    return Check("clustering", "Clustering in long time", CLAIM_B, CITATION_B, run, criterion,
                 verdict, reason, assumptions, constants, fit, data)


def _frozen_step(n: int, theta, op: str, post: tuple[str, ...], proj: str | None,
                 sphere_scheme: str, ln_scheme: str, u0, ctx, t_max: int, k: int
                 ) -> dict[str, Any]:
    """The record of step n: theta^n frozen, on the sphere (from P_S1(u0)) and with the
    network's LayerNorm (and the LayerNorm alone when it is a projection substep); the cluster
    counts, the time to one cluster, the rate of 1 - mean cosine and the value map's spectrum
    with the hyperplanes of the sphere run's final state."""
    spec = value_spectrum(theta[op])
    direction = spec.pop("direction") if spec is not None else None
    s_theta = _sphere_theta(theta, op, post)
    sphere = frozen_evolution(s_theta, sphere_scheme, t_max, k)
    hs = _history(sphere, s_theta["sphere"](u0, ctx), ctx, k)
    final = hs.pop("final")
    hl = _history(frozen_evolution(theta, ln_scheme, t_max, k), u0, ctx, k)
    hl.pop("final")
    record: dict[str, Any] = {
        "step": n, "sphere_clusters": hs["clusters"], "sphere_mean_cosine": hs["mean_cosine"],
        "sphere_time_to_one_cluster": _time_to_one(hs["clusters"]),
        "sphere_final_clusters": hs["clusters"][-1],
        "layernorm_clusters": hl["clusters"],
        "layernorm_time_to_one_cluster": _time_to_one(hl["clusters"]),
        "layernorm_final_clusters": hl["clusters"][-1]}
    if proj is not None:
        alone = _history(frozen_evolution(theta, f"{proj}:project", t_max, k), u0, ctx, k)
        alone.pop("final")
        record["layernorm_alone_clusters"] = alone["clusters"]
        record["layernorm_alone_final_clusters"] = alone["clusters"][-1]
    rate = _rate(hs["clusters"], hs["mean_cosine"])
    record["convergence_rate"] = rate["slope"] if rate["slope"] is None else -rate["slope"]
    record["convergence_r2"] = rate["r2"]
    if spec is not None:
        record.update(spec)
        record["hyperplanes"] = hyperplanes(final, direction)
        record["geometry_consistent"] = _consistent(spec["predicted_geometry"],
                                                    record["hyperplanes"])
        record["score_distance_from_identity"] = score_distance(theta[op])
    record["attracting"] = spec is None or spec["top_eigenvalue_real"] > 0
    return record


def _clustering_assumptions(evo, op: str, u0, per_step: list[dict[str, Any]],
                            applicable: list[dict[str, Any]], first: int = 0
                            ) -> list[dict[str, Any]]:
    """The theorems' assumptions and whether the network meets them."""
    return [
        assumption("autonomous field", True, "controls frozen at theta^n (one control set "
                   "repeated to t_max)"),
        assumption("state on a sphere", True, f"the sphere reading projects onto "
                   f"{sphere_name(evo.controls[first])} after every substep; the layernorm "
                   "reading (the network's own norm) is reported beside it"),
        assumption("features d >= 3", u0.shape[-1] >= 3, f"d = {u0.shape[-1]}"),
        assumption("attracting value map (top eigenvalue of W_O W_V has positive real part)",
                   bool(applicable), f"{len(applicable)} of {len(per_step)} steps"),
        assumption("V = I and Q^T K = I (the single-cluster theorem)",
                   any(r.get("distance_from_identity", 1.0) < 0.1
                       and r.get("score_distance_from_identity", 1.0) < 0.1 for r in per_step),
                   "distance of W_O W_V and of W_Q^T W_K from a multiple of I per step: "
                   + ", ".join(f"{r.get('distance_from_identity', float('nan')):.2f} and "
                               f"{r.get('score_distance_from_identity', float('nan')):.2f}"
                               for r in per_step)
                   + " (the single-cluster statement for generic parameters is the "
                   "papers' conjecture; the verdict tests it)"),
        assumption("one attention head (the geometry theorems)", _heads(evo, op, first) == 1,
                   f"{_heads(evo, op, first)} heads: M = W_O W_V sums them"),
    ]


def _clustering_fit(per_step: list[dict[str, Any]], applicable: list[dict[str, Any]],
                    t_max: int, k: int, n_tokens: int
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fit, constants): the rate fit of the step of median rate, and the counts and times
    over the steps."""
    ends = [r["sphere_final_clusters"] for r in applicable]
    times = [r["sphere_time_to_one_cluster"] for r in applicable]
    rates = [r for r in applicable if r["convergence_rate"] is not None]
    mid = sorted(rates, key=lambda r: r["convergence_rate"])[len(rates) // 2] if rates else None
    fit = ({"what": "log(1 - mean cosine) against t once one cluster, the step of median rate",
            "step": mid["step"], "slope": -mid["convergence_rate"], "r2": mid["convergence_r2"]}
           if mid is not None else {"what": "no step reached one cluster", "r2": None})
    constants = {
        "t_max": t_max, "tau": 1.0 / k, "tokens": n_tokens, "cluster_cosine": 0.99,
        "steps_one_cluster": sum(1 for e in ends if e == 1),
        "steps_tested": len(applicable),
        "median_time_to_one_cluster": _median([t for t in times if t is not None]),
        "max_time_to_one_cluster": max((t for t in times if t is not None), default=None),
        "layernorm_steps_one_cluster": sum(1 for r in per_step
                                           if r["layernorm_final_clusters"] == 1),
        "median_convergence_rate": _median([r["convergence_rate"] for r in rates]),
        "geometry_consistent_steps": sum(1 for r in per_step if r.get("geometry_consistent")),
        "geometry_predicted_steps": sum(1 for r in per_step
                                        if r.get("geometry_consistent") is not None)}
    return fit, constants


def _clustering_run(steps: int, t_max: int, k: int, n_tokens: int, sphere_scheme: str,
                    ln_scheme: str, proj: str | None, sphere: str = "S1 (SphereProjection)"
                    ) -> str:
    """What check b ran, in a sentence."""
    return (f"Each of the {steps} steps frozen (controls fixed at theta^n) and continued "
            f"to t = {t_max} at tau = 1/{k} from the network's u(0) of one input ({n_tokens} "
            f"tokens, float64): attention only, on the sphere ('{sphere_scheme}', {sphere}) "
            f"and with the network's own norm, LayerNorm or RMSNorm ('{ln_scheme}')"
            + (f", and the LayerNorm alone ('{proj}:project') as a control" if proj else "")
            + "; clusters counted at every unit of time.")


def _clustering_verdict(per_step: list[dict[str, Any]], applicable: list[dict[str, Any]],
                        t_max: int, last: float | None) -> tuple[str, str]:
    """(verdict, reason): pass when every attracting step's sphere run ends in one cluster and
    one of them started in several (inconclusive when all started as one: no effect to see)."""
    if not applicable:
        return NOT_APPLICABLE, ("no step's value map is attracting (top eigenvalue of W_O W_V "
                                "with real part <= 0)")
    bad = [r for r in applicable if r["sphere_final_clusters"] != 1]
    reason = (f"{len(applicable) - len(bad)} of {len(applicable)} steps reach one cluster on the "
              f"sphere by t = {t_max}"
              + (f"; steps {[r['step'] for r in bad]} end in "
                 f"{[r['sphere_final_clusters'] for r in bad]} clusters" if bad else
                 f" (the last at t = {last:g})"))
    if bad:
        return "fail", reason
    if all(r["sphere_clusters"][0] == 1 for r in applicable):
        return INCONCLUSIVE, (f"{reason}, but every one was one cluster at t = 0 (cosines > "
                              f"{CLUSTER_COSINE} chain all tokens): nothing to cluster")
    return "pass", reason


def _heads(evo, op: str, step: int = 0) -> int:
    return int(getattr(module_of(evo.controls[step][op]), "num_heads", 1))


def _consistent(predicted: str, planes: int) -> bool | None:
    if predicted.startswith("at most 3"):
        return planes <= 3
    return None


def _rate(counts: list[int], cosines: list[float]) -> dict[str, Any]:
    """The fit of log(1 - mean cosine) against t over the unit times once one cluster, while
    1 - mean cosine > 1e-12."""
    ts, ys = [], []
    for t, (c, m) in enumerate(zip(counts, cosines, strict=True)):
        if c == 1 and 1 - m > 1e-12:
            ts.append(float(t))
            ys.append(math.log(1 - m))
    return linear_fit(ts, ys)


def _median(values: list[float]) -> float | None:
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    m = len(v) // 2
    return v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])


# -- metastability --------------------------------------------------------------------------------
def _plateau(evo, u, ctx, k: int, n_tokens: int) -> dict[str, Any]:
    """The longest plateau of a constant cluster count c, 2 <= c < N, sampled every substep:
    its length (in t), count and start, whether it lasted to t_max (censored), and the counts
    at every unit of time."""
    tau = 1.0 / k
    best = (0.0, None, None, False)
    cur_c, cur_start = cluster_count(u), 0.0
    counts = [cur_c]
    steps = evo.num_steps
    with torch.no_grad():
        for i in range(steps):
            u = evo.advance(i, u, ctx)
            c = cluster_count(u)
            t = (i + 1) * tau
            if (i + 1) % k == 0:
                counts.append(c)
            if c != cur_c:
                if 2 <= cur_c < n_tokens and t - cur_start > best[0]:
                    best = (t - cur_start, cur_c, cur_start, False)
                cur_c, cur_start = c, t
            if c == 1 and min_cosine(u) > CLUSTER_COSINE:
                break
        else:
            t = steps * tau
            if 2 <= cur_c < n_tokens and t - cur_start > best[0]:
                best = (t - cur_start, cur_c, cur_start, True)
    return {"dwell": best[0], "count": best[1], "start": best[2], "censored": best[3],
            "clusters": counts}


def metastability(probe: Probe, betas=BETAS, t_max: int = 30, k: int = 10,
                  reference_t_max: int = 2500, seed: int = 0) -> Check:
    """Check c (module docstring): the sphere run of every step with its scores times each
    beta, to t_max at tau = 1 / k; and the reference system (Q = K = V = I on the circle) to
    ``reference_t_max`` (0: not run)."""
    betas = tuple(float(b) for b in betas)
    evo = probe.evolution
    steps, superposed = one_field_steps(evo)
    u0, ctx = probe.first()
    n_tokens = int(u0.shape[1])
    if not steps:
        return Check("metastability", "Metastability in beta", CLAIM_C, CITATION_C,
                     "nothing was run", _metastability_text("", betas, t_max, k, n_tokens)[1],
                     NOT_APPLICABLE, _superposed(superposed),
                     [_one_field(superposed, len(evo.controls))])
    op, _, post, _ = _attention_field(evo, steps[0])
    scheme = _scheme(op, (), post, "sphere")
    runs, attracting = _beta_runs(evo, steps, op, post, scheme, u0, ctx, betas, t_max, k)
    medians = [_median([r["dwell"] for r in runs if r["beta"] == b]) for b in betas]
    fit = linear_fit(betas, [math.log(m) if m is not None and m > 0 else None for m in medians])
    fit["what"] = "log(median dwell over the steps) against beta"
    ref = reference_run(t_max=reference_t_max, seed=seed) if reference_t_max > 0 else None
    gegen = _gegenbauer_note(evo, steps, op, n_tokens, int(u0.shape[-1]))
    censored = sum(int(r["censored"]) for r in runs)
    known = [m for m in medians if m is not None]
    constants = {"betas": list(betas), "median_dwell": medians, "dwell_growth": fit["slope"],
                 "log_dwell_intercept": fit["intercept"], "censored_runs": censored,
                 "runs": len(runs), "t_max": t_max, "tau": 1.0 / k,
                 "dwell_spread": max(known) - min(known) if known else None,
                 "dwell_resolution": DWELL_RESOLUTION / k, "superposed_steps": superposed}
    if ref is not None:
        constants["reference_dwell_growth"] = ref["fit"]["slope"]
        constants["reference_r2"] = ref["fit"]["r2"]
        constants["reference_gegenbauer_matches"] = ref["matches"]
    assumptions = [*_metastability_assumptions(betas, attracting, medians, gegen["why"]),
                   _one_field(superposed, len(evo.controls))]
    run, criterion = _metastability_text(scheme, betas, t_max, k, n_tokens)
    if superposed:
        run += f" {_superposed(superposed)}."
    data = {"runs": runs, "per_step_fits": _per_step_fits(runs), "gegenbauer": gegen,
            "reference": ref}
    verdict, reason = _metastability_verdict(assumptions[:3], fit, censored, len(runs),
                                             constants["dwell_spread"],
                                             constants["dwell_resolution"])
    if superposed:
        reason += f"; {_superposed(superposed)}"
    return Check("metastability", "Metastability in beta", CLAIM_C, CITATION_C, run, criterion,
                 verdict, reason, assumptions, constants, fit, data)


def _beta_runs(evo, steps: list[int], op: str, post: tuple[str, ...], scheme: str, u0, ctx,
               betas: tuple[float, ...], t_max: int, k: int
               ) -> tuple[list[dict[str, Any]], list[bool]]:
    """(runs, attracting): the plateau (``_plateau``) of the sphere run of every step of
    ``steps`` with an attracting value map at each beta, and per step whether its value map
    attracts."""
    runs: list[dict[str, Any]] = []
    attracting = []
    n_tokens = int(u0.shape[1])
    for n in steps:
        theta = evo.controls[n]
        spec = value_spectrum(theta[op])
        attract = spec is None or spec["top_eigenvalue_real"] > 0
        attracting.append(attract)
        if not attract:
            continue
        for b in betas:
            s_theta = _sphere_theta(theta, op, post, scaled_attention(theta[op], b))
            fe = frozen_evolution(s_theta, scheme, t_max, k)
            p = _plateau(fe, s_theta["sphere"](u0, ctx), ctx, k, n_tokens)
            runs.append({"step": n, "beta": b, **p})
    return runs, attracting


def _per_step_fits(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: the fit of log dwell against beta over its runs, and its censored runs."""
    out = []
    for n in sorted({r["step"] for r in runs}):
        rs = [r for r in runs if r["step"] == n]
        f = linear_fit([r["beta"] for r in rs],
                       [math.log(r["dwell"]) if r["dwell"] > 0 else None for r in rs])
        out.append({"step": n, "slope": f["slope"], "r2": f["r2"],
                    "censored": sum(int(r["censored"]) for r in rs)})
    return out


def _gegenbauer_note(evo, steps: list[int], op: str, n_tokens: int, d: int) -> dict[str, Any]:
    """Why the Gegenbauer count is not applied to the network (its assumptions)."""
    dist = [value_spectrum(evo.controls[n][op]) for n in steps]
    return {"applicable": False,
            "why": "the Gegenbauer count assumes Q = K = V = I, many tokens near the uniform "
                   "measure on the circle; the network's value maps are far from I (distance "
                   + ", ".join(f"{x['distance_from_identity']:.2f}" if x else "n/a"
                               for x in dist)
                   + f"), its {n_tokens} tokens start from its embedding, d = "
                   f"{d}; the reference system below is the setting where it "
                   "holds"}


def _metastability_assumptions(betas: tuple[float, ...], attracting: list[bool],
                               medians: list[float | None], why: str) -> list[dict[str, Any]]:
    """The assumptions of check c; the first three decide whether it applies."""
    return [
        assumption("at least four betas", len(betas) >= 4, f"{len(betas)} betas"),
        assumption("attracting value maps", any(attracting),
                   f"{sum(attracting)} of {len(attracting)} steps"),
        assumption("a dwell time measured at every beta", all(m is not None and m > 0
                                                              for m in medians),
                   "median dwell per beta: " + ", ".join("none" if m is None else f"{m:.3g}"
                                                         for m in medians)),
        assumption("Q = K = V = I, many tokens, near-uniform start (the Gegenbauer count)",
                   False, why),
    ]


def _metastability_text(scheme: str, betas: tuple[float, ...], t_max: int, k: int,
                        n_tokens: int) -> tuple[str, str]:
    """(run, criterion) of check c, in sentences."""
    run = (f"Every step with an attracting value map, frozen, attention only on the sphere "
           f"('{scheme}'), its scores multiplied by beta in {list(betas)}, to t = {t_max} at "
           f"tau = 1/{k} from u(0) of one input ({n_tokens} tokens); dwell = the longest "
           "plateau of a constant cluster count 2 <= c < N (sampled every substep; censored "
           "when it lasts to t_max). Reference: the theory's own system (Q = K = V = I, one "
           f"head, 64 tokens near-uniform on the circle, betas {list(REFERENCE_BETAS)}).")
    criterion = (f"pass if log(median dwell) against beta has slope > 0 and R^2 >= {R2_BAR}; "
                 "inconclusive when the median dwells differ by at most "
                 f"{DWELL_RESOLUTION} substeps ({DWELL_RESOLUTION}/{k} in t: a dwell is "
                 "the difference of two times sampled every substep, so such a change may be "
                 "the sampling alone); not applicable with fewer than four betas, when no step "
                 "has an attracting value map, or when the median dwell over the steps is 0 at "
                 "some beta (most steps have no multi-cluster plateau there)")
    return run, criterion


def _metastability_verdict(deciding: list[dict[str, Any]], fit: dict[str, Any],
                           censored: int, runs: int, spread: float | None,
                           resolution: float) -> tuple[str, str]:
    """(verdict, reason): not applicable when a deciding assumption fails; inconclusive when
    the median dwells differ by no more than ``resolution`` (``spread``: the largest minus the
    smallest); pass when the fit of log dwell against beta rises with R^2 >= R2_BAR."""
    if not all(a["holds"] for a in deciding):
        return NOT_APPLICABLE, "; ".join(a["name"] for a in deciding if not a["holds"])
    ok = fit["slope"] is not None and fit["slope"] > 0 and fit["r2"] is not None \
        and fit["r2"] >= R2_BAR
    r2 = "None" if fit["r2"] is None else f"{fit['r2']:.3f}"
    reason = (f"log dwell against beta: slope {fit['slope']:.3g}, R^2 {r2} ({censored} of "
              f"{runs} runs censored at t_max)")
    if spread is not None and spread <= resolution * (1 + 1e-9):
        return INCONCLUSIVE, (f"the median dwell changes by {spread:.3g} over the betas, "
                              f"within the resolution {resolution:.3g} ({DWELL_RESOLUTION} "
                              f"substeps); {reason}")
    return ("pass" if ok else "fail"), reason


def _log_bessel_i(nu: float, x: float) -> float:
    """log I_nu(x) for x > 0 by its power series sum_j (x/2)^(2j + nu) / (j! Gamma(j + nu + 1))
    (summed in log space)."""
    terms = [(2 * j + nu) * math.log(x / 2) - math.lgamma(j + 1) - math.lgamma(j + nu + 1)
             for j in range(int(4 * x) + 60)]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def gegenbauer_mode(beta: float, d: int, max_degree: int = 200) -> int:
    """The degree l >= 1 maximising l (l + d - 2) I_{l + d/2 - 1}(beta): the fastest-growing
    spherical harmonic of the mean-field equation on S^{d-1} linearised at the uniform
    measure, for the kernel exp(beta <x, x'>) (Funk-Hecke; Bruno et al. 2025). On the circle
    (d = 2): l^2 I_l(beta), e.g. 3 at beta = 5."""
    if beta <= 0:
        return 1
    return max(range(1, max_degree + 1),
               key=lambda deg: math.log(deg * (deg + d - 2)) + _log_bessel_i(deg + d / 2 - 1,
                                                                                beta))


def reference_run(betas=REFERENCE_BETAS, tokens: int = 64, t_max: int = 2500, k: int = 5,
                  seed: int = 0) -> dict[str, Any]:
    """The theory's own system: Q = K = V = I, one head, the tokens on the circle (3 features
    projected onto S1: a circle in the plane mean_y u = 0, radius sqrt(3)), equally spaced with
    angular noise 0.01 (seeded), scores beta <x, x'> / |x|^2. Per beta: the first metastable
    count (the first count 2 <= c < N seen at 5 consecutive unit times; 1 when the tokens go
    straight to one cluster), the Gegenbauer mode on
    the circle, the dwell (``_plateau``); the fit of log dwell against beta."""
    g = torch.Generator().manual_seed(int(seed))
    d = 3
    angle = (torch.arange(tokens, dtype=torch.float64) * 2 * math.pi / tokens
             + 0.01 * torch.randn(tokens, generator=g, dtype=torch.float64))
    e1 = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64) / math.sqrt(2)
    e2 = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64) / math.sqrt(6)
    sphere = SphereProjection(d).double()
    x = sphere(((torch.cos(angle)[:, None] * e1 + torch.sin(angle)[:, None] * e2)
                * math.sqrt(d))[None])
    rows = []
    for b in betas:
        att = NonlocalAttention(d, 1, bias=False, dtype=torch.float64)
        with torch.no_grad():
            att.qkv_weight.copy_(torch.cat([torch.eye(d, dtype=torch.float64)] * 3))
            att.out_weight.copy_(torch.eye(d, dtype=torch.float64))
        att.set_kernel("softmax", scale=float(b) / d)
        evo = frozen_evolution({"attention": att, "sphere": sphere}, "attention sphere:project",
                               t_max, k)
        p = _plateau(evo, x, None, k, tokens)
        first = _first_plateau(p["clusters"], tokens, 5)
        if first is None and p["clusters"][-1] == 1:
            first = 1  # straight to one cluster: the mode l = 1
        rows.append({"beta": float(b), "dwell": p["dwell"], "censored": p["censored"],
                     "first_metastable_clusters": first, "gegenbauer_mode": gegenbauer_mode(b, 2),
                     "clusters": p["clusters"][::REFERENCE_EVERY]})
    fit = linear_fit([r["beta"] for r in rows],
                     [math.log(r["dwell"]) if r["dwell"] > 0 else None for r in rows])
    return {"system": "Q = K = V = I, one head, tokens on the circle", "tokens": tokens,
            "clusters_every": REFERENCE_EVERY,
            "t_max": t_max, "tau": 1.0 / k, "rows": rows, "fit": fit,
            "matches": sum(1 for r in rows
                           if r["first_metastable_clusters"] == r["gegenbauer_mode"])}


def _first_plateau(counts: list[int], n: int, length: int) -> int | None:
    run_c, run_len = None, 0
    for c in counts:
        if c == run_c:
            run_len += 1
        else:
            run_c, run_len = c, 1
        if run_c is not None and 2 <= run_c < n and run_len >= length:
            return run_c
    return None
