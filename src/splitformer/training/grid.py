"""The time grid (and the patch grid) of a training run, computed once from its config.

    grid = TrainGrid.of(cfg)
    grid.T, grid.tau, grid.num_steps      T = depth, tau = T / N_t, N_t (at most MAX_STEPS)
    grid.choices, grid.refinements        tau_choices (largest first) and their k = tau / choice
    grid.refinement_at(step)              the k that optimiser step ``step`` trains at
    grid.tau_at(step)                     its time step, tau / k

Without ``tau_choices`` every step trains at the config's tau (k = 1). With them, step s draws
one choice uniformly by a generator seeded with (seed, s) (a str seed: sha512, not ``hash()``),
so a resumed run and every rank of a data-parallel run draw the same tau at the same step.

    grid.patches, grid.patch_at(step)     patch_choices (largest first) and the step's draw
    grid.variants(), grid.variant(k, p)   every (k, p) a step may train on, and its name

With ``patch_choices`` step s also draws a patch size, by its own generator seeded with
(seed, s) (so adding patch choices leaves the drawn taus as they were): the step trains on
``model.refine(k).with_patch_size(p)``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .config import TrainConfig

__all__ = ["TrainGrid"]


@dataclass(frozen=True)
class TrainGrid:
    """T, N_t and the random time steps of a ``TrainConfig`` (module docstring)."""

    T: int
    num_steps: int
    choices: tuple[float, ...] | None
    refinements: tuple[int, ...] | None
    seed: int
    patches: tuple[int, ...] | None = None

    @classmethod
    def of(cls, cfg: TrainConfig) -> TrainGrid:
        """The grid of ``cfg`` (its checks: ``TrainConfig.num_steps``, ``refinements``)."""
        return cls(cfg.depth, cfg.num_steps(), cfg.tau_choices, cfg.refinements(), cfg.seed,
                   cfg.patch_choices)

    @property
    def tau(self) -> float:
        """The config's time step T / N_t (evaluation runs at it)."""
        return self.T / self.num_steps

    def ks(self) -> tuple[int, ...]:
        """Every refinement a step may train at: 1 (the model itself) and the choices' k's."""
        return tuple(dict.fromkeys((1, *(self.refinements or ()))))

    def _draw(self, step: int) -> int:
        g = random.Random(f"tau_choices {self.seed} {step}")
        return g.randrange(len(self.choices))

    def draw(self, step: int) -> tuple[int, float]:
        """(k, tau) of optimiser step ``step``: it trains on ``model.refine(k)``, whose time
        step is tau (the drawn choice; without choices, (1, T / N_t))."""
        if self.choices is None:
            return 1, self.tau
        i = self._draw(step)
        return self.refinements[i], self.choices[i]

    def refinement_at(self, step: int) -> int:
        """k of optimiser step ``step``: the step trains on ``model.refine(k)``."""
        return self.draw(step)[0]

    def tau_at(self, step: int) -> float:
        """The time step of optimiser step ``step``: the drawn choice, or T / N_t."""
        return self.draw(step)[1]

    def patch_at(self, step: int) -> int | None:
        """The patch size optimiser step ``step`` trains at (one of ``patches``, drawn
        uniformly by a generator seeded with (seed, step)); None without patch choices (the
        model's own)."""
        if self.patches is None:
            return None
        g = random.Random(f"patch_choices {self.seed} {step}")
        return self.patches[g.randrange(len(self.patches))]

    def variants(self) -> tuple[tuple[int, int | None], ...]:
        """Every (k, p) a step may train on: ``model.refine(k)``, at patch size p (None: the
        model's own)."""
        return tuple((k, p) for k in self.ks() for p in (self.patches or (None,)))

    @staticmethod
    def variant(k: int, patch: int | None) -> str:
        """The name of the variant (k, p): "k", or "k_p" at a drawn patch size."""
        return str(k) if patch is None else f"{k}_{patch}"
