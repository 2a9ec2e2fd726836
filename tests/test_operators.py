"""The operators as mathematical objects: Theorem 3.1, scale invariance, ReLU = P_S2,
equivariance and the head integral, the LayerNorm reading, activations as proximal maps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from splitformer.operators import (
    Activation,
    FeatureIntegral,
    FeedForward,
    LayerNormProjection,
    NonlocalAttention,
    ProjectionS2,
    SphereProjection,
)
from splitformer.verification.references import TOL


def _random_points_of_s1(n_points: int, n: int, s1: float, s2: float, dtype) -> torch.Tensor:
    z = torch.randn(n_points, n, dtype=dtype)
    z = z - z.mean(-1, keepdim=True)
    z = z / z.pow(2).mean(-1, keepdim=True).sqrt()
    return s2 * z + s1


@pytest.mark.parametrize("s1,s2", [(0.0, 1.0), (0.7, 2.5), (-1.2, 0.3)])
def test_theorem_3_1_projection_is_the_closest_point(s1, s2):
    torch.manual_seed(0)
    dtype = torch.float64
    n = 16
    p = SphereProjection(n, s1=s1, s2=s2, dtype=dtype)
    v = 3.0 * torch.randn(20, n, dtype=dtype) + 0.5
    pv = p(v)
    # P(v) lies in S1
    assert torch.allclose(pv.mean(-1), torch.full((20,), s1, dtype=dtype), atol=1e-12)
    assert torch.allclose(pv.var(-1, unbiased=False), torch.full((20,), s2**2, dtype=dtype),
                          atol=1e-12)
    # no random point of S1 is closer; and nearby points on S1 (perturbations) are not closer
    d_star = (v - pv).norm(dim=-1)
    others = _random_points_of_s1(4000, n, s1, s2, dtype)
    d_others = torch.cdist(v, others)
    assert (d_others >= d_star[:, None] - 1e-12).all()
    near = p(pv.unsqueeze(1) + 0.05 * torch.randn(20, 200, n, dtype=dtype))  # points of S1 near
    assert ((v.unsqueeze(1) - near).norm(dim=-1) >= d_star[:, None] - 1e-12).all()
    # the distance formula dist(v, S1)^2 = N (m - s1)^2 + N (sigma - s2)^2
    assert torch.allclose(p.distance(v), d_star, atol=1e-10)


def test_projection_is_scale_invariant_and_idempotent():
    torch.manual_seed(1)
    p = SphereProjection(10, s1=0.2, s2=1.3, dtype=torch.float64)
    v = torch.randn(5, 7, 10, dtype=torch.float64)
    for c in (0.5, 2.0, 1e3):
        assert (p(c * v) - p(v)).abs().max() < 1e-12
    assert (p(p(v)) - p(v)).abs().max() < 1e-12
    # translation along constants does not move the projection either
    assert (p(v + 4.0) - p(v)).abs().max() < 1e-12


def test_zero_variance_is_defined():
    p = SphereProjection(6, s1=0.4, s2=2.0, dtype=torch.float64)
    v = torch.full((3, 6), 1.7, dtype=torch.float64)
    out = p(v)
    assert torch.isfinite(out).all() and torch.equal(out, torch.full_like(v, 0.4))
    # it is the eps -> 0+ limit of LayerNorm with gain s2 and bias s1
    ln = nn.LayerNorm(6, eps=1e-12, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.fill_(2.0)
        ln.bias.fill_(0.4)
    assert torch.allclose(out, ln(v))


def test_sphere_projection_equals_torch_layernorm_eps0(dtype):
    torch.manual_seed(2)
    p = SphereProjection(12, s1=-0.3, s2=0.8, dtype=dtype)
    ln = nn.LayerNorm(12, eps=0.0, dtype=dtype)
    with torch.no_grad():
        ln.weight.fill_(0.8)
        ln.bias.fill_(-0.3)
    v = torch.randn(4, 9, 12, dtype=dtype)
    assert (p(v) - ln(v)).abs().max() <= TOL[dtype]


@pytest.mark.parametrize("eps", [1e-5, 1e-2, 0.3])
def test_layernorm_reading_ghost_point_and_affine(eps, dtype):
    torch.manual_seed(3)
    ln = nn.LayerNorm(10, eps=eps, dtype=dtype)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 2)
        ln.bias.uniform_(-1, 1)
    p = LayerNormProjection(10, eps=eps, dtype=dtype)
    p.load_state_dict(ln.state_dict())
    v = torch.randn(6, 10, dtype=dtype)
    assert (p(v) - ln(v)).abs().max() <= TOL[dtype]
    assert (p.affine(p.ghost_projection(v)) - ln(v)).abs().max() <= TOL[dtype]
    # the ghost projection is a projection onto a sphere in R^(N+1): radius sqrt(N)
    n = 10
    centred = v - v.mean(-1, keepdim=True)
    lifted = torch.cat([centred, torch.full_like(v[:, :1], math.sqrt(n * eps))], -1)
    proj = math.sqrt(n) * lifted / lifted.norm(dim=-1, keepdim=True)
    assert torch.allclose(proj[:, :n], p.ghost_projection(v))


def test_layernorm_scale_relation_eps():
    """LN_eps(z / 2) = LN_{4 eps}(z): the paper's relaxation 1/2 is exact with 4 eps."""
    torch.manual_seed(4)
    z = torch.randn(5, 16, dtype=torch.float64)
    a = F.layer_norm(z / 2, (16,), eps=1e-3)
    b = F.layer_norm(z, (16,), eps=4e-3)
    assert (a - b).abs().max() < 1e-13
    assert (F.layer_norm(z / 2, (16,), eps=1e-3) - F.layer_norm(z, (16,), eps=1e-3)).abs().max() \
        > 1e-6


def test_relu_is_the_projection_onto_s2():
    torch.manual_seed(5)
    v = torch.randn(50, 8, dtype=torch.float64)
    pv = ProjectionS2()(v)
    assert torch.equal(pv, torch.relu(v))
    d_star = (v - pv).norm(dim=-1)
    others = torch.rand(3000, 8, dtype=torch.float64) * 3  # random points of S2
    assert (torch.cdist(v, others) >= d_star[:, None] - 1e-12).all()


def _attention(d, h, dtype):
    mha = nn.MultiheadAttention(d, h, batch_first=True, dtype=dtype).eval()
    a = NonlocalAttention(d, h, dtype=dtype)
    with torch.no_grad():
        a.qkv_weight.copy_(mha.in_proj_weight)
        a.qkv_bias.copy_(mha.in_proj_bias)
        a.out_weight.copy_(mha.out_proj.weight)
        a.out_bias.copy_(mha.out_proj.bias)
    return a, mha


@pytest.mark.parametrize("d,h", [(8, 1), (12, 3), (16, 8)])
def test_head_integral_equals_multihead_attention(d, h, dtype):
    torch.manual_seed(6)
    a, mha = _attention(d, h, dtype)
    x = torch.randn(3, 7, d, dtype=dtype)
    with torch.no_grad():
        ref = mha(x, x, x, need_weights=False)[0]
        assert (a(x) - ref).abs().max() <= TOL[dtype]
        assert (a.head_sum(x) - ref).abs().max() <= TOL[dtype]


def test_attention_is_permutation_equivariant():
    torch.manual_seed(7)
    a, _ = _attention(12, 3, torch.float64)
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    perm = torch.randperm(9)
    with torch.no_grad():
        assert (a(x[:, perm]) - a(x)[:, perm]).abs().max() < 1e-12


def test_feature_integral_embed_is_the_rectangular_identity():
    up, down = FeatureIntegral(3, 5), FeatureIntegral(5, 3)
    u = torch.randn(2, 3)
    assert torch.equal(up.embed(u), u @ up.identity_matrix().T)
    w = torch.randn(2, 5)
    assert torch.equal(down.embed(w), w @ down.identity_matrix().T)


@pytest.mark.parametrize("widths", [[6, 6], [6, 10, 6], [6, 10, 4, 6]])
def test_feedforward_any_J(widths, dtype):
    torch.manual_seed(8)
    g = FeedForward(widths, activation="gelu", dtype=dtype)
    lins = [nn.Linear(a, b, dtype=dtype) for a, b in zip(widths[:-1], widths[1:], strict=True)]
    with torch.no_grad():
        for st, lin in zip(g.stages, lins, strict=True):
            st.weight.copy_(lin.weight)
            st.bias.copy_(lin.bias)
    x = torch.randn(2, 3, widths[0], dtype=dtype)
    h = x
    for j, lin in enumerate(lins):
        h = lin(h)
        if j < len(lins) - 1:
            h = F.gelu(h)
    assert g.num_stages == len(widths) - 1
    assert (g(x) - h).abs().max() <= TOL[dtype]


@pytest.mark.parametrize("name", ["relu", "leaky_relu", "tanh", "hardtanh", "gelu", "silu"])
def test_activation_proximal_flag_is_true_iff_monotone_and_1_lipschitz(name):
    act = Activation(name)
    x = torch.linspace(-6, 6, 20001, dtype=torch.float64)
    y = act(x)
    slopes = torch.diff(y) / torch.diff(x)
    monotone_lipschitz = bool((slopes >= -1e-12).all() and (slopes <= 1 + 1e-9).all())
    assert act.is_proximal == monotone_lipschitz
    assert ("not a proximal" in act.reading) == (not act.is_proximal)
