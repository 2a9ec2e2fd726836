"""Hugging Face ViT <-> splitformer: exact against transformers, both ways.

float64 is compared against transformers' sdpa path: its eager path computes the softmax in
float32 even for a float64 model (measured below).
"""

from __future__ import annotations

import pytest
import torch

import splitformer
from splitformer.interop.hf_vit import from_hf_model, to_hf_model
from splitformer.models.vit import ViT, ViTOutput
from splitformer.verification.references import TOL, assert_same_state, maxdiff, perturb_

transformers = pytest.importorskip("transformers")  # conftest hides the torchvision stand-in

BASE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "image_size": 32,
    "patch_size": 8,
}

CONFIGS = {
    "gelu_pooler": ({}, True),
    "relu_no_qkv_bias_no_pooler": ({"hidden_act": "relu", "qkv_bias": False}, False),
    "rect_patch4_tanh_gelu": ({"image_size": [32, 16], "patch_size": 4,
                               "hidden_act": "gelu_pytorch_tanh", "num_attention_heads": 2,
                               "layer_norm_eps": 1e-6, "pooler_output_size": 24,
                               "num_hidden_layers": 3}, True),
    "one_channel": ({"num_channels": 1, "hidden_act": "silu"}, True),
    "gelu_new": ({"hidden_act": "gelu_new", "layer_norm_eps": 1e-6}, True),
}


def _hf(dtype, overrides=None, *, cls="ViTModel", pooler=True, attn="sdpa", num_labels=None,
        **model_kw):
    torch.manual_seed(0)
    config = transformers.ViTConfig(**{**BASE, **(overrides or {})})
    config._attn_implementation = attn
    if num_labels is not None:
        config.num_labels = num_labels
    if cls == "ViTModel":
        m = transformers.ViTModel(config, add_pooling_layer=pooler, **model_kw)
    else:
        m = transformers.ViTForImageClassification(config)
    m = m.to(dtype).eval()
    perturb_(m, seed=2)
    return m


def _pixels(model, dtype, batch=3, size=None, seed=1):
    c = model.config
    h, w = size or ((c.image_size, c.image_size) if isinstance(c.image_size, int)
                    else tuple(c.image_size))
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, c.num_channels, h, w, generator=g, dtype=dtype)


# -- exactness -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_vit_model_eval(name, dtype):
    overrides, pooler = CONFIGS[name]
    ref = _hf(dtype, overrides, pooler=pooler)
    ours = splitformer.from_hf(ref)
    assert isinstance(ours, ViT) and not ours.training
    x = _pixels(ref, dtype)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert isinstance(b, ViTOutput)
    assert b.last_hidden_state.shape == a.last_hidden_state.shape
    assert maxdiff(a.last_hidden_state, b.last_hidden_state) <= TOL[dtype]
    if pooler:
        assert maxdiff(a.pooler_output, b.pooler_output) <= TOL[dtype]
    else:
        assert b.pooler_output is None and a.pooler_output is None
    assert b.logits is None


def test_vit_model_train_mode_dropout0(dtype):
    ref = _hf(dtype).train()
    ours = from_hf_model(ref)
    assert ours.training
    x = _pixels(ref, dtype)
    a, b = ref(x), ours(x)
    assert maxdiff(a.last_hidden_state, b.last_hidden_state) <= TOL[dtype]
    assert maxdiff(a.pooler_output, b.pooler_output) <= TOL[dtype]
    # gradients flow to the controls
    b.pooler_output.sum().backward()
    assert ours.evolution.controls[0]["attention"].qkv_weight.grad is not None


@pytest.mark.parametrize("num_labels", [5, 0])
def test_classifier(num_labels, dtype):
    ref = _hf(dtype, {"qkv_bias": False}, cls="ViTForImageClassification",
              num_labels=num_labels)
    ours = splitformer.from_hf(ref)
    x = _pixels(ref, dtype)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert b.logits.shape == a.logits.shape
    assert maxdiff(a.logits, b.logits) <= TOL[dtype]
    # the classifier reads the class-token point of the last hidden state
    with torch.no_grad():
        u = ref.vit(x).last_hidden_state
    assert maxdiff(u, b.last_hidden_state) <= TOL[dtype]


def test_padding_mask(dtype):
    ref = _hf(dtype)
    ours = from_hf_model(ref)
    x = _pixels(ref, dtype)
    n = 1 + 16
    mask = torch.ones(3, n, dtype=torch.long)
    mask[1, 10:] = 0
    mask[2, 3:7] = 0
    with torch.no_grad():
        a = ref(x, attention_mask=mask)
        b = ours(x, attention_mask=mask)
        c = ours(x, attention_mask=mask.bool())
    assert maxdiff(a.last_hidden_state, b.last_hidden_state) <= TOL[dtype]
    assert maxdiff(a.pooler_output, b.pooler_output) <= TOL[dtype]
    assert torch.equal(b.last_hidden_state, c.last_hidden_state)
    # a prepared 4-D boolean mask (True = attend) is handed to the kernel as is
    full = mask.bool().view(3, 1, 1, n).expand(3, 1, n, n)
    with torch.no_grad():
        d = ours(x, attention_mask=full)
    assert torch.equal(b.last_hidden_state, d.last_hidden_state)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        ours(x, attention_mask=torch.ones(3, n - 1))


def test_interpolate_pos_encoding(dtype):
    ref = _hf(dtype)
    ours = from_hf_model(ref)
    for size in [(48, 48), (32, 48), (16, 64)]:
        x = _pixels(ref, dtype, size=size)
        with torch.no_grad():
            a = ref(x, interpolate_pos_encoding=True)
            b = ours(x, interpolate_pos_encoding=True)
        assert a.last_hidden_state.shape == b.last_hidden_state.shape
        assert maxdiff(a.last_hidden_state, b.last_hidden_state) <= TOL[dtype]
        with pytest.raises(ValueError, match="doesn't match"):
            ours(x)


def test_eager_attention():
    """float32: eager is exact to 1e-5. float64: eager's float32 softmax costs ~1e-8."""
    ref = _hf(torch.float32, attn="eager")
    ours = from_hf_model(ref)
    x = _pixels(ref, torch.float32)
    with torch.no_grad():
        assert maxdiff(ref(x).last_hidden_state, ours(x).last_hidden_state) <= TOL[torch.float32]
    ref64 = _hf(torch.float64, attn="eager")
    ours64 = from_hf_model(ref64)
    x64 = _pixels(ref64, torch.float64)
    with torch.no_grad():
        err = maxdiff(ref64(x64).last_hidden_state, ours64(x64).last_hidden_state)
        ref64.set_attn_implementation("sdpa")
        err_sdpa = maxdiff(ref64(x64).last_hidden_state, ours64(x64).last_hidden_state)
    assert err <= 1e-5  # float32 accuracy only
    assert err_sdpa <= TOL[torch.float64]


def test_pixel_dtype_cast():
    ref = _hf(torch.float64)
    ours = from_hf_model(ref)
    x = _pixels(ref, torch.float32)
    with torch.no_grad():
        a, b = ref(x), ours(x)  # both cast the pixels to the parameters' dtype
    assert maxdiff(a.last_hidden_state, b.last_hidden_state) <= TOL[torch.float64]


# -- round trips and checkpoints -----------------------------------------------------------

@pytest.mark.parametrize("kind", ["pooler", "no_pooler", "classifier", "classifier0"])
def test_round_trip(kind, dtype):
    if kind == "pooler":
        ref = _hf(dtype, {"qkv_bias": False})
    elif kind == "no_pooler":
        ref = _hf(dtype, {"hidden_act": "relu"}, pooler=False)
    else:
        ref = _hf(dtype, cls="ViTForImageClassification",
                  num_labels=5 if kind == "classifier" else 0)
    ours = splitformer.from_hf(ref)
    back = splitformer.to_hf(ours)
    assert type(back) is type(ref)
    assert back.config.to_dict() == ref.config.to_dict()
    assert back.training == ref.training
    assert_same_state(back, ref)
    x = _pixels(ref, dtype)
    with torch.no_grad():
        a, b = ref(x), back(x)
    for k in ("last_hidden_state", "pooler_output", "logits"):
        if getattr(a, k, None) is not None:
            assert torch.equal(getattr(a, k), getattr(b, k))
    # and the splitformer side of a second pass is the same model
    assert_same_state(from_hf_model(back), ours)


def test_local_checkpoint_folder(tmp_path):
    for cls in ("ViTModel", "ViTForImageClassification"):
        ref = _hf(torch.float32, cls=cls, num_labels=3)
        path = tmp_path / cls
        ref.save_pretrained(path)
        ours = splitformer.from_hf(str(path))
        assert ours.source.hf_class == cls
        x = _pixels(ref, torch.float32)
        with torch.no_grad():
            a, b = ref(x), ours(x)
        assert maxdiff(a.last_hidden_state if cls == "ViTModel" else a.logits,
                     b.last_hidden_state if cls == "ViTModel" else b.logits) <= 1e-5
        assert_same_state(splitformer.to_hf(ours), ref)


# -- unsupported options -------------------------------------------------------------------

def test_unsupported_options():
    with pytest.raises(ValueError, match="use_mask_token"):
        from_hf_model(_hf(torch.float32, use_mask_token=True))
    with pytest.raises(ValueError, match="hidden_act"):
        from_hf_model(_hf(torch.float32, {"hidden_act": "quick_gelu"}))
    with pytest.raises(ValueError, match="pooler_act"):
        from_hf_model(_hf(torch.float32, {"pooler_act": "relu6"}))
    cfg = transformers.ViTConfig(**BASE)
    cfg.head_dim = 16  # 4 heads x 16 != hidden_size 32
    with pytest.raises(ValueError, match="head_dim"):
        from_hf_model(transformers.ViTModel(cfg))
    with pytest.raises(TypeError, match="takes no options"):
        from_hf_model(_hf(torch.float32), form="paper")
    ours = from_hf_model(_hf(torch.float32))
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match="bool_masked_pos"):
        ours(x, bool_masked_pos=torch.zeros(1, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="channels"):
        ours(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match="tau"):
        to_hf_model(ours.refine(2))
    with pytest.raises(ValueError, match="prenorm"):
        to_hf_model(ours.with_scheme("strang"))
    with pytest.raises(ValueError, match="interpolation"):
        to_hf_model(ours.with_controls_in_time("linear"))
    # "lie" on the pre-LN layout is the prenorm scheme itself: it goes back
    assert_same_state(to_hf_model(ours.with_scheme("lie")), to_hf_model(ours))


# -- the model contract (docs/architecture.md) ---------------------------------------------

def test_contract(dtype):
    ref = _hf(dtype, {"num_hidden_layers": 3})
    ours = from_hf_model(ref)
    evo = ours.evolution
    assert evo.scheme.name == "prenorm"
    assert [str(s) for s in evo.scheme.stages] == ["norm1>attention", "norm2>ffn"]
    assert (evo.tau, evo.num_steps, evo.T) == (1.0, 3, 3.0)
    assert len(evo.controls) == 3
    x = _pixels(ref, dtype)
    with torch.no_grad():
        traj = ours.trajectory(x)
        hs = ref(x, output_hidden_states=True).hidden_states
        fine = ours.refine(2)
        out2 = fine(x)
        lie = ours.with_scheme("lie")(x)
    assert len(traj) == 4 and traj.times.tolist() == [0.0, 1.0, 2.0, 3.0]
    for h, s in zip(hs, traj.states, strict=True):
        assert maxdiff(h, s) <= TOL[dtype]
    assert fine.evolution.tau == 0.5 and fine.evolution.num_steps == 6
    assert out2.last_hidden_state.shape == traj.final.shape
    assert torch.isfinite(out2.last_hidden_state).all()
    assert all(p is q for p, q in zip(fine.evolution.controls.parameters(),
                                      evo.controls.parameters(), strict=True))  # shared parameters
    assert torch.isfinite(lie.last_hidden_state).all()
    # the initial condition lives on 1 + 4 x 4 points of Omega_x
    assert ours.embedding.grid_size == (4, 4) and ours.embedding.num_tokens == 17
    assert ours.source.hf_class == "ViTModel" and ours.source.config["hidden_size"] == 32


def test_verify_family():
    from splitformer.verification import run_checks

    rows = list(run_checks(["vit"]))
    assert rows and all(r["status"] == "PASS" for r in rows), rows


def test_outputs_index_like_transformers():
    """out[0] and out["name"] give what transformers' outputs give."""
    for cls in ("ViTModel", "ViTForImageClassification"):
        kw = {"num_labels": 3} if cls != "ViTModel" else {}
        hf = _hf(torch.float64, cls=cls, **kw).eval()
        ours = splitformer.from_hf(hf).eval()
        px = _pixels(hf, torch.float64)
        with torch.no_grad():
            ref, out = hf(px), ours(px)
        assert maxdiff(out[0], ref[0]) <= 1e-10
        key = "logits" if cls != "ViTModel" else "last_hidden_state"
        assert maxdiff(out[key], ref[key]) <= 1e-10


def test_dropout_rates_are_read_per_layer_and_checked_on_the_way_back():
    """Rates are attribute rows of the weight table: read per layer from the modules; to_hf
    rebuilds the model from its config, so a per-layer rate the config cannot say is refused
    (it would be lost by save_pretrained), naming the layer and the option."""
    ref = _hf(torch.float32, {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.2})
    ours = from_hf_model(ref)
    back = to_hf_model(ours)
    assert back.layers[1].dropout.p == 0.1 and back.layers[0].attention.attention_dropout == 0.2
    ref.layers[1].dropout.p = 0.3  # a rate the config does not say
    ours = from_hf_model(ref)
    theta = ours.evolution.controls[1]
    assert theta["attention"].out_dropout.p == 0.3 and theta["ffn"].out_dropout.p == 0.3
    assert ours.evolution.controls[0]["attention"].attn_dropout == 0.2
    with pytest.raises(ValueError, match="layer 1: .*differs from config option "
                                         "hidden_dropout_prob"):
        to_hf_model(ours)
