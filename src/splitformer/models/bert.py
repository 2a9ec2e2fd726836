"""BERT as an evolution: initial condition f, the post-LN Lie scheme, and read-outs.

The continuous model (docs/math.md section 1) on the token grid x = 0..N-1 and feature grid y:

    u(x, y, 0) = f(x, y) = P_S1( E_w(id_x, y) + E_t(type_x, y) + E_p(pos_x, y) )
    u_t = A[u] + G[u] - dI_S1(u)                                     on (0, T], T = L
    pooled      = tanh( W_P u(x_0, ., T) + b_P )                     (x_0 = the [CLS] token)
    logits      = W_C pooled + b_C

P_S1 is the embedding LayerNorm read as a projection with a ghost feature point and a
per-feature affine map (docs/math.md 3.1; eps = layer_norm_eps, 1e-12 for BERT): the initial
condition already lies on the constraint set. One BERT layer is one step (tau = 1) of the Lie
scheme with the FFN as a vector field (``splitformer.time.schemes.lie``):

    u <- u + tau A(u)      self-attention + its residual      (explicit Euler)
    u <- P1(u)             attention.output.LayerNorm          (projection substep)
    u <- u + tau G(u)      G(u) = W_2 s(W_1 u + b_1) + b_2     (explicit Euler)
    u <- P2(u)             output.LayerNorm                    (projection substep)

with s = GELU in its exact erf form (``hidden_act="gelu"``), or ReLU (the projection onto S2 of
the lifted hidden field), tanh-GELU, SiLU or tanh. Dropout acts where BERT puts it: on the
embedded field, on the attention kernel g(x, x') (``attention_probs_dropout_prob``), on A(u) and
on G(u) (``hidden_dropout_prob``) and before the classifier. The padding mask removes padded
tokens x' from the support of the kernel: m(x, x') = 0 on kept keys and the most negative finite
number of the dtype (``torch.finfo(dtype).min``, as transformers' eager path builds it) or a
boolean False (its sdpa path) on padded ones. Without an attention mask, ``position_ids`` that
do not step by +1 mark packed sequences, as transformers 5 reads them: a sequence starts at
each such token, and the support is each token's own sequence (``masks.packed_support``).

On a token grid (docs/math.md 3.12; every forward takes ``token_weights`` w_j and
``token_coords`` x_j, (N,) or (B, N), None = uniform / the index 0..N-1): the kernel integrates
against the weights (softmax(a + log w)), a weight-0 node is padding (the same outputs at the
other nodes as ``attention_mask`` 0 there), and the position term is p(x_j), the learned table
read as samples of p(x) (a gather at integer coordinates, linear interpolation between rows,
``embeddings.sample_positions``; coordinates outside [0, max_position_embeddings - 1] and
position_ids together with token_coords are refused). The pooler reads the node x_0 (the [CLS]
token) and never integrates over x, so it is unchanged by the weights.

Nothing here imports ``transformers``: the weight map lives in ``splitformer.interop.hf_bert``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..operators.base import Context
from ..time import Evolution, TimeGrid
from ..time.schemes import lie
from .base import EvolutionModel, keep_steps, path_states
from .embeddings import TokenEmbedding
from .encoder import encoder_controls
from .masks import finfo_additive, packed_support, padding_support, with_token_grid
from .outputs import ModelOutput

__all__ = [
    "BertClassifierOutput",
    "BertEncoderModel",
    "BertEncoderOutput",
    "BertSequenceClassifier",
    "ClassTokenPooler",
    "SequenceClassifierHead",
    "bert_model",
]

PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")


@dataclass
class BertEncoderOutput(ModelOutput):
    """u(T), the pooled read-out and, when asked, u(t_i) at every grid point."""

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class BertClassifierOutput(ModelOutput):
    """Classifier read-out (and its loss when labels are given), with u(T) and the pooled state."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None


class ClassTokenPooler(nn.Module):
    """Read-out R(u) = tanh(W u(x_0, ., T) + b): a feature integral at the first token x_0."""

    def __init__(self, dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.uniform_(self.bias, -1.0 / math.sqrt(dim), 1.0 / math.sqrt(dim))

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[0]}, x0=first token, tanh"

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.linear(u[:, 0], self.weight, self.bias))


class SequenceClassifierHead(nn.Module):
    """logits = W_C dropout(pooled) + b_C."""

    def __init__(self, dim: int, num_labels: int, *, dropout: float = 0.0, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.num_labels = num_labels
        self.dropout = nn.Dropout(dropout)
        self.weight = nn.Parameter(torch.empty(num_labels, dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(num_labels, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.uniform_(self.bias, -1.0 / math.sqrt(dim), 1.0 / math.sqrt(dim))

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[1]}, num_labels={self.num_labels}"

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return F.linear(self.dropout(pooled), self.weight, self.bias)


class BertEncoderModel(EvolutionModel):
    """BERT's encoder: u(0) = f (``embedding``), u(T) = evolution(f), read-out ``pooler``.

    forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds) takes the
    inputs of transformers' ``BertModel`` and returns ``last_hidden_state`` = u(T) and
    ``pooler_output`` = R(u(T)); ``output_hidden_states=True`` adds u(t_i) at every grid point
    (at tau = 1 these are BERT's hidden states: the embedding output and every layer's output).
    ``token_weights`` / ``token_coords`` (keywords; (N,) or (B, N)) give the token grid: the
    quadrature weights of every kernel and the coordinates the positions and relative kernels
    read (module docstring).

    ``additive_mask`` selects how a 2-D padding mask becomes the kernel's support: an additive
    float mask with ``torch.finfo(dtype).min`` on padded keys (transformers' eager path) or a
    boolean one (its sdpa path). A mask with no padded key is dropped (full support), and a 4-D
    mask is used as given, as transformers does.

    ``num_prefix_tokens`` = 1: the [CLS] node, which the pooler reads, is never merged
    (``with_token_merging``).
    """

    num_prefix_tokens = 1

    def __init__(
        self,
        embedding: TokenEmbedding,
        evolution: Evolution,
        *,
        pooler: ClassTokenPooler | None = None,
        additive_mask: bool = False,
        source: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.evolution = evolution
        self.pooler = pooler
        self.additive_mask = bool(additive_mask)
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)

    # -- the kernel's support ---------------------------------------------------------------
    def attention_support(
        self, attention_mask: torch.Tensor | None, batch: int, seq: int, dtype: torch.dtype,
        device: torch.device, position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """The mask m(x, x') handed to the attention kernel, built as transformers 5 builds it:
        the padding of ``attention_mask``; without one, the packed sequences that
        ``position_ids`` marks (``masks.packed_support``)."""
        if attention_mask is None:
            keep, prepared = packed_support(position_ids, batch, seq, device), False
        else:
            keep, prepared = padding_support(attention_mask, batch, seq, device)
        if keep is None or prepared or not self.additive_mask:
            return keep
        return finfo_additive(keep, dtype)

    def initial_condition(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Context]:
        """u(0) = f (positions p(x_j) with ``token_coords``) and the context: the kernel's
        support, the token grid (checked against N), and for the read-out the labels and
        whether to keep the hidden states."""
        u0 = self.embedding(input_ids, token_type_ids, position_ids, inputs_embeds,
                            token_coords=token_coords)
        b, n, _ = u0.shape
        mask = self.attention_support(attention_mask, b, n, u0.dtype, u0.device,
                                      position_ids)
        ctx = with_token_grid(Context(attn_mask=mask, readout={"labels": labels}), token_weights,
                              token_coords, batch=b, seq=n, owner=type(self).__name__,
                              dtype=u0.dtype)
        return u0, keep_steps(ctx, output_hidden_states)

    def read_out(self, u: torch.Tensor, context: Context) -> BertEncoderOutput:
        """last_hidden_state = u(T), pooler_output = R(u(T)) (None without a pooler), and the
        hidden states u(t_0), ..., u(t_N) when kept."""
        pooled = self.pooler(u) if self.pooler is not None else None
        return BertEncoderOutput(last_hidden_state=u, pooler_output=pooled,
                                 hidden_states=path_states(context))

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
    ) -> BertEncoderOutput:
        return self.solve(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          output_hidden_states=output_hidden_states,
                          token_weights=token_weights, token_coords=token_coords)


class BertSequenceClassifier(BertEncoderModel):
    """BertForSequenceClassification: the encoder with read-out logits = W_C R(u(T)) + b_C.

    With ``labels`` the loss is computed as transformers does: mean squared error for one label
    (regression), cross entropy for integer labels, binary cross entropy with logits otherwise;
    ``problem_type`` fixes the choice when set.
    """

    def __init__(
        self,
        embedding: TokenEmbedding,
        evolution: Evolution,
        *,
        pooler: ClassTokenPooler,
        classifier: SequenceClassifierHead,
        problem_type: str | None = None,
        additive_mask: bool = False,
        source: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(embedding, evolution, pooler=pooler, additive_mask=additive_mask,
                         source=source)
        self.classifier = classifier
        if problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type must be one of {PROBLEM_TYPES}, got {problem_type!r}")
        self.problem_type = problem_type

    @property
    def num_labels(self) -> int:
        return self.classifier.num_labels

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        kind = self.problem_type
        n = self.num_labels
        if kind is None:
            if n == 1:
                kind = "regression"
            elif labels.dtype in (torch.long, torch.int):
                kind = "single_label_classification"
            else:
                kind = "multi_label_classification"
        if kind == "regression":
            if n == 1:
                return F.mse_loss(logits.squeeze(), labels.squeeze())
            return F.mse_loss(logits, labels)
        if kind == "single_label_classification":
            return F.cross_entropy(logits.view(-1, n), labels.view(-1))
        if kind == "multi_label_classification":
            return F.binary_cross_entropy_with_logits(logits, labels)
        raise AssertionError(kind)  # PROBLEM_TYPES is checked when the model is built

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
    ) -> BertClassifierOutput:
        return self.solve(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          labels, output_hidden_states=output_hidden_states,
                          token_weights=token_weights, token_coords=token_coords)

    def read_out(self, u: torch.Tensor, context: Context) -> BertClassifierOutput:
        """logits = W_C R(u(T)) + b_C, and the loss when labels were given."""
        enc = super().read_out(u, context)
        logits = self.classifier(enc.pooler_output)
        labels = context.readout.get("labels")
        loss = self.loss(logits, labels) if labels is not None else None
        return BertClassifierOutput(
            loss=loss, logits=logits, hidden_states=enc.hidden_states,
            last_hidden_state=enc.last_hidden_state, pooler_output=enc.pooler_output,
        )


def _check_sizes(vocab_size, max_position_embeddings, type_vocab_size, pad_token_id,
                 num_labels) -> None:
    """The integer arguments of ``bert_model``: sizes >= 1, the pad id inside the vocabulary,
    num_labels None or >= 1 (ValueError naming the argument)."""
    for name, value in (("vocab_size", vocab_size), ("max_position_embeddings",
                        max_position_embeddings), ("type_vocab_size", type_vocab_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if pad_token_id is not None and not 0 <= pad_token_id < vocab_size:
        raise ValueError(f"pad_token_id must be None or in [0, vocab_size={vocab_size}), got "
                         f"{pad_token_id!r}")
    if num_labels is not None and (isinstance(num_labels, bool) or not isinstance(
            num_labels, int) or num_labels < 1):
        raise ValueError(f"num_labels must be None (no classifier) or an int >= 1, got "
                         f"{num_labels!r}")


def bert_model(
    *,
    vocab_size: int = 30522,
    hidden_size: int = 768,
    num_hidden_layers: int = 12,
    num_attention_heads: int = 12,
    intermediate_size: int = 3072,
    activation: str = "gelu",
    hidden_dropout_prob: float = 0.1,
    attention_probs_dropout_prob: float = 0.1,
    max_position_embeddings: int = 512,
    type_vocab_size: int = 2,
    layer_norm_eps: float = 1e-12,
    pad_token_id: int | None = 0,
    add_pooling_layer: bool = True,
    num_labels: int | None = None,
    classifier_dropout: float | None = None,
    problem_type: str | None = None,
    additive_mask: bool = False,
    source: Mapping[str, Any] | None = None,
    device=None,
    dtype=None,
) -> BertEncoderModel:
    """A BERT-shaped model with random weights (arguments named as in ``BertConfig``, except
    ``activation``: a splitformer ``Activation`` name; interop maps transformers' hidden_act).

    ``num_labels`` given: a ``BertSequenceClassifier`` (pooler required); otherwise a
    ``BertEncoderModel``. ``classifier_dropout`` None means ``hidden_dropout_prob``, as in BERT.
    """
    _check_sizes(vocab_size, max_position_embeddings, type_vocab_size, pad_token_id, num_labels)
    kw = {"device": device, "dtype": dtype}
    embedding = TokenEmbedding(
        vocab_size, max_position_embeddings, hidden_size, type_vocab_size=type_vocab_size,
        norm_eps=layer_norm_eps, dropout=hidden_dropout_prob, padding_idx=pad_token_id, **kw,
    )
    controls = encoder_controls(
        hidden_size, num_attention_heads, intermediate_size, num_hidden_layers,
        activation=activation, layer_norm_eps=layer_norm_eps,
        attn_dropout=float(attention_probs_dropout_prob), out_dropout=float(hidden_dropout_prob),
        ffn_dropout=0.0,  # BERT has no dropout on the hidden (lifted) field
        **kw,
    )
    evolution = Evolution(controls, lie(), TimeGrid(num_hidden_layers, num_hidden_layers))
    pooler = ClassTokenPooler(hidden_size, **kw) if add_pooling_layer else None
    if num_labels is None:
        return BertEncoderModel(embedding, evolution, pooler=pooler, additive_mask=additive_mask,
                                source=source)
    if pooler is None:
        raise ValueError("a sequence classifier reads the pooled state: add_pooling_layer=True")
    p = hidden_dropout_prob if classifier_dropout is None else classifier_dropout
    head = SequenceClassifierHead(hidden_size, num_labels, dropout=float(p), **kw)
    return BertSequenceClassifier(embedding, evolution, pooler=pooler, classifier=head,
                                  problem_type=problem_type, additive_mask=additive_mask,
                                  source=source)
