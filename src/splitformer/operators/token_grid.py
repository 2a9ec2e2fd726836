"""The token grid: a quadrature rule in x (docs/math.md 3.12).

The state u(x, y, t) is sampled at nodes x_j of Omega_x, and every integral in x is a
quadrature with weights w_j > 0 at those nodes:

    int g(x, x') V(x') dx'  ~  sum_j w_j g(x, x_j) V(x_j)

so the softmax kernel on the grid is

    A[u](x_i) = sum_j w_j exp(a_ij) V_j / sum_j w_j exp(a_ij) = sum_j softmax_j(a_ij + log w_j) V_j

A uniform grid has constant weights, which cancel: today's network (``weights=None``). The FFN
and the projections are local in x and never see the weights; a mean-pooling read-out is the
quadrature mean sum_j w_j u_j / sum_j w_j; padding is a node of weight 0. Kernels of x - x'
(ALiBi, rotary) and causal supports x' <= x read the coordinates x_j (``coords``; None = the
index 0 .. N-1), so two nodes at one coordinate see each other.

The consistency property every grid-aware kernel has (tests/test_token_grid.py): splitting node
j into two nodes at x_j with weight w_j / 2 each (``split_node``) leaves every other node's
output unchanged, exactly.

``TokenGrid`` is the pair (weights, coords) of one field; ``KernelGrid`` is what one kernel call
sees: the key weights, the query and the key coordinates (self-attention: one grid; cross-
attention: the queries on the target grid, the keys on the memory's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["KernelGrid", "TokenGrid", "check_grid_tensor", "split_node", "weighted_mean"]


def check_grid_tensor(t: Any, name: str, *, weights: bool,
                      dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """A token weight or coordinate tensor, checked (None passes): a real torch.Tensor of
    shape (N,) or (B, N), finite; weights also >= 0 with a positive sum per row (a weight-0
    node is padding). An integer tensor (``torch.arange(N)``, counts) is accepted and returned
    cast to ``dtype`` (the state's floating dtype; default ``torch.get_default_dtype()``); a
    floating tensor is returned as it is; bool and complex tensors are refused. On the meta
    device (no values) only the dtype and the shape are checked. TypeError / ValueError
    naming ``name``."""
    if t is None:
        return None
    what = ("quadrature weights w_j >= 0 (0 = padding), shape (N,) or (B, N)" if weights
            else "node coordinates x_j, shape (N,) or (B, N)")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be None or a torch.Tensor of {what}, got "
                        f"{type(t).__name__}")
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must be a real (floating-point or integer) tensor of {what}, "
                        f"got dtype {t.dtype}")
    if not t.is_floating_point():  # an integer grid: x_j = 0 .. N-1, or counts as weights
        t = t.to(dtype if dtype is not None and dtype.is_floating_point
                 else torch.get_default_dtype())
    if t.dim() not in (1, 2) or t.shape[-1] == 0:
        raise ValueError(f"{name} must have shape (N,) or (B, N) with N >= 1 ({what}), got "
                         f"shape {tuple(t.shape)}")
    if t.is_meta:  # shapes only: a meta tensor has no values to check
        return t
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite ({what}); it holds NaN or inf")
    if weights:
        if bool((t < 0).any()):
            raise ValueError(f"{name} must be >= 0 ({what}); it holds a negative weight")
        if bool((t.sum(-1) <= 0).any()):
            raise ValueError(f"{name}: every row must have a positive weight (a grid of "
                             "padding only has no quadrature)")
    return t


def _check_length(t: torch.Tensor | None, n: int, batch: int, name: str) -> None:
    if t is None:
        return
    if t.shape[-1] != n or (t.dim() == 2 and t.shape[0] not in (1, batch)):
        raise ValueError(f"{name} has shape {tuple(t.shape)} but the field has {n} nodes "
                         f"(batch {batch}): expected ({n},) or ({batch}, {n})")


@dataclass(frozen=True)
class TokenGrid:
    """The quadrature rule of one field in x: ``weights`` w_j (None = uniform) and ``coords``
    x_j (None = 0 .. N-1), each of shape (N,) or (B, N)."""

    weights: torch.Tensor | None = None
    coords: torch.Tensor | None = None

    @property
    def is_default(self) -> bool:
        """Uniform weights and index coordinates: the network's own grid."""
        return self.weights is None and self.coords is None

    def check(self, n: int, batch: int, owner: str = "token grid",
              names: tuple[str, str] = ("token_weights", "token_coords")) -> None:
        """ValueError unless the weights and coordinates have N = ``n`` nodes (shape (N,) or
        (B, N), a leading 1 broadcasting); ``names``: how the caller calls the two."""
        _check_length(self.weights, n, batch, f"{owner}: {names[0]}")
        _check_length(self.coords, n, batch, f"{owner}: {names[1]}")

    def coordinates(self, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """x_j as a (1, N) or (B, N) tensor: ``coords``, or the index 0 .. N-1."""
        if self.coords is None:
            return torch.arange(n, dtype=dtype, device=device).unsqueeze(0)
        c = self.coords.to(dtype=dtype, device=device)
        return c if c.dim() == 2 else c.unsqueeze(0)


@dataclass(frozen=True)
class KernelGrid:
    """The quadrature one kernel call integrates against: the key nodes' weights
    ``key_weights`` (None = uniform), the query nodes' ``query_weights`` (read only by kernels
    that integrate over the queries too: Sinkhorn's column sums), the query and key coordinates
    (None = the index; the queries bottom-right aligned with the keys, query i at key position
    i + N_k - N_q, as the causal support of ``operators.kernels`` reads it)."""

    key_weights: torch.Tensor | None = None
    query_weights: torch.Tensor | None = None
    query_coords: torch.Tensor | None = None
    key_coords: torch.Tensor | None = None

    @property
    def has_coords(self) -> bool:
        return self.query_coords is not None or self.key_coords is not None

    def log_weights(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """log w_j as an additive score term, (B or 1, 1, 1, N_k) (log 0 = -inf: padding), or
        None for uniform weights."""
        if self.key_weights is None:
            return None
        return _scaled(self.key_weights, device).log().to(dtype)[:, None, None, :]

    def log_query_weights(self, dtype: torch.dtype, device: torch.device
                          ) -> torch.Tensor | None:
        """log w_i of the queries as (B or 1, 1, N_q, 1), or None for uniform weights."""
        if self.query_weights is None:
            return None
        return _scaled(self.query_weights, device).log().to(dtype)[:, None, :, None]

    def weights(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """w_j as (B or 1, 1, 1, N_k), or None for uniform weights."""
        if self.key_weights is None:
            return None
        return _scaled(self.key_weights, device).to(dtype)[:, None, None, :]

    def positions(self, n_q: int, n_k: int, dtype: torch.dtype, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x_q, x_k) as (B or 1, N_q) and (B or 1, N_k): the coordinates, or the index with
        the queries bottom-right aligned (query i at i + N_k - N_q)."""
        xq = (torch.arange(n_q, dtype=dtype, device=device) + (n_k - n_q)).unsqueeze(0) \
            if self.query_coords is None else _rows(self.query_coords, dtype, device)
        xk = torch.arange(n_k, dtype=dtype, device=device).unsqueeze(0) \
            if self.key_coords is None else _rows(self.key_coords, dtype, device)
        return xq, xk

    def offsets(self, n_q: int, n_k: int, dtype: torch.dtype, device: torch.device
                ) -> torch.Tensor:
        """x_q - x_k as (B or 1, 1, N_q, N_k) (a head axis to broadcast over)."""
        xq, xk = self.positions(n_q, n_k, dtype, device)
        return (xq[:, :, None] - xk[:, None, :]).unsqueeze(1)

    def causal(self, n_q: int, n_k: int, device: torch.device) -> torch.Tensor:
        """The causal support x_k <= x_q as a boolean (B or 1, 1, N_q, N_k) tensor (True = in
        the support); two nodes at one coordinate see each other."""
        xq, xk = self.positions(n_q, n_k, torch.float64, device)
        return (xk[:, None, :] <= xq[:, :, None]).unsqueeze(1)


def _scaled(w: torch.Tensor, device: torch.device) -> torch.Tensor:
    """w / max_j w_j per row, (B or 1, N), in float64: every kernel is invariant under w -> c w
    (the weights are a rule up to scale), and scaling by the row's largest weight before the
    cast to the operator's dtype keeps tiny or huge weights from underflowing (float16) or from
    meeting a kernel's floor (the linear kernel's eps)."""
    w = w.to(device=device, dtype=torch.float64)
    w = w if w.dim() == 2 else w.unsqueeze(0)
    return w / w.amax(-1, keepdim=True)


def _rows(t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = t.to(dtype=dtype, device=device)
    return t if t.dim() == 2 else t.unsqueeze(0)


def weighted_mean(u: torch.Tensor, weights: torch.Tensor | None,
                  keep: torch.Tensor | None = None) -> torch.Tensor:
    """The quadrature mean over x of u (B, N, D): sum_j w_j u_j / sum_j w_j, with ``weights``
    (N,) or (B, N) (None = uniform) times an optional 0/1 ``keep`` (B, N) (e.g. an attention
    mask over padding). With neither it is ``u.mean(1)``, bit for bit."""
    if weights is None and keep is None:
        return u.mean(1)
    w = torch.ones(u.shape[:2], dtype=u.dtype, device=u.device) if weights is None else \
        torch.broadcast_to(_scaled(weights, u.device).to(u.dtype), u.shape[:2])
    if keep is not None:
        w = w * keep.to(dtype=u.dtype, device=u.device)
    return (u * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True)


def _split_tensor(t: torch.Tensor, n: int, j: int, axes: tuple[int, ...]) -> torch.Tensor:
    """``t`` with index j repeated (j, j) along every axis in ``axes`` whose size is n."""
    for ax in axes:
        if t.dim() >= -ax and t.shape[ax] == n:
            idx = torch.cat([torch.arange(j + 1), torch.tensor([j]), torch.arange(j + 1, n)])
            t = t.index_select(ax, idx.to(t.device))
    return t


def split_node(u: torch.Tensor, weights: torch.Tensor | None, coords: torch.Tensor | None,
               j: int, attn_mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Node j of the grid split into two copies at x_j with weight w_j / 2 each (the copies
    sit at j and j + 1): (u, weights, coords, attn_mask) on N + 1 nodes. u is (B, N, D); the
    mask's last two axes (queries, keys) are split where they have size N. The refinement
    under which every grid-aware kernel leaves every other node unchanged (docs/math.md 3.12).
    """
    n = u.shape[1]
    if not (isinstance(j, int) and 0 <= j < n):
        raise ValueError(f"split_node: j must be a node index in [0, {n}), got {j!r}")
    w = torch.ones(n, dtype=u.dtype, device=u.device) if weights is None else \
        check_grid_tensor(weights, "split_node: weights", weights=True, dtype=u.dtype)
    c = torch.arange(n, dtype=u.dtype, device=u.device) if coords is None else \
        check_grid_tensor(coords, "split_node: coords", weights=False, dtype=u.dtype)
    w = _split_tensor(w, n, j, (-1,)).clone()
    w[..., j] = w[..., j] / 2
    w[..., j + 1] = w[..., j + 1] / 2
    c = _split_tensor(c, n, j, (-1,))
    m = None if attn_mask is None else _split_tensor(attn_mask, n, j, (-1, -2))
    return _split_tensor(u, n, j, (1,)), w, c, m
