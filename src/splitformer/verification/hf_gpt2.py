"""Checks of the GPT-2 family: transformers' GPT2Model / GPT2LMHeadModel against the causal
evolution of ``splitformer.models.causal`` (weight map ``splitformer.interop.hf_gpt2``).

Each check builds a small random-weight GPT-2 (seeded; every parameter perturbed so that norms
and biases are non-trivial), converts it with ``from_hf`` and returns the max abs difference of
the named output on a batch with left and right padding. The reference is transformers itself,
on the attention path the check names.
"""

from __future__ import annotations

import torch

from . import register
from .references import maxdiff, perturb_, require_transformers

_SMALL = {
    "vocab_size": 67,
    "n_embd": 32,
    "n_layer": 3,
    "n_head": 4,
    "n_positions": 24,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "attn_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
}


def _pair(dtype: torch.dtype, *, lm: bool = False, attn: str = "sdpa", **overrides):
    """(transformers model, splitformer model, inputs) in eval mode, on a padded batch."""
    from ..interop.hf_gpt2 import from_hf_model

    tr = require_transformers()
    torch.manual_seed(0)
    config = tr.GPT2Config(**{**_SMALL, **overrides})
    config._attn_implementation = attn
    ref = (tr.GPT2LMHeadModel(config) if lm else tr.GPT2Model(config)).to(dtype).eval()
    perturb_(ref, seed=2)
    ours = from_hf_model(ref)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, 7:] = 0  # right padding
    return ref, ours, {"input_ids": ids, "attention_mask": mask}


@register("gpt2", "causal (Volterra) kernel, pre-LN Euler steps, read-out ln_f",
          "transformers GPT2Model last_hidden_state (sdpa, padding mask)")
def check_last_hidden_state(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype)
    with torch.no_grad():
        return maxdiff(ref(**inputs).last_hidden_state, ours(**inputs).last_hidden_state)


@register("gpt2", "causal kernel with additive finfo.min support",
          "transformers GPT2Model (eager attention, padding mask)")
def check_eager(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype, attn="eager")
    with torch.no_grad():
        return maxdiff(ref(**inputs).last_hidden_state, ours(**inputs).last_hidden_state)


@register("gpt2", "trajectory u(t_n), n = 0..L-1, and P_f(u(T))",
          "transformers GPT2Model hidden_states")
def check_hidden_states(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype)
    with torch.no_grad():
        hs = ref(**inputs, output_hidden_states=True).hidden_states
        mine = ours(**inputs, output_hidden_states=True).hidden_states
    if len(hs) != len(mine):
        return float("inf")
    return max(maxdiff(a, b) for a, b in zip(hs, mine, strict=True))


@register("gpt2", "LM read-out <P_f u(T), E_w> (tied embedding)",
          "transformers GPT2LMHeadModel logits")
def check_logits(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype, lm=True)
    with torch.no_grad():
        return maxdiff(ref(**inputs).logits, ours(**inputs).logits)


@register("gpt2", "kernel scale 1/(sqrt(d_h) (n+1)), ReLU field",
          "GPT2Model scale_attn_by_inverse_layer_idx, activation relu")
def check_scales(dtype: torch.dtype) -> float:
    ref, ours, inputs = _pair(dtype, scale_attn_by_inverse_layer_idx=True,
                              activation_function="relu")
    with torch.no_grad():
        return maxdiff(ref(**inputs).last_hidden_state, ours(**inputs).last_hidden_state)
