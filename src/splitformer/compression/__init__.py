"""Compressing a trained network in depth (t) and tokens (x): coarse grids as values, healing
as optimal control (docs/math.md 3.13, docs/depth.md).

    coarsening = coarsenings.plan("drop", model, steps=3, probe=ids)   # which coarse grid
    student = coarsening.apply(model)                                  # shared parameters
    result = heal(HealConfig(...), teacher=model, student=..., out=DIR)
"""

from .coarsenings import METHODS, Coarsening, method_names, plan

__all__ = ["METHODS", "Coarsening", "method_names", "plan"]
