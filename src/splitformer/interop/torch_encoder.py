"""nn.TransformerEncoder(Layer) <-> splitformer Encoder: a pure weight map (no torch.nn module is
wrapped or called).

nn.TransformerEncoderLayer with norm_first=False (post-LN) is one step of the Lie scheme

    u <- u + A(u);  u <- P1(u);  u <- u + G(u);  u <- P2(u)

and with norm_first=True (pre-LN) one explicit Euler step of u_t = A(P1 u) + G(P2 u), split in
two (docs/math.md 3.2). nn.TransformerEncoder with L layers is T = L, tau = 1; its final ``norm`` is
the read-out. Weight map (layer n -> theta^n, ``ENCODER_LAYER_MAP``):

    self_attn.in_proj_weight/bias  -> attention.qkv_weight/bias   (rows W_Q, W_K, W_V)
    self_attn.out_proj.weight/bias -> attention.out_weight/bias   (W_O)
    norm1 / norm2                  -> norm1 / norm2               (LayerNormProjection)
    linear1 / linear2              -> ffn.stages[0] / ffn.stages[1]

and the attribute rows: the dropout rates (self_attn.dropout, dropout1, dropout, dropout2) and
the eps of norm1, norm2. The paper's literal form (``form="paper"``, scalar LayerNorm gains and
eps = 0, ReLU; ``PAPER_LAYER_MAP``) maps linear_j.weight = E + W_j, where E is the rectangular
identity: the (I + W_j) relabelling.

``from_torch_encoder`` is check -> config -> build -> copy: ``torch_config`` checks the module
and reads a ``TorchConfig``, ``build_encoder`` builds the splitformer model from it (which keeps
the config as its ``source``), ``copy_table`` copies the weight table. ``to_torch_encoder``
reads the config back from the model (``torch_target``), builds the torch.nn module and copies
the same table the other way. The front, ``interop.torch_nn.from_torch`` / ``to_torch``,
dispatches here; this module imports the shared pieces (``interop.torch_layers``), never the
decoder map.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..models.encoder import Encoder, encoder_controls, paper_controls
from ..time import Evolution, TimeGrid
from ..time.schemes import lie, paper_lie, prenorm
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

__all__ = ["ENCODER_LAYER_MAP", "FORMS", "PAPER_LAYER_MAP", "build_encoder", "build_torch",
           "from_torch_encoder", "to_torch_encoder", "torch_config", "torch_target",
           "weight_map"]

FORMS = ("network", "paper")
# the pair's kinds: an Encoder whose source has one of them came from a decoder or a pair
_NOT_ENCODER_KINDS = ("decoder_layer", "decoder", "transformer")

# the feed-forward field and the norms of an encoder layer
_FFN_NORM_ROWS: tuple[Row, ...] = (
    Row("linear1.weight", "ffn.stages.0.weight"),
    Row("linear1.bias", "ffn.stages.0.bias"),
    Row("linear2.weight", "ffn.stages.1.weight"),
    Row("linear2.bias", "ffn.stages.1.bias"),
    Row("norm1.weight", "norm1.weight"),
    Row("norm1.bias", "norm1.bias"),
    Row("norm2.weight", "norm2.weight"),
    Row("norm2.bias", "norm2.bias"),
    Row("dropout.p", "ffn.dropout.p", attr=True),
    Row("dropout2.p", "ffn.out_dropout.p", attr=True),
    Row("norm1.eps", "norm1.eps", attr=True),
    Row("norm2.eps", "norm2.eps", attr=True),
)
# nn.TransformerEncoderLayer name -> the name in theta^n (the network form; both directions)
ENCODER_LAYER_MAP: tuple[Row, ...] = ATTENTION_ROWS + _FFN_NORM_ROWS
# the paper's literal form: scalar s2, s1 = LayerNorm gain, bias; linear_j.weight = E + W_j
PAPER_LAYER_MAP: tuple[Row, ...] = ATTENTION_ROWS + (
    Row("norm1.weight", "norm1.s2", transform="scalar"),
    Row("norm1.bias", "norm1.s1", transform="scalar"),
    Row("norm2.weight", "norm2.s2", transform="scalar"),
    Row("norm2.bias", "norm2.s1", transform="scalar"),
    Row("linear1.weight", "ffn1.weight", transform="plus_identity"),
    Row("linear1.bias", "ffn1.bias"),
    Row("linear2.weight", "ffn2.weight", transform="plus_identity"),
    Row("linear2.bias", "ffn2.bias"),
)


def weight_map(config: TorchConfig, layer_rows: tuple[Row, ...] | None = None) -> list[Row]:
    """Every row of the module ``config`` describes: layer n's table (``layer_rows``, by
    default the encoder's of the config's form) under ``layers.n`` / theta^n, then the final
    norm's."""
    if layer_rows is None:
        layer_rows = PAPER_LAYER_MAP if config.form == "paper" else ENCODER_LAYER_MAP
    return stack_rows(config, layer_rows)


# -- check ------------------------------------------------------------------------------------
def _layer_fields(layer: nn.Module, prefix: str = "") -> dict[str, Any]:
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise TypeError(f"expected nn.TransformerEncoderLayer, got {type(layer).__name__}")
    attn = layer.self_attn
    check_attention(attn, "self_attn")
    check_norms(layer, ("norm1", "norm2"))
    check_dropouts(layer, ("dropout", "dropout1", "dropout2"), prefix)
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
    return layer_fields(layer, attn)


def _check_paper(config: TorchConfig, layers: list[nn.Module]) -> None:
    if config.norm_first:
        raise ValueError("form='paper' needs norm_first=False (the paper's scheme is post-LN)")
    if config.activation != "relu":
        raise ValueError("form='paper' needs activation='relu' (the projection onto S2)")
    if not config.bias:
        raise ValueError("form='paper' needs bias=True (s1 is the LayerNorm bias)")
    for layer in layers:
        for nm in ("norm1", "norm2"):
            ln = getattr(layer, nm)
            if float(ln.weight.detach().reshape(-1)[0]) < 0:
                raise ValueError(f"form='paper' needs {nm}.weight (s2) >= 0: S1's standard "
                                 "deviation is nonnegative")
            if ln.eps != 0:
                raise ValueError(f"form='paper' needs {nm}.eps == 0 (layer_norm_eps=0), got "
                                 f"{ln.eps}")
    if config.final_norm:
        raise ValueError("form='paper' takes no final norm")


def torch_config(module: nn.Module, *, form: str = "network") -> TorchConfig:
    """Check an nn.TransformerEncoder(Layer) (ValueError / TypeError naming what the map does
    not support) and read its ``TorchConfig``."""
    if form not in FORMS:
        raise ValueError(f"form must be 'network' or 'paper', got {form!r}")
    if isinstance(module, nn.TransformerEncoderLayer):
        layers, switches = [module], {"kind": "layer"}
    elif isinstance(module, nn.TransformerEncoder):
        layers = list(module.layers)
        if not layers:
            raise ValueError("nn.TransformerEncoder has no layers")
        switches = {"kind": "encoder", "enable_nested_tensor": bool(module.enable_nested_tensor),
                    "mask_check": bool(module.mask_check)}
    else:
        raise TypeError("torch_config(module) expects nn.TransformerEncoder or "
                        f"nn.TransformerEncoderLayer, got {type(module).__name__}")
    check_plain(module)
    single = switches["kind"] == "layer"
    fields = shared_fields([_layer_fields(layer, "" if single else f"layers.{i}.")
                            for i, layer in enumerate(layers)])
    norm = module.norm if isinstance(module, nn.TransformerEncoder) else None
    check_final_norm(norm)
    config = TorchConfig(num_layers=len(layers), final_norm=norm is not None,
                         final_norm_bias=norm is None or norm.bias is not None, form=form,
                         **fields, **switches)
    if form == "paper":
        _check_paper(config, layers)
    return config


def build_encoder(config: TorchConfig, *, device=None, dtype=None) -> Encoder:
    """The splitformer Encoder of ``config`` with random weights: the Lie scheme (post-LN), the
    pre-norm scheme (pre-LN) or the paper's; ``source`` = ``config``."""
    kw = {"device": device, "dtype": dtype}
    d, h, ff, L = config.d_model, config.nhead, config.dim_feedforward, config.num_layers
    if config.form == "paper":
        controls = paper_controls(d, h, [d, ff, d], L, **kw)
        scheme = paper_lie(2)
    else:
        controls = encoder_controls(d, h, ff, L, activation=config.activation,
                                    layer_norm_eps=config.layer_norm_eps, bias=config.bias, **kw)
        scheme = prenorm() if config.norm_first else lie()
    evo = Evolution(controls, scheme, TimeGrid(L, L))
    return Encoder(evo, final_norm=final_norm(config, **kw), batch_first=config.batch_first,
                   source=config)


def build_torch(config: TorchConfig, *, device=None, dtype=None) -> nn.Module:
    """The torch.nn encoder (or layer) of ``config``, random weights, dropout 0 (the rates come
    with the table)."""
    return build_torch_stack(config, nn.TransformerEncoderLayer, nn.TransformerEncoder, "layer",
                             device=device, dtype=dtype,
                             enable_nested_tensor=config.enable_nested_tensor,
                             mask_check=config.mask_check)


# -- the two maps -------------------------------------------------------------------------------
def from_torch_encoder(module: nn.Module, *, form: str = "network") -> Encoder:
    """Map an nn.TransformerEncoder(Layer) onto controls and a scheme.

    form="network": post-LN -> the Lie scheme with the FFN as a vector field; pre-LN -> the
    pre-norm scheme. form="paper": the paper's literal scheme (post-LN, ReLU, scalar LayerNorm
    gains and biases, eps = 0 are required; weights become the W_j of the (I + W_j) form).
    """
    config = torch_config(module, form=form)
    p = next(module.parameters())
    model = build_encoder(config, device=p.device, dtype=p.dtype)
    copy_table(weight_map(config), theirs=module, ours=model, into="ours")
    model.train(module.training)
    return model


def torch_target(model: Encoder) -> TorchConfig:
    """The ``TorchConfig`` of the torch.nn module that holds ``model``: read from its operators,
    its scheme and its source (ValueError if it is not a network torch.nn can hold, or if its
    source says it came from a decoder or a pair)."""
    kind = model.source.kind
    if kind in _NOT_ENCODER_KINDS:
        raise ValueError(f"to_torch: the Encoder's model.source has kind {kind!r}, which is a "
                         "decoder's or a pair's; an Encoder converts from kind 'layer', "
                         "'encoder' or none")
    evo = model.evolution
    theta0 = evo.controls[0]
    check_two_stages(theta0)
    name = network_scheme(evo, {"lie": lie(), "prenorm": prenorm(), "paper": paper_lie(2)},
                          "to_torch")
    check_softmax(evo, "to_torch")
    a0 = theta0["attention"]
    if name == "paper":
        ff, act, eps, bias = theta0["ffn1"].out_dim, "relu", 0.0, True
    else:
        ff, act = theta0["ffn"].widths[1], theta0["ffn"].activation.name
        torch_activation(act)
        eps, bias = theta0["norm1"].eps, theta0["norm1"].bias is not None
    src, L = model.source, len(evo.controls)
    layer = kind == "layer" and L == 1 and model.final_norm is None
    return TorchConfig(
        kind="layer" if layer else "encoder", d_model=a0.dim, nhead=a0.num_heads,
        dim_feedforward=ff, num_layers=L, activation=act, layer_norm_eps=eps, bias=bias,
        norm_first=name == "prenorm", batch_first=model.batch_first,
        final_norm=model.final_norm is not None,
        final_norm_bias=model.final_norm is None or model.final_norm.bias is not None,
        form="paper" if name == "paper" else "network",
        enable_nested_tensor=src.field("enable_nested_tensor", True),
        mask_check=src.field("mask_check", True))


def to_torch_encoder(model: Encoder) -> nn.Module:
    """The nn.TransformerEncoder (or Layer) with the same weights: the inverse map."""
    config = torch_target(model)
    p = model.evolution.controls[0]["attention"].qkv_weight
    out = build_torch(config, device=p.device, dtype=p.dtype)
    copy_table(weight_map(config), theirs=out, ours=model, into="theirs")
    out.train(model.training)
    return out
