"""Hugging Face GPT-2 <-> the causal (decoder-only) evolution: exact against transformers."""

from __future__ import annotations

import pytest
import torch

import splitformer
from splitformer.interop.activations import GPT2_ACTIVATIONS
from splitformer.interop.hf_gpt2 import GPT2_WEIGHT_MAP, check_config, from_hf_model, weight_map
from splitformer.models.causal import (
    CausalDecoderModel,
    CausalLM,
    causal_context,
    causal_decoder,
)
from splitformer.operators import Context
from splitformer.verification.references import TOL, maxdiff, perturb_

transformers = pytest.importorskip("transformers")  # conftest hides the torchvision stand-in



BASE = {
    "vocab_size": 61,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 24,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "attn_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
}

CONFIGS = {
    "gelu_new": {},
    "relu-3layers-inner": {"activation_function": "relu", "n_layer": 3, "n_inner": 40},
    "erf-gelu-one-head": {"activation_function": "gelu", "n_head": 1, "layer_norm_epsilon": 1e-3},
    "scale-by-layer": {"scale_attn_by_inverse_layer_idx": True, "n_head": 8, "n_embd": 40},
    "unscaled-silu": {"scale_attn_weights": False, "activation_function": "silu"},
}


def make_gpt2(dtype=torch.float64, attn: str = "sdpa", *, lm: bool = False, seed: int = 0,
              **overrides):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(**{**BASE, **overrides})
    config._attn_implementation = attn
    model = transformers.GPT2LMHeadModel(config) if lm else transformers.GPT2Model(config)
    model = model.to(dtype).eval()
    return perturb_(model, seed=seed + 7)  # non-trivial norms and biases


def batch(vocab: int = 61, b: int = 3, n: int = 10, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, :3] = 0  # left padding (the first queries see only padding)
    mask[2, 6:] = 0  # right padding
    return ids, mask



@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_gpt2_model_matches(name, attn, dtype):
    ref = make_gpt2(dtype, attn, **CONFIGS[name])
    ours = splitformer.from_hf(ref)
    assert isinstance(ours, CausalDecoderModel)
    ids, mask = batch(ref.config.vocab_size)
    with torch.no_grad():
        for kw in ({}, {"attention_mask": mask}, {"attention_mask": torch.ones_like(mask)}):
            a = ref(ids, **kw).last_hidden_state
            b = ours(input_ids=ids, **kw).last_hidden_state
            assert maxdiff(a, b) <= TOL[dtype], (kw.keys(), maxdiff(a, b))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_lm_logits_and_loss(attn, dtype):
    ref = make_gpt2(dtype, attn, lm=True)
    ours = splitformer.from_hf(ref)
    assert isinstance(ours, CausalLM) and ours.tied
    ids, mask = batch()
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        r = ref(input_ids=ids, attention_mask=mask, labels=labels)
        o = ours(input_ids=ids, attention_mask=mask, labels=labels)
        assert maxdiff(r.logits, o.logits) <= TOL[dtype]
        # transformers computes the loss in float32 even for a float64 model
        assert abs(float(r.loss) - float(o.loss)) <= 1e-5
        r2 = ref(input_ids=ids, logits_to_keep=1)
        o2 = ours(input_ids=ids, logits_to_keep=1)
        assert o2.logits.shape == r2.logits.shape == (3, 1, 61)
        assert maxdiff(r2.logits, o2.logits) <= TOL[dtype]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_train_mode_dropout_zero_and_gradients(attn, dtype):
    ref = make_gpt2(dtype, attn, lm=True, n_layer=3).train()
    ours = splitformer.from_hf(ref)
    assert ours.training
    ids, mask = batch()
    r = ref(input_ids=ids, attention_mask=mask, labels=ids)
    o = ours(input_ids=ids, attention_mask=mask, labels=ids)
    assert maxdiff(r.logits, o.logits) <= TOL[dtype]
    # a loss on the tokens (not on padding): queries whose causal past is all padding have an
    # empty support, where transformers' eager autograd and the fused sdpa backward differ
    keep = mask.bool()[..., None]
    (r.logits * keep).pow(2).mean().backward()
    (o.logits * keep).pow(2).mean().backward()
    g_ref = ref.transformer.h[1].attn.c_attn.weight.grad.t()
    g_ours = ours.evolution.controls[1]["attention"].qkv_weight.grad
    scale = max(1.0, float(g_ref.abs().max()))
    assert maxdiff(g_ref, g_ours) <= TOL[dtype] * scale
    assert maxdiff(ref.transformer.wte.weight.grad, ours.embedding.word.weight.grad) \
        <= TOL[dtype] * max(1.0, float(ref.transformer.wte.weight.grad.abs().max()))


def test_train_mode_with_dropout_same_seed():
    """With dropout on, the random draws happen in transformers' order: same seed, same output."""
    ref = make_gpt2(torch.float64, "sdpa", embd_pdrop=0.1, attn_pdrop=0.2,
                    resid_pdrop=0.1).train()
    ours = splitformer.from_hf(ref)
    ids, _ = batch()
    torch.manual_seed(5)
    a = ref(input_ids=ids).last_hidden_state
    torch.manual_seed(5)
    b = ours(input_ids=ids).last_hidden_state
    assert maxdiff(a, b) <= 1e-10


def test_hidden_states_are_the_trajectory(dtype):
    ref = make_gpt2(dtype, n_layer=3)
    ours = splitformer.from_hf(ref)
    ids, mask = batch()
    with torch.no_grad():
        hs = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        out = ours(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        traj = ours.trajectory(input_ids=ids, attention_mask=mask)
    assert len(hs) == len(out.hidden_states) == len(traj) == 4
    for a, b in zip(hs, out.hidden_states, strict=True):
        assert maxdiff(a, b) <= TOL[dtype]
    for a, b in zip(hs[:-1], traj.states[:-1], strict=True):  # the last one is P_f(u(T))
        assert maxdiff(a, b) <= TOL[dtype]
    assert maxdiff(ours.final_norm(traj.final), hs[-1]) <= TOL[dtype]
    assert torch.equal(traj.times, torch.arange(4, dtype=dtype))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_inputs_embeds_positions_types_and_4d_masks(attn, dtype):
    ref = make_gpt2(dtype, attn)
    ours = splitformer.from_hf(ref)
    ids, mask = batch()
    g = torch.Generator().manual_seed(3)
    types = torch.randint(0, 61, ids.shape, generator=g)
    emb = ref.wte(ids).detach()
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]] * 3)
    shifted = torch.arange(2, 12).unsqueeze(0)
    four_d = torch.ones(3, 1, 10, 10, dtype=torch.bool).tril()
    four_d[0, :, :, 2] = False
    if attn == "eager":
        four_d = torch.where(four_d, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)
    cases = [
        {"inputs_embeds": emb, "attention_mask": mask},
        {"input_ids": ids, "token_type_ids": types},
        {"input_ids": ids, "position_ids": shifted, "attention_mask": mask},
        {"input_ids": ids, "position_ids": packed},  # with a cache: positions only
        {"input_ids": ids, "position_ids": packed, "use_cache": False},  # packed sequences
        {"input_ids": ids, "attention_mask": four_d},
    ]
    with torch.no_grad():
        for kw in cases:
            a = ref(**kw).last_hidden_state
            b = ours(**kw).last_hidden_state
            assert maxdiff(a, b) <= TOL[dtype], list(kw)


def test_causality_is_a_volterra_kernel():
    """u(x, t) depends on f(x') for x' <= x only: changing later tokens leaves earlier outputs."""
    model = causal_decoder(50, 16, 24, 3, 2, dtype=torch.float64)
    ids = torch.randint(0, 50, (2, 9))
    ids2 = ids.clone()
    ids2[:, 6:] = (ids2[:, 6:] + 1) % 50
    with torch.no_grad():
        a = model(input_ids=ids).last_hidden_state
        b = model(input_ids=ids2).last_hidden_state
        ta = model.refine(3).trajectory(input_ids=ids)
        tb = model.refine(3).trajectory(input_ids=ids2)
    assert torch.equal(a[:, :6], b[:, :6]) and not torch.allclose(a[:, 6:], b[:, 6:])
    assert torch.equal(ta.states[:, :, :6], tb.states[:, :, :6])


def test_causal_context_supports():
    ctx = causal_context(None, None, batch=2, seq=4, dtype=torch.float32, device=torch.device(
        "cpu"))
    assert ctx.is_causal and ctx.attn_mask is None
    m = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    ctx = causal_context(m, None, batch=2, seq=4, dtype=torch.float32,
                         device=torch.device("cpu"))
    assert ctx.attn_mask.shape == (2, 1, 4, 4) and ctx.attn_mask.dtype == torch.bool
    assert torch.equal(ctx.attn_mask[1, 0], torch.ones(4, 4, dtype=torch.bool).tril())
    assert not ctx.attn_mask[0, 0, :, 0].any()
    add = causal_context(m, None, batch=2, seq=4, dtype=torch.float32,
                         device=torch.device("cpu"), additive=True).attn_mask
    assert add.dtype == torch.float32 and float(add.min()) == torch.finfo(torch.float32).min
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        causal_context(torch.ones(2, 5), None, batch=2, seq=4, dtype=torch.float32,
                       device=torch.device("cpu"))
    assert isinstance(ctx, Context)


@pytest.mark.parametrize("kind", ["model", "lm-tied", "lm-untied"])
def test_round_trip_state_dict(kind):
    overrides = {"tie_word_embeddings": False} if kind == "lm-untied" else {}
    ref = make_gpt2(torch.float32, lm=kind != "model", **overrides)
    ours = splitformer.from_hf(ref)
    if kind == "lm-untied":
        assert not ours.tied
        assert not torch.equal(ours.lm_head.weight, ours.embedding.word.weight)
    back = splitformer.to_hf(ours)
    assert type(back) is type(ref)
    sd_ref, sd_back = ref.state_dict(), back.state_dict()
    assert list(sd_ref) == list(sd_back)
    for k in sd_ref:
        assert torch.equal(sd_ref[k], sd_back[k]), k
    if kind == "lm-tied":
        assert back.lm_head.weight is back.transformer.wte.weight
    assert back.config._attn_implementation == ref.config._attn_implementation
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids, attention_mask=mask)[0],
                           ref(input_ids=ids, attention_mask=mask)[0])
    # our state dict round trips too (tied lm_head included)
    again = from_hf_model(back)
    s1, s2 = ours.state_dict(), again.state_dict()
    assert list(s1) == list(s2) and all(torch.equal(s1[k], s2[k]) for k in s1)


def test_attention_mask_of_another_shape_is_refused():
    """A 2-D mask must be (batch, seq). transformers' GPT2Model views any mask of fewer than 4
    dimensions as (batch, -1), so a transposed mask with batch * seq entries is silently read
    as other rows (shown below); BertModel fails on it. We refuse it, naming the shape."""
    ref = make_gpt2(torch.float64)
    ours = splitformer.from_hf(ref)
    ids, mask = batch(b=3, n=10)
    with torch.no_grad():
        right = ref(input_ids=ids, attention_mask=mask)[0]
        wrong = ref(input_ids=ids, attention_mask=mask.t().contiguous())[0]
        assert not torch.equal(right, wrong)
        assert maxdiff(ours(input_ids=ids, attention_mask=mask)[0], right) <= TOL[torch.float64]
    for bad in (mask.t().contiguous(), mask.reshape(-1), mask.reshape(1, -1)):
        with pytest.raises(ValueError,
                           match=r"attention_mask must have shape \(batch, seq\) = \(3, 10\)"):
            ours(input_ids=ids, attention_mask=bad)


def test_to_hf_exports_a_refined_model_as_its_steps():
    """A refined model (tau = 1/2, 2L steps) is exported as the 2L-layer GPT-2 whose W_O, b_O and
    FFN output projections are tau times the controls' (Evolution.as_network): transformers'
    own forward then computes the refined evolution."""
    ref = make_gpt2(torch.float64)
    fine = splitformer.from_hf(ref).refine(2)
    exported = splitformer.to_hf(fine)
    assert exported.config.n_layer == 2 * ref.config.n_layer
    ids, mask = batch()
    with torch.no_grad():
        want = fine(input_ids=ids, attention_mask=mask)[0]
        got = exported(input_ids=ids, attention_mask=mask).last_hidden_state
        plain = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    assert maxdiff(got, want) <= TOL[torch.float64]
    assert maxdiff(plain, want) > 1e-3  # the refined evolution is another function


def test_to_hf_needs_the_network_form():
    ours = splitformer.from_hf(make_gpt2(torch.float32))
    with pytest.raises(ValueError, match="needs the scheme 'prenorm'"):
        splitformer.to_hf(ours.with_scheme("lie", integrator="heun"))
    with pytest.raises(ValueError, match="hf_class"):
        splitformer.to_hf(causal_decoder(10, 8, 8, 2, 1))


@pytest.mark.parametrize("lm", [False, True])
def test_from_local_folder(tmp_path, lm):
    ref = make_gpt2(torch.float32, lm=lm)
    ref.save_pretrained(tmp_path)
    ours = splitformer.from_hf(str(tmp_path))
    assert ours.source.hf_class == type(ref).__name__
    ids, mask = batch()
    with torch.no_grad():
        a = ref(input_ids=ids, attention_mask=mask)
        b = ours(input_ids=ids, attention_mask=mask)
    assert maxdiff(a[0], b[0]) <= TOL[torch.float32]


@pytest.mark.parametrize("option, overrides, attn", [
    ("add_cross_attention", {"add_cross_attention": True}, "sdpa"),
    ("activation_function", {"activation_function": "quick_gelu"}, "sdpa"),
    ("activation_function", {"activation_function": "gelu_fast"}, "sdpa"),
    ("reorder_and_upcast_attn", {"reorder_and_upcast_attn": True}, "eager"),
])
def test_unsupported_options_name_the_option(option, overrides, attn):
    ref = make_gpt2(torch.float32, attn, **overrides)
    with pytest.raises(ValueError, match=option):
        splitformer.from_hf(ref)


def test_accepted_options_and_other_checks(dtype):
    # reorder_and_upcast_attn has no effect on the sdpa path: accepted, exact
    ref = make_gpt2(dtype, "sdpa", reorder_and_upcast_attn=True)
    ours = splitformer.from_hf(ref)
    ids, mask = batch()
    with torch.no_grad():
        assert maxdiff(ref(input_ids=ids, attention_mask=mask)[0],
                       ours(input_ids=ids, attention_mask=mask)[0]) <= TOL[dtype]
    config = transformers.GPT2Config(**BASE)
    config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation"):
        check_config(config)
    config = transformers.GPT2Config(**BASE)
    config.is_causal = False
    with pytest.raises(ValueError, match="is_causal"):
        check_config(config)
    with pytest.raises(TypeError, match="no options"):
        from_hf_model(ref, form="paper")
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        ours()
    with pytest.raises(ValueError, match="exceeds"):
        ours(input_ids=torch.zeros(1, 30, dtype=torch.long))
    assert set(GPT2_ACTIVATIONS) >= {"gelu_new", "gelu", "relu", "gelu_pytorch_tanh"}


def test_contract():
    ref = make_gpt2(torch.float64, lm=True, n_layer=3)
    ours = splitformer.from_hf(ref)
    evo = ours.evolution
    assert (evo.tau, evo.num_steps, evo.T, evo.scheme.name) == (1.0, 3, 3.0, "prenorm")
    assert len(evo.controls) == 3
    ids, mask = batch()
    with torch.no_grad():
        base = ours(input_ids=ids, attention_mask=mask).logits
        fine = ours.refine(2)
        assert fine.evolution.num_steps == 6 and fine.evolution.tau == 0.5
        refined = fine(input_ids=ids, attention_mask=mask).logits
        traj = fine.trajectory(input_ids=ids, attention_mask=mask)
        # a name is rebuilt on the pre-LN layout: "lie" is the network itself
        lie = ours.with_scheme("lie")(input_ids=ids, attention_mask=mask).logits
        strang = ours.with_scheme("strang")(input_ids=ids, attention_mask=mask).logits
    assert torch.isfinite(refined).all() and maxdiff(base, refined) > 1e-6
    assert len(traj) == 7 and traj.states.shape == (7, 3, 10, 32)
    assert torch.equal(base, lie)
    assert torch.isfinite(strang).all() and maxdiff(base, strang) > 1e-6
    # the refined model shares the parameters (and the tied head)
    assert fine.lm_head.weight is ours.embedding.word.weight
    assert ours.refine(1)(input_ids=ids).logits.shape == (3, 10, 61)


def test_weight_map_table():
    ref = make_gpt2(torch.float32, lm=True, n_layer=2)
    names = {r.theirs for r in weight_map(2, lm_head=True) if not r.attr}
    assert names == set(ref.state_dict())
    assert any(r.theirs.endswith("c_attn.weight") and r.transform == "transpose"
               for r in GPT2_WEIGHT_MAP)


def test_conv1d_weights_keep_the_source_memory_layout():
    """The weights the map transposes (Conv1D's (in, out)) are stored as transformers stores
    them: our (out, in) parameter is a transposed view of (in, out) storage (the decode speed
    of docs/performance.md); the values, the shapes and the round trip are unchanged."""
    hf = make_gpt2(lm=True)
    ours = from_hf_model(hf)
    rows = [r for r in weight_map(2, lm_head=True) if r.transform == "transpose"]
    assert len(rows) == 8
    for r in rows:
        p = ours.get_parameter(r.ours)
        theirs = hf.get_parameter(r.theirs)
        assert p.shape == theirs.shape[::-1] and p.t().is_contiguous() and not p.is_contiguous()
        assert torch.equal(p.t(), theirs)
    back = splitformer.to_hf(ours)
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in hf.state_dict().items())
    ids, mask = batch()
    with torch.no_grad():
        assert maxdiff(ours(ids, attention_mask=mask).logits,
                       hf(ids, attention_mask=mask).logits) <= TOL[torch.float64]
