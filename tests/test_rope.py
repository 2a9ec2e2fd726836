"""operators.rope: every rope_type of transformers 5, bitwise against transformers itself.

The references are transformers' own init functions (``ROPE_INIT_FUNCTIONS``, the models'
``compute_default_rope_parameters``), rotary modules (LlamaRotaryEmbedding, GPTNeoX's for
partial rotary, Gemma3's per layer type) and ``apply_rotary_pos_emb``; the theorem-named tests
check the kernel reading (scores depend on x - x' only; linear = default at x / s).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from splitformer.operators.rope import ROPE_TYPES, RotaryPositions, rotate_half

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import (  # noqa: E402
    GPTNeoXRotaryEmbedding,
)
from transformers.models.gpt_neox.modeling_gpt_neox import (  # noqa: E402
    apply_rotary_pos_emb as neox_apply_rotary_pos_emb,
)
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

HEAD_DIM = 16  # hidden_size 64, 4 heads
N = 24

# name: (rope_parameters, max_position_embeddings, the trained length n0 where dynamic /
# longrope switch, or where the scaled types' interval ends)
CASES: dict[str, tuple[dict, int, int]] = {
    "default": ({"rope_type": "default", "rope_theta": 500000.0}, 2048, 2048),
    "linear": ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 8192, 2048),
    "dynamic": ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, 256, 256),
    # Llama-3.1's parameters
    "llama3": ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}, 131072, 8192),
    "yarn": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
              "original_max_position_embeddings": 1024}, 4096, 1024),
    "yarn_attention_factor": ({"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                               "original_max_position_embeddings": 1024,
                               "attention_factor": 0.8, "beta_fast": 16.0, "beta_slow": 2.0},
                              4096, 1024),
    # DeepSeek-style: the temperature from mscale / mscale_all_dim
    "yarn_mscale": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                     "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 1.0, "mscale_all_dim": 0.8}, 163840, 4096),
    # gpt-oss: no truncation of the ramp's ends
    "yarn_no_truncate": ({"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                          "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                          "beta_slow": 1.0, "truncate": False}, 131072, 4096),
    # factor None: transformers takes max_position_embeddings / original (DeepSeek-V3's note)
    "yarn_factor_none": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": None,
                          "original_max_position_embeddings": 1024}, 3000, 1024),
    # Phi-3-style: no factor (the ratio of the lengths), default attention factor
    "longrope": ({"rope_type": "longrope", "rope_theta": 10000.0,
                  "short_factor": [1.0, 1.02, 1.05, 1.1, 1.3, 1.7, 2.3, 3.1],
                  "long_factor": [1.0, 1.5, 2.5, 4.0, 7.0, 12.0, 20.0, 33.0],
                  "original_max_position_embeddings": 256}, 1024, 256),
    "longrope_factor": ({"rope_type": "longrope", "rope_theta": 10000.0, "factor": 8.0,
                         "attention_factor": 1.2,
                         "short_factor": [1.0] * 4 + [1.5] * 4,
                         "long_factor": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
                         "original_max_position_embeddings": 256}, 2048, 256),
    # Gemma-4-style: a quarter of the pairs rotate, the exponent over the whole head
    "proportional": ({"rope_type": "proportional", "rope_theta": 1000000.0,
                      "partial_rotary_factor": 0.25}, 2048, 2048),
}


def llama_config(name: str, **extra) -> transformers.LlamaConfig:
    params, max_pos, _ = CASES[name]
    return transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64,
        vocab_size=32, max_position_embeddings=max_pos, rope_parameters=copy.deepcopy(params),
        **extra)


def reference_inv_freq(config, seq_len=None) -> tuple[torch.Tensor, float]:
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)


def batch_positions(n0: int, beyond: bool) -> torch.Tensor:
    """A batch of 2 with different position ids: row 0 from 0, row 1 near the trained length
    n0, ending below it (beyond=False) or past it (beyond=True)."""
    start = n0 - N // 2 if beyond else n0 - N - 3
    return torch.stack([torch.arange(N), torch.arange(start, start + N)])


def test_rope_types_are_transformers():
    assert set(ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}
    assert {CASES[name][0]["rope_type"] for name in CASES} == set(ROPE_TYPES)


@pytest.mark.parametrize("name", list(CASES))
def test_inv_freq_and_scaling_match_transformers_init(name):
    config = llama_config(name)
    rope = RotaryPositions.from_config(config)
    n0 = CASES[name][2]
    for seq_len in (None, N, n0, n0 + 1, 3 * n0 + 5):
        ref, scaling = reference_inv_freq(config, seq_len)
        got = rope.inv_freq(seq_len)
        assert got.dtype == torch.float32 and got.shape == (HEAD_DIM // 2,)
        assert torch.equal(got, ref), (name, seq_len)
        assert rope.attention_scaling(seq_len) == scaling, (name, seq_len)
    if name == "dynamic":  # the forward's tensor seq_len: float32 arithmetic for the new base
        for seq_len in (torch.tensor(n0 + 1), torch.tensor(3 * n0 + 5)):
            ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, None, seq_len=seq_len)
            assert torch.equal(rope.inv_freq(seq_len), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("beyond", [False, True], ids=["below", "beyond"])
@pytest.mark.parametrize("name", list(CASES))
def test_angles_match_llama_rotary_embedding(name, beyond, dtype):
    config = llama_config(name)
    rope = RotaryPositions.from_config(config)
    module = LlamaRotaryEmbedding(config).to(dtype)  # a fresh module: no dynamic state
    positions = batch_positions(CASES[name][2], beyond)
    x = torch.zeros(2, N, 64, dtype=dtype)
    cos_ref, sin_ref = module(x, positions)
    cos, sin = rope.angles(positions, dtype)
    assert cos.shape == sin.shape == (2, 1, N, HEAD_DIM) and cos.dtype == dtype
    assert torch.equal(cos, cos_ref.unsqueeze(1)) and torch.equal(sin, sin_ref.unsqueeze(1))


@pytest.mark.parametrize("name", ["default", "dynamic", "yarn", "longrope"])
def test_angles_at_real_coordinates_and_shared_positions(name):
    config = llama_config(name)
    rope = RotaryPositions.from_config(config)
    n0 = CASES[name][2]
    for positions in (torch.arange(N)[None] * 0.37 + n0 - 5.5,  # real coordinates, (1, N)
                      torch.arange(n0 - 4, n0 - 4 + N)[None]):
        cos_ref, sin_ref = LlamaRotaryEmbedding(config)(torch.zeros(1, N, 64), positions)
        cos, sin = rope.angles(positions, torch.float32)
        assert cos.shape == (1, 1, N, HEAD_DIM)
        assert torch.equal(cos, cos_ref.unsqueeze(1)) and torch.equal(sin, sin_ref.unsqueeze(1))


def test_dynamic_matches_transformers_while_the_length_grows():
    """Generation: a prefill, then one position per step, the max position never decreasing;
    transformers' stateful module and our function of the current length agree at every step."""
    config = llama_config("dynamic")
    rope = RotaryPositions.from_config(config)
    module = LlamaRotaryEmbedding(config)
    n0 = CASES["dynamic"][2]
    steps = [torch.arange(n0 - 10)[None].expand(2, -1)]
    steps += [torch.tensor([[p], [p]]) for p in range(n0 - 10, n0 + 12)]
    steps += [torch.arange(n0 + 40, n0 + 60)[None], torch.tensor([[3 * n0]])]
    for dtype in (torch.float32, torch.float64):
        module = LlamaRotaryEmbedding(config).to(dtype)
        for positions in steps:
            cos_ref, sin_ref = module(torch.zeros(1, 1, 64, dtype=dtype), positions)
            cos, sin = rope.angles(positions, dtype)
            assert torch.equal(cos, cos_ref.unsqueeze(1)), int(positions.max())
            assert torch.equal(sin, sin_ref.unsqueeze(1)), int(positions.max())


def test_dynamic_is_a_function_of_the_current_length():
    """The documented difference: after a longer forward beyond n0, transformers keeps that
    forward's base; ours is the base of the current length (a fresh module's)."""
    config = llama_config("dynamic")
    rope = RotaryPositions.from_config(config)
    n0 = CASES["dynamic"][2]
    stateful = LlamaRotaryEmbedding(config)
    stateful(torch.zeros(1, 1, 64), torch.tensor([[3 * n0]]))
    positions = torch.arange(n0, n0 + 20)[None]
    cos, _ = rope.angles(positions, torch.float32)
    fresh, _ = LlamaRotaryEmbedding(config)(torch.zeros(1, 1, 64), positions)
    kept, _ = stateful(torch.zeros(1, 1, 64), positions)
    assert torch.equal(cos, fresh.unsqueeze(1))
    assert not torch.equal(cos, kept.unsqueeze(1))


PARTIAL = ["default", "linear", "dynamic", "yarn", "llama3", "longrope"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", PARTIAL)
def test_partial_rotary_matches_gpt_neox(name, dtype):
    """partial_rotary_factor 0.5 of a 16-feature head (GPT-NeoX's rotary module reads it for
    every type): the frequencies of 8 features, and the rotation of those 8 only."""
    params, max_pos, n0 = copy.deepcopy(CASES[name])
    params["partial_rotary_factor"] = 0.5
    if name == "longrope":
        params["short_factor"] = params["short_factor"][:4]
        params["long_factor"] = params["long_factor"][:4]
    config = transformers.GPTNeoXConfig(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64,
        vocab_size=32, max_position_embeddings=max_pos, rope_parameters=params)
    rope = RotaryPositions.from_config(config)
    assert rope.dim == HEAD_DIM // 2 and rope.head_dim == HEAD_DIM
    assert rope.to_parameters() == config.rope_parameters
    for beyond in (False, True):
        positions = batch_positions(n0, beyond)
        cos_ref, sin_ref = GPTNeoXRotaryEmbedding(config).to(dtype)(
            torch.zeros(2, N, 64, dtype=dtype), positions)
        cos, sin = rope.angles(positions, dtype)
        assert cos.shape[-1] == HEAD_DIM // 2
        assert torch.equal(cos, cos_ref.unsqueeze(1)) and torch.equal(sin, sin_ref.unsqueeze(1))
        q = torch.randn(2, 4, N, HEAD_DIM, dtype=dtype)
        k = torch.randn(2, 4, N, HEAD_DIM, dtype=dtype)
        q_ref, k_ref = neox_apply_rotary_pos_emb(q, k, cos_ref, sin_ref)
        assert torch.equal(rotate_half(q, cos, sin), q_ref)
        assert torch.equal(rotate_half(k, cos, sin), k_ref)
        assert torch.equal(rotate_half(q, cos, sin)[..., HEAD_DIM // 2:], q[..., HEAD_DIM // 2:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", ["default", "yarn", "proportional"])
def test_rotate_half_matches_apply_rotary_pos_emb(name, dtype):
    config = llama_config(name)
    positions = batch_positions(CASES[name][2], True)
    cos, sin = RotaryPositions.from_config(config).angles(positions, dtype)
    q = torch.randn(2, 4, N, HEAD_DIM).to(dtype)
    k = torch.randn(2, 4, N, HEAD_DIM).to(dtype)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos.squeeze(1), sin.squeeze(1))
    assert torch.equal(rotate_half(q, cos, sin), q_ref)
    assert torch.equal(rotate_half(k, cos, sin), k_ref)
    # (1, N) positions broadcast over the batch
    cos1, sin1 = RotaryPositions.from_config(config).angles(positions[:1], dtype)
    q_ref, _ = apply_rotary_pos_emb(q, k, cos1.squeeze(1), sin1.squeeze(1))
    assert torch.equal(rotate_half(q, cos1, sin1), q_ref)


def test_gemma3_per_layer_type():
    """Gemma3: a local (default) and a global (linear, factor 8) kernel, one per layer type."""
    config = transformers.Gemma3TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=HEAD_DIM,
        num_hidden_layers=2, intermediate_size=64, vocab_size=32, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0}})
    module = Gemma3RotaryEmbedding(config)
    positions = batch_positions(64, True)
    for layer_type in ("sliding_attention", "full_attention"):
        rope = RotaryPositions.from_config(config, layer_type=layer_type)
        assert rope.to_parameters() == config.rope_parameters[layer_type]
        cos_ref, sin_ref = module(torch.zeros(2, N, 64), positions, layer_type)
        cos, sin = rope.angles(positions, torch.float32)
        assert torch.equal(cos, cos_ref.unsqueeze(1)) and torch.equal(sin, sin_ref.unsqueeze(1))
    with pytest.raises(ValueError, match="layer_type"):
        RotaryPositions.from_config(config)
    with pytest.raises(ValueError, match="layer_type 'chunked'"):
        RotaryPositions.from_config(config, layer_type="chunked")


@pytest.mark.parametrize("name", list(CASES))
def test_from_config_to_parameters_round_trip(name):
    config = llama_config(name)
    rope = RotaryPositions.from_config(config)
    assert rope.to_parameters() == config.rope_parameters
    assert rope.base == config.rope_parameters["rope_theta"]
    assert rope.max_position_embeddings == CASES[name][1]
    params = {k: v for k, v in rope.to_parameters().items() if k not in ("rope_type", "rope_theta")}
    again = RotaryPositions(rope.dim, rope.base, rope.rope_type, params,
                            rope.max_position_embeddings, rope.head_dim)
    assert again == rope and hash(again) == hash(rope)
    with pytest.raises(TypeError):
        rope.parameters["factor"] = 2.0  # type: ignore[index]
    line = rope.describe()
    assert "\n" not in line and line.startswith(f"rope {rope.rope_type}, base ")


def test_describe():
    assert RotaryPositions(64, 1e5, head_dim=64).describe() == \
        "rope default, base 1e+05 on 64 of 64 features"
    linear = RotaryPositions.from_config(llama_config("linear"))
    assert linear.describe().endswith("linear: coordinates x -> x / 4")


def test_qwen2_config_without_head_dim():
    config = transformers.Qwen2Config(hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=1)
    rope = RotaryPositions.from_config(config)
    assert (rope.dim, rope.head_dim, rope.rope_type) == (16, 16, "default")
    assert RotaryPositions.from_config(config, head_dim=32).dim == 32


def test_errors_name_the_key():
    config = llama_config("default")
    config.rope_parameters = {"rope_type": "ntk-by-parts", "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="rope_type.*ntk-by-parts"):
        RotaryPositions.from_config(config)
    config.rope_parameters = {"rope_type": "linear", "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="'factor'"):
        RotaryPositions.from_config(config)
    config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(ValueError, match="'low_freq_factor'"):
        RotaryPositions.from_config(config)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        RotaryPositions(16, 10000.0, "yarn", {"factor": 2.0})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        RotaryPositions(16, 10000.0, "dynamic", {"factor": 2.0})
    with pytest.raises(ValueError, match="short_factor"):
        RotaryPositions(16, 10000.0, "longrope", {"short_factor": [1.0], "long_factor": [1.0] * 8,
                                                  "factor": 4.0,
                                                  "original_max_position_embeddings": 64})
    with pytest.raises(ValueError, match="dim"):
        RotaryPositions(15, 10000.0)


def _scores(rope: RotaryPositions, positions: torch.Tensor, q: torch.Tensor,
            k: torch.Tensor) -> torch.Tensor:
    cos, sin = rope.angles(positions, torch.float32)
    return rotate_half(q, cos, sin) @ rotate_half(k, cos, sin).transpose(-1, -2)


@pytest.mark.parametrize("name", list(CASES))
def test_theorem_rotated_scores_depend_on_the_difference_only(name):
    """<R_x q, R_x' k> = <q, R_(x'-x) k>: shifting every position by 7 leaves the scores
    unchanged (float32 angles; positions inside one regime of dynamic / longrope)."""
    rope = RotaryPositions.from_config(llama_config(name))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, N, HEAD_DIM, generator=gen)
    k = torch.randn(1, 4, N, HEAD_DIM, generator=gen)
    positions = torch.arange(N)[None] + 3
    base = _scores(rope, positions, q, k)
    shifted = _scores(rope, positions + 7, q, k)
    torch.testing.assert_close(shifted, base, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("factor", [4.0, 3.0])
def test_theorem_linear_is_position_interpolation(factor):
    """Linear scaling is the default kernel read at the coordinates x / s (a finer grid on the
    trained interval): its angles, and its scores, at x equal default's at x / s (bitwise for
    a power-of-two s, where x / s and w / s are exact)."""
    default = RotaryPositions(HEAD_DIM, 10000.0)
    linear = RotaryPositions(HEAD_DIM, 10000.0, "linear", {"factor": factor})
    positions = torch.stack([torch.arange(N), torch.arange(100, 100 + N)]).float()
    cos, sin = linear.angles(positions, torch.float32)
    cos_d, sin_d = default.angles(positions / factor, torch.float32)
    if math.log2(factor).is_integer():
        assert torch.equal(cos, cos_d) and torch.equal(sin, sin_d)
    # otherwise float32 rounding of the angles (up to 123 / s rad here): a few ulp of 123
    torch.testing.assert_close(cos, cos_d, atol=5e-5, rtol=0)
    torch.testing.assert_close(sin, sin_d, atol=5e-5, rtol=0)
    q, k = torch.randn(2, 2, 4, N, HEAD_DIM, generator=torch.Generator().manual_seed(1)).unbind(0)
    scores, scores_d = _scores(linear, positions, q, k), _scores(default, positions / factor, q, k)
    if math.log2(factor).is_integer():
        assert torch.equal(scores, scores_d)
    # |q| |k| ~ 16 times the angles' rounding above
    torch.testing.assert_close(scores, scores_d, atol=2e-4, rtol=0)
