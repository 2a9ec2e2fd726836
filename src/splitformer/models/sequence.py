"""A sequence classifier: an encoder evolution on a series, read out by pooling.

The series s(x, c) (x = 0..N-1 time points, c = 1..C channels) is lifted to the feature grid by
a feature integral and a learned position term,

    u(x, y, 0) = f(x, y) = sum_c W(y, c) s(x, c) + b(y) + e(x, y),

evolves by the encoder's scheme (pre-LN by default: u_t = A(P1 u) + G(P2 u), docs/math.md 3.2),
and is read out as

    logits = W_C P_f( mean_x u(x, ., T) ) + b_C      (P_f: a final LayerNorm).

On a token grid (docs/math.md 3.12; ``forward(series, token_weights=..., token_coords=...)``,
each (N,) or (B, N), None = uniform / the index 0 .. N-1) the kernels integrate against the
weights w_j, the mean is the quadrature mean sum_j w_j u_j / sum_j w_j
(``operators.token_grid.weighted_mean``; a weight-0 node is padding) and the position term is
e(x_j), the learned table read as samples of e(x) (a gather at integer x_j, linear
interpolation between rows; ``embeddings.sample_positions``). With coordinates the series may
have any number of points N (each at its x_j in [0, length - 1]); without, it has ``length``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..operators import Context, FeatureIntegral, LayerNormProjection
from ..operators.token_grid import check_grid_tensor, weighted_mean
from ..time import Evolution
from ..time.schemes import lie, prenorm
from .base import EvolutionModel
from .embeddings import sample_positions
from .encoder import encoder_controls
from .masks import with_token_grid

__all__ = ["SeriesEmbedding", "SequenceClassifier", "sequence_classifier"]


class SeriesEmbedding(nn.Module):
    """f(x, .) = W s(x, .) + b + e(x, .): a feature integral over the channels plus positions
    (e(x_j) at ``token_coords`` x_j: ``sample_positions``; then any number of points)."""

    def __init__(self, length: int, channels: int, dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.length, self.channels = length, channels
        self.lift = FeatureIntegral(channels, dim, device=device, dtype=dtype)
        self.position = nn.Parameter(torch.zeros(1, length, dim, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.position, std=0.02)

    def forward(self, series: torch.Tensor, *, token_coords: torch.Tensor | None = None
                ) -> torch.Tensor:
        if not isinstance(series, torch.Tensor) or series.dim() not in (2, 3):
            raise ValueError("series must be a tensor of shape (batch, length) or (batch, "
                             f"length, channels), got {getattr(series, 'shape', series)!r}")
        token_coords = check_grid_tensor(token_coords, "token_coords", weights=False,
                                         dtype=self.position.dtype)
        s = series.unsqueeze(-1) if series.dim() == 2 else series
        n = self.length if token_coords is None else s.shape[1]
        if s.shape[1:] != (n, self.channels):
            raise ValueError(f"series must have length {self.length} (any length with "
                             f"token_coords) and {self.channels} channel(s), got shape "
                             f"{tuple(series.shape)}")
        if s.dtype != self.position.dtype:
            raise TypeError(f"series has dtype {s.dtype} but the model's parameters are "
                            f"{self.position.dtype}")
        if token_coords is None:
            return self.lift(s) + self.position
        b = s.shape[0]
        if token_coords.shape[-1] != n or (token_coords.dim() == 2
                                           and token_coords.shape[0] not in (1, b)):
            raise ValueError(f"token_coords has shape {tuple(token_coords.shape)} but the "
                             f"series has {n} points (batch {b}): expected ({n},) or ({b}, "
                             f"{n})")
        return self.lift(s) + sample_positions(self.position[0], token_coords)


class SequenceClassifier(EvolutionModel):
    """forward(series, *, token_weights, token_coords) -> logits (B, num_classes): embedding,
    evolution, pooled read-out (the quadrature mean on a token grid: module docstring)."""

    def __init__(self, embedding: SeriesEmbedding, evolution: Evolution, *,
                 final_norm: nn.Module, head: nn.Module, source: Any = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.evolution = evolution
        self.final_norm = final_norm
        self.head = head
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)

    def initial_condition(self, series: torch.Tensor, *,
                          token_weights: torch.Tensor | None = None,
                          token_coords: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, Context]:
        """u(0) = f (positions e(x_j) with ``token_coords``) and the token grid (checked)."""
        u0 = self.embedding(series, token_coords=token_coords)
        b, n, _ = u0.shape
        return u0, with_token_grid(Context(), token_weights, token_coords, batch=b, seq=n,
                                   owner=type(self).__name__, dtype=u0.dtype)

    def read_out(self, u: torch.Tensor, context: Context) -> torch.Tensor:
        """logits = W_C P_f(sum_j w_j u_j / sum_j w_j) + b_C (the plain mean on the uniform
        grid, bit for bit)."""
        return self.head(self.final_norm(weighted_mean(u, context.token_weights)))

    def forward(self, series: torch.Tensor, *, token_weights: torch.Tensor | None = None,
                token_coords: torch.Tensor | None = None) -> torch.Tensor:
        return self.solve(series, token_weights=token_weights, token_coords=token_coords)


def sequence_classifier(length: int, channels: int, dim: int, heads: int, depth: int,
                        hidden: int, num_classes: int, *, norm_first: bool = True,
                        dropout: float = 0.0, source: Any = None, device=None,
                        dtype=None) -> SequenceClassifier:
    """Random weights; T = depth, tau = 1 (pre-LN Euler steps, or the post-LN Lie scheme)."""
    kw = {"device": device, "dtype": dtype}
    controls = encoder_controls(dim, heads, hidden, depth, activation="gelu", dropout=dropout,
                                **kw)
    evolution = Evolution(controls, prenorm() if norm_first else lie())
    return SequenceClassifier(SeriesEmbedding(length, channels, dim, **kw), evolution,
                              final_norm=LayerNormProjection(dim, **kw),
                              head=FeatureIntegral(dim, num_classes, **kw), source=source)
