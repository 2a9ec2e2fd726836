"""`splitformer experiment`: a sweep writes its table, is never redone, and a killed sweep
finishes on restart (issue 9, deliverable 3); the sweep file, the table's statistics and the
reproducing commands."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splitformer.cli import build_parser
from splitformer.commands.train import config_of
from splitformer.experiments import (
    Evaluation,
    Sweep,
    SweepError,
    read_results,
    run_sweep,
    summarise,
    tie,
)
from splitformer.training import TrainConfig

TINY = ["--width", "16", "--heads", "2", "--depth", "1", "--data", "digits"]
EXE = [sys.executable, "-m", "splitformer"]


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*EXE, "experiment", *args], capture_output=True, text=True,
                          timeout=300, **kw)


def _mtimes(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_two_run_sweep_writes_the_table_and_a_rerun_does_nothing(tmp_path):
    out = tmp_path / "sweep"
    args = ["--out", str(out), "--epochs", "2", "--seed", "0,1", *TINY, "--no-progress"]
    first = _run(args)
    assert first.returncode == 0, first.stderr
    rows = read_results(out / "results.jsonl")
    assert [r["seed"] for r in rows] == [0, 1]
    table = json.loads((out / "table.json").read_text())
    assert len(table) == 1 and table[0]["seeds"] == [0, 1]
    values = [r["value"] for r in rows]
    assert table[0]["test_accuracy"]["mean"] == pytest.approx(statistics.mean(values))
    assert table[0]["test_accuracy"]["std"] == pytest.approx(statistics.stdev(values))
    md = (out / "table.md").read_text()
    assert "test_accuracy" in md and "splitformer train" in md
    for kind in ("bars", "curves"):
        for ext in ("png", "svg"):
            assert (out / f"sweep-{kind}.{ext}").stat().st_size > 1000
    for r in rows:  # each run trained for real: its folder has final metrics equal to the row
        final = json.loads((out / r["run_dir"] / "final.json").read_text())
        assert final["test_accuracy"] == r["value"] and final["epochs"] == 2

    before = _mtimes(out / "runs")
    lines = (out / "results.jsonl").read_text()
    again = _run([a for a in args if a != "--no-progress"])
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("done already") == 2
    assert (out / "results.jsonl").read_text() == lines
    assert _mtimes(out / "runs") == before  # nothing was retrained or rewritten


@pytest.mark.slow  # 50-170 s (subprocesses): make test-slow
def test_a_sweep_killed_after_its_first_run_finishes_the_second_on_restart(tmp_path):
    """The second run is killed after a checkpoint; the restart resumes it, leaves the first
    alone, and the resumed run's metrics equal an uninterrupted run's."""
    out = tmp_path / "killed"
    args = ["--out", str(out), "--epochs", "1,6", "--checkpoint-every", "4", *TINY,
            "--no-progress"]
    proc = subprocess.Popen([*EXE, "experiment", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 240
    second = None
    try:
        while time.time() < deadline:
            if len(read_results(out / "results.jsonl")) == 1:
                runs = [p for p in (out / "runs").iterdir() if p.name.startswith("epochs=6")]
                if runs and (runs[0] / "latest").exists():
                    second = runs[0]
                    break
            if proc.poll() is not None:
                pytest.fail(f"the sweep ended before it could be killed: {proc.stderr.read()}")
            time.sleep(0.05)
        assert second is not None, "the second run wrote no checkpoint in time"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (second / "final.json").exists()
    from splitformer.training.checkpoints import load_checkpoint

    seconds_before_kill = load_checkpoint(second, restore_rng=False)["seconds"]
    first_line = (out / "results.jsonl").read_text()
    first_files = {k: v for k, v in _mtimes(out / "runs").items() if "epochs=1-" in k}

    restart = _run(args)
    assert restart.returncode == 0, restart.stderr
    rows = read_results(out / "results.jsonl")
    assert len(rows) == 2 and (out / "results.jsonl").read_text().startswith(first_line)
    assert {k: v for k, v in _mtimes(out / "runs").items() if "epochs=1-" in k} == first_files
    assert rows[1]["resumed"] is True and rows[1]["metrics"]["epochs"] == 6
    # the training time counts the attempt before the kill (kept in the checkpoint) too
    assert rows[1]["metrics"]["seconds"] > seconds_before_kill > 0

    whole = _run(["--out", str(tmp_path / "whole"), "--epochs", "6", "--checkpoint-every", "4",
                  *TINY, "--no-progress"])
    assert whole.returncode == 0, whole.stderr
    uninterrupted = read_results(tmp_path / "whole" / "results.jsonl")[0]
    assert rows[1]["value"] == uninterrupted["value"]
    assert rows[1]["metrics"]["steps"] == uninterrupted["metrics"]["steps"]


def test_sweep_file_variants_axes_and_evaluation(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text("""
[sweep]
name = "demo"
[base]
width = 16
heads = 2
depth = 2
epochs = 1
[axes]
seed = [0, 1]
[[variants]]
label = "pre-norm"
scheme = "prenorm"
[[variants]]
label = "Strang, half-width FFN"
scheme = "strang"
integrator = "euler"
ffn_ratio = 1.0
[evaluate]
taus = [1, 0.5]
""")
    sweep = Sweep.from_toml(spec)
    runs = sweep.runs()
    assert [(r.label, r.seed) for r in runs] == [("pre-norm", 0), ("pre-norm", 1),
                                                 ("Strang, half-width FFN", 0),
                                                 ("Strang, half-width FFN", 1)]
    assert runs[2].config.ffn_ratio == 1.0 and runs[2].config.integrator == "euler"
    assert runs[0].config.ffn_ratio == TrainConfig().ffn_ratio
    assert sweep.evaluation == Evaluation(taus=(1.0, 0.5))
    assert len({r.id for r in runs}) == 4 and runs[0].id == Sweep.from_toml(spec).runs()[0].id


@pytest.mark.parametrize("doc, match", [
    ({"base": {"widht": 16}}, "unknown keys"),
    ({"axes": {"seed": []}}, "non-empty list"),
    ({"axes": {"seed": [0, 0]}}, "twice"),
    ({"axes": {"lr": [-1.0]}}, "lr must be"),
    ({"variants": [{"label": "a"}, {"label": "a"}]}, "distinct"),
    ({"variants": [{"scheme": "lie"}]}, "needs a label"),
    ({"evaluate": {"taus": [0]}}, "taus"),
    ({"evaluate": {"nope": 1}}, "unknown keys"),
    ({"extra": {}}, "unknown tables"),
    ({"sweep": {"metric": "accuracy"}}, "metric"),
])
def test_a_bad_sweep_is_refused_naming_the_key(doc, match):
    with pytest.raises(SweepError, match=match):
        Sweep.from_dict(doc)


def test_each_rows_command_rebuilds_its_runs_config():
    """The command printed for a row, given to `splitformer train`, makes the same config."""
    sweep = Sweep(base={"width": 16, "heads": 2, "depth": 2},
                  variants=[{"label": "strang", "scheme": "strang", "integrator": "euler",
                             "ffn_ratio": 1.0}, {"label": "post", "scheme":
                             "attention norm1:project ffn norm2:project"},
                            {"label": "odd numbers", "lr": 0.0012345678, "steps": 6,
                             "tau_choices": [1 / 3, 1 / 6]}],
                  axes={"seed": [3], "kinetic": [0.0, 0.01]})
    import shlex

    parser = build_parser()
    for run in sweep.runs():
        argv = shlex.split(run.command)
        assert argv[:2] == ["splitformer", "train"]
        args = parser.parse_args(argv[1:])
        assert config_of(args) == run.config


def test_summarise_groups_by_label_with_mean_and_sample_std():
    rows = [{"label": "a", "seed": s, "metric": "test_accuracy", "value": v, "parameters": 10,
             "seconds_per_epoch": 1.0 + s, "command": f"c{s}", "evaluation": {}}
            for s, v in enumerate([0.9, 0.8, 0.7])]
    rows.append({**rows[0], "label": "b", "value": 0.5})
    table = summarise(rows)
    assert [t["label"] for t in table] == ["a", "b"]
    assert table[0]["test_accuracy"]["mean"] == pytest.approx(0.8)
    assert table[0]["test_accuracy"]["std"] == pytest.approx(statistics.stdev([0.9, 0.8, 0.7]))
    assert table[1]["test_accuracy"]["std"] == 0.0


@pytest.mark.parametrize("args, flag", [
    (["--lr", "x"], "--lr"),
    (["--lr", "-1"], "--lr"),
    (["--seed", "0,,1"], "--seed"),
    (["--seed", "1,1"], "--seed"),
    (["--eval-tau", "a"], "--eval-tau"),
    (["--eval-tau", "0"], "--eval-tau"),
    (["--only", "nope"], "--only"),
    (["--jobs", "0"], "--jobs"),
    (["--family", "nope"], "--family"),
    (["--data", "nope"], "--data"),
    (["/nonexistent/sweep.toml"], "does not exist"),
])
def test_bad_flags_are_one_line_usage_errors(args, flag, tmp_path):
    res = _run(["--out", str(tmp_path / "o"), *args])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], res.stderr
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_help_and_json(tmp_path):
    r = subprocess.run([*EXE, "experiment", "--help"], capture_output=True, text=True,
                       check=True)
    for flag in ("--jobs", "--only", "--eval-tau", "--scheme", "--tau-choices", "--json"):
        assert flag in r.stdout
    r = _run(["--out", str(tmp_path / "j"), "--epochs", "1", *TINY, "--json",
              "--eval-tau", "1,0.5", "--tau-choices", "1,0.5"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (row,) = doc["rows"]
    assert set(row["at_tau"]) == {"1", "0.5"} and row["seeds"] == [0]
    for path in doc["figures"]:
        assert Path(path).stat().st_size > 1000
    result = read_results(tmp_path / "j" / "results.jsonl")[0]
    assert result["config"]["tau_choices"] == [1.0, 0.5]
    assert row["at_tau"]["0.5"]["mean"] == result["evaluation"]["at_tau"]["0.5"]["test_accuracy"]


def test_a_trained_run_is_evaluated_again_not_retrained(tmp_path):
    """A run trained but without its line (killed before it was written), or whose line holds
    another evaluation, is evaluated from its final checkpoint: its folder is not touched."""
    out = tmp_path / "again"
    base = ["--out", str(out), "--epochs", "1", *TINY, "--no-progress"]
    assert _run(base).returncode == 0
    folder = out / read_results(out / "results.jsonl")[0]["run_dir"]
    before = _mtimes(folder)
    first = read_results(out / "results.jsonl")[0]
    (out / "results.jsonl").write_text("")  # the line was never written
    res = _run(base)
    assert res.returncode == 0, res.stderr
    assert _mtimes(folder) == before
    assert read_results(out / "results.jsonl")[0]["value"] == first["value"]
    res = _run([*base, "--eval-tau", "1,1/2"])  # another evaluation: evaluated, not trained
    assert res.returncode == 0, res.stderr
    assert _mtimes(folder) == before
    rows = read_results(out / "results.jsonl")
    assert len(rows) == 2 and set(rows[-1]["evaluation"]["at_tau"]) == {"1", "0.5"}
    assert rows[-1]["evaluation"]["at_tau"]["1"]["test_accuracy"] == first["value"]


@pytest.mark.slow  # 50-170 s (subprocesses): make test-slow
def test_a_failing_run_does_not_lose_the_others(tmp_path):
    """lr = 1e9 makes the loss non-finite: that run fails (exit 1, one line naming it), the
    other finishes and is tabulated, with two workers as with one."""
    for jobs in ("1", "2"):
        out = tmp_path / f"fail{jobs}"
        res = _run(["--out", str(out), "--epochs", "1", "--lr", "0.002,1e9", "--jobs", jobs,
                    *TINY, "--no-progress"])
        assert res.returncode == 1, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "1 of 2 runs failed" in lines[0] and "lr=1e+09" in lines[0]
        assert [r["config"]["lr"] for r in read_results(out / "results.jsonl")] == [0.002]
        table = _run(["--out", str(out), "--epochs", "1", "--lr", "0.002,1e9", *TINY,
                      "--table-only", "--json"])
        assert table.returncode == 0, table.stderr
        assert [r["label"] for r in json.loads(table.stdout)["rows"]] == ["lr=0.002"]


def test_only_trains_the_selected_rows_and_tabulates_every_finished_one(tmp_path):
    out = tmp_path / "only"
    args = ["--out", str(out), "--epochs", "1", "--scheme", "prenorm,parallel", *TINY,
            "--no-progress", "--json"]
    res = _run([*args, "--only", "scheme=parallel"])
    assert res.returncode == 0, res.stderr
    assert [r["label"] for r in json.loads(res.stdout)["rows"]] == ["scheme=parallel"]
    assert _run([*args, "--only", "scheme=prenorm"]).returncode == 0
    rows = json.loads((out / "table.json").read_text())
    assert [r["label"] for r in rows] == ["scheme=prenorm", "scheme=parallel"]
    empty = _run(["--out", str(tmp_path / "empty"), "--table-only", *TINY])
    assert empty.returncode == 2 and "no finished run" in empty.stderr


def test_the_evaluations_equal_direct_computations(tmp_path):
    """at_tau, the kinetic energy and adaptive depth of a line are those of the trained model
    computed here with the library's own entry points."""
    import torch

    from splitformer.analysis import adaptive_depth
    from splitformer.control import KineticEnergy
    from splitformer.time.saveat import SaveAt
    from splitformer.training import build_model, load_dataset
    from splitformer.training.checkpoints import load_checkpoint
    from splitformer.training.loop import evaluate

    ev = Evaluation(taus=(1.0, 0.5), kinetic=True, inputs=16, adaptive=(0.3, 0.05),
                    adaptive_levels=(1, 2))
    sweep = Sweep(base={"width": 16, "heads": 2, "depth": 2, "epochs": 1}, evaluation=ev)
    (row,) = run_sweep(sweep, tmp_path)
    (run,) = sweep.runs()
    data = load_dataset("digits")
    model = build_model(run.config, data)
    load_checkpoint(tmp_path / row["run_dir"], model=model, restore_rng=False)
    model.eval()
    got = row["evaluation"]
    assert got["at_tau"]["0.5"] == evaluate(model.refine(2), data, run.config)
    with torch.no_grad():
        path = model.trajectory(data.test.x[:16], saveat=SaveAt(steps=True))
        kinetic = float(KineticEnergy(1.0).value(model, path))
    assert got["kinetic_energy"] == pytest.approx(kinetic, rel=1e-6)
    res = adaptive_depth(model, (data.test.x,), 0.05, levels=(1, 2), logits=lambda o: o)
    assert got["adaptive"][1]["accuracy"] == pytest.approx(res.accuracy(data.test.y))
    assert got["adaptive"][1]["mean_steps"] == pytest.approx(res.mean_steps)


def test_an_evaluation_a_run_cannot_take_is_refused_before_training():
    with pytest.raises(SweepError, match="taus"):
        Sweep(base={"steps": 8, "depth": 4}, evaluation=Evaluation(taus=(1.0,)))
    with pytest.raises(SweepError, match="taus"):
        Sweep(evaluation=Evaluation(taus=(0.3,)))
    with pytest.raises(SweepError, match="order_ks"):
        Sweep.from_dict({"evaluate": {"order": True, "order_ks": [0]}})
    with pytest.raises(SweepError, match="same settings"):
        Sweep(variants=[{"label": "a", "scheme": "prenorm"}, {"label": "b", "scheme": "prenorm"}])


def test_tie_is_one_standard_deviation_of_the_larger():
    a = {"mean": 0.9863, "std": 0.0055, "n": 3}
    assert tie(a, {"mean": 0.9808, "std": 0.0027, "n": 3})  # equal to the std: a tie
    assert not tie(a, {"mean": 0.9707, "std": 0.0079, "n": 3})
    assert tie({"mean": 0.5, "std": 0.0, "n": 1}, {"mean": 0.5, "std": 0.0, "n": 1})
    assert not tie(a, None)


def _default_sigint() -> None:
    """In the child: Ctrl-C's default action, even when this test runs in a background job
    (a non-interactive shell starts background jobs with SIGINT ignored, and Python keeps an
    ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_is_one_line_and_keeps_the_finished_runs(tmp_path, jobs):
    out = tmp_path / "int"
    proc = subprocess.Popen([*EXE, "experiment", "--out", str(out), "--epochs", "1,200",
                             "--jobs", jobs, *TINY, "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)
    deadline = time.time() + 240
    while time.time() < deadline and len(read_results(out / "results.jsonl")) < 1:
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err, err
    assert len(read_results(out / "results.jsonl")) == 1


@pytest.mark.parametrize("args, needle", [
    (["--name", "a/b"], "plain file name"),
    (["--out", "/proc/version/x"], "--out"),
    (["--eval-tau", "1,1"], "repeat"),
    (["--eval-adaptive", "0.1,0.1"], "repeat"),
    (["--family", "lm", "--data", "text", "--seq-len", "8", "--family", "vit"],
     "share one metric"),
])
def test_more_bad_inputs_are_one_line_usage_errors(tmp_path, args, needle):
    res = _run(["--out", str(tmp_path / "o"), *TINY, *args])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


@pytest.mark.parametrize("doc, match", [
    ({"base": {"out": "x"}}, "out is not a sweep key"),
    ({"axes": {"out": ["x"]}}, "out is not a sweep key"),
    ({"sweep": {"metric": "test_bpc"}}, "does not fit"),
    ({"sweep": {"name": "../x"}}, "plain file name"),
])
def test_sweep_keys_that_cannot_be_honoured_are_refused(doc, match):
    with pytest.raises(SweepError, match=match):
        Sweep.from_dict(doc)


def test_a_file_error_names_the_file_key_not_a_flag(tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text('[base]\nwidth = "sixteen"\n')
    res = _run([str(spec), "--out", str(tmp_path / "o")])
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "width must be int" in line and "argument --width" not in line and "axes" not in line


def test_lines_that_are_not_results_are_named_and_left_out(tmp_path):
    out = tmp_path / "lines"
    args = ["--out", str(out), "--epochs", "1", *TINY]
    assert _run([*args, "--no-progress"]).returncode == 0
    with (out / "results.jsonl").open("a") as f:
        f.write('42\n{"foo": 1}\nnot json\n')
    res = _run([*args, "--table-only"])
    assert res.returncode == 0, res.stderr
    assert "3 line(s)" in res.stderr and "line 2, 3, 4" in res.stderr


def test_tau_choices_are_a_set():
    a = TrainConfig(tau_choices=(0.25, 1.0, 0.5))
    assert a == TrainConfig(tau_choices=[1, 0.5, 0.25]) and a.tau_choices == (1.0, 0.5, 0.25)


def test_list_valued_flags_are_one_value_each(tmp_path):
    """--tau-choices and --patch-choices take one comma-separated list per flag (a Setting with
    is_list): '--patch-choices 4,2' is one run with two patch sizes, not an axis of two runs."""
    from splitformer.commands.experiment import _values
    from splitformer.training.config import settings

    table = settings()
    assert [k for k, s in table.items() if s.is_list] == ["tau_choices", "patch_choices"]
    assert _values("patch_choices", ["4,2"], table["patch_choices"]) == [[4, 2]]
    assert _values("patch_choices", ["4,2", "4"], table["patch_choices"]) == [[4, 2], [4]]
    assert _values("tau_choices", ["1,0.5"], table["tau_choices"]) == [[1.0, 0.5]]
