"""Context extension as grid refinement (docs/context.md): ``with_rope`` on a Llama-family
model against transformers' own model with the same rope_parameters, exports, save / load,
and the kernel reading of splitformer's ``bandwidth`` rule (phases inside the trained ones,
the log n temperature only past the trained length)."""

from __future__ import annotations

import math

import pytest
import torch

import splitformer
from splitformer.operators.rope import RotaryPositions

transformers = pytest.importorskip("transformers")

N0 = 32  # the trained length of the small model
VOCAB = 97


def _config(rope_parameters: dict | None = None) -> transformers.LlamaConfig:
    params = {"rope_type": "default", "rope_theta": 10000.0, **(rope_parameters or {})}
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, intermediate_size=96, max_position_embeddings=N0,
        rope_parameters=params)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(_config()).double().eval()
    return ref, splitformer.from_hf(ref).eval()


def _theirs(ref, params: dict):
    other = transformers.LlamaForCausalLM(_config(params)).double().eval()
    other.load_state_dict(ref.state_dict())
    return other


# transformers' rope types at factor 4 of the trained 32 (yarn / llama3 / longrope read n0 from
# original_max_position_embeddings, which with_rope fills in)
EXTENSIONS = {
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 4.0},
    "yarn": {"factor": 4.0},
    "llama3": {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "longrope": {"short_factor": [1.0] * 8, "long_factor": [1.0, 1.5, 2, 3, 4, 5, 6, 8],
                 "factor": 4.0},
}


@pytest.mark.parametrize("rope_type", list(EXTENSIONS))
def test_with_rope_equals_transformers_with_that_rope_type(pair, rope_type):
    """with_rope(rope_type, ...) of the converted model equals transformers' LlamaForCausalLM
    built with those rope_parameters (the same weights), at 4x the trained length, float64:
    <= 1e-10 (in fact bitwise here); the converted model itself is untouched."""
    ref, ours = pair
    params = EXTENSIONS[rope_type]
    theirs = _theirs(ref, {"rope_type": rope_type, **params,
                           **({} if rope_type in ("linear", "dynamic")
                              else {"original_max_position_embeddings": N0})})
    ids = torch.randint(0, VOCAB, (2, 4 * N0), generator=torch.Generator().manual_seed(1))
    extended = ours.with_rope(rope_type, **params)
    with torch.no_grad():
        got, want = extended(ids).logits, theirs(ids).logits
        plain = ours(ids).logits
    assert (got - want).abs().max().item() <= 1e-10
    assert (plain - ref(ids).logits).abs().max().item() <= 1e-10  # the source is untouched
    assert (plain - got).abs().max().item() > 1e-6  # and the rope type did change the kernel
    assert next(iter(extended.rotary.values())).rope_type == rope_type


def test_with_rope_on_the_tape_equals_one_forward(pair):
    """The chunked prefill on the KV tape (positions absolute, as transformers' cache) gives
    the logits of one forward, for a static rule (bandwidth, log temperature): <= 1e-10."""
    from splitformer.operators.tape import KVTape

    _, ours = pair
    m = ours.with_rope("bandwidth", factor=4.0)
    ids = torch.randint(0, VOCAB, (1, 3 * N0), generator=torch.Generator().manual_seed(2))
    tape = KVTape(capacity=ids.shape[1])
    with torch.no_grad():
        whole = m(ids).logits
        parts = torch.cat([m(ids[:, s:s + 20], tape=tape).logits
                           for s in range(0, ids.shape[1], 20)], dim=1)
    assert (whole - parts).abs().max().item() <= 1e-10


def test_to_hf_writes_transformers_rope_types_and_refuses_ours(pair):
    ref, ours = pair
    yarn = ours.with_rope("yarn", factor=4.0)
    exported = splitformer.to_hf(yarn)
    assert exported.config.rope_parameters["rope_type"] == "yarn"
    assert exported.config.rope_parameters["factor"] == 4.0
    ids = torch.randint(0, VOCAB, (1, 3 * N0), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, yarn(ids).logits)
    with pytest.raises(ValueError, match="rope_type 'bandwidth' is splitformer's own"):
        splitformer.to_hf(ours.with_rope("bandwidth", factor=4.0))


@pytest.mark.parametrize("rope_type", ["bandwidth", "yarn"])
def test_save_and_load_keep_the_rope(pair, rope_type, tmp_path):
    _, ours = pair
    m = ours.with_rope(rope_type, factor=4.0)
    splitformer.save(m, tmp_path / "m")
    back = splitformer.load(tmp_path / "m")
    assert back.rotary == m.rotary
    ids = torch.randint(0, VOCAB, (1, 3 * N0), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, m(ids).logits)


def test_theorem_bandwidth_phases_stay_inside_the_trained_ones():
    """Every band's phases on [0, s n0) under bandwidth lie inside what the trained kernel swept
    on [0, n0): a band that turned at least once (all phases seen) keeps its frequency, any
    other sweeps at most its trained range w_i n0; Position Interpolation (linear) also stays
    inside but slows every band, the kept ones included (the resolution it loses)."""
    for base, dim, n0, s in ((1e5, 64, 8192, 4.0), (1e4, 128, 4096, 8.0), (5e5, 64, 2048, 2.0)):
        default = RotaryPositions(dim, base).inv_freq().double()
        ours = RotaryPositions(dim, base, "bandwidth", {
            "factor": s, "original_max_position_embeddings": n0}).inv_freq().double()
        linear = RotaryPositions(dim, base, "linear", {"factor": s}).inv_freq().double()
        turned = default * n0 >= 2 * math.pi
        assert 0 < int(turned.sum()) < dim // 2  # both kinds of band occur in these kernels
        assert torch.equal(ours[turned], default[turned].float().double())
        assert bool((ours[~turned] * s * n0 <= default[~turned] * n0 * (1 + 1e-6)).all())
        # turns=T keeps the bands that turned at least T times (yarn's beta_fast is 32)
        many = RotaryPositions(dim, base, "bandwidth", {
            "factor": s, "original_max_position_embeddings": n0, "turns": 32}).inv_freq()
        fast = default * n0 >= 2 * math.pi * 32
        assert torch.equal(many.double()[fast], default[fast].float().double())
        assert torch.allclose(many.double()[~fast], default[~fast] / s, rtol=1e-6)
        assert bool((linear * s * n0 <= default * n0 * (1 + 1e-6)).all())
        assert bool((linear[turned] < default[turned]).all())


def test_bandwidth_changes_nothing_on_the_trained_interval_but_the_slow_bands(pair):
    """Below n0 the temperature is 1: with temperature 'log' and 'none' the logits agree
    bitwise on [0, n0) and differ past it, where the query at x is scaled by ln(x+1) / ln n0."""
    _, ours = pair
    log = ours.with_rope("bandwidth", factor=4.0)
    none = ours.with_rope("bandwidth", factor=4.0, temperature="none")
    ids = torch.randint(0, VOCAB, (1, 3 * N0), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, b = log(ids).logits, none(ids).logits
    assert torch.equal(a[:, :N0], b[:, :N0])
    assert (a[:, N0 + 1:] - b[:, N0 + 1:]).abs().amax(-1).min().item() > 1e-8
    rope = next(iter(log.rotary.values()))
    x = torch.tensor([0, N0 - 1, N0, 2 * N0 - 1, 4 * N0 - 1])
    factor = rope.query_temperature(x).flatten()
    want = torch.tensor([1, 1, math.log(N0 + 1) / math.log(N0), math.log(2 * N0) / math.log(N0),
                         math.log(4 * N0) / math.log(N0)], dtype=torch.float32)
    torch.testing.assert_close(factor, want)


def test_refusals_name_the_argument(pair):
    _, ours = pair
    with pytest.raises(ValueError, match="rope_type: unknown rope_type 'ntk'"):
        ours.with_rope("ntk", factor=2.0)
    with pytest.raises(ValueError, match="factor: rope_type 'linear' needs"):
        ours.with_rope("linear")
    for bad in (0.5, float("inf"), float("nan"), True, "4"):
        with pytest.raises(ValueError, match="factor: rope_type 'bandwidth' needs a finite"):
            ours.with_rope("bandwidth", factor=bad)
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="turns: rope_type 'bandwidth' keeps the bands"):
            ours.with_rope("bandwidth", factor=2.0, turns=bad)
    with pytest.raises(ValueError, match="temperature: rope_type 'bandwidth' takes"):
        ours.with_rope("bandwidth", factor=2.0, temperature="sqrt")
    with pytest.raises(TypeError, match="rope_type must be a str"):
        ours.with_rope(4.0)
    gpt2 = splitformer.from_hf(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=16)))
    with pytest.raises(ValueError, match="with_rope: .* has no rotary positions"):
        gpt2.with_rope("linear", factor=2.0)
