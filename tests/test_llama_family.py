"""The Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3 text) <-> the rotary decoder:
exact against transformers' own modules built from random configs (registry-driven: every
family whose record's map is hf_llama), and the readings of docs/math.md 3.15-3.18 proved on
the operators against torch.nn and transformers."""

from __future__ import annotations

import math

import pytest
import torch

import splitformer
from splitformer.interop.families import families
from splitformer.models.causal import CausalLM
from splitformer.operators import (
    Context,
    GatedFeedForward,
    GroupedQueryAttention,
    RMSNormProjection,
)
from splitformer.operators.rope import RotaryPositions
from splitformer.operators.tape import KVTape
from splitformer.verification.references import perturb_

transformers = pytest.importorskip("transformers")

FAMILIES = [f for f in families("transformers") if f.map == "hf_llama"]
NAMES = [f.name for f in FAMILIES]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def softcapped(family) -> bool:
    """Gemma2: soft-capped scores, eager only in transformers (sdpa refuses softcap)."""
    return bool(family.traits.get("softcap") and family.example.get("attn_logit_softcapping"))


def implementations(family) -> list[str]:
    """transformers' attention paths of a family."""
    return ["eager"] if softcapped(family) else ["sdpa", "eager"]


def reference(family, dtype=torch.float64, impl="sdpa", lm=True, seed=0):
    model = family.reference(family.classes[1] if lm else family.classes[0], dtype=dtype,
                             seed=seed)
    model.config._attn_implementation = impl
    return perturb_(model, seed=seed + 7)  # non-trivial norm gains


def inputs(family, b=3, n=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, int(family.example["vocab_size"]), (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    if b > 1:
        mask[1, :3] = 0  # left padding
    return ids, mask


CASES = [(f.name, dtype, impl) for f in FAMILIES for dtype in TOL for impl in implementations(f)]


@pytest.mark.parametrize("name,dtype,impl", CASES)
def test_logits_equal_transformers(name, dtype, impl):
    family = next(f for f in FAMILIES if f.name == name)
    ref = reference(family, dtype, impl)
    ours = splitformer.from_hf(ref)
    ids, mask = inputs(family)
    if dtype == torch.float64 and impl == "eager":
        # transformers' eager softmax runs in float32: finfo(float64).min becomes -inf and a
        # padded row turns NaN there (and everywhere after it); compare without padding
        mask = torch.ones_like(mask)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    # transformers' eager softmax is float32 even in a float64 model (ours: float64, except
    # Gemma2's soft-capped kernel, which follows transformers' eager path)
    tol = 2e-6 if impl == "eager" and dtype == torch.float64 and not softcapped(family) \
        else TOL[dtype]
    assert (want - got)[keep].abs().max().item() <= tol


@pytest.mark.parametrize("name", NAMES)
def test_position_ids_and_base_model(name):
    family = next(f for f in FAMILIES if f.name == name)
    impl = implementations(family)[0]
    ref = reference(family, impl=impl, lm=False)
    ours = splitformer.from_hf(ref)
    ids, _ = inputs(family, b=2, n=7)
    pos = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [0, 1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        want = ref(input_ids=ids, position_ids=pos).last_hidden_state
        got = ours(input_ids=ids, position_ids=pos).last_hidden_state
    assert (want - got).abs().max().item() <= 1e-10


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_is_the_identity(name):
    family = next(f for f in FAMILIES if f.name == name)
    ref = reference(family, impl=implementations(family)[0])
    back = splitformer.to_hf(splitformer.from_hf(ref))
    assert type(back) is type(ref)
    a, b = ref.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ids, mask = inputs(family)
    with torch.no_grad():  # equal_nan: transformers' eager float64 path is NaN on padded rows
        torch.testing.assert_close(ref(input_ids=ids, attention_mask=mask).logits,
                                   back(input_ids=ids, attention_mask=mask).logits,
                                   rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", NAMES)
def test_generate_equals_transformers_greedy(name):
    """The tape and the cacheless oracle give transformers' greedy ids, left padding included
    (Mistral's and Gemma's sliding windows are shorter than the prompt), with the defaults of
    both: the config's eos stops a row (it does in some families here) and pad continues it."""
    family = next(f for f in FAMILIES if f.name == name)
    impl = implementations(family)[0]
    # transformers' eager float64 path is NaN on left-padded rows: Gemma2 runs in float32
    ref = reference(family, torch.float32 if impl == "eager" else torch.float64, impl)
    ours = splitformer.from_hf(ref)
    ids, mask = inputs(family, b=2, n=7)
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                            pad_token_id=0)
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=16, pad_token_id=0)
        oracle = ours.generate(ids, attention_mask=mask, max_new_tokens=16, pad_token_id=0,
                               use_cache=False)
    assert torch.equal(want, got)
    assert torch.equal(got, oracle)


@pytest.mark.parametrize("name", NAMES)
def test_tape_keeps_the_coarse_key_value_heads(name):
    family = next(f for f in FAMILIES if f.name == name)
    ours = splitformer.from_hf(reference(family, impl=implementations(family)[0]))
    ids, _ = inputs(family, b=2, n=5)
    tape = KVTape()
    with torch.no_grad():
        ours(input_ids=ids, tape=tape)
    cfg = ours.source
    per_node = 2 * cfg.num_kv_heads * cfg.head_dim * 8  # K and V, float64
    assert tape.nbytes() == cfg.num_layers * 2 * 5 * per_node
    assert tape.nbytes() < cfg.num_layers * 2 * 5 * 2 * cfg.num_heads * cfg.head_dim * 8


def test_rotary_angles_computed_once_per_forward(monkeypatch):
    """RoPE is computed once per forward (per distinct rotary positions), not per layer:
    Gemma3's two (local and global) are two calls for its two layers... and for any depth."""
    family = next(f for f in FAMILIES if f.name == "llama")
    ours = splitformer.from_hf(reference(family)).refine(3)  # 6 attention evaluations
    calls = []
    original = RotaryPositions.angles

    def counting(self, positions, dtype):
        calls.append(self.rope_type)
        return original(self, positions, dtype)

    monkeypatch.setattr(RotaryPositions, "angles", counting)
    ids, _ = inputs(family, b=1, n=6)
    with torch.no_grad():
        ours(input_ids=ids)
    assert len(calls) == 1


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2"])
def test_splitformer_tools_apply(name):
    """refine(1) and with_scheme('prenorm' / the family's own) change nothing; refine(2),
    strang, coarsen, drop_steps, trajectory and other kernels run; a coarsened model exports
    to transformers with the same logits."""
    family = next(f for f in FAMILIES if f.name == name)
    ours = splitformer.from_hf(reference(family, impl=implementations(family)[0]))
    ids, mask = inputs(family)
    with torch.no_grad():
        base = ours(input_ids=ids, attention_mask=mask).logits
        assert torch.equal(ours.refine(1)(input_ids=ids, attention_mask=mask).logits, base)
        for m in (ours.refine(2), ours.with_scheme("strang"), ours.coarsen(2),
                  ours.drop_steps([0])):
            out = m(input_ids=ids, attention_mask=mask).logits
            assert out.shape == base.shape and torch.isfinite(out).all()
            assert (out - base).abs().max() > 0
        path = ours.trajectory(input_ids=ids)
        assert len(path.states) == ours.evolution.num_steps + 1
        coarse = ours.coarsen(2)
        if family.example.get("layer_types") is None and "layer_types" not in \
                ours.source.config:
            exported = splitformer.to_hf(coarse)
            assert exported.config.num_hidden_layers == 1
            want = coarse(input_ids=ids, attention_mask=mask).logits
            got = exported(input_ids=ids, attention_mask=mask).logits
            assert (want - got)[mask.bool()].abs().max() <= 1e-10
    if ours.source.attention_scale is not None:  # Gemma: query_pre_attn_scalar's scale
        with pytest.raises(ValueError, match="no score scale"):
            ours.with_kernel("linear")
        return
    linear = ours.with_kernel("linear")
    with torch.no_grad():
        out = linear(input_ids=ids).logits
    assert torch.isfinite(out).all()


def test_drop_steps_equals_transformers_without_the_layer():
    family = next(f for f in FAMILIES if f.name == "llama")
    ref = reference(family)
    ours = splitformer.from_hf(ref).drop_steps([0])
    ref.model.layers = ref.model.layers[1:]
    ids, mask = inputs(family)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    assert (want - got)[mask.bool()].abs().max() <= 1e-10


def test_save_load_round_trip(tmp_path):
    family = next(f for f in FAMILIES if f.name == "gemma3")
    ours = splitformer.from_hf(reference(family))
    splitformer.save(ours, tmp_path / "m")
    back = splitformer.load(tmp_path / "m")
    ids, mask = inputs(family)
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids, attention_mask=mask).logits,
                           back(input_ids=ids, attention_mask=mask).logits)
    assert isinstance(back, CausalLM)


# -- the readings of docs/math.md 3.15-3.18 -----------------------------------------------------

def test_rmsnorm_is_the_projection_onto_a_sphere_with_a_ghost_point():
    """3.15: v / sqrt(mean v^2 + eps) is the first N coordinates of the projection of
    (v, sqrt(N eps)) onto the sphere of radius sqrt(N) in R^(N+1); equal to torch.nn.RMSNorm;
    without eps the nearest point of {|v|^2 = N}."""
    torch.manual_seed(0)
    v = torch.randn(5, 12, dtype=torch.float64) * 3
    p = RMSNormProjection(12, eps=1e-3, upcast=False, dtype=torch.float64)
    torch_rms = torch.nn.RMSNorm(12, eps=1e-3, dtype=torch.float64)
    with torch.no_grad():
        p.weight.normal_()
        torch_rms.weight.copy_(p.weight)
    assert (p(v) - torch_rms(v)).abs().max() <= 1e-14
    assert (p.affine(p.ghost_projection(v)) - p(v)).abs().max() <= 1e-14
    exact = RMSNormProjection(12, eps=0.0, upcast=False, elementwise_affine=False)
    pv = exact(v)
    assert torch.allclose(pv.pow(2).sum(-1), torch.full((5,), 12.0, dtype=torch.float64))
    assert exact.distance(pv).max() <= 1e-12
    w = torch.randn(200, 12, dtype=torch.float64)
    w = math.sqrt(12) * w / w.norm(dim=-1, keepdim=True)  # points of the sphere
    for i in range(5):
        assert (v[i] - pv[i]).norm() <= (v[i] - w).norm(dim=-1).min() + 1e-12


@pytest.mark.parametrize("cls,offset", [("LlamaRMSNorm", 0.0), ("Gemma2RMSNorm", 1.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rmsnorm_equals_transformers_bitwise(cls, offset, dtype):
    """transformers computes the normalisation in float32 (float64 too) and Gemma's (1 + g)
    gain in float32 before the cast; the projection reproduces both bitwise."""
    module = getattr(transformers.models.llama.modeling_llama if cls.startswith("Llama")
                     else transformers.models.gemma2.modeling_gemma2, cls)(16, eps=1e-5)
    module = module.to(dtype)
    with torch.no_grad():
        module.weight.normal_()
    ours = RMSNormProjection(16, eps=1e-5, offset=offset, gain_in_float32=offset != 0.0,
                             dtype=dtype)
    with torch.no_grad():
        ours.weight.copy_(module.weight)
    v = torch.randn(3, 7, 16).to(dtype) * 4
    assert torch.equal(ours(v), module(v))


def test_gated_field_equals_llama_mlp_and_its_lipschitz_bound_holds():
    """3.16: G(u) = W_d (SiLU(W_g u) * (W_u u)) is transformers' LlamaMLP; on the ball the
    pre-norm projects into, difference quotients stay below ``lipschitz_bound``."""
    config = transformers.LlamaConfig(hidden_size=12, intermediate_size=20, hidden_act="silu",
                                      num_attention_heads=2)
    mlp = transformers.models.llama.modeling_llama.LlamaMLP(config).double()
    ours = GatedFeedForward(12, 20, dtype=torch.float64)
    with torch.no_grad():
        for a, b in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            getattr(ours, a).weight.copy_(getattr(mlp, b).weight)
    u = torch.randn(4, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(ours(u), mlp(u))
        norm = RMSNormProjection(12, eps=1e-6, dtype=torch.float64)
        norm.weight.uniform_(0.5, 2.0)
        radius = norm.radius()
        bound = ours.lipschitz_bound(radius)
        x = norm(torch.randn(400, 12, dtype=torch.float64))
        y = norm(torch.randn(400, 12, dtype=torch.float64))
        assert x.norm(dim=-1).max() <= radius + 1e-9
        quotient = (ours(x) - ours(y)).norm(dim=-1) / (x - y).norm(dim=-1)
        assert quotient.max() <= bound
        big = ours.lipschitz_bound(10 * radius)
        assert big > 5 * bound  # not globally Lipschitz: the bound grows with the radius


def test_grouped_query_attention_is_a_coarser_head_quadrature():
    """3.17: GQA equals multi-head attention whose K and V weights are the H_kv heads
    repeated H / H_kv times (the coarse quadrature read on the fine grid); MQA is H_kv = 1."""
    torch.manual_seed(0)
    for kv in (1, 2):
        gqa = GroupedQueryAttention(16, 4, num_kv_heads=kv, head_dim=6, dtype=torch.float64)
        mha = GroupedQueryAttention(16, 4, num_kv_heads=4, head_dim=6, dtype=torch.float64)
        with torch.no_grad():
            mha.q_weight.copy_(gqa.q_weight)
            mha.out_weight.copy_(gqa.out_weight)
            for name in ("k_weight", "v_weight"):
                w = getattr(gqa, name).view(kv, 6, 16).repeat_interleave(4 // kv, dim=0)
                getattr(mha, name).copy_(w.reshape(24, 16))
        u = torch.randn(2, 7, 16, dtype=torch.float64)
        ctx = Context(is_causal=True)
        assert (gqa(u, ctx) - mha(u, ctx)).abs().max() <= 1e-14


def test_qk_norm_projects_each_head_onto_a_sphere():
    torch.manual_seed(0)
    def norm():
        return (RMSNormProjection(6, eps=0.0, upcast=False, dtype=torch.float64))
    op = GroupedQueryAttention(16, 4, num_kv_heads=2, head_dim=6, q_norm=norm(), k_norm=norm(),
                               dtype=torch.float64)
    q, k, _ = op.qkv(torch.randn(2, 5, 16, dtype=torch.float64), Context())
    assert torch.allclose(q.pow(2).sum(-1), torch.full_like(q[..., 0], 6.0))
    assert torch.allclose(k.pow(2).sum(-1), torch.full_like(k[..., 0], 6.0))


def test_sliding_window_is_a_support_on_the_coordinates():
    """3.17: with window W, the output at x does not depend on u(x') for x' <= x - W (one
    step; with coordinates given, on the coordinates)."""
    torch.manual_seed(0)
    op = GroupedQueryAttention(16, 4, num_kv_heads=2, head_dim=6, window=3,
                               dtype=torch.float64)
    u = torch.randn(1, 8, 16, dtype=torch.float64)
    changed = u.clone()
    changed[:, :4] += 1.0  # nodes 0..3: outside the window of nodes 7 (and 6 only sees 4..6)
    ctx = Context(is_causal=True)
    assert torch.equal(op(u, ctx)[:, 7:], op(changed, ctx)[:, 7:])
    assert not torch.equal(op(u, ctx)[:, 5:6], op(changed, ctx)[:, 5:6])
    coords = torch.arange(8, dtype=torch.float64) * 2.0  # spacing 2: the window holds 2 nodes
    grid = Context(is_causal=True, token_coords=coords)
    part = changed.clone()
    part[:, :6] = u[:, :6]
    part[:, :5] += 1.0
    assert torch.equal(op(u, grid)[:, 7:], op(part, grid)[:, 7:])


def test_to_hf_refuses_a_kernel_transformers_does_not_compute():
    for name in ("llama", "gemma2"):
        family = next(f for f in FAMILIES if f.name == name)
        ours = splitformer.from_hf(reference(family, impl=implementations(family)[0]))
        with pytest.raises(ValueError, match="kernel"):
            splitformer.to_hf(ours.with_kernel("gaussian"))


@pytest.mark.parametrize("change,word", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                          "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"layer_types": ["weird", "full_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"hidden_act": "tanh"}, "hidden_act"),
])
def test_unsupported_config_is_refused_naming_the_option(change, word):
    family = next(f for f in FAMILIES if f.name == "qwen2")
    model = family.reference(family.classes[1])
    for key, value in change.items():  # set after construction (as a user may)
        setattr(model.config, key, value)
    with pytest.raises(ValueError, match=word):
        splitformer.from_hf(model)
