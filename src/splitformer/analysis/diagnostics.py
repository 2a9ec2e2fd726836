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
    lipschitz       sigma_max(J_n), J_n = d u^{n+1} / d u^n of the step map S_tau(theta(t_n +
                    tau/2)) at the state of input ``kernel_input`` (the other inputs held fixed),
                    by power iteration on J^T J with torch.func.jvp and torch.func.vjp:
                    v_0 random (seeded), w_k = J^T J v_k, v_{k+1} = w_k / ||w_k||, estimate
                    sqrt(||w_K||) after K = ``lipschitz_iterations`` iterations (a lower bound
                    that increases to sigma_max; the softmax runs through the math backend of
                    scaled_dot_product_attention, whose forward-mode derivative exists)
    cosine_similarity  mean_b of  1/(N (N-1)) sum_{x != x'} <u(x), u(x')> / (|u(x)| |u(x')|)
                    over the tokens of u^{n+1}_b (a zero token has cosine 0 with every token;
                    ``cosine_similarity``)
    effective_rank  mean_b of exp(H(p)), p_i = s_i / sum_j s_j, s the singular values of the
                    N_x x N_y matrix u^{n+1}_b, H(p) = -sum_i p_i log p_i (Roy & Vetterli 2007;
                    ``effective_rank``): 1 for a rank-one state, min(N_x, N_y) at most (the
                    singular values in the state's dtype, the entropy in float64)
    attention_entropy  per head h: mean over the batch and the query tokens x of
                    -sum_x' g_h(x, x') log g_h(x, x') (0 log 0 = 0; ``attention_entropy``),
                    g the kernel of the step's first attention substep; log N_x' for a uniform
                    kernel

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
    relu_active     for a field substep whose field holds a ``FeedForward``: the fraction of its
                    hidden units (every hidden layer, token and input) where the activation's
                    constraint is active at the pre-activation p = W_j h + b_j: p < 0 for
                    relu, leaky_relu, gelu, gelu_tanh, silu; |p| > 1 for hardtanh; never for
                    identity; None for tanh (no active set). For a field with a ReLU
                    projection in ``then`` (the paper's literal FFN substeps): the fraction of
                    the substep's output entries that are <= 0 (clipped). Other substeps: None.

Per evolution: kinetic_energy = mean_b sum_n tau ||(u^{n+1}_b - u^n_b) / tau||^2 (the running
cost ``control.KineticEnergy`` with weight 1), lipschitz_product = prod_n lipschitz_n (a bound
on the Lipschitz constant of u(0) -> u(T) near the path, None if a step has none), and
"initial": norm, cosine similarity and effective rank of u(0).

The attention kernel g_h(x, x') of a step (``Diagnostics.kernels``, per head for input
``kernel_input``) is computed from the state entering the step's first attention substep (with
its ``pre`` projection applied, as the field sees it; for a Heun or RK4 substep, the first
evaluation), by the operator's own Q and K maps, support (mask, causal) and kernel:
g = kernel(Q, K, I), the kernel applied to the identity as values. Every kernel of
``operators.kernels`` returns int g(x, x') V(x') dx', linear in V, so V = I gives g itself:
the softmax with its mask or causal support, Sinkhorn's plan, the linear kernel's normalised
feature-map weights (an N_x x N_x' matrix that its O(N) path never forms). An attention inside a
parallel stage counts when it is the first stage of its branch. Kernels, Lipschitz constants,
FFN and pre-norm readings are None for a scheme with its own doubled state (``reversible``),
whose fields act on one component of it.

Every number of ``as_dict()`` is a finite float, an int, a str or None; a None carries its
reason in ``notes``. Bad arguments raise ``ArgumentError`` naming them.
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
from ..time.controls import _Interpolated
from ..time.schemes import Stage
from .checks import ArgumentError, check_seed

__all__ = [
    "DEFINITIONS",
    "Diagnostics",
    "analyze",
    "attention_entropy",
    "constraint_residual",
    "cosine_similarity",
    "effective_rank",
    "kernel_matrix",
    "step_lipschitz",
]

DEFINITIONS = {
    "norm": "mean over the batch of ||u^{n+1}||_F (tokens x features)",
    "velocity": "mean over the batch of ||u^{n+1} - u^n||_F / tau",
    "lipschitz": "largest singular value of the Jacobian of the step map u^n -> u^{n+1} at the "
                 "state of input kernel_input, by power iteration on J^T J (torch.func.jvp and "
                 "vjp); a lower bound that increases to it",
    "cosine_similarity": "mean over the batch of the mean cosine of the angle between two "
                         "distinct tokens of u^{n+1}",
    "effective_rank": "mean over the batch of exp(-sum_i p_i log p_i), p_i = s_i / sum_j s_j, "
                      "s the singular values of the tokens x features matrix of u^{n+1} "
                      "(Roy & Vetterli 2007)",
    "attention_entropy": "per head: mean over the batch and the query tokens x of "
                         "-sum_x' g(x, x') log g(x, x') of the step's first attention kernel",
    "increment": "mean over the batch of ||after - before||_F of the substep",
    "share": "increment / sum of the step's increments",
    "constraint": "residuals of the state after a projection substep (or of the state entering "
                  "a pre-norm field) against the constraint set S1 (mean, variance over the "
                  "features; max over inputs and tokens) or S2 (max negative part)",
    "relu_active": "fraction of the FFN's hidden units where the activation's constraint is "
                   "active (pre-activation < 0 for ReLU-like activations)",
    "kinetic_energy": "mean over the batch of sum_n tau ||(u^{n+1} - u^n) / tau||_F^2",
    "lipschitz_product": "product over the steps of the per-step Lipschitz estimates",
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


@contextlib.contextmanager
def _plain(op) -> Iterator[nn.Module]:
    """The operator as a module; an operator of linearly interpolated controls
    (``with_controls_in_time("linear")``) with its blended parameters in place."""
    if isinstance(op, _Interpolated):
        from torch.nn.utils.stateless import _reparametrize_module

        with _reparametrize_module(op.module, op.params):
            yield op.module
    else:
        yield op


def _module(op) -> nn.Module:
    return op.module if isinstance(op, _Interpolated) else op


def kernel_matrix(op: AttentionOperator, u: torch.Tensor, context: Context | None = None
                  ) -> torch.Tensor:
    """g_h(x, x') of the attention operator ``op`` at the state u (B, N_x, N_y) it is applied
    to: (B, H, N_x, N_x'). Q, K from the operator's own maps, its support (mask, causal) and its
    kernel applied to the identity as values, kernel(Q, K, I) (every kernel is linear in V);
    no dropout."""
    with _plain(op) as m:
        q, k, _ = m.qkv(u, context)
        mask, causal = m.support(context)
        n_k = k.shape[-2]
        eye = torch.eye(n_k, dtype=q.dtype, device=q.device).expand(*k.shape[:-2], n_k, n_k)
        return m.kernel(q, k, eye.contiguous(), attn_mask=mask, is_causal=causal,
                        dropout_p=0.0)


def step_lipschitz(evolution: Evolution, step: int, state: torch.Tensor,
                   context: Context | None = None, *, index: int = 0, iterations: int = 10,
                   seed: int = 0) -> float:
    """Power-iteration estimate of the largest singular value of the Jacobian of the step map
    u^n -> u^{n+1} (step ``step`` of ``evolution``) at input ``index`` of ``state`` (B, N_x,
    N_y), the other inputs held fixed: sqrt(||J^T J v_K||), v_0 a seeded random unit vector,
    v_{k+1} = J^T J v_k / ||J^T J v_k||, K = ``iterations`` (one torch.func.jvp and one vjp
    each). A lower bound that increases to sigma_max(J)."""
    if getattr(evolution.scheme, "lift", None) is not None:
        raise ValueError(f"scheme {evolution.scheme.name!r} has its own (doubled) state: its "
                         "step map does not act on u alone")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    u = state.detach()
    x0 = u[index]

    def f(x: torch.Tensor) -> torch.Tensor:
        full = torch.cat((u[:index], x.unsqueeze(0), u[index + 1:]))
        return evolution.advance(step, full, context)[index]

    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(x0.shape, generator=gen, dtype=torch.float64).to(x0)
    v = v / v.norm()
    sigma2 = torch.zeros((), dtype=torch.float64)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        _, vjp_fn = torch.func.vjp(f, x0)
        for _ in range(iterations):
            _, jv = torch.func.jvp(f, (x0,), (v,))
            (w,) = vjp_fn(jv)
            nw = w.double().norm()
            if not nw > 0:
                return 0.0 if nw == 0 else float("nan")
            sigma2 = nw
            v = (w / nw).to(x0.dtype)
    return float(sigma2.sqrt())


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
_NEGATIVE = ("relu", "leaky_relu", "gelu", "gelu_tanh", "silu")


def _active(name: str, p: torch.Tensor) -> torch.Tensor | None:
    """Where the activation's constraint is active at the pre-activation p (bool), or None."""
    if name in _NEGATIVE:
        return p < 0
    if name == "hardtanh":
        return p.abs() > 1
    if name == "identity":
        return torch.zeros_like(p, dtype=torch.bool)
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
    ``states[e]`` the Trajectory of evolution e (every grid point and substep), ``kernels[e]``
    the kernel per step (heads, N_x, N_x') of input ``kernel_input``, or None, ``grids[e]`` the
    token grid (rows, cols) a family reports (CvT) or None, ``names[e]`` its label."""

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

    def as_dict(self) -> dict[str, Any]:
        """Every number, JSON-friendly (floats, ints, strings, lists, dicts, None; no NaN)."""
        return {"model": self.model, "batch": self.batch, "activation": self.activation,
                "kernel_input": self.kernel_input, "evolutions": self.evolutions,
                "definitions": dict(DEFINITIONS), "notes": list(self.notes)}

    def summary(self) -> str:
        """A few lines of text: per evolution its scheme, N_t, tau, the final norm, the kinetic
        energy, the product Lipschitz bound, cosine similarity and effective rank from u(0) to
        u(T); and the reading of the activation."""
        m = self.model
        lines = [f"{m['class']} ({m['family'] or 'family unknown'}), batch {self.batch}"]
        for info, ev in zip(m["evolutions"], self.evolutions, strict=True):
            steps = ev["steps"]
            last = steps[-1] if steps else {}
            lines.append(f"{info['name']}: scheme {info['scheme']} [{info['scheme_text']}], "
                         f"N_t = {info['num_steps']}, tau = {info['tau']:g}, T = {info['T']:g}, "
                         f"{info['tokens']} tokens x {info['width']} features")
            lips = [s["lipschitz"] for s in steps if s["lipschitz"] is not None]
            lip_range = f" (per step {min(lips):.3g} .. {max(lips):.3g})" if lips else ""
            lines.append(f"  final norm {_fmt(last.get('norm'))}, kinetic energy "
                         f"{_fmt(ev['kinetic_energy'])}, Lipschitz product "
                         f"{_fmt(ev['lipschitz_product'])}{lip_range}")
            first = ev["initial"]
            lines.append(f"  cosine similarity {_fmt(first['cosine_similarity'])} -> "
                         f"{_fmt(last.get('cosine_similarity'))}, effective rank "
                         f"{_fmt(first['effective_rank'])} -> {_fmt(last.get('effective_rank'))}")
        a = self.activation
        lines.append(f"activation {a['name']}: {a['reading']} ({a['why']})")
        return "\n".join(lines)


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"


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


def _capture(model: EvolutionModel, args: tuple, kwargs: dict) -> list[_Call]:
    """Run the model once, recording (u0, context) of every call of one of its evolutions."""
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

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True)
               for m in model.modules() if isinstance(m, Evolution)]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise ArgumentError("inputs", f"model(...) refused them: {e}") from e
    finally:
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

    def num(self, x, where: str, what: str, why: str = "") -> float | None:
        """A finite float, or None with a note."""
        if x is None:
            if why:
                self.lines.append(f"{where}: {what} is None: {why}")
            return None
        v = float(x)
        if math.isfinite(v):
            return v
        self.lines.append(f"{where}: {what} is None: {why or 'the value is not finite'} "
                          f"({v})")
        return None


def _compose(names: Sequence[str], u: torch.Tensor, theta, context) -> torch.Tensor:
    for n in names:
        u = theta[n](u, context)
    return u


def _attention_in(st: Stage, theta) -> tuple[Stage, Any] | None:
    """(the stage, its attention operator) if ``st`` (or the first stage of one of its parallel
    branches) advances an attention field."""
    if st.kind == "field":
        for n in st.fields():
            if isinstance(_module(theta[n]), AttentionOperator):
                return st, theta[n]
    if st.kind == "parallel":
        for branch in st.branches:
            found = _attention_in(branch[0], theta)
            if found is not None:
                return found
    return None


def _relu_active(st: Stage, theta, before: torch.Tensor, after: torch.Tensor, context
                 ) -> tuple[float | None, str]:
    """(fraction, why-None) for a field substep; (None, "") when it has no FFN."""
    ffns = [theta[n] for n in st.fields() if isinstance(_module(theta[n]), FeedForward)]
    if ffns:
        w = _compose(st.pre, before, theta, context)
        active = total = 0
        for op in ffns:
            with _plain(op) as m:
                h = w
                for stage in m.stages[:-1]:
                    h = stage(h)
                    a = _active(m.activation.name, h)
                    if a is None:
                        return None, (f"activation {m.activation.name} has no active set (no "
                                      "constraint to be active)")
                    active += int(a.sum())
                    total += a.numel()
                    h = m.activation(h)
        return (active / total if total else None), "the FFN has no hidden layer"
    clip = [n for n in st.then if isinstance(_module(theta[n]), ProjectionS2) or (
        isinstance(_module(theta[n]), Activation) and _module(theta[n]).name == "relu")]
    if clip:
        return float((after <= 0).double().mean()), ""
    return None, ""


def _analyze_evolution(call: _Call, kernel_input: int, iterations: int, seed: int,
                       notes: _Notes) -> tuple[dict, Trajectory, list, tuple | None]:
    evo, ctx, name = call.evolution, call.context, call.name
    traj = evo(call.u0, ctx, SaveAt(steps=True, substeps=True))
    states = traj.state_list
    tau, nsteps = evo.tau, evo.num_steps
    reversible = getattr(evo.scheme, "lift", None) is not None
    stages = evo.scheme.stages
    by_step: dict[int, list] = {}
    for sub in traj.substeps:
        by_step.setdefault(sub.step, []).append(sub)
    steps_out, kernels = [], []
    kinetic = torch.zeros(states[0].shape[0], dtype=torch.float64, device=states[0].device)
    for n in range(nsteps):
        where = f"{name} step {n}"
        u_n, u_next = states[n], states[n + 1]
        theta = evo.theta(n)
        diff = _frob(u_next - u_n)
        kinetic += diff ** 2 / tau
        if reversible:
            lip, why = None, "the reversible scheme's step acts on the doubled state (u, v)"
        else:
            try:
                lip, why = step_lipschitz(evo, n, u_n, ctx, index=kernel_input,
                                          iterations=iterations, seed=seed), ""
            except (RuntimeError, NotImplementedError) as e:
                lip, why = None, f"jvp/vjp failed: {str(e).splitlines()[0]}"
        # substeps
        subs_out, kernel, entropy, att_label = [], None, None, None
        before = u_n
        for sub in by_step.get(n, []):
            st = stages[sub.stage]
            after = sub.state
            inc = float(_frob(_difference(after, before)).mean())
            constraint, relu = None, None
            if st.kind == "project":
                constraint = constraint_residual(theta[st.operator], after, before)
            elif st.kind == "field" and not reversible:
                pre_s1 = [p for p in st.pre if _is_s1(theta[p])]
                if pre_s1:
                    constraint = constraint_residual(theta[pre_s1[0]], before, state=True)
                relu, why_relu = _relu_active(st, theta, before, after, ctx)
                relu = notes.num(relu, f"{where} substep {sub.stage} '{sub.label}'",
                                 "relu_active", why_relu)
            if kernel is None and not reversible and att_label is None:
                found = _attention_in(st, theta)
                if found is not None:
                    ast, op = found
                    att_label = str(ast)
                    try:
                        g = kernel_matrix(op, _compose(ast.pre, before, theta, ctx), ctx)
                        kernel = g[kernel_input].detach()
                        ent = attention_entropy(g).mean(dim=(0, 2))
                        entropy = [notes.num(e, where, f"attention_entropy[{h}]")
                                   for h, e in enumerate(ent.tolist())]
                    except Exception as e:  # noqa: BLE001 - a kernel without a matrix form
                        notes.lines.append(f"{where}: kernel of '{att_label}' is None: its "
                                           f"kernel gave no matrix ({type(e).__name__}: {e})")
            subs_out.append({"label": sub.label, "stage": sub.stage, "kind": st.kind,
                             "increment": notes.num(inc, where, f"increment of '{sub.label}'"),
                             "share": None, "constraint": constraint, "relu_active": relu})
            before = after
        total = sum(s["increment"] or 0.0 for s in subs_out)
        for s in subs_out:
            if total > 0 and s["increment"] is not None:
                s["share"] = s["increment"] / total
        if subs_out and not total > 0:
            notes.lines.append(f"{where}: shares are None: the step's increments sum to 0")
        if att_label is None:
            why_att = ("the reversible scheme's fields act on one component of the doubled "
                       "state" if reversible else "the step has no attention substep")
            notes.lines.append(f"{where}: attention kernel and entropy are None: {why_att}")
        kernels.append(kernel)
        steps_out.append({
            "step": n, "t": float(evo.grid.time(n)), "t_end": float(evo.grid.time(n + 1)),
            "norm": notes.num(_frob(u_next).mean(), where, "norm"),
            "velocity": notes.num(diff.mean() / tau, where, "velocity"),
            "lipschitz": notes.num(lip, where, "lipschitz", why),
            "cosine_similarity": notes.num(cosine_similarity(u_next).mean(), where,
                                           "cosine_similarity",
                                           "a single token has no pairs"),
            "effective_rank": notes.num(effective_rank(u_next).mean(), where, "effective_rank",
                                        "the state is zero"),
            "attention_operator": att_label,
            "attention_entropy": entropy,
            "substeps": subs_out,
        })
    lips = [s["lipschitz"] for s in steps_out]
    product = math.prod(lips) if lips and all(x is not None for x in lips) else None
    u0 = states[0]
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
        "kinetic_energy": notes.num(kinetic.mean(), name, "kinetic_energy"),
        "lipschitz_product": notes.num(product, name, "lipschitz_product",
                                       "a step has no Lipschitz estimate" if lips else
                                       "no steps"),
    }
    grid = None
    if isinstance(ctx, Context):
        gs = ctx.extra.get("grid_shape")
        if isinstance(gs, (tuple, list)) and len(gs) == 2:
            grid = (int(gs[0]), int(gs[1]))
    return record, traj, kernels, grid


def analyze(model: EvolutionModel, inputs: tuple | list | Mapping[str, Any], *,
            lipschitz_iterations: int = 10, kernel_input: int = 0, seed: int = 0
            ) -> Diagnostics:
    """The diagnostics of ``model`` on ``inputs`` along the path of every evolution it runs
    (module docstring). ``inputs``: a tuple of positional inputs or a dict of keyword inputs,
    as ``model(...)`` takes them. ``lipschitz_iterations`` (>= 1) power iterations per step,
    from a random vector seeded by ``seed``, at input ``kernel_input`` (also the input whose
    kernels are kept). The model runs in eval mode (each module's own mode is restored after)
    and without gradients; ArgumentError names a bad argument."""
    if not isinstance(model, EvolutionModel):
        raise ArgumentError("model", f"expected a splitformer EvolutionModel (from_torch, "
                                     f"from_hf, build_vit, ...), got {type(model).__name__}")
    args, kwargs = _check_inputs(inputs)
    iterations = _check_int(lipschitz_iterations, "lipschitz_iterations", 1)
    index = _check_int(kernel_input, "kernel_input", 0)
    seed = check_seed(seed)
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        calls = _capture(model, args, kwargs)
        if not calls:
            raise ArgumentError("model", f"running {type(model).__name__} called no evolution")
        batch = int(calls[0].u0.shape[0])
        if index >= batch:
            raise ArgumentError("kernel_input", f"expected an input index in [0, {batch - 1}] "
                                                f"(the batch has {batch}), got {kernel_input!r}")
        notes = _Notes()
        records, trajs, kernels, grids, infos = [], [], [], [], []
        for call in calls:
            evo = call.evolution
            with torch.no_grad():
                rec, traj, ks, grid = _analyze_evolution(call, index, iterations, seed, notes)
            records.append(rec)
            trajs.append(traj)
            kernels.append(ks)
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
    )
