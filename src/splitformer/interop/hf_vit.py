"""Hugging Face ViT <-> splitformer: a pure weight map, both ways.

``ViTModel`` (with or without its pooler) and ``ViTForImageClassification`` are the ViT model of
``splitformer.models.vit``: the initial condition f on the 2-D patch grid (patch embedding,
class token, position embeddings, dropout), the pre-LN scheme (explicit Euler for
u_t = A(P1 u) + G(P2 u), split in two) with T = L, tau = 1, and the read-out (final LayerNorm,
then the pooler dense + tanh on the class token, or the classifier on the class token).

Weight map (HF name -> splitformer name; layer n -> theta^n = evolution.controls.sets[n]; the
prefix ``vit.`` is added for the classifier model):

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

plus the attribute rows: every LayerNorm's eps, the embedding, attention and output dropout
rates (HF's one ``layers.n.dropout`` acts on both A's and G's output). ``to_hf`` rebuilds the
model from the source config, which holds one value of each: it checks every layer's against
it and refuses a difference, naming the layer and the option. ``from_hf_model`` is
check -> config (``vit_config``: a ``HFViTConfig``, kept as the model's ``source``) -> build ->
copy.

HF's eager attention computes the softmax in float32 even for a float64 model; its float64
outputs are therefore only float32-accurate. Compare float64 against the sdpa path
(``attn_implementation="sdpa"``, the default), which is exact to rounding.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..models.vit import ViT, build_vit, vit_scheme
from .activations import VIT_ACTIVATIONS
from .families import classes_of
from .hf import HFSource, hf_config, hf_source, no_options
from .weights import Row, check_covered, check_softmax, copy_table, network_scheme, prefixed

__all__ = ["HFViTConfig", "build", "from_hf_model", "to_hf_model", "vit_config", "weight_map"]

HF_CLASSES = classes_of("hf_vit")  # the classes of its family record(s): a live view

_EMBEDDING_ROWS: tuple[Row, ...] = (
    Row("embeddings.patch_embeddings.projection.weight", "embedding.patch.weight"),
    Row("embeddings.patch_embeddings.projection.bias", "embedding.patch.bias"),
    Row("embeddings.cls_token", "embedding.class_token"),
    Row("embeddings.position_embeddings", "embedding.position"),
    Row("embeddings.dropout.p", "embedding.dropout.p", attr=True, option="hidden_dropout_prob"),
)
_LAYER_ROWS: tuple[Row, ...] = (
    *(Row(f"attention.{nm}_proj.{w}", f"attention.qkv_{w}", block=(i, 3))
      for i, nm in enumerate("qkv") for w in ("weight", "bias")),
    Row("attention.o_proj.weight", "attention.out_weight"),
    Row("attention.o_proj.bias", "attention.out_bias"),
    Row("layernorm_before.weight", "norm1.weight"),
    Row("layernorm_before.bias", "norm1.bias"),
    Row("layernorm_after.weight", "norm2.weight"),
    Row("layernorm_after.bias", "norm2.bias"),
    Row("mlp.fc1.weight", "ffn.stages.0.weight"),
    Row("mlp.fc1.bias", "ffn.stages.0.bias"),
    Row("mlp.fc2.weight", "ffn.stages.1.weight"),
    Row("mlp.fc2.bias", "ffn.stages.1.bias"),
    Row("layernorm_before.eps", "norm1.eps", attr=True, option="layer_norm_eps"),
    Row("layernorm_after.eps", "norm2.eps", attr=True, option="layer_norm_eps"),
    Row("attention.attention_dropout", "attention.attn_dropout", attr=True,
        option="attention_probs_dropout_prob"),
    Row("dropout.p", "attention.out_dropout.p", attr=True, option="hidden_dropout_prob"),
    Row("dropout.p", "ffn.out_dropout.p", attr=True, option="hidden_dropout_prob"),
)
_FINAL_ROWS: tuple[Row, ...] = (
    Row("layernorm.weight", "final_norm.weight"),
    Row("layernorm.bias", "final_norm.bias"),
    Row("layernorm.eps", "final_norm.eps", attr=True, option="layer_norm_eps"),
)
_POOLER_ROWS = (Row("pooler.dense.weight", "pooler.dense.weight"),
                Row("pooler.dense.bias", "pooler.dense.bias"))
_CLASSIFIER_ROWS = (Row("classifier.weight", "head.weight"), Row("classifier.bias", "head.bias"))


@dataclass(frozen=True, kw_only=True)
class HFViTConfig(HFSource):
    """A transformers ViT as splitformer reads it (sizes from the modules, activations as
    splitformer's names); ``num_classes`` None: no classifier, 0: an identity one."""

    image_size: tuple[int, int]
    patch_size: tuple[int, int]
    in_chans: int
    dim: int
    depth: int
    num_heads: int
    hidden_dim: int
    qkv_bias: bool
    patch_bias: bool
    activation: str
    norm_eps: float
    add_pooling_layer: bool
    pooler: tuple[int, str] | None = None
    num_classes: int | None = None


def weight_map(config: HFViTConfig) -> list[Row]:
    """Every row (tensors and attributes) of one model, transformers' names from its root."""
    prefix = "vit." if config.hf_class == "ViTForImageClassification" else ""
    rows = prefixed(_EMBEDDING_ROWS, prefix, "")
    for n in range(config.depth):
        rows += prefixed(_LAYER_ROWS, f"{prefix}layers.{n}.", f"evolution.controls.sets.{n}.")
    rows += prefixed(_FINAL_ROWS, prefix, "")
    if config.pooler is not None:
        rows += prefixed(_POOLER_ROWS, prefix, "")
    if config.num_classes:
        rows += list(_CLASSIFIER_ROWS)
    return rows


def _act(name: Any, option: str) -> str:
    if not isinstance(name, str) or name not in VIT_ACTIVATIONS:
        raise ValueError(f"{option}={name!r} is not supported; supported: "
                         f"{sorted(VIT_ACTIVATIONS)}")
    return VIT_ACTIVATIONS[name]


def _parts(model) -> tuple[Any, nn.Module | None]:
    name = type(model).__name__
    if name == "ViTModel":
        return model, None
    if name == "ViTForImageClassification":
        return model.vit, model.classifier
    raise TypeError(f"from_hf_model supports {list(HF_CLASSES)}, got {name}")


def _check(vit, classifier, config) -> None:
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
    proj = emb.patch_embeddings.projection
    if proj.padding != (0, 0) or proj.stride != proj.kernel_size:
        raise ValueError("the patch embedding must be a Conv2d with stride = kernel, no padding")
    if classifier is not None and not isinstance(classifier, (nn.Linear, nn.Identity)):
        raise ValueError(f"classifier={type(classifier).__name__} is not supported")


def vit_config(model: nn.Module) -> HFViTConfig:
    """Check a transformers ViTModel / ViTForImageClassification (ValueError naming the first
    unsupported option) and read its typed config."""
    vit, classifier = _parts(model)
    config = model.config
    _check(vit, classifier, config)
    proj = vit.embeddings.patch_embeddings.projection
    layer0, pooler = vit.layers[0], vit.pooler
    return HFViTConfig(
        hf_class=type(model).__name__,
        config=config.to_dict(),
        attn_implementation=getattr(config, "_attn_implementation", None),
        image_size=tuple(vit.embeddings.patch_embeddings.image_size),
        patch_size=tuple(proj.kernel_size),
        in_chans=proj.in_channels,
        dim=config.hidden_size,
        depth=len(vit.layers),
        num_heads=layer0.attention.num_attention_heads,
        hidden_dim=layer0.mlp.fc1.out_features,
        qkv_bias=layer0.attention.q_proj.bias is not None,
        patch_bias=proj.bias is not None,
        activation=_act(config.hidden_act, "hidden_act"),
        norm_eps=float(layer0.layernorm_before.eps),
        add_pooling_layer=pooler is not None,
        pooler=(None if pooler is None
                else (pooler.dense.out_features, _act(config.pooler_act, "pooler_act"))),
        num_classes=(None if classifier is None
                     else classifier.out_features if isinstance(classifier, nn.Linear) else 0),
    )


def build(config: HFViTConfig, *, device=None, dtype=None) -> ViT:
    """The splitformer ViT of ``config`` with random weights; ``source`` = ``config``. Eps
    and dropout rates come with the weight table."""
    return build_vit(
        image_size=config.image_size,
        patch_size=config.patch_size,
        in_chans=config.in_chans,
        dim=config.dim,
        depth=config.depth,
        num_heads=config.num_heads,
        hidden_dim=config.hidden_dim,
        qkv_bias=config.qkv_bias,
        proj_bias=True,
        patch_bias=config.patch_bias,
        activation=config.activation,
        norm_eps=config.norm_eps,
        class_token=True,
        position=True,
        position_prefix=True,
        final_norm=True,
        pool="token" if (config.pooler is not None or config.num_classes is not None) else None,
        pooler=config.pooler,
        num_classes=config.num_classes,
        ffn_dropout=0.0,
        read_out="hf",
        source=config,
        device=device,
        dtype=dtype,
    )


def from_hf_model(model, **kwargs) -> ViT:
    """A splitformer ViT with the same outputs as a transformers ViTModel / ViTForImage-
    Classification: ``out.last_hidden_state``, ``out.pooler_output`` (ViTModel with pooler),
    ``out.logits`` (ViTForImageClassification)."""
    no_options(kwargs, "ViT")
    config = vit_config(model)
    p = next(model.parameters())
    out = build(config, device=p.device, dtype=p.dtype)
    rows = weight_map(config)
    check_covered(model.state_dict(), rows, "ViT")
    copy_table(rows, theirs=model, ours=out, into="ours")
    out.train(model.training)
    return out


def to_hf_model(model: ViT):
    """The transformers model (class and config recorded in ``model.source``), same weights;
    every eps and rate must equal the config's (ValueError naming the layer and option)."""
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("to_hf(model) needs `transformers` (pip install splitformer[hf])") from e
    if not isinstance(model, ViT):
        raise TypeError(f"to_hf_model expects a splitformer ViT, got {type(model).__name__}")
    if not model.embedding.on_base_grid:
        raise ValueError("to_hf(model): the model evaluates on another patch grid than its "
                         "parameters were made on (with_patch_size / with_image_size); export "
                         "the model it was derived from")
    source = hf_source(model, HF_CLASSES, HFViTConfig)
    evo = model.evolution
    network_scheme(evo, {"prenorm": vit_scheme(False)}, "to_hf")
    check_softmax(evo, "to_hf")
    config = hf_config(source)
    config.num_hidden_layers = len(evo.controls)  # one layer per step (coarsened: fewer)
    if source.hf_class == "ViTModel":
        hf = transformers.ViTModel(config, add_pooling_layer=source.add_pooling_layer)
    else:
        hf = transformers.ViTForImageClassification(config)
    p = model.embedding.patch.weight
    hf = hf.to(device=p.device, dtype=p.dtype)
    layers = dataclasses.replace(source, depth=len(evo.controls))  # coarsened: fewer layers
    copy_table(weight_map(layers), theirs=hf, ours=model, into="theirs", attributes="check")
    hf.train(model.training)
    return hf
