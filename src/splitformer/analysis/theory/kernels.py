"""Checks d and e: the attention kernels of the network's own steps.

``step_kernels`` runs an evolution's steps (its own scheme, tau) and reads, at every attention
substep, the kernel g_h(x, x') at the state that substep's field sees (``readings``), with its
support.

Check d, critical log n scaling (arXiv 2510.05554; YaRN's attention temperature): a fixed score
scale lets attention flatten towards the uniform kernel as the number of tokens n grows; scores
multiplied by beta_n = log n / log n0 (the pretrained scale at n0) keep it between collapse
and the identity. On the same text at n = 32 .. 512 tokens: the normalised attention entropy
H / log |support| (1 for a uniform kernel, 0 for one that picks one token; mean over the steps,
heads and queries) and the normalised effective rank erank(u^{n+1}) / n, with the pretrained
scale and with beta_n. Fit: each against log n; pass if the scaled kernel's entropy slope is
at most half the pretrained one's in size, or below ``FLAT`` (0.01 per unit log n);
inconclusive when both slopes are within ``FLAT`` (the pretrained kernel does not flatten
measurably: there is nothing for the scaling to correct). Not applicable to a model with a
superposed step (``parallel_steps``): its kernels are sums the entropy of one kernel does not
describe.

Check e, doubly stochastic drift (Sinkformers): a softmax kernel is row-stochastic; Sander et
al. observe that training makes it close to doubly stochastic. Deviation of a kernel:
mean over inputs, heads and keys x' of |sum_x g(x, x') - 1|. Measured on the trained steps
and on the same evolution with its controls re-drawn, once by the operators' own
initialisation (``reset_parameters``, seeded) and once matched (each parameter tensor
replaced by Gaussian noise of its own mean and standard deviation), all from the trained
u(0). Pass if the trained deviation (mean over the steps) is below both untrained references
(the initialisation's and the matched noise's), fail if above both; inconclusive when it lies
between them (the choice of what "untrained" means moves the deviation more than training
did). A superposed step (``parallel_steps``) has no one kernel: it is left out of the means,
and said so.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...operators.attention import AttentionOperator
from ..checks import ArgumentError
from ..geometry import attention_entropy, effective_rank
from ..readings import attentions, compose, kernel_and_support, module_of
from .core import (
    INCONCLUSIVE,
    NOT_APPLICABLE,
    Check,
    Probe,
    assumption,
    linear_fit,
    one_field_steps,
    rescale_scores,
)

__all__ = ["LENGTHS", "doubly_stochastic", "log_n_scaling", "step_kernels", "with_attention"]

LENGTHS = (32, 64, 128, 256, 512)
FLAT = 0.01  # |slope| per unit log n below which a curve counts as flat

CLAIM_D = ("With a fixed score scale, attention flattens towards the uniform kernel as the "
           "number of tokens n grows; scaling the scores by beta log n keeps the normalised "
           "attention entropy (and the effective rank) flat in n.")
CITATION_D = ("'Critical attention scaling in long-context transformers', arXiv 2510.05554 "
              "(2025); Peng et al., 'YaRN: efficient context window extension of large language "
              "models' (2023), its attention temperature.")
CLAIM_E = ("Trained softmax attention drifts towards doubly stochastic kernels: the column sums "
           "of a trained kernel are closer to 1 than those of the same network at "
           "initialisation.")
CITATION_E = ("Sander, Ablin, Blondel, Peyre, 'Sinkformers: Transformers with doubly stochastic "
              "attention', AISTATS 2022.")


def step_kernels(evo, u0: torch.Tensor, ctx) -> list[dict[str, Any]]:
    """Per step n of ``evo``: ``kernels`` (the (g, support) of each attention substep, at the
    state its field sees) and ``after`` (u^{n+1})."""
    out = []
    stages = evo.scheme.stages
    u = u0
    with torch.no_grad():
        for i in range(evo.num_steps):
            theta = evo.theta(i)
            seen: list[torch.Tensor] = []
            after = evo.advance(i, u, ctx, lambda v, j, seen=seen: seen.append(v))
            kernels = []
            for j, st in enumerate(stages):
                before = u if j == 0 else seen[j - 1]
                for stage, _name, op in attentions([st], theta) if st.kind == "field" else []:
                    inp = compose(stage.pre, before, theta, ctx)
                    kernels.append(kernel_and_support(op, inp, ctx))
            out.append({"kernels": kernels, "after": after})
            u = after
    return out


def with_attention(evo, fn: Callable[[AttentionOperator], None]):
    """A deep copy of ``evo`` with ``fn`` applied in place to each attention operator of its
    controls, once (an operator that several control sets share, as in a weight-tied network,
    is one operator), its compiled plans dropped so that they are built on the copies."""
    new = copy.deepcopy(evo)
    new.__dict__.pop("_plans", None)
    seen: set[int] = set()
    for theta in new.controls:
        for op in theta.values():
            m = module_of(op)
            if isinstance(m, AttentionOperator) and id(m) not in seen:
                seen.add(id(m))
                fn(m)
    return new


def _rescale(beta: float) -> Callable[[AttentionOperator], None]:
    return lambda op: rescale_scores(op, beta)


def _entropy(g: torch.Tensor, support: torch.Tensor) -> float:
    """Mean over inputs, heads and queries with more than one key of H(g(x, .)) / log(the
    support's size)."""
    size = support.sum(-1).double()
    h = attention_entropy(g)
    keep = size > 1
    if not bool(keep.any()):
        return float("nan")
    return float((h[keep] / torch.log(size[keep])).mean())


def _scaling_row(evo, u0, ctx) -> dict[str, Any]:
    steps = step_kernels(evo, u0, ctx)
    n = int(u0.shape[1])
    ent = [sum(_entropy(g, s) for g, s in st["kernels"]) / len(st["kernels"]) for st in steps]
    rank = [float(effective_rank(st["after"].detach()).mean()) / n for st in steps]
    return {"entropy": ent, "rank": rank, "mean_entropy": sum(ent) / len(ent),
            "mean_rank": sum(rank) / len(rank)}


def log_n_scaling(probe: Probe, lengths: Sequence[int] = LENGTHS, n0: int | None = None
                  ) -> Check:
    """Check d (module docstring) at the token counts ``lengths`` (those the model takes; each
    >= 2); n0 (>= 2) defaults to the smallest. ArgumentError naming ``n0`` or ``lengths``
    otherwise."""
    title = "Critical log n scaling of the scores"
    if n0 is not None and (isinstance(n0, bool) or not isinstance(n0, numbers.Integral)
                           or n0 < 2):
        raise ArgumentError("n0", f"expected a token count >= 2 (log n0 > 0), got {n0!r}")
    short = [n for n in lengths if int(n) < 2]
    if short:
        raise ArgumentError("lengths", f"expected token counts >= 2, got {short}")
    usable = sorted({int(n) for n in lengths
                     if probe.max_tokens is None or n <= probe.max_tokens})
    why, assumptions = _length_assumptions(probe, lengths, usable)
    criterion = ("pass if |slope| of the mean normalised entropy against log n with the scaled "
                 "kernel is at most half of its |slope| with the pretrained scale, or at most "
                 f"{FLAT:g} (flat: a change below 0.028 from 32 to 512 tokens); inconclusive "
                 f"when both slopes are at most {FLAT:g} in size (the pretrained kernel does not "
                 "flatten measurably)")
    if why is not None:
        return Check("log_n_scaling", title, CLAIM_D, CITATION_D, "nothing was run", criterion,
                     NOT_APPLICABLE, why, assumptions)
    n0 = usable[0] if n0 is None else int(n0)
    rows = [_length_row(probe, n, n0) for n in usable]
    fit, constants = _length_fits(rows, n0, usable)
    sp, ss = constants["entropy_slope_pretrained"], constants["entropy_slope_scaled"]
    ok = sp is not None and ss is not None and abs(ss) <= max(0.5 * abs(sp), FLAT)
    flat = sp is not None and ss is not None and abs(sp) <= FLAT and abs(ss) <= FLAT
    run = (f"The network's evolution on the same text cut to n = {usable} tokens (float64), "
           f"with its pretrained score scale and with the scores times beta_n = log n / log "
           f"{n0}; per step the normalised entropy of each attention kernel (mean over heads "
           "and queries) and the effective rank of u^{n+1} over n.")
    reason = (f"entropy slope per unit log n: {sp:.3g} pretrained, {ss:.3g} scaled "
              f"(effective rank / n: {constants['rank_slope_pretrained']:.3g} and "
              f"{constants['rank_slope_scaled']:.3g})")
    if flat:
        verdict = INCONCLUSIVE
        reason = (f"both entropy slopes are within {FLAT:g} per unit log n: the pretrained "
                  f"kernel does not flatten measurably over {usable}; {reason}")
    else:
        verdict = "pass" if ok else "fail"
    return Check("log_n_scaling", title, CLAIM_D, CITATION_D, run, criterion, verdict, reason,
                 assumptions, constants, fit, {"rows": rows})


def _length_assumptions(probe: Probe, lengths: Sequence[int], usable: list[int]
                        ) -> tuple[str | None, list[dict[str, Any]]]:
    """(why check d cannot run, or None; its assumptions): the token count must vary on one
    text, at least 3 lengths must fit, and every kernel must have a score scale."""
    why = None
    superposed = one_field_steps(probe.evolution)[1]
    if superposed:
        why = (f"steps {superposed} superpose several fields (parallel_steps): their kernels "
               "are sums of attention maps, which the entropy of one kernel does not describe")
    elif probe.lengths is None:
        why = ("the model's input has a fixed token count (an image or a series): n cannot be "
               "varied on the same input")
    elif len(usable) < 3:
        why = (f"fewer than 3 of the lengths {list(lengths)} fit the model (at most "
               f"{probe.max_tokens} tokens)")
    ops = [module_of(op) for th in probe.evolution.controls for op in th.values()
           if isinstance(module_of(op), AttentionOperator)]
    kinds = {type(op.kernel).__name__ for op in ops}
    scalable = all(op.kernel.takes_scale for op in ops)
    if why is None and not scalable:
        why = f"a kernel without a score scale ({sorted(kinds)})"
    assumptions = [assumption("the token count can vary on one text", probe.lengths is not None,
                              "a text model (its tokenizer) reads the same text at n tokens"
                              if probe.lengths is not None else why or ""),
                   assumption("kernels with a score scale", scalable, f"kernels {sorted(kinds)}")]
    return why, assumptions


def _length_row(probe: Probe, n: int, n0: int) -> dict[str, Any]:
    """The text at n tokens, run with the pretrained scale and with the scores times
    beta_n = log n / log n0: per-step entropies and ranks, and their means."""
    u0, ctx = probe.lengths(n)
    beta = math.log(n) / math.log(n0)
    pre = _scaling_row(probe.evolution, u0, ctx)
    scaled = _scaling_row(with_attention(probe.evolution, _rescale(beta)), u0, ctx)
    return {"tokens": n, "beta": beta, "pretrained_entropy": pre["entropy"],
            "scaled_entropy": scaled["entropy"], "pretrained_rank": pre["rank"],
            "scaled_rank": scaled["rank"],
            "pretrained_mean_entropy": pre["mean_entropy"],
            "scaled_mean_entropy": scaled["mean_entropy"],
            "pretrained_mean_rank": pre["mean_rank"],
            "scaled_mean_rank": scaled["mean_rank"]}


def _length_fits(rows: list[dict[str, Any]], n0: int, usable: list[int]
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fit, constants): the least-squares fits of the mean entropies and ranks against log n;
    the headline fit is the scaled kernel's entropy."""
    x = [math.log(r["tokens"]) for r in rows]
    fits = {key: linear_fit(x, [r[key] for r in rows])
            for key in ("pretrained_mean_entropy", "scaled_mean_entropy",
                        "pretrained_mean_rank", "scaled_mean_rank")}
    constants = {"n0": n0, "lengths": usable,
                 "entropy_slope_pretrained": fits["pretrained_mean_entropy"]["slope"],
                 "entropy_slope_scaled": fits["scaled_mean_entropy"]["slope"],
                 "rank_slope_pretrained": fits["pretrained_mean_rank"]["slope"],
                 "rank_slope_scaled": fits["scaled_mean_rank"]["slope"],
                 "entropy_spread_pretrained": _spread(r["pretrained_mean_entropy"] for r in rows),
                 "entropy_spread_scaled": _spread(r["scaled_mean_entropy"] for r in rows)}
    fit = {"what": "mean normalised entropy against log n, scaled kernel",
           **fits["scaled_mean_entropy"],
           "pretrained": fits["pretrained_mean_entropy"]}
    return fit, constants


def _spread(values) -> float:
    v = list(values)
    return max(v) - min(v)


def _deviation(g: torch.Tensor, support: torch.Tensor) -> float:
    """mean over inputs, heads and keys (those some query sees) of |sum_x g(x, x') - r / c|,
    r and c the numbers of queries and keys with support (1 on a square grid)."""
    rows = support.any(-1).double().sum(-1, keepdim=True)  # (B, H, 1)
    cols_mask = support.any(-2)  # (B, H, N_k)
    cols = cols_mask.double().sum(-1, keepdim=True)
    col_sums = g.double().sum(-2)  # (B, H, N_k)
    dev = (col_sums - rows / cols).abs()
    return float(dev[cols_mask].mean())


def _deviations(evo, u0, ctx, steps: list[int]) -> list[float]:
    """The mean deviation of the kernels of each step of ``steps`` (one attention field each)."""
    read = step_kernels(evo, u0, ctx)
    return [sum(_deviation(g, s) for g, s in read[n]["kernels"]) / len(read[n]["kernels"])
            for n in steps]


def _reset(seed: int) -> Callable[[Any], Any]:
    def build(evo):
        new = copy.deepcopy(evo)
        new.__dict__.pop("_plans", None)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for m in new.controls.modules():
                if hasattr(m, "reset_parameters") and m is not new.controls:
                    m.reset_parameters()
        return new

    return build


def _matched(seed: int) -> Callable[[Any], Any]:
    def build(evo):
        new = copy.deepcopy(evo)
        new.__dict__.pop("_plans", None)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in new.controls.parameters():
                if p.numel() > 1:
                    noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
                    p.copy_((p.mean() + p.std() * noise).to(p))
        return new

    return build


def doubly_stochastic(probe: Probe, seed: int = 0) -> Check:
    """Check e (module docstring)."""
    title = "Doubly stochastic drift of trained attention"
    evo, u0, ctx = probe.evolution, probe.u0, probe.context
    steps, superposed = one_field_steps(evo)
    skipped = (f"steps {superposed} superpose several fields (parallel_steps): no one kernel, "
               "left out" if superposed else "")
    causal = bool(ctx is not None and ctx.is_causal) or any(
        getattr(module_of(op).kernel, "causal_support", False) for th in evo.controls
        for op in th.values() if isinstance(module_of(op), AttentionOperator))
    kinds = sorted({module_of(op).kernel.name for th in evo.controls for op in th.values()
                    if isinstance(module_of(op), AttentionOperator)})
    assumptions = [
        assumption("full (not causal) support", not causal,
                   "a causal kernel is lower triangular: its column sums are not near 1 by "
                   "construction" if causal else "every query sees every key"),
        assumption("softmax kernels (row-stochastic)", kinds == ["softmax"], f"kernels {kinds}"),
        assumption("trained weights", probe.trained,
                   "the model's weights were trained" if probe.trained else
                   "the model has random weights (a built-in model): there is no training "
                   "to drift"),
        assumption("a step that is one attention field", bool(steps),
                   skipped or f"all {len(steps)} steps")]
    criterion = ("pass if the trained steps' column-sum deviation (mean over the steps) is below "
                 "that of the same evolution at its initialisation and with matched noise, "
                 "fail if above both; inconclusive when it lies between the two")
    if not all(a["holds"] for a in assumptions):
        return Check("doubly_stochastic", title, CLAIM_E, CITATION_E, "nothing was run",
                     criterion, NOT_APPLICABLE,
                     "; ".join(f"{a['name']} does not hold: {a['detail']}" for a in assumptions
                               if not a["holds"]), assumptions)
    trained = _deviations(evo, u0, ctx, steps)
    init = _deviations(_reset(seed)(evo), u0, ctx, steps)
    matched = _deviations(_matched(seed)(evo), u0, ctx, steps)
    mean = {k: sum(v) / len(v) for k, v in (("trained", trained), ("init", init),
                                            ("matched", matched))}
    fit = linear_fit(steps, trained)
    fit["what"] = "trained deviation against the step n"
    constants = {"trained_mean_deviation": mean["trained"],
                 "init_mean_deviation": mean["init"],
                 "matched_mean_deviation": mean["matched"],
                 "ratio_to_init": mean["trained"] / mean["init"] if mean["init"] > 0 else None,
                 "ratio_to_matched": (mean["trained"] / mean["matched"]
                                      if mean["matched"] > 0 else None),
                 "seed": seed, "superposed_steps": superposed}
    lo, hi = sorted((mean["init"], mean["matched"]))
    run = (f"The network's {len(trained)} steps on its u(0) ({u0.shape[0]} input(s), "
           f"{u0.shape[1]} tokens, float64), the kernel of each attention substep read at the "
           "state its field sees; the same with the controls re-drawn by the operators' "
           f"initialisation (seed {seed}) and by matched Gaussian noise (each tensor's own "
           "mean and standard deviation).")
    reason = (f"mean |column sum - 1|: trained {mean['trained']:.3g}, initialisation "
              f"{mean['init']:.3g}, matched noise {mean['matched']:.3g}")
    if lo <= mean["trained"] <= hi:
        verdict = INCONCLUSIVE
        reason = f"trained lies between the two untrained references: {reason}"
    else:
        verdict = "pass" if mean["trained"] < lo else "fail"
    if superposed:
        run += f" {skipped}."
        reason += f"; {skipped}"
    return Check("doubly_stochastic", title, CLAIM_E, CITATION_E, run, criterion, verdict,
                 reason, assumptions, constants, fit,
                 {"steps": steps, "trained": trained, "init": init, "matched": matched})
