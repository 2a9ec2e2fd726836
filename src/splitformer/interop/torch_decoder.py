"""nn.TransformerDecoder(Layer) <-> splitformer CrossDecoder: a pure weight map (no torch.nn
module is called).

nn.TransformerDecoderLayer is one step of the decoder scheme on the three-field layout
(attention, norm1), (cross_attention, norm2), (ffn, norm3) (``splitformer.models.seq2seq``):

    norm_first=False (post-LN):  u <- P1(u + A u);  u <- P2(u + C(u; M));  u <- P3(u + G u)
    norm_first=True  (pre-LN):   u <- u + A(P1 u);  u <- u + C(P2 u; M);   u <- u + G(P3 u)

nn.TransformerDecoder with L layers is T = L, tau = 1, its ``norm`` the read-out; the memory M
enters the cross-attention kernel. Weight map, decoder layer n -> theta^n (``DECODER_LAYER_MAP``):

    self_attn.in_proj_weight/bias        -> attention.qkv_weight/qkv_bias         (W_Q, W_K, W_V)
    self_attn.out_proj.weight/bias       -> attention.out_weight/out_bias         (W_O)
    multihead_attn.in_proj_weight/bias   -> cross_attention.qkv_weight/qkv_bias   (W_Q on u,
                                                                               W_K, W_V on M)
    multihead_attn.out_proj.weight/bias  -> cross_attention.out_weight/out_bias
    linear1 / linear2                    -> ffn.stages.0 / ffn.stages.1
    norm1 / norm2 / norm3                -> norm1 / norm2 / norm3
    (decoder) norm                       -> final_norm

plus the attribute rows (the six dropout rates, the three eps). Both maps are check -> config
(``decoder_config``: a ``TorchConfig`` of kind "decoder" or "decoder_layer", kept as the model's
``source``) -> build -> copy. The front (``interop.torch_nn``) and the pair map
(``interop.torch_transformer``) use this module; it imports the shared pieces
(``interop.torch_layers``), never the encoder map.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..models.seq2seq import CrossDecoder, decoder_controls, decoder_lie, decoder_prenorm
from ..time import Evolution, TimeGrid
from .torch_layers import (
    ATTENTION_ROWS,
    TorchConfig,
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
    stack_rows,
    torch_activation,
)
from .weights import Row, check_softmax, copy_table, network_scheme

__all__ = ["DECODER_KINDS", "DECODER_LAYER_MAP", "build_decoder", "build_torch_decoder",
           "decoder_config", "decoder_rows", "decoder_target", "from_torch_decoder",
           "to_torch_decoder"]

# the source kinds of a CrossDecoder that torch.nn can hold
DECODER_KINDS = ("decoder", "decoder_layer")

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


def decoder_rows(config: TorchConfig) -> list[Row]:
    """Every row of the nn.TransformerDecoder(Layer) ``config`` describes (no prefix)."""
    return stack_rows(config, DECODER_LAYER_MAP)


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


def from_torch_decoder(module: nn.Module) -> CrossDecoder:
    """nn.TransformerDecoder(Layer) -> CrossDecoder whose forward takes the arguments of the
    source's forward (tgt, memory, masks) and returns the same tensor."""
    config = decoder_config(module)
    p = next(module.parameters())
    model = build_decoder(config, device=p.device, dtype=p.dtype)
    copy_table(decoder_rows(config), theirs=module, ours=model, into="ours")
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
    kind = model.source.kind
    if kind not in DECODER_KINDS:
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


def to_torch_decoder(model: CrossDecoder) -> nn.Module:
    """The nn.TransformerDecoder (or Layer) with the same weights: the inverse map."""
    config = decoder_target(model)
    a = model.evolution.controls[0]["attention"]
    out = build_torch_decoder(config, device=a.qkv_weight.device, dtype=a.qkv_weight.dtype)
    copy_table(decoder_rows(config), theirs=out, ours=model, into="theirs")
    out.train(model.training)
    return out
