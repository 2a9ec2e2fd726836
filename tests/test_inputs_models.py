"""Bad input to the model builders and forward arguments: a clear error naming the argument,
raised when the model is built (never at forward time, never a raw torch error)."""

from __future__ import annotations

import pytest
import torch

import splitformer
from splitformer.models import build_vit, causal_decoder, encoder_decoder, network_encoder
from splitformer.models.bert import bert_model

SMALL_BERT = {"vocab_size": 31, "hidden_size": 16, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 24, "max_position_embeddings": 12}
SMALL_VIT = {"image_size": 8, "patch_size": 4, "dim": 16, "depth": 1, "num_heads": 2,
             "hidden_dim": 24}


@pytest.mark.parametrize("build, match", [
    (lambda: splitformer.paper_encoder(8, 2, 16, 1, num_ffn_stages=2.5), "num_ffn_stages"),
    (lambda: splitformer.paper_encoder(8, 2, 16, 1, num_ffn_stages=None), "num_ffn_stages"),
    (lambda: network_encoder(8, 2, 16, 1, bogus=1), r"unknown arguments \['bogus'\]"),
    (lambda: bert_model(**SMALL_BERT, num_labels=0), "num_labels"),
    (lambda: bert_model(**SMALL_BERT, num_labels=2, problem_type="bogus"), "problem_type"),
    (lambda: bert_model(**{**SMALL_BERT, "vocab_size": 0}), "vocab_size"),
    (lambda: bert_model(**SMALL_BERT, pad_token_id=100), "pad_token_id"),
    (lambda: build_vit(**SMALL_VIT, num_classes=-1), "num_classes"),
    (lambda: causal_decoder(0, 12, 16, 2, 1), "vocab_size"),
])
def test_builders_refuse_bad_arguments(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


def test_image_size_not_a_multiple_of_the_patch_warns():
    with pytest.warns(UserWarning, match="not a multiple of patch_size"):
        build_vit(**{**SMALL_VIT, "image_size": 10})


def test_causal_flags_and_validation_switch_must_be_bools():
    pair = encoder_decoder(16, 2, 1, 1, 24)
    src, tgt = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    with pytest.raises(TypeError, match="tgt_is_causal must be a bool"):
        pair(src, tgt, tgt_is_causal="y")
    with pytest.raises(TypeError, match="validating"):
        pair.validating("no")


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_token_ids_outside_the_dictionary_are_refused(family):
    model = (bert_model(**SMALL_BERT) if family == "bert"
             else causal_decoder(31, 12, 16, 2, 1))
    ok = torch.randint(0, 31, (2, 5))
    model(ok)
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 31\)"):
        model(torch.full((2, 5), 31))
    with pytest.raises(ValueError, match="input_ids must lie"):
        model(torch.full((2, 5), -1))
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        model(ok.float())
    with pytest.raises(ValueError, match="position_ids must lie"):
        model(ok, position_ids=torch.arange(20, 25).unsqueeze(0))


def test_an_integer_4d_attention_mask_is_read_as_a_support_and_bad_values_refused():
    """A 0/1 integer mask in 4-D shape (mask[:, None, None, :]) is the support it says (1 =
    in it), as the 2-D mask (which is checked against transformers' BertModel elsewhere);
    with merging it merges (it warned 'nothing can merge'); other integers are refused."""
    import warnings

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32)
    model = splitformer.from_hf(transformers.BertModel(cfg).eval()).eval()
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        two = model(ids, attention_mask=mask).last_hidden_state
        four = model(ids, attention_mask=mask[:, None, None, :]).last_hidden_state
        assert torch.equal(two, four)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            _, trace = model.with_token_merging(2).solve_traced(
                ids, attention_mask=mask[:, None, None, :])
        assert not any("nothing can merge" in str(w.message) for w in got)
        assert trace is not None and len(trace) > 0
        with pytest.raises(ValueError, match="attention_mask: a 4-D mask must be bool"):
            model(ids, attention_mask=2 * mask[:, None, None, :])
