"""Diagnostics of the evolution u(x, y, t) along the discrete path of a model.

``analyze(model, inputs)`` runs the model once (eval mode, no gradient), finds every evolution
it calls (CvT's stages, the encoder and the decoder of the pair, or the one evolution of the
other families), reruns each from the same u(0) and context keeping every grid point and every
substep (``SaveAt(steps=True, substeps=True)``), and measures the quantities below. States are
(B, N_x, N_y) tensors (batch, tokens, features); ||.|| is the Frobenius norm over the tokens x
features of one input; "mean over batch" is the mean of a per-input value over the B inputs.

Per step n = 0 .. N_t - 1 (u^n = u(t_n), tau the step; a step's record holds t = t_n and
t_end = t_{n+1}):

    norm            mean_b ||u^{n+1}_b||
    velocity        mean_b ||u^{n+1}_b - u^n_b|| / tau
    lipschitz       an estimate of sigma_max(J_n), J_n = d u^{n+1} / d u^n of the step map
                    S_tau(theta(t_n + tau/2)) at the state of input ``kernel_input`` (the other
                    inputs held fixed; the step runs in eval mode), by the Lanczos iteration on
                    J^T J with torch.func.jvp and torch.func.vjp (``step_lipschitz``): v_1 a
                    seeded random unit vector, each iteration one product J^T J v_k (one jvp and
                    one vjp), the next vector that product orthogonalised against v_1 .. v_k;
                    the estimate after k iterations is sqrt(theta_k), theta_k the largest
                    eigenvalue of the k x k tridiagonal matrix of the iteration (the largest
                    Ritz value). It never exceeds sigma_max and increases with k. The
                    iteration stops when the estimate changes by less than ``lipschitz_tol``
                    (relative) from one iteration to the next, or at the cap
                    ``lipschitz_iterations`` (a note says so; the estimate is then a lower
                    estimate that may be well below sigma_max), or when the Krylov space is
                    invariant (exact). The softmax runs through the math backend of
                    scaled_dot_product_attention, whose forward-mode derivative exists.
    lipschitz_iterations, lipschitz_converged, lipschitz_change
                    the iterations used, whether the stopping rule was met before the cap, and
                    the relative change of the estimate at the last iteration
    cosine_similarity  mean_b of  1/(N (N-1)) sum_{x != x'} <u(x), u(x')> / (|u(x)| |u(x')|)
                    over the tokens of u^{n+1}_b (a zero token has cosine 0 with every token;
                    ``cosine_similarity``)
    effective_rank  mean_b of exp(H(p)), p_i = s_i / sum_j s_j, s the singular values of the
                    N_x x N_y matrix u^{n+1}_b, H(p) = -sum_i p_i log p_i (Roy & Vetterli 2007;
                    ``effective_rank``): 1 for a rank-one state, min(N_x, N_y) at most (the
                    singular values in the state's dtype, the entropy in float64)
    attention       one record per attention substep of the step (self-attention,
                    cross-attention, ...; an attention field, or the first stage of a branch of
                    a parallel substep): "substep" (its index), "operator" (its label),
                    "entropy": per head h the mean over the batch and the query tokens x of
                    -sum_x' g_h(x, x') log g_h(x, x') (0 log 0 = 0; ``attention_entropy``), g
                    the substep's kernel, and "entropy_uniform": the same for the kernel that
                    is uniform over g's support (log N_x' without a mask; for a causal kernel
                    the mean over x of log(x + 1))
    attention_operator, attention_entropy
                    the label and the entropies of the step's first attention substep (the
                    first record of "attention")

and per substep j of the step (the scheme's top-level stages; the state before substep 0 is
u^n, before substep j > 0 the state after substep j - 1):

    increment       mean_b ||after_b - before_b|| (a substep that changes the feature width,
                    the paper's literal FFN, is compared with zero padding of the narrower one)
    share           increment / sum of the step's increments
    constraint      kind "project" onto S1 (``SphereProjection`` with s1, s2, or a real
                    ``LayerNormProjection`` with gain gamma, bias beta and eps):
                      S1:  mean_residual = max |mean_y u - s1|, var_residual = max |var_y u - s2^2|
                      LN:  z = (u - beta) / gamma, mean_residual = max |mean_y z|,
                           var_residual = max |var_y z - var_y v / (var_y v + eps)|, v the state
                           before the substep (the ghost-point reading of docs/math.md 3.1: the
                           image of LN has var_y z = 1 - eps / (var_y v + eps), not 1), and
                           var_residual_eps0 = max |var_y z - 1| (against the eps = 0 set)
                    (max over the inputs and the tokens, var the population variance over y);
                    kind "project" onto S2 = {u >= 0} (``ProjectionS2``): residual = max(0,
                    -min u). A pre-norm field u + tau F(P u) has no projection substep: for a
                    field substep with an S1 projection P in ``pre`` the entry is the same
                    residuals of the state u entering the field (how far the state is from the
                    set; LN against the eps = 0 set, var_residual = max |var_y z - 1|), with
                    "set": "S1 (state, pre-norm)". Other substeps: None.
    relu_active     the fraction of active constraints, for activations that are constraints:
                    for a field substep whose field holds a ``FeedForward`` with activation relu
                    (the projection onto S2: active where the pre-activation p = W_j h + b_j is
                    < 0) or hardtanh (the projection onto [-1, 1]: active where |p| > 1), the
                    fraction of its hidden units (every hidden layer, token and input) where
                    the constraint is active; for a field with a ReLU projection in ``then``
                    (the paper's literal FFN substeps) the fraction of the substep's output
                    entries that are <= 0 (clipped). None for the other activations (GELU,
                    SiLU, leaky ReLU, tanh, identity: no constraint to be active; a note says
                    so) and for substeps without an FFN or ReLU projection.
    negative_preactivation
                    for a field substep whose field holds a ``FeedForward`` (any activation):
                    the fraction of its hidden units where the pre-activation is < 0, a sign
                    statistic (for relu it equals relu_active; for GELU or SiLU it is not an
                    active set). None for other substeps.

A parallel substep (``parallel(...)``) runs its branches on copies of the state entering it:
the attention and FFN of the first stage of each branch are measured from that state; a stage
later in a branch sees a state the trajectory does not keep, and is not measured (a note says
so).

Per evolution: kinetic_energy = ``control.KineticEnergy(1.0).value`` of the path (mean_b sum_n
tau ||(u^{n+1}_b - u^n_b) / tau||^2), lipschitz_product = prod_n lipschitz_n, and "initial":
norm, cosine similarity and effective rank of u(0). By the chain rule the Jacobian of u(0) ->
u(T) at this u(0) is the product J_{N-1} ... J_0, so the product of the exact sigma_max(J_n)
bounds its norm ||D(u(0) -> u(T))|| at this u(0) (of input ``kernel_input``): a local bound
along this one path, not a Lipschitz constant of the evolution over all inputs. The factors
here are iterative estimates that never exceed the sigma_max they estimate, so the product is
an estimate of that bound, not a guaranteed bound (None if a step has no estimate).

The attention kernel g_h(x, x') of an attention substep (``Diagnostics.attention_kernels``, per
head for input ``kernel_input``; ``Diagnostics.kernels`` keeps the step's first one) is
computed from the state entering the substep (with its ``pre`` projection applied, as the field
sees it; for a Heun or RK4 substep, the first evaluation), by the operator's own Q and K maps,
support (mask, causal) and kernel: g = kernel(Q, K, I), the kernel applied to the identity as
values. Every kernel of ``operators.kernels`` returns int g(x, x') V(x') dx', linear in V, so
V = I gives g itself: the softmax with its mask or causal support, Sinkhorn's plan, the linear
kernel's normalised feature-map weights (an N_x x N_x' matrix that its O(N) path never forms).
Its support is where the kernel at zero queries and keys, kernel(0, 0, I), is positive.
Kernels, Lipschitz estimates, FFN and pre-norm readings are None for a scheme with its own
doubled state (``reversible``), whose fields act on one component of it (a note says so).

Every number of ``as_dict()`` is a finite float, an int, a bool, a str or None; a None that
stands for a missing measurement carries its reason in ``notes`` (a quantity that does not
apply to a substep, such as the constraint of a field substep, is None by definition). Bad
arguments raise ``ArgumentError`` naming them, non-finite values (NaN, infinities) included:
in a parameter of the model ("model"), in an input tensor or in the u(0) made of it
("inputs").
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..control import KineticEnergy
from ..models.base import EvolutionModel
from ..operators.attention import AttentionOperator
from ..operators.base import Context
from ..operators.feature import FeedForward
from ..operators.projections import (
    Activation,
    LayerNormProjection,
    ProjectionS2,
    SphereProjection,
)
from ..time import Evolution, SaveAt, Trajectory
from ..time.schemes import Stage
from .checks import ArgumentError, check_seed

__all__ = [
    "DEFINITIONS",
    "LIPSCHITZ_ITERATIONS",
    "LIPSCHITZ_TOL",
    "Diagnostics",
    "LipschitzEstimate",
    "analyze",
    "attention_entropy",
    "constraint_residual",
    "cosine_similarity",
    "effective_rank",
    "kernel_matrix",
    "step_lipschitz",
    "summary_text",
]

LIPSCHITZ_ITERATIONS = 100  # the cap of the Lanczos iteration of each step
LIPSCHITZ_TOL = 1e-4  # stop when the estimate changes by less than this (relative)

DEFINITIONS = {
    "norm": "mean over the batch of ||u^{n+1}||_F (tokens x features)",
    "velocity": "mean over the batch of ||u^{n+1} - u^n||_F / tau",
    "lipschitz": "estimate of the largest singular value of the Jacobian J of the step map "
                 "u^n -> u^{n+1} at the state of input kernel_input (eval mode): the largest "
                 "Ritz value of the Lanczos iteration on J^T J (one torch.func.jvp and one vjp "
                 "per iteration), square-rooted; it never exceeds sigma_max(J) and increases "
                 "with the iterations, which stop when it changes by less than lipschitz_tol "
                 "(relative) or at the cap lipschitz_iterations",
    "lipschitz_iterations": "Lanczos iterations (jvp + vjp pairs) the step's estimate used",
    "lipschitz_converged": "whether the estimate's relative change fell below lipschitz_tol "
                           "before the cap (or the Krylov space became invariant: exact); "
                           "false: a lower estimate, possibly well below sigma_max",
    "lipschitz_change": "relative change of the estimate at its last iteration",
    "cosine_similarity": "mean over the batch of the mean cosine of the angle between two "
                         "distinct tokens of u^{n+1}",
    "effective_rank": "mean over the batch of exp(-sum_i p_i log p_i), p_i = s_i / sum_j s_j, "
                      "s the singular values of the tokens x features matrix of u^{n+1} "
                      "(Roy & Vetterli 2007)",
    "attention": "one record per attention substep of the step (self- and cross-attention "
                 "alike): its substep index, its operator label, its per-head entropy and the "
                 "entropy of the kernel uniform over its support",
    "entropy": "per head: mean over the batch and the query tokens x of -sum_x' g(x, x') "
               "log g(x, x') of the substep's attention kernel g",
    "entropy_uniform": "mean over the batch, heads and query tokens x of log |supp g(x, .)|: "
                       "the entropy of the kernel uniform over the support of g (log N_x' "
                       "without a mask; for a causal kernel the mean of log(x + 1))",
    "attention_operator": "the label of the step's first attention substep",
    "attention_entropy": "per head: the entropy of the step's first attention substep (the "
                         "first record of attention)",
    "increment": "mean over the batch of ||after - before||_F of the substep",
    "share": "increment / sum of the step's increments",
    "constraint": "residuals of the state after a projection substep (or of the state entering "
                  "a pre-norm field) against the constraint set S1 (mean, variance over the "
                  "features; max over inputs and tokens) or S2 (max negative part)",
    "relu_active": "fraction of active constraints of an FFN whose activation is a projection: "
                   "ReLU (pre-activation < 0) or hardtanh (|pre-activation| > 1); or the "
                   "fraction of entries clipped by a ReLU projection after a field; None for "
                   "other activations (GELU, SiLU, leaky ReLU, tanh: no active constraint)",
    "negative_preactivation": "fraction of the FFN's hidden units whose pre-activation is < 0, "
                              "for any activation: a sign statistic, which is an active set "
                              "only for ReLU",
    "kinetic_energy": "mean over the batch of sum_n tau ||(u^{n+1} - u^n) / tau||_F^2 "
                      "(control.KineticEnergy with weight 1)",
    "lipschitz_product": "product over the steps of the per-step Lipschitz estimates: an "
                         "estimate of the bound prod_n sigma_max(J_n) on ||D(u(0) -> u(T))|| "
                         "at this u(0) (chain rule; a local bound along this path, not a "
                         "Lipschitz constant over all inputs); each factor estimates its "
                         "sigma_max from below, so the product is an estimate, not a bound",
}

_READING_RANK = {"projection": 2, "proximal map": 1, "neither": 0}


# -- the quantities, as functions of tensors ---------------------------------------------------
def _batched(u: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(u, torch.Tensor) or u.dim() not in (2, 3):
        shape = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
        raise ArgumentError(what, f"expected a tensor (tokens, features) or (batch, tokens, "
                                  f"features), got {shape}")
    return u.unsqueeze(0) if u.dim() == 2 else u


def cosine_similarity(u: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity of the distinct token pairs of u: (N, D) -> a scalar, (B, N, D)
    -> (B,). 1/(N (N-1)) sum_{x != x'} cos(u(x), u(x')); a zero token has cosine 0 with every
    token; NaN for a single token (no pairs)."""
    single = isinstance(u, torch.Tensor) and u.dim() == 2
    v = _batched(u, "u").double()
    n = v.shape[1]
    norms = v.norm(dim=-1, keepdim=True)
    unit = v / torch.where(norms > 0, norms, torch.ones_like(norms))
    gram = unit @ unit.transpose(-2, -1)
    off = gram.sum(dim=(-2, -1)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    out = off / (n * (n - 1)) if n > 1 else torch.full_like(off, float("nan"))
    return out[0] if single else out


def effective_rank(u: torch.Tensor) -> torch.Tensor:
    """exp(H(p)), p = s / sum(s), s the singular values of the (tokens x features) matrix u
    (Roy & Vetterli 2007): (N, D) -> a scalar, (B, N, D) -> (B,). 1 for a rank-one matrix,
    min(N, D) for one with equal singular values; NaN for the zero matrix."""
    single = isinstance(u, torch.Tensor) and u.dim() == 2
    v = _batched(u, "u")
    s = torch.linalg.svdvals(v if v.is_floating_point() else v.double()).double()
    total = s.sum(-1, keepdim=True)
    p = s / torch.where(total > 0, total, torch.ones_like(total))
    h = -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))),
                     torch.zeros_like(p)).sum(-1)
    out = torch.where(total[..., 0] > 0, torch.exp(h), torch.full_like(h, float("nan")))
    return out[0] if single else out


def attention_entropy(g: torch.Tensor) -> torch.Tensor:
    """-sum_x' g(x, x') log g(x, x') over the last axis (0 log 0 = 0): (..., N_q, N_k) ->
    (..., N_q). log N_k for a uniform kernel, 0 for a kernel concentrated on one x'."""
    if not isinstance(g, torch.Tensor) or g.dim() < 1:
        raise ArgumentError("g", f"expected a tensor (..., N_q, N_k), got {type(g).__name__}")
    g = g.double()
    safe = torch.where(g > 0, g, torch.ones_like(g))
    return -torch.where(g > 0, g * torch.log(safe), torch.zeros_like(g)).sum(-1)


def _blended(op) -> tuple[nn.Module, Mapping[str, torch.Tensor]] | None:
    """(module, blended parameters) of an operator of linearly interpolated controls
    (``with_controls_in_time("linear")``: an object that is not a module but holds one as
    ``module`` with its parameters ``params``), or None for a plain operator."""
    if isinstance(op, nn.Module):
        return None
    module, params = getattr(op, "module", None), getattr(op, "params", None)
    if isinstance(module, nn.Module) and isinstance(params, Mapping):
        return module, params
    return None


@contextlib.contextmanager
def _plain(op) -> Iterator[nn.Module]:
    """The operator as a module; an operator of linearly interpolated controls with its
    blended parameters in place."""
    blend = _blended(op)
    if blend is not None:
        from torch.nn.utils.stateless import _reparametrize_module

        with _reparametrize_module(blend[0], blend[1]):
            yield blend[0]
    else:
        yield op


def _module(op) -> nn.Module:
    blend = _blended(op)
    return blend[0] if blend is not None else op


def kernel_matrix(op: AttentionOperator, u: torch.Tensor, context: Context | None = None
                  ) -> torch.Tensor:
    """g_h(x, x') of the attention operator ``op`` at the state u (B, N_x, N_y) it is applied
    to: (B, H, N_x, N_x'). Q, K from the operator's own maps, its support (mask, causal) and its
    kernel applied to the identity as values, kernel(Q, K, I) (every kernel is linear in V);
    no dropout."""
    return _kernel_and_support(op, u, context)[0]


def _kernel_and_support(op, u: torch.Tensor, context: Context | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, support): the kernel (B, H, N_x, N_x') and where the kernel at zero queries and keys
    is positive (bool, same shape): the support of g (mask, causal)."""
    with _plain(op) as m:
        q, k, _ = m.qkv(u, context)
        mask, causal = m.support(context)
        n_k = k.shape[-2]
        eye = torch.eye(n_k, dtype=q.dtype, device=q.device).expand(*k.shape[:-2], n_k, n_k)
        eye = eye.contiguous()
        g = m.kernel(q, k, eye, attn_mask=mask, is_causal=causal, dropout_p=0.0)
        g0 = m.kernel(torch.zeros_like(q), torch.zeros_like(k), eye, attn_mask=mask,
                      is_causal=causal, dropout_p=0.0)
        return g, g0 > 0


@dataclass(frozen=True)
class LipschitzEstimate:
    """What ``step_lipschitz`` returns: ``value`` (the estimate of sigma_max; ``float()`` of
    the record), the ``iterations`` used, whether it ``converged`` (the relative change fell
    below the tolerance, or the Krylov space became invariant) and the relative ``change`` of
    the estimate at the last iteration (None after a single iteration)."""

    value: float
    iterations: int
    converged: bool
    change: float | None

    def __float__(self) -> float:
        return float(self.value)


def _tridiagonal_top(alphas: list[float], betas: list[float]) -> float:
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        off = torch.tensor(betas, dtype=torch.float64)
        t = t + torch.diag(off, 1) + torch.diag(off, -1)
    return float(torch.linalg.eigvalsh(t)[-1])


def _check_real(value, argument: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(float(value)) and low <= float(value) < high):
        raise ArgumentError(argument, f"expected a number in [{low:g}, {high:g}), got "
                                      f"{value!r}")
    return float(value)


def step_lipschitz(evolution: Evolution, step: int, state: torch.Tensor,
                   context: Context | None = None, *, index: int = 0,
                   iterations: int = LIPSCHITZ_ITERATIONS, tol: float = LIPSCHITZ_TOL,
                   seed: int = 0) -> LipschitzEstimate:
    """An estimate of the largest singular value of the Jacobian J of the step map u^n ->
    u^{n+1} (step ``step`` of ``evolution``, run in eval mode: no dropout) at input ``index``
    of ``state`` (B, N_x, N_y), the other inputs held fixed.

    The Lanczos iteration on J^T J: v_1 a unit vector seeded by ``seed``; iteration k forms
    w = J^T J v_k (one torch.func.jvp and one vjp), alpha_k = <w, v_k>, orthogonalises w
    against v_1 .. v_k (twice, in float64), beta_k = ||w||, v_{k+1} = w / beta_k. The estimate
    is the square root of the largest eigenvalue of the tridiagonal matrix (alpha, beta): it
    never exceeds sigma_max(J) and increases with k. Stops when the estimate changes by less
    than ``tol`` (relative) from one iteration to the next, when beta_k vanishes (an invariant
    Krylov space: the estimate is exact), or after ``iterations`` (not converged). Bad
    arguments raise ArgumentError naming them."""
    if not isinstance(evolution, Evolution):
        raise ArgumentError("evolution", f"expected an Evolution, got {type(evolution).__name__}")
    if getattr(evolution.scheme, "lift", None) is not None:
        raise ArgumentError("evolution", f"scheme {evolution.scheme.name!r} has its own "
                                          "(doubled) state: its step map does not act on u alone")
    nsteps = int(evolution.num_steps)
    if not _is_index(step) or not 0 <= step < nsteps:
        raise ArgumentError("step", f"expected a step index in [0, {nsteps - 1}] (the "
                                    f"evolution has {plural(nsteps, 'step')}), got {step!r}")
    if not isinstance(state, torch.Tensor) or state.dim() != 3 or not state.is_floating_point():
        what = (f"{state.dtype} of shape {tuple(state.shape)}" if isinstance(state, torch.Tensor)
                else type(state).__name__)
        raise ArgumentError("state", f"expected a floating tensor (batch, tokens, features), "
                                     f"got {what}")
    batch = state.shape[0]
    if not _is_index(index) or not 0 <= index < batch:
        raise ArgumentError("index", f"expected an input index in [0, {batch - 1}] (the batch "
                                     f"has {batch}), got {index!r}")
    iterations = _check_int(iterations, "iterations", 1)
    tol = _check_real(tol, "tol", 0.0, 1.0)
    seed = check_seed(seed)
    modes = {m: m.training for m in evolution.modules()}
    evolution.eval()
    try:
        return _lanczos(evolution, int(step), state.detach(), context, int(index), iterations,
                        tol, seed)
    finally:
        for m, mode in modes.items():
            m.training = mode


def _lanczos(evolution: Evolution, step: int, u: torch.Tensor, context, index: int,
             cap: int, tol: float, seed: int) -> LipschitzEstimate:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    x0 = u[index]

    def f(x: torch.Tensor) -> torch.Tensor:
        full = torch.cat((u[:index], x.unsqueeze(0), u[index + 1:]))
        return evolution.advance(step, full, context)[index]

    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(x0.numel(), generator=gen, dtype=torch.float64).to(x0.device)
    v = v / v.norm()
    basis: list[torch.Tensor] = []
    alphas: list[float] = []
    betas: list[float] = []
    estimate, change = 0.0, None
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        _, vjp_fn = torch.func.vjp(f, x0)
        for k in range(1, cap + 1):
            basis.append(v)
            _, jv = torch.func.jvp(f, (x0,), (v.to(x0.dtype).reshape(x0.shape),))
            (w,) = vjp_fn(jv)
            w = w.detach().double().flatten()
            if not bool(torch.isfinite(w).all()):
                return LipschitzEstimate(float("nan"), k, False, None)
            size = float(w.norm())
            alphas.append(float(w @ v))
            vs = torch.stack(basis)
            for _ in range(2):  # full reorthogonalisation
                w = w - vs.T @ (vs @ w)
            beta = float(w.norm())
            previous = estimate
            estimate = math.sqrt(max(_tridiagonal_top(alphas, betas), 0.0))
            if k > 1:
                change = abs(estimate - previous) / estimate if estimate > 0 else 0.0
            if beta <= 1e-10 * size or k == x0.numel():  # invariant Krylov space: exact
                return LipschitzEstimate(estimate, k, True, change if change is not None
                                         else 0.0)
            if change is not None and change < tol:
                return LipschitzEstimate(estimate, k, True, change)
            betas.append(beta)
            v = w / beta
    return LipschitzEstimate(estimate, cap, False, change)


def _is_index(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _layer_norm_parts(op: LayerNormProjection, like: torch.Tensor):
    gamma = op.weight if op.weight is not None else torch.ones_like(like[0, 0])
    beta = op.bias if op.bias is not None else torch.zeros_like(like[0, 0])
    return gamma.detach().double(), beta.detach().double()


def constraint_residual(op, after: torch.Tensor, before: torch.Tensor | None = None,
                        *, state: bool = False) -> dict[str, Any] | None:
    """The residuals of u = ``after`` (B, N_x, N_y) against the set the projection ``op``
    projects onto (module docstring): a dict, or None for a projection this module does not
    read. ``before`` (the state the projection was applied to) gives a real LayerNorm its
    eps-corrected variance target; ``state=True`` reads u as the state entering a pre-norm
    field (LN against the eps = 0 set)."""
    op = _module(op)
    u = after.detach().double()
    label = "S1 (state, pre-norm)" if state else "S1"
    if isinstance(op, SphereProjection):
        s1, s2 = float(op.s1), float(op.s2)
        mean = u.mean(-1)
        var = u.var(-1, unbiased=False)
        return {"set": label, "operator": "SphereProjection", "s1": s1, "s2": s2,
                "mean_residual": float((mean - s1).abs().max()),
                "var_residual": float((var - s2 ** 2).abs().max()),
                "reading": "mean_y u against s1, var_y u against s2^2"}
    if isinstance(op, LayerNormProjection):
        with _plain(op):
            gamma, beta = _layer_norm_parts(op, u)
        out: dict[str, Any] = {"set": label, "operator": "LayerNormProjection", "eps": op.eps}
        if bool((gamma == 0).any()):
            out.update(mean_residual=None, var_residual=None, var_residual_eps0=None,
                       reading="not measured: the gain gamma has zero entries, so the "
                               "normalised variable z = (u - beta) / gamma is undefined there")
            return out
        z = (u - beta) / gamma
        var_z = z.var(-1, unbiased=False)
        out["mean_residual"] = float(z.mean(-1).abs().max())
        eps0 = float((var_z - 1.0).abs().max())
        if state or before is None or before.shape != after.shape:
            out["var_residual"] = eps0
            out["reading"] = ("normalised variable z = (u - beta) / gamma: mean_y z against 0, "
                              "var_y z against 1 (the eps = 0 set)")
        else:
            vb = before.detach().double().var(-1, unbiased=False)
            target = vb / (vb + op.eps) if op.eps > 0 else torch.ones_like(vb)
            out["var_residual"] = float((var_z - target).abs().max())
            out["var_residual_eps0"] = eps0
            out["reading"] = ("normalised variable z = (u - beta) / gamma: mean_y z against 0, "
                              "var_y z against 1 - eps / (var_y v + eps), v the state before "
                              "the projection (the ghost-point reading, docs/math.md 3.1); "
                              "var_residual_eps0 against 1")
        return out
    if isinstance(op, ProjectionS2) and not state:
        return {"set": "S2", "operator": "ProjectionS2",
                "residual": float((-u.min()).clamp_min(0.0)),
                "reading": "max(0, -min u): the negative part left"}
    return None


def _is_s1(op) -> bool:
    return isinstance(_module(op), (SphereProjection, LayerNormProjection))


# -- activations -------------------------------------------------------------------------------
def _constraint_active(name: str, p: torch.Tensor) -> torch.Tensor | None:
    """Where the activation's constraint is active at the pre-activation p (bool), or None for
    an activation that is not a projection (no constraint)."""
    if name == "relu":  # the projection onto S2 = {u >= 0}
        return p < 0
    if name == "hardtanh":  # the projection onto [-1, 1]
        return p.abs() > 1
    return None


def _activation_reading(act) -> tuple[str, str, str]:
    """(name, reading, why) of an Activation or ProjectionS2."""
    act = _module(act)
    if isinstance(act, ProjectionS2) or (isinstance(act, Activation) and act.name == "relu"):
        return "relu", "projection", "ReLU is the projection onto S2 = {u >= 0}"
    if isinstance(act, Activation):
        if act.is_proximal:
            return act.name, "proximal map", f"{act.name}: {act.reading}"
        return act.name, "neither", f"{act.name}: {act.reading}"
    return type(act).__name__, "neither", f"{type(act).__name__} is not a known activation"


# -- the result ------------------------------------------------------------------------------
@dataclass
class Diagnostics:
    """What ``analyze`` measured. ``evolutions`` holds the JSON-friendly records (``as_dict``);
    ``states[e]`` the Trajectory of evolution e (every grid point and substep),
    ``attention_kernels[e][n]`` the kernel (heads, N_x, N_x') of input ``kernel_input`` of each
    attention substep of step n, keyed by its label (the "operator" of its attention record),
    ``kernels[e][n]`` the step's first one or None, ``grids[e]`` the token grid (rows, cols) a
    family reports (CvT) or None, ``names[e]`` its label."""

    model: dict[str, Any]
    batch: int
    activation: dict[str, str]
    evolutions: list[dict[str, Any]]
    states: list[Trajectory]
    kernels: list[list[torch.Tensor | None]]
    names: list[str]
    grids: list[tuple[int, int] | None]
    kernel_input: int
    notes: list[str] = field(default_factory=list)
    attention_kernels: list[list[dict[str, torch.Tensor]]] = field(default_factory=list)
    lipschitz_settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Every number, JSON-friendly (floats, ints, bools, strings, lists, dicts, None; no
        NaN)."""
        return {"model": self.model, "batch": self.batch, "activation": self.activation,
                "kernel_input": self.kernel_input,
                "lipschitz_settings": dict(self.lipschitz_settings),
                "evolutions": self.evolutions, "definitions": dict(DEFINITIONS),
                "notes": list(self.notes)}

    def summary(self) -> str:
        """A few lines of text (``summary_text`` of ``as_dict()``): per evolution its scheme,
        N_t, tau, the final norm, the kinetic energy, the product of the Lipschitz estimates,
        cosine similarity and effective rank from u(0) to u(T); and the reading of the
        activation."""
        return summary_text(self.as_dict())


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, in the plural (word + "s") unless n is 1."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _count(n, word: str) -> str:
    """``plural`` of a number of the data, shown as ``_fmt`` shows it."""
    return f"{_fmt(n)} {word}" if n == 1 else f"{_fmt(n)} {word}s"


def _fmt(x) -> str:
    """A number as the report shows it: an int as is, a float to 4 significant digits."""
    if x is None:
        return "n/a"
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return str(int(x))
    return f"{x:.4g}"


def summary_text(data: Mapping[str, Any]) -> str:
    """The summary of ``Diagnostics.as_dict()`` (or of the JSON that ``splitformer analyze``
    writes): every number in it is a number of ``data``, as ``_fmt`` shows it."""
    m = data["model"]
    lines = [f"{m['class']} ({m['family'] or 'family unknown'}), batch {_fmt(data['batch'])}"]
    for info, ev in zip(m["evolutions"], data["evolutions"], strict=True):
        steps = ev["steps"]
        last = steps[-1] if steps else {}
        lines.append(f"{info['name']}: scheme {info['scheme']} [{info['scheme_text']}], "
                     f"N_t = {_fmt(info['num_steps'])}, tau = {_fmt(info['tau'])}, "
                     f"T = {_fmt(info['T'])}, {_count(info['tokens'], 'token')} x "
                     f"{_count(info['width'], 'feature')}")
        lips = [s["lipschitz"] for s in steps if s.get("lipschitz") is not None]
        lip_range = f" (per step {_fmt(min(lips))} .. {_fmt(max(lips))})" if lips else ""
        unconverged = [s for s in steps if s.get("lipschitz") is not None
                       and s.get("lipschitz_converged") is False]
        if unconverged:
            lip_range += (f", not converged at step{'s' if len(unconverged) > 1 else ''} "
                          + ", ".join(_fmt(s["step"]) for s in unconverged))
        lines.append(f"  final norm {_fmt(last.get('norm'))}, kinetic energy "
                     f"{_fmt(ev['kinetic_energy'])}, product of the Lipschitz estimates "
                     f"{_fmt(ev['lipschitz_product'])}{lip_range}")
        first = ev["initial"]
        lines.append(f"  cosine similarity {_fmt(first['cosine_similarity'])} -> "
                     f"{_fmt(last.get('cosine_similarity'))}, effective rank "
                     f"{_fmt(first['effective_rank'])} -> {_fmt(last.get('effective_rank'))}")
    a = data["activation"]
    lines.append(f"activation {a['name']}: {a['reading']} ({a['why']})")
    return "\n".join(lines)


# -- the analysis ------------------------------------------------------------------------------
def _check_inputs(inputs) -> tuple[tuple, dict]:
    if isinstance(inputs, Mapping):
        bad = [k for k in inputs if not isinstance(k, str)]
        if bad:
            raise ArgumentError("inputs", f"expected a dict of keyword inputs with str keys, got "
                                          f"the key {bad[0]!r}")
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    hint = " (wrap one tensor as a tuple: (x,))" if isinstance(inputs, torch.Tensor) else ""
    raise ArgumentError("inputs", f"expected a tuple of positional inputs or a dict of keyword "
                                  f"inputs, as model(...) takes them, got "
                                  f"{type(inputs).__name__}{hint}")


def _tensors(value, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in ``value`` (nested tuples, lists and dicts), with where each is."""
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _tensors(v, f"{where}[{k!r}]")
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{where}[{i}]")


def _nonfinite(t: torch.Tensor) -> str | None:
    """How a floating tensor is not finite ("NaN", "infinite", "NaN and infinite"), or None."""
    if not (t.is_floating_point() or t.is_complex()):
        return None
    nan = bool(torch.isnan(t).any())
    inf = bool(torch.isinf(t).any())
    return " and ".join(w for w, f in (("NaN", nan), ("infinite", inf)) if f) or None


def _check_finite(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Every parameter of the model and every floating input tensor is finite, or
    ArgumentError("model") / ArgumentError("inputs") naming the first that is not."""
    for name, param in model.named_parameters():
        bad = _nonfinite(param.detach())
        if bad:
            raise ArgumentError("model", f"parameter {name!r} holds {bad} values: the "
                                         "weights are not finite")
    for where, t in [*_tensors(args, "inputs"), *_tensors(kwargs, "inputs")]:
        bad = _nonfinite(t.detach())
        if bad:
            raise ArgumentError("inputs", f"{where} holds {bad} values: the input is not "
                                          "finite")


def _check_int(value, argument: str, low: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ArgumentError(argument, f"expected an integer >= {low}, got {value!r}")
    return int(value)


@dataclass
class _Call:
    evolution: Evolution
    name: str
    u0: torch.Tensor
    context: Context | None


class _Refused(Exception):
    """A TypeError or ValueError raised by a model's own input checks (initial_condition)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _capture(model: EvolutionModel, args: tuple, kwargs: dict) -> list[_Call]:
    """Run the model once, recording (u0, context) of every call of one of its evolutions.

    Inputs that ``model.forward`` does not take, and a TypeError or ValueError raised by the
    model's own input checks (the ``initial_condition`` of the model or of one of its parts),
    raise ArgumentError("inputs"); any other exception of the run propagates as it is."""
    import inspect

    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as e:
        raise ArgumentError("inputs", f"model(...) does not take them: {e}") from None
    except ValueError:  # no signature to read: let the call say
        pass
    names = {id(m): n for n, m in model.named_modules() if isinstance(m, Evolution)}
    calls: list[_Call] = []
    seen: dict[str, int] = {}

    def hook(module, hargs, hkwargs):
        u0 = hargs[0] if hargs else hkwargs.get("u0")
        ctx = hargs[1] if len(hargs) > 1 else hkwargs.get("context")
        path = names.get(id(module), "evolution")
        label = path[: -len(".evolution")] if path.endswith(".evolution") else path
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label}#{seen[label]}"
        calls.append(_Call(module, label, u0.detach(), ctx))

    def checked(method):
        def initial_condition(*a, **k):
            try:
                return method(*a, **k)
            except _Refused:
                raise
            except (TypeError, ValueError) as e:
                raise _Refused(e) from e
        return initial_condition

    owners = [m for m in model.modules() if isinstance(m, EvolutionModel)]
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True)
               for m in model.modules() if isinstance(m, Evolution)]
    for m in owners:
        object.__setattr__(m, "initial_condition", checked(m.initial_condition))
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except _Refused as e:
        raise ArgumentError("inputs", f"model(...) refused them: {type(e.error).__name__}: "
                                      f"{e.error}") from e.error
    finally:
        for m in owners:
            m.__dict__.pop("initial_condition", None)
        for h in handles:
            h.remove()
    return calls


def _family(model: nn.Module) -> str | None:
    mod = type(model).__module__
    if mod.startswith("splitformer.models."):
        return mod.rsplit(".", 1)[-1]
    return None


def _activation(evolutions: list[Evolution]) -> dict[str, str]:
    found: dict[str, tuple[str, str, str]] = {}
    for evo in evolutions:
        used = set(evo.scheme.operators())
        for theta in evo.controls:
            for name, op in theta.items():
                if name not in used:
                    continue
                for m in op.modules():
                    if isinstance(m, (Activation, ProjectionS2)):
                        r = _activation_reading(m)
                        found.setdefault(r[0], r)
    if not found:
        return {"name": "none", "reading": "neither",
                "why": "the evolution applies no activation (no FFN activation, no ReLU "
                       "projection)"}
    weakest = min(found.values(), key=lambda r: _READING_RANK[r[1]])
    if len(found) == 1:
        return {"name": weakest[0], "reading": weakest[1], "why": weakest[2]}
    return {"name": "+".join(found), "reading": weakest[1],
            "why": "several activations, the weakest reading shown: "
                   + "; ".join(r[2] for r in found.values())}


def _frob(t: torch.Tensor) -> torch.Tensor:
    """||.||_F over tokens x features, per input: (B, N, D) -> (B,) in float64."""
    return t.detach().double().flatten(1).norm(dim=1)


def _difference(after: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    if after.shape != before.shape:  # a width-changing substep: compare with zero padding
        d = max(after.shape[-1], before.shape[-1])
        after = nn.functional.pad(after, (0, d - after.shape[-1]))
        before = nn.functional.pad(before, (0, d - before.shape[-1]))
    return after - before


class _Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        if line not in self.lines:
            self.lines.append(line)

    def num(self, x, where: str, what: str, why: str = "") -> float | None:
        """A finite float, or None with a note."""
        if x is None:
            if why:
                self.add(f"{where}: {what} is None: {why}")
            return None
        v = float(x)
        if math.isfinite(v):
            return v
        self.add(f"{where}: {what} is None: {why or 'the value is not finite'} ({v})")
        return None


def _compose(names: Sequence[str], u: torch.Tensor, theta, context) -> torch.Tensor:
    for n in names:
        u = theta[n](u, context)
    return u


def _entered(st: Stage) -> tuple[list[Stage], list[Stage]]:
    """(the field stages of substep ``st`` that see the state entering it, those that do not):
    the substep itself if it is a field; for a parallel substep the first stage of each branch
    (recursively), and the later stages of the branches."""
    if st.kind == "field":
        return [st], []
    if st.kind != "parallel":
        return [], []
    seen, unseen = [], []
    for branch in st.branches:
        a, b = _entered(branch[0])
        seen += a
        unseen += b
        for later in branch[1:]:
            unseen += [s for s in _flat_fields(later)]
    return seen, unseen


def _flat_fields(st: Stage) -> list[Stage]:
    if st.kind == "field":
        return [st]
    if st.kind == "parallel":
        return [s for b in st.branches for x in b for s in _flat_fields(x)]
    return []


def _attentions(stages: list[Stage], theta) -> list[tuple[Stage, str, Any]]:
    """(stage, operator name, operator) of each attention field of ``stages``."""
    return [(st, n, theta[n]) for st in stages for n in st.fields()
            if isinstance(_module(theta[n]), AttentionOperator)]


def _ffn_readings(stages: list[Stage], theta, before: torch.Tensor, context
                  ) -> tuple[bool, float | None, float | None, set[str]]:
    """(whether a field of ``stages`` holds an FFN, relu_active, negative_preactivation, the
    activations without a constraint) of the FFNs of ``stages`` (fields that see
    ``before``)."""
    active = total = negative = 0
    counted = 0
    free: set[str] = set()
    found = False
    for st in stages:
        ffns = [theta[n] for n in st.fields() if isinstance(_module(theta[n]), FeedForward)]
        if not ffns:
            continue
        found = True
        w = _compose(st.pre, before, theta, context)
        for op in ffns:
            with _plain(op) as m:
                h = w
                for stage in m.stages[:-1]:
                    h = stage(h)
                    negative += int((h < 0).sum())
                    counted += h.numel()
                    a = _constraint_active(m.activation.name, h)
                    if a is None:
                        free.add(m.activation.name)
                    else:
                        active += int(a.sum())
                        total += a.numel()
                    h = m.activation(h)
    relu = active / total if total and not free else None
    return found, relu, (negative / counted if counted else None), free


def _clipped(stages: list[Stage], theta) -> bool:
    """Whether a field of ``stages`` is followed by a ReLU projection (``then``)."""
    return any(isinstance(_module(theta[n]), ProjectionS2) or (
        isinstance(_module(theta[n]), Activation) and _module(theta[n]).name == "relu")
        for st in stages for n in st.then)


def _attention_record(j: int, label: str, op, state: torch.Tensor, context, index: int,
                      where: str, notes: _Notes) -> tuple[dict[str, Any], torch.Tensor | None]:
    rec: dict[str, Any] = {"substep": j, "operator": label, "entropy": None,
                           "entropy_uniform": None}
    try:
        g, support = _kernel_and_support(op, state, context)
    except Exception as e:  # noqa: BLE001 - a kernel without a matrix form
        notes.add(f"{where}: the kernel and entropies of '{label}' are None: its kernel gave "
                  f"no matrix ({type(e).__name__}: {e})")
        return rec, None
    ent = attention_entropy(g).mean(dim=(0, 2))
    rec["entropy"] = [notes.num(e, where, f"entropy[{h}] of '{label}'")
                      for h, e in enumerate(ent.tolist())]
    count = support.sum(-1).double()
    uniform = torch.log(torch.where(count > 0, count, torch.ones_like(count))).mean()
    rec["entropy_uniform"] = notes.num(uniform, where, f"entropy_uniform of '{label}'")
    return rec, g[index].detach()


def _analyze_evolution(call: _Call, kernel_input: int, iterations: int, tol: float, seed: int,
                       notes: _Notes) -> tuple[dict, Trajectory, list, list, tuple | None]:
    evo, ctx, name = call.evolution, call.context, call.name
    traj = evo(call.u0, ctx, SaveAt(steps=True, substeps=True))
    states = traj.state_list
    tau, nsteps = evo.tau, evo.num_steps
    reversible = getattr(evo.scheme, "lift", None) is not None
    stages = evo.scheme.stages
    by_step: dict[int, list] = {}
    for sub in traj.substeps:
        by_step.setdefault(sub.step, []).append(sub)
    if reversible:
        notes.add(f"{name}: the Lipschitz estimates, attention kernels and entropies, and the "
                  "constraint, relu_active and negative_preactivation of the field substeps "
                  f"are None: the scheme {evo.scheme.name!r} steps its own doubled state (u, v) "
                  "and its fields act on one component of it")
    steps_out, kernels, all_kernels = [], [], []
    free: set[str] = set()
    for n in range(nsteps):
        where = f"{name} step {n}"
        u_n, u_next = states[n], states[n + 1]
        theta = evo.theta(n)
        diff = _frob(u_next - u_n)
        est, why = None, ""
        if reversible:
            why = "the reversible scheme's step acts on the doubled state (u, v)"
        else:
            try:
                est = step_lipschitz(evo, n, u_n, ctx, index=kernel_input,
                                     iterations=iterations, tol=tol, seed=seed)
            except (RuntimeError, NotImplementedError) as e:
                why = f"jvp/vjp failed: {str(e).splitlines()[0]}"
        lip = None
        if est is not None and math.isfinite(est.value):
            lip = float(est.value)
        elif est is not None:
            why = f"the estimate is not finite ({est.value})"
        if lip is None:
            notes.add(f"{where}: lipschitz, lipschitz_iterations, lipschitz_converged and "
                      f"lipschitz_change are None: {why}")
        elif not est.converged:
            last = (f"the relative change of the last iteration is {est.change:.2g}"
                    if est.change is not None else "a single iteration measures no change")
            notes.add(f"{where}: the Lipschitz estimate did not converge: it stopped at the "
                      f"cap of {plural(est.iterations, 'iteration')} (lipschitz_iterations) and "
                      f"{last}, "
                      f"not below lipschitz_tol = {tol:g}; it is a lower estimate of "
                      "sigma_max")
        # substeps
        subs_out, attention, step_kernels = [], [], {}
        before = u_n
        for sub in by_step.get(n, []):
            st = stages[sub.stage]
            after = sub.state
            inc = float(_frob(_difference(after, before)).mean())
            sub_where = f"{where} substep {sub.stage} '{sub.label}'"
            constraint, relu, negative = None, None, None
            seen, unseen = _entered(st)
            if st.kind == "project":
                constraint = constraint_residual(theta[st.operator], after, before)
            elif st.kind == "field" and not reversible:
                pre_s1 = [p for p in st.pre if _is_s1(theta[p])]
                if pre_s1:
                    constraint = constraint_residual(theta[pre_s1[0]], before, state=True)
            if seen and not reversible:
                has_ffn, relu, negative, no_set = _ffn_readings(seen, theta, before, ctx)
                free |= no_set
                if has_ffn and negative is None:
                    notes.add(f"{sub_where}: relu_active and negative_preactivation are None: "
                              "the FFN has no hidden layer")
                if not has_ffn and _clipped(seen, theta):
                    if st.kind == "field":
                        relu = float((after <= 0).double().mean())
                    else:
                        notes.add(f"{sub_where}: relu_active is None: the ReLU projection "
                                  "after a field inside a parallel branch acts on a state the "
                                  "trajectory does not keep")
                unmeasured = [str(s) for s in unseen
                              if _attentions([s], theta) or _ffn_readings_possible(s, theta)]
                if unmeasured:
                    notes.add(f"{sub_where}: the attention kernels and FFN readings of "
                              f"{', '.join(repr(u) for u in unmeasured)} are not measured: "
                              "later stages of a parallel branch see states the trajectory "
                              "does not keep")
                for ast, op_name, op in _attentions(seen, theta):
                    label = str(ast) if len(ast.fields()) == 1 else f"{ast}:{op_name}"
                    if any(a["operator"] == label for a in attention):
                        label = f"{label}#{sub.stage}"
                    rec, g = _attention_record(sub.stage, label, op,
                                               _compose(ast.pre, before, theta, ctx), ctx,
                                               kernel_input, where, notes)
                    attention.append(rec)
                    if g is not None:
                        step_kernels[label] = g
            relu = notes.num(relu, sub_where, "relu_active")
            negative = notes.num(negative, sub_where, "negative_preactivation")
            subs_out.append({"label": sub.label, "stage": sub.stage, "kind": st.kind,
                             "increment": notes.num(inc, where, f"increment of '{sub.label}'"),
                             "share": None, "constraint": constraint, "relu_active": relu,
                             "negative_preactivation": negative})
            before = after
        total = sum(s["increment"] or 0.0 for s in subs_out)
        for s in subs_out:
            if total > 0 and s["increment"] is not None:
                s["share"] = s["increment"] / total
        if subs_out and not total > 0:
            notes.add(f"{where}: shares are None: the step's increments sum to 0")
        if not attention:
            why_att = ("the reversible scheme's fields act on one component of the doubled "
                       "state" if reversible else "the step has no attention substep")
            notes.add(f"{where}: attention_operator and attention_entropy are None: "
                      f"{why_att}")
        first = attention[0] if attention else None
        kernels.append(step_kernels.get(first["operator"]) if first is not None else None)
        all_kernels.append(step_kernels)
        steps_out.append({
            "step": n, "t": float(evo.grid.time(n)), "t_end": float(evo.grid.time(n + 1)),
            "norm": notes.num(_frob(u_next).mean(), where, "norm"),
            "velocity": notes.num(diff.mean() / tau, where, "velocity"),
            "lipschitz": lip,
            "lipschitz_iterations": est.iterations if lip is not None else None,
            "lipschitz_converged": bool(est.converged) if lip is not None else None,
            "lipschitz_change": (notes.num(est.change, where, "lipschitz_change",
                                           "a single iteration measures no change")
                                 if lip is not None else None),
            "cosine_similarity": notes.num(cosine_similarity(u_next).mean(), where,
                                           "cosine_similarity",
                                           "a single token has no pairs"),
            "effective_rank": notes.num(effective_rank(u_next).mean(), where, "effective_rank",
                                        "the state is zero"),
            "attention_operator": first["operator"] if first is not None else None,
            "attention_entropy": first["entropy"] if first is not None else None,
            "attention": attention,
            "substeps": subs_out,
        })
    for act in sorted(free):
        notes.add(f"{name}: relu_active is None on the FFN substeps: activation {act} is not a "
                  "projection, so no constraint is active; negative_preactivation gives the "
                  "fraction of pre-activations < 0 (a sign statistic)")
    lips = [s["lipschitz"] for s in steps_out]
    product = math.prod(lips) if lips and all(x is not None for x in lips) else None
    u0 = states[0]
    kinetic = KineticEnergy(1.0).value(evo, traj) if len(traj) > 1 else None
    record = {
        "name": name,
        "times": [float(t) for t in evo.grid.times(dtype=torch.float64).tolist()],
        "initial": {
            "t": 0.0,
            "norm": notes.num(_frob(u0).mean(), f"{name} u(0)", "norm"),
            "cosine_similarity": notes.num(cosine_similarity(u0).mean(), f"{name} u(0)",
                                           "cosine_similarity", "a single token has no pairs"),
            "effective_rank": notes.num(effective_rank(u0).mean(), f"{name} u(0)",
                                        "effective_rank", "the state is zero"),
        },
        "steps": steps_out,
        "kinetic_energy": notes.num(kinetic, name, "kinetic_energy", "no steps"),
        "lipschitz_product": notes.num(product, name, "lipschitz_product",
                                       "a step has no Lipschitz estimate" if lips else
                                       "no steps"),
    }
    grid = None
    if isinstance(ctx, Context):
        gs = ctx.extra.get("grid_shape")
        if isinstance(gs, (tuple, list)) and len(gs) == 2:
            grid = (int(gs[0]), int(gs[1]))
    return record, traj, kernels, all_kernels, grid


def _ffn_readings_possible(st: Stage, theta) -> bool:
    return any(isinstance(_module(theta[n]), FeedForward) for n in st.fields())


def analyze(model: EvolutionModel, inputs: tuple | list | Mapping[str, Any], *,
            lipschitz_iterations: int = LIPSCHITZ_ITERATIONS,
            lipschitz_tol: float = LIPSCHITZ_TOL, kernel_input: int = 0, seed: int = 0
            ) -> Diagnostics:
    """The diagnostics of ``model`` on ``inputs`` along the path of every evolution it runs
    (module docstring). ``inputs``: a tuple of positional inputs or a dict of keyword inputs,
    as ``model(...)`` takes them. Each step's Lipschitz estimate iterates until its relative
    change is below ``lipschitz_tol`` (a number in [0, 1)), at most ``lipschitz_iterations``
    (>= 1) times, from a random vector seeded by ``seed``, at input ``kernel_input`` (also the
    input whose kernels are kept). The model runs in eval mode (each module's own mode is
    restored after) and without gradients; ArgumentError names a bad argument, and inputs
    that the model's own input checks refuse are ArgumentError("inputs"). Non-finite values
    (NaN, infinities) are refused before the run: in a parameter of the model
    (ArgumentError("model")), in a floating input tensor or in the u(0) the model makes of the
    inputs (ArgumentError("inputs"))."""
    if not isinstance(model, EvolutionModel):
        raise ArgumentError("model", f"expected a splitformer EvolutionModel (from_torch, "
                                     f"from_hf, build_vit, ...), got {type(model).__name__}")
    args, kwargs = _check_inputs(inputs)
    iterations = _check_int(lipschitz_iterations, "lipschitz_iterations", 1)
    tol = _check_real(lipschitz_tol, "lipschitz_tol", 0.0, 1.0)
    index = _check_int(kernel_input, "kernel_input", 0)
    seed = check_seed(seed)
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        _check_finite(model, args, kwargs)
        calls = _capture(model, args, kwargs)
        if not calls:
            raise ArgumentError("model", f"running {type(model).__name__} called no evolution")
        for call in calls:
            bad = _nonfinite(call.u0)
            if bad:
                raise ArgumentError("inputs", f"u(0) of evolution {call.name!r} holds {bad} "
                                              "values: the input is not finite as the model "
                                              "embeds it")
        batch = int(calls[0].u0.shape[0])
        if index >= batch:
            raise ArgumentError("kernel_input", f"expected an input index in [0, {batch - 1}] "
                                                f"(the batch has {batch}), got {kernel_input!r}")
        notes = _Notes()
        records, trajs, kernels, every, grids, infos = [], [], [], [], [], []
        for call in calls:
            evo = call.evolution
            with torch.no_grad():
                rec, traj, ks, all_ks, grid = _analyze_evolution(call, index, iterations, tol,
                                                                 seed, notes)
            records.append(rec)
            trajs.append(traj)
            kernels.append(ks)
            every.append(all_ks)
            grids.append(grid)
            infos.append({"name": call.name, "scheme": evo.scheme.name,
                          "scheme_text": str(evo.scheme), "T": float(evo.T),
                          "tau": float(evo.tau), "num_steps": int(evo.num_steps),
                          "tokens": int(call.u0.shape[1]), "width": int(call.u0.shape[-1])})
    finally:
        for m, mode in modes.items():
            m.training = mode
    return Diagnostics(
        model={"class": type(model).__name__, "family": _family(model), "evolutions": infos},
        batch=batch,
        activation=_activation([c.evolution for c in calls]),
        evolutions=records, states=trajs, kernels=kernels,
        names=[c.name for c in calls], grids=grids, kernel_input=index, notes=notes.lines,
        attention_kernels=every,
        lipschitz_settings={"method": "Lanczos iteration on J^T J (torch.func.jvp and vjp)",
                            "lipschitz_iterations": iterations, "lipschitz_tol": tol,
                            "seed": seed},
    )
