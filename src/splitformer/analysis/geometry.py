"""The geometry of a state u (B, N_x, N_y): its tokens as points of R^{N_y}.

Functions of tensors only (no model, no scheme), so that any analysis along a trajectory (the
per-step diagnostics of ``analysis.diagnostics``, a study of rank collapse or clustering) reads
the same numbers:

    cosine_similarity  1/(N (N-1)) sum_{x != x'} <u(x), u(x')> / (|u(x)| |u(x')|)
    effective_rank     exp(H(p)), p_i = s_i / sum_j s_j, s the singular values of u (Roy &
                       Vetterli 2007)
    attention_entropy  -sum_x' g(x, x') log g(x, x') of a kernel g
    first_token_mass   mean over the queries x >= 1 of g(x, 0): the mass a kernel puts on the
                       first token (the attention sink of trained decoders, docs/math.md 3.19)
    frob               ||u_b||_F per input b, in float64
    difference         after - before, a width-changing pair compared with zero padding
    block_influence    1 - mean_x cos(u_n(x), u_{n+1}(x)) per step (ShortGPT's BI)
    angular_distance   mean_x arccos(cos(u_a(x), u_b(x))) / pi (Gromov et al.)
"""

from __future__ import annotations

import torch
from torch import nn

from .checks import ArgumentError

__all__ = ["angular_distance", "attention_entropy", "block_influence", "cosine_similarity",
           "difference", "effective_rank", "first_token_mass", "frob"]


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


def first_token_mass(g: torch.Tensor) -> torch.Tensor:
    """The mass g(x, 0) a kernel puts on the first key token, averaged over the query tokens
    x >= 1: (..., N_q, N_k) -> (...), float64. Query 0 is left out: under a causal support it
    sees only key 0 (mass 1 whatever the weights). A kernel uniform over a causal support gives
    mean_{x >= 1} 1 / (x + 1); a point mass at the first token (an attention sink) gives 1. NaN
    with a single query."""
    if not isinstance(g, torch.Tensor) or g.dim() < 2:
        raise ArgumentError("g", f"expected a tensor (..., N_q, N_k), got {type(g).__name__}")
    g = g.double()
    if g.shape[-2] < 2:
        return torch.full(g.shape[:-2], float("nan"), dtype=torch.float64, device=g.device)
    return g[..., 1:, 0].mean(-1)


def frob(t: torch.Tensor) -> torch.Tensor:
    """||.||_F over tokens x features, per input: (B, N, D) -> (B,) in float64."""
    return t.detach().double().flatten(1).norm(dim=1)


def difference(after: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    if after.shape != before.shape:  # a width-changing substep: compare with zero padding
        d = max(after.shape[-1], before.shape[-1])
        after = nn.functional.pad(after, (0, d - after.shape[-1]))
        before = nn.functional.pad(before, (0, d - before.shape[-1]))
    return after - before


def _token_cosines(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """cos(a(x), b(x)) of every token, float64, (B, N); ``mask`` (B, N) True/1 where a token
    counts."""
    a, b = _batched(a, "a").double(), _batched(b, "b").double()
    if a.shape != b.shape:
        raise ArgumentError("b", f"expected the shape of a {tuple(a.shape)}, got "
                                 f"{tuple(b.shape)}")
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return values.mean()
    m = mask.to(values.dtype).reshape(values.shape)
    return (values * m).sum() / m.sum()


def block_influence(states, mask: torch.Tensor | None = None) -> torch.Tensor:
    """ShortGPT's block influence of each step (Men et al. 2024): BI_n = 1 - mean over the
    tokens (and inputs) of cos(u_n(x), u_{n+1}(x)), for the states u_0 .. u_N along a path
    (a sequence of (B, N_x, N_y) tensors, e.g. ``Trajectory.state_list``): (N,) float64. A step
    that barely turns the tokens has a small BI (ShortGPT drops those first). ``mask``
    (B, N_x): the tokens that count (the attention mask)."""
    states = list(states)
    if len(states) < 2:
        raise ArgumentError("states", f"expected at least two states (u_0, u_1, ...), got "
                                      f"{len(states)}")
    return torch.stack([1 - _masked_mean(_token_cosines(a, b, mask), mask)
                        for a, b in zip(states[:-1], states[1:], strict=True)])


def angular_distance(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """Gromov et al.'s angular distance of two states: mean over the tokens of
    arccos(cos(a(x), b(x))) / pi, in [0, 1], float64 scalar."""
    c = _token_cosines(a, b, mask).clamp(-1.0, 1.0)
    return _masked_mean(torch.arccos(c) / torch.pi, mask)
