"""The compiled plan of a step (time/plan.py) computes exactly what the scheme as data computes:
every family x named scheme x integrator x form, the same tensor bit for bit; it is rebuilt when
a control set changes, never copied with a model, and the FFN's in-place activation leaves hooks
and gradients as they were."""

from __future__ import annotations

import copy

import pytest
import torch
from test_registry import FAMILIES, OPTIONS, _refused, _tensor
from torch import nn

import splitformer
from splitformer.time import Plan


def _evolutions(model):
    return [m for m in model.modules() if isinstance(m, splitformer.time.Evolution)]


def _interpreted(model):
    """The model with every evolution stepping through Scheme.step (the scheme read as data)."""
    for evo in _evolutions(model):
        def advance(i, state, context, observe=None, evo=evo):
            return evo.scheme.step(state, evo.theta(i), evo.tau, context, observe)
        evo.advance = advance
    return model


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_plan_equals_the_scheme_read_as_data(name):
    model, inputs = FAMILIES[name]()
    for scheme, integrator, form in [(None, None, None), *OPTIONS]:
        if scheme is not None and _refused(name, scheme, form) is not None:
            continue
        m = model if scheme is None else model.with_scheme(scheme, integrator=integrator,
                                                           form=form)
        m = m.refine(2).eval()
        with torch.no_grad():
            planned = _tensor(m(*inputs))
            reference = _tensor(_interpreted(copy.deepcopy(m))(*inputs))
        assert torch.equal(planned, reference), (name, scheme, integrator, form)


def _encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True)
    ref = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return ref, splitformer.from_torch(ref).eval(), torch.randn(2, 5, 16)


def test_plan_is_rebuilt_when_an_operator_of_theta_is_replaced():
    ref, model, x = _encoder()
    y = model(x)
    evo = model.evolution
    first = evo.plan(0)
    assert evo.plan(0) is first  # kept
    theta = evo.controls[0]
    new = copy.deepcopy(theta["ffn"])
    with torch.no_grad():
        new.stages[1].weight.zero_()
        new.stages[1].bias.zero_()
    theta["ffn"] = new  # the FFN of step 0 now gives 0
    assert evo.plan(0) is not first
    ref.layers[0].linear2.weight.data.zero_()
    ref.layers[0].linear2.bias.data.zero_()
    torch.testing.assert_close(model(x), ref.eval()(x))
    assert not torch.allclose(model(x), y)


def test_plans_are_not_copied_with_the_model():
    _, model, x = _encoder()
    model(x)
    assert model.evolution.__dict__.get("_plans")
    twin = copy.deepcopy(model)
    assert not twin.evolution.__dict__.get("_plans")
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    assert not torch.allclose(twin(x), model(x))  # the copy runs its own weights


def test_plan_is_exported_and_runs_a_step():
    _, model, x = _encoder()
    evo = model.evolution
    plan = Plan(evo.scheme, evo.theta(0), evo.tau)
    assert plan.fits(evo.theta(0)) and not plan.fits(evo.theta(1))
    assert torch.equal(plan(x), evo.scheme.step(x, evo.theta(0), evo.tau))


def test_in_place_relu_keeps_forward_hooks_and_gradients():
    """The FFN writes ReLU into W_1 h + b_1 in place; a hook on the activation still sees its
    input (the call goes through the module then), and gradients equal torch.nn's."""
    ref, model, x = _encoder()
    act = model.evolution.controls[0]["ffn"].activation
    seen = []
    handle = act.register_forward_hook(lambda m, a, out: seen.append((a[0].min(), out.min())))
    model(x)
    handle.remove()
    assert seen and seen[0][0] < 0 and seen[0][1] == 0  # the input was not overwritten
    ref.train()
    model.train()
    ref(x).square().mean().backward()
    model(x).square().mean().backward()
    g_ref = ref.layers[0].linear1.weight.grad
    g = model.evolution.controls[0]["ffn"].stages[0].weight.grad
    torch.testing.assert_close(g, g_ref)


def test_updates_written_in_place_leave_kept_states_alone():
    """Without autograd u + F(u) is written into F(u)'s memory; every kept state and substep
    equals the run with autograd on (nothing kept is overwritten)."""
    from splitformer.time import SaveAt

    _, model, x = _encoder()
    keep = SaveAt(steps=True, substeps=True)
    with torch.no_grad():
        fast = model.trajectory(x, saveat=keep)
    slow = model.trajectory(x, saveat=keep)
    assert len(fast.substeps) == len(slow.substeps) > 0
    for a, b in zip(fast.states, slow.states, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(fast.substeps, slow.substeps, strict=True):
        assert torch.equal(a.state, b.state)


def test_returns_new_is_declared_by_the_class_that_defines_forward():
    from splitformer.operators import NonlocalAttention
    from splitformer.operators.base import returns_new, tree_has_hooks

    op = NonlocalAttention(8, 2)
    assert returns_new(op)

    class Cached(NonlocalAttention):  # overrides forward without saying it returns new
        def forward(self, u, context=None):
            return super().forward(u, context)

    assert not returns_new(Cached(8, 2))
    assert not tree_has_hooks(op)
    handle = op.kernel.register_forward_hook(lambda m, a, out: out)
    assert tree_has_hooks(op) and returns_new(op)  # the class's promise; the hook is checked
    handle.remove()  # when the update is made
    assert not tree_has_hooks(op)


def test_a_hook_added_later_keeps_what_it_saw():
    """A forward hook on an operator, or on a module inside it, added after the plan was
    built, keeps F(u) (or W_1 h + b_1) as it was made: nothing is written into it."""
    _, model, x = _encoder()
    theta = model.evolution.controls[0]
    with torch.no_grad():
        model(x)  # the plans exist
        for module in (theta["attention"], theta["ffn"].stages[1], theta["ffn"].stages[0],
                       theta["ffn"].out_dropout):
            kept = []
            handle = module.register_forward_hook(lambda m, a, out, kept=kept: kept.append(
                (out, out.clone())))
            model(x)
            handle.remove()
            assert kept and all(torch.equal(t, c) for t, c in kept), type(module).__name__


def test_backward_hooks_on_bypassed_modules_still_fire():
    _, model, x = _encoder()
    model.train()
    ffn = model.evolution.controls[0]["ffn"]
    fired = []
    ffn.dropout.register_full_backward_hook(lambda m, gi, go: fired.append("dropout"))
    ffn.activation.register_full_backward_hook(lambda m, gi, go: fired.append("activation"))
    model(x).square().mean().backward()
    assert set(fired) == {"dropout", "activation"}


def test_autocast_keeps_the_residual_in_the_states_dtype():
    """Under autocast F(u) is bfloat16: the update u + F(u) stays in u's dtype, as Scheme.step
    computes it."""
    _, model, x = _encoder()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        planned = model(x)
        reference = _interpreted(copy.deepcopy(model))(x)
    assert planned.dtype == reference.dtype
    assert torch.equal(planned, reference)


def test_piecewise_linear_controls_keep_no_plan_between_grid_points():
    _, model, x = _encoder()
    smooth = model.with_controls_in_time("linear").refine(4)
    smooth(x)
    evo = smooth.evolution
    kept = evo.__dict__.get("_plans", {})
    between = [i for i in range(evo.num_steps) if not isinstance(evo.theta(i), nn.Module)]
    assert between and not set(between) & set(kept)  # interpolated steps: nothing kept
    assert kept  # the steps on stored control sets are kept
    i = between[0]
    assert evo.plan(i) is not evo.plan(i)


def test_a_subclass_may_withdraw_the_promise():
    from splitformer.operators import FeedForward
    from splitformer.operators.base import returns_new

    class Careful(FeedForward):
        returns_new = False

    assert returns_new(FeedForward([8, 16, 8])) and not returns_new(Careful([8, 16, 8]))
