"""Checks of the encoder-decoder family: torch.nn.Transformer / TransformerDecoder(Layer) against
the coupled pair of fields of ``splitformer.models.seq2seq`` (weight map
``splitformer.interop.torch_transformer``).

Each check builds small random-weight torch.nn modules (seeded; every parameter perturbed so
that norms and biases are non-trivial), converts them with ``from_torch`` and returns the max abs
difference of the outputs, with a causal target mask and padding masks on both sides.
"""

from __future__ import annotations

import torch
from torch import nn

from . import register
from .references import maxdiff, perturb_

D, H, FF, B, S, T = 32, 4, 48, 3, 9, 7


def _inputs(dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    src = torch.randn(B, S, D, generator=g, dtype=dtype)
    tgt = torch.randn(B, T, D, generator=g, dtype=dtype)
    src_kpm = torch.zeros(B, S, dtype=torch.bool)
    src_kpm[1, -3:] = True
    tgt_kpm = torch.zeros(B, T, dtype=torch.bool)
    tgt_kpm[2, -2:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=dtype)
    return src, tgt, src_kpm, tgt_kpm, causal


def _transformer(dtype: torch.dtype, **kw) -> nn.Transformer:
    torch.manual_seed(0)
    return perturb_(nn.Transformer(D, H, 2, 3, FF, dropout=0.0, batch_first=True, dtype=dtype,
                                   **kw)).eval()


@register("transformer", "encoder field -> memory -> decoder field (post-LN Lie, 3 fields)",
          "nn.Transformer (causal tgt_mask, padding masks)")
def check_pair_post_ln(dtype: torch.dtype) -> float:
    from ..interop.torch_nn import from_torch

    ref = _transformer(dtype)
    src, tgt, skpm, tkpm, causal = _inputs(dtype)
    kw = {"tgt_mask": causal, "src_key_padding_mask": skpm, "tgt_key_padding_mask": tkpm,
          "memory_key_padding_mask": skpm}
    with torch.no_grad():
        return maxdiff(ref(src, tgt, **kw), from_torch(ref)(src, tgt, **kw))


@register("transformer", "the pair with projections inside the fields (pre-LN), GELU",
          "nn.Transformer(norm_first=True, activation='gelu')")
def check_pair_pre_ln(dtype: torch.dtype) -> float:
    from ..interop.torch_nn import from_torch

    ref = _transformer(dtype, norm_first=True, activation="gelu")
    src, tgt, skpm, tkpm, causal = _inputs(dtype)
    kw = {"tgt_mask": causal, "src_key_padding_mask": skpm, "memory_key_padding_mask": skpm}
    with torch.no_grad():
        return maxdiff(ref(src, tgt, **kw), from_torch(ref)(src, tgt, **kw))


@register("transformer", "decoder field with a fixed memory M (cross-attention kernel)",
          "nn.TransformerDecoder, 3 layers + norm, memory_mask")
def check_decoder(dtype: torch.dtype) -> float:
    from ..interop.torch_nn import from_torch

    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, dtype=dtype)
    ref = perturb_(nn.TransformerDecoder(layer, 3, norm=nn.LayerNorm(D, dtype=dtype))).eval()
    src, tgt, skpm, tkpm, causal = _inputs(dtype)
    g = torch.Generator().manual_seed(3)
    memory_mask = torch.rand(T, S, generator=g) < 0.3
    memory_mask[:, 0] = False  # every query keeps a key
    kw = {"tgt_mask": causal, "memory_mask": memory_mask, "tgt_key_padding_mask": tkpm}
    with torch.no_grad():
        return maxdiff(ref(tgt, src, **kw), from_torch(ref)(tgt, src, **kw))


@register("transformer", "one decoder step (tau = 1), sequence-first layout",
          "nn.TransformerDecoderLayer(batch_first=False)")
def check_layer(dtype: torch.dtype) -> float:
    from ..interop.torch_nn import from_torch

    torch.manual_seed(0)
    ref = perturb_(nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, dtype=dtype)).eval()
    src, tgt, skpm, _, causal = _inputs(dtype)
    src, tgt = src.transpose(0, 1), tgt.transpose(0, 1)
    kw = {"tgt_mask": causal, "memory_key_padding_mask": skpm, "tgt_is_causal": True}
    with torch.no_grad():
        return maxdiff(ref(tgt, src, **kw), from_torch(ref)(tgt, src, **kw))
