"""Hugging Face BERT <-> splitformer: an exact weight map, both ways.

``BertModel`` (and ``BertForSequenceClassification``) is the initial condition
f = P_S1(E_w + E_t + E_p), L steps of the post-LN Lie scheme with tau = 1 and the read-outs
(pooler, classifier): see ``splitformer.models.bert``. Weight map, layer n -> theta^n
(``BERT_WEIGHT_MAP`` is the table; the prefix ``bert.`` is added for the classifier model):

    embeddings.word_embeddings / position_embeddings / token_type_embeddings
                                        -> embedding.word / position / token_type
    embeddings.LayerNorm                -> embedding.norm                (initial projection)
    encoder.layer.n.attention.self.query / key / value (weight, bias)
                                        -> attention.qkv_weight / qkv_bias rows [0:d] [d:2d] [2d:3d]
    encoder.layer.n.attention.output.dense       -> attention.out_weight / out_bias   (W_O)
    encoder.layer.n.attention.output.LayerNorm   -> norm1                 (projection P1)
    encoder.layer.n.intermediate.dense           -> ffn.stages.0          (W_1, lifted grid)
    encoder.layer.n.output.dense                 -> ffn.stages.1          (W_2)
    encoder.layer.n.output.LayerNorm             -> norm2                 (projection P2)
    pooler.dense                                 -> pooler                (read-out)
    classifier                                   -> classifier            (read-out)

The head coordinate is laid out identically on both sides (the rows of W_Q are grouped by head
as (H, d_h)), so the map is a plain copy. ``transformers`` is imported only by ``to_hf_model``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..models.bert import BERT_ACTIVATIONS, BertEncoderModel, BertSequenceClassifier, bert_model
from ..time.schemes import lie
from .hf import attn_implementation, hf_config
from .weights import check_softmax, network_scheme
from .weights import copy_weight as _copy

__all__ = ["BERT_WEIGHT_MAP", "check_config", "from_hf_model", "to_hf_model", "weight_map"]

HF_CLASSES = ("BertModel", "BertForSequenceClassification")

# (transformers name, splitformer name, row block of the packed qkv or None) for one layer
_LAYER_MAP: tuple[tuple[str, str, int | None], ...] = (
    ("attention.self.query.weight", "attention.qkv_weight", 0),
    ("attention.self.query.bias", "attention.qkv_bias", 0),
    ("attention.self.key.weight", "attention.qkv_weight", 1),
    ("attention.self.key.bias", "attention.qkv_bias", 1),
    ("attention.self.value.weight", "attention.qkv_weight", 2),
    ("attention.self.value.bias", "attention.qkv_bias", 2),
    ("attention.output.dense.weight", "attention.out_weight", None),
    ("attention.output.dense.bias", "attention.out_bias", None),
    ("attention.output.LayerNorm.weight", "norm1.weight", None),
    ("attention.output.LayerNorm.bias", "norm1.bias", None),
    ("intermediate.dense.weight", "ffn.stages.0.weight", None),
    ("intermediate.dense.bias", "ffn.stages.0.bias", None),
    ("output.dense.weight", "ffn.stages.1.weight", None),
    ("output.dense.bias", "ffn.stages.1.bias", None),
    ("output.LayerNorm.weight", "norm2.weight", None),
    ("output.LayerNorm.bias", "norm2.bias", None),
)

_EMBEDDING_MAP: tuple[tuple[str, str, int | None], ...] = (
    ("embeddings.word_embeddings.weight", "embedding.word.weight", None),
    ("embeddings.position_embeddings.weight", "embedding.position.weight", None),
    ("embeddings.token_type_embeddings.weight", "embedding.token_type.weight", None),
    ("embeddings.LayerNorm.weight", "embedding.norm.weight", None),
    ("embeddings.LayerNorm.bias", "embedding.norm.bias", None),
)

_POOLER_MAP = (("pooler.dense.weight", "pooler.weight", None),
               ("pooler.dense.bias", "pooler.bias", None))
_CLASSIFIER_MAP = (("classifier.weight", "classifier.weight", None),
                   ("classifier.bias", "classifier.bias", None))

# the whole table, with n for the layer index (docs and tests read it)
BERT_WEIGHT_MAP: tuple[tuple[str, str], ...] = (
    *((h, s) for h, s, _ in _EMBEDDING_MAP),
    *((f"encoder.layer.n.{h}",
       f"evolution.controls.sets.n.{s}" + ("" if b is None else f"[{b}d:{b + 1}d]"))
      for h, s, b in _LAYER_MAP),
    *((h, s) for h, s, _ in _POOLER_MAP),
    *((h, s) for h, s, _ in _CLASSIFIER_MAP),
)

# non-persistent in transformers 5 (older versions saved them): rebuilt, never copied
_DEFAULT_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def weight_map(num_layers: int, *, pooler: bool, classifier: bool
               ) -> list[tuple[str, str, int | None]]:
    """Every (transformers name, splitformer name, qkv row block) of one model."""
    prefix = "bert." if classifier else ""
    out = [(prefix + h, s, b) for h, s, b in _EMBEDDING_MAP]
    for n in range(num_layers):
        out += [(f"{prefix}encoder.layer.{n}.{h}", f"evolution.controls.sets.{n}.{s}", b)
                for h, s, b in _LAYER_MAP]
    if pooler:
        out += [(prefix + h, s, b) for h, s, b in _POOLER_MAP]
    if classifier:
        out += list(_CLASSIFIER_MAP)
    return out


def check_config(config: Any) -> None:
    """Raise ValueError naming the first option of a BertConfig that the map does not support."""
    pet = getattr(config, "position_embedding_type", "absolute")
    if pet not in (None, "absolute"):
        raise ValueError(f"position_embedding_type={pet!r} is not supported (only 'absolute': "
                         "relative position kernels k(x - x') are not part of this map)")
    if getattr(config, "add_cross_attention", False):
        raise ValueError("add_cross_attention=True is not supported (cross-attention needs a "
                         "second field; the BERT map is an encoder)")
    if getattr(config, "is_decoder", False):
        raise ValueError("is_decoder=True is not supported (a causal BERT decoder is a Volterra "
                         "kernel with a cache; the BERT map is an encoder)")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError("is_encoder_decoder=True is not supported")
    act = config.hidden_act
    if not isinstance(act, str) or act not in BERT_ACTIVATIONS:
        raise ValueError(f"hidden_act={act!r} is not supported; supported: "
                         f"{sorted(BERT_ACTIVATIONS)} ('gelu' is the exact erf form)")
    if config.hidden_size % config.num_attention_heads != 0:
        raise ValueError(f"num_attention_heads={config.num_attention_heads} must divide "
                         f"hidden_size={config.hidden_size}")
    problem = getattr(config, "problem_type", None)
    if problem not in (None, "regression", "single_label_classification",
                       "multi_label_classification"):
        raise ValueError(f"problem_type={problem!r} is not supported")


def _parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def _target(tensor: torch.Tensor, block: int | None, d: int) -> torch.Tensor:
    return tensor if block is None else tensor[block * d:(block + 1) * d]




def _check_buffers(state: dict[str, torch.Tensor], prefix: str) -> None:
    """Persistent position_ids / token_type_ids (older checkpoints) must hold their defaults."""
    for name in _DEFAULT_BUFFERS:
        key = prefix + name
        if key not in state:
            continue
        t = state[key]
        default = (torch.arange(t.shape[-1], device=t.device).expand_as(t)
                   if name.endswith("position_ids") else torch.zeros_like(t))
        if not torch.equal(t, default):
            raise ValueError(f"buffer {key} differs from its default (arange / zeros): a custom "
                             "default position or token type is not supported")


def from_hf_model(model: nn.Module, **kwargs: Any) -> BertEncoderModel:
    """The splitformer model with the same outputs as a transformers BertModel /
    BertForSequenceClassification (a pure weight map; the source module is never called)."""
    if kwargs:
        raise TypeError(f"from_hf for BERT takes no options, got {sorted(kwargs)}")
    cls = type(model).__name__
    if cls not in HF_CLASSES:
        raise TypeError(f"expected one of {HF_CLASSES}, got {cls}")
    classifier = cls == "BertForSequenceClassification"
    bert = model.bert if classifier else model
    config = model.config
    check_config(config)
    attn_impl = attn_implementation(config)
    has_pooler = bert.pooler is not None
    p = next(model.parameters())
    source = {
        "hf_class": cls,
        "config": config.to_dict(),
        "add_pooling_layer": has_pooler,
        "attn_implementation": attn_impl,
    }
    ours = bert_model(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        hidden_dropout_prob=float(config.hidden_dropout_prob),
        attention_probs_dropout_prob=float(config.attention_probs_dropout_prob),
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=float(config.layer_norm_eps),
        pad_token_id=bert.embeddings.word_embeddings.padding_idx,
        add_pooling_layer=has_pooler,
        num_labels=model.classifier.out_features if classifier else None,
        classifier_dropout=float(model.dropout.p) if classifier else None,
        problem_type=getattr(config, "problem_type", None),
        additive_mask=attn_impl == "eager",
        source=source,
        device=p.device,
        dtype=p.dtype,
    )
    # dropout probabilities as the modules hold them (they may differ from the config)
    emb = bert.embeddings
    ours.embedding.dropout.p = float(emb.dropout.p)
    for theta, layer in zip(ours.evolution.controls, bert.encoder.layer, strict=True):
        theta["attention"].attn_dropout = float(layer.attention.self.dropout.p)
        theta["attention"].out_dropout.p = float(layer.attention.output.dropout.p)
        theta["ffn"].out_dropout.p = float(layer.output.dropout.p)
        for ours_norm, theirs in (("norm1", layer.attention.output.LayerNorm),
                                  ("norm2", layer.output.LayerNorm)):
            theta[ours_norm].eps = float(theirs.eps)
    ours.embedding.norm.eps = float(emb.LayerNorm.eps)

    state = model.state_dict()
    prefix = "bert." if classifier else ""
    _check_buffers(state, prefix)
    table = weight_map(len(bert.encoder.layer), pooler=has_pooler, classifier=classifier)
    mapped = {h for h, _, _ in table}
    extra = [k for k in state if k not in mapped
             and k.removeprefix(prefix) not in _DEFAULT_BUFFERS]
    if extra:
        raise ValueError(f"the model has weights the BERT map does not know: {extra[:5]}")
    params = _parameters(ours)
    d = config.hidden_size
    for hf_name, our_name, block in table:
        _copy(_target(params[our_name], block, d), state[hf_name], hf_name)
    covered = {s for _, s, _ in table}
    missing = [k for k in params if k not in covered]
    if missing:  # pragma: no cover - a bug in the table
        raise RuntimeError(f"parameters left unmapped: {missing}")
    ours.train(model.training)
    return ours


def to_hf_model(model: BertEncoderModel) -> nn.Module:
    """The transformers model with the same weights: the inverse of ``from_hf_model``."""
    import transformers

    if not isinstance(model, BertEncoderModel):
        raise TypeError(f"to_hf for BERT expects a BertEncoderModel, got {type(model).__name__}")
    source = model.source
    cls = source.get("hf_class")
    if cls not in HF_CLASSES:
        raise ValueError(f"model.source['hf_class'] must be one of {HF_CLASSES}, got {cls!r}")
    evo = model.evolution
    network_scheme(evo, {"lie": lie()}, "to_hf")
    check_softmax(evo, "to_hf")
    classifier = cls == "BertForSequenceClassification"
    if classifier != isinstance(model, BertSequenceClassifier):
        raise ValueError(f"model.source['hf_class']={cls!r} does not match {type(model).__name__}")
    config = hf_config("BertConfig", source)
    p = next(model.parameters())
    add_pooling = model.pooler is not None
    if classifier:
        out = transformers.BertForSequenceClassification(config)
    else:
        out = transformers.BertModel(config, add_pooling_layer=add_pooling)
    out = out.to(device=p.device, dtype=p.dtype)
    bert = out.bert if classifier else out
    state = out.state_dict()
    params = _parameters(model)
    d = model.embedding.dim
    table = weight_map(len(evo.controls), pooler=add_pooling, classifier=classifier)
    for hf_name, our_name, block in table:
        _copy(state[hf_name], _target(params[our_name], block, d), our_name)
    # dropout probabilities and eps as the splitformer modules hold them
    bert.embeddings.dropout.p = model.embedding.dropout.p
    bert.embeddings.LayerNorm.eps = model.embedding.norm.eps
    for theta, layer in zip(evo.controls, bert.encoder.layer, strict=True):
        layer.attention.self.dropout.p = theta["attention"].attn_dropout
        layer.attention.output.dropout.p = theta["attention"].out_dropout.p
        layer.output.dropout.p = theta["ffn"].out_dropout.p
        layer.attention.output.LayerNorm.eps = theta["norm1"].eps
        layer.output.LayerNorm.eps = theta["norm2"].eps
    if classifier:
        out.dropout.p = model.classifier.dropout.p
    out.train(model.training)
    return out
