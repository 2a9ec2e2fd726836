"""Context extension as grid refinement (docs/context.md): ``with_rope`` on a Llama-family
model against transformers' own model with the same rope_parameters, exports, save / load,
and the kernel reading of splitformer's ``bandwidth`` rule (phases inside the trained ones,
the log n temperature only past the trained length)."""

from __future__ import annotations

import math

import pytest
import torch

import splitformer
from splitformer.operators.rope import BANDWIDTH_TURNS, RotaryPositions

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
            "factor": s, "original_max_position_embeddings": n0, "turns": 1}).inv_freq().double()
        linear = RotaryPositions(dim, base, "linear", {"factor": s}).inv_freq().double()
        turned = default * n0 >= 2 * math.pi
        assert 0 < int(turned.sum()) < dim // 2  # both kinds of band occur in these kernels
        assert torch.equal(ours[turned], default[turned].float().double())
        assert bool((ours[~turned] * s * n0 <= default[~turned] * n0 * (1 + 1e-6)).all())
        # turns=T keeps the bands that turned at least T times (yarn's beta_fast is 32)
        many = RotaryPositions(dim, base, "bandwidth", {
            "factor": s, "original_max_position_embeddings": n0, "turns": 32}).inv_freq()
        default_turns = RotaryPositions(dim, base, "bandwidth", {
            "factor": s, "original_max_position_embeddings": n0})
        assert default_turns.parameters["turns"] == BANDWIDTH_TURNS == 32
        assert torch.equal(default_turns.inv_freq(), many)
        fast = default * n0 >= 2 * math.pi * 32
        assert torch.equal(many.double()[fast], default[fast].float().double())
        assert torch.allclose(many.double()[~fast], default[~fast] / s, rtol=1e-6)
        assert bool((linear * s * n0 <= default * n0 * (1 + 1e-6)).all())
        assert bool((linear[turned] < default[turned]).all())


def test_a_bandwidth_record_keeps_its_turns_and_an_old_one_read_turns_one():
    """A stored bandwidth kernel writes its turns out, so a later default does not change it;
    a record written before the default was 32 (no turns) reads as turns 1, as it was read."""
    rope = RotaryPositions(64, 1e5, "bandwidth", {"factor": 2.0,
                                                  "original_max_position_embeddings": 512})
    record = rope.record()
    assert record["parameters"]["turns"] == BANDWIDTH_TURNS
    assert torch.equal(RotaryPositions.from_record(record).inv_freq(), rope.inv_freq())
    old = {**record, "parameters": {k: v for k, v in record["parameters"].items()
                                    if k != "turns"}}
    one = RotaryPositions(64, 1e5, "bandwidth", {"factor": 2.0, "turns": 1,
                                                 "original_max_position_embeddings": 512})
    assert torch.equal(RotaryPositions.from_record(old).inv_freq(), one.inv_freq())
    assert not torch.equal(one.inv_freq(), rope.inv_freq())


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


def _one_layer():
    torch.manual_seed(0)
    cfg = _config()
    cfg.num_hidden_layers = 1
    ref = transformers.LlamaForCausalLM(cfg).double().eval()
    return splitformer.from_hf(ref).eval()


@pytest.mark.parametrize("rule", [("bandwidth", {"factor": None}), ("dynamic", {"factor": 2.0})],
                         ids=["bandwidth-follow", "dynamic"])
def test_theorem_a_tape_that_follows_the_length_holds_one_forwards_keys(rule):
    """For a kernel whose frequencies follow the length n (bandwidth without a factor: s =
    max(1, n / n0); dynamic NTK), KVTape(follow_length=True) re-rotates the stored keys to each
    forward's frequencies: with one attention evaluation the chunked logits are one forward's
    over the whole prefix, bitwise (float64, chunks of 24), chunk by chunk past n0. For
    transformers' dynamic the plain tape (keys at the frequencies they were rotated with,
    transformers' cache) is not; ours declares keys_follow_length, so every tape follows it."""
    from splitformer.operators.tape import KVTape

    name, params = rule
    m = _one_layer().with_rope(name, **params)
    assert next(iter(m.rotary.values())).follows_length
    ids = torch.randint(0, VOCAB, (1, 4 * N0), generator=torch.Generator().manual_seed(6))
    follow, plain = KVTape(follow_length=True), KVTape()
    worst_plain = 0.0
    with torch.no_grad():
        for s in range(0, ids.shape[1], 24):
            whole = m(ids[:, :s + 24]).logits[:, s:]
            assert torch.equal(m(ids[:, s:s + 24], tape=follow).logits, whole), s
            worst_plain = max(worst_plain, float((m(ids[:, s:s + 24], tape=plain).logits
                                                  - whole).abs().max()))
    if name == "dynamic":
        assert worst_plain > 1e-6
    else:
        assert worst_plain == 0.0


def test_theorem_a_length_dependent_kernel_is_not_volterra(pair):
    """With two evaluations the past nodes' states themselves depend on the kernel of the
    length they were read at: appending nodes changes them (the kernel changes with the grid's
    extent), so no cache is exact (docs/math.md 3.19 needs a kernel independent of the length):
    the following tape and one forward over the prefix differ past n0, and agree before."""
    from splitformer.operators.tape import KVTape

    _, ours = pair
    m = ours.with_rope("bandwidth", factor=None)
    ids = torch.randint(0, VOCAB, (1, 3 * N0), generator=torch.Generator().manual_seed(7))
    tape = KVTape(follow_length=True)
    with torch.no_grad():
        first = m(ids[:, :N0 - 8], tape=tape).logits
        assert torch.equal(first, m(ids[:, :N0 - 8]).logits)
        m(ids[:, N0 - 8:2 * N0], tape=tape)
        late = m(ids[:, 2 * N0:], tape=tape).logits
        whole = m(ids).logits[:, 2 * N0:]
    assert float((late - whole).abs().max()) > 1e-6


def test_bandwidth_without_a_factor_reads_the_current_length():
    rope = RotaryPositions(64, 1e5, "bandwidth", {"factor": None,
                                                  "original_max_position_embeddings": 8192})
    fixed = RotaryPositions(64, 1e5, "bandwidth", {"factor": 4.0,
                                                   "original_max_position_embeddings": 8192})
    default = RotaryPositions(64, 1e5)
    assert torch.equal(rope.forward_frequencies(8192), default.inv_freq())
    assert torch.equal(rope.forward_frequencies(4 * 8192), fixed.inv_freq())
    assert rope.follows_length and not fixed.follows_length
    assert "x / s, s = max(1, n / n0) at the current length n" in rope.describe()


def test_follow_length_refusals():
    from splitformer.operators.cache_policy import cache_policy
    from splitformer.operators.tape import KVTape

    with pytest.raises(TypeError, match="follow_length must be a bool"):
        KVTape(follow_length=1)
    with pytest.raises(ValueError, match="follow_length re-rotates"):
        KVTape(policy=cache_policy("streaming", 0.5), follow_length=True)


def test_our_length_following_kernel_is_followed_by_every_tape(pair):
    """bandwidth without a factor declares keys_follow_length: a plain tape (generate's,
    score_stream's) re-rotates for it as KVTape(follow_length=True) does; a cache policy that
    compresses its keys is refused by name; generate does not warn past the trained length."""
    import warnings

    from splitformer.operators.cache_policy import cache_policy
    from splitformer.operators.tape import KVTape, TapeError

    _, ours = pair
    m = ours.with_rope("bandwidth", factor=None)
    ids = torch.randint(0, VOCAB, (1, 3 * N0), generator=torch.Generator().manual_seed(8))
    a, b = KVTape(), KVTape(follow_length=True)
    with torch.no_grad():
        for s in range(0, ids.shape[1], 16):
            assert torch.equal(m(ids[:, s:s + 16], tape=a).logits,
                               m(ids[:, s:s + 16], tape=b).logits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.generate(ids[:, :N0], 8)
    with pytest.warns(UserWarning, match="go past the 32 positions"):
        ours.generate(ids[:, :N0], 8)
    with pytest.raises(TapeError, match="follow the length"):
        m.generate(ids, 4, cache_policy=cache_policy("streaming", 0.5))


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "llama3"])
def test_every_type_refuses_bad_factors_bases_and_misspellings(pair, rope_type):
    _, ours = pair
    extra = ({"low_freq_factor": 1.0, "high_freq_factor": 4.0} if rope_type == "llama3"
             else {})
    for bad in (0, -1.0, 0.5, float("inf"), float("nan"), True, "4"):
        with pytest.raises(ValueError, match=f"factor: rope_type '{rope_type}' needs a finite"):
            ours.with_rope(rope_type, factor=bad, **extra)
    with pytest.raises(ValueError, match=f"facter: rope_type '{rope_type}' does not read"):
        ours.with_rope(rope_type, factor=2.0, facter=2, **extra)
    for bad in ("1e5", float("inf"), True, 0.0):
        with pytest.raises(ValueError, match="rope_theta: the base must be"):
            ours.with_rope(rope_type, factor=2.0, rope_theta=bad, **extra)
    with pytest.raises(ValueError, match="temprature: rope_type 'bandwidth' does not read"):
        ours.with_rope("bandwidth", factor=2.0, temprature="none")


def test_trained_and_read_lengths_as_transformers_configs_write_them(pair):
    """A transformers config of an extended kernel records the trained length n0 in
    original_max_position_embeddings (yarn) or as max_position_embeddings / s (linear), and the
    length it is read for in max_position_embeddings: trained_positions and context_positions
    read them so; with_rope writes its models the same way, and to_hf exports that length."""
    ref, ours = pair
    for params, n0 in (({"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": N0}, N0),
                       ({"rope_type": "linear", "factor": 4.0}, N0)):
        cfg = _config(params)
        cfg.max_position_embeddings = 4 * N0
        m = splitformer.from_hf(transformers.LlamaForCausalLM(cfg))
        assert (m.trained_positions, m.context_positions) == (n0, 4 * N0), params
    for rope_type in ("yarn", "linear", "bandwidth"):
        m = ours.with_rope(rope_type, factor=4.0)
        assert (m.trained_positions, m.context_positions) == (N0, 4 * N0), rope_type
        twice = m.with_rope(rope_type, factor=2.0)  # re-read from the trained length
        assert (twice.trained_positions, twice.context_positions) == (N0, 2 * N0), rope_type
    dynamic = ours.with_rope("dynamic", factor=4.0)
    assert dynamic.context_positions is None and dynamic.trained_positions == N0
    assert splitformer.to_hf(ours.with_rope("yarn", factor=4.0)).config \
        .max_position_embeddings == 4 * N0


def test_a_record_rebuilds_the_kernel():
    for rope in (RotaryPositions(16, 1e4, "bandwidth", {"factor": None, "turns": 32,
                                                        "original_max_position_embeddings": 8}),
                 RotaryPositions(16, 1e4, "longrope", {
                     "short_factor": [1.0] * 8, "long_factor": [1.0, 2, 3, 4, 5, 6, 7, 8],
                     "original_max_position_embeddings": 8}, max_position_embeddings=32)):
        back = RotaryPositions.from_record(rope.record())
        assert back == rope and torch.equal(back.inv_freq(64), rope.inv_freq(64))
