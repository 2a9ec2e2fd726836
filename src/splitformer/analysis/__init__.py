"""Numerical analysis of evolutions: convergence in tau, diagnostics, plots."""

from .checks import MAX_REF_K, ArgumentError
from .convergence import ConvergenceResult, configuration, convergence, fit_order

__all__ = ["MAX_REF_K", "ArgumentError", "ConvergenceResult", "configuration", "convergence",
           "fit_order"]
