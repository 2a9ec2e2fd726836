"""timm VisionTransformer <-> splitformer: exact against timm, both ways.

timm imports here through conftest's torchvision stub; the library itself never imports timm
to convert from it (checked in a subprocess below).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import splitformer
from splitformer.interop.timm_vit import from_timm_model, to_timm_model
from splitformer.models.vit import ViT, ViTOutput
from splitformer.operators.scaling import DiagonalScaling, LayerScale
from splitformer.verification.references import TOL, assert_same_state, maxdiff, perturb_

try:
    import timm  # noqa: F401
    from timm.models.vision_transformer import VisionTransformer
except Exception as e:  # pragma: no cover - depends on the environment
    pytest.skip(f"timm cannot be imported: {e}", allow_module_level=True)

SMALL = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4,
         "num_classes": 5}

CONFIGS = {
    "token": {},
    "avg_no_class_token": {"class_token": False, "global_pool": "avg"},
    "layerscale_no_qkv_bias": {"init_values": 0.1, "qkv_bias": False},
    "registers_no_embed_class_pre_norm": {"reg_tokens": 2, "no_embed_class": True,
                                          "pre_norm": True, "global_pool": "avg"},
    "avg_with_class_token_no_fc_norm": {"global_pool": "avg", "fc_norm": False},
    "pooled_features": {"num_classes": 0},
    "per_token_head": {"global_pool": "", "num_classes": 3},
    "relu_no_proj_bias": {"act_layer": "relu", "proj_bias": False, "mlp_ratio": 2.0},
    "gelu_tanh_torch_ln": {"act_layer": "gelu_tanh",
                           "norm_layer": functools.partial(nn.LayerNorm, eps=1e-5)},
    "no_pos_embed_max": {"pos_embed": "none", "global_pool": "max"},
    "avgmax_include_prefix": {"global_pool": "avgmax", "pool_include_prefix": True,
                              "reg_tokens": 1},
    "no_final_norm_rect": {"final_norm": False, "img_size": (32, 16), "patch_size": 4,
                           "num_heads": 2, "depth": 3},
    "registers_no_class_token": {"class_token": False, "reg_tokens": 3, "global_pool": "avg",
                                 "init_values": 1e-2},
}


def _timm(dtype, seed=0, **overrides):
    torch.manual_seed(seed)
    m = VisionTransformer(**{**SMALL, **overrides}).to(dtype).eval()
    return perturb_(m, seed=seed + 2)


def _pixels(m, dtype, batch=3, seed=1):
    h, w = m.patch_embed.img_size
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, m.patch_embed.proj.in_channels, h, w, generator=g, dtype=dtype)


# -- exactness -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_eval_and_round_trip(name, dtype):
    ref = _timm(dtype, **CONFIGS[name])
    ours = splitformer.from_timm(ref)
    assert isinstance(ours, ViT) and not ours.training
    x = _pixels(ref, dtype)
    with torch.no_grad():
        a, b = ref(x), ours(x)
        fa, fb = ref.forward_features(x), ours.forward_features(x)
        pa, pb = ref.forward_head(fa, pre_logits=True), ours.forward_head(fb, pre_logits=True)
        out = ours.outputs(x)
    assert isinstance(b, torch.Tensor) and a.shape == b.shape
    assert maxdiff(a, b) <= TOL[dtype]
    assert maxdiff(fa, fb) <= TOL[dtype]
    assert maxdiff(pa, pb) <= TOL[dtype]
    assert isinstance(out, ViTOutput)
    assert torch.equal(out.last_hidden_state, fb)
    assert torch.equal(out.pooler_output, pb)
    if ref.num_classes > 0:
        assert torch.equal(out.logits, b)
    # round trip: the same class, the state dict to the bit, the same outputs
    back = splitformer.to_timm(ours)
    assert type(back) is VisionTransformer and back.training == ref.training
    assert_same_state(back, ref)
    with torch.no_grad():
        assert torch.equal(ref(x), back(x))
    assert_same_state(from_timm_model(back), ours)


@pytest.mark.parametrize("name", ["token", "layerscale_no_qkv_bias",
                                  "registers_no_embed_class_pre_norm"])
def test_forward_train_dropout0(name, dtype):
    ref = _timm(dtype, **CONFIGS[name]).train()
    ours = from_timm_model(ref)
    assert ours.training
    x = _pixels(ref, dtype)
    a, b = ref(x), ours(x)
    assert maxdiff(a, b) <= TOL[dtype]
    b.sum().backward()
    assert all(p.grad is not None for p in ours.parameters())


def test_attention_masks(dtype):
    ref = _timm(dtype)
    ours = from_timm_model(ref)
    x = _pixels(ref, dtype)
    n = 17
    keep = torch.ones(3, 1, 1, n, dtype=torch.bool)
    keep[1, ..., 12:] = False
    keep[2, ..., 2:5] = False
    additive = torch.zeros(3, 1, n, n, dtype=dtype).masked_fill(~keep, float("-inf"))
    with torch.no_grad():
        for m in (keep, additive):
            assert maxdiff(ref(x, attn_mask=m), ours(x, attn_mask=m)) <= TOL[dtype]
            assert maxdiff(ref(x, attn_mask=m), ours(x, m)) <= TOL[dtype]
        assert maxdiff(ref(x, is_causal=True), ours(x, is_causal=True)) <= TOL[dtype]
    with pytest.raises(ValueError, match="not both"):
        ours(x, keep, is_causal=True)


def test_trajectory_matches_blocks(dtype):
    ref = _timm(dtype, init_values=0.5, reg_tokens=1, pre_norm=True, depth=3)
    ours = from_timm_model(ref)
    x = _pixels(ref, dtype)
    with torch.no_grad():
        u = ref.norm_pre(ref._pos_embed(ref.patch_embed(x)))
        states = [u]
        for blk in ref.blocks:
            u = blk(u)
            states.append(u)
        traj = ours.trajectory(x)
    assert len(traj) == 4
    for s, t in zip(states, traj.states, strict=True):
        assert maxdiff(s, t) <= TOL[dtype]


# -- LayerScale as a per-feature step --------------------------------------------------------

def test_layerscale_is_per_feature_step(dtype):
    ref = _timm(dtype, init_values=0.1, depth=1)
    ours = from_timm_model(ref)
    theta = ours.evolution.controls[0]
    assert ours.evolution.scheme.name == "prenorm_layerscale"
    assert [str(s) for s in ours.evolution.scheme.stages] == ["norm1>attention<ls1",
                                                             "norm2>ffn<ls2"]
    ls1 = theta["ls1"]
    assert isinstance(ls1, DiagonalScaling) and LayerScale is DiagonalScaling
    assert ls1.kind == "map"
    assert torch.equal(ls1.step_sizes(0.5), 0.5 * ref.blocks[0].ls1.gamma.detach())
    # u + tau gamma A(P1 u), written out with the per-feature step tau(y) = tau gamma(y)
    u = torch.randn(2, 17, 32, dtype=dtype)
    tau = 0.25
    attn = theta["attention"](theta["norm1"](u))
    u1 = u + ls1.step_sizes(tau) * attn
    step = ours.evolution.scheme.stages[0]
    from splitformer.time.schemes import Scheme, prenorm

    one = Scheme((step,), name="one")
    with torch.no_grad():
        got = one.step(u, theta, tau)
    assert maxdiff(got, u1) <= 10 * TOL[dtype]
    # gamma = 1 is the plain pre-LN scheme
    with torch.no_grad():
        for nm in ("ls1", "ls2"):
            theta[nm].gamma.fill_(1.0)
        x = _pixels(ref, dtype)
        a = ours(x)
        b = ours.with_scheme(prenorm())(x)  # the scheme value: no ls1, ls2
    assert maxdiff(a, b) <= TOL[dtype]


# -- round trips (the per-configuration round trip is in test_forward_eval_and_round_trip) --

def test_round_trip_train_mode_and_dropouts():
    ref = _timm(torch.float32, proj_drop_rate=0.1, attn_drop_rate=0.2, pos_drop_rate=0.05,
                drop_rate=0.3).train()
    ours = from_timm_model(ref)
    theta = ours.evolution.controls[0]
    assert theta["attention"].attn_dropout == 0.2
    assert theta["attention"].out_dropout.p == 0.1
    assert theta["ffn"].dropout.p == 0.1 and theta["ffn"].out_dropout.p == 0.1
    assert ours.embedding.dropout.p == 0.05 and ours.head_dropout.p == 0.3
    back = to_timm_model(ours)
    assert back.training
    assert back.blocks[0].attn.attn_drop.p == 0.2 and back.head_drop.p == 0.3
    assert back.pos_drop.p == 0.05 and back.blocks[1].mlp.drop2.p == 0.1
    assert_same_state(back, ref)


def test_to_timm_needs_timm(monkeypatch):
    ours = from_timm_model(_timm(torch.float32))
    monkeypatch.setitem(sys.modules, "timm.models.vision_transformer", None)
    with pytest.raises(ImportError, match="needs timm"):
        to_timm_model(ours)


def test_library_never_imports_timm():
    code = ("import sys, splitformer, splitformer.interop.timm_vit, splitformer.models.vit, "
            "splitformer.operators.scaling; "
            "assert 'timm' not in sys.modules and 'torchvision' not in sys.modules")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


# -- unsupported options -------------------------------------------------------------------

UNSUPPORTED = {
    "global_pool": {"global_pool": "map"},
    "dynamic_img_size": {"dynamic_img_size": True},
    "dynamic_img_pad": {"dynamic_img_pad": True},
    "qk_norm": {"qk_norm": True},
    "scale_attn_norm": {"scale_attn_norm": True},
    "scale_mlp_norm": {"scale_mlp_norm": True},
    "drop_path_rate": {"drop_path_rate": 0.1},
    "patch_drop_rate": {"patch_drop_rate": 0.1},
    "act_layer": {"act_layer": "quick_gelu"},
    "norm_layer": {"norm_layer": "rmsnorm"},
    "embed_norm_layer": {"embed_norm_layer": "layernorm"},
}


@pytest.mark.parametrize("option", list(UNSUPPORTED))
def test_unsupported_options(option):
    ref = _timm(torch.float32, **UNSUPPORTED[option])
    with pytest.raises(ValueError, match=option):
        from_timm_model(ref)


def test_unsupported_layers():
    from timm.layers import GluMlp

    with pytest.raises(ValueError, match="mlp_layer"):
        from_timm_model(_timm(torch.float32, mlp_layer=GluMlp, act_layer="sigmoid"))
    from timm.models.deit import VisionTransformerDistilled

    distilled = VisionTransformerDistilled(**SMALL)
    with pytest.raises(TypeError, match="VisionTransformer"):
        from_timm_model(distilled)
    with pytest.raises(TypeError, match="takes no options"):
        from_timm_model(_timm(torch.float32), form="paper")
    ours = from_timm_model(_timm(torch.float32))
    with pytest.raises(ValueError, match="tau"):
        to_timm_model(ours.refine(2))
    with pytest.raises(ValueError, match="scheme"):
        to_timm_model(ours.with_scheme("strang"))
    with pytest.raises(ValueError, match="interpolation"):
        to_timm_model(ours.with_controls_in_time("linear"))
    with pytest.raises(TypeError, match="dtype"):
        ours(torch.randn(1, 3, 32, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="doesn't match"):
        ours(torch.randn(1, 3, 48, 48))


# -- the model contract (docs/architecture.md) ---------------------------------------------

def test_contract(dtype):
    ref = _timm(dtype, init_values=0.2, depth=3, reg_tokens=2)
    ours = from_timm_model(ref)
    evo = ours.evolution
    assert (evo.tau, evo.num_steps, evo.T) == (1.0, 3, 3.0)
    assert sorted(evo.controls[0].keys()) == ["attention", "ffn", "ls1", "ls2", "norm1", "norm2"]
    x = _pixels(ref, dtype)
    with torch.no_grad():
        fine = ours.refine(2)
        y2 = fine(x)
        traj = fine.trajectory(x)
        y = ours(x)
        lie = ours.with_scheme("lie")(x)  # built on the layout: keeps pre-LN and LayerScale
        strang = ours.with_scheme("strang")(x)
    assert torch.equal(lie, y)
    assert strang.shape == y.shape and torch.isfinite(strang).all()
    assert fine.evolution.tau == 0.5 and fine.evolution.num_steps == 6
    assert all(p is q for p, q in zip(fine.evolution.controls.parameters(),
                                      evo.controls.parameters(), strict=True))
    assert y2.shape == (3, 5) and torch.isfinite(y2).all()
    assert len(traj) == 7 and traj.states.shape == (7, 3, 1 + 2 + 16, 32)
    assert ours.embedding.num_prefix_tokens == 3 and ours.embedding.grid_size == (4, 4)
    src = ours.source
    assert src.timm_class == "VisionTransformer"
    assert src.kwargs["reg_tokens"] == 2 and src.kwargs["init_values"] == 0.2


def test_verify_family():
    from splitformer.verification import run_checks

    rows = list(run_checks(["timm"]))
    assert rows and all(r["status"] == "PASS" for r in rows), rows


def test_mixed_block_dropout_is_refused():
    """to_timm rebuilds every block from one set of rates: mixed rates are refused up front."""
    model = _timm(torch.float64, depth=2, attn_drop_rate=0.1)
    model.blocks[1].attn.attn_drop.p = 0.3
    with pytest.raises(ValueError, match="attn_drop_rate / proj_drop_rate"):
        splitformer.from_timm(model)
