"""Training on a random patch grid per batch (``patch_choices``, the x-analogue of
``tau_choices``; docs/space.md): the config key, the draws, the variant each batch runs on
(``model.with_patch_size(p)``, one set of parameters), resume, `--patch-choices`."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
import torch

from splitformer.cli import build_parser, main
from splitformer.commands import UsageError
from splitformer.commands.train import config_of
from splitformer.training import ConfigError, TrainConfig
from splitformer.training.data import load_dataset
from splitformer.training.families import build_model
from splitformer.training.grid import TrainGrid
from splitformer.training.loop import evaluate, fit, tau_at

# sklearn digits: 8 x 8 images, so patch 4 gives a 2 x 2 grid and patch 2 a 4 x 4 one
TINY = {"width": 16, "heads": 2, "depth": 2, "epochs": 2, "batch_size": 128, "log_every": 1,
        "dropout": 0.1, "checkpoint_every": 4, "patch": 4}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _rows(history):
    return [r for r in history if "loss" in r]


def _max_parameter_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    return max(float((pa[k] - pb[k]).detach().abs().max()) for k in pa)


# -- the config key ------------------------------------------------------------------------------
def test_patch_choices_are_ints_largest_first_and_round_trip(tmp_path):
    cfg = TrainConfig(patch_choices=[4, 14, 7])
    assert cfg.patch_choices == (14, 7, 4)
    assert all(type(p) is int for p in cfg.patch_choices)
    assert cfg.to_dict()["patch_choices"] == [14, 7, 4]
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert TrainConfig().patch_choices is None
    # the key sits right after tau_choices (the order of `splitformer train --help`)
    keys = TrainConfig.keys()
    assert keys[keys.index("tau_choices") + 1] == "patch_choices"
    f = tmp_path / "run.toml"
    f.write_text("[train]\npatch = 4\npatch_choices = [2, 4]\n")
    assert TrainConfig.from_toml(f) == TrainConfig(patch=4, patch_choices=(4, 2))


@pytest.mark.parametrize("value, match", [
    ((), "at least one patch size"),
    ([2.5], "patch_choices must hold integers >= 1 .* got 2.5"),
    ([4.0], "patch_choices must hold integers >= 1"),
    ([0], "patch_choices must hold integers >= 1"),
    ([-4], "patch_choices must hold integers >= 1"),
    ([True], "patch_choices must be a list of numbers or None"),
    ("4,7", "patch_choices must be a list of numbers or None"),
    ([4, 4], "patch_choices must not repeat a patch size"),
])
def test_bad_patch_choices_are_refused_naming_the_key(value, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(patch_choices=value)


@pytest.mark.parametrize("family", ["cvt", "encoder", "lm"])
def test_patch_choices_need_the_vit_family(family):
    with pytest.raises(ConfigError, match=f"patch_choices needs family 'vit' .* got family "
                       f"'{family}'"):
        TrainConfig(family=family, patch_choices=(4, 2))


def test_a_choice_that_does_not_tile_the_image_is_refused_when_the_model_is_built(digits):
    with pytest.raises(ConfigError, match=r"patch_choices: 3 must divide the image size 8x8"):
        build_model(TrainConfig(patch=4, patch_choices=(4, 3)), digits)


# -- the draws -----------------------------------------------------------------------------------
def test_the_drawn_patches_follow_the_seed_and_leave_the_taus_alone():
    cfg = TrainConfig(patch_choices=(2, 4, 8))
    grid = TrainGrid.of(cfg)
    a = [grid.patch_at(s) for s in range(300)]
    assert a == [TrainGrid.of(cfg).patch_at(s) for s in range(300)]
    assert a != [TrainGrid.of(cfg.replace(seed=1)).patch_at(s) for s in range(300)]
    counts = Counter(a)
    assert set(counts) == {2, 4, 8} and all(60 <= n <= 140 for n in counts.values()), counts
    taus = TrainConfig(tau_choices=(1.0, 0.5, 0.25))
    both = taus.replace(patch_choices=(2, 4))
    assert [tau_at(taus, s) for s in range(100)] == [tau_at(both, s) for s in range(100)]
    assert TrainGrid.of(TrainConfig()).patch_at(3) is None
    assert TrainGrid.of(both).variants() == tuple((k, p) for k in (1, 2, 4) for p in (4, 2))


# -- the variant each batch runs on ------------------------------------------------------------
def test_each_step_trains_at_its_drawn_patch_and_evaluation_is_at_the_config_patch(tmp_path,
                                                                                   digits):
    cfg = TrainConfig(**{**TINY, "epochs": 1, "patch_choices": (2, 4)})
    r = fit(cfg, out=tmp_path / "run", data=digits)
    rows = _rows(r.history)
    grid = TrainGrid.of(cfg)
    assert [x["patch"] for x in rows] == [grid.patch_at(x["step"] - 1) for x in rows]
    assert {x["patch"] for x in rows} == {2, 4}
    assert all("tau" not in x for x in rows)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["patch_choices"] == [4, 2]
    # the model is the base one, at patch 4 (the kernel 4 x 4, the table on the 2 x 2 grid)
    assert r.model.embedding.on_base_grid and r.model.embedding.patch.weight.shape[-1] == 4
    assert r.metrics["test_accuracy"] == evaluate(r.model, digits, cfg)["test_accuracy"]
    at2 = evaluate(r.model.with_patch_size(2), digits, cfg)["test_accuracy"]
    assert 0.0 <= at2 <= 1.0


def test_a_single_choice_at_the_config_patch_is_the_plain_run(tmp_path, digits):
    plain = fit(TrainConfig(**TINY), out=tmp_path / "plain", data=digits)
    one = fit(TrainConfig(**TINY, patch_choices=(4,)), out=tmp_path / "one", data=digits)
    assert [{k: v for k, v in x.items() if k not in ("patch", "examples_per_s")}
            for x in one.history] == [{k: v for k, v in x.items() if k != "examples_per_s"}
                                      for x in plain.history]
    assert {x["patch"] for x in _rows(one.history)} == {4}
    assert _max_parameter_diff(one.model, plain.model) == 0.0


def test_the_batch_runs_on_the_model_at_the_drawn_patch(tmp_path, digits):
    """patch_choices=(2,) on a model built at patch 4 trains its parameters as a hand-written
    SGD loop on ``model.with_patch_size(2)`` does (the same losses and trained parameters):
    the derived kernel and position rows are computed from the base ones, so the gradient
    reaches them; the parameters end far from those of a run at patch 4."""
    cfg = TrainConfig(**{**TINY, "epochs": 1, "dropout": 0.0, "optimizer": "sgd", "lr": 0.05,
                         "weight_decay": 0.0, "schedule": "constant", "warmup": 0.0,
                         "grad_clip": None, "patch_choices": (2,)})
    r = fit(cfg, out=tmp_path / "two", data=digits)
    from splitformer.training.loop import batches, seed_everything

    seed_everything(cfg.seed)
    model = build_model(cfg, digits)
    fine = model.with_patch_size(2).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in batches(digits, cfg, 0):
        loss = torch.nn.functional.cross_entropy(fine(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    got = [x["loss"] for x in _rows(r.history)]
    assert len(got) == len(losses) == 12
    assert max(abs(u - v) for u, v in zip(got, losses, strict=True)) <= 1e-6
    assert _max_parameter_diff(r.model, model) <= 1e-6
    plain = fit(dataclasses.replace(cfg, patch_choices=None), out=tmp_path / "four",
                data=digits)
    assert all("patch" not in x for x in plain.history)
    assert _max_parameter_diff(r.model, plain.model) > 1e-3


# -- resume ---------------------------------------------------------------------------------------
def test_a_resumed_random_patch_run_equals_the_uninterrupted_one(tmp_path, digits, cut_fit):
    cfg = TrainConfig(**TINY, patch_choices=(2, 4))
    whole = fit(cfg, out=tmp_path / "whole", data=digits)
    cut_fit(cfg, 9, out=tmp_path / "cut", data=digits)
    args = build_parser().parse_args(["train", "--resume", str(tmp_path / "cut"),
                                      "--patch-choices", "4,2"])
    assert config_of(args) == cfg
    args = build_parser().parse_args(["train", "--resume", str(tmp_path / "cut"),
                                      "--patch-choices", "2"])
    with pytest.raises(UsageError, match="patch_choices"):
        config_of(args)
    resumed = fit(cfg, resume=tmp_path / "cut", data=digits)
    a, b = _rows(whole.history), _rows(resumed.history)
    assert [(x["step"], x["patch"]) for x in a] == [(x["step"], x["patch"]) for x in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= 1e-6, (x["step"], x["loss"], y["loss"])
    assert resumed.metrics["test_accuracy"] == whole.metrics["test_accuracy"]
    assert _max_parameter_diff(resumed.model, whole.model) <= 1e-6
    with pytest.raises(ConfigError, match="differs in \\['patch_choices'\\]"):
        fit(cfg.replace(patch_choices=(4,)), resume=tmp_path / "cut", data=digits)


# -- the command line ----------------------------------------------------------------------------
def test_the_patch_choices_flag(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--epochs", "1", "--width", "16", "--heads", "2", "--depth", "1",
                 "--batch-size", "256", "--log-every", "1", "--patch", "4",
                 "--patch-choices", "2, 4", "--tau-choices", "1,0.5", "--json", "--out",
                 str(out)])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["epochs"] == 1
    assert json.loads((out / "config.json").read_text())["patch_choices"] == [4, 2]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["patch"] for r in rows if "loss" in r} <= {2, 4}
    assert {r["tau"] for r in rows if "loss" in r} <= {1.0, 0.5}
    for bad, match in (("4,x", "argument --patch-choices: expected comma-separated patch"),
                       ("", "argument --patch-choices: expected comma-separated patch"),
                       ("2.5", "argument --patch-choices: expected comma-separated patch"),
                       ("4,4", "argument --patch-choices: patch_choices must not repeat"),
                       ("0", "argument --patch-choices: patch_choices must hold integers"),
                       ("4,3", "patch_choices: 3 must divide the image size 8x8")):
        with pytest.raises(SystemExit) as e:
            main(["train", "--patch", "4", "--patch-choices", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert match in err, (bad, err)
    with pytest.raises(SystemExit) as e:
        main(["train", "--family", "cvt", "--patch-choices", "2,4"])
    assert e.value.code == 2
    assert "patch_choices needs family 'vit'" in capsys.readouterr().err


# -- data parallel ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_ranks_with_patch_choices_equal_one_process(tmp_path):
    """Every rank draws the step's patch from (seed, step): 2 gloo ranks train the
    single-process run (tests/test_distributed.py's launcher; about 45 s)."""
    from test_distributed import FLAGS, _losses, _max_diff, _torchrun, _untimed
    from test_distributed import TINY as DDP

    cfg = TrainConfig(**DDP, optimizer="sgd", lr=0.05, patch=4, patch_choices=(2, 4))
    single = fit(cfg, out=tmp_path / "single")
    r, ranks = _torchrun(tmp_path, "patch", *FLAGS, "--optimizer", "sgd", "--lr", "0.05",
                         "--patch", "4", "--patch-choices", "2,4", "--json", "--out",
                         str(tmp_path / "ddp"))
    (p0, info0), (p1, info1) = ranks
    assert all(torch.equal(p0[k], p1[k]) for k in p0), "ranks differ"
    assert _untimed(info0["history"]) == _untimed(info1["history"])
    patches = [(row["step"], row["patch"]) for row in info0["history"] if "patch" in row]
    assert patches == [(row["step"], row["patch"]) for row in single.history if "patch" in row]
    assert len({p for _, p in patches}) == 2
    a, b = _losses(single.history), _losses(info0["history"])
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b, strict=True)) <= 1e-5
    assert _max_diff(p0, dict(single.model.state_dict())) <= 1e-5
