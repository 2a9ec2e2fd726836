"""Checks of the BERT family: transformers' BertModel against its splitformer weight map.

Each check builds a small random-weight BERT (seeded), converts it with ``from_hf``, runs both
on the same padded batch and returns the max abs difference of the named output. The reference
is transformers itself (its sdpa attention path unless the check names eager).
"""

from __future__ import annotations

import torch

from . import register
from .references import maxdiff, require_transformers

_SMALL = {
    "vocab_size": 97,
    "hidden_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "max_position_embeddings": 40,
    "type_vocab_size": 2,
}


def _pair(dtype: torch.dtype, *, classifier: bool = False, attn: str = "sdpa", **overrides):
    """(transformers model, splitformer model, inputs) in eval mode, on a padded batch."""
    from ..interop.hf_bert import from_hf_model

    tr = require_transformers()
    torch.manual_seed(0)
    config = tr.BertConfig(**{**_SMALL, **overrides})
    config._attn_implementation = attn
    if classifier:
        config.num_labels = 3
        ref = tr.BertForSequenceClassification(config)
    else:
        ref = tr.BertModel(config)
    ref = ref.to(dtype).eval()
    ours = from_hf_model(ref)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (3, 12), generator=g)
    types = torch.randint(0, config.type_vocab_size, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return ref, ours, inputs


@register("bert", "BERT encoder = post-LN Lie scheme (GELU, eps 1e-12)",
          "transformers BertModel last_hidden_state (sdpa, padding mask)")
def check_last_hidden_state(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype)
    with torch.no_grad():
        return maxdiff(ref(**inputs).last_hidden_state, ours(**inputs).last_hidden_state)


@register("bert", "BERT encoder, ReLU FFN, additive finfo.min mask",
          "transformers BertModel hidden_act='relu' (eager attention)")
def check_relu_eager(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype, attn="eager", hidden_act="relu")
    with torch.no_grad():
        return maxdiff(ref(**inputs).last_hidden_state, ours(**inputs).last_hidden_state)


@register("bert", "trajectory u(t_n), n = 0..L (u(0) = LN of the embeddings)",
          "transformers BertModel hidden_states")
def check_hidden_states(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype)
    with torch.no_grad():
        hs = ref(**inputs, output_hidden_states=True).hidden_states
        traj = ours.trajectory(**inputs)
    if len(hs) != len(traj):
        return float("inf")
    return max(maxdiff(a, b) for a, b in zip(hs, traj.states, strict=True))


@register("bert", "pooler = tanh(W u(x_0, T) + b) read-out",
          "transformers BertModel pooler_output")
def check_pooler(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype)
    with torch.no_grad():
        return maxdiff(ref(**inputs).pooler_output, ours(**inputs).pooler_output)


@register("bert", "classifier = linear read-out of the pooled state",
          "transformers BertForSequenceClassification logits")
def check_classifier(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype, classifier=True)
    with torch.no_grad():
        return maxdiff(ref(**inputs).logits, ours(**inputs).logits)
