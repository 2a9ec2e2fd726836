"""Adaptive depth (splitformer.analysis.adaptive): N_t per input from an error estimate."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from splitformer.analysis import ArgumentError, adaptive_depth, fixed_depths
from splitformer.analysis.adaptive import ESTIMATES, plot
from splitformer.analysis.convergence import smooth_configuration
from splitformer.models import build_vit, paper_encoder
from splitformer.models.cvt import CvtStageSpec, build_cvt
from splitformer.time import NonFiniteError, SaveAt

D = torch.float64
N0 = 2  # depth of the ViT below: N_t0 = 2


def _vit(**kw):
    torch.manual_seed(0)
    return build_vit(image_size=8, patch_size=4, in_chans=1, dim=16, depth=N0, num_heads=2,
                     hidden_dim=32, num_classes=5, dtype=D, **kw).eval()


@pytest.fixture(scope="module")
def vit():
    model = _vit()
    x = torch.randn(5, 1, 8, 8, dtype=D, generator=torch.Generator().manual_seed(1))
    return model, x


def _final(model, x) -> torch.Tensor:
    """u(T) of ``model`` on x, computed through the model's trajectory (independently of the
    module under test)."""
    with torch.no_grad():
        return model.trajectory(x, saveat=SaveAt()).final


def _rel(u, ref) -> float:
    return float((u - ref).norm() / ref.norm())


# -- tolerance extremes ----------------------------------------------------------------------

def test_huge_tol_accepts_the_first_level(vit):
    model, x = vit
    r = adaptive_depth(model, x, 1e30)
    assert r.level.tolist() == [1] * 5 and r.converged.all()
    assert r.steps.tolist() == [2 * N0] * 5          # the finer solution u_2k is accepted
    assert r.work.tolist() == [N0 * (1 + 2)] * 5     # the grids N_t0 and 2 N_t0
    assert (r.mean_steps, r.mean_work, r.fraction_converged) == (2 * N0, 3 * N0, 1.0)
    r = adaptive_depth(model, x, 1e30, levels=(3, 6))
    assert r.level.tolist() == [3] * 5 and r.steps.tolist() == [6 * N0] * 5
    assert r.work.tolist() == [N0 * (3 + 6)] * 5
    r = adaptive_depth(model, x, 1e30, estimate="lie-strang")
    assert r.level.tolist() == [1] * 5 and r.steps.tolist() == [N0] * 5
    assert r.work.tolist() == [2 * N0] * 5           # the Lie run and the Strang run


def test_tiny_tol_converges_nowhere_and_takes_the_finest_level(vit):
    model, x = vit
    r = adaptive_depth(model, x, 1e-30, levels=(1, 2, 4, 8))
    assert not r.converged.any() and r.fraction_converged == 0.0
    assert r.level.tolist() == [8] * 5 and r.steps.tolist() == [16 * N0] * 5
    assert r.work.tolist() == [N0 * (1 + 2 + 4 + 8 + 16)] * 5  # each grid counted once
    assert torch.equal(r.estimate, r.level_estimates[-1])
    r = adaptive_depth(model, x, 1e-30, levels=(1, 2, 4), estimate="lie-strang")
    assert r.level.tolist() == [4] * 5 and r.steps.tolist() == [4 * N0] * 5
    assert r.work.tolist() == [2 * N0 * (1 + 2 + 4)] * 5 and not r.converged.any()


# -- the estimates against direct computations ------------------------------------------------

def test_doubling_estimate_equals_a_direct_computation(vit):
    model, x = vit
    levels = (1, 2, 4)
    r = adaptive_depth(model, x, 0.1, levels=levels)
    i = 3
    xi = x[i:i + 1]
    for j, k in enumerate(levels):
        direct = _rel(_final(model.refine(k), xi), _final(model.refine(2 * k), xi))
        assert math.isclose(float(r.level_estimates[j, i]), direct, rel_tol=1e-9), (k, direct)
        assert direct > 1e-4  # not trivially zero


def test_lie_strang_estimate_equals_a_direct_computation(vit):
    model, x = vit
    levels = (1, 2)
    r = adaptive_depth(model, x, 1e-30, levels=levels, estimate="lie-strang")
    lie, strang = model.with_scheme("lie"), model.with_scheme("strang")
    for j, k in enumerate(levels):
        u_lie, u_strang = _final(lie.refine(k), x), _final(strang.refine(k), x)
        # for the pre-LN ViT the Lie member is the model's own steps
        assert torch.equal(u_lie, _final(model.refine(k), x))
        for i in range(x.shape[0]):
            direct = _rel(u_lie[i], u_strang[i])
            assert math.isclose(float(r.level_estimates[j, i]), direct, rel_tol=1e-9)
        # the accepted solution is Strang's
        with torch.no_grad():
            z = strang.refine(k)(x).logits
        torch.testing.assert_close(r.level_logits[j], z, rtol=1e-12, atol=1e-12)


def test_accepted_predictions_are_those_of_the_refined_model(vit):
    model, x = vit
    levels = (1, 2, 4)
    probe = adaptive_depth(model, x, 1e30, levels=levels)
    # a tolerance between the inputs' estimates at level 2: some accept there, some later
    tol = float(probe.level_estimates[1].median())
    r = probe.at_tol(tol)
    assert len(set(r.level.tolist())) >= 2, r.level_estimates
    for i in range(x.shape[0]):
        k = int(r.level[i])
        with torch.no_grad():
            z = model.refine(2 * k)(x[i:i + 1]).logits[0]
        torch.testing.assert_close(r.logits[i], z, rtol=1e-10, atol=1e-12)
        assert int(r.predictions[i]) == int(z.argmax())
        j = levels.index(k)
        assert float(r.level_estimates[j, i]) <= tol
        assert all(float(r.level_estimates[m, i]) > tol for m in range(j))
    for j, k in enumerate(levels):
        with torch.no_grad():
            assert torch.equal(r.level_predictions[j], model.refine(2 * k)(x).logits.argmax(-1))


def test_at_tol_equals_a_fresh_run(vit):
    model, x = vit
    probe = adaptive_depth(model, x, 1e30, levels=(1, 2, 4))
    tol = float(probe.level_estimates[1].median())
    a, b = probe.at_tol(tol), adaptive_depth(model, x, tol, levels=(1, 2, 4))
    for name in ("level", "steps", "work", "predictions", "converged"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    torch.testing.assert_close(a.estimate, b.estimate)
    assert a.tol == b.tol == tol


def test_results_per_input_do_not_depend_on_the_batch(vit):
    model, x = vit
    for estimate in ESTIMATES:
        full = adaptive_depth(model, x, 1e-30, levels=(1, 2, 4), estimate=estimate)
        for i in (0, 2):
            alone = adaptive_depth(model, x[i:i + 1], 1e-30, levels=(1, 2, 4),
                                   estimate=estimate)
            torch.testing.assert_close(alone.level_estimates[:, 0], full.level_estimates[:, i],
                                       rtol=1e-10, atol=1e-14)
            torch.testing.assert_close(alone.logits[0], full.logits[i], rtol=1e-10, atol=1e-12)
        tol = float(full.level_estimates[1].median())
        perm = torch.tensor([4, 0, 3, 1, 2])
        shuffled = adaptive_depth(model, x[perm], tol, levels=(1, 2, 4), estimate=estimate)
        chosen = full.at_tol(tol)
        assert torch.equal(shuffled.level, chosen.level[perm])
        assert torch.equal(shuffled.predictions, chosen.predictions[perm])


def test_estimates_decrease_with_k_on_a_smooth_model():
    """Consistency: the smooth configuration (post-LN Encoder, tanh, projections onto S1),
    read out through a ``logits`` adapter; both estimates shrink as tau = 1 / k does."""
    model, u0 = smooth_configuration(batch=3)
    for estimate in ESTIMATES:
        r = adaptive_depth(model, u0, 1e-30, levels=(1, 2, 4), estimate=estimate,
                           logits=lambda out: out.mean(dim=1))
        e = r.level_estimates
        assert (e[0] > e[1]).all() and (e[1] > e[2]).all(), (estimate, e)
        ratio = e[0] / e[2]  # first order: e_k ~ C / k, so about 4
        assert ((ratio > 2.5) & (ratio < 6)).all(), (estimate, ratio)
        assert r.base_steps == 2 and r.logits.shape == (3, 16)


# -- models ------------------------------------------------------------------------------------

def test_the_models_mode_is_left_as_it_was():
    model = _vit(out_dropout=0.5, ffn_dropout=0.5)
    x = torch.randn(3, 1, 8, 8, dtype=D)
    model.train()
    r = adaptive_depth(model, x, 1e30, levels=(1,))
    assert all(m.training for m in model.modules())
    with torch.no_grad():
        z = model.refine(2).eval()(x).logits   # eval mode: dropout off, deterministic
    torch.testing.assert_close(r.logits, z, rtol=1e-12, atol=1e-12)
    f = fixed_depths(model, x, (1,))
    with torch.no_grad():
        torch.testing.assert_close(f.logits[0], model.refine(1).eval()(x).logits)
    assert all(m.training for m in model.modules())


def test_a_model_with_several_evolutions_counts_all_their_steps():
    """CvT: refine acts on every stage; u(T) is the last stage's; N_t0 = 1 + 2."""
    torch.manual_seed(0)
    specs = [CvtStageSpec(3, 8, 1, 1, patch_size=3, patch_stride=2),
             CvtStageSpec(8, 16, 2, 2, cls_token=True)]
    model = build_cvt(specs, num_labels=3, dtype=D).eval()
    x = torch.randn(2, 3, 16, 16, dtype=D)
    r = adaptive_depth(model, x, 1e30, levels=(1, 2))
    assert r.base_steps == 3 and r.steps.tolist() == [6, 6] and r.work.tolist() == [9, 9]
    direct = _rel(_final(model.refine(1), x[1:]), _final(model.refine(2), x[1:]))
    assert math.isclose(float(r.level_estimates[0, 1]), direct, rel_tol=1e-9)


def test_fixed_depths_and_accuracy(vit):
    model, x = vit
    f = fixed_depths(model, x, (1, 2, 4))
    assert f.steps == (N0, 2 * N0, 4 * N0) and f.base_steps == N0
    for j, k in enumerate((1, 2, 4)):
        with torch.no_grad():
            assert torch.equal(f.predictions[j], model.refine(k)(x).logits.argmax(-1))
    targets = f.predictions[1].clone()
    assert f.accuracy(targets)[1] == 1.0
    r = adaptive_depth(model, x, 1e30, levels=(1,))  # accepts u_2: the fixed depth k = 2
    assert r.accuracy(targets) == 1.0
    targets[0] = (targets[0] + 1) % 5
    assert r.accuracy(targets) == pytest.approx(4 / 5)
    assert f.accuracy(targets)[1] == pytest.approx(4 / 5)


def test_plot_writes_a_figure(vit, tmp_path):
    pytest.importorskip("matplotlib")
    model, x = vit
    probe = adaptive_depth(model, x, 1e30)
    f = fixed_depths(model, x, (1, 2, 4, 8, 16))
    path = tmp_path / "adaptive.png"
    plot([probe.at_tol(t) for t in (0.2, 0.1, 0.05)], f, f.predictions[-1], str(path))
    assert path.stat().st_size > 1000


# -- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,argument", [
    ({"tol": 0.0}, "tol"),
    ({"tol": -1e-3}, "tol"),
    ({"tol": float("nan")}, "tol"),
    ({"tol": float("inf")}, "tol"),
    ({"tol": "0.1"}, "tol"),
    ({"tol": True}, "tol"),
    ({"levels": ()}, "levels"),
    ({"levels": (2, 1)}, "levels"),
    ({"levels": (1, 1)}, "levels"),
    ({"levels": (0, 1)}, "levels"),
    ({"levels": (1, 2.0)}, "levels"),
    ({"levels": (True, 2)}, "levels"),
    ({"levels": "124"}, "levels"),
    ({"levels": 4}, "levels"),
    ({"estimate": "richardson"}, "estimate"),
    ({"estimate": None}, "estimate"),
    ({"logits": 3}, "logits"),
    ({"logits": lambda out: out.last_hidden_state}, "logits"),  # (B, N, d), not (B, classes)
    ({"inputs": [1.0]}, "inputs"),
    ({"model": nn.Linear(2, 2)}, "model"),
])
def test_bad_arguments_are_named(vit, kwargs, argument):
    model, x = vit
    args = {"model": model, "inputs": x, "tol": 0.1}
    args.update(kwargs)
    with pytest.raises(ArgumentError) as e:
        adaptive_depth(args.pop("model"), args.pop("inputs"), args.pop("tol"), **args)
    assert e.value.argument == argument
    if argument == "estimate":
        assert "doubling" in str(e.value) and "lie-strang" in str(e.value)


def test_bad_arguments_of_fixed_depths_and_accuracy(vit):
    model, x = vit
    with pytest.raises(ArgumentError, match="^levels"):
        fixed_depths(model, x, (4, 2))
    with pytest.raises(ArgumentError, match="^model"):
        fixed_depths(object(), x)
    r = adaptive_depth(model, x, 1e30, levels=(1,))
    for targets in (torch.zeros(4, dtype=torch.long), torch.zeros(5), [0] * 5):
        with pytest.raises(ArgumentError, match="^targets"):
            r.accuracy(targets)


def test_a_model_without_a_layout_is_refused_for_lie_strang():
    torch.manual_seed(0)
    model = paper_encoder(8, 2, 16, 2, dtype=D).eval()
    u0 = torch.randn(2, 3, 8, dtype=D)
    with pytest.raises(ArgumentError, match="^estimate: .*doubling"):
        adaptive_depth(model, u0, 0.1, levels=(1,), estimate="lie-strang",
                       logits=lambda o: o.mean(1))


def test_non_finite_parameters_are_refused(vit):
    model = _vit()
    with torch.no_grad():
        model.evolution.controls[0]["ffn"].parameters().__next__().fill_(float("nan"))
    with pytest.raises(ArgumentError, match="^model"):
        adaptive_depth(model, vit[1], 0.1)


def test_a_non_finite_state_names_the_level(vit):
    model, x = vit
    x = x.clone()
    x[2, 0, 0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"level k = 1 \(N_t = 2.*1 of 5 inputs"):
        adaptive_depth(model, x, 0.1)
    with pytest.raises(NonFiniteError, match=r"level k = 2 \(N_t = 4"):
        fixed_depths(model, x, (2,))
