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

plus the attribute rows: every LayerNorm's eps and every dropout rate, as the modules hold
them (they may differ from the config; ``to_hf`` then refuses, naming the layer and the config
option, since the rebuilt model's config could not represent them). The head coordinate is
laid out identically on both sides (the rows of W_Q are grouped by head as (H, d_h)), so the
map is a plain copy.
``from_hf_model`` is check -> config (``bert_config``: a ``HFBertConfig``, kept as the model's
``source``) -> build -> copy; ``to_hf_model`` rebuilds from the source and copies back.
``transformers`` is imported only by ``to_hf_model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..models.bert import BertEncoderModel, BertSequenceClassifier, bert_model
from ..time.schemes import lie
from .activations import BERT_ACTIVATIONS
from .families import classes_of
from .hf import HFSource, attn_implementation, hf_config, hf_source, no_options
from .weights import Row, check_covered, check_softmax, copy_table, network_scheme, prefixed

__all__ = ["BERT_WEIGHT_MAP", "HFBertConfig", "bert_config", "build", "check_config",
           "from_hf_model", "to_hf_model", "weight_map"]

HF_CLASSES = classes_of("hf_bert")  # the classes of its family record(s): a live view

# one layer: transformers name <-> the name in theta^n
_LAYER_ROWS: tuple[Row, ...] = (
    Row("attention.self.query.weight", "attention.qkv_weight", block=(0, 3)),
    Row("attention.self.query.bias", "attention.qkv_bias", block=(0, 3)),
    Row("attention.self.key.weight", "attention.qkv_weight", block=(1, 3)),
    Row("attention.self.key.bias", "attention.qkv_bias", block=(1, 3)),
    Row("attention.self.value.weight", "attention.qkv_weight", block=(2, 3)),
    Row("attention.self.value.bias", "attention.qkv_bias", block=(2, 3)),
    Row("attention.output.dense.weight", "attention.out_weight"),
    Row("attention.output.dense.bias", "attention.out_bias"),
    Row("attention.output.LayerNorm.weight", "norm1.weight"),
    Row("attention.output.LayerNorm.bias", "norm1.bias"),
    Row("intermediate.dense.weight", "ffn.stages.0.weight"),
    Row("intermediate.dense.bias", "ffn.stages.0.bias"),
    Row("output.dense.weight", "ffn.stages.1.weight"),
    Row("output.dense.bias", "ffn.stages.1.bias"),
    Row("output.LayerNorm.weight", "norm2.weight"),
    Row("output.LayerNorm.bias", "norm2.bias"),
    Row("attention.self.dropout.p", "attention.attn_dropout", attr=True,
        option="attention_probs_dropout_prob"),
    Row("attention.output.dropout.p", "attention.out_dropout.p", attr=True,
        option="hidden_dropout_prob"),
    Row("output.dropout.p", "ffn.out_dropout.p", attr=True, option="hidden_dropout_prob"),
    Row("attention.output.LayerNorm.eps", "norm1.eps", attr=True, option="layer_norm_eps"),
    Row("output.LayerNorm.eps", "norm2.eps", attr=True, option="layer_norm_eps"),
)

_EMBEDDING_ROWS: tuple[Row, ...] = (
    Row("embeddings.word_embeddings.weight", "embedding.word.weight"),
    Row("embeddings.position_embeddings.weight", "embedding.position.weight"),
    Row("embeddings.token_type_embeddings.weight", "embedding.token_type.weight"),
    Row("embeddings.LayerNorm.weight", "embedding.norm.weight"),
    Row("embeddings.LayerNorm.bias", "embedding.norm.bias"),
    Row("embeddings.LayerNorm.eps", "embedding.norm.eps", attr=True, option="layer_norm_eps"),
    Row("embeddings.dropout.p", "embedding.dropout.p", attr=True, option="hidden_dropout_prob"),
)

_POOLER_ROWS = (Row("pooler.dense.weight", "pooler.weight"),
                Row("pooler.dense.bias", "pooler.bias"))
_CLASSIFIER_ROWS = (Row("classifier.weight", "classifier.weight"),
                    Row("classifier.bias", "classifier.bias"),
                    Row("dropout.p", "classifier.dropout.p", attr=True,
                        option="classifier_dropout"))

# the whole table, with n for the layer index (docs and tests read it)
BERT_WEIGHT_MAP: tuple[Row, ...] = (
    *_EMBEDDING_ROWS,
    *prefixed(_LAYER_ROWS, "encoder.layer.n.", "evolution.controls.sets.n."),
    *_POOLER_ROWS,
    *_CLASSIFIER_ROWS,
)

# non-persistent in transformers 5 (older versions saved them): rebuilt, never copied
_DEFAULT_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


@dataclass(frozen=True, kw_only=True)
class HFBertConfig(HFSource):
    """A transformers BERT as splitformer reads it: ``BertConfig``'s fields that fix the
    operators (``hidden_act`` is transformers' name), and what the modules say beyond the
    config (the pooler, the classifier's width, the padding index)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    hidden_dropout_prob: float
    attention_probs_dropout_prob: float
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int | None
    add_pooling_layer: bool
    num_labels: int | None = None  # None: BertModel
    classifier_dropout: float | None = None
    problem_type: str | None = None

    @property
    def classifier(self) -> bool:
        return self.hf_class == "BertForSequenceClassification"


def weight_map(num_layers: int, *, pooler: bool, classifier: bool) -> list[Row]:
    """Every row (tensors and attributes) of one model, transformers' names from its root."""
    prefix = "bert." if classifier else ""
    rows = prefixed(_EMBEDDING_ROWS, prefix, "")
    for n in range(num_layers):
        rows += prefixed(_LAYER_ROWS, f"{prefix}encoder.layer.{n}.",
                         f"evolution.controls.sets.{n}.")
    if pooler:
        rows += prefixed(_POOLER_ROWS, prefix, "")
    if classifier:
        rows += list(_CLASSIFIER_ROWS)
    return rows


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


def bert_config(model: nn.Module) -> HFBertConfig:
    """Check a transformers BertModel / BertForSequenceClassification (ValueError naming the
    first unsupported option or weight) and read its typed config."""
    cls = type(model).__name__
    if cls not in HF_CLASSES:
        raise TypeError(f"expected one of {HF_CLASSES}, got {cls}")
    classifier = cls == "BertForSequenceClassification"
    bert = model.bert if classifier else model
    config = model.config
    check_config(config)
    prefix = "bert." if classifier else ""
    state = model.state_dict()
    _check_buffers(state, prefix)
    rows = weight_map(len(bert.encoder.layer), pooler=bert.pooler is not None,
                      classifier=classifier)
    check_covered(state, rows, "BERT", ignore=lambda k: k.removeprefix(prefix) in _DEFAULT_BUFFERS)
    return HFBertConfig(
        hf_class=cls,
        config=config.to_dict(),
        attn_implementation=attn_implementation(config),
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=len(bert.encoder.layer),
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        hidden_dropout_prob=float(config.hidden_dropout_prob),
        attention_probs_dropout_prob=float(config.attention_probs_dropout_prob),
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=float(config.layer_norm_eps),
        pad_token_id=bert.embeddings.word_embeddings.padding_idx,
        add_pooling_layer=bert.pooler is not None,
        num_labels=model.classifier.out_features if classifier else None,
        classifier_dropout=float(model.dropout.p) if classifier else None,
        problem_type=getattr(config, "problem_type", None),
    )


def build(config: HFBertConfig, *, device=None, dtype=None) -> BertEncoderModel:
    """The splitformer BERT of ``config`` with random weights; ``source`` = ``config``."""
    return bert_model(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        activation=BERT_ACTIVATIONS[config.hidden_act],
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_eps,
        pad_token_id=config.pad_token_id,
        add_pooling_layer=config.add_pooling_layer,
        num_labels=config.num_labels,
        classifier_dropout=config.classifier_dropout,
        problem_type=config.problem_type,
        additive_mask=config.attn_implementation == "eager",
        source=config,
        device=device,
        dtype=dtype,
    )


def from_hf_model(model: nn.Module, **kwargs: Any) -> BertEncoderModel:
    """The splitformer model with the same outputs as a transformers BertModel /
    BertForSequenceClassification (a pure weight map; the source module is never called)."""
    no_options(kwargs, "BERT")
    config = bert_config(model)
    p = next(model.parameters())
    ours = build(config, device=p.device, dtype=p.dtype)
    rows = weight_map(config.num_hidden_layers, pooler=config.add_pooling_layer,
                      classifier=config.classifier)
    copy_table(rows, theirs=model, ours=ours, into="ours")
    ours.train(model.training)
    return ours


def to_hf_model(model: BertEncoderModel) -> nn.Module:
    """The transformers model with the same weights: the inverse of ``from_hf_model``.

    It is built from the source config, which fixes every eps and dropout rate: each layer's
    must equal it (ValueError naming the layer and the option), so that the model and its
    config agree (save_pretrained / from_pretrained keep what to_hf returns)."""
    import transformers

    if not isinstance(model, BertEncoderModel):
        raise TypeError(f"to_hf for BERT expects a BertEncoderModel, got {type(model).__name__}")
    source = hf_source(model, HF_CLASSES, HFBertConfig)
    evo = model.evolution
    network_scheme(evo, {"lie": lie()}, "to_hf")
    check_softmax(evo, "to_hf")
    if source.classifier != isinstance(model, BertSequenceClassifier):
        raise ValueError(f"model.source.hf_class={source.hf_class!r} does not match "
                         f"{type(model).__name__}")
    config = hf_config(source)
    config.num_hidden_layers = len(evo.controls)  # one layer per step (coarsened: fewer)
    add_pooling = model.pooler is not None
    if source.classifier:
        out = transformers.BertForSequenceClassification(config)
    else:
        out = transformers.BertModel(config, add_pooling_layer=add_pooling)
    p = next(model.parameters())
    out = out.to(device=p.device, dtype=p.dtype)
    rows = weight_map(len(evo.controls), pooler=add_pooling, classifier=source.classifier)
    copy_table(rows, theirs=out, ours=model, into="theirs", attributes="check")
    out.train(model.training)
    return out
