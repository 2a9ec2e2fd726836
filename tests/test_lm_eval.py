"""The evaluation harness of compressed decoder LLMs (``experiments.lm_eval``, issue 31).

On a tiny random transformers ``LlamaForCausalLM`` (2 layers, width 32, vocabulary 128) and
``splitformer.from_hf`` of it, with a synthetic ``LMText`` (no data needed): the teacher
against itself (kl 0, top-1 1, all 32 greedy ids), transformers' model against the splitformer
teacher (the same, float32 tolerance), perplexity against exp(cross_entropy) of transformers'
own logits (the reference), bits per byte on a known case, a perturbed model (kl > 0). With
`make data` (gensim's Wikipedia extract, the King James text, the packaged SmolLM2): lm_text's
windows and prompts on SmolLM2's tokenizer, and healing windows away from the evaluation."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from _optional_data import needs

from splitformer.experiments import lm_eval
from splitformer.experiments.lm_eval import (
    NEW_TOKENS,
    LMEvaluation,
    LMText,
    bits_per_byte,
    perplexity,
    scored_bytes,
)

transformers = pytest.importorskip("transformers")

VOCAB, N, M, KL = 128, 16, 6, 4


@pytest.fixture(scope="module")
def pair():
    """(transformers' tiny LlamaForCausalLM, splitformer.from_hf of it), float32, eval."""
    import splitformer

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # logits of a useful spread (random init is near uniform)
        hf.lm_head.weight.mul_(20.0)
    return hf, splitformer.from_hf(hf).eval()


@pytest.fixture(scope="module")
def text() -> LMText:
    g = torch.Generator().manual_seed(1)
    return LMText(evaluation=torch.randint(0, VOCAB, (M, N), generator=g),
                  calibration=torch.randint(0, VOCAB, (2, N), generator=g),
                  bytes_per_token=3.5,
                  prompts=list(torch.randint(0, VOCAB, (20, 24), generator=g)))


@pytest.fixture(scope="module")
def evaluation(pair, text) -> LMEvaluation:
    return LMEvaluation(pair[1], text, batch=4, kl_windows=KL)


def test_the_teacher_against_itself(pair, evaluation, text):
    r = evaluation(pair[1])
    assert abs(r["kl"]) < 1e-6 and r["top1"] == 1.0
    assert r["match_tokens"] == NEW_TOKENS and r["match_full"] == len(text.prompts)
    assert r["perplexity"] == pytest.approx(r["teacher"]["perplexity"], rel=1e-12)
    assert evaluation.teacher_logp.shape == (KL, N, VOCAB)
    assert evaluation.teacher_loss.shape == (M, N - 1)
    assert evaluation.teacher_new.shape == (20, NEW_TOKENS)


def test_transformers_model_against_the_splitformer_teacher(pair, evaluation, text):
    hf, _ = pair
    r = evaluation(hf)
    assert r["kl"] < 1e-6 and r["top1"] == 1.0
    assert r["match_tokens"] == NEW_TOKENS and r["match_full"] == len(text.prompts)
    assert r["perplexity"] == pytest.approx(r["teacher"]["perplexity"], rel=1e-5)


def test_perplexity_is_exp_cross_entropy_of_transformers_logits(pair, text):
    hf, ours = pair
    w = text.evaluation
    with torch.no_grad():
        logits = hf(input_ids=w).logits  # the reference library's own forward
    want = math.exp(F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                    w[:, 1:].reshape(-1)).item())
    assert perplexity(ours, w, batch=4) == pytest.approx(want, rel=1e-5)
    assert perplexity(hf, w, batch=5) == pytest.approx(want, rel=1e-5)  # a ragged last batch
    assert want > 1.5  # not a degenerate case


class _ByteTokenizer:
    """Id i decodes to a character of known UTF-8 length: 'a' (1), 'é' (2), '€' (3)."""

    chars = "aé€"

    def decode(self, ids, **_):
        return "".join(self.chars[i % 3] for i in ids)


def test_bits_per_byte_on_a_known_case(pair, evaluation):
    assert bits_per_byte(2 * math.log(2), 4.0) == pytest.approx(0.5)
    # window [0, 1, 2, 0]: tokens 1.. spell 'é€a' (6 bytes); [2, 2, 0, 0]: '€aa' (5 bytes)
    assert scored_bytes(_ByteTokenizer(), torch.tensor([[0, 1, 2, 0], [2, 2, 0, 0]])) == 11
    r = evaluation(pair[1], continuations=False)
    assert "match_tokens" not in r
    # bpb = loss * T / (B ln 2) with B / T = bytes_per_token = 3.5
    assert r["bits_per_byte"] == pytest.approx(math.log(r["perplexity"]) / (3.5 * math.log(2)))


def test_a_perturbed_model_differs(pair, evaluation):
    changed = copy.deepcopy(pair[1])
    with torch.no_grad():
        w = dict(changed.named_parameters())
        name = next(k for k in w if w[k].dim() == 2 and "embed" not in k)
        w[name].add_(0.5 * torch.randn(w[name].shape, generator=torch.Generator().manual_seed(3)))
    r = evaluation(changed)
    assert r["kl"] > 1e-3
    assert r["perplexity"] != pytest.approx(r["teacher"]["perplexity"], rel=1e-4)
    assert 0 <= r["top1"] <= 1 and 0 <= r["match_tokens"] <= NEW_TOKENS
    assert r["match_full"] <= 20


def test_speed_keys(pair, text):
    hf, ours = pair
    s = lm_eval.speed(ours, hf, text, prompt=16, new=4, repeats=1, warmup=0)
    for name in ("model", "reference"):
        assert s[name]["prefill_tokens_per_s"] > 0 and s[name]["decode_tokens_per_s"] > 0
    assert s["prefill_ratio"] == pytest.approx(
        s["model"]["prefill_tokens_per_s"] / s["reference"]["prefill_tokens_per_s"])
    with pytest.raises(ValueError, match="prompt=999"):
        lm_eval.speed(ours, hf, text, prompt=999)


def test_arguments_are_named(pair, text):
    with pytest.raises(ValueError, match="kl_windows=99"):
        LMEvaluation(pair[1], text, kl_windows=99)
    with pytest.raises(ValueError, match="windows must be"):
        perplexity(pair[1], torch.zeros(3, dtype=torch.long))


# -- the real text (make data) --------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from splitformer.interop.gguf import gguf_location

    folder, file = gguf_location("smollm2")
    return transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file=file,
                                                      local_files_only=True)


@needs("gensim", "wiki", "text", "smollm2")
def test_lm_text_and_healing_windows_on_smollm2(smollm2_tokenizer):
    tok = smollm2_tokenizer
    t = lm_eval.lm_text(tok, length=512, evaluation=32, calibration=64)
    stream = lm_eval.wiki_ids(tok)
    s = len(stream)
    assert t.evaluation.shape == (32, 512) and t.calibration.shape == (64, 512)
    assert torch.equal(t.evaluation.reshape(-1), stream[s - 32 * 512:])  # the end, in order
    assert torch.equal(t.calibration.reshape(-1), stream[:64 * 512])  # the start
    assert 64 * 512 <= s - 32 * 512  # disjoint, calibration first
    assert len(t.prompts) == 20 and all(p.shape == (24,) for p in t.prompts)
    assert len({tuple(p.tolist()) for p in t.prompts}) == 20
    text = tok.decode(t.evaluation.reshape(-1).tolist())
    assert all(tok.decode(p.tolist()) in text for p in t.prompts)
    assert 3.0 < t.bytes_per_token < 6.0, t.bytes_per_token
    with pytest.raises(ValueError, match="evaluation=2000"):
        lm_eval.lm_text(tok, evaluation=2000)
    h = lm_eval.healing_windows(tok, 128, 16, seed=0, wiki=0.5)
    assert h.shape == (16, 128) and torch.equal(h, lm_eval.healing_windows(tok, 128, 16, 0))
    grams = {tuple(x) for x in stream[s - 32 * 512:].unfold(0, 32, 1).tolist()}
    assert not any(tuple(x) in grams for x in h.unfold(1, 32, 32).reshape(-1, 32).tolist())
    wiki = stream[:s - lm_eval.EVALUATION_TOKENS]
    starts = wiki.unfold(0, 16, 1)
    in_wiki = sum(bool((starts == row[:16]).all(1).any()) for row in h)
    assert in_wiki == 8
