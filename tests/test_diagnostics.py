"""analysis.diagnostics and analysis.figures: each quantity against a known answer (projection
residuals, the Lipschitz constant of a linear step, identical tokens, a uniform kernel, a direct
count of active ReLU units, shares, velocity and kinetic energy), every family runs to a
JSON-friendly dict, draw() writes its files, bad arguments are named."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import splitformer
from splitformer.analysis import ArgumentError
from splitformer.analysis.diagnostics import (
    Diagnostics,
    analyze,
    attention_entropy,
    cosine_similarity,
    effective_rank,
    kernel_matrix,
)
from splitformer.analysis.figures import Figure, draw
from splitformer.models import (
    EvolutionModel,
    build_vit,
    causal_decoder,
    encoder_decoder,
    network_encoder,
    paper_encoder,
)
from splitformer.models.bert import bert_model
from splitformer.models.cvt import CvtStageSpec, build_cvt
from splitformer.operators import NonlocalAttention, Operator
from splitformer.operators.base import Context
from splitformer.operators.kernels import LinearKernel
from splitformer.time import Controls, Evolution, SaveAt, Scheme, Stage

D = torch.float64


def _post_ln(dtype=D, eps=1e-5, activation="relu"):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True, dtype=dtype,
                                       layer_norm_eps=eps, activation=activation)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return enc, splitformer.from_torch(enc)


def _x(dtype=D, batch=2, tokens=5):
    torch.manual_seed(1)
    return torch.randn(batch, tokens, 16, dtype=dtype)


# -- the quantities against known answers ------------------------------------------------------
def test_projection_substeps_leave_no_residual():
    """Post-LN with a real LayerNorm (random gain and bias, eps = 0.1, float32): after each norm
    substep the normalised variable z = (u - beta) / gamma has mean 0 and the eps-corrected
    variance; against var 1 (the eps = 0 set) the residual is visible."""
    enc, model = _post_ln(torch.float32, eps=0.1)
    with torch.no_grad():
        for layer in enc.layers:
            for norm in (layer.norm1, layer.norm2):
                norm.weight.copy_(1.0 + 0.3 * torch.rand(16))
                norm.bias.copy_(torch.randn(16))
    model = splitformer.from_torch(enc)
    diag = analyze(model, (_x(torch.float32),), lipschitz_iterations=1)
    seen = 0
    for step in diag.evolutions[0]["steps"]:
        for sub in step["substeps"]:
            if sub["kind"] != "project":
                assert sub["constraint"] is None
                continue
            c = sub["constraint"]
            assert c["set"] == "S1" and c["operator"] == "LayerNormProjection"
            assert c["mean_residual"] < 1e-5 and c["var_residual"] < 1e-5
            assert c["var_residual_eps0"] > 1e-3  # eps = 0.1 is not the set var = 1
            seen += 1
    assert seen == 4


def test_sphere_projection_residual_is_zero():
    """The paper's literal scheme: P_S1 with scalar s1, s2 (eps = 0)."""
    torch.manual_seed(0)
    model = paper_encoder(8, 2, 12, 2)
    diag = analyze(model, (torch.randn(2, 4, 8),), lipschitz_iterations=1)
    found = [sub["constraint"] for s in diag.evolutions[0]["steps"] for sub in s["substeps"]
             if sub["kind"] == "project"]
    assert len(found) == 4
    for c in found:
        assert c["operator"] == "SphereProjection"
        assert c["mean_residual"] < 1e-5 and c["var_residual"] < 1e-5


class _MatrixField(Operator):
    """F(u) = A u B: tokens mixed by A (N x N), features by B (D x D)."""

    kind = "field"

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("a", a)
        self.register_buffer("b", b)

    def forward(self, u, context=None):
        return self.a @ u @ self.b


class _Linear(EvolutionModel):
    def __init__(self, fields) -> None:
        super().__init__()
        self.evolution = Evolution(Controls([{"f": f} for f in fields]),
                                   Scheme((Stage("f"),)))

    def initial_condition(self, u):
        return u, Context()

    def read_out(self, u, context):
        return u


@pytest.mark.parametrize("k", [1, 2])
def test_lipschitz_of_a_linear_step_is_its_largest_singular_value(k):
    """u -> u + tau A u B has the Jacobian I + tau kron(A, B^T) (row-major vec)."""
    torch.manual_seed(0)
    n, d = 4, 3
    mats = [(torch.randn(n, n, dtype=D), torch.randn(d, d, dtype=D)) for _ in range(2)]
    model = _Linear([_MatrixField(a, b) for a, b in mats]).refine(k)
    diag = analyze(model, (torch.randn(2, n, d, dtype=D),), lipschitz_iterations=300,
                   kernel_input=1)
    tau = 1.0 / k
    steps = diag.evolutions[0]["steps"]
    assert len(steps) == 2 * k
    expected = []
    for s in steps:
        a, b = mats[s["step"] // k]
        m = torch.eye(n * d, dtype=D) + tau * torch.kron(a, b.T.contiguous())
        expected.append(float(torch.linalg.svdvals(m)[0]))
        assert s["lipschitz"] == pytest.approx(expected[-1], rel=1e-3)
        assert s["attention_entropy"] is None and s["attention_operator"] is None
    assert diag.evolutions[0]["lipschitz_product"] == pytest.approx(math.prod(expected),
                                                                    rel=1e-3)


def test_identical_tokens_have_cosine_one_and_rank_one():
    torch.manual_seed(0)
    row = torch.randn(7)
    same = row.expand(5, 7).clone()
    assert float(cosine_similarity(same)) == pytest.approx(1.0, abs=1e-6)
    assert float(effective_rank(same)) == pytest.approx(1.0, abs=1e-5)
    batch = torch.stack([same, 2.0 * same])
    assert torch.allclose(cosine_similarity(batch), torch.ones(2, dtype=D), atol=1e-6)
    # and the other ends: orthogonal tokens, equal singular values
    eye = torch.eye(4)
    assert float(cosine_similarity(eye)) == pytest.approx(0.0, abs=1e-12)
    assert float(effective_rank(eye)) == pytest.approx(4.0, rel=1e-9)
    # a state of identical tokens through analyze: the initial readings
    model = _Linear([_MatrixField(torch.eye(5, dtype=D), torch.eye(7, dtype=D))])
    diag = analyze(model, (same.double().unsqueeze(0),), lipschitz_iterations=1)
    first = diag.evolutions[0]["initial"]
    assert first["cosine_similarity"] == pytest.approx(1.0, abs=1e-9)
    assert first["effective_rank"] == pytest.approx(1.0, abs=1e-6)


def test_attention_entropy_of_a_uniform_kernel_is_log_n():
    """Zero query and key weights: every score is 0, g = 1/N, entropy log N per head."""
    _, model = _post_ln()
    with torch.no_grad():
        for theta in model.evolution.controls:
            att = theta["attention"]
            att.qkv_weight[: 2 * att.dim].zero_()
            att.qkv_bias[: 2 * att.dim].zero_()
    n = 5
    diag = analyze(model, (_x(tokens=n),), lipschitz_iterations=1)
    for step, g in zip(diag.evolutions[0]["steps"], diag.kernels[0], strict=True):
        assert step["attention_entropy"] == pytest.approx([math.log(n)] * 2, abs=1e-9)
        assert g.shape == (2, n, n)
        assert torch.allclose(g, torch.full_like(g, 1.0 / n))
    one_hot = torch.eye(3)
    assert torch.allclose(attention_entropy(one_hot), torch.zeros(3, dtype=D))


def test_kernel_matrix_is_the_softmax_and_the_linear_kernel():
    torch.manual_seed(0)
    att = NonlocalAttention(8, 2, dtype=D)
    u = torch.randn(2, 5, 8, dtype=D)
    q, k, _ = att.qkv(u)
    soft = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)
    assert torch.allclose(kernel_matrix(att, u), soft, atol=1e-12)
    causal = kernel_matrix(att, u, Context(is_causal=True))
    assert torch.equal(causal.triu(1), torch.zeros_like(causal))
    assert torch.allclose(causal.sum(-1), torch.ones(2, 2, 5, dtype=D))
    att.set_kernel(LinearKernel())
    fq, fk = LinearKernel.feature_map(q), LinearKernel.feature_map(k)
    w = fq @ fk.transpose(-2, -1)
    assert torch.allclose(kernel_matrix(att, u), w / w.sum(-1, keepdim=True), atol=1e-12)


def test_relu_active_is_a_direct_count():
    """The fraction of W_1 h + b_1 < 0 over the hidden units, h the state entering the FFN
    (after norm1), from the torch layer's own linear1."""
    enc, model = _post_ln()
    x = _x()
    diag = analyze(model, (x,), lipschitz_iterations=1)
    subs = diag.states[0].substeps
    for n, layer in enumerate(enc.layers):
        h = next(s.state for s in subs if s.step == n and s.label.startswith("norm1"))
        direct = float((layer.linear1(h) < 0).double().mean())
        ffn = [s for s in diag.evolutions[0]["steps"][n]["substeps"] if s["label"] == "ffn"]
        assert ffn[0]["relu_active"] == pytest.approx(direct, abs=1e-12)
        assert 0.0 < direct < 1.0


def test_shares_sum_to_one_and_increments_are_the_substeps_moves():
    _, model = _post_ln()
    x = _x()
    diag = analyze(model, (x,), lipschitz_iterations=1)
    with torch.no_grad():
        traj = model.trajectory(x, saveat=SaveAt(steps=True, substeps=True))
    for step in diag.evolutions[0]["steps"]:
        shares = [s["share"] for s in step["substeps"]]
        assert sum(shares) == pytest.approx(1.0, abs=1e-12)
        before = traj.state_list[step["step"]]
        subs = [s for s in traj.substeps if s.step == step["step"]]
        for rec, sub in zip(step["substeps"], subs, strict=True):
            direct = float((sub.state - before).flatten(1).norm(dim=1).mean())
            assert rec["increment"] == pytest.approx(direct, rel=1e-12)
            before = sub.state


def test_velocity_norm_and_kinetic_energy_match_the_trajectory():
    _, model = _post_ln()
    model = model.refine(2)
    x = _x()
    diag = analyze(model, (x,), lipschitz_iterations=1)
    with torch.no_grad():
        states = model.trajectory(x, saveat=SaveAt(steps=True)).state_list
    tau = 0.5
    kinetic = torch.zeros(x.shape[0], dtype=D)
    ev = diag.evolutions[0]
    assert ev["times"] == pytest.approx([0.5 * i for i in range(5)])
    for n, step in enumerate(ev["steps"]):
        assert (step["t"], step["t_end"]) == pytest.approx((tau * n, tau * (n + 1)))
        d = (states[n + 1] - states[n]).flatten(1).norm(dim=1)
        assert step["velocity"] == pytest.approx(float(d.mean()) / tau, rel=1e-12)
        assert step["norm"] == pytest.approx(float(states[n + 1].flatten(1).norm(dim=1).mean()),
                                             rel=1e-12)
        kinetic += tau * (d / tau) ** 2
    assert ev["kinetic_energy"] == pytest.approx(float(kinetic.mean()), rel=1e-12)


# -- every family ------------------------------------------------------------------------------
def _bert():
    torch.manual_seed(0)
    m = bert_model(vocab_size=31, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=24, max_position_embeddings=12, dtype=D)
    return m, (torch.randint(0, 31, (2, 6)),), 1


def _bert_hf():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=31, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=24,
                                  max_position_embeddings=12)
    m = splitformer.from_hf(transformers.BertModel(cfg).eval())
    ids = torch.randint(0, 31, (2, 6))
    return m, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 1


def _vit():
    torch.manual_seed(0)
    m = build_vit(image_size=8, patch_size=4, in_chans=3, dim=16, depth=2, num_heads=2,
                  hidden_dim=24, num_classes=3, dtype=D)
    return m, (torch.randn(2, 3, 8, 8, dtype=D),), 1


def _cvt():
    torch.manual_seed(0)
    specs = [CvtStageSpec(3, 8, 1, 1, patch_size=3, patch_stride=2),
             CvtStageSpec(8, 16, 2, 2, cls_token=True)]
    return build_cvt(specs, num_labels=3), (torch.randn(2, 3, 16, 16),), 2


def _gpt2():
    torch.manual_seed(0)
    return causal_decoder(31, 12, 16, 2, 2, lm_head=True, dtype=D), \
        (torch.randint(0, 31, (2, 6)),), 1


def _pair():
    torch.manual_seed(0)
    m = encoder_decoder(16, 2, 2, 2, 24, dtype=D)
    return m, (torch.randn(2, 5, 16, dtype=D), torch.randn(2, 4, 16, dtype=D)), 2


FAMILIES = {
    "encoder_post_ln": lambda: (_post_ln()[1], (_x(),), 1),
    "encoder_pre_ln": lambda: (network_encoder(16, 2, 24, 2, norm_first=True, dtype=D),
                               (_x(),), 1),
    "bert": _bert,
    "bert_hf": _bert_hf,
    "vit": _vit,
    "cvt": _cvt,
    "gpt2": _gpt2,
    "seq2seq": _pair,
}


def _finite_numbers(obj) -> None:
    if isinstance(obj, dict):
        for v in obj.values():
            _finite_numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            _finite_numbers(v)
    elif isinstance(obj, float):
        assert math.isfinite(obj)
    else:
        assert obj is None or isinstance(obj, (str, int))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_runs_to_a_json_dict(name):
    model, inputs, evolutions = FAMILIES[name]()
    model.train()
    diag = analyze(model, inputs, lipschitz_iterations=2, kernel_input=1)
    assert all(m.training for m in model.modules())  # the caller's mode is restored
    d = diag.as_dict()
    json.dumps(d, allow_nan=False)
    _finite_numbers(d)
    assert len(d["evolutions"]) == len(d["model"]["evolutions"]) == evolutions
    assert d["batch"] == 2 and d["activation"]["reading"] in ("projection", "proximal map",
                                                              "neither")
    for info, ev, traj, ks in zip(d["model"]["evolutions"], d["evolutions"], diag.states,
                                  diag.kernels, strict=True):
        assert len(ev["steps"]) == info["num_steps"] == len(ks) == len(traj) - 1
        for step, g in zip(ev["steps"], ks, strict=True):
            for key in ("norm", "velocity", "lipschitz", "cosine_similarity",
                        "effective_rank"):
                assert step[key] is not None, key
            assert step["lipschitz"] > 0
            assert len(step["attention_entropy"]) == g.shape[0]
            assert torch.allclose(g.sum(-1), torch.ones_like(g[..., 0]), atol=1e-5)
    text = diag.summary()
    assert d["model"]["class"] in text and "Lipschitz product" in text


# -- figures -----------------------------------------------------------------------------------
def _check_files(figs: list[Figure]) -> None:
    for f in figs:
        assert isinstance(f, Figure) and f.caption.endswith(".") and f.title
        assert f.png.stat().st_size > 0 and f.svg.stat().st_size > 0
        assert f.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in f.svg.read_bytes()[:2000]


def test_draw_writes_png_and_svg(tmp_path):
    model, inputs, _ = _vit()
    diag = analyze(model, inputs, lipschitz_iterations=1)
    figs = draw(diag, tmp_path / "vit", image_grid=(2, 2), times=[0, 2])
    assert [f.name for f in figs] == ["heatmaps", "kernels", "curves", "pca", "patches"]
    _check_files(figs)
    model, inputs, _ = _pair()
    figs = draw(analyze(model, inputs, lipschitz_iterations=1), tmp_path / "pair")
    assert {f.name for f in figs} == {f"{k}_{e}" for k in ("heatmaps", "kernels", "curves",
                                                           "pca")
                                      for e in ("encoder", "decoder")}
    _check_files(figs)


# -- bad arguments -----------------------------------------------------------------------------
def test_bad_arguments_are_named(tmp_path):
    _, model = _post_ln()
    x = _x()
    cases = [
        (lambda: analyze(nn.Linear(2, 2), (x,)), "model"),
        (lambda: analyze(model, x), "inputs"),
        (lambda: analyze(model, 3), "inputs"),
        (lambda: analyze(model, (x,), lipschitz_iterations=0), "lipschitz_iterations"),
        (lambda: analyze(model, (x,), lipschitz_iterations=1.5), "lipschitz_iterations"),
        (lambda: analyze(model, (x,), kernel_input=2), "kernel_input"),
        (lambda: analyze(model, (x,), kernel_input=-1), "kernel_input"),
        (lambda: analyze(model, (x,), seed="0"), "seed"),
    ]
    for call, argument in cases:
        with pytest.raises(ArgumentError) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))
    diag = analyze(model, (x,), lipschitz_iterations=1)
    assert isinstance(diag, Diagnostics)
    cases = [
        (lambda: draw("not a diagnostics", tmp_path), "diag"),
        (lambda: draw(diag, tmp_path, times=[99.0]), "times"),
        (lambda: draw(diag, tmp_path, image_grid=(3, 3)), "image_grid"),
        (lambda: draw(diag, tmp_path, image_grid=(2, 0)), "image_grid"),
        (lambda: draw(diag, tmp_path, skip_tokens=1), "skip_tokens"),
        (lambda: draw(diag, tmp_path, example=5), "example"),
    ]
    for call, argument in cases:
        with pytest.raises(ArgumentError) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))
