"""Bad input to the time layer (grid, controls, schemes, SaveAt, Evolution) gets a clear error
naming the argument; nothing is silently ignored or approximated."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import splitformer
from splitformer.time import Evolution, SaveAt, Scheme, Stage, TimeGrid, resolve, schemes
from splitformer.time.saveat import SaveAt as SaveAtClass


@pytest.fixture
def model():
    torch.manual_seed(0)
    return splitformer.network_encoder(8, 2, 16, 2, dtype=torch.float64)


# -- 1. SaveAt ------------------------------------------------------------------------------
@pytest.mark.parametrize("ts", ["10", b"1", True, False, None, (0.5, True), ("1",)])
def test_saveat_ts_refuses_str_bool_and_non_numbers(ts):
    with pytest.raises(TypeError, match="SaveAt.ts must"):
        SaveAt(ts=ts)


def test_saveat_ts_accepts_numbers_sequences_and_tensors():
    assert SaveAt(ts=1).ts == (1.0,)
    assert SaveAt(ts=[0, 1.5]).ts == (0.0, 1.5)
    assert SaveAt(ts=torch.tensor([0.0, 2.0])).ts == (0.0, 2.0)
    with pytest.raises(ValueError, match="finite"):
        SaveAt(ts=(math.nan,))


def test_saveat_ts_is_checked_against_the_grid_also_with_steps(model):
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"SaveAt.ts: t = 0.25 is not a grid point"):
        model.trajectory(x, saveat=SaveAt(steps=True, ts=(0.25,)))
    traj = model.trajectory(x, saveat=SaveAt(steps=True, ts=(1.0,)))
    assert len(traj) == 3  # steps keeps every grid point; ts adds nothing


def test_saveat_has_no_unused_keeps_states():
    assert not hasattr(SaveAtClass(), "keeps_states")


# -- 2. TimeGrid ----------------------------------------------------------------------------
def test_grid_refuses_bool_steps_and_refinements():
    with pytest.raises(ValueError, match="num_steps must be an int >= 1, got True"):
        TimeGrid(2, True)
    with pytest.raises(ValueError, match="k must be an int >= 1, got True"):
        TimeGrid(2, 2).refine(True)


@pytest.mark.parametrize("T", [math.inf, math.nan, 0.0, -1.0])
def test_grid_needs_a_finite_positive_T(T):
    with pytest.raises(ValueError, match="T must be a finite number > 0"):
        TimeGrid(T, 2)


@pytest.mark.parametrize("T", ["2", None, True, torch.ones(2)])
def test_grid_T_must_be_a_real_number(T):
    with pytest.raises(TypeError, match="T must be a real number"):
        TimeGrid(T, 2)


def test_grid_stores_T_as_a_float():
    g = TimeGrid(2, 4)
    assert isinstance(g.T, float) and g.tau == 0.5


# -- 3. Stage -------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [None, 3, ("attention",)])
def test_stage_operator_must_be_a_str(op):
    with pytest.raises(TypeError, match="Stage.operator must be a str"):
        Stage(op)


def test_stage_reads_a_single_name_as_a_one_tuple():
    st = Stage("attention", pre="norm1", post="ls1")
    assert st.pre == ("norm1",) and st.post == ("ls1",)
    assert Stage("ffn1", then="relu").then == ("relu",)
    assert st == Stage("attention", pre=("norm1",), post=("ls1",))
    assert str(st) == "norm1>attention<ls1"
    with pytest.raises(TypeError, match="Stage.pre must be a tuple of operator names"):
        Stage("attention", pre=3)


def test_scheme_string_suffix_lists_every_valid_suffix():
    with pytest.raises(ValueError, match=r"':projet'.*euler, heun, rk2, rk4, project, map"):
        resolve("attention norm1:projet")
    assert schemes.SUFFIXES == ("euler", "heun", "rk2", "rk4", "project", "map")


@pytest.mark.parametrize("text", ["attention*1e308", "attention*1001"])
def test_huge_fractions_are_refused_when_the_stage_is_built(text):
    with pytest.raises(ValueError, match=r"fraction must be a number > 0 and <= 1000"):
        resolve(text)
    with pytest.raises(ValueError, match=r"fraction must be a number > 0 and <= 1000"):
        Stage("attention", fraction=1e308)
    assert Stage("attention", fraction=schemes.MAX_FRACTION).fraction == 1e3


def test_relax_weight_is_checked():
    with pytest.raises(ValueError, match="weight must be in"):
        Stage("U", "relax", weight="a")
    with pytest.raises(ValueError, match="weight must be in"):
        resolve("attention@U relax(U,1e)")


# -- 4. parallel branches, dead code --------------------------------------------------------
def test_save_inside_a_parallel_branch_is_refused():
    with pytest.raises(ValueError, match=r"stage 'ffn@V' inside a parallel stage .*cannot save"):
        resolve("parallel(attention norm1:project | ffn@V) norm2:project")
    with pytest.raises(ValueError, match="relax\\(U\\) refers to a state"):
        resolve("parallel(attention relax(U) | ffn) norm2:project")
    with pytest.raises(TypeError, match="branches must hold branches"):
        Stage("parallel", "parallel", branches=(Stage("attention"),))
    ok = resolve("attention@U parallel(norm1:project relax(U) | ffn) norm2:project")
    assert ok.stages[1].kind == "parallel"


def test_dead_names_are_gone():
    assert not hasattr(schemes, "NAMED")
    assert not hasattr(Stage("attention"), "is_field")


# -- 5. unused field operators ----------------------------------------------------------------
def test_a_scheme_that_drops_a_field_operator_warns(model):
    with pytest.warns(UserWarning, match=r"leaves the field operators \['ffn'\]"):
        model.with_scheme("attention norm1:project")
    with pytest.warns(UserWarning, match=r"\['attention'\]"):
        Evolution(model.evolution.controls, "ffn norm2:project")


def test_unused_projections_and_maps_do_not_warn(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.with_scheme("attention ffn norm2:project")  # norm1 (a projection) unused
        model.with_scheme("strang")
        model.refine(2)


# -- 6. Evolution.validate -------------------------------------------------------------------
@pytest.mark.parametrize("value", [1, "yes", None])
def test_validate_must_be_a_bool(model, value):
    with pytest.raises(TypeError, match="Evolution.validate must be a bool"):
        model.evolution.validate = value
    with pytest.raises(TypeError, match="Evolution.validate must be a bool"):
        Evolution(model.evolution.controls, "lie", validate=value)
    assert model.evolution.validate is False


def test_validate_setter_and_copies(model):
    model.validating(True)
    assert model.evolution.validate is True and model.refine(2).evolution.validate is True
    model.evolution.validate = False
    assert model.evolution.validate is False


# -- 10. names with surrounding whitespace ---------------------------------------------------
def test_interpolation_names_are_stripped(model):
    assert model.with_controls_in_time("linear ").evolution.controls.interpolation == "linear"
    assert model.with_scheme(" lie ").evolution.scheme.name == "lie"
    with pytest.raises(ValueError, match="interpolation must be"):
        model.with_controls_in_time("cubic")


def test_scheme_values_still_build():
    s = Scheme((Stage("attention", pre="norm1"), Stage("ffn", pre=("norm2",))))
    assert str(s) == "norm1>attention norm2>ffn"
