"""nn.Transformer <-> splitformer EncoderDecoderModel: the coupled pair of the two weight maps.

nn.Transformer is the encoder field (the map of ``interop.torch_encoder`` for its
nn.TransformerEncoder, final norm included) whose final state is the memory M, and the decoder
field (the map of ``interop.torch_decoder``), in whose cross-attention kernel M enters. Names of
the whole model: ``encoder.layers.n.*`` -> ``encoder.evolution.controls.sets.n.*``,
``decoder.layers.n.*`` -> ``decoder.evolution.controls.sets.n.*``, ``encoder.norm`` ->
``encoder.final_norm``, ``decoder.norm`` -> ``decoder.final_norm``. Both maps are check ->
config (``TorchTransformerConfig``: one ``TorchConfig`` per half, kept as the pair's
``source``) -> build -> copy.

This module composes the two maps (it imports both; they never import each other or this one).
``from_torch_transformer`` / ``to_torch_transformer`` / ``weight_map`` also take a decoder alone
(they did before the front, ``interop.torch_nn``, existed); the decoder names are kept
importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..models.base import Source
from ..models.seq2seq import CrossDecoder, EncoderDecoderModel
from .torch_decoder import (
    DECODER_LAYER_MAP,
    build_decoder,
    build_torch_decoder,
    decoder_config,
    decoder_rows,
    decoder_target,
    from_torch_decoder,
    to_torch_decoder,
)
from .torch_encoder import (
    ENCODER_LAYER_MAP,
    build_encoder,
    build_torch,
    torch_config,
    torch_target,
)
from .torch_encoder import weight_map as encoder_rows
from .torch_layers import TorchConfig, check_plain
from .weights import Row, copy_table, prefixed

__all__ = ["DECODER_LAYER_MAP", "ENCODER_LAYER_MAP", "TorchTransformerConfig", "build_decoder",
           "decoder_config", "from_torch_transformer", "pair_rows", "to_torch_transformer",
           "transformer_config", "weight_map"]


@dataclass(frozen=True, kw_only=True)
class TorchTransformerConfig(Source):
    """An nn.Transformer as splitformer reads it: the configs of its two halves and the
    arguments of nn.Transformer itself."""

    kind: str = "transformer"
    d_model: int
    nhead: int
    batch_first: bool
    encoder: TorchConfig
    decoder: TorchConfig


def pair_rows(encoder: TorchConfig, decoder: TorchConfig) -> list[Row]:
    """The rows of the pair: the encoder's under ``encoder.``, the decoder's under ``decoder.``."""
    return (prefixed(encoder_rows(encoder, ENCODER_LAYER_MAP), "encoder.", "encoder.")
            + prefixed(decoder_rows(decoder), "decoder.", "decoder."))


def transformer_config(module: nn.Transformer) -> TorchTransformerConfig:
    """Check an nn.Transformer and read the configs of its halves."""
    enc, dec = module.encoder, module.decoder
    if not isinstance(enc, nn.TransformerEncoder):
        raise TypeError(f"custom_encoder of type {type(enc).__name__} is not supported "
                        "(an nn.TransformerEncoder is)")
    if not isinstance(dec, nn.TransformerDecoder):
        raise TypeError(f"custom_decoder of type {type(dec).__name__} is not supported "
                        "(an nn.TransformerDecoder is)")
    check_plain(module)
    encoder, decoder = torch_config(enc), decoder_config(dec)
    if encoder.batch_first != decoder.batch_first:
        raise ValueError("the encoder and decoder layers must share batch_first")
    return TorchTransformerConfig(d_model=int(module.d_model), nhead=int(module.nhead),
                                  batch_first=bool(module.batch_first), encoder=encoder,
                                  decoder=decoder)


def from_torch_transformer(module: nn.Module) -> CrossDecoder | EncoderDecoderModel:
    """nn.Transformer -> EncoderDecoderModel (nn.TransformerDecoder(Layer) -> CrossDecoder).

    The forward of the result takes the arguments of the source's forward and returns the same
    tensor. Post-LN and pre-LN (norm_first), relu / gelu / tanh-gelu, batch_first either way,
    bias on or off, final norms present or not are all mapped exactly.
    """
    if isinstance(module, (nn.TransformerDecoder, nn.TransformerDecoderLayer)):
        return from_torch_decoder(module)
    if not isinstance(module, nn.Transformer):
        raise TypeError("from_torch_transformer expects nn.Transformer, nn.TransformerDecoder "
                        f"or nn.TransformerDecoderLayer, got {type(module).__name__}")
    config = transformer_config(module)
    p = next(module.parameters())
    kw = {"device": p.device, "dtype": p.dtype}
    model = EncoderDecoderModel(build_encoder(config.encoder, **kw),
                                build_decoder(config.decoder, **kw), source=config)
    copy_table(pair_rows(config.encoder, config.decoder), theirs=module, ours=model, into="ours")
    model.train(module.training)
    return model


def weight_map(model: CrossDecoder | EncoderDecoderModel) -> list[Row]:
    """Every row of a converted pair or decoder (the tensor rows only where the model has the
    weight, biases included or not): the table both directions copy."""
    if isinstance(model, EncoderDecoderModel):
        rows = pair_rows(torch_target(model.encoder), decoder_target(model.decoder))
    else:
        rows = decoder_rows(decoder_target(model))
    params = dict(model.named_parameters())
    return [r for r in rows if r.attr or r.ours in params]


def to_torch_transformer(model: CrossDecoder | EncoderDecoderModel) -> nn.Module:
    """The torch.nn module with the same weights: the inverse of ``from_torch_transformer``."""
    if isinstance(model, CrossDecoder):
        return to_torch_decoder(model)
    if not isinstance(model, EncoderDecoderModel):
        raise TypeError(f"to_torch_transformer(model) expects a splitformer CrossDecoder or "
                        f"EncoderDecoderModel (an Encoder goes through to_torch), got "
                        f"{type(model).__name__}")
    enc_config = torch_target(model.encoder)
    if enc_config.kind != "encoder":  # pragma: no cover - a pair's encoder has kind encoder
        raise ValueError("the encoder of a pair must be an nn.TransformerEncoder")
    dec_config = decoder_target(model.decoder)
    a = model.evolution.controls[0]["attention"]
    kw = {"device": a.qkv_weight.device, "dtype": a.qkv_weight.dtype}
    out = nn.Transformer(a.dim, a.num_heads, custom_encoder=nn.Identity(),
                         custom_decoder=nn.Identity(), batch_first=model.batch_first, **kw)
    out.encoder = build_torch(enc_config, **kw)
    out.decoder = build_torch_decoder(dec_config, **kw)
    copy_table(pair_rows(enc_config, dec_config), theirs=out, ours=model, into="theirs")
    out.train(model.training)
    return out
