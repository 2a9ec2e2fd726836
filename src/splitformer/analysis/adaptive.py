"""Adaptive depth: N_t chosen per input from an error estimate, as adaptive ODE solvers do.

A network of L layers is the evolution at tau = 1, N_t = N_t0 (= L); ``model.refine(k)`` runs
the same piecewise-constant controls at tau = 1 / k, N_t = k N_t0 (docs/math.md 3.10). For
every level k of ``levels`` (increasing positive integers) and every input i, an estimate of
the error of u_k(T) is computed; input i is accepted at the first level whose estimate is at
most ``tol`` (or, when none is, at the finest level, flagged as not converged).

Two estimates, both relative, in the Frobenius norm over the tokens x features of one input:

* ``"doubling"`` (step doubling, the model's own scheme):

      e_k(i) = ||u_k(T)_i - u_2k(T)_i|| / ||u_2k(T)_i||

  and the accepted solution is the finer one, u_2k (local extrapolation: the estimate is the
  error of u_k, the answer the better u_2k). Its N_t is 2 k N_t0.

* ``"lie-strang"`` (an embedded pair on the same controls and grid):

      e_k(i) = ||u^Lie_k(T)_i - u^Strang_k(T)_i|| / ||u^Strang_k(T)_i||

  with ``model.with_scheme("lie")`` and ``model.with_scheme("strang")`` (Heun substeps, raw
  form: the defaults of the named schemes), both rebuilt on the model's layout, so a pre-LN
  model (ViT, the sequence classifier, a ``norm_first`` encoder) stays pre-LN in both members
  and a post-LN one keeps its projection substeps. The Lie member is the low-order member:
  for the networks of every family (post-LN ``lie``, pre-LN ``prenorm``, LayerScale) it runs
  exactly the model's own steps; for a model that already runs another scheme it is still
  the Lie scheme of the layout, not the model's scheme. The accepted solution is Strang's
  (its N_t is k N_t0). For pre-LN layouts Strang with Heun substeps is second order
  (asymptotically) towards u_t = A(P1 u) + G(P2 u); with projection substeps (post-LN) raw
  Strang is only first order with a smaller constant (docs/convergence.md); either way e_k
  estimates the Lie member's error and overestimates Strang's.

Work. ``work`` is what an adaptive solver would have spent on input i: the sum of the N_t of
the runs it evaluated up to and including the accepted level, each run counted once (step
doubling at levels 1, 2 runs the grids N_t0, 2 N_t0, 4 N_t0, not 2 N_t0 twice; the embedded
pair counts its Lie and its Strang run, each k N_t0 steps, though a Strang step with Heun
substeps costs about three Lie steps in field evaluations). This function itself runs every
level for the whole batch (batched, simpler, and what the at_tol re-selection needs), so the
reported work is not what it computed.

With several evolutions (CvT's stages, the encoder-decoder pair) ``refine`` and
``with_scheme`` act on all of them, u(T) is the state the read-out sees (the last stage, the
decoder), and N_t counts the steps of every evolution.

Everything runs under ``torch.no_grad()`` on copies of the model (``refine`` and
``with_scheme`` share parameters but have their own train/eval flags) put in eval mode: the
model's own mode is never changed. A bad argument raises ``ArgumentError`` naming it; a u(T)
or a read-out that is not finite raises ``NonFiniteError`` naming the level.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..files import save_figure
from ..models.base import EvolutionModel
from ..time import NonFiniteError
from .checks import ArgumentError, _is_int, check_model, refuse_merging

__all__ = [
    "ESTIMATES",
    "AdaptiveResult",
    "FixedDepths",
    "adaptive_depth",
    "fixed_depths",
    "plot",
]

ESTIMATES = ("doubling", "lie-strang")


# -- argument checks ------------------------------------------------------------------------

def _check_tol(tol) -> float:
    if isinstance(tol, torch.Tensor) and tol.numel() == 1 and tol.dtype != torch.bool:
        tol = tol.item()
    if not isinstance(tol, numbers.Real) or isinstance(tol, bool) or not (
            math.isfinite(float(tol)) and tol > 0):
        raise ArgumentError("tol", f"expected a finite number > 0 (a relative error), got "
                                   f"{tol!r}")
    return float(tol)


def _check_levels(levels) -> tuple[int, ...]:
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Iterable):
        raise ArgumentError("levels", f"expected a sequence of increasing positive integers k "
                                      f"(N_t = k N_t0), got {levels!r}")
    levels = tuple(levels)
    if not levels:
        raise ArgumentError("levels", "expected at least one level k (N_t = k N_t0), got none")
    bad = [k for k in levels if not _is_int(k) or k < 1]
    if bad:
        raise ArgumentError("levels", f"expected positive integers k (N_t = k N_t0), got "
                                      f"{bad[0]!r} in {levels!r}")
    levels = tuple(int(k) for k in levels)
    if any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
        raise ArgumentError("levels", f"expected levels that increase without repeats, got "
                                      f"{levels!r}")
    return levels


def _check_estimate(estimate) -> str:
    if not isinstance(estimate, str) or estimate not in ESTIMATES:
        raise ArgumentError("estimate", f"expected one of {', '.join(ESTIMATES)}, got "
                                        f"{estimate!r}")
    return estimate


def _check_model(model) -> None:
    if not isinstance(model, EvolutionModel):
        raise ArgumentError("model", f"expected a splitformer EvolutionModel (e.g. build_vit, "
                                     f"sequence_classifier, from_torch), got "
                                     f"{type(model).__name__}")
    for owner in model.evolution_owners():
        check_model(model, owner.evolution)


def _check_inputs(inputs) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, tuple) and inputs:
        return inputs
    raise ArgumentError("inputs", f"expected a tensor or a non-empty tuple of the model's "
                                  f"positional inputs, got {type(inputs).__name__}")


def _check_logits(logits) -> Callable[[Any], Any] | None:
    if logits is not None and not callable(logits):
        raise ArgumentError("logits", f"expected None or a callable from the model's output to "
                                      f"a (batch, classes) tensor, got {type(logits).__name__}")
    return logits


def _check_targets(targets, batch: int) -> torch.Tensor:
    if not isinstance(targets, torch.Tensor) or targets.shape != (batch,) or (
            targets.dtype.is_floating_point or targets.is_complex() or
            targets.dtype == torch.bool):
        shape = tuple(targets.shape) if isinstance(targets, torch.Tensor) else None
        raise ArgumentError("targets", f"expected an integer tensor of class indices of shape "
                                       f"({batch},), got "
                                       f"{type(targets).__name__} of shape {shape}")
    return targets


# -- running one level ------------------------------------------------------------------------

def _num_steps(model: EvolutionModel) -> int:
    """N_t of a model: the steps of all its evolutions."""
    return sum(owner.evolution.num_steps for owner in model.evolution_owners())


def _as_logits(out, logits: Callable[[Any], Any] | None, batch: int) -> torch.Tensor:
    if logits is not None:
        z = logits(out)
    elif isinstance(out, torch.Tensor):
        z = out
    else:
        z = getattr(out, "logits", None)
    if not isinstance(z, torch.Tensor) or z.dim() != 2 or z.shape[0] != batch:
        shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise ArgumentError("logits", f"expected the read-out as a ({batch}, classes) tensor "
                                      f"(default: the output if it is a tensor, else its "
                                      f".logits), got {shape}; pass logits=, a callable from "
                                      f"the model's output to that tensor")
    return z


def _run(model: EvolutionModel, inputs: tuple, logits, label: str
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """u(T) and the (batch, classes) read-out of ``model`` (a refined copy, in eval mode)."""
    u0, ctx = model.initial_condition(*inputs)
    ctx.saveat = None  # only u(T) is needed
    u = model.evolution(u0, ctx)
    bad = ~torch.isfinite(u.flatten(1)).all(dim=1)
    if bad.any():
        raise NonFiniteError(f"u(T) at {label} is not finite for {int(bad.sum())} of "
                             f"{u.shape[0]} inputs: the evolution blew up at this step size")
    z = _as_logits(model.read_out(u, ctx), logits, u.shape[0])
    if not torch.isfinite(z).all():
        raise NonFiniteError(f"the read-out at {label} is not finite")
    return u, z


def _relative(u: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """||u_i - ref_i|| / ||ref_i|| per input i (Frobenius over everything but the batch)."""
    num = (u - ref).flatten(1).norm(dim=1)
    den = ref.flatten(1).norm(dim=1).clamp_min(torch.finfo(ref.dtype).tiny)
    return num / den


def _label(k: int, steps: int, model: EvolutionModel) -> str:
    return f"level k = {k} (N_t = {steps}, scheme {model.evolution.scheme.name!r})"


# -- results -----------------------------------------------------------------------------------

@dataclass
class AdaptiveResult:
    """What ``adaptive_depth`` chose for every input (per-input tensors of length batch).

    level: the accepted level k; steps: N_t of the accepted solution (2 k N_t0 for
    "doubling", k N_t0 for "lie-strang"); work: the steps an adaptive solver would have
    spent up to acceptance (module docstring); estimate: e_k at the accepted level;
    predictions: argmax of the accepted read-out (``logits``); converged: e_k <= tol at the
    accepted level (False: no level met tol, the finest was taken).

    Per level (first dimension len(levels)): level_estimates e_k (levels, batch),
    level_logits (levels, batch, classes) of the solution accepted at that level; level_steps
    and level_work, the N_t and the cumulative work of each level (the same for every input).
    ``at_tol(tol)`` selects again for another tolerance without running anything.
    """

    estimator: str
    tol: float
    levels: tuple[int, ...]
    base_steps: int
    level_steps: tuple[int, ...]
    level_work: tuple[int, ...]
    level_estimates: torch.Tensor
    level_logits: torch.Tensor
    level: torch.Tensor
    steps: torch.Tensor
    work: torch.Tensor
    estimate: torch.Tensor
    predictions: torch.Tensor
    logits: torch.Tensor
    converged: torch.Tensor

    @property
    def mean_steps(self) -> float:
        """Mean N_t of the accepted solutions."""
        return float(self.steps.double().mean())

    @property
    def mean_work(self) -> float:
        """Mean steps an adaptive solver would have spent per input."""
        return float(self.work.double().mean())

    @property
    def fraction_converged(self) -> float:
        """Fraction of inputs whose accepted estimate is at most tol."""
        return float(self.converged.double().mean())

    @property
    def level_predictions(self) -> torch.Tensor:
        """(levels, batch): argmax of the solution accepted at each level."""
        return self.level_logits.argmax(dim=-1)

    def accuracy(self, targets: torch.Tensor) -> float:
        """Fraction of inputs whose prediction equals ``targets`` (class indices, (batch,))."""
        targets = _check_targets(targets, self.predictions.shape[0])
        return float((self.predictions == targets.to(self.predictions.device)).double().mean())

    def at_tol(self, tol: float) -> AdaptiveResult:
        """The same runs, selected for another tolerance."""
        return _select(self.estimator, _check_tol(tol), self.levels, self.base_steps,
                       self.level_steps, self.level_work, self.level_estimates,
                       self.level_logits)

    def as_dict(self) -> dict:
        """Summaries and per-input values as plain Python values."""
        return {
            "estimate": self.estimator, "tol": self.tol, "levels": list(self.levels),
            "base_steps": self.base_steps, "mean_steps": self.mean_steps,
            "mean_work": self.mean_work, "fraction_converged": self.fraction_converged,
            "level": self.level.tolist(), "steps": self.steps.tolist(),
            "work": self.work.tolist(), "estimates": self.estimate.tolist(),
            "predictions": self.predictions.tolist(), "converged": self.converged.tolist(),
        }


def _select(estimator: str, tol: float, levels: tuple[int, ...], base_steps: int,
            level_steps: tuple[int, ...], level_work: tuple[int, ...],
            estimates: torch.Tensor, logits: torch.Tensor) -> AdaptiveResult:
    """For each input the first level with e_k <= tol, else the finest (not converged)."""
    ok = estimates <= tol
    converged = ok.any(dim=0)
    first = ok.to(torch.uint8).argmax(dim=0)  # the first True (argmax returns the first max)
    idx = torch.where(converged, first, torch.full_like(first, len(levels) - 1))
    batch = torch.arange(estimates.shape[1], device=estimates.device)
    table = {name: torch.tensor(values, device=estimates.device)
             for name, values in (("level", levels), ("steps", level_steps),
                                  ("work", level_work))}
    chosen = logits[idx, batch]
    return AdaptiveResult(
        estimator=estimator, tol=tol, levels=levels, base_steps=base_steps,
        level_steps=level_steps, level_work=level_work, level_estimates=estimates,
        level_logits=logits, level=table["level"][idx], steps=table["steps"][idx],
        work=table["work"][idx], estimate=estimates[idx, batch],
        predictions=chosen.argmax(dim=-1), logits=chosen, converged=converged,
    )


@dataclass
class FixedDepths:
    """The model's own scheme at fixed N_t = k N_t0 for every k of ``levels``: ``steps`` per
    level, ``logits`` (levels, batch, classes), ``predictions`` (levels, batch)."""

    levels: tuple[int, ...]
    base_steps: int
    steps: tuple[int, ...]
    logits: torch.Tensor

    @property
    def predictions(self) -> torch.Tensor:
        return self.logits.argmax(dim=-1)

    def accuracy(self, targets: torch.Tensor) -> list[float]:
        """Per level, the fraction of inputs whose prediction equals ``targets``."""
        targets = _check_targets(targets, self.logits.shape[1])
        hit = self.predictions == targets.to(self.logits.device)
        return [float(h.double().mean()) for h in hit]

    def as_dict(self) -> dict:
        return {"levels": list(self.levels), "base_steps": self.base_steps,
                "steps": list(self.steps), "predictions": self.predictions.tolist()}


# -- the API -----------------------------------------------------------------------------------

def _doubling(model: EvolutionModel, inputs: tuple, logits, levels: tuple[int, ...], n0: int):
    """(e_k, the accepted read-outs, N_t of each accepted run, the work up to each level) of
    the doubling estimate: runs at every level k and 2 k, shared where they meet."""
    runs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for k in sorted(set(levels) | {2 * k for k in levels}):
        m = model.refine(k).eval()
        runs[k] = _run(m, inputs, logits, _label(k, _num_steps(m), m))
    est = [_relative(runs[k][0], runs[2 * k][0]) for k in levels]
    out = [runs[2 * k][1] for k in levels]
    level_steps = tuple(2 * k * n0 for k in levels)
    grids: set[int] = set()
    level_work = []
    for k in levels:
        grids |= {k, 2 * k}
        level_work.append(n0 * sum(grids))
    return est, out, level_steps, level_work


def _lie_strang(model: EvolutionModel, inputs: tuple, logits, levels: tuple[int, ...],
                n0: int):
    """The same for the Lie-Strang estimate: at each level the model under lie and strang."""
    pair = []
    for name in ("lie", "strang"):
        try:
            pair.append(model.with_scheme(name))
        except ValueError as e:
            raise ArgumentError("estimate", f"'lie-strang' rebuilds the model's "
                                            f"evolutions under the named schemes lie "
                                            f"and strang, and this model cannot: {e}; "
                                            f"use estimate='doubling'") from e
    est, out = [], []
    for k in levels:
        lie_k, strang_k = (p.refine(k).eval() for p in pair)
        u_lie, _ = _run(lie_k, inputs, logits, _label(k, _num_steps(lie_k), lie_k))
        u_strang, z = _run(strang_k, inputs, logits, _label(k, _num_steps(strang_k), strang_k))
        est.append(_relative(u_lie, u_strang))
        out.append(z)
    level_steps = tuple(k * n0 for k in levels)
    level_work = [2 * n0 * sum(levels[:j + 1]) for j in range(len(levels))]
    return est, out, level_steps, level_work


def adaptive_depth(
    model: EvolutionModel,
    inputs: torch.Tensor | tuple,
    tol: float,
    *,
    levels: Iterable[int] = (1, 2, 4, 8),
    estimate: str = "doubling",
    logits: Callable[[Any], torch.Tensor] | None = None,
) -> AdaptiveResult:
    """N_t per input: the first level k in ``levels`` whose error estimate e_k <= ``tol``.

    model: a splitformer ``EvolutionModel`` as given (N_t0 = its steps); level k runs
    ``model.refine(k)``, N_t = k N_t0.
    inputs: a tensor, or a tuple of the positional inputs of the model's ``forward``.
    tol: a finite number > 0, compared with the relative estimate e_k.
    levels: increasing positive integers (for "doubling" the levels 2 k are run too; where
    2 k is itself a level its run is shared).
    estimate: "doubling", e_k = ||u_k(T) - u_2k(T)|| / ||u_2k(T)||, accepting u_2k; or
    "lie-strang", e_k = ||u^Lie_k(T) - u^Strang_k(T)|| / ||u^Strang_k(T)||, accepting Strang's
    (module docstring: the norms, the members of the pair, the work).
    logits: a callable from the model's output to a (batch, classes) tensor; default: the
    output if it is a tensor, else its ``.logits``.

    Returns an ``AdaptiveResult``. Raises ``ArgumentError`` naming a bad argument,
    ``NonFiniteError`` naming the level whose u(T) or read-out is not finite.
    """
    _check_model(model)
    refuse_merging([o.evolution for o in model.evolution_owners()], "adaptive depth")
    tol = _check_tol(tol)
    levels = _check_levels(levels)
    estimator = _check_estimate(estimate)
    inputs = _check_inputs(inputs)
    logits = _check_logits(logits)
    n0 = _num_steps(model)
    with torch.no_grad():
        run = _doubling if estimator == "doubling" else _lie_strang
        est, out, level_steps, level_work = run(model, inputs, logits, levels, n0)
    return _select(estimator, tol, levels, n0, level_steps, tuple(level_work),
                   torch.stack(est), torch.stack(out))


def fixed_depths(
    model: EvolutionModel,
    inputs: torch.Tensor | tuple,
    levels: Iterable[int] = (1, 2, 4, 8),
    logits: Callable[[Any], torch.Tensor] | None = None,
) -> FixedDepths:
    """The baseline beside ``adaptive_depth``: ``model.refine(k)`` (the model's own scheme) for
    every input, for each k of ``levels``; its predictions and N_t = k N_t0 per level. Same
    arguments, checks and evaluation (no_grad, eval-mode copies) as ``adaptive_depth``."""
    _check_model(model)
    levels = _check_levels(levels)
    inputs = _check_inputs(inputs)
    logits = _check_logits(logits)
    n0 = _num_steps(model)
    out = []
    with torch.no_grad():
        for k in levels:
            m = model.refine(k).eval()
            out.append(_run(m, inputs, logits, _label(k, _num_steps(m), m))[1])
    return FixedDepths(levels, n0, tuple(k * n0 for k in levels), torch.stack(out))


def plot(results: list[AdaptiveResult], fixed: FixedDepths, targets: torch.Tensor, path: str,
         title: str = "") -> None:
    """Accuracy against mean steps per input: the adaptive results (one point per tolerance;
    solid: mean N_t of the accepted solution, dashed: mean work) beside the fixed depths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot(fixed.steps, fixed.accuracy(targets), "ks-", label="fixed depth N_t = k N_t0")
    by_estimate: dict[str, list[AdaptiveResult]] = {}
    for r in results:
        by_estimate.setdefault(r.estimator, []).append(r)
    for name, rs in by_estimate.items():
        rs = sorted(rs, key=lambda r: r.mean_steps)
        acc = [r.accuracy(targets) for r in rs]
        line, = ax.plot([r.mean_steps for r in rs], acc, "o-", label=f"adaptive ({name}): "
                        "accepted N_t")
        ax.plot([r.mean_work for r in rs], acc, "o--", color=line.get_color(), alpha=0.6,
                label=f"adaptive ({name}): work")
        for r, a in zip(rs, acc, strict=True):
            ax.annotate(f"{r.tol:g}", (r.mean_steps, a), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("mean steps per input")
    ax.set_ylabel("accuracy")
    ax.set_title(title or "adaptive depth against fixed depths")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
