"""torch.nn encoder-decoder <-> splitformer: a pure weight map (no torch.nn module is called).

nn.TransformerDecoderLayer is one step of the decoder scheme on the three-field layout
(attention, norm1), (cross_attention, norm2), (ffn, norm3) (``splitformer.models.seq2seq``):

    norm_first=False (post-LN):  u <- P1(u + A u);  u <- P2(u + C(u; M));  u <- P3(u + G u)
    norm_first=True  (pre-LN):   u <- u + A(P1 u);  u <- u + C(P2 u; M);   u <- u + G(P3 u)

nn.TransformerDecoder with L layers is T = L, tau = 1, its ``norm`` the read-out.
nn.Transformer is the coupled pair: the encoder field (``interop.torch_nn.from_torch`` of its
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

Names of the whole model: ``decoder.layers.n.*`` -> ``decoder.evolution.controls.sets.n.*``,
``encoder.layers.n.*`` -> ``encoder.evolution.controls.sets.n.*``, ``decoder.norm`` ->
``decoder.final_norm``, ``encoder.norm`` -> ``encoder.final_norm``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..models.seq2seq import (
    CrossDecoder,
    EncoderDecoderModel,
    decoder_controls,
    decoder_lie,
    decoder_prenorm,
)
from ..operators import LayerNormProjection, SoftmaxKernel
from ..time import Evolution, TimeGrid
from .torch_nn import ENCODER_LAYER_MAP, _activation_name, from_torch, to_torch
from .weights import copy_table, network_scheme
from .weights import copy_weight as _copy

__all__ = ["DECODER_LAYER_MAP", "ENCODER_LAYER_MAP", "from_torch_transformer",
           "to_torch_transformer", "weight_map"]

DECODER_LAYER_MAP: tuple[tuple[str, str], ...] = (
    *ENCODER_LAYER_MAP[:4],
    ("multihead_attn.in_proj_weight", "cross_attention.qkv_weight"),
    ("multihead_attn.in_proj_bias", "cross_attention.qkv_bias"),
    ("multihead_attn.out_proj.weight", "cross_attention.out_weight"),
    ("multihead_attn.out_proj.bias", "cross_attention.out_bias"),
    *ENCODER_LAYER_MAP[4:],
    ("norm3.weight", "norm3.weight"),
    ("norm3.bias", "norm3.bias"),
)

_NORM_MAP = (("norm.weight", "final_norm.weight"), ("norm.bias", "final_norm.bias"))


def weight_map(model: CrossDecoder | EncoderDecoderModel) -> list[tuple[str, str]]:
    """Every (torch.nn name, splitformer name) pair of a converted model (biases only where
    the model has them)."""
    params = dict(model.named_parameters())
    return [(t, s) for t, s in _full_map(model) if s in params]


def _full_map(model: CrossDecoder | EncoderDecoderModel) -> list[tuple[str, str]]:
    def part(prefix_t: str, prefix_s: str, layers: int, table, norm: bool):
        out = []
        for n in range(layers):
            out += [(f"{prefix_t}layers.{n}.{t}", f"{prefix_s}evolution.controls.sets.{n}.{s}")
                    for t, s in table]
        if norm:
            out += [(prefix_t + t, prefix_s + s) for t, s in _NORM_MAP]
        return out

    if isinstance(model, EncoderDecoderModel):
        enc, dec = model.encoder, model.decoder
        return (part("encoder.", "encoder.", len(enc.evolution.controls), ENCODER_LAYER_MAP,
                     enc.final_norm is not None)
                + part("decoder.", "decoder.", len(dec.evolution.controls), DECODER_LAYER_MAP,
                       dec.final_norm is not None))
    if model.source.get("kind") == "decoder_layer":
        return [(t, f"evolution.controls.sets.0.{s}") for t, s in DECODER_LAYER_MAP]
    return part("", "", len(model.evolution.controls), DECODER_LAYER_MAP,
                model.final_norm is not None)


# ------------------------------------------------------------------------------------------
# torch.nn -> splitformer
# ------------------------------------------------------------------------------------------
def _check_mha(attn: nn.MultiheadAttention, what: str) -> None:
    if not attn._qkv_same_embed_dim:
        raise ValueError(f"{what} with kdim/vdim != embed_dim is not supported")
    if attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError(f"{what} with add_bias_kv or add_zero_attn is not supported")


def _decoder_layer_config(layer: nn.Module) -> dict[str, Any]:
    if not isinstance(layer, nn.TransformerDecoderLayer):
        raise TypeError(f"expected nn.TransformerDecoderLayer, got {type(layer).__name__}")
    sa, ca = layer.self_attn, layer.multihead_attn
    _check_mha(sa, "self_attn")
    _check_mha(ca, "multihead_attn")
    if ca.embed_dim != sa.embed_dim or ca.num_heads != sa.num_heads:
        raise ValueError("self_attn and multihead_attn must share embed_dim and num_heads")
    if bool(sa.batch_first) != bool(ca.batch_first):
        raise ValueError("self_attn and multihead_attn must share batch_first")
    for nm in ("norm1", "norm2", "norm3"):
        ln = getattr(layer, nm)
        if not isinstance(ln, nn.LayerNorm) or not ln.elementwise_affine:
            raise ValueError(f"{nm} must be nn.LayerNorm with elementwise_affine=True")
    p = next(layer.parameters())
    return {
        "d_model": sa.embed_dim,
        "nhead": sa.num_heads,
        "dim_feedforward": layer.linear1.out_features,
        "activation": _activation_name(layer),
        "layer_norm_eps": layer.norm1.eps,
        "bias": layer.linear1.bias is not None,
        "norm_first": bool(layer.norm_first),
        "batch_first": bool(sa.batch_first),
        "dtype": p.dtype,
        "device": p.device,
    }


def _fill_decoder_theta(theta: nn.ModuleDict, layer: nn.TransformerDecoderLayer) -> None:
    copy_table(theta, layer, DECODER_LAYER_MAP)
    theta["attention"].attn_dropout = float(layer.self_attn.dropout)
    theta["attention"].out_dropout.p = float(layer.dropout1.p)
    theta["cross_attention"].attn_dropout = float(layer.multihead_attn.dropout)
    theta["cross_attention"].out_dropout.p = float(layer.dropout2.p)
    theta["ffn"].dropout.p = float(layer.dropout.p)
    theta["ffn"].out_dropout.p = float(layer.dropout3.p)
    for nm in ("norm1", "norm2", "norm3"):
        theta[nm].eps = float(getattr(layer, nm).eps)


_SHARED = ("d_model", "nhead", "dim_feedforward", "activation", "norm_first", "batch_first",
           "bias", "dtype", "device")


def _final_norm(norm: nn.Module | None, cfg: dict[str, Any]) -> LayerNormProjection | None:
    if norm is None:
        return None
    if not isinstance(norm, nn.LayerNorm) or not norm.elementwise_affine:
        raise ValueError(f"norm={norm!r}: only nn.LayerNorm with elementwise_affine=True")
    out = LayerNormProjection(cfg["d_model"], eps=norm.eps, bias=norm.bias is not None,
                              device=cfg["device"], dtype=cfg["dtype"])
    _copy(out.weight, norm.weight, "norm.weight")
    _copy(out.bias, norm.bias, "norm.bias")
    return out


def _decoder_from(layers: list[nn.Module], norm: nn.Module | None,
                  source: dict[str, Any]) -> CrossDecoder:
    if not layers:
        raise ValueError("nn.TransformerDecoder has no layers")
    cfgs = [_decoder_layer_config(layer) for layer in layers]
    cfg = cfgs[0]
    for i, c in enumerate(cfgs[1:], start=1):
        diff = [k for k in _SHARED if c[k] != cfg[k]]
        if diff:
            raise ValueError(f"decoder layer {i} differs from layer 0 in {diff}: layers must "
                             "share them")
    L = len(layers)
    controls = decoder_controls(
        cfg["d_model"], cfg["nhead"], cfg["dim_feedforward"], L, activation=cfg["activation"],
        layer_norm_eps=cfg["layer_norm_eps"], bias=cfg["bias"], device=cfg["device"],
        dtype=cfg["dtype"])
    for theta, layer in zip(controls, layers, strict=True):
        _fill_decoder_theta(theta, layer)
    scheme = decoder_prenorm() if cfg["norm_first"] else decoder_lie()
    evo = Evolution(controls, scheme, TimeGrid(L, L))
    source = dict(source, batch_first=cfg["batch_first"], norm_first=cfg["norm_first"])
    model = CrossDecoder(evo, final_norm=_final_norm(norm, cfg), batch_first=cfg["batch_first"],
                         source=source)
    model.train(layers[0].training)
    return model


def from_torch_transformer(module: nn.Module) -> CrossDecoder | EncoderDecoderModel:
    """nn.Transformer -> EncoderDecoderModel; nn.TransformerDecoder(Layer) -> CrossDecoder.

    The forward of the result takes the arguments of the source's forward and returns the same
    tensor. Post-LN and pre-LN (norm_first), relu / gelu / tanh-gelu, batch_first either way,
    bias on or off, final norms present or not are all mapped exactly.
    """
    if isinstance(module, nn.Transformer):
        enc, dec = module.encoder, module.decoder
        if not isinstance(enc, nn.TransformerEncoder):
            raise TypeError(f"custom_encoder of type {type(enc).__name__} is not supported "
                            "(an nn.TransformerEncoder is)")
        if not isinstance(dec, nn.TransformerDecoder):
            raise TypeError(f"custom_decoder of type {type(dec).__name__} is not supported "
                            "(an nn.TransformerDecoder is)")
        encoder = from_torch(enc)
        decoder = _decoder_from(list(dec.layers), dec.norm, {"kind": "decoder"})
        if encoder.batch_first != decoder.batch_first:
            raise ValueError("the encoder and decoder layers must share batch_first")
        model = EncoderDecoderModel(encoder, decoder, source={
            "kind": "transformer", "batch_first": bool(module.batch_first),
            "d_model": int(module.d_model), "nhead": int(module.nhead)})
        model.train(module.training)
        return model
    if isinstance(module, nn.TransformerDecoder):
        return _decoder_from(list(module.layers), module.norm, {"kind": "decoder"})
    if isinstance(module, nn.TransformerDecoderLayer):
        return _decoder_from([module], None, {"kind": "decoder_layer"})
    raise TypeError("from_torch_transformer expects nn.Transformer, nn.TransformerDecoder or "
                    f"nn.TransformerDecoderLayer, got {type(module).__name__}")


# ------------------------------------------------------------------------------------------
# splitformer -> torch.nn
# ------------------------------------------------------------------------------------------
def _torch_activation(name: str) -> str | nn.Module:
    if name in ("relu", "gelu"):
        return name
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    raise ValueError(f"to_torch supports the activations relu, gelu and gelu_tanh, got {name!r}")


def _check_evolution(evo: Evolution, schemes: dict[str, Any], what: str) -> bool:
    """norm_first of the scheme (it must be one of ``schemes``' network schemes, tau = 1)."""
    name = network_scheme(evo, {k: make() for k, make in schemes.items()}, "to_torch",
                          where=f"the {what}")
    return name == "prenorm"


def _layer_options(theta: nn.ModuleDict, what: str) -> dict[str, Any]:
    a, ffn = theta["attention"], theta["ffn"]
    for name in ("attention", "cross_attention"):
        if name in theta:
            k = theta[name].kernel
            if type(k) is not SoftmaxKernel or k.scale is not None:
                raise ValueError(f"to_torch needs the softmax kernel with scale 1/sqrt(d_h) in "
                                 f"{what} {name}, got {k!r}")
    if ffn.num_stages != 2:
        raise ValueError(f"to_torch needs J = 2 feed-forward stages, got {ffn.num_stages}")
    return {
        "d_model": a.dim,
        "nhead": a.num_heads,
        "dim_feedforward": ffn.widths[1],
        "activation": _torch_activation(ffn.activation.name),
        "layer_norm_eps": theta["norm1"].eps,
        "bias": a.qkv_bias is not None,
        "device": a.qkv_weight.device,
        "dtype": a.qkv_weight.dtype,
    }


def _torch_norm(norm: LayerNormProjection | None) -> nn.LayerNorm | None:
    if norm is None:
        return None
    w = norm.weight
    out = nn.LayerNorm(w.shape[0], eps=norm.eps, bias=norm.bias is not None, device=w.device,
                       dtype=w.dtype)
    _copy(out.weight, norm.weight, "final_norm.weight")
    _copy(out.bias, norm.bias, "final_norm.bias")
    return out


def _decoder_layers(model: CrossDecoder) -> list[nn.TransformerDecoderLayer]:
    evo = model.evolution
    norm_first = _check_evolution(evo, {"lie": decoder_lie, "prenorm": decoder_prenorm},
                                  "decoder")
    layers = []
    for theta in evo.controls:
        o = _layer_options(theta, "decoder")
        layer = nn.TransformerDecoderLayer(
            o["d_model"], o["nhead"], o["dim_feedforward"], dropout=0.0,
            activation=o["activation"], layer_norm_eps=o["layer_norm_eps"],
            batch_first=model.batch_first, norm_first=norm_first, bias=o["bias"],
            device=o["device"], dtype=o["dtype"])
        copy_table(layer, theta, DECODER_LAYER_MAP, reverse=True)
        layer.self_attn.dropout = theta["attention"].attn_dropout
        layer.dropout1.p = theta["attention"].out_dropout.p
        layer.multihead_attn.dropout = theta["cross_attention"].attn_dropout
        layer.dropout2.p = theta["cross_attention"].out_dropout.p
        layer.dropout.p = theta["ffn"].dropout.p
        layer.dropout3.p = theta["ffn"].out_dropout.p
        for nm in ("norm1", "norm2", "norm3"):
            getattr(layer, nm).eps = theta[nm].eps
        layers.append(layer)
    return layers


def _decoder_to_torch(model: CrossDecoder) -> nn.Module:
    layers = _decoder_layers(model)
    if model.source.get("kind") == "decoder_layer" and len(layers) == 1 \
            and model.final_norm is None:
        return layers[0]
    out = nn.TransformerDecoder(layers[0], len(layers), norm=_torch_norm(model.final_norm))
    for i, layer in enumerate(layers):
        out.layers[i] = layer
    return out


def to_torch_transformer(model: CrossDecoder | EncoderDecoderModel) -> nn.Module:
    """The torch.nn module with the same weights: the inverse of ``from_torch_transformer``."""
    kind = getattr(model, "source", {}).get("kind")
    if isinstance(model, EncoderDecoderModel):
        enc = to_torch(model.encoder)  # the encoder half is an Encoder: torch_nn's inverse map
        dec = _decoder_to_torch(model.decoder)
        if not isinstance(dec, nn.TransformerDecoder):  # pragma: no cover - kind is "decoder"
            raise ValueError("the decoder of a pair must be an nn.TransformerDecoder")
        a = model.evolution.controls[0]["attention"]
        out: nn.Module = nn.Transformer(
            a.dim, a.num_heads, custom_encoder=nn.Identity(), custom_decoder=nn.Identity(),
            batch_first=model.batch_first, device=a.qkv_weight.device, dtype=a.qkv_weight.dtype)
        out.encoder = enc
        out.decoder = dec
    elif isinstance(model, CrossDecoder):
        if kind not in ("decoder", "decoder_layer"):
            raise ValueError(f"model.source['kind'] must be 'decoder' or 'decoder_layer', got "
                             f"{kind!r}")
        out = _decoder_to_torch(model)
    else:
        raise TypeError(f"to_torch_transformer expects a CrossDecoder or EncoderDecoderModel, "
                        f"got {type(model).__name__}")
    out.train(model.training)
    return out

