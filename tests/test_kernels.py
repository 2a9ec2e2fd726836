"""Attention kernels as values: each reduced to the standard case, or checked against the
reference implementation in transformers where one exists."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import TOL
from torch import nn

import splitformer
from splitformer.operators import Context, CrossAttention, NonlocalAttention
from splitformer.operators.kernels import (
    ALiBiKernel,
    GaussianKernel,
    LinearKernel,
    RotaryKernel,
    SinkhornKernel,
    SoftmaxKernel,
    alibi_slopes,
    set_kernel,
)


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
        ctx = Context(extra={"memory": m, "memory_mask": (~kpm).view(2, 1, 1, 7)})
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
