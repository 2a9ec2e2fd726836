"""Convergence in tau on the documented smooth configuration (docs/math.md 3.4, 3.5)."""

from __future__ import annotations

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
from splitformer.verification.references import post_ln_reference


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
    with pytest.raises(ValueError, match="ks must be"):
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
    with pytest.raises(ValueError, match="ks must be distinct"):
        convergence(model, u0, ks=(2, 2), ref_k=8)
    assert math.isnan(fit_order([0.5, 0.5], [0.1, 0.1]))  # one tau twice: no slope
