"""torch.nn encoder-decoder <-> splitformer: a pure weight map (no torch.nn module is called).

nn.TransformerDecoderLayer is one step of the decoder scheme on the three-field layout
(attention, norm1), (cross_attention, norm2), (ffn, norm3) (``splitformer.models.seq2seq``):

    norm_first=False (post-LN):  u <- P1(u + A u);  u <- P2(u + C(u; M));  u <- P3(u + G u)
    norm_first=True  (pre-LN):   u <- u + A(P1 u);  u <- u + C(P2 u; M);   u <- u + G(P3 u)

nn.TransformerDecoder with L layers is T = L, tau = 1, its ``norm`` the read-out.
nn.Transformer is the coupled pair: the encoder field (the map of ``interop.torch_nn`` for its
nn.TransformerEncoder, final norm included) gives the memory M, which enters the decoder's
cross-attention kernel. Weight map, decoder layer n -> theta^n of the decoder evolution
(``DECODER_LAYER_MAP``; the encoder's is ``ENCODER_LAYER_MAP``):

    self_attn.in_proj_weight/bias        -> attention.qkv_weight/qkv_bias         (W_Q, W_K, W_V)
    self_attn.out_proj.weight/bias       -> attention.out_weight/out_bias         (W_O)
    multihead_attn.in_proj_weight/bias   -> cross_attention.qkv_weight/qkv_bias   (W_Q on u,
                                                                               W_K, W_V on M)
    multihead_attn.out_proj.weight/bias  -> cross_attention.out_weight/out_bias
    linear1 / linear2                    -> ffn.stages.0 / ffn.stages.1
    norm1 / norm2 / norm3                -> norm1 / norm2 / norm3
    (decoder) norm                       -> final_norm

plus the attribute rows (the six dropout rates, the three eps). Names of the whole model:
``decoder.layers.n.*`` -> ``decoder.evolution.controls.sets.n.*``, ``encoder.layers.n.*`` ->
``encoder.evolution.controls.sets.n.*``, ``decoder.norm`` -> ``decoder.final_norm``,
``encoder.norm`` -> ``encoder.final_norm``. Both maps are check -> config (``TorchConfig`` per
half, ``TorchTransformerConfig`` for the pair, kept as the models' ``source``) -> build -> copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..models.seq2seq import (
    CrossDecoder,
    EncoderDecoderModel,
    decoder_controls,
    decoder_lie,
    decoder_prenorm,
)
from ..time import Evolution, TimeGrid
from .torch_nn import (
    ATTENTION_ROWS,
    ENCODER_LAYER_MAP,
    TorchConfig,
    build_encoder,
    build_torch,
    build_torch_stack,
    check_attention,
    check_dropouts,
    check_final_norm,
    check_norms,
    check_plain,
    check_two_stages,
    final_norm,
    layer_fields,
    shared_fields,
    torch_activation,
    torch_config,
    torch_target,
)
from .torch_nn import weight_map as module_rows
from .weights import Row, check_softmax, copy_table, network_scheme, prefixed, source_field

__all__ = ["DECODER_LAYER_MAP", "ENCODER_LAYER_MAP", "TorchTransformerConfig", "build_decoder",
           "decoder_config", "from_torch_transformer", "to_torch_transformer",
           "transformer_config", "weight_map"]

DECODER_LAYER_MAP: tuple[Row, ...] = (
    *ATTENTION_ROWS,
    Row("multihead_attn.in_proj_weight", "cross_attention.qkv_weight"),
    Row("multihead_attn.in_proj_bias", "cross_attention.qkv_bias"),
    Row("multihead_attn.out_proj.weight", "cross_attention.out_weight"),
    Row("multihead_attn.out_proj.bias", "cross_attention.out_bias"),
    Row("multihead_attn.dropout", "cross_attention.attn_dropout", attr=True),
    Row("dropout2.p", "cross_attention.out_dropout.p", attr=True),
    Row("linear1.weight", "ffn.stages.0.weight"),
    Row("linear1.bias", "ffn.stages.0.bias"),
    Row("linear2.weight", "ffn.stages.1.weight"),
    Row("linear2.bias", "ffn.stages.1.bias"),
    *(Row(f"norm{i}.{w}", f"norm{i}.{w}") for i in (1, 2, 3) for w in ("weight", "bias")),
    Row("dropout.p", "ffn.dropout.p", attr=True),
    Row("dropout3.p", "ffn.out_dropout.p", attr=True),
    *(Row(f"norm{i}.eps", f"norm{i}.eps", attr=True) for i in (1, 2, 3)),
)


@dataclass(frozen=True, kw_only=True)
class TorchTransformerConfig:
    """An nn.Transformer as splitformer reads it: the configs of its two halves and the
    arguments of nn.Transformer itself."""

    kind: str = "transformer"
    d_model: int
    nhead: int
    batch_first: bool
    encoder: TorchConfig
    decoder: TorchConfig


def _rows(encoder: TorchConfig | None, decoder: TorchConfig) -> list[Row]:
    """The rows of a decoder (``encoder`` None) or of the pair (prefixes encoder., decoder.)."""
    if encoder is None:
        return module_rows(decoder, DECODER_LAYER_MAP)
    return (prefixed(module_rows(encoder, ENCODER_LAYER_MAP), "encoder.", "encoder.")
            + prefixed(module_rows(decoder, DECODER_LAYER_MAP), "decoder.", "decoder."))


# -- torch.nn -> splitformer --------------------------------------------------------------------
def _decoder_layer_fields(layer: nn.Module, prefix: str = "") -> dict[str, Any]:
    if not isinstance(layer, nn.TransformerDecoderLayer):
        raise TypeError(f"expected nn.TransformerDecoderLayer, got {type(layer).__name__}")
    sa, ca = layer.self_attn, layer.multihead_attn
    check_attention(sa, "self_attn")
    check_attention(ca, "multihead_attn")
    if ca.embed_dim != sa.embed_dim or ca.num_heads != sa.num_heads:
        raise ValueError("self_attn and multihead_attn must share embed_dim and num_heads")
    if bool(sa.batch_first) != bool(ca.batch_first):
        raise ValueError("self_attn and multihead_attn must share batch_first")
    check_norms(layer, ("norm1", "norm2", "norm3"))
    check_dropouts(layer, ("dropout", "dropout1", "dropout2", "dropout3"), prefix)
    return layer_fields(layer, sa)


def decoder_config(module: nn.Module) -> TorchConfig:
    """Check an nn.TransformerDecoder(Layer) and read its ``TorchConfig`` (kind "decoder" or
    "decoder_layer")."""
    if isinstance(module, nn.TransformerDecoderLayer):
        layers, norm, kind = [module], None, "decoder_layer"
    else:
        layers, norm, kind = list(module.layers), module.norm, "decoder"
    if not layers:
        raise ValueError("nn.TransformerDecoder has no layers")
    check_plain(module)
    single = kind == "decoder_layer"
    fields = shared_fields([_decoder_layer_fields(layer, "" if single else f"layers.{i}.")
                            for i, layer in enumerate(layers)], "decoder layer")
    check_final_norm(norm)
    return TorchConfig(kind=kind, num_layers=len(layers), final_norm=norm is not None,
                       final_norm_bias=norm is None or norm.bias is not None, **fields)


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


def build_decoder(config: TorchConfig, *, device=None, dtype=None) -> CrossDecoder:
    """The splitformer CrossDecoder of ``config`` with random weights (decoder Lie scheme for
    post-LN, decoder pre-norm for pre-LN); ``source`` = ``config``."""
    kw = {"device": device, "dtype": dtype}
    L = config.num_layers
    controls = decoder_controls(config.d_model, config.nhead, config.dim_feedforward, L,
                                activation=config.activation,
                                layer_norm_eps=config.layer_norm_eps, bias=config.bias, **kw)
    scheme = decoder_prenorm() if config.norm_first else decoder_lie()
    return CrossDecoder(Evolution(controls, scheme, TimeGrid(L, L)),
                        final_norm=final_norm(config, **kw), batch_first=config.batch_first,
                        source=config)


def from_torch_transformer(module: nn.Module) -> CrossDecoder | EncoderDecoderModel:
    """nn.Transformer -> EncoderDecoderModel; nn.TransformerDecoder(Layer) -> CrossDecoder.

    The forward of the result takes the arguments of the source's forward and returns the same
    tensor. Post-LN and pre-LN (norm_first), relu / gelu / tanh-gelu, batch_first either way,
    bias on or off, final norms present or not are all mapped exactly.
    """
    p = next(module.parameters(), None)
    kw = {"device": getattr(p, "device", None), "dtype": getattr(p, "dtype", None)}
    if isinstance(module, nn.Transformer):
        config = transformer_config(module)
        model: nn.Module = EncoderDecoderModel(build_encoder(config.encoder, **kw),
                                               build_decoder(config.decoder, **kw), source=config)
        rows = _rows(config.encoder, config.decoder)
    elif isinstance(module, (nn.TransformerDecoder, nn.TransformerDecoderLayer)):
        config = decoder_config(module)
        model = build_decoder(config, **kw)
        rows = _rows(None, config)
    else:
        raise TypeError("from_torch_transformer expects nn.Transformer, nn.TransformerDecoder "
                        f"or nn.TransformerDecoderLayer, got {type(module).__name__}")
    copy_table(rows, theirs=module, ours=model, into="ours")
    model.train(module.training)
    return model


# -- splitformer -> torch.nn --------------------------------------------------------------------
def decoder_target(model: CrossDecoder) -> TorchConfig:
    """The ``TorchConfig`` of the nn.TransformerDecoder(Layer) that holds ``model``: read from
    its operators, scheme and source (ValueError if torch.nn cannot hold it)."""
    evo = model.evolution
    name = network_scheme(evo, {"lie": decoder_lie(), "prenorm": decoder_prenorm()},
                          "to_torch", where="the decoder")
    check_softmax(evo, "to_torch")
    theta0 = evo.controls[0]
    check_two_stages(theta0, "the decoder")
    ffn, a0 = theta0["ffn"], theta0["attention"]
    torch_activation(ffn.activation.name)
    kind = source_field(model.source, "kind")
    if kind not in ("decoder", "decoder_layer"):
        raise ValueError(f"model.source kind must be 'decoder' or 'decoder_layer', got {kind!r}")
    L, norm = len(evo.controls), model.final_norm
    layer = kind == "decoder_layer" and L == 1 and norm is None
    return TorchConfig(
        kind="decoder_layer" if layer else "decoder", d_model=a0.dim, nhead=a0.num_heads,
        dim_feedforward=ffn.widths[1], num_layers=L, activation=ffn.activation.name,
        layer_norm_eps=theta0["norm1"].eps, bias=a0.qkv_bias is not None,
        norm_first=name == "prenorm", batch_first=model.batch_first,
        final_norm=norm is not None, final_norm_bias=norm is None or norm.bias is not None)


def build_torch_decoder(config: TorchConfig, *, device=None, dtype=None) -> nn.Module:
    """The nn.TransformerDecoder (or Layer) of ``config``, random weights, dropout 0 (the rates
    come with the table)."""
    return build_torch_stack(config, nn.TransformerDecoderLayer, nn.TransformerDecoder,
                             "decoder_layer", device=device, dtype=dtype)


def weight_map(model: CrossDecoder | EncoderDecoderModel) -> list[Row]:
    """Every row of a converted model (the tensor rows only where the model has the weight,
    biases included or not): the table both directions copy."""
    if isinstance(model, EncoderDecoderModel):
        rows = _rows(torch_target(model.encoder), decoder_target(model.decoder))
    else:
        rows = _rows(None, decoder_target(model))
    params = dict(model.named_parameters())
    return [r for r in rows if r.attr or r.ours in params]


def to_torch_transformer(model: CrossDecoder | EncoderDecoderModel) -> nn.Module:
    """The torch.nn module with the same weights: the inverse of ``from_torch_transformer``."""
    if isinstance(model, EncoderDecoderModel):
        enc_config = torch_target(model.encoder)
        if enc_config.kind != "encoder":  # pragma: no cover - a pair's encoder has kind encoder
            raise ValueError("the encoder of a pair must be an nn.TransformerEncoder")
        dec_config = decoder_target(model.decoder)
        a = model.evolution.controls[0]["attention"]
        kw = {"device": a.qkv_weight.device, "dtype": a.qkv_weight.dtype}
        out: nn.Module = nn.Transformer(a.dim, a.num_heads, custom_encoder=nn.Identity(),
                                        custom_decoder=nn.Identity(),
                                        batch_first=model.batch_first, **kw)
        out.encoder = build_torch(enc_config, **kw)
        out.decoder = build_torch_decoder(dec_config, **kw)
        rows = _rows(enc_config, dec_config)
    elif isinstance(model, CrossDecoder):
        config = decoder_target(model)
        a = model.evolution.controls[0]["attention"]
        out = build_torch_decoder(config, device=a.qkv_weight.device, dtype=a.qkv_weight.dtype)
        rows = _rows(None, config)
    else:
        raise TypeError(f"to_torch(model) expects a splitformer Encoder, CrossDecoder or "
                        f"EncoderDecoderModel, got {type(model).__name__}")
    copy_table(rows, theirs=out, ours=model, into="theirs")
    out.train(model.training)
    return out
