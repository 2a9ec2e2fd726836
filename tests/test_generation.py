"""Generation on a KV tape (docs/generation.md, docs/math.md 3.19).

The reference is the cacheless oracle (every token from a forward over the whole prefix) and,
for GPT-2, transformers' own ``GPT2LMHeadModel.generate`` with its DynamicCache. The theorem
behind the tape: the causal evolution is a Volterra operator in x, so at every attention
evaluation in time the keys and values of the past nodes are final.
"""

from __future__ import annotations

import pytest
import torch

import splitformer
from splitformer.models import causal_decoder
from splitformer.models.generation import GenerationConfig, warp_scores
from splitformer.operators.tape import KVTape, TapeError

transformers = pytest.importorskip("transformers")

VOCAB = 61


def _lm(dtype=torch.float64, seed=0, layers=3, dim=24, heads=3):
    torch.manual_seed(seed)
    return causal_decoder(VOCAB, 96, dim, heads, layers, lm_head=True, dtype=dtype).eval()


def _ids(b=2, n=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (b, n), generator=g)


VARIANTS = {
    "prenorm (GPT-2's Lie step)": lambda m: m,
    "lie": lambda m: m.with_scheme("lie"),
    "strang": lambda m: m.with_scheme("strang"),
    "parallel": lambda m: m.with_scheme("parallel"),
    "heun": lambda m: m.with_scheme("prenorm", integrator="heun"),
    "rk4": lambda m: m.with_scheme("prenorm", integrator="rk4"),
    "reversible": lambda m: m.with_scheme("reversible"),
    "refine(2)": lambda m: m.refine(2),
    "linear controls": lambda m: m.with_controls_in_time("linear"),
    "strang + heun + refine(2)": lambda m: m.with_scheme("strang", integrator="heun").refine(2),
}

KERNELS = {
    "softmax": {},
    "alibi": {"causal": True},
    "gaussian": {},
    "rotary": {},
    "linear": {},
    "sinkhorn (1 iteration)": {"iterations": 1},
}


def _kernel(model, name):
    opts = KERNELS[name]
    return model.with_kernel(name.split(" ")[0], **opts)


def _tape_vs_oracle(model, ids, mask=None, new=6):
    out = model.generate(ids, new, attention_mask=mask, return_logits=True)
    ref = model.generate(ids, new, attention_mask=mask, return_logits=True, use_cache=False)
    assert torch.equal(out.sequences, ref.sequences)
    err = max(float((a - b).abs().max()) for a, b in zip(out.logits, ref.logits, strict=True))
    return err


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_volterra_tape_equals_the_oracle_for_every_scheme(variant):
    """Strang evaluates attention twice a step, Heun twice and RK4 four times per substep,
    refine(2) twice per control set, linear controls blend a fresh operator per step: the
    tape, indexed by the evaluation in time, equals re-running the prefix (float64)."""
    model = VARIANTS[variant](_lm())
    assert _tape_vs_oracle(model, _ids()) <= 1e-10


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_volterra_tape_equals_the_oracle_for_every_cacheable_kernel(kernel):
    model = _kernel(_lm(), kernel)
    assert _tape_vs_oracle(model, _ids()) <= 1e-10


@pytest.mark.parametrize("kernel", ["softmax", "rotary", "linear"])
def test_tape_with_left_padding_equals_the_oracle_and_each_row_alone(kernel):
    """A left-padded batch: the padding is recorded on the tape's grid; every row generates
    what it generates alone (positions cumsum(mask) - 1, as transformers gives them)."""
    model = _kernel(_lm(), kernel)
    ids = _ids(3, 8)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :1] = 0
    assert _tape_vs_oracle(model, ids, mask) <= 1e-10
    batch = model.generate(ids, 5, attention_mask=mask)
    for r in range(3):
        alone = model.generate(ids[r:r + 1, mask[r].bool()], 5)
        assert torch.equal(batch[r, -5:], alone[0, -5:])


def test_linear_kernel_tape_is_constant_memory_per_token():
    """The recurrent form keeps running sums: the tape's bytes do not grow with the prefix."""
    model = _kernel(_lm(), "linear")
    tape = KVTape()
    ids = _ids(1, 40)
    with torch.no_grad():
        model(ids[:, :10], tape=tape)
        first = tape.nbytes()
        for i in range(10, 40):
            model(ids[:, i:i + 1], tape=tape)
    assert tape.length == 40 and tape.nbytes() == first > 0
    softmax = _lm()
    t2 = KVTape()
    with torch.no_grad():
        softmax(ids[:, :10], tape=t2)
        b10 = t2.nbytes()
        softmax(ids[:, 10:40], tape=t2)
    assert t2.nbytes() == 4 * b10  # K and V per node: linear in the length


def test_sinkhorn_is_refused_on_the_tape_by_name_and_the_oracle_still_runs():
    model = _lm().with_kernel("sinkhorn", iterations=3)
    with pytest.raises(TapeError, match="Sinkhorn.*column sums run over the past queries"):
        model.generate(_ids(), 3)
    assert model.generate(_ids(), 3, use_cache=False).shape == (2, 12)


def test_a_user_kernel_without_a_cache_declaration_is_refused():
    from splitformer.operators.kernels import SoftmaxKernel

    class Mine(SoftmaxKernel):
        caches = None

    model = _lm()
    for op in model.modules():
        if isinstance(op, splitformer.operators.AttentionOperator):
            op.install_kernel(Mine())
    with pytest.raises(TapeError, match="Mine cannot be cached exactly: it declares no cache"):
        model.generate(_ids(), 2)


def test_tape_forward_in_chunks_equals_one_forward_on_a_token_grid():
    """Prefill in chunks with coordinates and weights: the grid lives in the tape."""
    model = _lm().with_kernel("rotary")
    ids = _ids(2, 10)
    coords = torch.tensor([0.0, 1, 2, 2.5, 4, 5, 6, 7, 8.5, 9])
    weights = torch.tensor([1.0, 1, 2, 0.5, 1, 1, 3, 1, 1, 1])
    with torch.no_grad():
        full = model(ids, token_coords=coords, token_weights=weights).logits
        tape = KVTape()
        parts = [model(ids[:, a:b], token_coords=coords[a:b], token_weights=weights[a:b],
                       tape=tape).logits for a, b in ((0, 4), (4, 7), (7, 10))]
    assert float((torch.cat(parts, 1) - full).abs().max()) <= 1e-10
    assert torch.equal(tape.coords[0], coords.double()) and tape.length == 10


def test_a_failed_forward_leaves_the_tape_as_it_was():
    model = _lm()
    tape = KVTape()
    ids = _ids(2, 6)
    with torch.no_grad():
        model(ids[:, :4], tape=tape)
        before = [e.k[:, :, :4].clone() for e in tape.entries]
        with pytest.raises(ValueError, match="input_ids must lie in"):
            model(torch.full((2, 1), VOCAB + 5), tape=tape)
        with pytest.raises(TapeError, match="batch of 2 rows"):
            model(ids[:1, 4:5], tape=tape)
        assert tape.length == 4 and not tape.open
        a = model(ids[:, 4:6], tape=tape).logits
    assert all(torch.equal(e.k[:, :, :4], b) for e, b in zip(tape.entries, before, strict=True))
    with torch.no_grad():
        assert float((a - model(ids).logits[:, 4:6]).abs().max()) <= 1e-10


@pytest.mark.parametrize("other,match", [
    (lambda m: m.with_scheme("strang"), "another scheme, time grid or controls"),
    (lambda m: m.with_scheme("parallel"), "another scheme, time grid or controls"),
    (lambda m: m.refine(2), "another scheme, time grid or controls"),
    (lambda m: m.with_controls_in_time("linear"), "another scheme, time grid or controls"),
    (lambda m: m.with_kernel("rotary"), "the kernel RotaryKernel.*but the tape recorded "
                                        "SoftmaxKernel"),
    (lambda m: m.with_kernel("gaussian"), "the kernel GaussianKernel"),
    (lambda m: m.with_kernel("linear"), "the kernel LinearKernel"),
])
def test_a_tape_recorded_by_one_model_refuses_another(other, match):
    """Parallel, or another kernel, evaluates attention as many times as prenorm but at
    other states (or with another kernel): refused (it was accepted, off by 0.019), and the
    tape is left as it was."""
    model = _lm()
    tape = KVTape()
    with torch.no_grad():
        model(_ids(2, 4), tape=tape)
        with pytest.raises(TapeError, match=match):
            other(model)(_ids(2, 1), tape=tape)
        model.with_scheme("prenorm")(_ids(2, 1), tape=tape)  # the same model, copied: fits
    assert tape.length == 5


def test_a_tape_checks_the_count_of_evaluations_too():
    model = _lm()
    strang = KVTape()
    with torch.no_grad():
        model.with_scheme("strang")(_ids(2, 4), tape=strang)
        strang.signature = None  # as if recorded without a signature: the count still checks
        with pytest.raises(TapeError, match="evaluated attention 3 times but the tape "
                                            "recorded 6"):
            model(_ids(2, 1), tape=strang)
    assert strang.length == 4


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_gpt2_greedy_generate_equals_transformers_for_64_tokens(dtype, tol):
    """from_hf(GPT2LMHeadModel).generate equals transformers' generate with its own
    DynamicCache, id for id, for 64 new tokens (batch of 2, no padding and left padding)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=3, n_embd=48, n_head=4, vocab_size=VOCAB,
                                  n_positions=128, bos_token_id=0, eos_token_id=1)
    hf = transformers.GPT2LMHeadModel(cfg).to(dtype).eval()
    model = splitformer.from_hf(hf).eval()
    ids = _ids(2, 11)
    for mask in (torch.ones_like(ids), torch.tensor([[0, 0, 0] + [1] * 8, [1] * 11])):
        ref = hf.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False,
                          pad_token_id=0, eos_token_id=None, output_logits=True,
                          return_dict_in_generate=True)
        out = model.generate(ids, 64, attention_mask=mask, return_logits=True)
        assert torch.equal(out.sequences, ref.sequences)
        err = max(float((a.float() - b).abs().max())
                  for a, b in zip(out.logits, ref.logits, strict=True))
        assert err <= tol * 10


def test_gpt2_sampling_is_reproducible_and_draws_as_transformers():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
                                  n_positions=64)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    model = splitformer.from_hf(hf).eval()
    ids = _ids(2, 5)
    opts = {"do_sample": True, "temperature": 0.8, "top_k": 20, "top_p": 0.9}
    a = model.generate(ids, 30, seed=7, **opts)
    b = model.generate(ids, 30, generator=torch.Generator().manual_seed(7), **opts)
    assert torch.equal(a, b)
    assert not torch.equal(a, model.generate(ids, 30, seed=8, **opts))
    torch.manual_seed(11)
    ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30,
                      pad_token_id=0, **opts)
    torch.manual_seed(11)
    assert torch.equal(model.generate(ids, 30, **opts), ref)


def test_eos_finishes_a_row_and_pads_it():
    model = _lm()
    ids = _ids(2, 5)
    free = model.generate(ids, 8)
    eos = int(free[0, 7])  # the third new token of row 0
    out = model.generate(ids, 8, eos_token_id=eos, pad_token_id=VOCAB - 1)
    row0 = out[0, 5:].tolist()
    cut = row0.index(eos)
    assert cut <= 2 and row0[:cut + 1] == free[0, 5:5 + cut + 1].tolist()
    assert all(t == VOCAB - 1 for t in row0[cut + 1:])  # finished: padded from there on
    stop = free[1, 5:].tolist()
    if eos in stop:  # both rows finished: the loop stopped at the later one
        assert out.shape[1] == 5 + max(cut, stop.index(eos)) + 1
    else:
        assert out.shape[1] == 13 and out[1, 5:].tolist() == stop


def test_warpers_follow_transformers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )
    torch.manual_seed(0)
    scores = torch.randn(3, 50)
    cfg = GenerationConfig(do_sample=True, temperature=0.7, top_k=12, top_p=0.8)
    ref = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(12)(None, TemperatureLogitsWarper(0.7)(
        None, scores)))
    assert torch.equal(warp_scores(scores, cfg), ref)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_new_tokens": -1}, "max_new_tokens must be an int >= 0"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an int >= 0"),
    ({"temperature": 0.0}, "temperature must be a finite number > 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number > 0"),
    ({"top_k": 0}, "top_k must be None or an int >= 1"),
    ({"top_p": 1.5}, "top_p must be None or a number in"),
    ({"eos_token_id": -3}, "eos_token_id must be an int >= 0"),
    ({"seed": -1}, "seed must be an int in \\[0, 2\\^63\\)"),
    ({"seed": 2 ** 70}, "seed must be an int in"),
    ({"seed": 1, "generator": torch.Generator()}, "pass generator or seed, not both"),
    ({"attention_mask": torch.ones(2, 3)}, "attention_mask must be a tensor of the shape"),
    ({"attention_mask": torch.tensor([[1] * 8 + [0]] * 2)}, "every row must end with a token"),
    ({"attention_mask": torch.full((2, 9), 2)}, "1 \\(token\\) and 0 \\(padding\\) only"),
    ({"max_new_tokens": 90}, "exceed the model's 96 learned positions"),
    ({"streamer": 3}, "streamer must be callable"),
])
def test_bad_generate_arguments_are_named(kwargs, match):
    model = _lm()
    kwargs = dict(kwargs)
    new = kwargs.pop("max_new_tokens", 3)
    with pytest.raises((ValueError, TypeError), match=match):
        model.generate(_ids(), new, **kwargs)


def test_generate_refuses_training_mode_and_float_ids():
    model = _lm().train()
    with pytest.raises(ValueError, match="training mode"):
        model.generate(_ids(), 2)
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        model.eval().generate(_ids().double(), 2)


def test_tape_arguments_are_checked():
    model = _lm()
    tape = KVTape()
    with pytest.raises(TypeError, match="tape must be a splitformer KVTape"):
        model(_ids(), tape={})
    with pytest.raises(ValueError, match="capacity must be an int >= 0"):
        KVTape(-1)
    with torch.no_grad():
        model(_ids(2, 4), tape=tape)
        with pytest.raises(ValueError, match="attention_mask on a KV tape must have shape"):
            model(_ids(2, 1), attention_mask=torch.ones(2, 3), tape=tape)
        with pytest.raises(ValueError, match="differ from the padding the tape recorded"):
            model(_ids(2, 1), attention_mask=torch.tensor([[0, 1, 1, 1, 1]] * 2), tape=tape)
        out = model(_ids(2, 1), attention_mask=torch.ones(2, 5), tape=tape)
    assert out.logits.shape == (2, 1, VOCAB) and tape.length == 5


def test_nn_transformer_decoder_on_a_tape_equals_torch_with_a_causal_mask():
    """from_torch(nn.TransformerDecoder): the target nodes fed a few at a time on a tape (the
    memory read by cross-attention at each forward) equal torch's decoder with its causal
    mask and key padding."""
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                       dtype=torch.float64)
    dec = nn.TransformerDecoder(layer, 2).eval()
    model = splitformer.from_torch(dec).eval()
    tgt = torch.randn(2, 7, 16, dtype=torch.float64)
    mem = torch.randn(2, 5, 16, dtype=torch.float64)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 1] = True  # a padding node inside row 1's prefix
    causal = nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64)
    with torch.no_grad():
        ref = dec(tgt, mem, tgt_mask=causal, tgt_key_padding_mask=kpm, tgt_is_causal=True)
        tape = KVTape()
        parts = [model(tgt[:, a:b], mem, tgt_key_padding_mask=kpm[:, a:b], tgt_is_causal=True,
                       tape=tape) for a, b in ((0, 3), (3, 4), (4, 5), (5, 7))]
        with pytest.raises(ValueError, match="pass tgt_is_causal=True and no tgt_mask"):
            model(tgt[:, :1], mem, tgt_mask=causal[:1, :1], tape=KVTape())
        with pytest.raises(ValueError, match="memory_is_causal with a KV tape"):
            model(tgt[:, :1], mem, tgt_is_causal=True, memory_is_causal=True, tape=KVTape())
    out = torch.cat(parts, 1)
    assert float((out - ref)[~kpm].abs().max()) <= 1e-10 and tape.length == 7


def test_sampling_options_without_do_sample_are_warned_about():
    model = _lm()
    with pytest.warns(UserWarning, match="temperature, top_k act\\(s\\) on sampling"):
        out = model.generate(_ids(), 3, temperature=0.1, top_k=3)
    assert torch.equal(out, model.generate(_ids(), 3))
