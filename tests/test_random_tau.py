"""Training with a random time step per batch (``tau_choices``, T fixed; docs/training.md):
the config key, the draws, the refined model each batch runs on, resume, `--tau-choices`."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from splitformer.cli import build_parser, main
from splitformer.commands import UsageError
from splitformer.commands.train import config_of
from splitformer.training import ConfigError, TrainConfig
from splitformer.training.data import load_dataset
from splitformer.training.loop import evaluate, fit, tau_at

TINY = {"width": 16, "heads": 2, "depth": 2, "epochs": 2, "batch_size": 128, "log_every": 1,
        "dropout": 0.1, "checkpoint_every": 4}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _rows(history):
    return [r for r in history if "loss" in r]


def _same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """The largest difference between the parameters of a and b (the same names)."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    return max(float((pa[k] - pb[k]).detach().abs().max()) for k in pa)


# -- the config key ----------------------------------------------------------------------------
def test_tau_choices_are_a_tuple_of_floats_and_round_trip_through_json_and_toml(tmp_path):
    cfg = TrainConfig(depth=2, tau_choices=[1, 0.5, 0.25])
    assert cfg.tau_choices == (1.0, 0.5, 0.25)
    assert all(type(c) is float for c in cfg.tau_choices)
    assert cfg.refinements() == (1, 2, 4)
    assert cfg.to_dict()["tau_choices"] == [1.0, 0.5, 0.25]
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert TrainConfig().tau_choices is None and TrainConfig().refinements() is None
    assert TrainConfig().to_dict()["tau_choices"] is None
    # the choices divide the config's own tau: at steps = 2 depth (tau 1/2), k = tau / choice
    assert TrainConfig(depth=2, steps=4, tau_choices=(0.5, 0.125)).refinements() == (1, 4)
    f = tmp_path / "run.toml"
    f.write_text("[train]\ndepth = 2\ntau_choices = [1, 0.5]\n")
    assert TrainConfig.from_toml(f) == TrainConfig(depth=2, tau_choices=(1.0, 0.5))
    assert TrainConfig.from_toml(f).replace(tau_choices=(0.25,)).tau_choices == (0.25,)


@pytest.mark.parametrize("value, match", [
    ((), "at least one time step"),
    (["a"], "tau_choices must be a list of numbers or None, got \\['a'\\]"),
    ("1,0.5", "tau_choices must be a list of numbers or None"),
    (0.5, "tau_choices must be a list of numbers or None"),
    ([True], "tau_choices must be a list of numbers or None"),
    ([1, None], "tau_choices must be a list of numbers or None"),
    ([0.3], "tau_choices must hold time steps tau / k .* = 1; 0.3 is not one"),
    ([2.0], "tau_choices must hold time steps tau / k .* 2 is not one"),
    ([0.0], "tau_choices must hold finite numbers > 0, got 0.0"),
    ([-0.5], "tau_choices must hold finite numbers > 0"),
    ([float("inf")], "tau_choices must hold finite numbers > 0"),
    ([float("nan")], "tau_choices must hold finite numbers > 0"),
    ([0.5, 0.5], "tau_choices must not repeat a time step, got 0.5 twice"),
    ([1, 0.5, 0.5000000000001], "tau_choices must not repeat"),
])
def test_bad_tau_choices_are_refused_naming_the_key(value, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(depth=2, tau_choices=value)


def test_a_choice_above_the_config_tau_is_refused():
    with pytest.raises(ConfigError, match="tau_choices must hold .* tau = T / N_t = 0.5; 1 is"):
        TrainConfig(depth=2, tau=0.5, tau_choices=(1.0, 0.5))


# -- the draws -----------------------------------------------------------------------------------
def test_the_drawn_taus_follow_the_seed():
    cfg = TrainConfig(tau_choices=(1.0, 0.5, 0.25))
    a = [tau_at(cfg, s) for s in range(300)]
    assert a == [tau_at(cfg, s) for s in range(300)]  # the same seed: the same sequence
    assert a != [tau_at(cfg.replace(seed=1), s) for s in range(300)]
    counts = Counter(a)
    assert set(counts) == {1.0, 0.5, 0.25}
    assert all(60 <= n <= 140 for n in counts.values()), counts  # about 100 each
    assert tau_at(TrainConfig(depth=4, steps=8), 3) == 0.5  # without choices: the config's tau
    # the sequence itself, as the code of 2026-12-01 (032d4af) drew it: a run checkpointed by
    # an older version resumes on the same draws
    assert a[:12] == [0.5, 0.5, 0.5, 1.0, 0.25, 1.0, 1.0, 1.0, 0.5, 1.0, 0.5, 0.25]


def test_each_logged_step_records_its_drawn_tau(tmp_path, digits):
    cfg = TrainConfig(**{**TINY, "epochs": 1, "tau_choices": (1.0, 0.5, 0.25)})
    r = fit(cfg, out=tmp_path / "run", data=digits)
    rows = _rows(r.history)
    assert [x["step"] for x in rows] == list(range(1, 13))
    assert [x["tau"] for x in rows] == [tau_at(cfg, x["step"] - 1) for x in rows]
    assert len({x["tau"] for x in rows}) == 3
    written = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    assert written == r.history
    assert json.loads((tmp_path / "run" / "config.json").read_text())["tau_choices"] == [
        1.0, 0.5, 0.25]
    # the test set is evaluated at the config's tau (the model itself, tau = 1)
    assert r.metrics["test_accuracy"] == evaluate(r.model, digits, cfg)["test_accuracy"]
    plain = fit(TrainConfig(**{**TINY, "epochs": 1}), out=tmp_path / "plain", data=digits)
    assert all("tau" not in x for x in plain.history)


# -- the model each batch runs on ------------------------------------------------------------------
def test_a_single_choice_at_the_config_tau_is_the_plain_run(tmp_path, digits):
    plain = fit(TrainConfig(**TINY), out=tmp_path / "plain", data=digits)
    one = fit(TrainConfig(**TINY, tau_choices=(1.0,)), out=tmp_path / "one", data=digits)
    assert [{k: v for k, v in x.items() if k not in ("tau", "examples_per_s")}
            for x in one.history] == [{k: v for k, v in x.items() if k != "examples_per_s"}
                                      for x in plain.history]
    assert {x["tau"] for x in _rows(one.history)} == {1.0}
    assert one.metrics["test_accuracy"] == plain.metrics["test_accuracy"]
    assert _same_parameters(one.model, plain.model) == 0.0


def test_the_batch_runs_on_the_refined_model(tmp_path, digits):
    """tau_choices=(0.5,) at the config's tau 1 trains the parameters exactly as a run at tau
    1/2 (steps = 2 depth) does: the same losses, kinetic energy of the refined path included,
    dropout on (the refined copy is in train mode), and the same trained parameters."""
    base = {**TINY, "kinetic": 0.01, "control_reg": 0.001}
    half = fit(TrainConfig(**base, tau_choices=(0.5,)), out=tmp_path / "choices", data=digits)
    ref = fit(TrainConfig(**base, tau=0.5), out=tmp_path / "tau", data=digits)
    a, b = _rows(half.history), _rows(ref.history)
    assert {x["tau"] for x in a} == {0.5}
    for x, y in zip(a, b, strict=True):
        for key in ("loss", "terminal", "kinetic", "control_regularity", "accuracy"):
            assert abs(x[key] - y[key]) <= 1e-6, (x["step"], key, x[key], y[key])
    assert a[0]["kinetic"] > 0
    assert _same_parameters(half.model, ref.model) <= 1e-6
    assert half.model.training  # the base model, back in train mode after evaluation
    # evaluation stays at the config's tau (1), not at the drawn 1/2
    cfg = TrainConfig(**base, tau_choices=(0.5,))
    assert half.metrics["test_accuracy"] == evaluate(half.model, digits, cfg)["test_accuracy"]
    assert ref.metrics["test_accuracy"] == evaluate(half.model.refine(2), digits,
                                                    cfg)["test_accuracy"]


# -- resume ---------------------------------------------------------------------------------------
def test_a_resumed_random_tau_run_equals_the_uninterrupted_one(tmp_path, digits, cut_fit):
    """Interrupted after step 9, resumed from its checkpoint at step 8: the same taus, losses
    (to 1e-6), test accuracy and parameters as the uninterrupted run (dropout on)."""
    cfg = TrainConfig(**TINY, tau_choices=(1.0, 0.5, 0.25))
    whole = fit(cfg, out=tmp_path / "whole", data=digits)
    cut_fit(cfg, 9, out=tmp_path / "cut", data=digits)
    # the recorded config (tau_choices a JSON list) is this config: the CLI resumes it, with
    # the same --tau-choices or none, and refuses another
    args = build_parser().parse_args(["train", "--resume", str(tmp_path / "cut"),
                                      "--tau-choices", "1,1/2,1/4"])
    assert config_of(args) == cfg
    args = build_parser().parse_args(["train", "--resume", str(tmp_path / "cut"),
                                      "--tau-choices", "1,1/2"])
    with pytest.raises(UsageError, match="tau_choices"):
        config_of(args)
    resumed = fit(cfg, resume=tmp_path / "cut", data=digits)
    a, b = _rows(whole.history), _rows(resumed.history)
    assert [x["step"] for x in a] == [x["step"] for x in b]
    assert [x["tau"] for x in a] == [x["tau"] for x in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= 1e-6, (x["step"], x["loss"], y["loss"])
    assert resumed.metrics["test_accuracy"] == whole.metrics["test_accuracy"]
    assert _same_parameters(resumed.model, whole.model) <= 1e-6
    with pytest.raises(ConfigError, match="differs in \\['tau_choices'\\]"):
        fit(cfg.replace(tau_choices=(1.0, 0.5)), resume=tmp_path / "cut", data=digits)


# -- the command line ----------------------------------------------------------------------------
def test_the_tau_choices_flag(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--epochs", "1", "--width", "16", "--heads", "2", "--depth", "1",
                 "--batch-size", "256", "--log-every", "1", "--tau-choices", "1, 1/2,0.25",
                 "--json", "--out", str(out)])
    assert code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["epochs"] == 1 and metrics["out"] == str(out)
    assert json.loads((out / "config.json").read_text())["tau_choices"] == [1.0, 0.5, 0.25]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["tau"] for r in rows if "loss" in r} <= {1.0, 0.5, 0.25}
    for bad, match in (("1,x", "expected comma-separated time steps"),
                       ("", "expected comma-separated time steps"),
                       ("1,1/0", "expected comma-separated time steps"),
                       ("1,0.3", "0.3 is not one"),
                       ("0.5,1/2", "must not repeat"),
                       ("-1", "finite numbers > 0")):
        with pytest.raises(SystemExit) as e:
            main(["train", "--tau-choices", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert "argument --tau-choices:" in err and match in err, (bad, err)
