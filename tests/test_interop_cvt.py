"""Hugging Face CvT <-> splitformer: exact weight map, both ways (docs/math.md 3.7).

Reference: the installed transformers (CvtModel, CvtForImageClassification) with every weight and
BatchNorm statistic drawn at random. Tolerances: float64 1e-10, float32 1e-5 (references.TOL).
Eval mode (BatchNorm = per-feature affine map of its running statistics) and train mode (BatchNorm
on batch statistics, running statistics updated; dropout 0; stochastic depth compared under an
equal seed).
"""

from __future__ import annotations

import pytest
import torch

import splitformer
from splitformer.interop.hf_cvt import from_hf_model, to_hf_model, weight_table
from splitformer.models.cvt import ConvolutionalVisionTransformer, cvt_scheme
from splitformer.operators import Context
from splitformer.operators.convolution import (
    BatchNormMap,
    ConvolutionalAttention,
    ConvolutionalProjection,
    token_grid,
)
from splitformer.verification.hf_cvt import SMALL_CONFIG, randomize_
from splitformer.verification.references import TOL, maxdiff

transformers = pytest.importorskip("transformers")  # conftest hides the torchvision stand-in




BASE = SMALL_CONFIG  # the verify rows' configuration: three stages, class token in the last

CONFIGS = {
    # CvT-13's layout, scaled down: three grid levels, class token in the last.
    "three_stages": {},
    # Two stages, no class token, no qkv bias, 5x5 projections, K/V stride 1, odd mlp ratio.
    "two_stages_no_cls": {
        "patch_sizes": [3, 3], "patch_stride": [2, 2], "patch_padding": [1, 1],
        "embed_dim": [6, 10], "num_heads": [2, 5], "depth": [2, 2], "mlp_ratio": [3.0, 1.5],
        "attention_drop_rate": [0.0] * 2, "drop_rate": [0.0] * 2, "drop_path_rate": [0.0] * 2,
        "qkv_bias": [False, False], "cls_token": [False, False],
        "qkv_projection_method": ["dw_bn"] * 2, "kernel_qkv": [5, 5], "padding_kv": [2, 2],
        "stride_kv": [1, 1], "padding_q": [2, 2], "stride_q": [1, 1],
    },
    # One stage with a class token, two channels, stride-3 K/V.
    "one_stage_cls": {
        "num_channels": 2, "patch_sizes": [4], "patch_stride": [4], "patch_padding": [0],
        "embed_dim": [12], "num_heads": [3], "depth": [3], "mlp_ratio": [2.0],
        "attention_drop_rate": [0.0], "drop_rate": [0.0], "drop_path_rate": [0.0],
        "qkv_bias": [True], "cls_token": [True], "qkv_projection_method": ["dw_bn"],
        "kernel_qkv": [3], "padding_kv": [1], "stride_kv": [3], "padding_q": [1],
        "stride_q": [1],
    },
}


def make(cls_name: str, dtype=torch.float64, seed: int = 0, **overrides):
    cfg = {**BASE, **overrides}
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(transformers.CvtConfig(**cfg))
    return randomize_(model.to(dtype), seed).eval()


def pixels(dtype, channels=3, shape=(2, 32, 24), seed=1):
    g = torch.Generator().manual_seed(seed)
    b, h, w = shape
    return torch.randn(b, channels, h, w, generator=g, dtype=torch.float64).to(dtype)



# -- outputs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_matches_eval(name, dtype):
    ref = make("CvtModel", dtype, **CONFIGS[name])
    ours = splitformer.from_hf(ref)
    x = pixels(dtype, ref.config.num_channels)
    with torch.no_grad():
        a = ref(x, output_hidden_states=True)
        b = ours(x, output_hidden_states=True)
    assert b.last_hidden_state.shape == a.last_hidden_state.shape
    assert maxdiff(a.last_hidden_state, b.last_hidden_state) <= TOL[dtype]
    if a.cls_token_value is None:
        assert b.cls_token_value is None
    else:
        assert maxdiff(a.cls_token_value, b.cls_token_value) <= TOL[dtype]
    assert len(a.hidden_states) == len(b.hidden_states)
    for h1, h2 in zip(a.hidden_states, b.hidden_states, strict=True):
        assert maxdiff(h1, h2) <= TOL[dtype]
    assert b.logits is None


@pytest.mark.parametrize("name,num_labels", [("three_stages", 5), ("one_stage_cls", 3),
                                             ("three_stages", 0)])
def test_classifier_matches_eval(name, num_labels, dtype):
    ref = make("CvtForImageClassification", dtype, seed=2, **{**CONFIGS[name],
                                                            "num_labels": num_labels})
    ours = splitformer.from_hf(ref)
    assert (ours.classifier is None) == (num_labels == 0)
    x = pixels(dtype, ref.config.num_channels)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert b.logits.shape == a.logits.shape
    assert maxdiff(a.logits, b.logits) <= TOL[dtype]


def test_train_mode_batchnorm_statistics(dtype):
    """Train mode, dropout 0: BatchNorm on batch statistics; the running statistics and
    num_batches_tracked are updated identically over two passes."""
    ref = make("CvtForImageClassification", dtype, seed=3).train()
    ours = splitformer.from_hf(ref)
    assert ours.training
    for seed in (1, 2):
        x = pixels(dtype, shape=(3, 32, 24), seed=seed)
        with torch.no_grad():
            a, b = ref(x), ours(x)
        assert maxdiff(a.logits, b.logits) <= TOL[dtype]
    theirs, mine = ref.state_dict(), to_hf_model(ours).state_dict()
    assert theirs.keys() == mine.keys()
    n_running = 0
    for k, v in theirs.items():
        if k.endswith("num_batches_tracked"):
            assert int(v) == 9 and torch.equal(v, mine[k]), k
        elif "running_" in k:
            n_running += 1
            assert maxdiff(v, mine[k]) <= TOL[dtype], k
        else:
            assert torch.equal(v, mine[k]), k
    assert n_running == 2 * 3 * 6  # (mean, var) x (q, k, v) x 6 layers


def test_train_mode_stochastic_depth_same_seed(dtype):
    """drop_path > 0: the same Bernoulli masks under the same seed, including Hugging Face's
    second drop_path on the whole state after the FFN residual."""
    ref = make("CvtModel", dtype, seed=5, drop_path_rate=[0.0, 0.2, 0.3]).train()
    ours = splitformer.from_hf(ref)
    assert ours.stages[0].evolution.scheme.name == "prenorm"  # rate 0: nn.Identity in HF
    assert ours.stages[2].evolution.scheme.name == "cvt_drop_path"
    x = pixels(dtype, shape=(8, 32, 24))
    torch.manual_seed(123)
    with torch.no_grad():
        a = ref(x)
    # the second drop_path zeroes whole states: some samples end at exactly 0
    assert (a.last_hidden_state.flatten(1).abs().amax(1) == 0).any()
    torch.manual_seed(123)
    with torch.no_grad():
        b = ours(x)
    assert maxdiff(a.last_hidden_state, b.last_hidden_state) <= TOL[dtype]
    assert maxdiff(a.cls_token_value, b.cls_token_value) <= TOL[dtype]
    # In eval mode stochastic depth is the identity: the scheme reduces to pre-LN.
    ref.eval()
    ours.eval()
    with torch.no_grad():
        assert maxdiff(ref(x).last_hidden_state, ours(x).last_hidden_state) <= TOL[dtype]
        # named schemes on a drop-path stage: D after each field (STOCHASTIC_DEPTH_LAYOUT)
        same = ours.with_scheme("prenorm")
        layout = "norm1>attention<drop_path norm2>ffn<drop_path"
        assert str(same.stages[2].evolution.scheme) == layout
        assert maxdiff(same(x).last_hidden_state, ours(x).last_hidden_state) == 0.0
        strang = ours.with_scheme("strang", integrator="heun")
        assert all(st.evolution.scheme.name == "strang" for st in strang.stages)
        assert torch.isfinite(strang(x).last_hidden_state).all()


def test_gradients_match(dtype):
    """Backprop through the scheme (the discrete adjoint) gives Hugging Face's gradients."""
    ref = make("CvtForImageClassification", dtype, seed=8)
    ours = splitformer.from_hf(ref)
    x = pixels(dtype)
    ref(x).logits.square().sum().backward()
    ours(x).logits.square().sum().backward()
    theirs = dict(ref.named_parameters())
    mine = dict(ours.named_parameters())
    n = 0
    for row in weight_table(ours):
        if row.theirs in theirs:
            n += 1
            assert maxdiff(theirs[row.theirs].grad, mine[row.ours].grad) <= 10 * TOL[dtype], row
    assert n == len(theirs)


# -- weight map ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cls_name", ["CvtModel", "CvtForImageClassification"])
@pytest.mark.parametrize("name", ["three_stages", "two_stages_no_cls"])
def test_round_trip_state_dict(cls_name, name, dtype):
    ref = make(cls_name, dtype, seed=4, **CONFIGS[name])
    ours = splitformer.from_hf(ref)
    assert ours.source.hf_class == cls_name
    assert ours.source.config["embed_dim"] == list(ref.config.embed_dim)
    back = splitformer.to_hf(ours)
    assert type(back) is type(ref)
    a, b = ref.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert {r.theirs for r in weight_table(ours) if not r.attr} == set(a)
    x = pixels(dtype)
    if ref.config.cls_token[-1] or cls_name == "CvtModel":  # HF's head needs a class token
        with torch.no_grad():
            assert torch.equal(ref(x)[0], back(x)[0])


def test_local_checkpoint_folder(tmp_path):
    ref = make("CvtForImageClassification", torch.float32, seed=6)
    ref.save_pretrained(tmp_path)
    ours = splitformer.from_hf(str(tmp_path))
    x = pixels(torch.float32)
    with torch.no_grad():
        assert maxdiff(ref(x).logits, ours(x).logits) <= TOL[torch.float32]
    loaded = type(ref).from_pretrained(tmp_path, local_files_only=True)
    a, b = loaded.state_dict(), splitformer.to_hf(ours).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "overrides,option",
    [
        ({"qkv_projection_method": ["dw_bn", "avg", "dw_bn"]}, "qkv_projection_method"),
        ({"stride_q": [1, 2, 1]}, "stride_q"),
        ({"padding_q": [1, 1, 0]}, "padding_q"),
        ({"cls_token": [True, False, True]}, "cls_token"),
        ({"num_heads": [1, 2]}, "num_heads"),
    ],
)
def test_unsupported_config_raises(overrides, option):
    short = {k: v for k, v in overrides.items() if k == "num_heads"}
    ref = make("CvtModel", torch.float32, **{k: v for k, v in overrides.items() if k not in short})
    for k, v in short.items():  # fewer entries than stages: set after construction
        setattr(ref.config, k, v)
    with pytest.raises(ValueError, match=option):
        splitformer.from_hf(ref)


def test_unsupported_modules_raise():
    ref = make("CvtModel", torch.float32)
    bn = (ref.encoder.stages[1].layers[0].attention.attention.convolution_projection_key
          .convolution_projection.normalization)
    bn.track_running_stats = False
    with pytest.raises(ValueError, match="track_running_stats"):
        splitformer.from_hf(ref)
    ref = make("CvtModel", torch.float32)
    ref.encoder.stages[2].layers[1].intermediate.activation = torch.nn.GELU("tanh")
    with pytest.raises(ValueError, match="approximate"):
        splitformer.from_hf(ref)


def test_to_hf_errors():
    ref = make("CvtModel", torch.float32)
    ours = from_hf_model(ref)
    ours.stages[1].evolution.controls[0]["norm1"].eps = 1e-6
    with pytest.raises(ValueError, match="layer_norm_eps"):
        to_hf_model(ours)
    ours.stages[1].evolution.controls[0]["norm1"].eps = 1e-5
    with pytest.raises(ValueError, match="tau = 1"):
        to_hf_model(ours.refine(2))
    with pytest.raises(ValueError, match="scheme"):
        to_hf_model(ours.with_scheme("strang"))
    assert isinstance(to_hf_model(ours.with_scheme("prenorm")), transformers.CvtModel)
    ours.source = {}
    with pytest.raises(ValueError, match="from_hf"):
        splitformer.to_hf(ours)


def test_input_checks():
    ours = splitformer.from_hf(make("CvtModel", torch.float32))
    with pytest.raises(ValueError, match="pixel_values"):
        ours(torch.zeros(1, 4, 16, 16))
    with pytest.raises(TypeError, match="dtype"):
        ours(torch.zeros(1, 3, 16, 16, dtype=torch.float64))


# -- the contract -------------------------------------------------------------------------------
def test_contract_evolution_refine_trajectory():
    ref = make("CvtForImageClassification", torch.float64, seed=7)
    ours = splitformer.from_hf(ref)
    assert isinstance(ours, ConvolutionalVisionTransformer)
    evo = ours.evolution
    assert evo is ours.stages[-1].evolution
    assert (evo.tau, evo.num_steps, evo.T) == (1.0, 3, 3.0)
    assert [s.evolution.num_steps for s in ours.stages] == [1, 2, 3]
    assert ours.stage_offsets == [0.0, 1.0, 3.0]
    assert evo.scheme.name == "prenorm" and len(evo.controls) == 3
    x = pixels(torch.float64)

    fine = ours.refine(2)
    assert [s.evolution.num_steps for s in fine.stages] == [2, 4, 6]
    assert fine.evolution.tau == 0.5 and ours.evolution.tau == 1.0
    assert all(p is q for p, q in zip(fine.parameters(), ours.parameters(), strict=True))
    with torch.no_grad():
        out = fine(x)
        assert torch.isfinite(out.logits).all()
        assert not torch.equal(out.logits, ours(x).logits)

    strang = ours.with_scheme("strang")  # built on the pre-LN layout of every stage
    assert all(s.evolution.scheme.name == "strang" for s in strang.stages)
    assert all(s.evolution.scheme.stages[0].pre == ("norm2",) for s in strang.stages)
    assert all(s.evolution.scheme.name == "prenorm" for s in ours.stages)
    heun = ours.with_scheme("prenorm", integrator="heun")
    assert all(s.evolution.scheme.stages[0].integrator == "heun" for s in heun.stages)
    mixed = ours.with_scheme(["prenorm", "strang", "norm1>attention norm2>ffn:heun"])
    assert [s.evolution.scheme.name for s in mixed.stages] == ["prenorm", "strang", "custom"]
    with torch.no_grad():
        assert torch.isfinite(mixed(x).logits).all()
        linear = ours.with_controls_in_time("linear")
        assert all(s.evolution.controls.interpolation == "linear" for s in linear.stages)
        # at tau = 1 the step midpoints are the nodes: linear-in-time controls = the network
        assert maxdiff(linear(x).logits, ours(x).logits) <= 1e-12
    with pytest.raises(ValueError, match="one per stage"):
        ours.with_scheme(["prenorm", "lie"])

    with torch.no_grad():
        out = ours(x)
        traj = ours.trajectory(x)
        assert traj.states.shape[0] == 4 and torch.equal(traj.times, evo.grid.times())
        # class token first, then the grid tokens of the last stage
        assert torch.equal(traj.final[:, :1], out.cls_token_value)
        grid = traj.final[:, 1:].transpose(1, 2).reshape(out.last_hidden_state.shape)
        assert torch.equal(grid, out.last_hidden_state)
        trajs = ours.trajectories(x)
        assert [len(t) for t in trajs] == [2, 3, 4]
        assert torch.equal(trajs[-1].states, traj.states)
        first = ours.trajectory(x, stage=0)
        assert torch.equal(first.states, trajs[0].states)
        fine_traj = fine.trajectory(x)
        assert len(fine_traj) == 7
    assert ours.validating(True).stages[0].evolution.validate
    ours.validating(False)


def test_scheme_of_the_layer():
    assert cvt_scheme(False).name == "prenorm"
    s = cvt_scheme(True)
    assert str(s) == "norm1>attention<drop_path norm2>ffn drop_path:map"


def test_random_weight_model_without_transformers_objects():
    """build_cvt: the library's own CvT (random weights), two grid levels, a head."""
    from splitformer.models.cvt import CvtStageSpec, build_cvt

    specs = [
        CvtStageSpec(3, 8, 2, 2, patch_size=5, patch_stride=4, patch_padding=2),
        CvtStageSpec(8, 12, 3, 2, cls_token=True, drop_path=[0.0, 0.1]),
    ]
    model = build_cvt(specs, num_labels=4, dtype=torch.float64).eval()
    assert model.stages[1].evolution.scheme.name == "cvt_drop_path"
    out = model(pixels(torch.float64, shape=(2, 16, 16)), output_hidden_states=True)
    assert out.last_hidden_state.shape == (2, 12, 2, 2) and out.cls_token_value.shape == (2, 1, 12)
    assert [h.shape[-2:] for h in out.hidden_states] == [(4, 4), (2, 2)]
    assert out.logits.shape == (2, 4)
    assert model.refine(3)(pixels(torch.float64, shape=(1, 16, 16))).logits.shape == (1, 4)


# -- the operators ------------------------------------------------------------------------------
def test_batchnorm_eval_is_the_affine_map():
    bn = BatchNormMap(5, dtype=torch.float64)
    randomize_(bn, 0)
    bn.eval()
    v = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    a, c = bn.affine_coefficients()
    assert maxdiff(bn(v), a.view(1, 5, 1, 1) * v + c.view(1, 5, 1, 1)) <= 1e-14
    ref = torch.nn.BatchNorm2d(5, dtype=torch.float64)
    ref.load_state_dict(bn.state_dict())
    bn.train()
    ref.train()
    assert torch.equal(bn(v), ref(v))
    assert all(torch.equal(x, y) for x, y in zip(bn.state_dict().values(),
                                                 ref.state_dict().values(), strict=True))
    bn.momentum = ref.momentum = None  # cumulative average
    assert torch.equal(bn(v), ref(v)) and torch.equal(bn.running_var, ref.running_var)


def test_class_token_bypasses_the_convolution():
    proj = ConvolutionalProjection(6, stride=2, num_prefix_tokens=1, dtype=torch.float64)
    proj.eval()
    u = torch.randn(2, 1 + 4 * 5, 6, dtype=torch.float64)
    ctx = Context(grid_shape=(4, 5))
    out = proj(u, ctx)
    assert out.shape == (2, 1 + 2 * 3, 6)  # the stride-2 (coarse) grid
    expected = u[:, :1] @ proj.weight.T + proj.bias
    assert maxdiff(out[:, :1], expected) <= 1e-14
    v = u.clone()
    v[:, 1:] += 1.0
    assert torch.equal(proj(v, ctx)[:, :1], out[:, :1])


def test_attention_grid_from_context():
    att = ConvolutionalAttention(8, 2, dtype=torch.float64).eval()
    u = torch.randn(1, 6, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="grid_shape"):
        att(u)
    assert att(u, Context(grid_shape=(2, 3))).shape == u.shape
    assert token_grid(torch.zeros(1, 10, 3), None, 1) == (3, 3)
    with pytest.raises(ValueError, match="grid_shape"):
        token_grid(u, Context(grid_shape=(2, 2)), 0)
    assert att.scale == 8 ** -0.5  # CvT scales by dim**-1/2, not head_dim**-1/2


@pytest.mark.slow
def test_default_cvt13_config_eval():
    """CvT-13's configuration (random weights, stochastic depth in the last stage), 224 x 224."""
    cfg = transformers.CvtConfig(num_labels=10)
    torch.manual_seed(0)
    ref = randomize_(transformers.CvtForImageClassification(cfg), 0).eval()
    ours = splitformer.from_hf(ref)
    x = pixels(torch.float32, shape=(1, 224, 224))
    with torch.no_grad():
        assert maxdiff(ref(x).logits, ours(x).logits) <= TOL[torch.float32]


def test_outputs_index_like_transformers():
    """out[0] and out["name"] give what transformers' outputs give."""
    for cls in ("CvtModel", "CvtForImageClassification"):
        hf = getattr(transformers, cls)(transformers.CvtConfig(**BASE)).double().eval()
        ours = splitformer.from_hf(hf).eval()
        px = torch.randn(2, 3, 32, 32, dtype=torch.float64)
        with torch.no_grad():
            ref, out = hf(px), ours(px)
        assert (out[0] - ref[0]).abs().max() <= 1e-10
        key = "logits" if cls != "CvtModel" else "last_hidden_state"
        assert (out[key] - ref[key]).abs().max() <= 1e-10
