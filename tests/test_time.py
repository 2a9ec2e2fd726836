"""Time: grids, controls, schemes as data, the evolution and its trajectory, validation mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitformer
from splitformer.time import (
    Controls,
    Evolution,
    NonFiniteError,
    Scheme,
    Stage,
    TimeGrid,
    lie,
    prenorm,
    resolve,
    scheme_from_string,
)


def test_grid():
    g = TimeGrid(6, 6)
    assert g.tau == 1.0 and g.refine(4).tau == 0.25 and g.refine(4).num_steps == 24
    assert torch.allclose(g.times(), torch.arange(7, dtype=torch.float64))
    with pytest.raises(ValueError, match="num_steps"):
        TimeGrid(1.0, 0)
    with pytest.raises(ValueError, match="k must"):
        g.refine(0)


def test_controls_are_piecewise_constant():
    c = Controls([{"a": nn.Identity()} for _ in range(3)])
    assert c.T == 3.0
    assert c.at(0.0) is c[0] and c.at(1.0) is c[0] and c.at(1.01) is c[1] and c.at(3.0) is c[2]
    assert [c.at((i + 0.5) * 0.25) for i in range(12)] == [c[0]] * 4 + [c[1]] * 4 + [c[2]] * 4
    lin = c.with_interpolation("linear")
    assert lin.at(0.3) is c[0] and lin.at(1.5) is c[1] and lin.at(2.9) is c[2]
    assert set(lin.at(1.0)) == {"a"}  # between midpoints 1/2 and 3/2: an interpolant


def test_scheme_string_round_trip():
    for text in ["attention norm1:project ffn norm2:project", "norm1>attention norm2>ffn",
                 "attention norm1:project@U2 ffn1|relu ffn2 relax(U2,0.5) norm2:project",
                 "norm2>ffn*0.5 norm1>attention:rk4 norm2>ffn<ls2:heun*0.5"]:
        s = scheme_from_string(text)
        assert str(s) == text
        assert scheme_from_string(str(s)).stages == s.stages
    assert str(lie()) == "attention norm1:project ffn norm2:project"
    assert resolve("prenorm") == prenorm()
    with pytest.raises(ValueError, match="unknown scheme"):
        resolve("nonesuch")
    with pytest.raises(ValueError, match="relax"):
        Scheme((Stage("X", "relax"),))
    with pytest.raises(ValueError, match="integrator"):
        Stage("attention", "midpoint")


def _model(dtype=torch.float64):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, dtype=dtype)
    return splitformer.from_torch(nn.TransformerEncoder(layer, 3, enable_nested_tensor=False))


def test_user_written_scheme_equals_the_named_one():
    m = _model().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    custom = m.with_scheme("attention norm1:project ffn norm2:project")
    with torch.no_grad():
        assert torch.equal(custom(x), m(x))


def test_trajectory_and_refine():
    m = _model().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        traj = m.trajectory(x)
        assert len(traj) == 4 and torch.equal(traj.states[0], x)
        assert torch.allclose(traj.final, m(x))
        assert torch.allclose(traj.times, torch.arange(4, dtype=torch.float64))
        r = m.refine(2)
        tr = r.trajectory(x)
        assert len(tr) == 7 and r.evolution.tau == 0.5
        assert not torch.allclose(tr.final, traj.final)  # a different discretisation
        # one refined step uses tau/2 of the first control set: check the first substep by hand
        theta = m.evolution.controls[0]
        u = x + 0.5 * theta["attention"](x)
        u = theta["norm1"](u)
        u = theta["norm2"](u + 0.5 * theta["ffn"](u))
        assert torch.allclose(tr.states[1], u)


def test_refine_converges():
    """Halving tau repeatedly: successive differences shrink (the discretisation converges)."""
    m = _model().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        outs = [m.refine(k)(x) for k in (8, 16, 32, 64)]
    d = [(a - b).abs().max().item() for a, b in zip(outs[:-1], outs[1:], strict=True)]
    assert d[0] > d[1] > d[2]


def test_validation_mode_names_the_substep():
    m = _model()
    with torch.no_grad():
        m.evolution.controls[1]["ffn"].stages[1].bias[0] = float("nan")
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    assert torch.isnan(m(x)).any()  # the hot path does not check
    m.validating(True)
    with pytest.raises(NonFiniteError, match=r"step 1 .*substep 2 'ffn'"):
        m(x)


def test_evolution_checks_controls():
    c = Controls([{"attention": nn.Identity()}])
    with pytest.raises(ValueError, match=r"needs operators \['norm1'"):
        Evolution(c, "lie")
    with pytest.raises(TypeError, match="controls"):
        Evolution([{}], "lie")


def test_linear_controls_blend_the_layers():
    """Piecewise linear controls: tau = 1 is the network; a step with midpoint 3/4 uses
    (3/4) theta^1 + (1/4) theta^2 (checked against a torch layer holding the blended weights)."""
    import copy

    torch.manual_seed(7)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.0, batch_first=True, dtype=torch.float64), 2,
        enable_nested_tensor=False).eval()
    with torch.no_grad():
        for lyr in enc.layers:  # distinct layers (the encoder deep-copies one)
            for p in lyr.parameters():
                p.add_(0.3 * torch.randn_like(p))
    m = splitformer.from_torch(enc).with_controls_in_time("linear").eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    blend = copy.deepcopy(enc.layers[0])
    with torch.no_grad():
        assert (m(x) - enc(x)).abs().max() < 1e-12
        for pb, p0, p1 in zip(blend.parameters(), enc.layers[0].parameters(),
                              enc.layers[1].parameters(), strict=True):
            pb.copy_(0.75 * p0 + 0.25 * p1)
        tr = m.refine(2).trajectory(x)  # steps centred at 1/4, 3/4, 5/4, 7/4
        u = blend.norm1(tr.states[1] + 0.5 * blend.self_attn(*[tr.states[1]] * 3)[0])
        u = blend.norm2(u + 0.5 * blend.linear2(torch.relu(blend.linear1(u))))
        assert (tr.states[2] - u).abs().max() < 1e-12


def test_named_schemes_keep_the_field_order():
    """Rebuilding a named scheme on a Strang scheme keeps attention first (the layout travels
    with the scheme; the Strang stage order starts with the FFN)."""
    m = _model()
    back = m.with_scheme("strang").with_scheme("lie")
    assert back.evolution.scheme.stages == lie().stages


def test_saveat_keeps_what_it_asks_for():
    """SaveAt is the one way to say what a trajectory keeps: every grid point, chosen times,
    every substep; u(T) always. A substep record is the state after that stage, and the last
    substep of step i is u(t_{i+1}) (checked against a torch.nn layer applied by hand)."""
    from splitformer.time import SaveAt

    torch.manual_seed(3)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                       dtype=torch.float64)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    m = splitformer.from_torch(enc).eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    fine = m.refine(2)
    with torch.no_grad():
        every = fine.trajectory(x)
        some = fine.trajectory(x, saveat=SaveAt(ts=(0.0, 1.5, 2.0)))
        subs = m.trajectory(x, saveat=SaveAt(steps=True, substeps=True))
        first = enc.layers[0]
        a = first.norm1(x + first.self_attn(x, x, x)[0])
    assert every.times.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert some.times.tolist() == [0.0, 1.5, 2.0] and torch.equal(some.states[1], every.states[3])
    assert torch.equal(some.final, every.final)
    with torch.no_grad():
        assert torch.equal(subs.final, m(x))
    assert [(s.step, s.stage) for s in subs.substeps] == [(i, j) for i in range(2)
                                                          for j in range(4)]
    assert subs.substeps[1].label == "norm1:project"
    assert (subs.substeps[1].state - a).abs().max() < 1e-12  # u after attention + P1, layer 1
    assert torch.equal(subs.substeps[3].state, subs.states[1])
    with pytest.raises(ValueError, match="not a grid point"):
        fine.trajectory(x, saveat=SaveAt(ts=(0.25,)))
    with pytest.raises(TypeError, match="saveat must be a SaveAt"):
        m.evolution(x, None, "steps")
