"""What the torch.nn weight maps share: the typed config, the rows every layer has, the checks
and the builders of torch.nn stacks (no map lives here).

``TorchConfig`` is a torch.nn encoder or decoder as splitformer reads it (and the ``source`` of
the model built from it). ``ATTENTION_ROWS`` is the self-attention table of an encoder or
decoder layer, ``NORM_ROWS`` the final norm (the read-out); ``stack_rows(config, layer_rows)``
places layer n's table under ``layers.n`` / theta^n. The checks refuse what a map would silently
change (``check_plain``: overridden or patched methods, hooks, mixed dtypes or devices) and read
a layer's constructor arguments (``layer_fields``, ``shared_fields``). ``interop.torch_encoder``
and ``interop.torch_decoder`` both import this module and never each other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import nn

from ..models.base import Source
from ..operators import LayerNormProjection
from .weights import Row, check_no_hooks, prefixed

__all__ = ["ATTENTION_ROWS", "NORM_ROWS", "TorchConfig", "activation_name", "build_torch_stack",
           "check_attention", "check_dropouts", "check_final_norm", "check_norms", "check_plain",
           "check_two_stages", "check_uniform", "final_norm", "layer_fields", "num_ffn_stages",
           "shared_fields", "stack_rows", "torch_activation"]

# self-attention of an encoder or decoder layer (both directions)
ATTENTION_ROWS: tuple[Row, ...] = (
    Row("self_attn.in_proj_weight", "attention.qkv_weight"),
    Row("self_attn.in_proj_bias", "attention.qkv_bias"),
    Row("self_attn.out_proj.weight", "attention.out_weight"),
    Row("self_attn.out_proj.bias", "attention.out_bias"),
    Row("self_attn.dropout", "attention.attn_dropout", attr=True),
    Row("dropout1.p", "attention.out_dropout.p", attr=True),
)
# a final LayerNorm (the read-out) of an encoder or decoder
NORM_ROWS: tuple[Row, ...] = (
    Row("norm.weight", "final_norm.weight"),
    Row("norm.bias", "final_norm.bias"),
    Row("norm.eps", "final_norm.eps", attr=True),
)


@dataclass(frozen=True, kw_only=True)
class TorchConfig(Source):
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


def stack_rows(config: TorchConfig, layer_rows: tuple[Row, ...]) -> list[Row]:
    """Every row of the module ``config`` describes: layer n's table ``layer_rows`` under
    ``layers.n`` / theta^n (a single layer: no prefix), then the final norm's."""
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


# -- build --------------------------------------------------------------------------------------
def final_norm(config: TorchConfig, **kw: Any) -> LayerNormProjection | None:
    """Our read-out LayerNorm of ``config`` (None without one); eps comes with the table."""
    if not config.final_norm:
        return None
    return LayerNormProjection(config.d_model, bias=config.final_norm_bias, **kw)


def torch_activation(name: str) -> str | nn.Module:
    """The ``activation`` argument of a torch.nn layer for splitformer's ``name``."""
    if name in ("relu", "gelu"):
        return name
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    raise ValueError(f"to_torch supports the activations relu, gelu and gelu_tanh, got {name!r}")


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


# -- the layers to_torch can hold ---------------------------------------------------------------
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
