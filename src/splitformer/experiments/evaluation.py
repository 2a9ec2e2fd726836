"""What a sweep measures on each trained network, besides its test metric (docs/results.md).

``Evaluation`` is a value (the ``[evaluate]`` table of a sweep file):

* ``taus``: the test metric of the same weights at each time step tau (``model.refine(k)``,
  k = tau_config / tau; T fixed): depth chosen at inference, docs/math.md 3.10;
* ``order``: the observed order of convergence of u(T) in tau of the trained evolution
  (``analysis.convergence`` with the model's own scheme and the inputs' context (masks, the
  causal support), tau = 2^-k for k in ``order_ks``, against the same scheme at
  tau = 2^-``order_ref_k``) on the first ``inputs`` test inputs;
* ``kinetic``: the kinetic energy of the path at the config's tau, sum_n tau |(u^{n+1} - u^n) /
  tau|^2, summed over tokens and features and averaged over the first ``inputs`` test inputs
  (``control.KineticEnergy``);
* ``adaptive``: tolerances for adaptive depth (``analysis.adaptive``): per input, N_t chosen
  by the ``adaptive_estimate`` error estimate over the refinement ``adaptive_levels``; the test
  accuracy, mean steps and mean work for each tolerance.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from ..analysis.checks import MAX_REF_K, ArgumentError, check_ks
from ..training.config import ConfigError, refinement

__all__ = ["Evaluation"]


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Evaluation:
    """Measurements after training (module docstring); the default measures nothing more."""

    taus: tuple[float, ...] = ()
    order: bool = False
    order_ks: tuple[int, ...] = (0, 1, 2, 3, 4)
    order_ref_k: int = 8
    kinetic: bool = False
    inputs: int = 64
    adaptive: tuple[float, ...] = ()
    adaptive_estimate: str = "doubling"
    adaptive_levels: tuple[int, ...] = (1, 2, 4, 8)

    def __post_init__(self) -> None:
        for name in ("taus", "order_ks", "adaptive", "adaptive_levels"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise TypeError(f"{name} must be a list, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        for name in ("taus", "adaptive", "order_ks", "adaptive_levels"):
            v = getattr(self, name)
            if len(set(v)) != len(v):
                raise ValueError(f"{name} must not repeat a value, got {list(v)}")
        if not all(_number(t) and t > 0 for t in self.taus):
            raise ValueError(f"taus must be numbers > 0, got {list(self.taus)}")
        if not all(_number(t) and t > 0 for t in self.adaptive):
            raise ValueError(f"adaptive must list tolerances > 0, got {list(self.adaptive)}")
        for name in ("order_ks", "adaptive_levels"):
            v = getattr(self, name)
            if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in v):
                raise ValueError(f"{name} must list integers >= 0, got {list(v)}")
        for name in ("order", "kinetic"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.inputs, int) or isinstance(self.inputs, bool) or self.inputs < 1:
            raise ValueError(f"inputs must be an integer >= 1, got {self.inputs!r}")
        if (not isinstance(self.order_ref_k, int) or isinstance(self.order_ref_k, bool)
                or not 1 <= self.order_ref_k <= MAX_REF_K):
            raise ValueError(f"order_ref_k must be an integer in [1, {MAX_REF_K}], got "
                             f"{self.order_ref_k!r}")
        if self.order:
            try:
                check_ks(self.order_ks, self.order_ref_k, argument="order_ks",
                         ref_argument="order_ref_k")
            except ArgumentError as e:
                raise ValueError(str(e)) from None
        if self.adaptive_estimate not in ("doubling", "lie-strang"):
            raise ValueError(f"adaptive_estimate must be 'doubling' or 'lie-strang', got "
                             f"{self.adaptive_estimate!r}")

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Evaluation:
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise ValueError(f"unknown keys {unknown}; known: {known}")
        return cls(**doc)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def check(self, cfg: Any) -> None:
        """Refuse (ValueError naming the key) what a run of config ``cfg`` cannot be evaluated
        at: a tau of ``taus`` that does not divide the run's tau."""
        tau0 = cfg.depth / cfg.num_steps()
        for tau in self.taus:
            try:
                refinement(tau0, tau, "taus")
            except ConfigError as e:
                raise ValueError(str(e)) from None

    @property
    def empty(self) -> bool:
        return not (self.taus or self.order or self.kinetic or self.adaptive)

    # -- measuring ----------------------------------------------------------------------------
    def measure(self, model: torch.nn.Module, data: Any, cfg: Any) -> dict[str, Any]:
        """Every measurement this evaluation names, on ``model`` trained with ``cfg`` on
        ``data`` (a ``training.Dataset``); JSON-friendly."""
        from ..training.loop import evaluate

        out: dict[str, Any] = {}
        if self.empty:
            return out
        was = model.training
        model.eval()
        try:
            tau0 = cfg.depth / cfg.num_steps()
            if self.taus:
                at = {}
                for tau in self.taus:
                    k = refinement(tau0, tau, "taus")
                    refined = model if k == 1 else model.refine(k)
                    at[f"{tau:g}"] = evaluate(refined, data, cfg)
                out["at_tau"] = at
            x = _test_inputs(data, cfg, self.inputs)
            if self.order:
                out["order"] = _order(model, x, cfg, self.order_ks, self.order_ref_k)
            if self.kinetic:
                out["kinetic_energy"] = _kinetic(model, x, cfg)
            if self.adaptive:
                out["adaptive"] = _adaptive(model, data, cfg, self)
        finally:
            model.train(was)
        return out


def _test_inputs(data: Any, cfg: Any, n: int) -> torch.Tensor:
    from ..training.loop import test_windows

    if data.task == "lm":
        return test_windows(data, cfg.seq_len)[:n]
    return data.test.x[:n]


def _family_inputs(cfg: Any, x: torch.Tensor) -> tuple[tuple, dict]:
    from ..training.families import FAMILIES

    args = FAMILIES[cfg.family].inputs(x)
    return ((), args) if isinstance(args, dict) else (tuple(args), {})


@torch.no_grad()
def _order(model: Any, x: torch.Tensor, cfg: Any, ks: tuple[int, ...], ref_k: int
           ) -> dict[str, Any]:
    """The observed order of u(T) in tau of the trained evolution (same-scheme reference)."""
    from ..analysis.convergence import convergence

    owners = model.evolution_owners()
    if len(owners) != 1:
        return {"skipped": f"the model has {len(owners)} evolutions (a multigrid chain); the "
                           "order is measured on single-evolution families"}
    args, kwargs = _family_inputs(cfg, x)
    u0, context = model.initial_condition(*args, **kwargs)
    context.saveat = None  # the convergence runs keep u(T) only
    evo = owners[0].evolution
    res = convergence(evo, u0, scheme=evo.scheme, ks=ks, ref_k=ref_k,
                      reference="same-scheme", context=context)
    return {"order": res.order, "taus": res.taus, "errors": res.errors,
            "pairwise_orders": res.pairwise_orders, "reference": res.reference}


@torch.no_grad()
def _kinetic(model: Any, x: torch.Tensor, cfg: Any) -> float:
    from ..control import KineticEnergy
    from ..time.saveat import SaveAt

    args, kwargs = _family_inputs(cfg, x)
    path = model.trajectory(*args, saveat=SaveAt(steps=True), **kwargs)
    return float(KineticEnergy(1.0).value(model, path))


def _adaptive(model: Any, data: Any, cfg: Any, ev: Evaluation) -> list[dict[str, Any]]:
    from ..analysis.adaptive import adaptive_depth
    from ..training.families import FAMILIES

    if data.task != "classify":
        return [{"skipped": "adaptive depth is measured on classifiers"}]
    family = FAMILIES[cfg.family]
    x, y = data.test.x, data.test.y
    first = adaptive_depth(model, family.inputs(x), ev.adaptive[0], levels=ev.adaptive_levels,
                           estimate=ev.adaptive_estimate, logits=family.read)
    rows = []
    for tol in ev.adaptive:  # every level is computed once; at_tol re-selects per tolerance
        res = first.at_tol(tol)
        rows.append({"tol": tol, "accuracy": res.accuracy(y), "mean_steps": res.mean_steps,
                     "mean_work": res.mean_work,
                     "fraction_converged": res.fraction_converged})
    return rows
