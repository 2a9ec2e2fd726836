"""benchmarks/merge_vit.py on a tiny ViT and synthetic images (no data files): the accuracy grid
is what ``evaluate`` gives the merged model, r = 0 is the unmerged model, the merge-trained
model at its own r is the model as trained, the throughput rows and node counts are there, and
a rerun does no finished work again (a new r only evaluates its cells). No timing is asserted
(benchmarks never are)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from splitformer.training.data import Dataset, Split
from splitformer.training.loop import evaluate

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("merge_vit", ROOT / "benchmarks" / "merge_vit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mv = _script()
OPTIONS = {"keys +w": ("keys", True), "keys": ("keys", False), "state +w": ("state", True),
           "state": ("state", False)}  # the columns: ToMe's metric, +w = proportional weights


def _data(n_train: int = 64, n_test: int = 100) -> Dataset:
    """28 x 28 one-channel noise images whose class (of 3) sets a brighter square's place (the
    noise makes every patch differ, so merges change predictions)."""
    g = torch.Generator().manual_seed(0)

    def split(n: int) -> Split:
        y = torch.randint(0, 3, (n,), generator=g)
        x = torch.rand(n, 1, 28, 28, generator=g)
        for i, c in enumerate(y.tolist()):
            x[i, 0, 7 * c:7 * c + 7, 7 * c:7 * c + 7] += 0.5
        return Split(x, y)

    return Dataset("fashion-mnist", "classify", split(n_train), split(n_test), num_classes=3,
                   input_shape=(1, 28, 28))


def _args(out: Path, *extra: str):
    return mv.arguments(["--out", str(out), "--seeds", "0", "--rs", "2,4", "--train-merge",
                         "2", "--train-size", "64", "--test-size", "100", "--monitor-size", "8",
                         "--epochs", "1", "--batch-size", "32", "--patch", "7", "--width", "16",
                         "--depth", "2", "--heads", "2", "--time-batch", "8", "--repeats", "1",
                         "--warmup", "0", *extra])


def test_grid_throughput_table_and_resume(tmp_path, monkeypatch):
    args = _args(tmp_path)
    assert args.rs == (0, 2, 4)
    data = _data()
    results = mv.sweep(args, data=data)
    assert set(results["runs"]) == {"plain-s0", "merge2-s0"}
    assert list(mv.VARIANTS) == list(OPTIONS)
    configs = mv.run_configs(args)
    assert configs["merge2-s0"].merge == 2 and configs["plain-s0"].merge == 0

    for run_id, cfg in configs.items():
        row = results["runs"][run_id]
        model, _ = mv.trained(cfg, data, tmp_path / "runs" / run_id)  # loaded: final.json
        plain = model.with_token_merging(None)
        at0 = evaluate(plain, data, cfg)["test_accuracy"]
        assert all(row["accuracy"][v]["0"] == at0 for v in mv.VARIANTS)
        assert row["as_trained"] == evaluate(model, data, cfg)["test_accuracy"]
        # each cell is evaluate of with_token_merging with that variant's options (and the
        # variants do differ on these images, so a mixed-up option would show)
        assert len({json.dumps(row["accuracy"][v]) for v in mv.VARIANTS}) > 1
        for v, (metric, proportional) in OPTIONS.items():
            for r in (2, 4):
                m = plain.with_token_merging(r, metric=metric, where="attention",
                                             proportional=proportional)
                assert row["accuracy"][v][str(r)] == evaluate(m, data, cfg)["test_accuracy"]
    # the merge-trained model at its own r (keys, after attention, weights) is itself
    trained_row = results["runs"]["merge2-s0"]
    assert trained_row["as_trained"] == trained_row["accuracy"]["keys +w"]["2"]

    tp = results["throughput"]["rows"]
    assert set(tp) == set(mv.VARIANTS)
    for v in mv.VARIANTS:
        assert tp[v]["0"]["ratio"] == 1.0
        # 1 + 16 nodes at patch 7; r per layer over 2 layers (clipped to half the mergeable)
        assert tp[v]["0"]["nodes"] == [17]
        assert tp[v]["2"]["nodes"] == [17, 15, 13]
        assert tp[v]["4"]["nodes"] == [17, 13, 9]
        assert all(c["images_per_s"] > 0 and len(c["times_s"]) == 1 for c in tp[v].values())
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == results

    text = mv.tables(results, args)
    assert "| 4 | 17 > 13 > 9 |" in text
    assert text.count("\n| 2 | ") == 3  # throughput, accuracy and accuracy change rows

    # a rerun trains, evaluates and times nothing again
    def refuse(*a, **k):
        raise AssertionError("finished work was redone")

    measure = mv.measure
    monkeypatch.setattr(sys.modules["patch_grid"], "fit", refuse)
    monkeypatch.setattr(mv, "evaluate", refuse)
    monkeypatch.setattr(mv, "measure", refuse)
    assert mv.sweep(args, data=data) == results
    # a new r: only its cells are evaluated (the models loaded, not trained), the rest kept;
    # the timing, whose settings hold the rs, is measured again
    calls: list[int] = []

    def counted(model, *a, **k):
        calls.append(1)
        return evaluate(model, *a, **k)

    monkeypatch.setattr(mv, "evaluate", counted)
    monkeypatch.setattr(mv, "measure", measure)
    again = mv.sweep(_args(tmp_path, "--rs", "2,6"), data=data)
    assert len(calls) == 2 * len(mv.VARIANTS)  # two models, r = 6 under each variant
    for run_id, row in again["runs"].items():
        assert row["grid"]["rs"] == [0, 2, 4, 6]
        for v in mv.VARIANTS:
            assert list(row["accuracy"][v]) == ["0", "2", "4", "6"]
            assert {r: row["accuracy"][v][r] for r in ("0", "2", "4")} == \
                results["runs"][run_id]["accuracy"][v]
        assert row["train_seconds"] == results["runs"][run_id]["train_seconds"]
    assert set(again["throughput"]["rows"]["state"]) == {"0", "2", "6"}
    text = mv.tables(again, _args(tmp_path, "--rs", "2,6"))
    assert "| 6 | 17 > 11 > 6 |" in text  # 16 mergeable: 6, then min(6, 10 // 2) = 5
    plain = again["runs"]["plain-s0"]["accuracy"]["keys +w"]  # the first column
    assert f"| 6 | {again['throughput']['rows']['keys +w']['6']['ratio']:.2f} | " \
        f"{100 * plain['6']:.2f} +- 0.00 |" in text
    assert f"{100 * (plain['6'] - plain['0']):+.2f} +- 0.00 |" in text


@pytest.mark.parametrize("bad", [["--seeds", "x"], ["--repeats", "0"], ["--rs", "-1"]])
def test_bad_arguments_are_one_line_usage_errors(bad, capsys):
    with pytest.raises(SystemExit) as e:
        mv.arguments(bad)
    assert e.value.code == 2
    assert "usage" in capsys.readouterr().err
