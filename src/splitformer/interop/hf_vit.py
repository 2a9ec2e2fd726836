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
    for n, layer in enumerate(vit.layers):
        for nm in ("layernorm_before", "layernorm_after"):
            if getattr(layer, nm).eps != layer0.layernorm_before.eps:
                raise ValueError(f"layers.{n}.{nm}.eps differs from layer 0: layers must share it")
    for name, theirs, ours in _weight_pairs(out, vit, classifier):
        _copy(ours, theirs, name)
    out.final_norm.eps = float(vit.layernorm.eps)
    out.train(model.training)
    return out


def _weight_pairs(model: ViT, vit: nn.Module, classifier: nn.Module | None):
    """(HF name, HF tensor, our tensor) for every weight: one table for both directions.

    HF's separate W_Q, W_K, W_V are row blocks (views) of our packed qkv_weight.
    """
    e, emb = model.embedding, vit.embeddings
    proj = emb.patch_embeddings.projection
    pairs = [
        ("embeddings.patch_embeddings.projection.weight", proj.weight, e.patch.weight),
        ("embeddings.patch_embeddings.projection.bias", proj.bias, e.patch.bias),
        ("embeddings.cls_token", emb.cls_token, e.class_token),
        ("embeddings.position_embeddings", emb.position_embeddings, e.position),
    ]
    d = model.dim
    for n, (theta, layer) in enumerate(zip(model.evolution.controls, vit.layers, strict=True)):
        pre = f"layers.{n}."
        a, ha = theta["attention"], layer.attention
        for i, nm in enumerate(("q_proj", "k_proj", "v_proj")):
            rows = slice(i * d, (i + 1) * d)
            lin = getattr(ha, nm)
            pairs += [(pre + f"attention.{nm}.weight", lin.weight, a.qkv_weight[rows]),
                      (pre + f"attention.{nm}.bias", lin.bias,
                       None if a.qkv_bias is None else a.qkv_bias[rows])]
        pairs += [(pre + "attention.o_proj.weight", ha.o_proj.weight, a.out_weight),
                  (pre + "attention.o_proj.bias", ha.o_proj.bias, a.out_bias)]
        for mine, theirs in (("norm1", "layernorm_before"), ("norm2", "layernorm_after")):
            pairs += [(pre + theirs + ".weight", getattr(layer, theirs).weight,
                       theta[mine].weight),
                      (pre + theirs + ".bias", getattr(layer, theirs).bias, theta[mine].bias)]
        for stage, nm in zip(theta["ffn"].stages, ("fc1", "fc2"), strict=True):
            lin = getattr(layer.mlp, nm)
            pairs += [(pre + f"mlp.{nm}.weight", lin.weight, stage.weight),
                      (pre + f"mlp.{nm}.bias", lin.bias, stage.bias)]
    pairs += [("layernorm.weight", vit.layernorm.weight, model.final_norm.weight),
              ("layernorm.bias", vit.layernorm.bias, model.final_norm.bias)]
    if vit.pooler is not None:
        if model.pooler is None:
            raise ValueError("the HF model has a pooler (add_pooling_layer) but this model has "
                             "none")
        pairs += [("pooler.dense.weight", vit.pooler.dense.weight, model.pooler.dense.weight),
                  ("pooler.dense.bias", vit.pooler.dense.bias, model.pooler.dense.bias)]
    if isinstance(classifier, nn.Linear):
        if not hasattr(model.head, "weight"):
            raise ValueError("the HF config has a classifier but the model's head is not linear")
        pairs += [("classifier.weight", classifier.weight, model.head.weight),
                  ("classifier.bias", classifier.bias, model.head.bias)]
    return pairs


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
    for name, theirs, ours in _weight_pairs(model, vit, classifier):
        _copy(theirs, ours, name)
    hf.train(model.training)
    return hf
