"""Defects of the training floor, each with the test that failed before its fix: two writers on
one folder, torn and corrupt metrics lines on resume, the last epoch's test row after a kill,
unbounded N_t, config-file errors, a run folder without config.json, missing figure library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from splitformer.cli import build_parser, main
from splitformer.commands import UsageError
from splitformer.commands.train import config_of
from splitformer.training import ConfigError, TrainConfig
from splitformer.training import loop as fit_module
from splitformer.training.config import MAX_STEPS
from splitformer.training.data import load_dataset
from splitformer.training.loop import fit

ROOT = Path(__file__).resolve().parents[1]
EXE = [sys.executable, "-m", "splitformer"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
# one epoch of digits is 6 optimiser steps at batch 256
TINY = {"width": 16, "heads": 2, "depth": 1, "epochs": 1, "batch_size": 256, "log_every": 1,
        "threads": 1}
TINY_FLAGS = ["--width", "16", "--heads", "2", "--depth", "1", "--batch-size", "256",
              "--threads", "1"]


def _one_line_usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _wait(predicate, proc: subprocess.Popen, what: str, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the first process ended before {what}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- two writers on one folder ---------------------------------------------------------------
def test_a_second_sweep_on_one_out_is_refused_naming_the_first(tmp_path):
    """Two real `splitformer experiment` processes on one --out: the second is refused in one
    line naming the first's process (exit 2), and the first's results hold each run once."""
    out = tmp_path / "sweep"
    args = [*EXE, "experiment", "--out", str(out), "--epochs", "30", "--seed", "0,1",
            *TINY_FLAGS, "--no-progress"]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=ENV)
    try:
        _wait(lambda: (out / "sweep.json").exists(), first, "the sweep started")
        second = subprocess.run(args, capture_output=True, text=True, timeout=300, env=ENV)
        assert first.poll() is None, "the first sweep ended before the second started"
        assert second.returncode == 2, second.stderr
        line = second.stderr.strip()
        assert len(line.splitlines()) == 1 and f"pid {first.pid}" in line, line
        assert "in use by another process" in line
    finally:
        first.communicate(timeout=600)
    assert first.returncode == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in rows) == [0, 1]


def test_resuming_a_run_that_another_process_trains_is_refused(tmp_path):
    """`splitformer train --resume DIR` while another process trains into DIR (it has written a
    checkpoint): refused in one line naming that process; the first run is untouched."""
    run = tmp_path / "run"
    first = subprocess.Popen([*EXE, "train", "--out", str(run), "--epochs", "60",
                              "--checkpoint-every", "1", *TINY_FLAGS, "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        _wait(lambda: (run / "latest").exists(), first, "the first checkpoint")
        second = subprocess.run([*EXE, "train", "--resume", str(run), "--json"],
                                capture_output=True, text=True, timeout=300, env=ENV)
        assert first.poll() is None, "the first run ended before the second started"
        assert second.returncode == 2, second.stderr
        line = second.stderr.strip()
        assert len(line.splitlines()) == 1 and f"pid {first.pid}" in line, line
    finally:
        first.kill()
        first.communicate(timeout=60)


# -- metrics.jsonl on resume -------------------------------------------------------------------
def _cut_run(cut_fit, folder: Path, steps: int = 4) -> TrainConfig:
    cfg = TrainConfig(**{**TINY, "epochs": 2}, checkpoint_every=2)
    cut_fit(cfg, steps, out=folder)
    return cfg


def test_a_torn_last_metrics_line_is_cut_on_resume(tmp_path, cut_fit, capsys):
    run = tmp_path / "run"
    _cut_run(cut_fit, run, steps=5)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "epoch": 0, "lo')  # a kill or a full disk mid-line
    assert main(["train", "--resume", str(run), "--json"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "lr" in r]
    assert steps == list(range(1, 13))


def test_a_corrupt_middle_metrics_line_is_refused_in_one_line(tmp_path, cut_fit, capsys):
    run = tmp_path / "run"
    _cut_run(cut_fit, run, steps=5)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines.insert(1, "not json at all\n")
    (run / "metrics.jsonl").write_text("".join(lines))
    err = _one_line_usage_error(capsys, ["train", "--resume", str(run), "--json"])
    assert "metrics.jsonl" in err and "line 2" in err


# -- a kill during the last epoch's test evaluation ------------------------------------------
def test_a_kill_during_the_last_test_evaluation_keeps_the_test_row(tmp_path, monkeypatch):
    """checkpoint_every divides the total steps: the last checkpoint is written before the last
    epoch's test evaluation. A kill there, then --resume: the test row is made on resume."""
    cfg = TrainConfig(**TINY, checkpoint_every=3)
    digits = load_dataset("digits")
    real = fit_module._evaluate
    calls = {"n": 0}

    def killed(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 1:  # the epoch's test row, after the checkpoint at step 6
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(fit_module, "_evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        fit(cfg, out=tmp_path / "run", data=digits)
    monkeypatch.setattr(fit_module, "_evaluate", real)
    result = fit(cfg, resume=tmp_path / "run", data=digits)
    assert (tmp_path / "run" / "final.json").exists()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    tests = [r for r in rows if "lr" not in r]
    assert [(r["epoch"], r["step"]) for r in tests] == [(0, 6)]
    assert tests[0]["test_accuracy"] == result.metrics["test_accuracy"]


# -- N_t is bounded ------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, value", [("--tau-choices", "1e-300"), ("--tau", "1e-300"),
                                         ("--steps", str(MAX_STEPS + 1)),
                                         ("--tau-choices", "1,1e-5")])
def test_a_time_step_beyond_max_steps_is_refused_naming_the_flag(flag, value):
    args = build_parser().parse_args(["train", flag, value, "--depth", "1"])
    with pytest.raises(UsageError) as e:  # the CLI: this line on stderr, exit status 2
        config_of(args)
    err = str(e.value)
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"argument {flag}:") and str(MAX_STEPS) in err, err


def test_max_steps_holds_in_a_toml_file_and_at_the_limit(tmp_path, capsys):
    assert TrainConfig(depth=1, steps=MAX_STEPS).num_steps() == MAX_STEPS
    assert TrainConfig(depth=1, tau=1 / MAX_STEPS).num_steps() == MAX_STEPS
    path = tmp_path / "run.toml"
    path.write_text("tau_choices = [1e-300]\n")
    with pytest.raises(ConfigError, match=f"run.toml.*tau_choices.*{MAX_STEPS}"):
        TrainConfig.from_toml(path)
    err = _one_line_usage_error(capsys, ["train", "--config", str(path)])
    assert "run.toml" in err and "tau_choices" in err and "argument --" not in err


# -- --config files --------------------------------------------------------------------------------
def test_a_bad_value_in_a_config_file_names_the_file_and_key(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text("epochs = 0\n")
    err = _one_line_usage_error(capsys, ["train", "--config", str(path)])
    assert "argument --epochs" not in err and str(path) in err and "epochs must be >= 1" in err
    path.write_text('[train]\nwidth = "wide"\n')
    err = _one_line_usage_error(capsys, ["train", "--config", str(path)])
    assert "argument --width" not in err and str(path) in err and "width must be int" in err
    # a flag's bad value is still the flag's
    path.write_text("epochs = 3\n")
    err = _one_line_usage_error(capsys, ["train", "--config", str(path), "--lr", "-1"])
    assert err.startswith("splitformer train: error: argument --lr: lr must be"), err
    assert config_of(build_parser().parse_args(
        ["train", "--config", str(path), "--lr", "0.01"])) == TrainConfig(epochs=3, lr=0.01)


def test_a_flag_that_fails_beside_a_config_file_is_the_flags(tmp_path, capsys):
    """A value that is wrong only with the file's other values (heads must divide the file's
    width; tau must divide the file's depth) is the flag's, not the file's."""
    path = tmp_path / "run.toml"
    path.write_text("width = 64\ndepth = 4\n")
    err = _one_line_usage_error(capsys, ["train", "--config", str(path), "--heads", "3"])
    assert err.startswith("splitformer train: error: argument --heads: heads=3"), err
    assert str(path) not in err
    err = _one_line_usage_error(capsys, ["train", "--config", str(path), "--tau", "0.3"])
    assert err.startswith("splitformer train: error: argument --tau: tau=0.3"), err


def test_a_config_file_on_resume_may_repeat_the_run_not_change_it(tmp_path, cut_fit, capsys):
    run = tmp_path / "run"
    cfg = _cut_run(cut_fit, run, steps=3)
    other = tmp_path / "other.toml"
    other.write_text(f"lr = {cfg.lr * 10}\n")
    err = _one_line_usage_error(capsys, ["train", "--resume", str(run), "--config", str(other)])
    assert "argument --resume" in err and "['lr']" in err  # before: silently ignored
    same = tmp_path / "same.toml"
    same.write_text(f"lr = {cfg.lr}\n")
    assert main(["train", "--resume", str(run), "--config", str(same), "--json"]) == 0


def test_a_folder_given_as_config_is_named_a_folder(tmp_path, capsys):
    err = _one_line_usage_error(capsys, ["train", "--config", str(tmp_path)])
    assert "is a folder" in err and "does not exist" not in err


def test_a_run_folder_without_config_json_resumes_from_its_checkpoint(tmp_path, cut_fit,
                                                                     capsys):
    run = tmp_path / "run"
    cfg = _cut_run(cut_fit, run, steps=3)
    (run / "config.json").unlink()
    assert main(["train", "--resume", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 12
    assert TrainConfig.from_dict(json.loads((run / "config.json").read_text())) == cfg


# -- dependencies of the main jobs -------------------------------------------------------------
def test_the_main_jobs_dependencies_are_default_dependencies():
    """train (rich, scikit-learn's digits), experiment (matplotlib) and analyze (matplotlib,
    Pillow) run after a bare `pip install splitformer`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower()
             for d in project["dependencies"]}
    assert {"torch", "numpy", "safetensors", "rich", "scikit-learn", "matplotlib",
            "pillow"} <= names


def test_experiment_without_matplotlib_is_refused_before_training(tmp_path):
    out = tmp_path / "sweep"
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from splitformer.cli import main\n"
            f"raise SystemExit(main(['experiment', '--out', {str(out)!r}, '--epochs', '1', "
            "'--width', '16', '--heads', '2', '--depth', '1', '--no-progress']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=ENV)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "matplotlib" in line, line
    assert not (out / "runs").exists() and not (out / "results.jsonl").exists()


# -- what the trial of issue 16 found -------------------------------------------------------------
def test_an_out_that_is_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    err = _one_line_usage_error(capsys, ["train", *TINY_FLAGS, "--epochs", "1", "--out", str(f)])
    assert "is a file, expected a folder" in err
    err = _one_line_usage_error(capsys, ["train", *TINY_FLAGS, "--epochs", "1", "--out",
                                         str(f / "sub")])
    assert "cannot make the folder" in err
    assert f.read_text() == "keep me"


def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path, cut_fit, capsys):
    """Killed in its first epoch with checkpoints only at epoch ends: no checkpoint, so nothing
    can resume it; the same --out starts it again (before: each message sent the user to the
    other, --resume and --out both refused)."""
    run = tmp_path / "run"
    cut_fit(TrainConfig(**{**TINY, "epochs": 2}), 3, out=run)
    assert (run / "metrics.jsonl").exists() and not (run / "latest").exists()
    err = _one_line_usage_error(capsys, ["train", "--resume", str(run)])
    assert "holds no complete checkpoint" in err and "start it again with --out" in err
    assert main(["train", *TINY_FLAGS, "--log-every", "1", "--epochs", "2", "--out", str(run),
                 "--json"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "lr" in r]
    assert steps == sorted(set(steps)) == list(range(1, 13))  # the old rows replaced
    err = _one_line_usage_error(capsys, ["train", *TINY_FLAGS, "--out", str(run)])
    assert "holds a finished run" in err


def test_resuming_a_missing_folder_says_so(tmp_path, capsys):
    err = _one_line_usage_error(capsys, ["train", "--resume", str(tmp_path / "nope")])
    assert "is not a folder" in err


def test_resuming_a_run_that_has_no_checkpoint_yet_names_its_process(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from splitformer.files import FolderLock; "
                               "lock = FolderLock(sys.argv[1]).acquire(); "
                               "print('held', flush=True); time.sleep(60)", str(run)],
                              stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        err = _one_line_usage_error(capsys, ["train", "--resume", str(run)])
        assert f"pid {holder.pid}" in err, err
    finally:
        holder.kill()
        holder.wait()


def test_a_refused_experiment_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "a" / "sweep"
    err = _one_line_usage_error(capsys, ["experiment", "--scheme", "lie,nope", "--epochs", "1",
                                         "--out", str(out)])
    assert "unknown: ['nope']" in err
    _one_line_usage_error(capsys, ["experiment", "--kernel", "softmaxx", "--out", str(out)])
    assert not (tmp_path / "a").exists()


def test_a_list_of_scheme_names_is_not_one_scheme(capsys):
    err = _one_line_usage_error(capsys, ["train", "--scheme", "lie,strang", "--epochs", "1"])
    assert "a list of names, not one scheme" in err and "experiment" in err
