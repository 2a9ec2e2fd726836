"""Hugging Face BERT <-> splitformer: exact against transformers, both ways."""

from __future__ import annotations

import pytest
import torch

import splitformer
from splitformer.interop.hf_bert import BERT_WEIGHT_MAP, from_hf_model, weight_map
from splitformer.models.bert import BertEncoderModel, BertSequenceClassifier, bert_model
from splitformer.verification.references import TOL, maxdiff

transformers = pytest.importorskip("transformers")  # conftest hides the torchvision stand-in

BASE = {
    "vocab_size": 61,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "max_position_embeddings": 24,
    "type_vocab_size": 2,
}

CONFIGS = {
    "gelu": {},
    "relu": {"hidden_act": "relu"},
    "heads8-3layers": {"num_attention_heads": 8, "num_hidden_layers": 3, "hidden_size": 40,
                       "intermediate_size": 72},
    "one-head-types3-eps1e-5": {"num_attention_heads": 1, "type_vocab_size": 3,
                                "layer_norm_eps": 1e-5},
    "gelu_tanh": {"hidden_act": "gelu_pytorch_tanh"},
    "silu-nopad-chunked": {"hidden_act": "silu", "pad_token_id": None,
                           "chunk_size_feed_forward": 3},
}


def make_config(attn: str = "sdpa", **overrides):
    config = transformers.BertConfig(**{**BASE, **overrides})
    config._attn_implementation = attn
    return config


def make_bert(dtype=torch.float64, attn: str = "sdpa", *, classifier: bool = False,
              pooling: bool = True, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = make_config(attn, **overrides)
    if classifier:
        model = transformers.BertForSequenceClassification(config)
    else:
        model = transformers.BertModel(config, add_pooling_layer=pooling)
    return model.to(dtype).eval()


def inputs(config, *, batch: int = 3, seq: int = 9, pad: bool = True, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    types = torch.randint(0, config.type_vocab_size, (batch, seq), generator=g)
    out = {"input_ids": ids, "token_type_ids": types}
    if pad:
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[1, seq - 3:] = 0
        mask[-1, 2:] = 0
        out["attention_mask"] = mask
    return out



# -- forward: last hidden state and pooled output -------------------------------------------

@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_bert_model_matches(name, attn, dtype):
    ref = make_bert(dtype, attn, **CONFIGS[name])
    ours = splitformer.from_hf(ref)
    assert isinstance(ours, BertEncoderModel)
    for pad in (True, False):
        x = inputs(ref.config, pad=pad)
        with torch.no_grad():
            r, o = ref(**x), ours(**x)
        assert o.last_hidden_state.dtype == dtype
        assert maxdiff(r.last_hidden_state, o.last_hidden_state) <= TOL[dtype]
        assert maxdiff(r.pooler_output, o.pooler_output) <= TOL[dtype]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_train_mode_dropout_zero_and_gradients(attn, dtype):
    ref = make_bert(dtype, attn, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref.train()
    ours = from_hf_model(ref)
    assert ours.training
    x = inputs(ref.config)
    r, o = ref(**x), ours(**x)
    assert maxdiff(r.last_hidden_state, o.last_hidden_state) <= TOL[dtype]
    (r.last_hidden_state.square().mean() + r.pooler_output.sum()).backward()
    (o.last_hidden_state.square().mean() + o.pooler_output.sum()).backward()
    # the adjoint: every gradient maps like its weight
    params = dict(ours.named_parameters())
    d = ref.config.hidden_size
    for row in weight_map(ref.config.num_hidden_layers, pooler=True, classifier=False):
        if row.attr:
            continue
        g = params[row.ours].grad
        g = g if row.block is None else g[row.block[0] * d:(row.block[0] + 1) * d]
        hf_grad = ref.get_parameter(row.theirs).grad
        assert maxdiff(hf_grad, g) <= 10 * TOL[dtype], row.theirs


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_train_mode_with_dropout_same_seed(attn):
    """Dropout sits where BERT puts it and draws in the same order (same seed, same masks)."""
    ref = make_bert(torch.float64, attn, classifier=True, hidden_dropout_prob=0.2,
                    attention_probs_dropout_prob=0.3, classifier_dropout=0.25)
    ref.train()
    ours = from_hf_model(ref)
    assert ours.embedding.dropout.p == 0.2 and ours.classifier.dropout.p == 0.25
    theta = ours.evolution.controls[0]
    assert theta["attention"].attn_dropout == 0.3 and theta["ffn"].out_dropout.p == 0.2
    x = inputs(ref.config)
    torch.manual_seed(5)
    r = ref(**x)
    torch.manual_seed(5)
    o = ours(**x)
    assert maxdiff(r.logits, o.logits) <= 1e-10


def test_padding_semantics_match_transformers(dtype):
    """finfo.min (eager) / boolean (sdpa) support; an all-ones mask is dropped; float masks."""
    for attn, additive in (("eager", True), ("sdpa", False)):
        ref = make_bert(dtype, attn)
        ours = from_hf_model(ref)
        assert ours.additive_mask is additive
        x = inputs(ref.config, seq=7)
        m = ours.attention_support(x["attention_mask"], 3, 7, dtype, torch.device("cpu"))
        if additive:
            assert m.dtype == dtype and m.shape == (3, 1, 1, 7)
            assert m.min() == torch.finfo(dtype).min and m.max() == 0
            assert not torch.isinf(m).any()
        else:
            assert m.dtype == torch.bool
        assert ours.attention_support(torch.ones(3, 7), 3, 7, dtype, m.device) is None
        # float 0/1 mask, a fully padded sequence, and a prepared 4-D mask
        x["attention_mask"] = x["attention_mask"].to(dtype)
        x["attention_mask"][0] = 0
        with torch.no_grad():
            r, o = ref(**x), ours(**x)
            assert maxdiff(r.last_hidden_state, o.last_hidden_state) <= TOL[dtype]
            m4 = torch.zeros(3, 1, 7, 7, dtype=dtype)
            m4[:, :, :, -2:] = torch.finfo(dtype).min
            x["attention_mask"] = m4
            r, o = ref(**x), ours(**x)
            assert maxdiff(r.last_hidden_state, o.last_hidden_state) <= TOL[dtype]


@pytest.mark.parametrize("shape", ["transposed", "flat", "one-row"])
def test_attention_mask_of_another_shape_is_refused_as_transformers_does(shape):
    """A 2-D mask must be (batch, seq): one with batch * seq entries in another shape is not
    reshaped (transformers' BertModel fails on it too); 2-D (batch, seq) and 4-D masks are
    what both accept (test_padding_semantics_match_transformers)."""
    ref = make_bert(torch.float64)
    ours = from_hf_model(ref)
    x = inputs(ref.config, batch=3, seq=9)
    mask = x["attention_mask"]
    bad = {"transposed": mask.t().contiguous(), "flat": mask.reshape(-1),
           "one-row": mask.reshape(1, -1)}[shape]
    with torch.no_grad(), pytest.raises((RuntimeError, IndexError)):
        ref(**{**x, "attention_mask": bad})
    with pytest.raises(ValueError,
                       match=r"attention_mask must have shape \(batch, seq\) = \(3, 9\)"):
        ours(**{**x, "attention_mask": bad})


def test_embedding_inputs(dtype):
    """position_ids, token_type_ids omitted, inputs_embeds: as BertModel takes them."""
    ref = make_bert(dtype)
    ours = from_hf_model(ref)
    x = inputs(ref.config)
    # consecutive positions from a random offset per row: transformers 5 reads position_ids
    # without an attention mask as packed sequences (a new sequence wherever the step is not 1)
    b, n = x["input_ids"].shape
    pos = torch.randint(0, ref.config.max_position_embeddings - n + 1, (b, 1)) + torch.arange(n)
    embeds = ref.embeddings.word_embeddings(x["input_ids"]).detach()
    cases = [
        {"input_ids": x["input_ids"], "position_ids": pos, "token_type_ids": x["token_type_ids"]},
        {"input_ids": x["input_ids"], "attention_mask": x["attention_mask"]},
        {"inputs_embeds": embeds, "attention_mask": x["attention_mask"]},
    ]
    with torch.no_grad():
        for kw in cases:
            assert maxdiff(ref(**kw).last_hidden_state, ours(**kw).last_hidden_state) <= TOL[dtype]
    with pytest.raises(ValueError, match="exactly one"):
        ours(input_ids=x["input_ids"], inputs_embeds=embeds)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ours(input_ids=torch.zeros(1, ref.config.max_position_embeddings + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        ours(input_ids=x["input_ids"], attention_mask=torch.ones(3, 2))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_position_ids_without_a_mask_are_packed_sequences(dtype, attn):
    """transformers 5 reads position_ids that do not step by +1, given without an attention
    mask, as several sequences packed on one grid (block-diagonal attention); so does
    from_hf: each packed sequence's output is its own run alone."""
    ref = make_bert(dtype, attn)
    ours = from_hf_model(ref)
    x = inputs(ref.config, pad=False)
    ids = x["input_ids"]  # (3, 9)
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4],
                           [0, 1, 2, 3, 4, 5, 6, 7, 8],   # one sequence: nothing masked
                           [5, 6, 0, 1, 2, 9, 10, 11, 0]])
    with torch.no_grad():
        for pos in (packed, packed[:1]):  # (B, N) and (1, N), as BertModel takes them
            want = ref(input_ids=ids, position_ids=pos).last_hidden_state
            got = ours(input_ids=ids, position_ids=pos).last_hidden_state
            assert maxdiff(want, got) <= TOL[dtype]
        alone = ours(input_ids=ids[:1, 4:], position_ids=packed[:1, 4:]).last_hidden_state
        got = ours(input_ids=ids, position_ids=packed).last_hidden_state
        assert maxdiff(got[:1, 4:], alone) <= TOL[dtype]
        # an attention mask given: padding only, the positions are positions (as BertModel)
        kw = {"input_ids": ids, "position_ids": packed, "attention_mask": torch.ones_like(ids)}
        assert maxdiff(ref(**kw).last_hidden_state, ours(**kw).last_hidden_state) <= TOL[dtype]
        assert maxdiff(ours(**kw).last_hidden_state, got) > 1e-3
    with pytest.raises(ValueError, match=r"position_ids must have shape \(batch, seq\)"):
        ours(input_ids=ids, position_ids=packed[:, :8])
    with pytest.raises(TypeError, match="position_ids must be a torch.Tensor"):
        ours(input_ids=ids, position_ids=packed.tolist())


def test_hidden_states_are_the_trajectory(dtype):
    ref = make_bert(dtype, num_hidden_layers=3)
    ours = from_hf_model(ref)
    x = inputs(ref.config)
    with torch.no_grad():
        hs = ref(**x, output_hidden_states=True).hidden_states
        out = ours(**x, output_hidden_states=True)
        traj = ours.trajectory(**x)
    assert len(hs) == len(out.hidden_states) == len(traj) == 4
    for a, b, c in zip(hs, out.hidden_states, traj.states, strict=True):
        assert maxdiff(a, b) <= TOL[dtype] and torch.equal(b, c)
    assert torch.equal(out.last_hidden_state, traj.final)
    assert out[0] is out.last_hidden_state and out["pooler_output"] is out.pooler_output


# -- sequence classification ------------------------------------------------------------------

@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sequence_classification(attn, dtype):
    ref = make_bert(dtype, attn, classifier=True, num_labels=5, hidden_act="relu")
    ours = splitformer.from_hf(ref)
    assert isinstance(ours, BertSequenceClassifier) and ours.num_labels == 5
    x = inputs(ref.config)
    with torch.no_grad():
        r, o = ref(**x), ours(**x)
        assert maxdiff(r.logits, o.logits) <= TOL[dtype]
        rb = ref.bert(**x)
        assert maxdiff(rb.pooler_output, o.pooler_output) <= TOL[dtype]
        assert maxdiff(rb.last_hidden_state, o.last_hidden_state) <= TOL[dtype]
        labels = torch.tensor([0, 4, 2])
        assert abs(float(ref(**x, labels=labels).loss - ours(**x, labels=labels).loss)) \
            <= TOL[dtype]


@pytest.mark.parametrize("num_labels,problem,labels", [
    (1, None, torch.tensor([0.5, -1.0, 2.0])),
    (2, "multi_label_classification", torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])),
    (3, None, torch.tensor([2, 0, 1])),
])
def test_classification_losses(num_labels, problem, labels):
    ref = make_bert(torch.float64, classifier=True, num_labels=num_labels, problem_type=problem)
    ours = from_hf_model(ref)
    x = inputs(ref.config)
    labels = labels.to(torch.float64) if labels.is_floating_point() else labels
    with torch.no_grad():
        assert abs(float(ref(**x, labels=labels).loss - ours(**x, labels=labels).loss)) <= 1e-12


# -- round trip -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["model", "no-pooler", "classifier", "relu-eager-f32"])
def test_round_trip_state_dict(kind):
    if kind == "model":
        ref = make_bert(torch.float64)
    elif kind == "no-pooler":
        ref = make_bert(torch.float64, pooling=False)
    elif kind == "classifier":
        ref = make_bert(torch.float64, classifier=True, num_labels=4, classifier_dropout=0.3)
    else:
        ref = make_bert(torch.float32, "eager", hidden_act="relu")
    ref.train(kind == "model")
    ours = from_hf_model(ref)
    back = splitformer.to_hf(ours)
    assert type(back) is type(ref)
    assert back.training == ref.training
    assert back.config._attn_implementation == ref.config._attn_implementation
    assert back.config.to_dict() == ref.config.to_dict()
    a, b = ref.state_dict(), back.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    for k, buf in ref.named_buffers():
        assert torch.equal(buf, back.get_buffer(k)), k
    if kind == "no-pooler":
        assert ours.pooler is None and back.pooler is None
    # the weight map is a bijection onto both parameter sets
    cls = kind == "classifier"
    table = [r for r in weight_map(ref.config.num_hidden_layers, pooler=kind != "no-pooler",
                                   classifier=cls) if not r.attr]
    assert sorted(r.theirs for r in table) == sorted(dict(ref.named_parameters()))
    covered = {(r.ours, r.block) for r in table}
    assert {s for s, _ in covered} == set(dict(ours.named_parameters()))
    assert len(covered) == len(table)


def test_to_hf_needs_the_network_form():
    ours = from_hf_model(make_bert())
    # a refined model is a network of 2L layers with halved output projections (as_network,
    # docs/depth.md): transformers runs it as the refined evolution
    fine = ours.eval().refine(2)
    out = splitformer.to_hf(fine).eval()
    ids = torch.randint(0, out.config.vocab_size, (2, 5))
    assert out.config.num_hidden_layers == 2 * len(ours.evolution.controls)
    with torch.no_grad():
        assert float((out(ids).last_hidden_state - fine(ids).last_hidden_state).abs().max()) \
            < 1e-5
    with pytest.raises(ValueError, match="needs the scheme 'lie'"):
        splitformer.to_hf(ours.with_scheme("prenorm"))
    # a Lie scheme with other substep integrators is not the network either
    with pytest.raises(ValueError, match="needs the scheme 'lie'"):
        splitformer.to_hf(ours.with_scheme("lie", integrator="heun"))
    from splitformer.models.kernels import set_kernel

    with pytest.raises(ValueError, match="softmax kernel"):
        splitformer.to_hf(set_kernel(from_hf_model(make_bert()), "alibi"))
    with pytest.raises(ValueError, match="hf_class"):
        splitformer.to_hf(bert_model(hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                                     intermediate_size=16, vocab_size=10))


# -- local checkpoint folder (no network) -----------------------------------------------------

@pytest.mark.parametrize("classifier", [False, True])
def test_from_local_folder(tmp_path, classifier):
    ref = make_bert(torch.float32, classifier=classifier)
    ref.save_pretrained(tmp_path)
    ours = splitformer.from_hf(tmp_path)
    loaded_cls = "BertForSequenceClassification" if classifier else "BertModel"
    assert ours.source.hf_class == loaded_cls
    x = inputs(ref.config)
    with torch.no_grad():
        r, o = ref(**x), ours(**x)
    key = "logits" if classifier else "last_hidden_state"
    assert maxdiff(r[key], o[key]) <= TOL[torch.float32]
    with pytest.raises(FileNotFoundError):
        splitformer.from_hf(tmp_path / "missing")


# -- unsupported configurations ---------------------------------------------------------------

@pytest.mark.parametrize("option,overrides", [
    ("position_embedding_type", {"position_embedding_type": "relative_key"}),
    ("is_decoder", {"is_decoder": True}),
    ("add_cross_attention", {"is_decoder": True, "add_cross_attention": True}),
    ("hidden_act", {"hidden_act": "gelu_new"}),
])
def test_unsupported_options_name_the_option(option, overrides):
    ref = make_bert(torch.float32, **overrides)
    with pytest.raises(ValueError, match=option):
        splitformer.from_hf(ref)


def test_callable_activation_and_extra_kwargs():
    ref = make_bert(torch.float32)
    object.__setattr__(ref.config, "hidden_act", torch.nn.functional.gelu)  # bypass validation
    with pytest.raises(ValueError, match="hidden_act"):
        from_hf_model(ref)
    object.__setattr__(ref.config, "hidden_act", "gelu")
    with pytest.raises(TypeError, match="no options"):
        from_hf_model(ref, form="paper")


# -- the model contract (docs/architecture.md) ---------------------------------------------

def test_contract():
    ref = make_bert(torch.float64, num_hidden_layers=3)
    ours = from_hf_model(ref)
    evo = ours.evolution
    assert evo.scheme.name == "lie" and evo.tau == 1.0 and evo.num_steps == 3
    assert len(evo.controls) == 3 and evo.grid.T == 3
    x = inputs(ref.config)
    with torch.no_grad():
        base = ours(**x).last_hidden_state
        fine = ours.refine(2)
        assert fine.evolution.num_steps == 6 and fine.evolution.tau == 0.5
        out2 = fine(**x).last_hidden_state
        assert torch.isfinite(out2).all() and maxdiff(base, out2) > 1e-6
        assert all(p is q for p, q in zip(fine.parameters(), ours.parameters(), strict=True))
        traj = ours.trajectory(**x)
        assert len(traj) == evo.num_steps + 1
        assert len(fine.trajectory(**x)) == 7
        pre = ours.with_scheme("prenorm")(**x).last_hidden_state
        assert torch.isfinite(pre).all()
        assert torch.equal(ours(**x).last_hidden_state, base)  # the original is unchanged


def test_weight_map_table_mentions_every_layer_name():
    names = {r.theirs for r in BERT_WEIGHT_MAP}
    ref = make_bert(torch.float32, classifier=True)
    for k in dict(ref.named_parameters()):
        k = k.removeprefix("bert.")
        parts = k.split(".")
        if parts[0] == "encoder":
            parts[2] = "n"
        assert ".".join(parts) in names, k
