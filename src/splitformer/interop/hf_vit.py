"""Hugging Face ViT <-> splitformer: a pure weight map, both ways.

``ViTModel`` (with or without its pooler) and ``ViTForImageClassification`` are the ViT model of
``splitformer.models.vit``: the initial condition f on the 2-D patch grid (patch embedding,
class token, position embeddings, dropout), the pre-LN scheme (explicit Euler for
u_t = A(P1 u) + G(P2 u), split in two) with T = L, tau = 1, and the read-out (final LayerNorm,
then the pooler dense + tanh on the class token, or the classifier on the class token).

Weight map (HF name -> splitformer name; layer n -> theta^n = evolution.controls.sets[n]):

    embeddings.patch_embeddings.projection.weight/bias -> embedding.patch.weight/bias
    embeddings.cls_token                               -> embedding.class_token
    embeddings.position_embeddings                     -> embedding.position
    layers.n.layernorm_before.weight/bias              -> theta^n norm1.weight/bias (P1)
    layers.n.attention.{q,k,v}_proj.weight             -> theta^n attention.qkv_weight (rows)
    layers.n.attention.{q,k,v}_proj.bias               -> theta^n attention.qkv_bias
    layers.n.attention.o_proj.weight/bias              -> theta^n attention.out_weight/out_bias
    layers.n.layernorm_after.weight/bias               -> theta^n norm2.weight/bias (P2)
    layers.n.mlp.fc1 / fc2                             -> theta^n ffn.stages[0] / ffn.stages[1]
    layernorm.weight/bias                              -> final_norm.weight/bias
    pooler.dense.weight/bias                           -> pooler.dense.weight/bias
    classifier.weight/bias                             -> head.weight/bias

HF's eager attention computes the softmax in float32 even for a float64 model; its float64
outputs are therefore only float32-accurate. Compare float64 against the sdpa path
(``attn_implementation="sdpa"``, the default), which is exact to rounding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..models.vit import ViT, build_vit, vit_scheme
from .hf import hf_config
from .weights import check_softmax, network_scheme
from .weights import copy_weight as _copy

__all__ = ["from_hf_model", "to_hf_model"]

HF_CLASSES = ("ViTModel", "ViTForImageClassification")

# transformers hidden_act / pooler_act -> splitformer Activation
_ACTS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",  # the same tanh formula written out; equal up to rounding
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
    "linear": "identity",
}




def _act(name: Any, option: str) -> str:
    if not isinstance(name, str) or name not in _ACTS:
        raise ValueError(f"{option}={name!r} is not supported; supported: {sorted(_ACTS)}")
    return _ACTS[name]


def _parts(model) -> tuple[Any, nn.Module | None]:
    name = type(model).__name__
    if name == "ViTModel":
        return model, None
    if name == "ViTForImageClassification":
        return model.vit, model.classifier
    raise TypeError(f"from_hf_model supports {list(HF_CLASSES)}, got {name}")


def _check(vit, config) -> None:
    emb = vit.embeddings
    if getattr(emb, "mask_token", None) is not None:
        raise ValueError("use_mask_token=True is not supported (the masked-image-modeling mask "
                         "token is not part of the initial condition)")
    for i, layer in enumerate(vit.layers):
        a = layer.attention
        if a.head_dim * a.num_attention_heads != config.hidden_size:
            raise ValueError(f"head_dim={a.head_dim} with num_attention_heads="
                             f"{a.num_attention_heads} must give hidden_size="
                             f"{config.hidden_size} (layer {i})")
        if a.o_proj.bias is None:
            raise ValueError(f"layer {i}: attention o_proj without bias is not supported")
        for nm in ("layernorm_before", "layernorm_after"):
            ln = getattr(layer, nm)
            if not isinstance(ln, nn.LayerNorm) or not ln.elementwise_affine or ln.bias is None:
                raise ValueError(f"layers.{i}.{nm} must be an affine nn.LayerNorm with bias")
    if emb.patch_embeddings.projection.padding != (0, 0) or \
            emb.patch_embeddings.projection.stride != emb.patch_embeddings.projection.kernel_size:
        raise ValueError("the patch embedding must be a Conv2d with stride = kernel, no padding")


def from_hf_model(model, **kwargs) -> ViT:
    """A splitformer ViT with the same outputs as a transformers ViTModel / ViTForImage-
    Classification: ``out.last_hidden_state``, ``out.pooler_output`` (ViTModel with pooler),
    ``out.logits`` (ViTForImageClassification)."""
    if kwargs:
        raise TypeError(f"from_hf_model(ViT) takes no options, got {sorted(kwargs)}")
    vit, classifier = _parts(model)
    config = model.config
    _check(vit, config)
    emb = vit.embeddings
    proj = emb.patch_embeddings.projection
    p = proj.weight
    kw = {"device": p.device, "dtype": p.dtype}
    layer0 = vit.layers[0]
    pooler = vit.pooler
    if pooler is not None:
        pooler_spec: tuple[int, str] | None = (pooler.dense.out_features,
                                               _act(config.pooler_act, "pooler_act"))
    else:
        pooler_spec = None
    num_classes = None
    if classifier is not None:
        num_classes = classifier.out_features if isinstance(classifier, nn.Linear) else 0
        if not isinstance(classifier, (nn.Linear, nn.Identity)):
            raise ValueError(f"classifier={type(classifier).__name__} is not supported")
    hf_class = type(model).__name__
    source = {
        "hf_class": hf_class,
        "config": config.to_dict(),
        "add_pooling_layer": pooler is not None,
        "attn_implementation": getattr(config, "_attn_implementation", None),
    }
    out = build_vit(
        image_size=emb.patch_embeddings.image_size,
        patch_size=tuple(proj.kernel_size),
        in_chans=proj.in_channels,
        dim=config.hidden_size,
        depth=len(vit.layers),
        num_heads=layer0.attention.num_attention_heads,
        hidden_dim=layer0.mlp.fc1.out_features,
        qkv_bias=layer0.attention.q_proj.bias is not None,
        proj_bias=True,
        patch_bias=proj.bias is not None,
        activation=_act(config.hidden_act, "hidden_act"),
        norm_eps=layer0.layernorm_before.eps,
        class_token=True,
        position=True,
        position_prefix=True,
        final_norm=True,
        pool="token" if (pooler is not None or classifier is not None) else None,
        pooler=pooler_spec,
        num_classes=num_classes,
        embed_dropout=emb.dropout.p,
        attn_dropout=float(layer0.attention.attention_dropout),
        out_dropout=layer0.dropout.p,
        ffn_dropout=0.0,
        output_format="hf",
        source=source,
        **kw,
    )
    e = out.embedding
    _copy(e.patch.weight, proj.weight, "embeddings.patch_embeddings.projection.weight")
    _copy(e.patch.bias, proj.bias, "embeddings.patch_embeddings.projection.bias")
    _copy(e.class_token, emb.cls_token, "embeddings.cls_token")
    _copy(e.position, emb.position_embeddings, "embeddings.position_embeddings")
    for n, (theta, layer) in enumerate(zip(out.evolution.controls, vit.layers, strict=True)):
        pre = f"layers.{n}."
        a, ha = theta["attention"], layer.attention
        for nm in ("layernorm_before", "layernorm_after"):
            if getattr(layer, nm).eps != out.evolution.controls[0]["norm1"].eps:
                raise ValueError(f"{pre}{nm}.eps differs from layer 0: layers must share it")
        _copy(a.qkv_weight, torch.cat([ha.q_proj.weight, ha.k_proj.weight, ha.v_proj.weight]),
              pre + "attention.{q,k,v}_proj.weight")
        if ha.q_proj.bias is not None:
            _copy(a.qkv_bias, torch.cat([ha.q_proj.bias, ha.k_proj.bias, ha.v_proj.bias]),
                  pre + "attention.{q,k,v}_proj.bias")
        _copy(a.out_weight, ha.o_proj.weight, pre + "attention.o_proj.weight")
        _copy(a.out_bias, ha.o_proj.bias, pre + "attention.o_proj.bias")
        for mine, theirs in (("norm1", "layernorm_before"), ("norm2", "layernorm_after")):
            _copy(theta[mine].weight, getattr(layer, theirs).weight, pre + theirs + ".weight")
            _copy(theta[mine].bias, getattr(layer, theirs).bias, pre + theirs + ".bias")
        for stage, lin, nm in zip(theta["ffn"].stages, (layer.mlp.fc1, layer.mlp.fc2),
                                  ("fc1", "fc2"), strict=True):
            _copy(stage.weight, lin.weight, pre + f"mlp.{nm}.weight")
            _copy(stage.bias, lin.bias, pre + f"mlp.{nm}.bias")
    _copy(out.final_norm.weight, vit.layernorm.weight, "layernorm.weight")
    _copy(out.final_norm.bias, vit.layernorm.bias, "layernorm.bias")
    out.final_norm.eps = float(vit.layernorm.eps)
    if pooler is not None:
        _copy(out.pooler.dense.weight, pooler.dense.weight, "pooler.dense.weight")
        _copy(out.pooler.dense.bias, pooler.dense.bias, "pooler.dense.bias")
    if isinstance(classifier, nn.Linear):
        _copy(out.head.weight, classifier.weight, "classifier.weight")
        _copy(out.head.bias, classifier.bias, "classifier.bias")
    out.train(model.training)
    return out


def to_hf_model(model: ViT):
    """The transformers model (class and config recorded in ``model.source``), same weights."""
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("to_hf(model) needs `transformers` (pip install splitformer[hf])") from e
    if not isinstance(model, ViT):
        raise TypeError(f"to_hf_model expects a splitformer ViT, got {type(model).__name__}")
    src = model.source
    hf_class = src.get("hf_class")
    if hf_class not in HF_CLASSES:
        raise ValueError(f"model.source['hf_class'] must be one of {list(HF_CLASSES)}, got "
                         f"{hf_class!r}")
    evo = model.evolution
    network_scheme(evo, {"prenorm": vit_scheme(False)}, "to_hf")
    check_softmax(evo, "to_hf")
    config = hf_config("ViTConfig", src)
    if config.num_hidden_layers != len(evo.controls):
        raise ValueError(f"config.num_hidden_layers={config.num_hidden_layers} differs from the "
                         f"number of control sets {len(evo.controls)}")
    if hf_class == "ViTModel":
        hf = transformers.ViTModel(config, add_pooling_layer=bool(src.get("add_pooling_layer")))
        vit, classifier = hf, None
    else:
        hf = transformers.ViTForImageClassification(config)
        vit, classifier = hf.vit, hf.classifier
    p = model.embedding.patch.weight
    hf = hf.to(device=p.device, dtype=p.dtype)
    emb = vit.embeddings
    e = model.embedding
    proj = emb.patch_embeddings.projection
    _copy(proj.weight, e.patch.weight, "embedding.patch.weight")
    _copy(proj.bias, e.patch.bias, "embedding.patch.bias")
    _copy(emb.cls_token, e.class_token, "embedding.class_token")
    _copy(emb.position_embeddings, e.position, "embedding.position")
    d = model.dim
    for n, (theta, layer) in enumerate(zip(evo.controls, vit.layers, strict=True)):
        pre = f"controls[{n}]."
        a, ha = theta["attention"], layer.attention
        for i, lin in enumerate((ha.q_proj, ha.k_proj, ha.v_proj)):
            _copy(lin.weight, a.qkv_weight[i * d:(i + 1) * d], pre + "attention.qkv_weight")
            _copy(lin.bias, None if a.qkv_bias is None else a.qkv_bias[i * d:(i + 1) * d],
                  pre + "attention.qkv_bias")
        _copy(ha.o_proj.weight, a.out_weight, pre + "attention.out_weight")
        _copy(ha.o_proj.bias, a.out_bias, pre + "attention.out_bias")
        for mine, theirs in (("norm1", "layernorm_before"), ("norm2", "layernorm_after")):
            _copy(getattr(layer, theirs).weight, theta[mine].weight, pre + mine + ".weight")
            _copy(getattr(layer, theirs).bias, theta[mine].bias, pre + mine + ".bias")
        for stage, lin in zip(theta["ffn"].stages, (layer.mlp.fc1, layer.mlp.fc2), strict=True):
            _copy(lin.weight, stage.weight, pre + "ffn.weight")
            _copy(lin.bias, stage.bias, pre + "ffn.bias")
    _copy(vit.layernorm.weight, model.final_norm.weight, "final_norm.weight")
    _copy(vit.layernorm.bias, model.final_norm.bias, "final_norm.bias")
    if vit.pooler is not None:
        if model.pooler is None:
            raise ValueError("source says add_pooling_layer=True but the model has no pooler")
        _copy(vit.pooler.dense.weight, model.pooler.dense.weight, "pooler.dense.weight")
        _copy(vit.pooler.dense.bias, model.pooler.dense.bias, "pooler.dense.bias")
    if isinstance(classifier, nn.Linear):
        if not hasattr(model.head, "weight"):
            raise ValueError("the HF config has a classifier but the model's head is not linear")
        _copy(classifier.weight, model.head.weight, "head.weight")
        _copy(classifier.bias, model.head.bias, "head.bias")
    hf.train(model.training)
    return hf
