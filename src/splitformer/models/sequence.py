"""A sequence classifier: an encoder evolution on a series, read out by pooling.

The series s(x, c) (x = 0..N-1 time points, c = 1..C channels) is lifted to the feature grid by
a feature integral and a learned position term,

    u(x, y, 0) = f(x, y) = sum_c W(y, c) s(x, c) + b(y) + e(x, y),

evolves by the encoder's scheme (pre-LN by default: u_t = A(P1 u) + G(P2 u), docs/math.md 3.2),
and is read out as

    logits = W_C P_f( mean_x u(x, ., T) ) + b_C      (P_f: a final LayerNorm).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..operators import Context, FeatureIntegral, LayerNormProjection
from ..time import Evolution
from ..time.schemes import lie, prenorm
from .base import EvolutionModel
from .encoder import encoder_controls

__all__ = ["SeriesEmbedding", "SequenceClassifier", "sequence_classifier"]


class SeriesEmbedding(nn.Module):
    """f(x, .) = W s(x, .) + b + e(x, .): a feature integral over the channels plus positions."""

    def __init__(self, length: int, channels: int, dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.length, self.channels = length, channels
        self.lift = FeatureIntegral(channels, dim, device=device, dtype=dtype)
        self.position = nn.Parameter(torch.zeros(1, length, dim, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.position, std=0.02)

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        if not isinstance(series, torch.Tensor) or series.dim() not in (2, 3):
            raise ValueError("series must be a tensor of shape (batch, length) or (batch, "
                             f"length, channels), got {getattr(series, 'shape', series)!r}")
        s = series.unsqueeze(-1) if series.dim() == 2 else series
        if s.shape[1:] != (self.length, self.channels):
            raise ValueError(f"series must have length {self.length} and {self.channels} "
                             f"channel(s), got shape {tuple(series.shape)}")
        if s.dtype != self.position.dtype:
            raise TypeError(f"series has dtype {s.dtype} but the model's parameters are "
                            f"{self.position.dtype}")
        return self.lift(s) + self.position


class SequenceClassifier(EvolutionModel):
    """forward(series) -> logits (B, num_classes): embedding, evolution, pooled read-out."""

    def __init__(self, embedding: SeriesEmbedding, evolution: Evolution, *,
                 final_norm: nn.Module, head: nn.Module, source: Any = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.evolution = evolution
        self.final_norm = final_norm
        self.head = head
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)

    def initial_condition(self, series: torch.Tensor) -> tuple[torch.Tensor, Context]:
        return self.embedding(series), Context()

    def read_out(self, u: torch.Tensor, context: Context) -> torch.Tensor:
        return self.head(self.final_norm(u.mean(dim=1)))

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        return self.solve(series)


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
