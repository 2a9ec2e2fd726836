"""What the particle theory of attention predicts, tested on a real network (docs/theory.md,
docs/math.md 3.14).

Tokens are particles moving under the attention field; a frozen step theta^n continued past T
is an autonomous system, the setting of the theorems. Each check is a function of a ``Probe``
(the model in float64, its first evolution, u(0) and the context; ``Probe.from_model``) that
returns a ``Check`` value: the claim and its citation, what was run, the criterion, the
theory's assumptions and whether the model meets them, the verdict ("pass", "fail",
"inconclusive" when the measured effect is within the measurement's resolution, or "not
applicable"), fitted constants, the headline fit (with ``r2``) and the measured data. A step
that superposes several fields (``parallel_steps``) is not one attention field: the per-step
checks (b, c, e) leave it out and say so, checks a and d are not applicable. A model that
merges tokens is probed with merging off (``Probe.merging``).

    rank_collapse      a  pure attention loses rank doubly exponentially (Dong et al. 2021)
    clustering         b  frozen steps cluster in long time (Geshkovski et al. 2023-2024)
    metastability      c  multi-cluster dwell grows exponentially in beta (Geshkovski, Koubbi
                          et al. 2024; Bruno et al. 2025, the Gegenbauer count)
    log_n_scaling      d  scores times log n keep entropy and rank flat in n (arXiv 2510.05554)
    doubly_stochastic  e  trained kernels drift towards doubly stochastic (Sinkformers)

``run_checks(probe, names, ...)`` runs those named (all by default) in that order;
``draw(check, folder)`` writes the check's figure. Deterministic for a seed (only check e
draws random weights; the reference system of check c its angular noise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .clustering import (
    BETAS,
    clustering,
    gegenbauer_mode,
    metastability,
    reference_run,
    value_spectrum,
)
from .core import (
    VERDICTS,
    Check,
    Probe,
    cluster_count,
    frozen_evolution,
    linear_fit,
    relative_residual,
    rescale_scores,
    scaled_attention,
)
from .figures import draw
from .kernels import LENGTHS, doubly_stochastic, log_n_scaling, step_kernels
from .rank import rank_collapse

__all__ = ["BETAS", "CHECKS", "LENGTHS", "VERDICTS", "Check", "Probe", "cluster_count",
           "clustering", "doubly_stochastic", "draw", "frozen_evolution", "gegenbauer_mode",
           "linear_fit", "log_n_scaling", "metastability", "rank_collapse", "reference_run",
           "relative_residual", "rescale_scores", "run_checks", "scaled_attention", "step_kernels",
           "value_spectrum"]

# name -> (letter, what it tests)
CHECKS: dict[str, tuple[str, str]] = {
    "rank_collapse": ("a", "pure attention loses rank doubly exponentially (Dong et al.)"),
    "clustering": ("b", "frozen steps cluster in long time (Geshkovski et al.)"),
    "metastability": ("c", "multi-cluster dwell grows exponentially in beta"),
    "log_n_scaling": ("d", "scores times log n keep attention flat in n"),
    "doubly_stochastic": ("e", "trained kernels drift towards doubly stochastic (Sinkformers)"),
}


def run_checks(probe: Probe, names: Sequence[str] | None = None, *, seed: int = 0,
               t_max: int = 100, refine: int = 10, meta_t_max: int = 30,
               betas: Sequence[float] = BETAS, lengths: Sequence[int] = LENGTHS,
               reference_t_max: int = 2500,
               progress: Callable[[str], Any] | None = None) -> list[Check]:
    """The checks ``names`` (default all, in the order of ``CHECKS``) on ``probe``: clustering
    to ``t_max``, metastability to ``meta_t_max``, both at tau = 1 / ``refine``; ``betas`` the
    score multipliers of check c, ``reference_t_max`` how far its reference system runs (0: not
    run), ``lengths`` the token counts of check d; ``progress`` is called with a line before
    each check."""
    chosen = list(CHECKS) if names is None else list(dict.fromkeys(names))
    unknown = [n for n in chosen if n not in CHECKS]
    if unknown:
        raise ValueError(f"names: unknown checks {unknown}; expected some of {list(CHECKS)}")
    out = []
    for n in chosen:
        if progress is not None:
            progress(f"check {CHECKS[n][0]}: {n}")
        if n == "rank_collapse":
            out.append(rank_collapse(probe))
        elif n == "clustering":
            out.append(clustering(probe, t_max=t_max, k=refine))
        elif n == "metastability":
            out.append(metastability(probe, betas=betas, t_max=meta_t_max, k=refine,
                                     reference_t_max=reference_t_max, seed=seed))
        elif n == "log_n_scaling":
            out.append(log_n_scaling(probe, lengths=lengths))
        else:
            out.append(doubly_stochastic(probe, seed=seed))
    return out
