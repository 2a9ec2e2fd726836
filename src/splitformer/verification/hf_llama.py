"""Checks of the Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3 text): transformers'
``*Model`` / ``*ForCausalLM`` against the rotary decoder of ``splitformer.models.llama`` (weight
map ``splitformer.interop.hf_llama``, docs/interop.md "The Llama family").

One group per family whose record's map is ``hf_llama`` (registry-driven: a family derived
later gets its rows too), four rows each, all on the record's small ``example`` config
(``ModelFamily.reference``, every parameter perturbed so that the RMSNorm gains are not 1):

* LM logits on a batch of 3 with left and right padding (``attention_mask``);
* the base model's last hidden state with explicit ``position_ids`` (one row a continuation
  from position 5);
* the round trip ``to_hf(from_hf(m))``: the same class, bitwise the same state dict, the same
  logits;
* greedy ``generate`` on the tape (and without it) against transformers' greedy ``generate``,
  left-padded prompts, 12 new tokens: the max |difference| of the new ids (0: the same ids)
  and of the raw logits each was chosen from (transformers' float32 ones in its float64 run).

The reference runs transformers' sdpa path, except for a family with soft-capped scores
(Gemma2), whose transformers attention is eager only. transformers' eager softmax runs in
float32 even in a float64 model: a fully masked query (a left pad) becomes -inf everywhere and
its row NaN, so in float64 Gemma2's logits are compared on the rows without left padding and
its prompts are unpadded (float32 has the left padding).
"""

from __future__ import annotations

from typing import Any

import torch

from ..interop.families import ModelFamily, families, family
from . import register
from .references import maxdiff, perturb_, require_transformers

MAP = "hf_llama"
NEW_TOKENS = 12


def softcapped(f: ModelFamily) -> bool:
    """Soft-capped scores: transformers runs them on its eager path only."""
    return bool(f.traits.get("softcap") and f.example.get("attn_logit_softcapping"))


def implementation(f: ModelFamily) -> str:
    """transformers' attention path the checks of ``f`` compare against."""
    return "eager" if softcapped(f) else "sdpa"


def _nan_rows(f: ModelFamily, dtype: torch.dtype) -> bool:
    """transformers' path is NaN on left-padded rows (eager softmax in float32, float64)."""
    return implementation(f) == "eager" and dtype == torch.float64


def describe(f: ModelFamily) -> str:
    """The continuous model of family ``f``, its deltas read from the record (traits and the
    example config), never from its name."""
    t, ex = f.traits, f.example
    heads, kv = ex.get("num_attention_heads"), ex.get("num_key_value_heads")
    act = ex.get(t.get("activation_key", "hidden_act"), "silu")
    parts = [f"RMSNorm projection{' (gain 1 + g)' if t.get('norm_offset') else ''}",
             f"gated {act} field",
             f"causal kernel of {heads} heads on {kv} key/value heads, rotary angles"]
    if t.get("qkv_bias"):
        parts.append("q/k/v biases")
    if t.get("qk_norm"):
        parts.append("QK-norm (each head's q, k projected)")
    window = ex.get("sliding_window")
    if ex.get("layer_types"):
        kinds = ", ".join(dict.fromkeys(ex["layer_types"]))
        parts.append(f"layer types {kinds} (window {window}, a local and a global rotary)")
    elif t.get("window") == "all" and window is not None:
        parts.append(f"sliding window {window} on every step")
    if t.get("sandwich"):
        parts.append("sandwich steps (post-norms)")
    if t.get("pre_attn_scalar"):
        parts.append("score scale query_pre_attn_scalar^-1/2")
    if softcapped(f):
        parts.append("soft-capped scores (kernel)")
    if t.get("softcap") and ex.get("final_logit_softcapping"):
        parts.append("soft-capped logits")
    if t.get("embed_scale"):
        parts.append("u(0) = sqrt(d) E_w")
    if ex.get("tie_word_embeddings"):
        parts.append("tied read-out")
    return ", ".join(parts)


def _pair(name: str, dtype: torch.dtype, *, lm: bool = True) -> tuple[Any, Any]:
    """(transformers model, splitformer model) of family ``name``, eval mode."""
    from ..interop.hf import from_hf

    require_transformers()
    f = family(name)
    ref = f.reference(f.classes[1] if lm else f.classes[0], dtype=dtype, seed=0)
    ref.config._attn_implementation = implementation(f)
    perturb_(ref, seed=7)
    return ref, from_hf(ref)


def _padded(f: ModelFamily, b: int = 3, n: int = 9, seed: int = 1):
    """ids (b, n) from 2 up (0 is the pad, 1 the eos) and a mask: row 1 left-padded by 3,
    row 2 (where b > 2) right-padded by 2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, int(f.example["vocab_size"]), (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, :3] = 0
    if b > 2:
        mask[2, n - 2:] = 0
    return ids, mask


def _nan_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| where NaN must meet NaN (inf otherwise; shapes must agree)."""
    if a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return float("inf")
    both = a.isnan()
    return maxdiff(a.masked_fill(both, 0), b.masked_fill(both, 0))


def check_logits(name: str, dtype: torch.dtype) -> float:
    f = family(name)
    ref, ours = _pair(name, dtype)
    ids, mask = _padded(f)
    keep = mask.bool()
    if _nan_rows(f, dtype):
        keep &= mask[:, :1].bool()  # rows without left padding
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    return maxdiff(want[keep], got[keep])


def check_positions(name: str, dtype: torch.dtype) -> float:
    f = family(name)
    ref, ours = _pair(name, dtype, lm=False)
    ids, _ = _padded(f, b=2, n=7)
    pos = torch.stack([torch.arange(5, 12), torch.arange(7)])
    with torch.no_grad():
        want = ref(input_ids=ids, position_ids=pos).last_hidden_state
        got = ours(input_ids=ids, position_ids=pos).last_hidden_state
    return maxdiff(want, got)


def check_round_trip(name: str, dtype: torch.dtype) -> float:
    from ..interop.hf import to_hf

    f = family(name)
    ref, ours = _pair(name, dtype)
    back = to_hf(ours)
    a, b = ref.state_dict(), back.state_dict()
    if type(back) is not type(ref) or list(a) != list(b) or any(
            a[k].dtype != b[k].dtype or a[k].shape != b[k].shape for k in a):
        return float("inf")
    ids, mask = _padded(f)
    with torch.no_grad():
        logits = _nan_diff(ref(input_ids=ids, attention_mask=mask).logits,
                           back(input_ids=ids, attention_mask=mask).logits)
    return max([logits, *(maxdiff(a[k].double(), b[k].double()) for k in a)])


def check_generate(name: str, dtype: torch.dtype) -> float:
    """The max |difference| of the new ids, transformers' greedy decoding (its own cache)
    against the tape and the tape against the cacheless oracle, and of the raw logits each new
    token of transformers and of the tape was chosen from (in transformers' dtype: its
    ``generate`` casts the next-token logits to float32)."""
    f = family(name)
    ref, ours = _pair(name, dtype)
    ids, mask = _padded(f, b=2, n=7)
    if _nan_rows(f, dtype):
        mask = torch.ones_like(mask)  # unpadded prompts (module docstring)
    # no stop on either side: every row decodes NEW_TOKENS tokens (the eos default is a test)
    kw = {"attention_mask": mask, "max_new_tokens": NEW_TOKENS, "pad_token_id": 0,
          "eos_token_id": None}
    with torch.no_grad():
        want = ref.generate(ids, do_sample=False, output_logits=True,
                            return_dict_in_generate=True, **kw)
        tape = ours.generate(ids, return_logits=True, **kw)
        oracle = ours.generate(ids, use_cache=False, **kw)
    if not (want.sequences.shape == tape.sequences.shape == oracle.shape
            and len(want.logits) == len(tape.logits)):
        return float("inf")
    theirs = torch.stack(want.logits)
    return max(maxdiff(want.sequences.double(), tape.sequences.double()),
               maxdiff(tape.sequences.double(), oracle.double()),
               maxdiff(theirs, torch.stack(tape.logits).to(theirs.dtype)))


def _register(f: ModelFamily) -> None:
    """The four rows of family ``f`` in its group (``f.name``)."""
    causal, base = f.classes[1], f.classes[0]
    impl = implementation(f)
    eager = impl == "eager"
    rows = [
        (check_logits, f"rotary decoder: {describe(f)}; LM read-out",
         f"transformers {causal} logits ({impl}, left and right padding, batch 3"
         + ("; float64: the rows without left padding, NaN there in transformers' float32 "
            "eager softmax)" if eager else ")")),
        (check_positions, "rotary angles at the given coordinates, read-out norm",
         f"transformers {base} last_hidden_state ({impl}, position_ids, one row from 5, "
         "batch 2)"),
        (check_round_trip, "to_hf(from_hf(m)): the identity",
         f"{causal}: the same class, state dict bitwise, logits on the padded batch"),
        (check_generate, f"greedy generate on the tape and without it, {NEW_TOKENS} new tokens: "
         "max |diff| of the ids and of the logits they are chosen from",
         f"transformers {causal}.generate(do_sample=False) ({impl}), left-padded prompts"
         + (" (float64: unpadded)" if eager else "") + ", batch 2; logits in float32 where "
         "the model is float64 (generate casts them)"),
    ]
    for fn, claim, reference in rows:
        register(f.name, claim, reference)(
            lambda dtype, fn=fn, name=f.name: fn(name, dtype))


# one group per family of the map (derived records inherit this module: families.py)
for _f in families("transformers"):
    if _f.map == MAP and _f.example and _f.verification == __name__:
        _register(_f)
