"""Attention kernels as values: each reduced to the standard case, or checked against the
reference implementation in transformers where one exists."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import splitformer
from splitformer.models.kernels import set_kernel
from splitformer.operators import Context, CrossAttention, NonlocalAttention
from splitformer.operators.kernels import (
    ALiBiKernel,
    GaussianKernel,
    LinearKernel,
    RotaryKernel,
    SinkhornKernel,
    SoftmaxKernel,
    alibi_slopes,
)
from splitformer.verification.references import TOL


def _qkv(dtype, b=2, h=3, n=6, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g, dtype=dtype) for _ in range(3))


def test_sinkhorn_one_iteration_is_softmax():
    q, k, v = _qkv(torch.float64)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert (SinkhornKernel(1)(q, k, v) - ref).abs().max() < 1e-14
    mask = torch.rand(6, 6) > 0.3
    mask.fill_diagonal_(True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (SinkhornKernel(1)(q, k, v, attn_mask=mask) - ref).abs().max() < 1e-14


def test_sinkhorn_converges_to_doubly_stochastic():
    q, k, _ = _qkv(torch.float64)
    eye = torch.eye(6, dtype=torch.float64).expand(2, 3, 6, 6)
    p = SinkhornKernel(200)(q, k, eye)  # P @ I = P
    assert torch.allclose(p.sum(-1), torch.ones(2, 3, 6, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(p.sum(-2), torch.ones(2, 3, 6, dtype=torch.float64), atol=1e-6)


def test_gaussian_equals_softmax_for_keys_of_equal_norm():
    q, k, v = _qkv(torch.float64)
    k = 1.7 * k / k.norm(dim=-1, keepdim=True)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert (GaussianKernel()(q, k, v) - ref).abs().max() < 1e-14
    # and differs when norms differ
    q, k, v = _qkv(torch.float64)
    assert (GaussianKernel()(q, k, v) - F.scaled_dot_product_attention(q, k, v)).abs().max() \
        > 1e-3


def test_linear_kernel_matches_its_quadratic_form_and_is_a_mean():
    q, k, v = _qkv(torch.float64)
    lk = LinearKernel()
    fq, fk = lk.feature_map(q), lk.feature_map(k)
    w = fq @ fk.transpose(-2, -1)
    ref = (w / w.sum(-1, keepdim=True)) @ v
    assert (lk(q, k, v) - ref).abs().max() < 1e-13
    ones = torch.ones_like(v)
    assert torch.allclose(lk(q, k, ones), ones)  # rows of g integrate to 1
    causal = lk(q, k, v, is_causal=True)
    assert torch.allclose(causal[..., 0, :], v[..., 0, :])  # x = 0 sees x' = 0 only


def test_causal_support_is_a_volterra_operator():
    """u(x) depends on u(x') for x' <= x only: changing the future leaves the past unchanged."""
    q, k, v = _qkv(torch.float64)
    for kern in (SoftmaxKernel(), SinkhornKernel(1), GaussianKernel(), LinearKernel(),
                 ALiBiKernel(3), RotaryKernel(4)):
        out = kern(q, k, v, is_causal=True)
        k2, v2 = k.clone(), v.clone()
        k2[..., 4:, :] += 1.0
        v2[..., 4:, :] -= 2.0
        out2 = kern(q, k2, v2, is_causal=True)
        assert torch.allclose(out[..., :4, :], out2[..., :4, :], atol=1e-13), kern.name
        assert not torch.allclose(out[..., 4:, :], out2[..., 4:, :]), kern.name


@pytest.mark.parametrize("heads", [4, 6, 8, 12])
def test_alibi_slopes_match_transformers(heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 5), heads, torch.float64)  # slope_h * position
    assert torch.allclose(alibi[:, 0, 1], alibi_slopes(heads).double())


def test_alibi_is_relative_and_zero_slopes_give_softmax():
    q, k, v = _qkv(torch.float64)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert (ALiBiKernel(3, slopes=torch.zeros(3))(q, k, v) - ref).abs().max() < 1e-14
    b = ALiBiKernel(3).bias(6, 6, torch.float64, None)
    assert torch.equal(b[:, 1:, 1:], b[:, :-1, :-1])  # depends on x - x' only


def test_rotary_matches_transformers_llama_rotation():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=16, num_attention_heads=2, head_dim=8)
    cos, sin = LlamaRotaryEmbedding(cfg)(torch.randn(1, 7, 16), torch.arange(7)[None])
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 7, 8, generator=g) for _ in range(3))
    qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
    ref = F.scaled_dot_product_attention(qr, kr, v)
    assert (RotaryKernel(8)(q, k, v) - ref).abs().max() <= 1e-5
    # scores depend on x - x' only: shifting all positions leaves them unchanged
    rk = RotaryKernel(8)
    c, s = rk.angles(10, torch.float64, None)
    qd, kd = q.double(), k.double()
    a0 = rk.rotate(qd, c[:7], s[:7]) @ rk.rotate(kd, c[:7], s[:7]).transpose(-2, -1)
    a3 = rk.rotate(qd, c[3:], s[3:]) @ rk.rotate(kd, c[3:], s[3:]).transpose(-2, -1)
    assert torch.allclose(a0, a3, atol=1e-12)


def test_cross_attention_equals_multihead_attention(dtype):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(12, 3, batch_first=True, dtype=dtype).eval()
    a = CrossAttention(12, 3, dtype=dtype)
    with torch.no_grad():
        a.qkv_weight.copy_(mha.in_proj_weight)
        a.qkv_bias.copy_(mha.in_proj_bias)
        a.out_weight.copy_(mha.out_proj.weight)
        a.out_bias.copy_(mha.out_proj.bias)
    x, m = torch.randn(2, 5, 12, dtype=dtype), torch.randn(2, 7, 12, dtype=dtype)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 5:] = True
    with torch.no_grad():
        ref = mha(x, m, m, key_padding_mask=kpm, need_weights=False)[0]
        ctx = Context(memory=m, memory_mask=(~kpm).view(2, 1, 1, 7))
        assert (a(x, ctx) - ref).abs().max() <= TOL[dtype]
    with pytest.raises(ValueError, match="memory"):
        a(x)


def test_set_kernel_on_a_converted_model():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                       dtype=torch.float64)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    m = splitformer.from_torch(enc).eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        ref = enc(x)
        set_kernel(m, "sinkhorn", iterations=1)
        assert (m(x) - ref).abs().max() < 1e-12
        set_kernel(m, "alibi")
        assert (m(x) - ref).abs().max() > 1e-3
        set_kernel(m, "softmax")
        assert (m(x) - ref).abs().max() < 1e-12
    assert all(isinstance(o.kernel, SoftmaxKernel) for o in m.modules()
               if isinstance(o, NonlocalAttention))
    with pytest.raises(ValueError, match="kernel must be"):
        set_kernel(m, "nope")


# -- causality: every kernel, with its real settings, on real causal models -----------------
# (name, options of set_kernel): the defaults the registry builds, and Sinkhorn with several
# iterations (its column normalisation is where the future could leak in)
CAUSAL_CASES = [
    ("softmax", {}),
    ("sinkhorn", {}),
    ("sinkhorn", {"iterations": 2}),
    ("sinkhorn", {"iterations": 7}),
    ("gaussian", {}),
    ("linear", {}),
    ("alibi", {}),
    ("rotary", {}),
]
CAUSAL_IDS = [n + "".join(f"-{k}{v}" for k, v in o.items()) for n, o in CAUSAL_CASES]
PAST = 5  # tokens 0..4 are the past, 5.. the perturbed future


def _assert_past_unchanged(out, out2, what):
    assert (out[:, :PAST] - out2[:, :PAST]).abs().max().item() <= 1e-12, what
    assert (out[:, PAST:] - out2[:, PAST:]).abs().max().item() > 1e-6, what  # it did change


@pytest.mark.parametrize("padded", [False, True], ids=["is_causal", "causal_mask"])
@pytest.mark.parametrize(("name", "options"), CAUSAL_CASES, ids=CAUSAL_IDS)
def test_every_kernel_is_causal_on_the_gpt2_family(name, options, padded):
    """GPT-2 family (causal_decoder): changing tokens PAST.. leaves the outputs at x < PAST.
    Without padding the support is ``is_causal``; with padding it is a causal & padding mask
    (``is_causal=False``), as transformers builds it."""
    torch.manual_seed(0)
    m = splitformer.models.causal_decoder(50, 16, 16, 2, 2, dtype=torch.float64).eval()
    set_kernel(m, name, **options)
    ids = torch.randint(0, 50, (2, 9))
    ids2 = ids.clone()
    ids2[:, PAST:] = (ids2[:, PAST:] + 1 + torch.randint(0, 48, (2, 9 - PAST))) % 50
    mask = None
    if padded:
        mask = torch.ones(2, 9, dtype=torch.long)
        mask[1, -2:] = 0  # right padding in row 1 (inside the future)
    with torch.no_grad():
        out = m(ids, attention_mask=mask).last_hidden_state
        out2 = m(ids2, attention_mask=mask).last_hidden_state
    _assert_past_unchanged(out, out2, (name, options, padded))


@pytest.mark.parametrize("padded", [False, True], ids=["is_causal", "is_causal+padding"])
@pytest.mark.parametrize(("name", "options"), CAUSAL_CASES, ids=CAUSAL_IDS)
def test_every_kernel_is_causal_on_an_encoder_run_with_is_causal(name, options, padded):
    torch.manual_seed(1)
    m = splitformer.network_encoder(16, 2, 32, 2, dtype=torch.float64).eval()
    set_kernel(m, name, **options)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[:, PAST:] += torch.randn(2, 9 - PAST, 16, dtype=torch.float64)
    kpm = None
    if padded:
        kpm = torch.zeros(2, 9, dtype=torch.bool)
        kpm[1, -2:] = True
    with torch.no_grad():
        out = m(x, src_key_padding_mask=kpm, is_causal=True)
        out2 = m(x2, src_key_padding_mask=kpm, is_causal=True)
    _assert_past_unchanged(out, out2, (name, options, padded))


def _sinkhorn_reference(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """Plain Sinkhorn (probability domain) of exp(a) on its support (a = -inf off it)."""
    p = a.exp()
    p = p / p.sum(-1, keepdim=True)
    for _ in range(iterations - 1):
        p = p / p.sum(-2, keepdim=True).clamp_min(1e-300)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-300)
    return p


@pytest.mark.parametrize("iterations", [1, 3, 6])
def test_causal_sinkhorn_is_the_sinkhorn_plan_of_the_past(iterations):
    """With a causal support, row x of the kernel is row x of the Sinkhorn plan of the problem
    restricted to the past {0..x}^2; the last row is the plain Sinkhorn plan's."""
    q, k, v = _qkv(torch.float64, n=7)
    n = q.shape[-2]
    a = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    a = a.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    ref = torch.cat([_sinkhorn_reference(a[..., : x + 1, : x + 1], iterations)[..., x:, :]
                     @ v[..., : x + 1, :] for x in range(n)], dim=-2)
    kern = SinkhornKernel(iterations)
    assert (kern(q, k, v, is_causal=True) - ref).abs().max() < 1e-13
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    assert (kern(q, k, v, attn_mask=tril) - ref).abs().max() < 1e-13  # a causal mask: the same
    if iterations == 1:
        assert (kern(q, k, v, is_causal=True)
                - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max() < 1e-14
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # full support: the plain plan
    assert (kern(q, k, v) - _sinkhorn_reference(scores, iterations) @ v).abs().max() < 1e-13


# -- set_kernel: every attention operator, validated names, kept scales --------------------
def _gpt2_by_layer():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=16,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  scale_attn_by_inverse_layer_idx=True)
    cfg._attn_implementation = "sdpa"
    return transformers.GPT2Model(cfg).double().eval()


def test_set_kernel_softmax_keeps_gpt2_scale_by_inverse_layer_idx():
    hf = _gpt2_by_layer()
    m = splitformer.from_hf(hf).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        ref = hf(input_ids=ids).last_hidden_state
        assert (m(ids).last_hidden_state - ref).abs().max() < 1e-12
        set_kernel(m, "softmax")
        assert (m(ids).last_hidden_state - ref).abs().max() < 1e-12
        set_kernel(m, "sinkhorn", iterations=1)  # the same kernel, the same scales
        assert (m(ids).last_hidden_state - ref).abs().max() < 1e-12
    scales = [theta["attention"].kernel.scale for theta in m.evolution.controls]
    assert scales == [8 ** -0.5, 8 ** -0.5 / 2]  # 1/sqrt(d_h) / (n + 1), d_h = 8
    with pytest.raises(ValueError, match=r"(?s)CausalDecoderModel.*'linear'.*scale"):
        set_kernel(m, "linear")
    assert all(type(t["attention"].kernel) is SinkhornKernel for t in m.evolution.controls)


def test_set_kernel_validates_the_name_first_and_needs_an_attention_operator():
    with pytest.raises(ValueError, match="alibi.*gaussian.*linear.*rotary.*sinkhorn.*softmax"):
        set_kernel(nn.Linear(2, 2), "nope")  # the name first, even without attention
    with pytest.raises(ValueError, match=r"Linear.*'softmax'"):
        set_kernel(nn.Linear(2, 2), "softmax")
    with pytest.raises(TypeError, match="Kernel"):
        set_kernel(splitformer.network_encoder(8, 2, 16, 1), 3)


def test_set_kernel_reaches_convolutional_attention_and_keeps_its_scale():
    from splitformer.models.cvt import CvtStageSpec, build_cvt
    from splitformer.operators.convolution import ConvolutionalAttention

    torch.manual_seed(0)
    m = build_cvt([CvtStageSpec(3, 16, 2, 2)], num_labels=3, dtype=torch.float64).eval()
    ops = [o for o in m.modules() if isinstance(o, ConvolutionalAttention)]
    assert len(ops) == 2
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        ref = m(x).logits
        set_kernel(m, "softmax")
        assert (m(x).logits - ref).abs().max() < 1e-12
        assert all(o.kernel.scale == 16 ** -0.5 for o in ops)
        set_kernel(m, "sinkhorn")
        assert (m(x).logits - ref).abs().max() > 1e-6
        assert all(type(o.kernel) is SinkhornKernel and o.kernel.scale == 16 ** -0.5
                   for o in ops)


def test_set_kernel_uses_a_kernel_instance_as_given():
    m = splitformer.network_encoder(16, 2, 32, 2, attention_scales=[0.1, 0.2])
    lin = LinearKernel()
    set_kernel(m, lin)  # an instance is the caller's explicit choice: no scale check
    ops = [t["attention"] for t in m.evolution.controls]
    assert all(o.kernel is lin for o in ops)  # shared, not copied
    set_kernel(m, "softmax")  # the operators remember their scale through the linear kernel
    assert [o.kernel.scale for o in ops] == [0.1, 0.2]
    g = GaussianKernel(scale=0.7)
    set_kernel(m, g)
    assert [o.kernel.scale for o in ops] == [0.7, 0.7]
    with pytest.raises(ValueError, match="options"):
        set_kernel(m, g, iterations=3)
    with pytest.raises(ValueError, match="heads"):
        set_kernel(m, ALiBiKernel(4))  # 2 heads here
    with pytest.raises(ValueError, match="head_dim"):
        set_kernel(m, RotaryKernel(4))  # head_dim 8 here


def _families():
    """name -> (small float64 model, a function running it on fixed inputs)."""
    transformers = pytest.importorskip("transformers")
    from splitformer.models.bert import bert_model
    from splitformer.models.cvt import CvtStageSpec, build_cvt
    from splitformer.verification.hf_cvt import randomize_

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    f64 = torch.float64
    ids = torch.randint(0, 50, (2, 7), generator=g)
    x = torch.randn(2, 7, 16, generator=g, dtype=f64)
    img = torch.randn(2, 3, 16, 16, generator=g, dtype=f64)
    src, tgt = torch.randn(2, 6, 16, generator=g, dtype=f64), x
    cvt_cfg = transformers.CvtConfig(
        num_channels=3, patch_sizes=[3], patch_stride=[2], patch_padding=[1], embed_dim=[16],
        num_heads=[2], depth=[2], mlp_ratio=[2.0], attention_drop_rate=[0.0], drop_rate=[0.0],
        drop_path_rate=[0.0], qkv_bias=[True], cls_token=[True])
    torch.manual_seed(0)
    hf_cvt = randomize_(transformers.CvtModel(cvt_cfg).double()).eval()  # init scores are ~0
    nn_t = nn.Transformer(16, 2, 2, 2, 32, dropout=0.0, batch_first=True, dtype=f64).eval()
    return {
        "encoder": (splitformer.network_encoder(16, 2, 32, 2, dtype=f64), lambda m: m(x)),
        "bert": (bert_model(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=32,
                            max_position_embeddings=16, dtype=f64),
                 lambda m: m(ids).last_hidden_state),
        "vit": (splitformer.models.build_vit(image_size=16, patch_size=4, dim=16, depth=2,
                                             num_heads=2, hidden_dim=32, dtype=f64),
                lambda m: m(img).last_hidden_state),
        "cvt": (build_cvt([CvtStageSpec(3, 16, 2, 2)], num_labels=3, dtype=f64),
                lambda m: m(img).logits),
        "cvt_hf": (splitformer.from_hf(hf_cvt), lambda m: m(img).last_hidden_state),
        "gpt2": (splitformer.models.causal_decoder(50, 16, 16, 2, 2, dtype=f64),
                 lambda m: m(ids).last_hidden_state),
        "gpt2_by_layer": (splitformer.from_hf(_gpt2_by_layer()),
                          lambda m: m(ids).last_hidden_state),
        "transformer": (splitformer.from_torch(nn_t), lambda m: m(src, tgt)),
    }


# (family, kernel) pairs that must refuse, with the reason the message gives
REFUSED = {
    ("cvt", "linear"): "scale", ("cvt_hf", "linear"): "scale",
    ("gpt2_by_layer", "linear"): "scale",
    ("cvt", "alibi"): "grid", ("cvt", "rotary"): "grid",
    ("cvt_hf", "alibi"): "grid", ("cvt_hf", "rotary"): "grid",
    ("transformer", "alibi"): "CrossAttention", ("transformer", "rotary"): "CrossAttention",
}


def test_every_kernel_name_on_every_family_changes_the_output_or_refuses():
    from splitformer.operators import AttentionOperator
    from splitformer.operators.kernels import KERNEL_NAMES

    assert sorted(KERNEL_NAMES) == ["alibi", "gaussian", "linear", "rotary", "sinkhorn",
                                    "softcap", "softmax"]
    for family, (model, run) in _families().items():
        model.eval()
        ops = [o for o in model.modules() if isinstance(o, AttentionOperator)]
        assert ops, family
        with torch.no_grad():
            ref = run(model)
            for name in sorted(KERNEL_NAMES):
                before = [o.kernel for o in ops]
                if (family, name) in REFUSED:
                    with pytest.raises(ValueError) as err:
                        set_kernel(model, name)
                    msg = str(err.value)
                    assert type(model).__name__ in msg and repr(name) in msg, msg
                    assert REFUSED[family, name] in msg, msg
                    assert [o.kernel for o in ops] == before, (family, name)  # all or nothing
                    continue
                set_kernel(model, name)
                assert all(o.kernel.name == name for o in ops), (family, name)
                d = (run(model) - ref).abs().max().item()
                if name == "softmax":
                    assert d < 1e-12, (family, d)
                else:  # softcap's default cap 50 (Gemma2's) bends only scores near 50:
                    # on these small random weights a small change, but a change
                    assert d > (0.0 if name == "softcap" else 1e-6), (family, name, d)
                set_kernel(model, "softmax")
                assert (run(model) - ref).abs().max().item() < 1e-12, (family, name)


@pytest.mark.parametrize(("n_q", "n_k"), [(3, 6), (6, 3), (5, 5)])
def test_causal_support_has_one_alignment_in_every_kernel(n_q, n_k):
    """is_causal means the bottom-right support tril(N_k - N_q) in every kernel (sdpa's own
    is_causal is top-left: the softmax and rotary kernels used it when N_q != N_k)."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, n_q, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, n_k, 4, generator=g, dtype=torch.float64) for _ in range(2))
    support = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    keep = support.any(-1)  # queries with a non-empty support
    for kern in (SoftmaxKernel(), SinkhornKernel(), GaussianKernel(), LinearKernel(),
                 ALiBiKernel(2), RotaryKernel(4)):
        a = kern(q, k, v, is_causal=True)[..., keep, :]
        b = kern(q, k, v, attn_mask=support)[..., keep, :]
        assert (a - b).abs().max() < 1e-13, kern.name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_attention_is_differentiated_in_float32_on_the_cpu(dtype):
    """operators.sdpa.sdpa: a differentiated half-precision call on the CPU is torch's own
    float32 call cast back (value and gradients bitwise), and everything else is torch's call
    as it is (benchmarks/sdpa_cpu.py: the half-precision CPU backward is 1.2-4x slower)."""
    from splitformer.operators.sdpa import sdpa

    q, k, v = (x.to(dtype) for x in _qkv(torch.float32, n=7, d=8))
    mask = torch.randn(7, 7).to(dtype)
    g = torch.randn(2, 3, 7, 8).to(dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = SoftmaxKernel()(*leaves, attn_mask=mask)
    out.backward(g)
    ref_leaves = [x.float().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_leaves, attn_mask=mask.float())
    ref.backward(g.float())
    assert out.dtype == dtype and torch.equal(out, ref.to(dtype))
    for mine, theirs in zip(leaves, ref_leaves, strict=True):
        assert mine.grad.dtype == dtype and torch.equal(mine.grad, theirs.grad.to(dtype))
    with torch.no_grad():  # inference: torch's half-precision call itself
        assert torch.equal(sdpa(*leaves, attn_mask=mask),
                           F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    # grad enabled, nothing to differentiate: torch's call itself
    assert torch.equal(sdpa(q, k, v, attn_mask=mask),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    # autocast leaves float64 alone: so does sdpa (torch's float64 call, float64 out)
    leaves64 = [x.detach().double().requires_grad_() for x in leaves]
    with torch.autocast("cpu", dtype=dtype):
        out = sdpa(*leaves64)
    assert out.dtype == torch.float64
    assert torch.equal(out, F.scaled_dot_product_attention(*leaves64))
    # dtypes torch refuses are refused as torch refuses them
    with pytest.raises(RuntimeError):
        sdpa(leaves[0], leaves[1].detach().float(), leaves[2])
    # autocast casts float32 inputs to its dtype: float32 inside, autocast's dtype out
    leaves32 = [x.detach().float().requires_grad_() for x in leaves]
    with torch.autocast("cpu", dtype=dtype):
        out = sdpa(*leaves32)
    assert out.dtype == dtype
    assert torch.equal(out, F.scaled_dot_product_attention(*leaves32).to(dtype))
