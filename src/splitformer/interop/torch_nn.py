"""torch.nn <-> splitformer: a pure weight map (no torch.nn module is wrapped or called).

nn.TransformerEncoderLayer with norm_first=False (post-LN) is one step of the Lie scheme

    u <- u + A(u);  u <- P1(u);  u <- u + G(u);  u <- P2(u)

and with norm_first=True (pre-LN) one explicit Euler step of u_t = A(P1 u) + G(P2 u), split in
two (docs/math.md 3.2). nn.TransformerEncoder with L layers is T = L, tau = 1; its final ``norm`` is
the read-out. Weight map (layer n -> theta^n):

    self_attn.in_proj_weight/bias  -> attention.qkv_weight/bias   (rows W_Q, W_K, W_V)
    self_attn.out_proj.weight/bias -> attention.out_weight/bias   (W_O)
    norm1 / norm2                  -> norm1 / norm2               (LayerNormProjection)
    linear1 / linear2              -> ffn.stages[0] / ffn.stages[1]

The paper's literal form (``form="paper"``, scalar LayerNorm gains and eps = 0, ReLU) maps
linear_j.weight = E + W_j, where E is the rectangular identity: the (I + W_j) relabelling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models.encoder import Encoder, encoder_controls, paper_controls
from ..operators import LayerNormProjection
from ..time import Evolution, TimeGrid
from ..time.schemes import lie, paper_lie, prenorm
from .weights import check_softmax, copy_table, network_scheme
from .weights import copy_weight as _copy

__all__ = ["ENCODER_LAYER_MAP", "from_torch", "to_torch"]

# nn.TransformerEncoderLayer name -> the name in theta^n (the network form; both directions)
ENCODER_LAYER_MAP: tuple[tuple[str, str], ...] = (
    ("self_attn.in_proj_weight", "attention.qkv_weight"),
    ("self_attn.in_proj_bias", "attention.qkv_bias"),
    ("self_attn.out_proj.weight", "attention.out_weight"),
    ("self_attn.out_proj.bias", "attention.out_bias"),
    ("linear1.weight", "ffn.stages.0.weight"),
    ("linear1.bias", "ffn.stages.0.bias"),
    ("linear2.weight", "ffn.stages.1.weight"),
    ("linear2.bias", "ffn.stages.1.bias"),
    ("norm1.weight", "norm1.weight"),
    ("norm1.bias", "norm1.bias"),
    ("norm2.weight", "norm2.weight"),
    ("norm2.bias", "norm2.bias"),
)


def _activation_name(layer: nn.TransformerEncoderLayer) -> str:
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    if isinstance(act, nn.GELU) and act.approximate == "tanh":
        return "gelu_tanh"
    raise ValueError(
        f"activation={act!r} is not supported for conversion: use 'relu' or 'gelu' "
        "(F.relu, F.gelu, nn.ReLU(), nn.GELU())"
    )




def _layer_config(layer: nn.TransformerEncoderLayer) -> dict:
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise TypeError(
            f"expected nn.TransformerEncoderLayer, got {type(layer).__name__}"
        )
    attn = layer.self_attn
    if not attn._qkv_same_embed_dim:
        raise ValueError("self_attn with kdim/vdim != embed_dim is not supported")
    if attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError("self_attn with add_bias_kv or add_zero_attn is not supported")
    for nm in ("norm1", "norm2"):
        norm = getattr(layer, nm)
        if not isinstance(norm, nn.LayerNorm) or not norm.elementwise_affine:
            raise ValueError(f"{nm}={norm!r}: must be nn.LayerNorm with elementwise_affine=True")
    biases = {
        "self_attn.in_proj_bias": attn.in_proj_bias is not None,
        "self_attn.out_proj.bias": attn.out_proj.bias is not None,
        "linear1.bias": layer.linear1.bias is not None,
        "linear2.bias": layer.linear2.bias is not None,
        "norm1.bias": layer.norm1.bias is not None,
        "norm2.bias": layer.norm2.bias is not None,
    }
    if len(set(biases.values())) > 1:
        missing = [k for k, v in biases.items() if not v]
        raise ValueError(f"biases must be all present or all absent (bias=True/False); "
                         f"missing: {missing}")
    p = next(layer.parameters())
    return {
        "d_model": attn.embed_dim,
        "nhead": attn.num_heads,
        "dim_feedforward": layer.linear1.out_features,
        "activation": _activation_name(layer),
        "layer_norm_eps": layer.norm1.eps,
        "bias": layer.linear1.bias is not None,
        "norm_first": bool(layer.norm_first),
        "batch_first": bool(attn.batch_first),
        "dropout": float(layer.dropout.p),
        "attn_dropout": float(attn.dropout),
        "out_dropout1": float(layer.dropout1.p),
        "out_dropout2": float(layer.dropout2.p),
        "dtype": p.dtype,
        "device": p.device,
    }


def _fill_theta(theta: nn.ModuleDict, layer: nn.TransformerEncoderLayer, cfg: dict) -> None:
    copy_table(theta, layer, ENCODER_LAYER_MAP)
    theta["attention"].attn_dropout = cfg["attn_dropout"]
    theta["attention"].out_dropout.p = cfg["out_dropout1"]
    for nm in ("norm1", "norm2"):
        theta[nm].eps = getattr(layer, nm).eps  # eps is not in the state dict
    theta["ffn"].dropout.p = cfg["dropout"]
    theta["ffn"].out_dropout.p = cfg["out_dropout2"]


def _layers_of(module: nn.Module) -> tuple[list[nn.TransformerEncoderLayer], dict]:
    if isinstance(module, nn.TransformerEncoderLayer):
        return [module], {"kind": "layer"}
    if isinstance(module, nn.TransformerEncoder):
        layers = list(module.layers)
        if not layers:
            raise ValueError("nn.TransformerEncoder has no layers")
        return layers, {
            "kind": "encoder",
            "enable_nested_tensor": bool(module.enable_nested_tensor),
            "mask_check": bool(getattr(module, "mask_check", True)),
        }
    raise TypeError(
        "from_torch(module) expects nn.TransformerEncoder or nn.TransformerEncoderLayer, got "
        f"{type(module).__name__}"
    )


def from_torch(module: nn.Module, *, form: str = "network") -> Encoder:
    """Map an nn.TransformerEncoder(Layer) onto controls and a scheme.

    form="network": post-LN -> the Lie scheme with the FFN as a vector field; pre-LN -> the
    pre-norm scheme. form="paper": the paper's literal scheme (post-LN, ReLU, scalar LayerNorm
    gains and biases, eps = 0 are required; weights become the W_j of the (I + W_j) form).
    """
    if form not in ("network", "paper"):
        raise ValueError(f"form must be 'network' or 'paper', got {form!r}")
    if isinstance(module, (nn.Transformer, nn.TransformerDecoder, nn.TransformerDecoderLayer)):
        from .torch_transformer import from_torch_transformer

        return from_torch_transformer(module)
    layers, source = _layers_of(module)
    cfgs = [_layer_config(layer) for layer in layers]
    cfg = cfgs[0]
    keys = ("d_model", "nhead", "dim_feedforward", "activation", "norm_first", "batch_first",
            "bias", "dtype", "device")
    for i, c in enumerate(cfgs[1:], start=1):
        diff = [k for k in keys if c[k] != cfg[k]]
        if diff:
            raise ValueError(f"layer {i} differs from layer 0 in {diff}: layers must share them")
    source.update(batch_first=cfg["batch_first"], norm_first=cfg["norm_first"])
    kw = {"device": cfg["device"], "dtype": cfg["dtype"]}
    L = len(layers)
    final_norm = None
    norm = getattr(module, "norm", None)
    if norm is not None:
        if not isinstance(norm, nn.LayerNorm) or not norm.elementwise_affine:
            raise ValueError(f"norm={norm!r}: only nn.LayerNorm with elementwise_affine=True")
        final_norm = LayerNormProjection(cfg["d_model"], eps=norm.eps,
                                         bias=norm.bias is not None, **kw)
        _copy(final_norm.weight, norm.weight, "norm.weight")
        _copy(final_norm.bias, norm.bias, "norm.bias")

    if form == "paper":
        return _from_torch_paper(layers, cfgs, source, final_norm)

    controls = encoder_controls(
        cfg["d_model"], cfg["nhead"], cfg["dim_feedforward"], L, activation=cfg["activation"],
        layer_norm_eps=cfg["layer_norm_eps"], bias=cfg["bias"], **kw,
    )
    for theta, layer, c in zip(controls, layers, cfgs, strict=True):
        _fill_theta(theta, layer, c)
    scheme = prenorm() if cfg["norm_first"] else lie()
    evo = Evolution(controls, scheme, TimeGrid(L, L))
    model = Encoder(evo, final_norm=final_norm, batch_first=cfg["batch_first"], source=source)
    model.train(module.training)
    return model


def _scalar(t: torch.Tensor, what: str) -> float:
    if not torch.all(t == t.reshape(-1)[0]):
        raise ValueError(f"form='paper' needs a scalar {what} (all entries equal)")
    return float(t.reshape(-1)[0])


def _from_torch_paper(layers, cfgs, source, final_norm) -> Encoder:
    cfg = cfgs[0]
    if cfg["norm_first"]:
        raise ValueError("form='paper' needs norm_first=False (the paper's scheme is post-LN)")
    if cfg["activation"] != "relu":
        raise ValueError("form='paper' needs activation='relu' (the projection onto S2)")
    if not cfg["bias"]:
        raise ValueError("form='paper' needs bias=True (s1 is the LayerNorm bias)")
    for layer in layers:
        for nm in ("norm1", "norm2"):
            if float(getattr(layer, nm).weight.detach().reshape(-1)[0]) < 0:
                raise ValueError(f"form='paper' needs {nm}.weight (s2) >= 0: S1's standard "
                                 "deviation is nonnegative")
            if getattr(layer, nm).eps != 0:
                raise ValueError(f"form='paper' needs {nm}.eps == 0 (layer_norm_eps=0), got "
                                 f"{getattr(layer, nm).eps}")
    if final_norm is not None:
        raise ValueError("form='paper' takes no final norm")
    d, ff, L = cfg["d_model"], cfg["dim_feedforward"], len(layers)
    controls = paper_controls(d, cfg["nhead"], [d, ff, d], L, device=cfg["device"],
                              dtype=cfg["dtype"])
    for theta, layer, c in zip(controls, layers, cfgs, strict=True):
        sa, a = layer.self_attn, theta["attention"]
        _copy(a.qkv_weight, sa.in_proj_weight, "self_attn.in_proj_weight")
        _copy(a.qkv_bias, sa.in_proj_bias, "self_attn.in_proj_bias")
        _copy(a.out_weight, sa.out_proj.weight, "self_attn.out_proj.weight")
        _copy(a.out_bias, sa.out_proj.bias, "self_attn.out_proj.bias")
        a.attn_dropout = c["attn_dropout"]
        for nm in ("norm1", "norm2"):
            ln = getattr(layer, nm)
            with torch.no_grad():
                theta[nm].s2.fill_(_scalar(ln.weight, f"{nm}.weight (s2)"))
                theta[nm].s1.fill_(_scalar(ln.bias, f"{nm}.bias (s1)"))
        for j, lin in ((1, layer.linear1), (2, layer.linear2)):
            st = theta[f"ffn{j}"]
            _copy(st.weight, lin.weight - st.identity_matrix(), f"linear{j}.weight - E")
            _copy(st.bias, lin.bias, f"linear{j}.bias")
    evo = Evolution(controls, paper_lie(2), TimeGrid(L, L))
    source = dict(source, form="paper")
    model = Encoder(evo, final_norm=None, batch_first=cfg["batch_first"], source=source)
    model.train(layers[0].training)
    return model


def to_torch(model: Encoder) -> nn.Module:
    """The nn.TransformerEncoder (or Layer) with the same weights: the inverse map."""
    if getattr(model, "source", {}).get("kind") in ("transformer", "decoder", "decoder_layer"):
        from .torch_transformer import to_torch_transformer

        return to_torch_transformer(model)
    if not isinstance(model, Encoder):
        raise TypeError(f"to_torch(model) expects a splitformer Encoder, got "
                        f"{type(model).__name__}")
    evo = model.evolution
    name = network_scheme(evo, {"lie": lie(), "prenorm": prenorm(), "paper": paper_lie(2)},
                          "to_torch")
    check_softmax(evo, "to_torch")
    paper = name == "paper"
    theta0 = evo.controls[0]
    a0 = theta0["attention"]
    p = a0.qkv_weight
    if paper:
        if "ffn3" in theta0:
            raise ValueError("to_torch needs J = 2 feed-forward stages for the paper form")
        ff = theta0["ffn1"].out_dim
        act, eps, bias = "relu", 0.0, True
        dropout = 0.0
    else:
        ffn = theta0["ffn"]
        if ffn.num_stages != 2:
            raise ValueError(f"to_torch needs J = 2 feed-forward stages, got {ffn.num_stages}")
        ff = ffn.widths[1]
        act = {"relu": "relu", "gelu": "gelu"}.get(ffn.activation.name)
        if ffn.activation.name == "gelu_tanh":
            act = nn.GELU(approximate="tanh")
        if act is None:
            raise ValueError(f"to_torch supports relu, gelu and gelu_tanh, got "
                             f"{ffn.activation.name!r}")
        eps, bias = theta0["norm1"].eps, theta0["norm1"].bias is not None
        dropout = ffn.dropout.p
    batch_first = model.batch_first
    layers = []
    for theta in evo.controls:
        layer = nn.TransformerEncoderLayer(
            a0.dim, a0.num_heads, ff, dropout=dropout, activation=act, layer_norm_eps=eps,
            batch_first=batch_first, norm_first=(name == "prenorm"), bias=bias,
            device=p.device, dtype=p.dtype,
        )
        a = theta["attention"]
        copy_table(layer, theta, ENCODER_LAYER_MAP[:4], reverse=True)  # the attention weights
        layer.self_attn.dropout = a.attn_dropout
        layer.dropout1.p = a.out_dropout.p
        if paper:
            for nm in ("norm1", "norm2"):
                with torch.no_grad():
                    getattr(layer, nm).weight.fill_(float(theta[nm].s2))
                    getattr(layer, nm).bias.fill_(float(theta[nm].s1))
            for j, lin in ((1, layer.linear1), (2, layer.linear2)):
                st = theta[f"ffn{j}"]
                _copy(lin.weight, st.weight + st.identity_matrix(), f"ffn{j}.weight + E")
                _copy(lin.bias, st.bias, f"ffn{j}.bias")
        else:
            copy_table(layer, theta, ENCODER_LAYER_MAP[4:], reverse=True)
            for nm in ("norm1", "norm2"):
                getattr(layer, nm).eps = theta[nm].eps  # eps is not in the state dict
            ffn = theta["ffn"]
            layer.dropout.p = ffn.dropout.p
            layer.dropout2.p = ffn.out_dropout.p
        layers.append(layer)
    src = model.source
    if src.get("kind") == "layer" and len(layers) == 1 and model.final_norm is None:
        out: nn.Module = layers[0]
    else:
        norm = None
        if model.final_norm is not None:
            fn = model.final_norm
            norm = nn.LayerNorm(a0.dim, eps=fn.eps, bias=fn.bias is not None, device=p.device,
                                dtype=p.dtype)
            _copy(norm.weight, fn.weight, "final_norm.weight")
            _copy(norm.bias, fn.bias, "final_norm.bias")
        out = nn.TransformerEncoder(
            layers[0], len(layers), norm=norm,
            enable_nested_tensor=src.get("enable_nested_tensor", True),
            mask_check=src.get("mask_check", True),
        )
        for i, layer in enumerate(layers):
            out.layers[i] = layer
    out.train(model.training)
    return out
