"""analysis.diagnostics and analysis.figures: each quantity against a known answer (projection
residuals, the Lipschitz constant of a linear step and of a nonlinear post-LN step against the
autograd Jacobian, identical tokens, a uniform kernel, a direct count of active ReLU units and
of negative pre-activations, shares, velocity and kinetic energy), cross-attention measured like
self-attention, every None with its note, every family runs to a JSON-friendly dict, draw()
writes its files, bad arguments are named."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn

import splitformer
from splitformer.analysis import ArgumentError
from splitformer.analysis.diagnostics import (
    DEFINITIONS,
    LIPSCHITZ_ITERATIONS,
    Diagnostics,
    LipschitzEstimate,
    analyze,
    attention_entropy,
    cosine_similarity,
    effective_rank,
    kernel_matrix,
    step_lipschitz,
    summary_text,
)
from splitformer.analysis.figures import Figure, draw
from splitformer.control import KineticEnergy
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
from splitformer.time import Controls, Evolution, SaveAt, Scheme, Stage, scheme_from_string

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


def _leaves(obj):
    """Every value of a JSON-like tree that is not a dict or a list."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def _finite_numbers(obj) -> None:
    for v in _leaves(obj):
        if isinstance(v, float):
            assert math.isfinite(v)
        else:
            assert v is None or isinstance(v, (str, int))


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
    assert d["model"]["class"] in text and "product of the Lipschitz estimates" in text


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
                                      for e in ("encoder", "decoder")} | {
        "kernels_cross-attention_decoder"}
    cross = next(f for f in figs if f.name == "kernels_cross-attention_decoder")
    assert "'cross_attention'" in cross.caption
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
        (lambda: analyze(model, (x,), lipschitz_tol=-0.1), "lipschitz_tol"),
        (lambda: analyze(model, (x,), lipschitz_tol=1.0), "lipschitz_tol"),
        (lambda: analyze(model, (x,), lipschitz_tol="1e-3"), "lipschitz_tol"),
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


# -- the Lipschitz estimate --------------------------------------------------------------------
def _step_jacobian_sigma(evolution, n: int, u: torch.Tensor, index: int) -> float:
    """sigma_max of the autograd Jacobian of step n at input ``index`` of u (others fixed)."""
    def f(z):
        return evolution.advance(n, torch.cat((u[:index], z.unsqueeze(0), u[index + 1:])),
                                 None)[index]

    jac = torch.autograd.functional.jacobian(f, u[index])
    return float(torch.linalg.svdvals(jac.reshape(u[index].numel(), -1))[0])


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_lipschitz_at_defaults_is_the_largest_singular_value_of_the_jacobian(activation):
    """A nonlinear post-LN step (two torch layers, float64; at step 1 the second singular value
    is within 8% of the first): at the defaults the estimate converges and equals sigma_max of
    the autograd Jacobian to 1e-3 (ten power iterations, the old default, were 9% low at step
    1)."""
    enc, model = _post_ln(activation=activation)
    torch.manual_seed(10)
    x = 3 * torch.randn(2, 5, 16, dtype=D)
    diag = analyze(model, (x,), kernel_input=1)
    with torch.no_grad():
        states = model.trajectory(x).state_list
    for n, step in enumerate(diag.evolutions[0]["steps"]):
        sigma = _step_jacobian_sigma(model.evolution, n, states[n], 1)
        assert step["lipschitz"] == pytest.approx(sigma, rel=1e-3), n
        assert step["lipschitz"] <= sigma * (1 + 1e-9)  # never above sigma_max
        assert step["lipschitz_converged"] is True
        assert 1 < step["lipschitz_iterations"] <= LIPSCHITZ_ITERATIONS
        assert step["lipschitz_change"] < 1e-4
    assert not [n for n in diag.notes if "Lipschitz" in n]
    est = step_lipschitz(model.evolution, 1, states[1], index=1)
    assert isinstance(est, LipschitzEstimate) and est.converged
    assert float(est) == diag.evolutions[0]["steps"][1]["lipschitz"]


def test_lipschitz_at_the_cap_is_marked_not_converged_with_a_note():
    _, model = _post_ln()
    diag = analyze(model, (_x(),), lipschitz_iterations=2)
    for step in diag.evolutions[0]["steps"]:
        assert step["lipschitz_iterations"] == 2 and step["lipschitz_converged"] is False
        assert step["lipschitz_change"] > 1e-4
        n = step["step"]
        assert any(note.startswith(f"evolution step {n}: the Lipschitz estimate did not "
                                   "converge") for note in diag.notes)
    assert "not converged at steps 0, 1" in diag.summary()
    settings = diag.as_dict()["lipschitz_settings"]
    assert settings["lipschitz_iterations"] == 2 and settings["lipschitz_tol"] == 1e-4
    # one iteration: no change measured, said so
    diag = analyze(model, (_x(),), lipschitz_iterations=1)
    assert all(s["lipschitz_change"] is None for s in diag.evolutions[0]["steps"])
    assert any("a single iteration measures no change" in n for n in diag.notes)


def test_step_lipschitz_names_bad_arguments_and_runs_the_step_in_eval_mode():
    _, model = _post_ln()
    evo = model.evolution
    u = _x()
    cases = [
        (dict(step=99), "step"), (dict(step=-1), "step"), (dict(step=True), "step"),
        (dict(step=1.0), "step"), (dict(index=-1), "index"), (dict(index=2), "index"),
        (dict(iterations=0), "iterations"), (dict(iterations=2.5), "iterations"),
        (dict(tol=-1.0), "tol"), (dict(tol=1.0), "tol"), (dict(tol=float("nan")), "tol"),
        (dict(state=u[0]), "state"), (dict(state=u.long()), "state"),
        (dict(evolution=model), "evolution"),
        (dict(evolution=model.with_scheme("reversible").evolution), "evolution"),
        (dict(seed="0"), "seed"),
    ]
    for kw, argument in cases:
        call = {"evolution": evo, "step": 0, "state": u, **kw}
        with pytest.raises(ArgumentError) as e:
            step_lipschitz(call.pop("evolution"), call.pop("step"), call.pop("state"), **call)
        assert e.value.argument == argument, (kw, str(e.value))
    # dropout in training mode would make J random: the step runs in eval mode
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.5, batch_first=True, dtype=D)
    drop = splitformer.from_torch(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
    drop.train()
    a = step_lipschitz(drop.evolution, 1, u, iterations=5, seed=3)
    b = step_lipschitz(drop.evolution, 1, u, iterations=5, seed=3)
    assert all(m.training for m in drop.modules())  # the caller's mode is restored
    drop.eval()
    c = step_lipschitz(drop.evolution, 1, u, iterations=5, seed=3)
    assert a == b == c


def test_kinetic_energy_is_control_kinetic_energy():
    _, model = _post_ln()
    diag = analyze(model.refine(2), (_x(),), lipschitz_iterations=1)
    expected = float(KineticEnergy(1.0)(model, diag.states[0]))
    assert diag.evolutions[0]["kinetic_energy"] == pytest.approx(expected, rel=1e-12)


# -- attention substeps, FFN readings, notes ---------------------------------------------------
def test_cross_attention_gets_its_kernel_and_entropy():
    """The decoder of the pair: self-attention and cross-attention both have a kernel (the
    cross kernel is decoder tokens x encoder tokens) and per-head entropies; the step's first
    attention stays in attention_operator / attention_entropy."""
    model, inputs, _ = _pair()
    diag = analyze(model, inputs, lipschitz_iterations=1)
    dec = diag.names.index("decoder")
    traj = diag.states[dec]
    for step, ks in zip(diag.evolutions[dec]["steps"], diag.attention_kernels[dec],
                        strict=True):
        ops = [a["operator"] for a in step["attention"]]
        assert ops == ["attention", "cross_attention"]
        assert step["attention_operator"] == "attention"
        assert step["attention_entropy"] == step["attention"][0]["entropy"]
        cross = step["attention"][1]
        assert cross["substep"] == 2 and len(cross["entropy"]) == 2
        assert cross["entropy_uniform"] == pytest.approx(math.log(5), rel=1e-12)
        assert ks["cross_attention"].shape == (2, 4, 5)
        # the cross kernel from the state entering the substep, directly
        n = step["step"]
        entering = next(s.state for s in traj.substeps if s.step == n and s.stage == 1)
        op = model.decoder.evolution.theta(n)["cross_attention"]
        g = kernel_matrix(op, entering, _decoder_context(model, inputs))
        assert torch.allclose(ks["cross_attention"], g[0], atol=1e-12)
        assert cross["entropy"] == pytest.approx(
            attention_entropy(g).mean(dim=(0, 2)).tolist(), rel=1e-12)
    assert diag.kernels[dec][0] is diag.attention_kernels[dec][0]["attention"]


def _decoder_context(model, inputs):
    from splitformer.analysis.diagnostics import _capture

    return [c for c in _capture(model, inputs, {}) if c.name == "decoder"][0].context


def test_causal_kernel_entropy_uniform_is_the_mean_of_log_x_plus_one():
    model, inputs, _ = _gpt2()
    diag = analyze(model, inputs, lipschitz_iterations=1)
    n = inputs[0].shape[1]
    expected = sum(math.log(x + 1) for x in range(n)) / n
    for step in diag.evolutions[0]["steps"]:
        assert step["attention"][0]["entropy_uniform"] == pytest.approx(expected, rel=1e-12)
        assert all(e < math.log(n) for e in step["attention_entropy"])


@pytest.mark.parametrize("activation", ["gelu", "silu", "hardtanh"])
def test_ffn_readings_by_activation(activation):
    """relu_active only where the activation is a projection (hardtanh: |p| > 1); GELU and
    SiLU get None there (with a note) and the sign statistic under negative_preactivation, a
    direct count either way."""
    torch.manual_seed(0)
    model = network_encoder(16, 2, 24, 2, activation=activation, dtype=D)
    x = _x()
    diag = analyze(model, (x,), lipschitz_iterations=1)
    subs = diag.states[0].substeps
    for n, step in enumerate(diag.evolutions[0]["steps"]):
        ffn = next(s for s in step["substeps"] if s["label"] == "ffn")
        h = next(s.state for s in subs if s.step == n and s.label.startswith("norm1"))
        p = model.evolution.controls[n]["ffn"].stages[0](h)
        assert ffn["negative_preactivation"] == pytest.approx(float((p < 0).double().mean()),
                                                              abs=1e-12)
        if activation == "hardtanh":
            assert ffn["relu_active"] == pytest.approx(float((p.abs() > 1).double().mean()),
                                                       abs=1e-12)
        else:
            assert ffn["relu_active"] is None
        others = [s for s in step["substeps"] if s["label"] != "ffn"]
        assert all(s["relu_active"] is None and s["negative_preactivation"] is None
                   for s in others)
    note = [n for n in diag.notes if "relu_active is None on the FFN substeps" in n]
    assert bool(note) == (activation != "hardtanh")
    assert "negative_preactivation" in DEFINITIONS and "sign statistic" in DEFINITIONS[
        "negative_preactivation"]


def _nones_and_notes(diag) -> None:
    """Every measurement that is None in a step has a note naming the step (or its
    evolution) and the key."""
    for ev in diag.evolutions:
        name = ev["name"]
        for step in ev["steps"]:
            where = f"{name} step {step['step']}"
            for key in ("lipschitz", "lipschitz_iterations", "lipschitz_converged",
                        "attention_operator", "attention_entropy"):
                if step[key] is None:
                    assert any(n.startswith(where + ":") and key in n for n in diag.notes), (
                        where, key, diag.notes)


def test_reversible_and_parallel_nones_carry_notes():
    _, model = _post_ln()
    x = _x()
    rev = analyze(model.with_scheme("reversible"), (x,), lipschitz_iterations=1)
    _nones_and_notes(rev)
    for step in rev.evolutions[0]["steps"]:
        assert step["lipschitz"] is None and step["attention"] == []
        assert all(s["relu_active"] is None for s in step["substeps"])
    assert any(n.startswith("evolution: ") and "relu_active" in n and "doubled state" in n
               for n in rev.notes)
    # the parallel scheme: the FFN and attention first in their branches are measured
    par = analyze(model.with_scheme("parallel"), (x,), lipschitz_iterations=1)
    _nones_and_notes(par)
    step = par.evolutions[0]["steps"][0]
    sub = step["substeps"][0]
    assert sub["kind"] == "parallel" and 0 < sub["relu_active"] < 1
    assert sub["relu_active"] == sub["negative_preactivation"]
    assert [a["operator"] for a in step["attention"]] == ["attention*2"]
    # an FFN later in a branch is not measured, and a note says so
    custom = model.with_scheme(scheme_from_string(
        "parallel(attention norm1:project ffn | ffn norm2:project)"))
    diag = analyze(custom, (x,), lipschitz_iterations=1)
    assert any("'ffn'" in n and "not measured" in n for n in diag.notes), diag.notes
    assert diag.evolutions[0]["steps"][0]["substeps"][0]["relu_active"] is not None


def test_linear_controls_in_time_are_read_with_their_blended_parameters():
    _, model = _post_ln()
    lin = model.with_controls_in_time("linear").refine(2)
    x = _x()
    diag = analyze(lin, (x,), lipschitz_iterations=3)
    _nones_and_notes(diag)
    assert all(s["lipschitz"] is not None and s["attention_entropy"] is not None
               for s in diag.evolutions[0]["steps"])
    # step 1 (t = 0.5 .. 1, midpoint 0.75): blended controls; the kernel from them
    n = 1
    theta = lin.evolution.theta(n)
    assert not isinstance(theta["attention"], nn.Module)
    g = kernel_matrix(theta["attention"], diag.states[0].state_list[n])
    assert torch.allclose(diag.kernels[0][n], g[0], atol=1e-12)


# -- the run of the model ----------------------------------------------------------------------
class _Fails(EvolutionModel):
    """Refuses a 2-D input in initial_condition; fails in the read-out with ``error``."""

    def __init__(self, error: Exception | None) -> None:
        super().__init__()
        self.evolution = Evolution(Controls([{"f": _MatrixField(torch.eye(3, dtype=D),
                                                                torch.eye(2, dtype=D))}]),
                                   Scheme((Stage("f"),)))
        self.error = error

    def initial_condition(self, u):
        if u.dim() != 3:
            raise ValueError(f"expected (batch, tokens, features), got {tuple(u.shape)}")
        return u, Context()

    def read_out(self, u, context):
        if self.error is not None:
            raise self.error
        return u


def test_only_the_models_input_checks_make_an_input_refused():
    x = torch.randn(1, 3, 2, dtype=D)
    with pytest.raises(ArgumentError) as e:
        analyze(_Fails(None), (x[0],))
    assert e.value.argument == "inputs" and "ValueError" in str(e.value)
    with pytest.raises(ArgumentError) as e:
        analyze(_Fails(None), (x, x))  # forward does not take two inputs
    assert e.value.argument == "inputs"
    for error in (TypeError("a bug in the read-out"), ValueError("another")):
        with pytest.raises(type(error)) as e:
            analyze(_Fails(error), (x,))
        assert not isinstance(e.value, ArgumentError)
    model = _Fails(None)
    analyze(model, (x,), lipschitz_iterations=1)
    assert "initial_condition" not in model.__dict__  # the input check is unwrapped after


def test_non_finite_weights_and_inputs_are_named_before_the_run():
    """A NaN or infinite parameter is ArgumentError("model"), a NaN or infinite input tensor or
    a u(0) that is not finite ArgumentError("inputs"): before any torch error of the run
    (linalg.svd on NaN)."""
    _, model = _post_ln()
    x = _x()
    bad = x.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ArgumentError) as e:
        analyze(model, (bad,))
    assert e.value.argument == "inputs" and "not finite" in str(e.value) and "NaN" in str(e.value)
    inf = x.clone()
    inf[0, 0, 0] = float("inf")
    with pytest.raises(ArgumentError) as e:
        analyze(model, (inf,))
    assert e.value.argument == "inputs" and "infinite" in str(e.value)
    name, param = next(iter(model.named_parameters()))
    with torch.no_grad():
        keep = param.clone()
        param.view(-1)[0] = float("nan")
    try:
        with pytest.raises(ArgumentError) as e:
            analyze(model, (x,))
        assert e.value.argument == "model" and name in str(e.value)
        assert "not finite" in str(e.value)
    finally:
        with torch.no_grad():
            param.copy_(keep)

    class Overflows(_Fails):  # finite inputs, a u(0) that is not
        def initial_condition(self, u):
            return u * float("inf"), Context()

    with pytest.raises(ArgumentError) as e:
        analyze(Overflows(None), (torch.ones(1, 3, 2, dtype=D),))
    assert e.value.argument == "inputs" and "u(0)" in str(e.value)
    analyze(model, (x,), lipschitz_iterations=1)  # restored: runs


def test_summary_numbers_are_numbers_of_the_data():
    model, inputs, _ = _pair()
    diag = analyze(model, inputs, lipschitz_iterations=2)
    data = json.loads(json.dumps(diag.as_dict()))
    text = summary_text(data)
    assert text == diag.summary()
    shown = set()
    for v in _leaves(data):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            shown.add(str(v) if isinstance(v, int) else f"{v:.4g}")
        elif isinstance(v, str):
            shown.update(re.findall(NUMBER, v))
    for number in re.findall(NUMBER, text):
        assert number in shown, number


NUMBER = r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
