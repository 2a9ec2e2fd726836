"""What the operators of a substep show: attention kernels, constraint residuals, FFN active
sets, the activation's reading (``analysis.diagnostics`` documents each quantity).

An operator of linearly interpolated controls (``with_controls_in_time("linear")``,
``time.controls._Interpolated``: a module with blended parameters) is read as its module with
those parameters in place (``plain``, ``module_of``). ``has_own_state(scheme)`` says whether a
scheme steps its own doubled state (``reversible``), whose fields act on one component of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ..operators.attention import AttentionOperator
from ..operators.base import Context
from ..operators.feature import FeedForward
from ..operators.kernel import expand_heads, window_support
from ..operators.projections import (
    Activation,
    LayerNormProjection,
    ProjectionS2,
    SphereProjection,
)
from ..time import Evolution
from ..time.controls import _Interpolated
from ..time.schemes import Scheme, Stage

__all__ = ["constraint_residual", "has_own_state", "kernel_matrix"]

_READING_RANK = {"projection": 2, "proximal map": 1, "neither": 0}


def has_own_state(scheme: Any) -> bool:
    """Whether ``scheme`` steps a state of its own (the reversible scheme's doubled (u, v)):
    its class overrides the declared initial map ``Scheme.lift`` (the identity)."""
    return isinstance(scheme, Scheme) and type(scheme).lift is not Scheme.lift


def _blended(op) -> tuple[nn.Module, dict[str, torch.Tensor]] | None:
    """(module, blended parameters) of an operator of linearly interpolated controls, or None
    for a plain operator."""
    if isinstance(op, _Interpolated):
        return op.module, op.params
    return None


@contextlib.contextmanager
def plain(op) -> Iterator[nn.Module]:
    """The operator as a module; an operator of linearly interpolated controls with its
    blended parameters in place."""
    blend = _blended(op)
    if blend is not None:
        from torch.nn.utils.stateless import _reparametrize_module

        with _reparametrize_module(blend[0], blend[1]):
            yield blend[0]
    else:
        yield op


def module_of(op) -> nn.Module:
    blend = _blended(op)
    return blend[0] if blend is not None else op


def kernel_matrix(op: AttentionOperator, u: torch.Tensor, context: Context | None = None
                  ) -> torch.Tensor:
    """g_h(x, x') of the attention operator ``op`` at the state u (B, N_x, N_y) it is applied
    to: (B, H, N_x, N_x'). Q, K from the operator's own maps, its support (mask, causal) and its
    kernel applied to the identity as values, kernel(Q, K, I) (every kernel is linear in V);
    no dropout."""
    return kernel_and_support(op, u, context)[0]


def kernel_and_support(op, u: torch.Tensor, context: Context | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, support): the kernel (B, H, N_x, N_x') and where the kernel at zero queries and keys
    is positive (bool, same shape): the support of g (mask, causal, and an operator's sliding
    ``window``). Q and K come from the operator's own ``qkv`` (rotary angles from the context's
    ``Context.rotary``, QK-norm); grouped key/value heads are read for the query heads they
    serve (``expand_heads``), as ``head_outputs`` reads them."""
    with plain(op) as m:
        q, k, _ = m.qkv(u, context)
        mask, causal = m.support(context)
        n_k = k.shape[-2]
        eye = torch.eye(n_k, dtype=q.dtype, device=q.device).expand(*k.shape[:-2], n_k, n_k)
        eye = eye.contiguous()
        # grouped heads (H_kv < H key/value heads) and a sliding window, as the operator's
        # own head_outputs reads them (operators.attention.GroupedQueryAttention)
        k, eye = expand_heads(m.kernel, q, k, eye)
        window = getattr(m, "window", None)
        if window is not None:
            mask, causal = window_support(mask, causal, q.shape[-2], n_k, None, window,
                                          q.dtype, q.device)
        g = m.kernel(q, k, eye, attn_mask=mask, is_causal=causal, dropout_p=0.0)
        g0 = m.kernel(torch.zeros_like(q), torch.zeros_like(k), eye, attn_mask=mask,
                      is_causal=causal, dropout_p=0.0)
        return g, g0 > 0


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
    op = module_of(op)
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
        with plain(op):
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


def is_s1(op) -> bool:
    return isinstance(module_of(op), (SphereProjection, LayerNormProjection))


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
    act = module_of(act)
    if isinstance(act, ProjectionS2) or (isinstance(act, Activation) and act.name == "relu"):
        return "relu", "projection", "ReLU is the projection onto S2 = {u >= 0}"
    if isinstance(act, Activation):
        if act.is_proximal:
            return act.name, "proximal map", f"{act.name}: {act.reading}"
        return act.name, "neither", f"{act.name}: {act.reading}"
    return type(act).__name__, "neither", f"{type(act).__name__} is not a known activation"


def activation_of(evolutions: list[Evolution]) -> dict[str, str]:
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


def compose(names: Sequence[str], u: torch.Tensor, theta, context) -> torch.Tensor:
    for n in names:
        u = theta[n](u, context)
    return u


def entered(st: Stage) -> tuple[list[Stage], list[Stage]]:
    """(the field stages of substep ``st`` that see the state entering it, those that do not):
    the substep itself if it is a field; for a parallel substep the first stage of each branch
    (recursively), and the later stages of the branches."""
    if st.kind == "field":
        return [st], []
    if st.kind != "parallel":
        return [], []
    seen, unseen = [], []
    for branch in st.branches:
        a, b = entered(branch[0])
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


def attentions(stages: list[Stage], theta) -> list[tuple[Stage, str, Any]]:
    """(stage, operator name, operator) of each attention field of ``stages``."""
    return [(st, n, theta[n]) for st in stages for n in st.fields()
            if isinstance(module_of(theta[n]), AttentionOperator)]


def ffn_readings(stages: list[Stage], theta, before: torch.Tensor, context
                  ) -> tuple[bool, float | None, float | None, set[str]]:
    """(whether a field of ``stages`` holds an FFN, relu_active, negative_preactivation, the
    activations without a constraint) of the FFNs of ``stages`` (fields that see
    ``before``)."""
    active = total = negative = 0
    counted = 0
    free: set[str] = set()
    found = False
    for st in stages:
        ffns = [theta[n] for n in st.fields() if isinstance(module_of(theta[n]), FeedForward)]
        if not ffns:
            continue
        found = True
        w = compose(st.pre, before, theta, context)
        for op in ffns:
            with plain(op) as m:
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


def clipped(stages: list[Stage], theta) -> bool:
    """Whether a field of ``stages`` is followed by a ReLU projection (``then``)."""
    return any(isinstance(module_of(theta[n]), ProjectionS2) or (
        isinstance(module_of(theta[n]), Activation) and module_of(theta[n]).name == "relu")
        for st in stages for n in st.then)


def ffn_readings_possible(st: Stage, theta) -> bool:
    return any(isinstance(module_of(theta[n]), FeedForward) for n in st.fields())
