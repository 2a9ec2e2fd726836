"""timm VisionTransformer <-> splitformer: a pure weight map, both ways.

The library never imports timm to convert from it: ``from_timm_model`` reads the module's
attributes and tensors. ``to_timm_model`` imports timm lazily, only to build the target.

A timm VisionTransformer is the ViT model of ``splitformer.models.vit``; its options are
choices of operator and read-out:

* ``class_token``, ``reg_tokens``: extra points of Omega_x (prefix points) whose initial value is
  a learned constant; ``no_embed_class``: the position embedding lives on the patch points only;
  ``pos_embed='none'``: no position embedding;
* ``pre_norm``: a LayerNorm of the initial condition f (``norm_pre``; the patch embedding then
  has no bias);
* blocks: explicit Euler for u_t = A(P1 u) + G(P2 u) (scheme ``prenorm``); ``init_values``
  (LayerScale) adds the diagonal operators ls1, ls2 as ``post`` operators: per-feature steps
  tau(y) = tau gamma(y) (scheme ``prenorm_layerscale``); ``qkv_bias`` / ``proj_bias``: biases
  of the Q/K/V and of the W_O / feed-forward feature integrals;
* read-out: ``norm`` (final LayerNorm) or, with ``fc_norm``, a LayerNorm after pooling;
  ``global_pool`` 'token' / 'avg' / 'max' / 'avgmax' / '' (``pool_include_prefix``); ``head``.

Weight map (timm name -> splitformer name; block n -> theta^n = evolution.controls.sets[n]):

    patch_embed.proj.weight/bias   -> embedding.patch.weight/bias
    cls_token                      -> embedding.class_token
    reg_token                      -> embedding.register_tokens
    pos_embed                      -> embedding.position
    norm_pre.weight/bias           -> embedding.pre_norm.weight/bias
    blocks.n.norm1.weight/bias     -> theta^n norm1.weight/bias               (P1)
    blocks.n.attn.qkv.weight/bias  -> theta^n attention.qkv_weight/qkv_bias
    blocks.n.attn.proj.weight/bias -> theta^n attention.out_weight/out_bias   (W_O)
    blocks.n.ls1.gamma             -> theta^n ls1.gamma                       (tau_1(y) / tau)
    blocks.n.norm2.weight/bias     -> theta^n norm2.weight/bias               (P2)
    blocks.n.mlp.fc1 / fc2         -> theta^n ffn.stages[0] / ffn.stages[1]
    blocks.n.ls2.gamma             -> theta^n ls2.gamma
    norm.weight/bias               -> final_norm.weight/bias
    fc_norm.weight/bias            -> fc_norm.weight/bias
    head.weight/bias               -> head.weight/bias

Not supported (ValueError naming the option): global_pool 'map' / 'prr' (attention pooling),
dynamic_img_size, dynamic_img_pad, patch_drop_rate > 0, drop_path_rate > 0, qk_norm,
scale_attn_norm, scale_mlp_norm, gated attention, attn_layer other than Attention, block_fn
other than Block, mlp_layer other than Mlp, embed_norm_layer, embed_layer other than PatchEmbed,
norm layers other than affine LayerNorm with bias, activations other than GELU (erf or tanh),
ReLU, SiLU, Tanh, and subclasses of VisionTransformer (distilled, ...).

``from_timm_model`` is check -> config (``timm_config``: a ``TimmViTConfig``, kept as the
model's ``source``) -> build -> copy; dropout rates and eps are attribute rows of the weight
table, copied both ways.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from ..models.base import Source
from ..models.vit import ViT, build_vit, vit_scheme
from ..operators import FeatureIntegral
from .weights import Row, check_covered, check_softmax, copy_table, network_scheme, prefixed

__all__ = ["TimmViTConfig", "build", "from_timm_model", "timm_config", "to_timm_model",
           "weight_map"]

_POOLS = ("", "token", "avg", "max", "avgmax")
_ACTIVATIONS = {"GELUTanh": "gelu_tanh", "ReLU": "relu", "SiLU": "silu", "Tanh": "tanh"}


@dataclass(frozen=True, kw_only=True)
class TimmViTConfig(Source):
    """A timm VisionTransformer as splitformer reads it: the constructor arguments that rebuild
    it (``kwargs``), the norm and activation classes (module and name, imported only by
    ``to_timm``) with the one norm eps, and what fixes our operators beyond ``kwargs``; a
    ``Source`` of kind "timm"."""

    kind: ClassVar[str] = "timm"

    timm_class: str = "VisionTransformer"
    kwargs: dict[str, Any]
    norm_eps: float
    norm_layer: dict[str, str] | None
    act_layer: dict[str, Any]
    activation: str
    hidden_dim: int
    patch_bias: bool
    final_norm: bool  # ``norm`` is a LayerNorm (kwargs' final_norm also holds with fc_norm)


_LAYER_ROWS: tuple[Row, ...] = (
    Row("attn.qkv.weight", "attention.qkv_weight"), Row("attn.qkv.bias", "attention.qkv_bias"),
    Row("attn.proj.weight", "attention.out_weight"), Row("attn.proj.bias", "attention.out_bias"),
    Row("norm1.weight", "norm1.weight"), Row("norm1.bias", "norm1.bias"),
    Row("norm2.weight", "norm2.weight"), Row("norm2.bias", "norm2.bias"),
    Row("mlp.fc1.weight", "ffn.stages.0.weight"), Row("mlp.fc1.bias", "ffn.stages.0.bias"),
    Row("mlp.fc2.weight", "ffn.stages.1.weight"), Row("mlp.fc2.bias", "ffn.stages.1.bias"),
    Row("norm1.eps", "norm1.eps", attr=True), Row("norm2.eps", "norm2.eps", attr=True),
    Row("attn.attn_drop.p", "attention.attn_dropout", attr=True, absent=0.0),
    Row("attn.proj_drop.p", "attention.out_dropout.p", attr=True, absent=0.0),
    Row("mlp.drop1.p", "ffn.dropout.p", attr=True, absent=0.0),
    Row("mlp.drop2.p", "ffn.out_dropout.p", attr=True, absent=0.0),
)
_LAYER_SCALE_ROWS = (Row("ls1.gamma", "ls1.gamma"), Row("ls2.gamma", "ls2.gamma"))


def weight_map(model: ViT) -> list[Row]:
    """Every row (tensors and attributes) of ``model``: one table for both directions."""
    rows = [Row("patch_embed.proj.weight", "embedding.patch.weight"),
            Row("patch_embed.proj.bias", "embedding.patch.bias"),
            Row("cls_token", "embedding.class_token"),
            Row("reg_token", "embedding.register_tokens"),
            Row("pos_embed", "embedding.position"),
            Row("pos_drop.p", "embedding.dropout.p", attr=True, absent=0.0),
            Row("head_drop.p", "head_dropout.p", attr=True, absent=0.0)]
    if model.embedding.pre_norm is not None:
        rows += [Row("norm_pre.weight", "embedding.pre_norm.weight"),
                 Row("norm_pre.bias", "embedding.pre_norm.bias"),
                 Row("norm_pre.eps", "embedding.pre_norm.eps", attr=True)]
    for n, theta in enumerate(model.evolution.controls):
        table = _LAYER_ROWS + (_LAYER_SCALE_ROWS if "ls1" in theta else ())
        rows += prefixed(table, f"blocks.{n}.", f"evolution.controls.sets.{n}.")
    for timm_name, name in (("norm", "final_norm"), ("fc_norm", "fc_norm")):
        if getattr(model, name) is not None:
            rows += [Row(f"{timm_name}.weight", f"{name}.weight"),
                     Row(f"{timm_name}.bias", f"{name}.bias"),
                     Row(f"{timm_name}.eps", f"{name}.eps", attr=True)]
    if isinstance(model.head, FeatureIntegral):  # a linear classifier (not Identity, not None)
        rows += [Row("head.weight", "head.weight"), Row("head.bias", "head.bias")]
    return rows


# -- check ------------------------------------------------------------------------------------
def _name(m: Any) -> str:
    return type(m).__name__


def _is_identity(m: Any) -> bool:
    return m is None or isinstance(m, nn.Identity)


def _class_ref(m: Any) -> dict[str, str]:
    return {"module": type(m).__module__, "name": type(m).__name__}


def _activation(act: nn.Module) -> str:
    name = _name(act)
    if name == "GELU":
        approx = getattr(act, "approximate", "none")
        return "gelu" if approx == "none" else "gelu_tanh"
    if name not in _ACTIVATIONS:
        raise ValueError(f"act_layer={name} is not supported; supported: GELU, GELUTanh, ReLU, "
                         "SiLU, Tanh")
    return _ACTIVATIONS[name]


def _norm(m: Any, where: str) -> float | None:
    """eps of a supported LayerNorm, None for an identity; ValueError otherwise."""
    if _is_identity(m):
        return None
    if not isinstance(m, nn.LayerNorm) or _name(m) != "LayerNorm":
        raise ValueError(f"norm_layer={_name(m)} at {where} is not supported (only LayerNorm)")
    if not m.elementwise_affine or m.bias is None:
        raise ValueError(f"norm_layer at {where} must be an affine LayerNorm with bias")
    if len(m.normalized_shape) != 1:
        raise ValueError(f"norm_layer at {where} must normalise the last dimension only")
    return float(m.eps)


def _dropout_p(m: Any) -> float:
    return float(m.p) if isinstance(m, nn.Dropout) else 0.0


def _block_rates(blk: nn.Module) -> tuple[float, ...]:
    return (_dropout_p(blk.attn.attn_drop), _dropout_p(blk.attn.proj_drop),
            _dropout_p(blk.mlp.drop1), _dropout_p(blk.mlp.drop2))


def _check_block(i: int, blk: nn.Module, dim: int) -> None:
    where = f"blocks.{i}"
    if _name(blk) != "Block":
        raise ValueError(f"block_fn={_name(blk)} ({where}) is not supported; only Block (pre-LN)")
    attn, mlp = blk.attn, blk.mlp
    if _name(attn) != "Attention":
        raise ValueError(f"attn_layer={_name(attn)} ({where}) is not supported; only Attention")
    if not (_is_identity(attn.q_norm) and _is_identity(attn.k_norm)):
        raise ValueError(f"qk_norm=True ({where}) is not supported")
    if not _is_identity(getattr(attn, "norm", None)):
        raise ValueError(f"scale_attn_norm=True ({where}) is not supported")
    if getattr(attn, "gate", None) is not None:
        raise ValueError(f"gated attention ({where}) is not supported")
    if attn.num_heads * attn.head_dim != dim or attn.qkv.out_features != 3 * dim or \
            attn.proj.out_features != dim:
        raise ValueError(f"attn_head_dim / dim_out ({where}): heads x head_dim must equal "
                         f"embed_dim={dim}")
    if _name(mlp) != "Mlp":
        raise ValueError(f"mlp_layer={_name(mlp)} ({where}) is not supported; only Mlp")
    if not isinstance(mlp.fc1, nn.Linear) or not isinstance(mlp.fc2, nn.Linear):
        raise ValueError(f"Mlp with use_conv=True ({where}) is not supported")
    if not _is_identity(mlp.norm):
        raise ValueError(f"scale_mlp_norm=True ({where}) is not supported")
    if (mlp.fc1.bias is None) != (mlp.fc2.bias is None) or \
            (mlp.fc1.bias is None) != (attn.proj.bias is None):
        raise ValueError(f"proj_bias must be the same for attn.proj, mlp.fc1 and mlp.fc2 "
                         f"({where})")
    for nm in ("drop_path1", "drop_path2"):
        if not _is_identity(getattr(blk, nm)):
            raise ValueError(f"drop_path_rate > 0 ({where}.{nm}) is not supported (stochastic "
                             "depth is random in training; build with drop_path_rate=0)")
    for nm in ("ls1", "ls2"):
        ls = getattr(blk, nm)
        if not _is_identity(ls) and _name(ls) != "LayerScale":
            raise ValueError(f"{where}.{nm}={_name(ls)} is not supported (only LayerScale)")


def _check_model(model: nn.Module) -> None:
    """The options outside the blocks: class, patch embedding, pooling, patch dropout, head."""
    if _name(model) != "VisionTransformer":
        raise TypeError(f"from_timm supports timm VisionTransformer (not subclasses), got "
                        f"{_name(model)}")
    if getattr(model, "dynamic_img_size", False):
        raise ValueError("dynamic_img_size=True is not supported")
    pe = model.patch_embed
    if _name(pe) != "PatchEmbed":
        raise ValueError(f"embed_layer={_name(pe)} is not supported; only PatchEmbed")
    if getattr(pe, "dynamic_img_pad", False):
        raise ValueError("dynamic_img_pad=True is not supported")
    if not getattr(pe, "strict_img_size", True) or not getattr(pe, "flatten", True) or \
            pe.img_size is None:
        raise ValueError("PatchEmbed must have a fixed img_size (strict_img_size, flatten)")
    if not _is_identity(pe.norm):
        raise ValueError("embed_norm_layer is not supported")
    proj = pe.proj
    if tuple(proj.stride) != tuple(proj.kernel_size) or tuple(proj.padding) != (0, 0) or \
            tuple(proj.dilation) != (1, 1) or proj.groups != 1:
        raise ValueError("patch_embed.proj must be a Conv2d with stride = kernel, no padding")
    if getattr(model, "attn_pool", None) is not None:
        raise ValueError(f"global_pool={model.global_pool!r} (attention pooling) is not "
                         "supported")
    if model.global_pool not in _POOLS:
        raise ValueError(f"global_pool={model.global_pool!r} is not supported; supported: "
                         f"{_POOLS}")
    if not _is_identity(model.patch_drop):
        raise ValueError("patch_drop_rate > 0 is not supported")
    if not isinstance(model.head, (nn.Linear, nn.Identity)):
        raise ValueError(f"head={_name(model.head)} is not supported (Linear or Identity)")
    if not len(model.blocks):
        raise ValueError("depth=0: a VisionTransformer without blocks has no evolution")


def _check_blocks_agree(blocks: list[nn.Module]) -> None:
    """What to_timm rebuilds from one constructor argument must be the same in every block."""
    b0 = blocks[0]
    act = _activation(b0.mlp.act)
    ls = not _is_identity(b0.ls1)
    for i, blk in enumerate(blocks):
        if _name(blk.mlp.act) != _name(b0.mlp.act) or _activation(blk.mlp.act) != act:
            raise ValueError(f"blocks.{i}: act_layer differs from blocks.0")
        if (not _is_identity(blk.ls1)) != ls or (not _is_identity(blk.ls2)) != ls:
            raise ValueError("init_values: LayerScale must be on ls1 and ls2 of every block or "
                             "none")
        if _name(blk.norm1) != _name(b0.norm1):
            raise ValueError("norm_layer must be the same in every block")
        if blk.mlp.fc1.out_features != b0.mlp.fc1.out_features:
            raise ValueError("mlp hidden width must be the same in every block")
    rates = {_block_rates(b) for b in blocks}
    if len(rates) > 1:  # to_timm rebuilds every block from one set of rates
        raise ValueError(f"attn_drop_rate / proj_drop_rate must be the same in every block, got "
                         f"{sorted(rates)}")


def _norms(model: nn.Module, blocks: list[nn.Module]) -> tuple[float, dict[str, str] | None]:
    """The one eps of every LayerNorm and the norm class (ValueError if they differ)."""
    eps_values: dict[str, float] = {}
    norm_class = None
    named = [("norm_pre", model.norm_pre), ("norm", model.norm), ("fc_norm", model.fc_norm)]
    for i, blk in enumerate(blocks):
        named += [(f"blocks.{i}.norm1", blk.norm1), (f"blocks.{i}.norm2", blk.norm2)]
    for where, m in named:
        eps = _norm(m, where)
        if eps is not None:
            eps_values[where] = eps
            norm_class = norm_class or _class_ref(m)
    if len(set(eps_values.values())) > 1:
        raise ValueError(f"norm_layer eps must be the same everywhere, got {eps_values}")
    return eps_values["blocks.0.norm1"], norm_class


# -- config, build, copy ------------------------------------------------------------------------
def _kwargs(model: nn.Module, b0: nn.Module, mlp_ratio: float) -> dict[str, Any]:
    """The VisionTransformer constructor arguments that rebuild ``model``."""
    pe = model.patch_embed
    has_fc = not _is_identity(model.fc_norm)
    return {
        "img_size": tuple(pe.img_size),
        "patch_size": tuple(pe.patch_size),
        "in_chans": pe.proj.in_channels,
        "num_classes": model.head.out_features if isinstance(model.head, nn.Linear) else 0,
        "global_pool": model.global_pool,
        "embed_dim": model.embed_dim,
        "depth": len(model.blocks),
        "num_heads": b0.attn.num_heads,
        "mlp_ratio": mlp_ratio,
        "qkv_bias": b0.attn.qkv.bias is not None,
        "proj_bias": b0.attn.proj.bias is not None,
        "init_values": None if _is_identity(b0.ls1) else float(b0.ls1.init_values),
        "class_token": model.cls_token is not None,
        "pos_embed": "none" if model.pos_embed is None else "learn",
        "no_embed_class": bool(model.no_embed_class),
        "reg_tokens": int(model.num_reg_tokens),
        "pre_norm": not _is_identity(model.norm_pre),
        "final_norm": not _is_identity(model.norm) or has_fc,
        "fc_norm": has_fc,
        "pool_include_prefix": bool(getattr(model, "pool_include_prefix", False)),
        "drop_rate": _dropout_p(model.head_drop),
        "pos_drop_rate": _dropout_p(model.pos_drop),
        "proj_drop_rate": _dropout_p(b0.attn.proj_drop),
        "attn_drop_rate": _dropout_p(b0.attn.attn_drop),
    }


def timm_config(model: nn.Module) -> TimmViTConfig:
    """Check a timm VisionTransformer (ValueError naming the first unsupported option) and
    read its typed config."""
    _check_model(model)
    blocks = list(model.blocks)
    for i, blk in enumerate(blocks):
        _check_block(i, blk, model.embed_dim)
    _check_blocks_agree(blocks)
    eps, norm_class = _norms(model, blocks)
    b0 = blocks[0]
    hidden = b0.mlp.fc1.out_features
    mlp_ratio = hidden / model.embed_dim
    if int(model.embed_dim * mlp_ratio) != hidden:
        raise ValueError(f"mlp hidden width {hidden} is not int(embed_dim * mlp_ratio) for any "
                         "float mlp_ratio: cannot record it")
    return TimmViTConfig(
        kwargs=_kwargs(model, b0, mlp_ratio),
        norm_eps=eps,
        norm_layer=norm_class,
        act_layer={**_class_ref(b0.mlp.act),
                   "approximate": getattr(b0.mlp.act, "approximate", None)},
        activation=_activation(b0.mlp.act),
        hidden_dim=hidden,
        patch_bias=model.patch_embed.proj.bias is not None,
        final_norm=not _is_identity(model.norm),
    )


def build(config: TimmViTConfig, *, device=None, dtype=None) -> ViT:
    """The splitformer ViT (timm's read-out) of ``config`` with random weights; ``source`` =
    ``config``. Dropout rates and eps come with the weight table."""
    kw = config.kwargs
    return build_vit(
        image_size=kw["img_size"],
        patch_size=kw["patch_size"],
        in_chans=kw["in_chans"],
        dim=kw["embed_dim"],
        depth=kw["depth"],
        num_heads=kw["num_heads"],
        hidden_dim=config.hidden_dim,
        qkv_bias=kw["qkv_bias"],
        proj_bias=kw["proj_bias"],
        patch_bias=config.patch_bias,
        activation=config.activation,
        norm_eps=config.norm_eps,
        layer_scale=None if kw["init_values"] is None else 1.0,
        class_token=kw["class_token"],
        reg_tokens=kw["reg_tokens"],
        position=kw["pos_embed"] != "none",
        position_prefix=not kw["no_embed_class"],
        pre_norm=kw["pre_norm"],
        final_norm=config.final_norm,
        pool=kw["global_pool"],
        pool_include_prefix=kw["pool_include_prefix"],
        fc_norm=kw["fc_norm"],
        num_classes=kw["num_classes"],
        read_out="timm",
        source=config,
        device=device,
        dtype=dtype,
    )


def from_timm_model(model: nn.Module, **kwargs) -> ViT:
    """A splitformer ViT whose forward returns what timm's ``model(x)`` returns.

    ``forward_features(x)``, ``forward_head(u, pre_logits)`` and ``outputs(x)`` (a ViTOutput
    with last_hidden_state, pooler_output, logits) are there too.
    """
    if kwargs:
        raise TypeError(f"from_timm_model takes no options, got {sorted(kwargs)}")
    config = timm_config(model)
    p = model.patch_embed.proj.weight
    out = build(config, device=p.device, dtype=p.dtype)
    rows = weight_map(out)
    check_covered(model.state_dict(), rows, "timm VisionTransformer")
    copy_table(rows, theirs=model, ours=out, into="ours")
    out.train(model.training)
    return out


def _resolve_class(ref: dict[str, str] | None):
    if not ref:
        return None
    return getattr(importlib.import_module(ref["module"]), ref["name"])


def _timm_kwargs(config: TimmViTConfig) -> dict[str, Any]:
    """The constructor arguments, with the norm and activation classes resolved."""
    kwargs = dict(config.kwargs)
    norm_cls = _resolve_class(config.norm_layer)
    if norm_cls is not None:
        kwargs["norm_layer"] = functools.partial(norm_cls, eps=config.norm_eps)
    act = config.act_layer or {}
    act_cls = _resolve_class(act)
    if act_cls is not None:
        if act.get("approximate") is not None and act["name"] == "GELU" and \
                act["module"].startswith("torch."):
            kwargs["act_layer"] = functools.partial(act_cls, approximate=act["approximate"])
        else:
            kwargs["act_layer"] = act_cls
    return kwargs


def to_timm_model(model: ViT) -> nn.Module:
    """The timm VisionTransformer with the same weights (needs timm; imported here only)."""
    try:
        from timm.models.vision_transformer import VisionTransformer
    except Exception as e:  # missing, or a broken install (e.g. torchvision that does not load)
        raise ImportError(
            "to_timm(model) needs timm installed and importable (pip install timm); importing "
            f"it failed: {type(e).__name__}: {e}"
        ) from e
    if not isinstance(model, ViT):
        raise TypeError(f"to_timm_model expects a splitformer ViT, got {type(model).__name__}")
    if not model.embedding.on_base_grid:
        raise ValueError("to_timm(model): the model evaluates on another patch grid than its "
                         "parameters were made on (with_patch_size / with_image_size); export "
                         "the model it was derived from")
    config = model.source
    if not isinstance(config, TimmViTConfig) or config.timm_class != "VisionTransformer":
        raise ValueError("to_timm(model) needs a model made by from_timm (model.source is a "
                         f"{type(config).__name__}, not a TimmViTConfig)")
    evo = model.evolution
    want = vit_scheme(config.kwargs.get("init_values") is not None)
    network_scheme(evo, {want.name: want}, "to_timm")
    check_softmax(evo, "to_timm")
    if len(evo.controls) != config.kwargs["depth"]:
        raise ValueError(f"to_timm: the model has {len(evo.controls)} steps, its source "
                         f"depth={config.kwargs['depth']}; a coarsened ViT is not exported to "
                         "timm (export it with to_hf, or the model it came from)")
    p = model.embedding.patch.weight
    tm = VisionTransformer(**_timm_kwargs(config), weight_init="skip", device=p.device,
                           dtype=p.dtype)
    copy_table(weight_map(model), theirs=tm, ours=model, into="theirs")
    tm.train(model.training)
    return tm
