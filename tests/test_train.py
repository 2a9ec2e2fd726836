"""Training: the config, the fit loop (determinism, resume, faults) and `splitformer train`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from splitformer.training import ConfigError, TrainConfig
from splitformer.training import loop as fit_module
from splitformer.training.loop import TrainingError, fit

TINY = {"width": 16, "heads": 2, "depth": 2, "epochs": 2, "batch_size": 128, "log_every": 1,
        "dropout": 0.1, "checkpoint_every": 4}


def _rows(history):
    return [r for r in history if "loss" in r]


def test_config_checks_keys_and_types(tmp_path):
    with pytest.raises(ConfigError, match="unknown config keys \\['bogus'\\]"):
        TrainConfig.from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match="lr must be float, got 'high'"):
        TrainConfig(lr="high")
    with pytest.raises(ConfigError, match="epochs must be int, got True"):
        TrainConfig(epochs=True)
    with pytest.raises(ConfigError, match="heads=3 must divide width=16"):
        TrainConfig(width=16, heads=3)
    with pytest.raises(ConfigError, match="steps must be a positive multiple of depth=4"):
        TrainConfig(steps=6)
    with pytest.raises(ConfigError, match="disagree"):
        TrainConfig(steps=8, tau=0.25)
    assert TrainConfig(tau=0.5).num_steps() == 8
    f = tmp_path / "run.toml"
    f.write_text('[train]\nfamily = "vit"\nlr = 0.01\nepochs = 3\n')
    cfg = TrainConfig.from_toml(f).replace(epochs=5, lr=None)
    assert (cfg.lr, cfg.epochs) == (0.01, 5)  # the file's lr, the flag's epochs
    f.write_text('lr = "x"\n')
    with pytest.raises(ConfigError, match="lr must be float"):
        TrainConfig.from_toml(f)
    f.write_text("lr = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        TrainConfig.from_toml(f)


def test_fit_is_deterministic_for_a_seed(tmp_path):
    cfg = TrainConfig(**TINY)
    a = fit(cfg, out=tmp_path / "a")
    b = fit(cfg, out=tmp_path / "b")
    assert [r["loss"] for r in _rows(a.history)] == [r["loss"] for r in _rows(b.history)]
    c = fit(cfg.replace(seed=1), out=tmp_path / "c")
    assert [r["loss"] for r in _rows(a.history)] != [r["loss"] for r in _rows(c.history)]
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == a.history
    assert set(a.metrics) >= {"test_accuracy", "epochs", "seconds", "parameters"}


def test_resume_continues_the_same_loss_curve(tmp_path, cut_fit):
    """A run interrupted after step 9 and resumed from its checkpoint (step 8) logs the same
    losses as the uninterrupted run, to 1e-6 at every logged step (dropout on)."""
    cfg = TrainConfig(**TINY)
    whole = fit(cfg, out=tmp_path / "whole")
    cut_fit(cfg, 9, out=tmp_path / "cut")
    resumed = fit(cfg, resume=tmp_path / "cut")
    a, b = _rows(whole.history), _rows(resumed.history)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= 1e-6, (x["step"], x["loss"], y["loss"])
    assert resumed.metrics["test_accuracy"] == whole.metrics["test_accuracy"]
    with pytest.raises(ConfigError, match="differs in \\['lr'\\]"):
        fit(cfg.replace(lr=0.1), resume=tmp_path / "cut")


def test_a_non_finite_loss_stops_naming_the_step_and_keeps_the_checkpoint(tmp_path,
                                                                          monkeypatch):
    cfg = TrainConfig(**TINY)
    real_step = fit_module._step_on
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        obj, correct, n = real_step(*args, **kwargs)
        if calls["n"] == 6:
            obj.total = obj.total * float("nan")
        return obj, correct, n

    monkeypatch.setattr(fit_module, "_step_on", poisoned)
    with pytest.raises(TrainingError, match="at step 5 .*last good checkpoint"):
        fit(cfg, out=tmp_path / "nan")
    from splitformer.training.checkpoints import load_checkpoint

    assert load_checkpoint(tmp_path / "nan", restore_rng=False)["step"] == 4


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "splitformer", "train", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # 50-170 s (subprocesses): make test-slow
def test_cli_json_and_errors(tmp_path):
    r = _cli("--width", "16", "--heads", "2", "--depth", "2", "--epochs", "1", "--json",
             "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"test_accuracy", "epochs", "seconds", "parameters"}
    assert out["epochs"] == 1 and (tmp_path / "run" / "metrics.jsonl").exists()
    for bad, match in ((["--epochs", "0"], "argument --epochs"),
                       (["--lr", "abc"], "argument --lr"),
                       (["--family", "lm"], "does not fit data"),
                       (["--kernel", "flash"], "kernel"),
                       (["--scheme", "lei"], "unknown scheme"),
                       (["--resume", str(tmp_path / "none")], "argument --resume"),
                       (["--config", str(tmp_path / "none.toml")], "does not exist")):
        r = _cli(*bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and match in r.stderr, (bad, r.stderr)


@pytest.mark.slow
def test_default_run_reaches_the_bar(tmp_path):
    """`splitformer train --json` with the defaults: test accuracy >= 0.97 on digits."""
    torch.set_num_threads(2)
    r = _cli("--json", "--out", str(tmp_path / "run"), timeout=900)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["test_accuracy"] >= 0.97


@pytest.mark.slow  # 50-170 s (subprocesses): make test-slow
def test_a_run_killed_with_sigkill_resumes_with_nothing_lost(tmp_path):
    """`splitformer train` killed with kill -9 while it runs (and writes checkpoints every
    step) resumes from its last complete checkpoint to the uninterrupted run's final model."""
    import os
    import signal
    import time

    args = ["--width", "16", "--heads", "2", "--depth", "2", "--epochs", "3",
            "--batch-size", "64", "--checkpoint-every", "1", "--log-every", "1",
            "--dropout", "0.1", "--threads", "1", "--json", "--no-progress"]
    whole = _cli(*args, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    cut = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "splitformer", "train", *args, "--out",
                             str(cut)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (cut / "latest").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a few more steps and checkpoint writes
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (cut / "final.json").exists()
    resumed = _cli("--resume", str(cut), "--json", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    a, b = json.loads(whole.stdout), json.loads(resumed.stdout)
    assert a["test_accuracy"] == b["test_accuracy"] and a["steps"] == b["steps"]
    rows = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [r["step"] for r in ref]
    for x, y in zip(rows, ref, strict=True):
        if "loss" in x:
            assert abs(x["loss"] - y["loss"]) <= 1e-6, (x["step"], x["loss"], y["loss"])


@pytest.mark.slow  # 50-170 s (subprocesses): make test-slow
def test_cli_refuses_what_the_trial_found(tmp_path):
    """Bad input a new user tried: each one line, exit status 2, before any training."""
    done = tmp_path / "done"
    r = _cli("--width", "16", "--heads", "2", "--depth", "2", "--epochs", "1", "--json",
             "--out", str(done))
    assert r.returncode == 0, r.stderr
    for bad, match in ((["--patch", "0"], "patch must be"),
                       (["--family", "encoder"], "does not fit data 'digits'"),
                       (["--width", "100000", "--heads", "2"], "does not fit in memory"),
                       (["--out", str(done)], "holds a finished run (final.json)"),
                       (["--resume", str(done)], "is complete"),
                       ):
        r = _cli(*bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and match in r.stderr, (bad, r.stderr)


def test_a_kill_between_the_last_checkpoint_of_an_epoch_and_its_test_row(tmp_path, monkeypatch):
    """Killed after the checkpoint of an epoch's last step but before that epoch's test-set
    row was logged: the resumed log has the row (the same metrics) and equals the
    uninterrupted one."""
    cfg = TrainConfig(width=16, heads=2, depth=2, epochs=2, batch_size=256, checkpoint_every=1,
                      log_every=1, dropout=0.0, threads=1)
    whole = fit(cfg, out=tmp_path / "whole")
    real = fit_module._evaluate

    def killed(*args, **kwargs):  # the first epoch's evaluation never happens
        raise KeyboardInterrupt

    monkeypatch.setattr(fit_module, "_evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        fit(cfg, out=tmp_path / "cut")
    monkeypatch.setattr(fit_module, "_evaluate", real)
    resumed = fit(cfg, resume=tmp_path / "cut")
    untimed = [{k: v for k, v in r.items() if k != "examples_per_s"} for r in whole.history]
    assert [{k: v for k, v in r.items() if k != "examples_per_s"}
            for r in resumed.history] == untimed
