"""bench.scheme_peers: the scheme comparisons build, run and train, and each peer is what it
claims to be, read off the real libraries (torch.nn, x-transformers, timm via conftest's
torchvision stand-in)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from splitformer.bench.scheme_peers import (
    ODETransformerRK2,
    PeerUnavailable,
    heun_rk2,
    parallel_block,
    strang_macaron,
)
from splitformer.bench.sizes import Size

SIZE = Size(dim=32, heads=2, layers=2, ff=64, batch=2, seq=16)
BUILDERS = {"strang_macaron": strang_macaron, "heun_rk2": heun_rk2,
            "parallel_block": parallel_block}


def _needs(builder) -> None:
    if builder is strang_macaron:
        pytest.importorskip("x_transformers")
    if builder is parallel_block:
        try:
            import timm.models.vision_transformer  # noqa: F401
        except Exception as e:  # pragma: no cover - depends on the environment
            pytest.skip(f"timm cannot be imported: {e}")


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_contenders_run_forward_and_train_with_finite_gradients(name):
    builder = BUILDERS[name]
    _needs(builder)
    contenders = builder(SIZE, seed=0)
    assert len({c.name for c in contenders}) == len(contenders) >= 2
    for c in contenders:
        assert f"{c.parameters:,} parameters" in c.note, c.note
        assert all(p.dtype == torch.float32 for p in c.model.parameters()), c.name
        c.model.eval()
        with torch.no_grad():
            out = c.output(c.model(*c.inputs, **c.kwargs))
        assert out.shape == (SIZE.batch, SIZE.seq, SIZE.dim), (c.name, out.shape)
        assert torch.isfinite(out).all(), c.name
        c.model.train()
        c.model.zero_grad(set_to_none=True)
        c.output(c.model(*c.inputs, **c.kwargs)).square().mean().backward()
        grads = [p.grad for p in c.model.parameters() if p.requires_grad]
        assert grads and all(g is not None for g in grads), c.name
        assert all(torch.isfinite(g).all() for g in grads), c.name
    # one input, shared by every contender of the pair
    assert all(c.inputs[0] is contenders[0].inputs[0] for c in contenders)


def test_the_same_seed_gives_the_same_networks_and_inputs():
    a, b = heun_rk2(SIZE, seed=3), heun_rk2(SIZE, seed=3)
    assert torch.equal(a[0].inputs[0], b[0].inputs[0])
    for ca, cb in zip(a, b, strict=True):
        for pa, pb in zip(ca.model.parameters(), cb.model.parameters(), strict=True):
            assert torch.equal(pa, pb)


def _ffn(layer: nn.TransformerEncoderLayer, v: torch.Tensor) -> torch.Tensor:
    return layer.linear2(layer.activation(layer.linear1(v)))


def _attn(layer: nn.TransformerEncoderLayer, v: torch.Tensor) -> torch.Tensor:
    return layer.self_attn(v, v, v, need_weights=False)[0]


def test_ode_rk2_block_is_heun_on_the_residual_free_torch_layer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(SIZE.dim, SIZE.heads, SIZE.ff, dropout=0.0,
                                       batch_first=True, norm_first=True).double()
    block = ODETransformerRK2([layer]).eval()
    y = torch.randn(SIZE.batch, SIZE.seq, SIZE.dim, dtype=torch.float64)

    def F(v):  # the pre-norm block without its residual, from torch.nn's own modules
        a = _attn(layer, layer.norm1(v))
        return a + _ffn(layer, layer.norm2(v + a))

    f1 = F(y)
    f2 = F(y + f1)
    expected = y + (f1 + f2) / 2
    assert torch.allclose(block(y), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="norm_first=True"):
        ODETransformerRK2([nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)])


def test_heun_pair_has_equal_parameters_and_the_rk2_peer_holds_torch_layers():
    heun, rk2, lie = heun_rk2(SIZE)
    assert heun.parameters == rk2.parameters == lie.parameters
    assert str(heun.model.evolution.scheme) == "norm1>attention:heun norm2>ffn:heun"
    assert isinstance(rk2.model, ODETransformerRK2)
    assert len(rk2.model.layers) == SIZE.layers
    assert all(type(m) is nn.TransformerEncoderLayer and m.norm_first for m in rk2.model.layers)
    assert str(lie.model.evolution.scheme) == "attention norm1:project ffn norm2:project"


def test_macaron_peer_has_two_half_width_feed_forwards_per_layer_and_strang_half_width():
    pytest.importorskip("x_transformers")
    from x_transformers.x_transformers import Attention, FeedForward, Scale

    strang, macaron, lie = strang_macaron(SIZE)
    half = SIZE.ff // 2
    enc = macaron.model
    assert enc.layer_types == ("f", "a", "f") * SIZE.layers
    assert type(enc.final_norm).__name__ == "Identity"
    for block in range(SIZE.layers):
        modules = [enc.layers[3 * block + i][1] for i in range(3)]
        ff1, attn, ff2 = modules
        assert isinstance(attn, Attention) and attn.attend.flash
        for ff in (ff1, ff2):
            assert isinstance(ff, Scale) and ff.scale == 0.5 and isinstance(ff.fn, FeedForward)
            linears = [m for m in ff.fn.modules() if isinstance(m, nn.Linear)]
            assert [m.out_features for m in linears] == [half, SIZE.dim]
            assert any(isinstance(m, nn.ReLU) for m in ff.fn.modules())
        assert ff1.fn is not ff2.fn and ff1.fn.ff[0][0].weight is not ff2.fn.ff[0][0].weight
        norms = [enc.layers[3 * block + i][0][0] for i in range(3)]
        assert all(type(n).__name__ == "LayerNorm" for n in norms)  # not RMSNorm
    assert sum(isinstance(m, FeedForward) for m in enc.modules()) == 2 * SIZE.layers

    # splitformer's Strang: one FFN of width ff/2 per step, G/2 A G/2 with explicit Euler
    assert str(strang.model.evolution.scheme) == "norm2>ffn*0.5 norm1>attention norm2>ffn*0.5"
    for theta in strang.model.evolution.controls:
        assert tuple(theta["ffn"].stages[0].weight.shape) == (half, SIZE.dim)
    assert str(lie.model.evolution.scheme) == "attention norm1:project ffn norm2:project"
    for theta in lie.model.evolution.controls:
        assert tuple(theta["ffn"].stages[0].weight.shape) == (SIZE.ff, SIZE.dim)


def test_strang_network_is_half_ffn_attention_half_ffn_of_the_torch_layers():
    """The Strang contender equals u += G(P2 u)/2; u += A(P1 u); u += G(P2 u)/2 computed from
    the torch.nn layers it was converted from (rebuilt from the same seed)."""
    pytest.importorskip("x_transformers")
    strang = strang_macaron(SIZE, seed=5)[0]
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(SIZE.dim, SIZE.heads, SIZE.ff // 2, dropout=0.0,
                                       batch_first=True, norm_first=True)
    enc = nn.TransformerEncoder(layer, SIZE.layers, enable_nested_tensor=False).eval()
    u = x = strang.inputs[0]
    with torch.no_grad():
        for m in enc.layers:
            u = u + 0.5 * _ffn(m, m.norm2(u))
            u = u + _attn(m, m.norm1(u))
            u = u + 0.5 * _ffn(m, m.norm2(u))
        got = strang.model.eval()(x)
    assert torch.allclose(got, u, rtol=0, atol=1e-5)


def test_timm_peer_is_the_parallel_scaling_block_vit():
    _needs(parallel_block)
    from timm.models.vision_transformer import ParallelScalingBlock, VisionTransformer

    ours, peer = parallel_block(SIZE)
    assert type(peer.model) is VisionTransformer
    assert len(peer.model.blocks) == SIZE.layers
    assert all(type(b) is ParallelScalingBlock for b in peer.model.blocks)
    for b in peer.model.blocks:
        assert b.mlp_out_proj.in_features == SIZE.ff and b.attn_out_proj.in_features == SIZE.dim
    assert peer.model.patch_embed.num_patches == SIZE.seq
    assert str(ours.model.evolution.scheme) == "parallel(norm1>attention*2 | norm2>ffn*2)"
    # one LayerNorm (weight and bias) fewer per layer than the standard block ours comes from
    assert ours.parameters - peer.parameters == 2 * SIZE.dim * SIZE.layers


@pytest.mark.parametrize(("builder", "module", "library"), [
    (strang_macaron, "x_transformers", "x-transformers"),
    (parallel_block, "timm.models.vision_transformer", "timm"),
])
def test_a_missing_library_is_a_one_line_peer_unavailable(monkeypatch, builder, module, library):
    monkeypatch.setitem(sys.modules, module, None)  # import of it raises ImportError
    with pytest.raises(PeerUnavailable, match=f"^{library} does not import here") as info:
        builder(SIZE)
    assert "\n" not in str(info.value)
