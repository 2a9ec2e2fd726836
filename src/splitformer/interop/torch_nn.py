"""torch.nn <-> splitformer: a pure weight map (no torch.nn module is wrapped or called).

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

``from_torch`` is check -> config -> build -> copy: ``torch_config`` checks the module and reads
a ``TorchConfig``, ``build_encoder`` builds the splitformer model from it (which keeps the config
as its ``source``), ``copy_table`` copies the weight table. ``to_torch`` reads the config back
from the model (``torch_target``), builds the torch.nn module and copies the same table the
other way. A module whose class overrides torch.nn's forward (or the methods it calls) or that
carries hooks is refused: the map reproduces torch.nn's equations, not custom code.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import nn

from ..models.encoder import Encoder, encoder_controls, paper_controls
from ..operators import LayerNormProjection
from ..time import Evolution, TimeGrid
from ..time.schemes import lie, paper_lie, prenorm
from .weights import (
    Row,
    check_no_hooks,
    check_softmax,
    copy_table,
    network_scheme,
    prefixed,
    source_field,
)

__all__ = ["ACCEPTED", "ENCODER_LAYER_MAP", "PAPER_LAYER_MAP", "TorchConfig", "build_encoder",
           "build_torch", "build_torch_stack", "check_dropouts", "check_plain", "check_uniform",
           "from_torch", "to_torch", "torch_config", "torch_target", "weight_map"]

FORMS = ("network", "paper")
# every torch.nn class from_torch converts (to_torch returns the same classes)
ACCEPTED = (nn.Transformer, nn.TransformerDecoder, nn.TransformerDecoderLayer,
            nn.TransformerEncoder, nn.TransformerEncoderLayer)
_ACCEPTED_NAMES = ", ".join(f"nn.{c.__name__}" for c in ACCEPTED[:-1]) + \
    f" or nn.{ACCEPTED[-1].__name__}"

# self-attention of an encoder or decoder layer (both directions)
ATTENTION_ROWS: tuple[Row, ...] = (
    Row("self_attn.in_proj_weight", "attention.qkv_weight"),
    Row("self_attn.in_proj_bias", "attention.qkv_bias"),
    Row("self_attn.out_proj.weight", "attention.out_weight"),
    Row("self_attn.out_proj.bias", "attention.out_bias"),
    Row("self_attn.dropout", "attention.attn_dropout", attr=True),
    Row("dropout1.p", "attention.out_dropout.p", attr=True),
)
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
# a final LayerNorm (the read-out) of an encoder or decoder
NORM_ROWS: tuple[Row, ...] = (
    Row("norm.weight", "final_norm.weight"),
    Row("norm.bias", "final_norm.bias"),
    Row("norm.eps", "final_norm.eps", attr=True),
)


@dataclass(frozen=True, kw_only=True)
class TorchConfig:
    """A torch.nn encoder or decoder (``kind``: "layer", "encoder", "decoder_layer",
    "decoder") as splitformer reads it: the constructor arguments its layers share, the number
    of layers, the final norm, the form of the map, and the TransformerEncoder switches that
    ``to_torch`` restores. ``activation`` is splitformer's name (relu, gelu, gelu_tanh)."""

    kind: str
    d_model: int
    nhead: int
    dim_feedforward: int
    num_layers: int
    activation: str
    layer_norm_eps: float
    bias: bool
    norm_first: bool
    batch_first: bool
    final_norm: bool = False
    final_norm_bias: bool = True
    form: str = "network"
    enable_nested_tensor: bool = True
    mask_check: bool = True


def weight_map(config: TorchConfig, layer_rows: tuple[Row, ...] | None = None) -> list[Row]:
    """Every row of the module ``config`` describes: layer n's table (``layer_rows``, by
    default the encoder's of the config's form) under ``layers.n`` / theta^n, then the final
    norm's."""
    if layer_rows is None:
        layer_rows = PAPER_LAYER_MAP if config.form == "paper" else ENCODER_LAYER_MAP
    if config.kind in ("layer", "decoder_layer"):
        return prefixed(layer_rows, "", "evolution.controls.sets.0.")
    rows = []
    for n in range(config.num_layers):
        rows += prefixed(layer_rows, f"layers.{n}.", f"evolution.controls.sets.{n}.")
    return rows + (list(NORM_ROWS) if config.final_norm else [])


# -- check ------------------------------------------------------------------------------------
# methods a subclass may override without changing what the module computes
_HARMLESS = frozenset({"__init__", "__setstate__", "__repr__", "extra_repr", "reset_parameters",
                       "_reset_parameters", "generate_square_subsequent_mask"})
_CALLS = frozenset({"forward", "__call__", "_call_impl", "_wrapped_call_impl", "__getattr__"})


def _is_torch(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "torch"


def _guarded(mro: tuple[type, ...]) -> set[str]:
    """The methods whose redefinition changes what a torch.nn module computes: the call path
    and every method of its torch.nn classes but the harmless ones."""
    guarded = set(_CALLS)
    for c in mro:
        if _is_torch(c) and c is not nn.Module:
            guarded |= {k for k, v in vars(c).items() if callable(v) and k not in _HARMLESS}
    return guarded


def _overridden(mod: nn.Module) -> tuple[type, list[str]]:
    """(the torch.nn class ``mod`` derives from, the methods of it its own classes redefine).

    A direct subclass of nn.Module is no torch.nn layer: where the map would use one, the
    structural checks refuse it by type.
    """
    mro = type(mod).__mro__
    own = [c for c in mro if c is not object and not _is_torch(c)]
    base = next(c for c in mro if _is_torch(c))
    if not own or base is nn.Module:
        return base, []
    guarded = _guarded(mro)
    return base, sorted({k for c in own for k in vars(c) if k in guarded})


def _patched(mod: nn.Module) -> list[str]:
    """The methods of ``mod``'s class replaced on the instance itself (``layer.forward = f``,
    ``layer._sa_block = f``): they change what it computes as a subclass would."""
    if _is_torch(type(mod)) and type(mod) is nn.Module:
        return []
    guarded = _guarded(type(mod).__mro__)
    return sorted(k for k in vars(mod) if k in guarded)


def check_uniform(module: nn.Module, target: str = "from_torch") -> None:
    """Refuse (ValueError, naming the parameter) a module whose parameters do not share one
    dtype and one device: torch.nn itself fails on such a module, and the map would cast."""
    params = list(module.named_parameters())
    for attr in ("dtype", "device"):
        values = Counter(getattr(p, attr) for _, p in params)
        if len(values) > 1:
            common = values.most_common(1)[0][0]
            name, p = next((n, p) for n, p in params if getattr(p, attr) != common)
            raise ValueError(f"{target} cannot convert a module with mixed parameter {attr}s: "
                             f"{name} has {attr} {getattr(p, attr)} while the rest has {common} "
                             f"(torch.nn itself fails on it); convert the whole module first "
                             f"(module.to({attr}))")


def check_plain(module: nn.Module, target: str = "from_torch") -> None:
    """Refuse (ValueError) a module tree that the weight map would silently change: a subclass
    of a torch.nn class that redefines ``forward`` or a method it calls (``_sa_block``,
    ``_ff_block``, ...), the same methods replaced on an instance (``layer.forward = f``), any
    registered hook that changes what it computes or saves (forward, pre-forward, backward,
    state-dict), or parameters of mixed dtypes or devices (``check_uniform``).

    Parametrizations (``torch.nn.utils.parametrize``) are accepted: the map reads the weight
    they compute, by value.
    """
    for path, mod in module.named_modules():
        if "parametrizations" in path.split("."):
            continue
        where = path or "the module"
        base, names = _overridden(mod)
        if names:
            raise ValueError(f"{target} cannot convert {where} of class {type(mod).__name__}: it "
                             f"overrides {', '.join(names)} of {base.__module__}.{base.__name__}"
                             " (the map reproduces torch.nn's computation, not a custom one)")
        patched = _patched(mod)
        if patched:
            raise ValueError(f"{target} cannot convert {where} ({type(mod).__name__}): "
                             f"{', '.join(patched)} is replaced on the instance (an attribute "
                             "set on the module, e.g. layer.forward = f); the map reproduces "
                             "torch.nn's computation, not a custom one: delete the attribute")
    check_no_hooks(module, target)
    check_uniform(module, target)


def activation_name(layer: nn.Module) -> str:
    """splitformer's name of a torch.nn layer's activation (relu, gelu, gelu_tanh)."""
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    if isinstance(act, nn.GELU) and act.approximate == "tanh":
        return "gelu_tanh"
    raise ValueError(
        f"activation={act!r} is not supported for conversion: use 'relu' or 'gelu' "
        "(F.relu, F.gelu, nn.ReLU(), nn.GELU(), nn.GELU(approximate='tanh'))"
    )


def check_attention(attn: nn.MultiheadAttention, what: str) -> None:
    """The map handles MultiheadAttention with packed in_proj and no extra keys."""
    if not attn._qkv_same_embed_dim:
        raise ValueError(f"{what} with kdim/vdim != embed_dim is not supported")
    if attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError(f"{what} with add_bias_kv or add_zero_attn is not supported")


def check_dropouts(layer: nn.Module, names: tuple[str, ...], prefix: str = "") -> None:
    """The layer's dropouts ``names`` are nn.Dropout (their rate ``p`` is an attribute row);
    ``prefix`` is the layer's path in the module, named in the error."""
    for nm in names:
        d = getattr(layer, nm, None)
        if not isinstance(d, nn.Dropout):
            raise ValueError(f"{prefix}{nm} must be nn.Dropout (the map reads its rate p), got "
                             f"{type(d).__name__}")


def check_norms(layer: nn.Module, names: tuple[str, ...]) -> None:
    """The layer's norms ``names`` are affine nn.LayerNorms (the projections P_i)."""
    for nm in names:
        norm = getattr(layer, nm)
        if not isinstance(norm, nn.LayerNorm) or not norm.elementwise_affine:
            raise ValueError(f"{nm}={norm!r}: must be nn.LayerNorm with elementwise_affine=True")


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


def layer_fields(layer: nn.Module, attn: nn.MultiheadAttention) -> dict[str, Any]:
    """The constructor arguments of a torch.nn encoder or decoder layer (and its dtype and
    device, which every layer must share too)."""
    p = next(layer.parameters())
    return {
        "d_model": attn.embed_dim,
        "nhead": attn.num_heads,
        "dim_feedforward": layer.linear1.out_features,
        "activation": activation_name(layer),
        "layer_norm_eps": float(layer.norm1.eps),
        "bias": layer.linear1.bias is not None,
        "norm_first": bool(layer.norm_first),
        "batch_first": bool(attn.batch_first),
        "dtype": p.dtype,
        "device": p.device,
    }


def shared_fields(fields: list[dict[str, Any]], what: str = "layer") -> dict[str, Any]:
    """Layer 0's fields, after checking that every layer agrees on all but ``layer_norm_eps``
    (each layer's eps is copied on its own)."""
    first = fields[0]
    for i, f in enumerate(fields[1:], start=1):
        diff = [k for k in first if k != "layer_norm_eps" and f[k] != first[k]]
        if diff:
            raise ValueError(f"{what} {i} differs from layer 0 in {diff}: layers must share them")
    return {k: v for k, v in first.items() if k not in ("dtype", "device")}


def check_final_norm(norm: nn.Module | None) -> None:
    """A final norm (the read-out) is absent or an affine nn.LayerNorm."""
    if norm is not None and (not isinstance(norm, nn.LayerNorm) or not norm.elementwise_affine):
        raise ValueError(f"norm={norm!r}: only nn.LayerNorm with elementwise_affine=True")


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
                    "mask_check": bool(getattr(module, "mask_check", True))}
    else:
        raise TypeError("torch_config(module) expects nn.TransformerEncoder or "
                        f"nn.TransformerEncoderLayer, got {type(module).__name__}")
    check_plain(module)
    single = switches["kind"] == "layer"
    fields = shared_fields([_layer_fields(layer, "" if single else f"layers.{i}.")
                            for i, layer in enumerate(layers)])
    norm = getattr(module, "norm", None)
    check_final_norm(norm)
    config = TorchConfig(num_layers=len(layers), final_norm=norm is not None,
                         final_norm_bias=norm is None or norm.bias is not None, form=form,
                         **fields, **switches)
    if form == "paper":
        _check_paper(config, layers)
    return config


# -- build --------------------------------------------------------------------------------------
def final_norm(config: TorchConfig, **kw: Any) -> LayerNormProjection | None:
    """Our read-out LayerNorm of ``config`` (None without one); eps comes with the table."""
    if not config.final_norm:
        return None
    return LayerNormProjection(config.d_model, bias=config.final_norm_bias, **kw)


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


def torch_activation(name: str) -> str | nn.Module:
    """The ``activation`` argument of a torch.nn layer for splitformer's ``name``."""
    if name in ("relu", "gelu"):
        return name
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    raise ValueError(f"to_torch supports the activations relu, gelu and gelu_tanh, got {name!r}")


def build_torch(config: TorchConfig, *, device=None, dtype=None) -> nn.Module:
    """The torch.nn encoder (or layer) of ``config``, random weights, dropout 0 (the rates come
    with the table)."""
    return build_torch_stack(config, nn.TransformerEncoderLayer, nn.TransformerEncoder, "layer",
                             device=device, dtype=dtype,
                             enable_nested_tensor=config.enable_nested_tensor,
                             mask_check=config.mask_check)


def build_torch_stack(config: TorchConfig, layer_cls: type[nn.Module], stack_cls: type[nn.Module],
                      single: str, *, device=None, dtype=None, **stack_options) -> nn.Module:
    """A torch.nn layer of ``layer_cls`` (when ``config.kind == single``) or a ``stack_cls`` of
    ``config.num_layers`` of them with the optional final norm; random weights, dropout 0."""
    layer = layer_cls(
        config.d_model, config.nhead, config.dim_feedforward, dropout=0.0,
        activation=torch_activation(config.activation), layer_norm_eps=config.layer_norm_eps,
        batch_first=config.batch_first, norm_first=config.norm_first, bias=config.bias,
        device=device, dtype=dtype)
    if config.kind == single:
        return layer
    norm = None
    if config.final_norm:
        norm = nn.LayerNorm(config.d_model, bias=config.final_norm_bias, device=device,
                            dtype=dtype)
    return stack_cls(layer, config.num_layers, norm=norm, **stack_options)


# -- the two maps -------------------------------------------------------------------------------
def from_torch(module: nn.Module, *, form: str = "network") -> Encoder:
    """Map an nn.TransformerEncoder(Layer) onto controls and a scheme (nn.Transformer and the
    decoder classes go to ``torch_transformer.from_torch_transformer``).

    form="network": post-LN -> the Lie scheme with the FFN as a vector field; pre-LN -> the
    pre-norm scheme. form="paper": the paper's literal scheme (post-LN, ReLU, scalar LayerNorm
    gains and biases, eps = 0 are required; weights become the W_j of the (I + W_j) form).
    """
    if form not in FORMS:
        raise ValueError(f"form must be 'network' or 'paper', got {form!r}")
    if not isinstance(module, ACCEPTED):
        raise TypeError(f"from_torch(module) expects {_ACCEPTED_NAMES}, got "
                        f"{type(module).__name__}")
    if isinstance(module, (nn.Transformer, nn.TransformerDecoder, nn.TransformerDecoderLayer)):
        from .torch_transformer import from_torch_transformer

        if form != "network":
            raise ValueError(f"form={form!r} is for encoders: {type(module).__name__} has only "
                             "the network form")
        return from_torch_transformer(module)
    config = torch_config(module, form=form)
    p = next(module.parameters())
    model = build_encoder(config, device=p.device, dtype=p.dtype)
    copy_table(weight_map(config), theirs=module, ours=model, into="ours")
    model.train(module.training)
    return model


def num_ffn_stages(theta: nn.ModuleDict) -> int:
    """J of a control set: the stages of its FeedForward, or its ffn1..ffnJ (paper form)."""
    if "ffn" in theta:
        return theta["ffn"].num_stages
    return sum(1 for k in theta.keys() if k.startswith("ffn") and k[3:].isdigit())


def check_two_stages(theta: nn.ModuleDict, where: str = "") -> None:
    """torch.nn's layers have J = 2 feed-forward stages (linear1, linear2)."""
    j = num_ffn_stages(theta)
    if j != 2:
        at = f" in {where}" if where else ""
        raise ValueError(f"to_torch needs J = 2 feed-forward stages (linear1, linear2 of a "
                         f"torch.nn layer){at}, got J = {j}")


def torch_target(model: Encoder) -> TorchConfig:
    """The ``TorchConfig`` of the torch.nn module that holds ``model``: read from its operators,
    its scheme and its source (ValueError if it is not a network torch.nn can hold)."""
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
    layer = source_field(src, "kind") == "layer" and L == 1 and model.final_norm is None
    return TorchConfig(
        kind="layer" if layer else "encoder", d_model=a0.dim, nhead=a0.num_heads,
        dim_feedforward=ff, num_layers=L, activation=act, layer_norm_eps=eps, bias=bias,
        norm_first=name == "prenorm", batch_first=model.batch_first,
        final_norm=model.final_norm is not None,
        final_norm_bias=model.final_norm is None or model.final_norm.bias is not None,
        form="paper" if name == "paper" else "network",
        enable_nested_tensor=source_field(src, "enable_nested_tensor", True),
        mask_check=source_field(src, "mask_check", True))


def to_torch(model: Encoder) -> nn.Module:
    """The nn.TransformerEncoder (or Layer) with the same weights: the inverse map (decoders and
    pairs go to ``torch_transformer.to_torch_transformer``)."""
    from ..models.seq2seq import CrossDecoder, EncoderDecoderModel

    kind = source_field(getattr(model, "source", None), "kind")
    if kind in ("transformer", "decoder", "decoder_layer") or \
            isinstance(model, (CrossDecoder, EncoderDecoderModel)):
        from .torch_transformer import to_torch_transformer

        return to_torch_transformer(model)
    if not isinstance(model, Encoder):
        raise TypeError(f"to_torch(model) expects a splitformer Encoder, CrossDecoder or "
                        f"EncoderDecoderModel (as from_torch makes them from {_ACCEPTED_NAMES}), "
                        f"got {type(model).__name__}")
    config = torch_target(model)
    p = model.evolution.controls[0]["attention"].qkv_weight
    out = build_torch(config, device=p.device, dtype=p.dtype)
    copy_table(weight_map(config), theirs=out, ours=model, into="theirs")
    out.train(model.training)
    return out
