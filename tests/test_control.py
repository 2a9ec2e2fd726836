"""The control problem (splitformer.control): running costs with known values, the objective's
parts, adjoints as values (checkpoint and reversible gradients against backprop), the
reversible scheme, and bad input refused naming the argument."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import splitformer
from splitformer.control import (
    Backprop,
    Checkpoint,
    ControlProblem,
    ControlRegularity,
    KineticEnergy,
    Objective,
    Reversible,
    ReversibleScheme,
    adjoint_names,
    set_adjoint,
    with_adjoint,
)
from splitformer.models import EvolutionModel, build_vit, causal_decoder, encoder_decoder
from splitformer.models.cvt import CvtStageSpec, build_cvt
from splitformer.operators import Operator
from splitformer.operators.base import Context
from splitformer.time import (
    Controls,
    Evolution,
    SaveAt,
    Scheme,
    Stage,
    TimeGrid,
    Trajectory,
    scheme_names,
)

D = torch.float64


# -- small models -------------------------------------------------------------------------------
def _vit(dropout: float = 0.0, depth: int = 3):
    torch.manual_seed(0)
    m = build_vit(image_size=8, patch_size=4, in_chans=3, dim=16, depth=depth, num_heads=2,
                  hidden_dim=24, num_classes=3, read_out="timm", attn_dropout=dropout,
                  out_dropout=dropout, dtype=D)
    return m, (torch.randn(2, 3, 8, 8, dtype=D),), torch.tensor([0, 2])


def _gpt2(dropout: float = 0.0):
    torch.manual_seed(0)
    m = causal_decoder(31, 12, 16, 2, 3, lm_head=True, attn_dropout=dropout,
                       resid_dropout=dropout, dtype=D)
    ids = torch.randint(0, 31, (2, 6))
    return m, (ids,), ids


def _strang(dropout: float = 0.0):
    """A post-LN encoder under Strang (Heun substeps), refined to tau = 1/2."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=dropout, batch_first=True, dtype=D)
    m = splitformer.from_torch(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
    m = m.with_scheme("strang").refine(2)
    assert m.evolution.tau == 0.5 and m.evolution.scheme.name == "strang"
    return m, (torch.randn(2, 5, 16, dtype=D),), torch.randn(2, 5, 16, dtype=D)


def _cvt():
    torch.manual_seed(0)
    specs = [CvtStageSpec(3, 8, 1, 1, patch_size=3, patch_stride=2),
             CvtStageSpec(8, 16, 2, 2, cls_token=True)]
    return build_cvt(specs, num_labels=3, dtype=D), (torch.randn(2, 3, 16, 16, dtype=D),), \
        torch.tensor([1, 0])


def _pair():
    torch.manual_seed(0)
    m = encoder_decoder(16, 2, 2, 2, 24, dtype=D)
    return m, (torch.randn(2, 5, 16, dtype=D), torch.randn(2, 4, 16, dtype=D)), \
        torch.randn(2, 4, 16, dtype=D)


def _lm_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def _loss(out, target):
    if target.is_floating_point():
        return (_logits(out) - target).pow(2).mean()
    logits = _logits(out)
    if logits.dim() == 3:
        return _lm_loss(logits, target)
    return F.cross_entropy(logits, target)


CASES = {"vit": _vit, "gpt2": _gpt2, "strang_tau_half": _strang}


def _gradients(model, inputs, target, costs=(), seed=1):
    """Gradients of J with respect to every parameter (None where unused), and J."""
    problem = ControlProblem(model, _loss, costs)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    obj = problem(inputs, target)
    obj.total.backward()
    return [p.grad.clone() if p.grad is not None else None for p in model.parameters()], obj


def _max_rel(gs, refs) -> float:
    """max over the parameters of |g - r|_inf / max(|r|_inf, 1e-6 max_k |r_k|_inf): relative
    per tensor, with a floor for tensors whose exact gradient is zero (a key bias under the
    softmax) and whose computed one is round-off."""
    assert [g is None for g in gs] == [r is None for r in refs]
    pairs = [(g, r) for g, r in zip(gs, refs, strict=True) if r is not None]
    scale = max(r.abs().max().item() for _, r in pairs)
    return max(((g - r).abs().max() / max(r.abs().max().item(), 1e-6 * scale)).item()
               for g, r in pairs)


# -- 1. running costs: known answers ------------------------------------------------------------
def _path(states, tau):
    times = torch.arange(len(states), dtype=D) * tau
    return Trajectory(times, tuple(states), states[-1])


def test_kinetic_energy_of_a_constant_path_is_zero():
    u = torch.randn(3, 4, 5, dtype=D)
    assert KineticEnergy(2.0)(None, _path([u] * 7, 0.25)).item() == 0.0


def test_kinetic_energy_of_a_linear_path():
    """u^n = u0 + n tau c: sum_n tau |c|^2 = T |c|^2, |c|^2 = mean_b sum_{x,y} c^2."""
    torch.manual_seed(0)
    u0, c = torch.randn(3, 4, 5, dtype=D), torch.randn(3, 4, 5, dtype=D)
    tau, n = 0.25, 8
    path = _path([u0 + i * tau * c for i in range(n + 1)], tau)
    c2 = c.pow(2).sum(dim=(1, 2)).mean()
    assert torch.allclose(KineticEnergy(1.0)(None, path), n * tau * c2, rtol=1e-12)
    assert torch.allclose(KineticEnergy(0.5)(None, path), 0.5 * n * tau * c2, rtol=1e-12)


class _Drift(Operator):
    """A field that is the constant c, whatever u: the path is u0 + t c."""

    kind = "field"

    def __init__(self, c: torch.Tensor) -> None:
        super().__init__()
        self.c = nn.Parameter(c)

    def forward(self, u, context=None):
        return self.c.expand_as(u)


class _Tiny(EvolutionModel):
    """initial_condition: u0 = x; read-out: the mean over tokens."""

    def __init__(self, evolution: Evolution) -> None:
        super().__init__()
        self.evolution = evolution

    def initial_condition(self, x):
        return x, Context()

    def read_out(self, u, context):
        return u.mean(dim=1)


def _drift_model(cs, steps):
    controls = Controls([{"drift": _Drift(c)} for c in cs])
    scheme = Scheme((Stage("drift"),))
    return _Tiny(Evolution(controls, scheme, TimeGrid(len(cs), steps)))


def test_kinetic_energy_on_a_model_with_a_known_path():
    """dX/dt = c on [0, 2] (two equal control sets), tau = 1/4: the Euler path is exactly
    linear, and the objective's kinetic part is T |c|^2 (c broadcast over the batch)."""
    torch.manual_seed(0)
    c = torch.randn(4, 5, dtype=D)
    model = _drift_model([c, c.clone()], 8)
    problem = ControlProblem(model, lambda out, t: (out - t).pow(2).mean(), [KineticEnergy(3.0)])
    obj = problem(torch.randn(2, 4, 5, dtype=D), torch.zeros(2, 5, dtype=D))
    assert torch.allclose(obj.parts["kinetic"], 3.0 * 2.0 * c.pow(2).sum(), rtol=1e-10)


def test_kinetic_energy_of_a_model_at_rest_is_zero():
    """A ViT whose fields are zero (attention output and last FFN layer zeroed) stays at u0."""
    model, inputs, target = _vit()
    with torch.no_grad():
        for theta in model.evolution.controls:
            theta["attention"].out_weight.zero_()
            theta["attention"].out_bias.zero_()
            theta["ffn"].stages[-1].weight.zero_()
            theta["ffn"].stages[-1].bias.zero_()
    obj = ControlProblem(model.refine(2), _loss, [KineticEnergy(1.0)])(inputs, target)
    assert obj.parts["kinetic"].item() == 0.0


def test_control_regularity_known_values():
    """theta^m = m c: sum_{m=1}^{L-1} |c|^2 = (L - 1)|c|^2, whatever tau; identical sets: 0."""
    c = torch.randn(4, 5, dtype=D)
    model = _drift_model([m * c for m in (1.0, 2.0, 3.0, 4.0)], 4)
    want = 3 * c.pow(2).sum()
    assert torch.allclose(ControlRegularity(1.0)(model), want, rtol=1e-12)
    assert torch.allclose(ControlRegularity(0.1)(model.refine(6)), 0.1 * want, rtol=1e-12)
    same = _drift_model([c.clone() for _ in range(3)], 3)
    assert ControlRegularity(1.0)(same).item() == 0.0


def test_control_regularity_of_identical_control_sets_of_a_vit_is_zero():
    model, inputs, target = _vit()
    sets = list(model.evolution.controls)
    assert ControlRegularity(1.0)(model).item() > 0
    for s in sets[1:]:
        s.load_state_dict(sets[0].state_dict())
    assert ControlRegularity(1.0)(model).item() == 0.0
    assert ControlRegularity(1.0)(model.refine(4)).item() == 0.0


def test_control_regularity_sums_every_evolution():
    """CvT has one evolution per stage: the regularity is the sum over both."""
    model, _, _ = _cvt()
    per = [ControlRegularity(1.0)(o.evolution) for o in model.evolution_owners()]
    assert torch.allclose(ControlRegularity(1.0)(model), sum(per))


# -- 2. the objective -----------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_objective_parts_add_up_to_the_total(case):
    model, inputs, target = CASES[case]()
    costs = [KineticEnergy(0.3), ControlRegularity(0.02)]
    obj = ControlProblem(model, _loss, costs)(inputs, target)
    assert isinstance(obj, Objective)
    assert list(obj.parts) == ["terminal", "kinetic", "control_regularity"]
    assert obj.terminal is obj.parts["terminal"] and obj.total.dim() == 0
    assert torch.allclose(obj.total, sum(obj.parts.values()), rtol=0, atol=1e-12)
    assert obj.parts["terminal"].item() > 0 and obj.parts["kinetic"].item() > 0
    assert obj.parts["control_regularity"].item() >= 0  # 0: torch's encoder clones its layer
    # the terminal part is the model's own forward pass and loss
    model.eval()
    plain = ControlProblem(model, _loss)(inputs, target)
    assert torch.equal(plain.total, plain.terminal)
    with torch.no_grad():
        assert torch.allclose(plain.terminal, _loss(model(*inputs), target), rtol=1e-13)


def test_zero_weight_costs_nothing_and_keeps_no_path():
    model, inputs, target = _vit()
    problem = ControlProblem(model, _loss, [KineticEnergy(0.0)])
    assert not problem.needs_path
    obj = problem(inputs, target)
    assert obj.parts["kinetic"].item() == 0.0 and torch.equal(obj.total, obj.terminal)


def test_logits_adapter_and_keyword_inputs_and_hidden_states():
    """A read-out that is not a tensor goes through ``logits``; dict inputs are keywords; a
    model that asks for its hidden states still gets them (as many as without the cost)."""
    model, (ids,), _ = _gpt2()
    problem = ControlProblem(model, _lm_loss, [KineticEnergy(1.0)], logits=lambda o: o.logits)
    obj = problem({"input_ids": ids, "output_hidden_states": True}, ids)
    ref = model(input_ids=ids, output_hidden_states=True)
    assert len(obj.output.hidden_states) == len(ref.hidden_states)
    for a, b in zip(obj.output.hidden_states, ref.hidden_states, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_a_plain_module_has_a_terminal_loss_only():
    lin = nn.Linear(3, 2, dtype=D)
    obj = ControlProblem(lin, F.cross_entropy)(torch.randn(4, 3, dtype=D), torch.tensor([0, 1, 1,
                                                                                          0]))
    assert list(obj.parts) == ["terminal"]


def test_the_problem_is_a_module_over_the_models_parameters():
    model, inputs, target = _vit()
    problem = ControlProblem(model, _loss)
    assert [id(p) for p in problem.parameters()] == [id(p) for p in model.parameters()]
    problem.eval()
    assert not model.training
    problem.train()
    assert model.training


# -- 3. adjoints: gradients -----------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_checkpoint_gradients_equal_backprop(case, dropout):
    """Same seed, same dropout masks: checkpoint's gradients are backprop's to round-off
    (with the kinetic energy, which keeps the path, and without)."""
    model, inputs, target = CASES[case](dropout)
    model.train()
    for costs in ((), (KineticEnergy(0.1), ControlRegularity(0.01))):
        ref, obj_ref = _gradients(model, inputs, target, costs)
        set_adjoint(model, "checkpoint")
        got, obj = _gradients(model, inputs, target, costs)
        set_adjoint(model, "backprop")
        assert torch.equal(obj.total, obj_ref.total)
        assert _max_rel(got, ref) <= 1e-13, (case, dropout, costs)


def test_checkpoint_restores_batchnorm_statistics_and_matches_backprop():
    """CvT in train mode updates BatchNorm's running statistics: the recomputation must not
    update them a second time."""
    model, inputs, target = _cvt()
    model.train()
    start = copy.deepcopy(model.state_dict())
    ref, _ = _gradients(model, inputs, target)
    after_backprop = copy.deepcopy(model.state_dict())
    model.load_state_dict(start)
    set_adjoint(model, "checkpoint")
    assert all(o.evolution.adjoint == Checkpoint() for o in model.evolution_owners())
    got, _ = _gradients(model, inputs, target)
    assert _max_rel(got, ref) <= 1e-13
    for k, v in model.state_dict().items():
        assert torch.equal(v, after_backprop[k]), k


@pytest.mark.parametrize("case", ["vit", "gpt2", "strang_tau_half"])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_reversible_gradients_equal_backprop_of_the_reversible_scheme(case, dropout):
    """adjoint 'reversible' (steps inverted in the backward pass) against backprop of the same
    reversible scheme: within 1e-8 relative in float64, with and without a path cost."""
    model, inputs, target = CASES[case](dropout)
    model = model.with_scheme("reversible").refine(2)
    model.train()
    for costs in ((), (KineticEnergy(0.1),)):
        ref, obj_ref = _gradients(model, inputs, target, costs)
        set_adjoint(model, "reversible")
        got, obj = _gradients(model, inputs, target, costs)
        set_adjoint(model, "checkpoint")
        chk, _ = _gradients(model, inputs, target, costs)
        set_adjoint(model, "backprop")
        assert torch.allclose(obj.total, obj_ref.total, rtol=1e-13)
        assert _max_rel(got, ref) <= 1e-8, (case, dropout, costs)
        assert _max_rel(chk, ref) <= 1e-13


def test_reversible_adjoint_with_linear_controls_cross_attention_and_batchnorm():
    """Controls linear in t (lerped parameters), a decoder reading the encoder's memory (a
    context tensor that needs a gradient), and CvT's BatchNorm in train mode."""
    for build in (_vit, _pair, _cvt):
        model, inputs, target = build()
        model = model.with_scheme("reversible").with_controls_in_time("linear").refine(2)
        model.train()
        start = copy.deepcopy(model.state_dict())
        ref, _ = _gradients(model, inputs, target)
        after = copy.deepcopy(model.state_dict())
        model.load_state_dict(start)
        set_adjoint(model, "reversible")
        got, _ = _gradients(model, inputs, target)
        assert _max_rel(got, ref) <= 1e-8, build.__name__
        for k, v in model.state_dict().items():
            assert torch.equal(v, after[k]), (build.__name__, k)


def test_adjoints_do_not_change_values_or_substeps():
    """Forward values, kept states and substeps are the same under every adjoint, and a
    recomputation neither validates twice nor records substeps twice."""
    model, inputs, _ = _vit()
    model = model.with_scheme("reversible").refine(2).validating(True)
    u0, ctx = model.initial_condition(*inputs)
    u0 = u0.detach().requires_grad_(True)
    outs = {}
    for name in adjoint_names():
        evo = model.evolution.with_adjoint(name)
        traj = evo(u0, ctx, SaveAt(steps=True, substeps=True))
        traj.final.sum().backward()
        assert len(traj.substeps) == evo.num_steps * len(evo.scheme.stages), name
        outs[name] = traj
    for name, traj in outs.items():
        assert torch.allclose(traj.states, outs["backprop"].states, rtol=0, atol=1e-14), name
        assert traj.states.shape[1:] == u0.shape
        sub = torch.stack([s.state for s in traj.substeps])
        ref = torch.stack([s.state for s in outs["backprop"].substeps])
        assert torch.allclose(sub, ref, rtol=0, atol=1e-14)


def test_checkpoint_and_reversible_under_no_grad_are_plain_runs():
    model, inputs, _ = _vit()
    rev = model.with_scheme("reversible")
    with torch.no_grad():
        y = rev(*inputs)
        assert torch.equal(with_adjoint(rev, "reversible")(*inputs), y)
        assert torch.equal(with_adjoint(model, "checkpoint")(*inputs), model(*inputs))


# -- 4. the reversible scheme ---------------------------------------------------------------------
def test_reversible_scheme_is_a_named_scheme_with_its_own_initial_map_and_read_out():
    assert "reversible" in scheme_names()
    model, inputs, _ = _vit()
    rev = model.with_scheme("reversible")
    s = rev.evolution.scheme
    assert isinstance(s, ReversibleScheme) and s.name == "reversible"
    assert str(s) == "v+=norm1>attention u+=norm2>ffn"
    u0, ctx = model.initial_condition(*inputs)
    state = s.lift(u0)
    assert state.shape == (2, *u0.shape) and torch.equal(s.read(state), u0)
    # one step by hand: v += tau A(P1 u); u += tau G(P2 v); read-out (u + v) / 2
    theta = rev.evolution.theta(0)
    v = u0 + theta["attention"](theta["norm1"](u0, ctx), ctx)
    u = u0 + theta["ffn"](theta["norm2"](v, ctx), ctx)
    one = splitformer.time.Evolution(rev.evolution.controls, s, TimeGrid(3, 3))
    with torch.no_grad():
        st = one.advance(0, state, ctx)
        assert torch.allclose(st[0], u, atol=1e-13) and torch.allclose(st[1], v, atol=1e-13)
    # back to the network's own scheme: the network again
    with torch.no_grad():
        assert torch.equal(rev.with_scheme("prenorm")(*inputs), model(*inputs))
    # the same field stages act on (u, v): never taken for the pre-norm network
    assert s.stages != model.evolution.scheme.stages and s.stages == rev.refine(2).evolution \
        .scheme.stages
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True, norm_first=True)
    pre_ln = splitformer.from_torch(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
    with pytest.raises(ValueError, match="to_torch needs the scheme.*got 'reversible'"):
        splitformer.to_torch(pre_ln.with_scheme("reversible"))


def test_reversible_step_is_inverted_exactly_up_to_round_off():
    model, inputs, _ = _gpt2()
    evo = model.with_scheme("reversible").refine(4).evolution
    u0, ctx = model.initial_condition(*inputs)
    s = evo.scheme
    with torch.no_grad():
        state = s.lift(u0)
        states = [state]
        for i in range(evo.num_steps):
            state = evo.advance(i, state, ctx)
            states.append(state)
        for i in reversed(range(evo.num_steps)):  # x <- x - h F(y), stages in reverse
            parts = list(state.unbind(0))
            for j in reversed(range(len(s.stages))):
                t = s.target(j)
                parts[t] = parts[t] - evo.tau * s.field(j, parts[1 - t], evo.theta(i), ctx)
            state = torch.stack(parts)
            assert torch.allclose(state, states[i], rtol=0, atol=1e-12)


def test_reversible_options():
    model, inputs, _ = _strang()
    post_ln = model.with_scheme("reversible", form="tangent")  # projections exist: Pi_T(P y)
    assert post_ln.evolution.scheme.stages[0].tangent == "norm1"
    with torch.no_grad():
        assert torch.isfinite(post_ln(*inputs)).all()
        base = model.with_scheme("reversible")(*inputs)
        for integrator in ("heun", "rk4"):  # exact on x_t = F(y), y frozen: the same scheme
            assert torch.equal(model.with_scheme("reversible", integrator=integrator)(*inputs),
                               base)
    vit, _, _ = _vit()
    with pytest.raises(ValueError, match="form='tangent' needs a projection"):
        vit.with_scheme("reversible", form="tangent")


# -- 5. adjoints as values: copies, in place, pickling ---------------------------------------------
def test_adjoint_values_copies_and_pickling():
    model, inputs, _ = _vit()
    assert model.evolution.adjoint == Backprop()
    copy_ = with_adjoint(model, " checkpoint ")
    assert copy_.evolution.adjoint == Checkpoint() and model.evolution.adjoint == Backprop()
    assert all(p is q for p, q in zip(copy_.parameters(), model.parameters(), strict=True))
    assert copy_.refine(2).evolution.adjoint == Checkpoint()
    assert copy_.with_scheme("strang").evolution.adjoint == Checkpoint()
    assert "adjoint=checkpoint" in repr(copy_.evolution)
    for clone in (pickle.loads(pickle.dumps(copy_)), copy.deepcopy(copy_)):
        assert clone.evolution.adjoint == Checkpoint()
    rev = model.with_scheme("reversible").evolution.with_adjoint(Reversible())
    assert rev.adjoint == Reversible()
    assert set_adjoint(model, "checkpoint") is model and model.evolution.adjoint == Checkpoint()
    model2, _, _ = _pair()
    set_adjoint(model2, "checkpoint")
    assert [o.evolution.adjoint for o in model2.evolution_owners()] == [Checkpoint()] * 2


# -- 6. bad input -------------------------------------------------------------------------------
def test_unknown_adjoint_names_the_argument():
    model, _, _ = _vit()
    with pytest.raises(ValueError, match=r"adjoint must be one of \['backprop', 'checkpoint', "
                                         r"'reversible'\].*'nope'"):
        Evolution(model.evolution.controls, "prenorm", adjoint="nope")
    with pytest.raises(ValueError, match=r"ControlProblem\(adjoint\): adjoint must be one of"):
        ControlProblem(model, _loss, adjoint="adjoint-sensitivity")
    with pytest.raises(TypeError, match="adjoint must be an adjoint name"):
        model.evolution.adjoint = 3
    with pytest.raises(ValueError, match="adjoint must be one of"):
        model.evolution.with_adjoint("")
    assert model.evolution.adjoint == Backprop()


def test_reversible_adjoint_needs_the_reversible_scheme():
    model, _, _ = _vit()
    with pytest.raises(ValueError, match=r"adjoint 'reversible' needs the reversible scheme.*"
                                         r"'prenorm'.*with_scheme\('reversible'\)"):
        model.evolution.adjoint = "reversible"
    with pytest.raises(ValueError, match=r"ControlProblem\(adjoint\): adjoint 'reversible' "):
        ControlProblem(model, _loss, adjoint="reversible")
    assert model.evolution.adjoint == Backprop()
    rev = with_adjoint(model.with_scheme("reversible"), "reversible")
    with pytest.raises(ValueError, match="needs the reversible scheme"):
        rev.with_scheme("strang")  # with_adjoint('checkpoint') first
    cvt, _, _ = _cvt()
    with pytest.raises(ValueError, match="needs the reversible scheme"):
        set_adjoint(cvt, "reversible")  # nothing changed: all or none
    assert all(o.evolution.adjoint == Backprop() for o in cvt.evolution_owners())


@pytest.mark.parametrize("weight, error, match", [
    (-1.0, ValueError, r"KineticEnergy\(weight\): weight must be a finite number >= 0"),
    (float("nan"), ValueError, r"weight must be a finite number >= 0"),
    (float("inf"), ValueError, r"weight must be a finite number >= 0"),
    (True, TypeError, r"weight must be a real number"),
    ("1", TypeError, r"weight must be a real number"),
])
def test_bad_weights_name_the_argument(weight, error, match):
    with pytest.raises(error, match=match):
        KineticEnergy(weight)
    with pytest.raises(error, match=match.replace("KineticEnergy", "ControlRegularity")):
        ControlRegularity(weight)


def test_running_costs_on_a_model_without_a_path_or_controls():
    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"ControlProblem\(running_costs\): KineticEnergy needs "
                                         r"the path.*Linear"):
        ControlProblem(lin, F.cross_entropy, [KineticEnergy(1.0)])
    with pytest.raises(ValueError, match=r"ControlRegularity needs control sets.*Linear"):
        ControlProblem(lin, F.cross_entropy, [ControlRegularity(1.0)])
    with pytest.raises(ValueError, match="KineticEnergy needs the path"):
        KineticEnergy(1.0)(lin, None)
    with pytest.raises(ValueError, match=r"ControlProblem\(adjoint\).*no evolution"):
        ControlProblem(lin, F.cross_entropy, adjoint="checkpoint")


def test_other_bad_arguments_name_themselves():
    model, inputs, target = _vit()
    with pytest.raises(TypeError, match=r"ControlProblem\(model\)"):
        ControlProblem("vit", _loss)
    with pytest.raises(TypeError, match=r"ControlProblem\(loss\)"):
        ControlProblem(model, "cross_entropy")
    with pytest.raises(TypeError, match=r"ControlProblem\(logits\)"):
        ControlProblem(model, _loss, logits="logits")
    with pytest.raises(TypeError, match=r"ControlProblem\(running_costs\)"):
        ControlProblem(model, _loss, KineticEnergy(1.0))
    with pytest.raises(TypeError, match=r"ControlProblem\(running_costs\).*got str"):
        ControlProblem(model, _loss, ["kinetic"])
    with pytest.raises(ValueError, match=r"ControlProblem\(running_costs\): the name 'kinetic'"):
        ControlProblem(model, _loss, [KineticEnergy(1.0), KineticEnergy(2.0)])
    with pytest.raises(ValueError, match=r"ControlProblem\(loss\): loss must return a scalar"):
        ControlProblem(model, lambda out, t: out)(inputs, target)


# -- 7. memory: what each adjoint keeps grows as documented ------------------------------------
def _peak_bytes(fn) -> int:
    """Largest running total of tensor bytes allocated minus freed while fn runs (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    total = peak = 0
    for e in events:
        total += e.nbytes()
        peak = max(peak, total)
    return peak


def test_activation_memory_grows_with_n_t_as_documented():
    """Peak memory of a training step at N_t = 8 and 32 (the same controls): backprop grows
    with N_t x activations, checkpoint with N_t x state (much less), reversible not at all."""
    torch.manual_seed(0)
    m = build_vit(image_size=16, patch_size=2, in_chans=3, dim=32, depth=2, num_heads=2,
                  hidden_dim=64, num_classes=3, read_out="timm")
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 3, (8,))
    peaks = {}
    for scheme, adjoint in (("prenorm", "backprop"), ("prenorm", "checkpoint"),
                            ("reversible", "backprop"), ("reversible", "reversible")):
        for n in (8, 32):
            model = with_adjoint(m.with_scheme(scheme).refine(n // 2), adjoint)
            problem = ControlProblem(model, F.cross_entropy)

            def step(problem=problem):
                problem.zero_grad(set_to_none=True)
                problem((x,), y).total.backward()

            step()
            peaks[scheme, adjoint, n] = _peak_bytes(step)
    growth = {k[:2]: peaks[(*k[:2], 32)] - peaks[(*k[:2], 8)] for k in peaks}
    assert growth["prenorm", "checkpoint"] < growth["prenorm", "backprop"] / 4, peaks
    assert peaks["prenorm", "checkpoint", 32] < peaks["prenorm", "backprop", 32] / 3, peaks
    assert abs(growth["reversible", "reversible"]) < peaks["reversible", "reversible", 8] / 10
    assert peaks["reversible", "reversible", 32] < peaks["reversible", "backprop", 32] / 8
