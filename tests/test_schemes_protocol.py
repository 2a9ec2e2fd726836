"""What a scheme declares and the evolution asks of it (time/schemes/stages.py): ``lift``,
``read``, ``plan``, ``layout``, ``unused_fields``. The reversible scheme is a registered scheme
like the others (no import side effect of time.adjoints); a user-written scheme with a state of
its own runs through the evolution by its declarations alone; the evolution runs the compiled
plan of every named scheme and that equals the scheme read as data."""

from __future__ import annotations

import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import splitformer
from splitformer.operators import Operator
from splitformer.time import Controls, Evolution, Plan, SaveAt, Scheme, Stage, TimeGrid
from splitformer.time.schemes import ReversibleScheme, scheme_names
from splitformer.time.schemes import stages as stages_module

D = torch.float64
SRC = Path(splitformer.__file__).resolve().parents[1]

# Import splitformer.time.schemes with the parent packages as bare namespaces (their __init__
# files import the evolution, hence the adjoints): only the schemes package and what it needs.
_ALONE = """
import sys, types
src = sys.argv[1]
for name, path in (("splitformer", src + "/splitformer"),
                   ("splitformer.time", src + "/splitformer/time")):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
import splitformer.time.schemes as s
loaded = sorted(k for k in sys.modules if k.startswith("splitformer."))
assert "splitformer.time.adjoints" not in sys.modules, loaded
assert "splitformer.time.evolution" not in sys.modules, loaded
assert "reversible" in s.SCHEMES, sorted(s.SCHEMES)
assert s.SCHEMES["reversible"]().name == "reversible"
print("ok")
"""


def test_the_reversible_scheme_is_registered_without_importing_the_adjoints():
    done = subprocess.run([sys.executable, "-c", _ALONE, str(SRC)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- a user-written scheme with a state of its own ---------------------------------------------
class _Drift(Operator):
    """F(u) = c, whatever u."""

    kind = "field"

    def __init__(self, c: torch.Tensor) -> None:
        super().__init__()
        self.c = torch.nn.Parameter(c)

    def forward(self, u, context=None):
        return self.c.expand_as(u)


class _HeavyBallPlan(Plan):
    """m <- beta m + F(u);  u <- u + tau m, on the state (u, m) stacked."""

    def compile(self, theta):
        return (theta["f"],)

    def __call__(self, state, context=None, observe=None):
        (f,) = self.stages
        u, m = state.unbind(0)
        m = self.scheme.beta * m + f(u, context)
        u = u + self.tau * m
        out = torch.stack((u, m))
        if observe is not None:
            observe(out, 0)
        return out


@dataclass(frozen=True)
class _HeavyBall(Scheme):
    """The heavy-ball method as a scheme: its own state (u, m), initial map (f, 0), read-out u."""

    beta: float = 0.5
    calls: dict = field(default_factory=dict, compare=False, hash=False)  # asked for, counted

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def lift(self, u0):
        self._count("lift")
        return torch.stack((u0, torch.zeros_like(u0)))

    def read(self, state):
        self._count("read")
        return state[0]

    def plan(self, theta, tau):
        self._count("plan")
        return _HeavyBallPlan(self, theta, tau)


def test_a_user_scheme_with_its_own_state_runs_by_its_declarations():
    torch.manual_seed(0)
    c = torch.randn(3, 4, dtype=D)
    u0 = torch.randn(2, 3, 4, dtype=D)
    calls: dict = {}
    scheme = _HeavyBall((Stage("f"),), name="heavy_ball", calls=calls)
    evo = Evolution(Controls([{"f": _Drift(c)} for _ in range(3)]), scheme, TimeGrid(3, 3))
    with torch.no_grad():
        out = evo(u0)
    # m_1 = c, m_2 = 1.5 c, m_3 = 1.75 c; u(3) = u0 + (1 + 1.5 + 1.75) c at tau = 1
    torch.testing.assert_close(out, u0 + 4.25 * c, rtol=0, atol=1e-12)
    assert calls == {"lift": 1, "plan": 3, "read": 1}
    with torch.no_grad():
        traj = evo(u0, saveat=SaveAt(steps=True, substeps=True))
    # every kept state is read out: u(t_i), not the doubled state
    assert traj.states.shape == (4, *u0.shape)
    torch.testing.assert_close(traj.states[1], u0 + c, rtol=0, atol=1e-12)
    assert [s.state.shape for s in traj.substeps] == [u0.shape] * 3
    assert calls["plan"] == 3  # the plans were kept: built once per step
    # refined: tau = 1/2, the same declarations (6 steps, each with its own plan)
    fine = evo.refine(2)
    with torch.no_grad():
        fine(u0)
    assert calls["plan"] == 3 + 6


@dataclass(frozen=True)
class _Doubling(Scheme):
    """A scheme that defines its step by overriding ``step`` alone: u <- 2 u + F(u)."""

    def step(self, u, theta, tau, context=None, observe=None):
        out = 2 * u + theta["f"](u, context)
        if observe is not None:
            observe(out, 0)
        return out


def test_a_scheme_that_overrides_step_alone_has_its_step_run():
    torch.manual_seed(0)
    c = torch.randn(3, 4, dtype=D)
    u0 = torch.randn(2, 3, 4, dtype=D)
    evo = Evolution(Controls([{"f": _Drift(c)} for _ in range(2)]), _Doubling((Stage("f"),)),
                    TimeGrid(2, 2))
    with torch.no_grad():
        out = evo(u0)
    # the compiled base plan would give u0 + 2 c (Euler on the stage list); the step gives
    # 2 (2 u0 + c) + c
    torch.testing.assert_close(out, 4 * u0 + 3 * c, rtol=0, atol=1e-12)
    traj = evo(u0, saveat=SaveAt(steps=True, substeps=True))
    assert len(traj.substeps) == 2


def test_a_compiled_model_is_still_an_evolution_model_for_the_control_problem():
    from splitformer.control import ControlProblem, KineticEnergy, evolutions_of

    torch.manual_seed(0)
    model = splitformer.network_encoder(8, 2, 16, 2).double()
    x = torch.randn(2, 5, 8, dtype=D)
    compiled = torch.compile(model)  # lazy: nothing is traced until it is called
    assert evolutions_of(compiled) == evolutions_of(model) != []
    loss = lambda out, target: (out - target).pow(2).mean()  # noqa: E731
    plain = ControlProblem(model, loss, [KineticEnergy(0.1)])(x, torch.zeros_like(x))
    wrapped = ControlProblem(compiled, loss, [KineticEnergy(0.1)])(x, torch.zeros_like(x))
    torch.testing.assert_close(wrapped.total, plain.total, rtol=0, atol=0)
    assert wrapped.parts["kinetic"] > 0


def test_the_unused_field_warning_comes_from_the_scheme(monkeypatch):
    model = splitformer.network_encoder(8, 2, 16, 2)
    controls = model.evolution.controls
    scheme = splitformer.time.schemes.resolve("attention norm1:project")
    assert scheme.unused_fields(controls) == ["ffn"]
    assert splitformer.time.schemes.lie().unused_fields(controls) == []
    with pytest.warns(UserWarning, match=r"leaves the field operators \['ffn'\]") as record:
        Evolution(controls, scheme)
    assert record[0].filename == __file__  # at the caller of Evolution()
    asked = []
    original = stages_module.Scheme.unused_fields

    def spy(self, controls):
        asked.append(self.name)
        return original(self, controls)

    monkeypatch.setattr(stages_module.Scheme, "unused_fields", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # lie uses every field: no warning
        Evolution(controls, "lie")
    with pytest.warns(UserWarning, match="ffn"):
        Evolution(controls, scheme)
    assert asked == ["lie", "custom"]


def test_the_layout_is_declared_by_the_scheme():
    s = splitformer.time.schemes
    assert s.lie().layout == s.POST_LN
    assert s.resolve("norm1>attention norm2>ffn").layout == s.PRE_LN
    assert s.paper_lie().layout is None
    model = splitformer.network_encoder(8, 2, 16, 2)
    assert model.evolution.layout == s.POST_LN
    with pytest.raises(ValueError, match="no plain field layout"):
        s.layout_of(s.paper_lie())


def _model(name: str):
    torch.manual_seed(0)
    if name == "paper":
        return splitformer.paper_encoder(8, 2, 16, 2, dtype=D)
    return splitformer.network_encoder(8, 2, 16, 2, dtype=D).with_scheme(name)


@pytest.mark.parametrize("name", scheme_names())
def test_the_evolution_runs_the_plan_of_every_named_scheme(name, monkeypatch):
    model = _model(name).refine(1 if name == "paper" else 2).eval()  # (paper: no limit)
    evo = model.evolution
    scheme = evo.scheme
    assert isinstance(scheme, ReversibleScheme) == (name == "reversible")
    x = torch.randn(2, 5, 8, dtype=D)
    u0, ctx = model.initial_condition(x)
    with torch.no_grad():  # the oracle: the scheme read as data, step by step
        state = scheme.lift(u0)
        for i in range(evo.num_steps):
            state = scheme.step(state, evo.theta(i), evo.tau, ctx)
        oracle = scheme.read(state)
    built = []
    plan = type(scheme).plan

    def counted(self, theta, tau):
        built.append(tau)
        return plan(self, theta, tau)

    def interpreter(*args, **kwargs):
        raise AssertionError("the evolution ran the interpreter, not the plan")

    monkeypatch.setattr(type(scheme), "plan", counted)
    monkeypatch.setattr(type(scheme), "step", interpreter)
    with torch.no_grad():
        got = evo(u0, ctx)
    assert built == [evo.tau] * evo.num_steps
    assert torch.equal(got, oracle), (name, (got - oracle).abs().max())
