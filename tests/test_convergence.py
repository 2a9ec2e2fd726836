"""Convergence in tau on the documented smooth configuration (docs/math.md 3.4, 3.5)."""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch

from splitformer.analysis.convergence import (
    configuration,
    convergence,
    fit_order,
    reference_solution,
)
from splitformer.cli import main
from splitformer.time import Evolution, NonFiniteError
from splitformer.verification.references import post_ln_reference

# the module (the package's name 'convergence' is the function)
conv_mod = importlib.import_module("splitformer.analysis.convergence")


@pytest.fixture(scope="module")
def smooth():
    model, u0 = configuration("smooth")
    return model, u0, reference_solution(model, u0, ref_k=8)


def test_fit_order_recovers_a_power_law():
    taus = [2.0**-k for k in range(1, 7)]
    assert abs(fit_order(taus, [3 * t**2 for t in taus]) - 2) < 1e-12
    assert abs(fit_order(taus, [0.5 * t for t in taus]) - 1) < 1e-12


@pytest.mark.parametrize("scheme,integrator,form,lo,hi", [
    ("lie", "euler", "raw", 0.9, 1.1),
    ("strang", "heun", "tangent", 1.8, 2.2),
    ("strang", "heun", "raw", 0.8, 1.3),   # raw-field substeps: first order (docs/math.md 3.5)
    ("parallel", "euler", "raw", 0.9, 1.1),
])
def test_observed_orders(smooth, scheme, integrator, form, lo, hi):
    model, u0, u_ref = smooth
    r = convergence(model, u0, scheme=scheme, integrator=integrator, form=form, ks=(2, 3, 4, 5),
                    ref_k=8, u_ref=u_ref)
    assert lo <= r.order <= hi, (r.order, r.errors)
    assert all(a > b for a, b in zip(r.errors, r.errors[1:], strict=False))


def test_all_projected_schemes_share_the_projected_ode_limit(smooth):
    """Lie and Strang (raw or tangent) approach the same u(T): the projected ODE's."""
    model, u0, u_ref = smooth
    with torch.no_grad():
        for scheme, form in (("lie", "raw"), ("strang", "tangent")):
            evo = model.evolution.with_scheme(scheme, integrator="heun", form=form)
            assert (evo.refine(64)(u0) - u_ref).abs().max() < 5e-2


def test_smooth_configuration_at_tau_1_is_a_torch_encoder(smooth):
    """At tau = 1 the raw-form Lie scheme of the smooth configuration is a post-LN torch.nn
    encoder (tanh FFN, LayerNorm with eps = 0, gain 1, bias 0); the tangent form is not."""
    model, u0, _ = smooth
    # SphereProjection(0, 1) norms are LayerNorm with eps = 0, gain 1, bias 0
    enc = post_ln_reference(model.evolution.controls, torch.float64, activation=torch.tanh)
    with torch.no_grad():
        ref = enc(u0)
        raw = model.evolution.with_scheme("lie", integrator="euler", form="raw")(u0)
        tan = model.evolution.with_scheme("lie", integrator="euler", form="tangent")(u0)
    assert (raw - ref).abs().max() < 1e-10
    assert (tan - ref).abs().max() > 1e-3  # the two forms differ at tau = 1


def test_prenorm_converges_to_its_own_ode():
    model, u0 = configuration("smooth")
    r = convergence(model, u0, scheme="prenorm", ks=(2, 3, 4), ref_k=7)
    assert "same scheme" in r.reference
    assert 0.85 <= r.order <= 1.15


def test_bad_arguments():
    model, u0 = configuration("smooth")
    with pytest.raises(ValueError, match="ks: every k must be below ref_k 10"):
        convergence(model, u0, ks=(3, 12), ref_k=10)
    with pytest.raises(ValueError, match="form must be"):
        convergence(model, u0, form="sideways")
    with pytest.raises(ValueError, match="no projection substeps"):
        convergence(model, u0, scheme="prenorm", form="tangent")
    with pytest.raises(ValueError, match="configuration must be"):
        configuration("nonesuch")


def test_cli_json_and_plot(tmp_path, capsys):
    out_png = tmp_path / "c.png"
    rc = main(["convergence", "--scheme", "strang", "--integrator", "rk2", "--substep-form",
               "tangent", "--ks", "2-4", "--ref-k", "7", "--json", "--plot", str(out_png)])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["scheme"] == "strang" and len(data["errors"]) == 3
    assert 1.8 <= data["order"] <= 2.2
    assert out_png.stat().st_size > 10_000


@pytest.mark.slow
def test_issue_bars_with_the_default_cli_run(capsys):
    """The bars of issue 4, with the command's defaults (ks 1-6, reference 2^-10)."""
    main(["convergence", "--scheme", "lie", "--json"])
    lie = json.loads(capsys.readouterr().out)
    main(["convergence", "--scheme", "strang", "--integrator", "rk2", "--substep-form",
          "tangent", "--json"])
    strang = json.loads(capsys.readouterr().out)
    assert 0.9 <= lie["order"] <= 1.1
    assert 1.8 <= strang["order"] <= 2.2


def test_api_options_default_to_the_schemes_own_and_strings_are_schemes(smooth):
    """convergence(scheme=name) is model.with_scheme(name): Strang is Heun unless told; a scheme
    string or Scheme is taken as written (integrator/form are options of names only)."""
    model, u0, u_ref = smooth
    kw = dict(ks=(2, 3), ref_k=8, u_ref=u_ref)
    r = convergence(model, u0, scheme="strang", **kw)
    assert (r.integrator, r.form) == ("heun", "raw")
    assert r.errors == convergence(model, u0, scheme="strang", integrator="heun", **kw).errors
    text = convergence(model, u0, scheme="attention norm1:project ffn norm2:project", **kw)
    assert text.errors == convergence(model, u0, scheme="lie", **kw).errors
    assert text.integrator is None and text.form is None
    with pytest.raises(ValueError, match="options of the named schemes"):
        convergence(model, u0, scheme="attention norm1:project ffn norm2:project",
                    integrator="heun", **kw)
    with pytest.raises(ValueError, match="ks: expected k values that increase without repeats"):
        convergence(model, u0, ks=(2, 2), ref_k=8)
    assert math.isnan(fit_order([0.5, 0.5], [0.1, 0.1]))  # one tau twice: no slope


# -- the API's checks (shared with the CLI): an ArgumentError naming the argument -----------
# (ArgumentError, splitformer.analysis.ArgumentError, is a ValueError with .argument, .detail)

def _nan_u0(u0):
    bad = u0.clone()
    bad[0, 0, 0] = float("nan")
    return bad


@pytest.mark.parametrize("change,argument,needle", [
    (lambda u0: {"u0": _nan_u0(u0)}, "u0", "expected finite values, got 1 NaN"),
    (lambda u0: {"u0": None}, "u0", "expected a torch.Tensor of shape (batch, tokens, 16)"),
    (lambda u0: {"u0": u0[..., :8]}, "u0", "expected shape (batch, tokens, 16), got (2, 6, 8)"),
    (lambda u0: {"u0": u0[0]}, "u0", "expected shape (batch, tokens, 16), got (6, 16)"),
    (lambda u0: {"u0": u0.float()}, "u0", "expected dtype torch.float64"),
    (lambda u0: {"ref_k": 2.5}, "ref_k", "expected an integer in [1, 16]"),
    (lambda u0: {"ref_k": "5"}, "ref_k", "got '5'"),
    (lambda u0: {"ref_k": True}, "ref_k", "got True"),
    (lambda u0: {"ref_k": 40}, "ref_k", "got 40"),
    (lambda u0: {"ks": (1,)}, "ks", "at least two k values"),
    (lambda u0: {"ks": (2, 1)}, "ks", "increase without repeats"),
    (lambda u0: {"ks": (1, 2.5)}, "ks", "got 2.5"),
    (lambda u0: {"ks": "12"}, "ks", "a sequence of integers"),
    (lambda u0: {"ks": (-1, 2)}, "ks", "got -1"),
    (lambda u0: {"u_ref": u0[:, :5]}, "u_ref", "of shape (2, 6, 16), got (2, 5, 16)"),
    (lambda u0: {"u_ref": _nan_u0(u0)}, "u_ref", "expected finite values"),
    (lambda u0: {"u_ref": "u"}, "u_ref", "expected a torch.Tensor"),
    (lambda u0: {"reference": "nope"}, "reference", "expected one of auto, projected-ode"),
    (lambda u0: {"scheme": "prenorm", "reference": "projected-ode"}, "reference",
     "operators composed inside them"),
    (lambda u0: {"scheme": "attention norm1:project"}, "scheme",
     "does not use the model's field operator ffn"),
])
def test_api_refuses_bad_inputs_naming_the_argument(monkeypatch, change, argument, needle):
    """Every check runs before any run (no reference, no refined run), naming the argument."""
    model, u0 = configuration("smooth")

    def fail(*args, **kwargs):
        raise AssertionError("a run started before the inputs were checked")

    monkeypatch.setattr(conv_mod, "_run", fail)
    kw = {"u0": u0, "ks": (2, 3), "ref_k": 5, **change(u0)}
    with pytest.raises(ValueError) as exc:
        convergence(model, kw.pop("u0"), **kw)
    assert getattr(exc.value, "argument", None) == argument, exc.value
    assert str(exc.value).startswith(f"{argument}: ") and needle in exc.value.detail, exc.value


def test_api_refuses_distinct_sets_for_the_projected_ode():
    """trained-s-like: the two norms project onto different S1 sets, so the projected ODE is not
    the limit; 'auto' picks the same scheme, 'projected-ode' is refused."""
    model, u0 = configuration("smooth")
    with torch.no_grad():
        model.evolution.controls[0]["norm2"].s2.fill_(2.0)
    with pytest.raises(ValueError, match="not one and the same constraint set"):
        convergence(model, u0, ks=(2, 3), ref_k=5, reference="projected-ode")
    assert "same scheme" in convergence(model, u0, ks=(2, 3), ref_k=5).reference


def test_nan_weights_are_refused():
    model, u0 = configuration("smooth")
    with torch.no_grad():
        next(model.evolution.controls[1]["ffn"].parameters()).view(-1)[0] = float("inf")
    with pytest.raises(ValueError, match="model: expected finite parameters"):
        convergence(model, u0, ks=(2, 3), ref_k=5)


def test_non_finite_results_raise_instead_of_nan(monkeypatch):
    """No NaN order or errors: a reference or a run that is not finite, or errors all at
    round-off, raise NonFiniteError saying which."""
    model, u0 = configuration("smooth")
    kw = dict(ks=(2, 3), ref_k=5)
    real_ref = conv_mod.reference_solution
    monkeypatch.setattr(conv_mod, "reference_solution",
                        lambda evo, u, *a, **k: torch.full_like(u, float("nan")))
    with pytest.raises(NonFiniteError, match="the reference u"):
        convergence(model, u0, **kw)
    monkeypatch.setattr(conv_mod, "reference_solution", real_ref)
    real_run = conv_mod._run
    monkeypatch.setattr(conv_mod, "_run",
                        lambda evo, u, ctx=None: real_run(evo, u, ctx)
                        * (float("inf") if evo.tau > 0.2 else 1))
    with pytest.raises(NonFiniteError, match="tau = 2\\^-2 is not finite"):
        convergence(model, u0, **kw)
    monkeypatch.setattr(conv_mod, "_run", real_run)
    with torch.no_grad():  # no fields: u(T) = u0 for every tau, errors at round-off
        for theta in model.evolution.controls:
            for name in ("attention", "ffn"):
                for p in theta[name].parameters():
                    p.zero_()
    with pytest.raises(NonFiniteError, match="no order to fit"):
        convergence(model, u0, **kw)


def test_configuration_seed_is_range_checked():
    with pytest.raises(ValueError, match="seed: expected an integer in"):
        configuration("smooth", seed=99999999999999999999999)
    with pytest.raises(ValueError, match="seed: "):
        configuration("smooth", seed=1.5)
    configuration("smooth", seed=2**64 - 1)  # torch's range, all of it


def test_the_order_of_a_causal_evolution_keeps_its_causal_support():
    """convergence(..., context=) runs every tau with the inputs' context: for a GPT-2-shaped
    decoder the causal support changes u(T), and the errors are those of the causal runs."""
    from splitformer.models import causal_decoder
    from splitformer.time import TimeGrid

    torch.manual_seed(0)
    model = causal_decoder(20, 8, 16, 2, 2, ffn_dim=32).eval()
    ids = torch.randint(0, 20, (2, 8))
    with torch.no_grad():
        u0, ctx = model.initial_condition(input_ids=ids)
    assert ctx.is_causal
    evo = model.evolution
    res = convergence(evo, u0, scheme=evo.scheme, ks=(0, 1), ref_k=3, reference="same-scheme",
                      context=ctx)
    with torch.no_grad():
        unit = Evolution(evo.controls, evo.scheme, TimeGrid(2, 2))
        ref = unit.refine(8)(u0, ctx)
        err = (unit.refine(2)(u0, ctx) - ref).abs().max().item()
        full = (unit.refine(2)(u0) - unit.refine(8)(u0)).abs().max().item()
    assert res.errors[1] == pytest.approx(err, rel=1e-6) and abs(full - err) > 1e-6
