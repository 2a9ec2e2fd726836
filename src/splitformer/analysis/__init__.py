"""Numerical analysis of evolutions: convergence in tau, adaptive depth, diagnostics, plots."""

from .adaptive import AdaptiveResult, FixedDepths, adaptive_depth, fixed_depths
from .checks import MAX_REF_K, ArgumentError
from .convergence import ConvergenceResult, configuration, convergence, fit_order

__all__ = ["MAX_REF_K", "AdaptiveResult", "ArgumentError", "ConvergenceResult", "FixedDepths",
           "adaptive_depth", "configuration", "convergence", "fit_order", "fixed_depths"]
