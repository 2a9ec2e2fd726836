"""Numerical analysis of evolutions: convergence in tau, adaptive depth, diagnostics, plots."""

from .adaptive import AdaptiveResult, FixedDepths, adaptive_depth, fixed_depths
from .checks import MAX_REF_K, ArgumentError
from .convergence import ConvergenceResult, configuration, convergence, fit_order
from .diagnostics import (
    Diagnostics,
    analyze,
    attention_entropy,
    constraint_residual,
    cosine_similarity,
    effective_rank,
    kernel_matrix,
    step_lipschitz,
)
from .figures import Figure, draw

__all__ = ["MAX_REF_K", "AdaptiveResult", "ArgumentError", "ConvergenceResult", "FixedDepths",
           "adaptive_depth", "configuration", "convergence", "fit_order", "fixed_depths",
           "Diagnostics", "Figure", "analyze", "attention_entropy", "constraint_residual",
           "cosine_similarity", "draw", "effective_rank", "kernel_matrix", "step_lipschitz"]
