"""Numerical analysis of evolutions: convergence in tau, diagnostics, plots."""

from .convergence import ConvergenceResult, configuration, convergence, fit_order

__all__ = ["ConvergenceResult", "configuration", "convergence", "fit_order"]
