"""Checkpoints (issue 8, sections 4 and 7): round trips are bitwise, a damaged checkpoint is
refused naming the file and changes nothing, a writer killed with SIGKILL leaves the last
complete checkpoint loadable, and splitformer.save/load rebuild every training family."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

import splitformer
from splitformer.training import TrainConfig, build_model, load_dataset
from splitformer.training.checkpoints import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from splitformer.training.families import FAMILIES

SMALL = TrainConfig(width=16, heads=2, depth=2, dropout=0.0)  # steps interleave two models
SERIES = {"name": "series", "task": "classify", "num_classes": 3, "input_shape": [24, 2],
          "vocab_size": None, "vocab": None}
TEXT = {"name": "text", "task": "lm", "num_classes": None, "input_shape": None,
        "vocab_size": 11, "vocab": list("abcdefghijk")}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _model(digits, seed=0, cfg=SMALL):
    torch.manual_seed(seed)
    return build_model(cfg, digits)


def _trained(digits, opt_name="adamw", steps=3, seed=0):
    """A small ViT, its optimizer and a LambdaLR after ``steps`` steps on digits."""
    model = _model(digits, seed)
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))
    for i in range(steps):
        _step(model, opt, sched, digits, i)
    return model, opt, sched


def _step(model, opt, sched, digits, i):
    x, y = digits.train.x[16 * i:16 * i + 16], digits.train.y[16 * i:16 * i + 16]
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    sched.step()


def _snapshot(model, opt=None):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if opt is not None:
        for i, s in opt.state_dict()["state"].items():
            for k, v in s.items():
                state[f"opt/{i}/{k}"] = v.clone() if isinstance(v, torch.Tensor) else v
    return state


def _same(a, b):
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


# -- round trips ------------------------------------------------------------------------------
def test_model_round_trip_is_bitwise(digits, tmp_path):
    model = _model(digits, seed=0).eval()
    save_checkpoint(tmp_path, model=model, state={"step": 0})
    other = _model(digits, seed=1).eval()
    x = digits.test.x[:32]
    assert not torch.equal(other(x), model(x))
    assert load_checkpoint(tmp_path, model=other) == {"step": 0}
    assert torch.equal(other(x), model(x))
    # the checkpoint folder holds the model too: splitformer.load rebuilds it
    assert torch.equal(splitformer.load(tmp_path)(x), model(x))


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_optimizer_and_scheduler_round_trip_give_the_same_next_update(digits, tmp_path,
                                                                      opt_name):
    model, opt, sched = _trained(digits, opt_name)
    state = {"step": 3, "epoch": 0, "config": SMALL.to_dict(),
             "metrics": {"loss": 0.5, "nan": float("nan")}, "pair": (1, 2), "ids": {3: "c"}}
    save_checkpoint(tmp_path, model=model, optimizer=opt, scheduler=sched, state=state)
    model2, opt2, sched2 = _trained(digits, opt_name, steps=1, seed=5)
    back = load_checkpoint(tmp_path, model=model2, optimizer=opt2, scheduler=sched2)
    assert back["pair"] == (1, 2) and back["ids"] == {3: "c"} and back["config"] == SMALL.to_dict()
    assert np.isnan(back["metrics"]["nan"]) and back["metrics"]["loss"] == 0.5
    assert sched2.get_last_lr() == sched.get_last_lr()
    for i in range(3, 5):
        _step(model, opt, sched, digits, i)
        _step(model2, opt2, sched2, digits, i)
    assert _same(_snapshot(model, opt), _snapshot(model2, opt2))
    assert sched2.state_dict() == sched.state_dict()


def test_rng_states_are_restored(digits, tmp_path):
    model = _model(digits)
    torch.manual_seed(123)
    random.seed(4)
    np.random.seed(5)
    random.gauss(0, 1)  # python random holds a cached gaussian
    save_checkpoint(tmp_path, model=model, state={})
    draws = (torch.rand(5), random.random(), random.gauss(0, 1), np.random.rand(3))
    torch.rand(7), random.random(), np.random.rand(2)
    load_checkpoint(tmp_path, restore_rng=True)
    again = (torch.rand(5), random.random(), random.gauss(0, 1), np.random.rand(3))
    assert torch.equal(draws[0], again[0]) and draws[1:3] == again[1:3]
    assert np.array_equal(draws[3], again[3])
    before = torch.get_rng_state()
    load_checkpoint(tmp_path, restore_rng=False)
    assert torch.equal(torch.get_rng_state(), before)


def test_tied_weights_are_stored_once_and_come_back_tied(tmp_path):
    torch.manual_seed(0)
    lm = build_model(TrainConfig(family="lm", width=16, heads=2, depth=2, seq_len=8), TEXT)
    save_checkpoint(tmp_path, model=lm, state={"step": 1})
    ckpt = latest_checkpoint(tmp_path)
    meta = json.loads((ckpt / "model.json").read_text())
    assert meta["aliases"] == {"lm_head.weight": "embedding.word.weight"}
    loaded = splitformer.load(tmp_path)
    assert loaded.lm_head.weight is loaded.embedding.word.weight
    ids = torch.randint(0, 11, (2, 8))
    assert torch.equal(loaded(input_ids=ids).logits, lm.eval()(input_ids=ids).logits)


# -- on-disk layout and crash windows ---------------------------------------------------------
def test_layout_pointer_and_pruning(digits, tmp_path):
    model = _model(digits)
    (tmp_path / "metrics.jsonl").write_text("{}\n")  # the run's own files are left alone
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, model=model, state={"step": step}, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-000000020", "ckpt-000000030", "latest", "metrics.jsonl"]
    assert (tmp_path / "latest").read_text() == "ckpt-000000030\n"
    assert sorted(p.name for p in (tmp_path / "ckpt-000000030").iterdir()) == [
        "checkpoint.json", "model.json", "model.safetensors", "rng.safetensors"]
    again = save_checkpoint(tmp_path, model=model, state={"step": 30})  # the same step twice
    assert again.name == "ckpt-000000030.1" and latest_checkpoint(tmp_path) == again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000030.1", "latest",
                                                          "metrics.jsonl"]


def test_an_interrupt_while_an_older_checkpoint_is_deleted_leaves_no_half_folder(
        digits, tmp_path, monkeypatch):
    """Ctrl-C in the middle of deleting the older checkpoint (a real shutil.rmtree that
    stops after its first file): what is left is a leftover, not a folder under a
    checkpoint's name with files missing, and the next save removes it."""
    import shutil

    from splitformer import files

    model = _model(digits)
    save_checkpoint(tmp_path, model=model, state={"step": 1})
    real = shutil.rmtree

    def interrupted(path, ignore_errors=False):
        os.unlink(sorted(p.path for p in os.scandir(path) if p.is_file())[0])
        raise KeyboardInterrupt

    monkeypatch.setattr(files.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, model=model, state={"step": 2})
    monkeypatch.setattr(files.shutil, "rmtree", real)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".ckpt-000000001.tmp-retired", "ckpt-000000002", "latest"], left
    assert latest_checkpoint(tmp_path).name == "ckpt-000000002"
    save_checkpoint(tmp_path, model=model, state={"step": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000003", "latest"]


def test_crash_windows_leave_the_last_committed_checkpoint(digits, tmp_path):
    model = _model(digits)
    save_checkpoint(tmp_path, model=model, state={"step": 1})
    # killed while writing: a partial temporary folder
    partial = tmp_path / ".tmp-ckpt-999-deadbeef"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 100)
    # killed after the rename, before the pointer moved: a complete but uncommitted folder
    save_checkpoint(tmp_path / "other", model=model, state={"step": 2})
    os.rename(latest_checkpoint(tmp_path / "other"), tmp_path / "ckpt-000000002")
    (tmp_path / "latest.tmp-999-deadbeef").write_text("ckpt-0000")
    assert load_checkpoint(tmp_path, model=model) == {"step": 1}
    save_checkpoint(tmp_path, model=model, state={"step": 3})  # cleans the leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000003", "latest", "other"]
    assert load_checkpoint(tmp_path) == {"step": 3}


WRITER = r"""
import os, sys, time, torch
from torch import nn
import splitformer.training.checkpoints as ck

def slow_write(path, data):  # the real write, in 8 flushed pieces: a wide window to kill in
    print("writing", path.name, flush=True)
    with open(path, "wb") as f:
        n = max(1, len(data) // 8)
        for i in range(0, len(data), n):
            f.write(data[i:i + n])
            f.flush()
            time.sleep(0.01)
        os.fsync(f.fileno())

ck._write = slow_write
folder = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(128, 128) for _ in range(4)])
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 128)).sum().backward()
opt.step()
step = 0
if ck.latest_checkpoint(folder) is not None:
    step = ck.load_checkpoint(folder, model=model, optimizer=opt)["step"]
print("resumed", step, flush=True)
while True:
    step += 1
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(step)
            opt.state[p]["exp_avg"].fill_(step)
    ck.save_checkpoint(folder, model=model, optimizer=opt, state={"step": step})
    print("saved", step, flush=True)
"""


def _wait_for(lines, proc, errors, prefix, count):
    deadline = time.monotonic() + 120
    while sum(line.startswith(prefix) for line in lines) < count:
        assert proc.poll() is None, errors.read_text()
        assert time.monotonic() < deadline, f"the writer never printed {prefix!r}"
        time.sleep(0.005)


def test_sigkill_at_random_moments_leaves_the_last_complete_checkpoint(tmp_path):
    """A real writer process is killed with SIGKILL (kill -9) four times: twice at a random
    moment, twice a few ms after it began writing a file (its writes are slowed down to give a
    window). Each time the folder loads a complete checkpoint at least as new as the last save
    that returned, and the next writer resumes from it (about 5 s a kill on 2 busy cores:
    mostly starting Python)."""
    rng = random.Random(8)
    folder = tmp_path / "run"
    errors = tmp_path / "stderr.txt"
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 128)).sum().backward()
    opt.step()
    last = mid_write = 0
    for kill in range(4):
        with open(errors, "w") as err:
            proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)],
                                    stdout=subprocess.PIPE, stderr=err, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda p=proc, out=lines: out.extend(p.stdout),
                                  daemon=True)
        reader.start()
        _wait_for(lines, proc, errors, "saved", 1)
        if kill % 2:  # a random moment
            time.sleep(rng.uniform(0.0, 0.5))
        else:  # while a file of the next save is being written
            writing = sum(line.startswith("writing") for line in lines)
            _wait_for(lines, proc, errors, "writing", writing + rng.randint(1, 6))
            time.sleep(rng.uniform(0.0, 0.03))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        reader.join(timeout=30)
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        assert lines[0] == f"resumed {last}\n"
        mid_write += any(".tmp-" in p.name for p in folder.iterdir())  # files.atomic_folder
        saved = [int(line.split()[1]) for line in lines if line.startswith("saved")]
        state = load_checkpoint(folder, model=model, optimizer=opt, restore_rng=False)
        # the last save that returned, or the one in flight if it committed before the kill
        assert state["step"] in (saved[-1], saved[-1] + 1)
        for p in model.parameters():
            assert bool((p == state["step"]).all())
            assert bool((opt.state[p]["exp_avg"] == state["step"]).all())
        last = state["step"]
    assert mid_write >= 1, "no kill landed while a checkpoint was being written"


# -- damaged checkpoints ---------------------------------------------------------------------
def _seal(doc):
    doc = {k: v for k, v in doc.items() if k != "sha256"}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    doc["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps(doc, indent=1)


def _entry(path):
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _rewrite_tensors(ckpt, name, change):
    """Rewrite a safetensors file with ``change(tensors)`` and update every hash that names
    it: a checkpoint that is consistent but does not fit (as if from another model)."""
    path = ckpt / name
    tensors = safetensors.torch.load(path.read_bytes())
    change(tensors)
    path.write_bytes(safetensors.torch.save(tensors))
    if name == "model.safetensors":
        meta = json.loads((ckpt / "model.json").read_text())
        meta["files"][name] = _entry(path)
        (ckpt / "model.json").write_text(_seal(meta))
    doc = json.loads((ckpt / "checkpoint.json").read_text())
    for f in doc["files"]:
        doc["files"][f] = _entry(ckpt / f)
    (ckpt / "checkpoint.json").write_text(_seal(doc))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_json(path, key, value):
    doc = json.loads(path.read_text())
    doc[key] = value
    path.write_text(json.dumps(doc, indent=1))


def _first_param_state(t):
    """A moment of shape (1,) where the parameter has more than one entry (a leading [:1] would
    leave a (1, N, D) class token's shape unchanged: the test then depended on key order)."""
    name = next(k for k in sorted(t) if k.endswith("exp_avg") and t[k].numel() > 1)
    t[name] = t[name].reshape(-1)[:1].clone()


DAMAGE = {
    "model truncated": (lambda c: _truncate(c / "model.safetensors"), "model.safetensors",
                        "truncated"),
    "model flipped byte": (lambda c: _flip(c / "model.safetensors"), "model.safetensors",
                           "sha256"),
    "checkpoint.json edited": (lambda c: _edit_json(c / "checkpoint.json", "state",
                                                    {"step": 99}), "checkpoint.json", "edited"),
    "checkpoint.json truncated": (lambda c: _truncate(c / "checkpoint.json"),
                                  "checkpoint.json", "JSON"),
    "model.json edited": (lambda c: _edit_json(c / "model.json", "aliases", {}),
                          "model.json", "edited"),
    "optimizer flipped byte": (lambda c: _flip(c / "optimizer.safetensors"),
                               "optimizer.safetensors", "sha256"),
    "rng file missing": (lambda c: (c / "rng.safetensors").unlink(), "rng.safetensors",
                         "missing"),
    "tensor missing": (lambda c: _rewrite_tensors(c, "model.safetensors",
                                                  lambda t: t.pop("head.weight")),
                       "model.safetensors", "'head.weight'"),
    "shape changed": (lambda c: _rewrite_tensors(
        c, "model.safetensors", lambda t: t.update({"head.bias": torch.zeros(11)})),
        "model.safetensors", "shape (11,)"),
    "optimizer shape changed": (lambda c: _rewrite_tensors(c, "optimizer.safetensors",
                                                           _first_param_state),
                                "optimizer.safetensors", "shape (1,"),
    "optimizer tensor missing": (lambda c: _rewrite_tensors(
        c, "optimizer.safetensors", lambda t: t.pop("optimizer/state/0/exp_avg_sq")),
        "optimizer.safetensors", "missing"),
    "pointer garbage": (lambda c: (c.parent / "latest").write_text("../../etc"), "latest",
                        "must name"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_checkpoint_is_refused_naming_the_file_and_changes_nothing(digits, tmp_path,
                                                                           damage):
    model, opt, sched = _trained(digits)
    ckpt = save_checkpoint(tmp_path, model=model, optimizer=opt, scheduler=sched,
                           state={"step": 3})
    spoil, filename, what = DAMAGE[damage]
    spoil(ckpt)
    target, target_opt, target_sched = _trained(digits, steps=1, seed=9)
    before = _snapshot(target, target_opt)
    sched_before, rng_before = target_sched.state_dict(), torch.get_rng_state()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path, model=target, optimizer=target_opt, scheduler=target_sched)
    message = str(err.value)
    assert filename in message and what in message, message
    assert _same(_snapshot(target, target_opt), before)
    assert target_sched.state_dict() == sched_before
    assert torch.equal(torch.get_rng_state(), rng_before)
    if filename in ("model.safetensors", "model.json"):
        with pytest.raises(CheckpointError, match=filename.replace(".", r"\.")):
            splitformer.load(tmp_path)


def test_checkpoint_of_another_model_or_optimizer_is_refused_before_anything_changes(
        digits, tmp_path):
    model, opt, sched = _trained(digits)
    save_checkpoint(tmp_path, model=model, optimizer=opt, scheduler=sched, state={"step": 3})
    wider = _model(digits, cfg=SMALL.replace(width=32))
    before = _snapshot(wider)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*shape"):
        load_checkpoint(tmp_path, model=wider)
    assert _same(_snapshot(wider), before)
    # the model part fits, the optimizer part does not: the model is not touched either
    target = _model(digits, seed=3)
    sgd = torch.optim.SGD(target.parameters(), lr=0.1)
    before = _snapshot(target)
    with pytest.raises(CheckpointError, match=r"checkpoint\.json.*AdamW.*SGD"):
        load_checkpoint(tmp_path, model=target, optimizer=sgd)
    assert _same(_snapshot(target), before)
    two_groups = torch.optim.AdamW([{"params": list(target.parameters())[:3]},
                                    {"params": list(target.parameters())[3:]}])
    with pytest.raises(CheckpointError, match="1 parameter group.*given has 2"):
        load_checkpoint(tmp_path, model=target, optimizer=two_groups)
    assert _same(_snapshot(target), before)
    save_checkpoint(tmp_path / "bare", model=model, state={})
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        load_checkpoint(tmp_path / "bare", model=target, optimizer=torch.optim.AdamW(
            target.parameters()))
    assert _same(_snapshot(target), before)


def test_a_failure_while_applying_is_rolled_back(digits, tmp_path, monkeypatch):
    model, opt, sched = _trained(digits)
    save_checkpoint(tmp_path, model=model, optimizer=opt, scheduler=sched, state={"step": 3})
    target, target_opt, target_sched = _trained(digits, steps=1, seed=9)
    before = _snapshot(target, target_opt)
    rng_before, sched_before = torch.get_rng_state(), target_sched.state_dict()

    calls = []
    set_rng_state = torch.set_rng_state

    def fails_once(state):  # the RNG is applied last: model, optimizer, scheduler are undone
        calls.append(state)
        if len(calls) == 1:
            raise RuntimeError("generator refused")
        set_rng_state(state)

    monkeypatch.setattr(torch, "set_rng_state", fails_once)
    with pytest.raises(CheckpointError, match="rolled back.*generator refused"):
        load_checkpoint(tmp_path, model=target, optimizer=target_opt, scheduler=target_sched)
    assert len(calls) == 2
    assert _same(_snapshot(target, target_opt), before)
    assert target_sched.state_dict() == sched_before
    assert torch.equal(torch.get_rng_state(), rng_before)


# -- splitformer.save / splitformer.load -------------------------------------------------------
FAMILY_CASES = {
    "vit": (TrainConfig(width=16, heads=2, depth=2, steps=4, scheme="strang"), None),
    "cvt": (TrainConfig(family="cvt", width=16, heads=2, depth=2), None),
    "encoder": (TrainConfig(family="encoder", width=16, heads=2, depth=2, kernel="sinkhorn"),
                SERIES),
    "lm": (TrainConfig(family="lm", width=16, heads=2, depth=2, seq_len=8), TEXT),
}


@pytest.mark.parametrize("family", sorted(FAMILY_CASES))
def test_save_and_load_every_training_family(digits, tmp_path, family):
    cfg, data = FAMILY_CASES[family]
    torch.manual_seed(0)
    model = build_model(cfg, data if data is not None else digits).eval()
    x = {"vit": digits.test.x[:8], "cvt": digits.test.x[:8],
         "encoder": torch.randn(8, 24, 2), "lm": torch.randint(0, 11, (8, 8))}[family]
    expected = FAMILIES[family].logits(model, x)
    rng = torch.get_rng_state()
    splitformer.save(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.json",
                                                                 "model.safetensors"]
    loaded = splitformer.load(tmp_path / "m")
    assert torch.equal(torch.get_rng_state(), rng)  # rebuilding draws no random numbers
    assert type(loaded) is type(model) and not loaded.training
    assert loaded.source["config"] == cfg.to_dict()
    assert torch.equal(FAMILIES[family].logits(loaded, x), expected)
    # saving again replaces the earlier save
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    splitformer.save(model, tmp_path / "m")
    assert torch.equal(FAMILIES[family].logits(splitformer.load(tmp_path / "m"), x),
                       FAMILIES[family].logits(model, x))


def test_load_keeps_the_saved_dtype(digits, tmp_path):
    model = _model(digits).double().eval()
    splitformer.save(model, tmp_path / "m")
    loaded = splitformer.load(tmp_path / "m")
    x = digits.test.x[:8].double()
    assert next(loaded.parameters()).dtype == torch.float64
    assert torch.equal(loaded(x), model(x))


def test_save_refuses_models_it_cannot_rebuild(digits, tmp_path):
    with pytest.raises(ValueError, match=r"Encoder cannot be saved: its model.source is "
                                         r"\{'kind': 'encoder'\}"):
        splitformer.save(splitformer.network_encoder(8, 2, 16, 1), tmp_path / "a")
    with pytest.raises(ValueError, match="differs from what its model.source builds"):
        splitformer.save(_model(digits).refine(2), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # a checkpoint of such a model still resumes, but splitformer.load says why it cannot
    save_checkpoint(tmp_path / "c", model=splitformer.network_encoder(8, 2, 16, 1), state={})
    with pytest.raises(CheckpointError, match=r"model\.json.*no training source.*'kind'"):
        splitformer.load(tmp_path / "c")


# -- bad arguments ---------------------------------------------------------------------------
def test_bad_arguments_are_named(digits, tmp_path):
    model = _model(digits)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        save_checkpoint(tmp_path, model="vit", state={})
    with pytest.raises(TypeError, match="state must be a dict"):
        save_checkpoint(tmp_path, model=model, state=[1])
    with pytest.raises(TypeError, match=r"state\['metrics'\]\['loss'\] is a torch.Tensor"):
        save_checkpoint(tmp_path, model=model, state={"metrics": {"loss": torch.tensor(1.0)}})
    with pytest.raises(TypeError, match=r"state\['when'\] is a numpy.int64"):
        save_checkpoint(tmp_path, model=model, state={"when": np.int64(1)})
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        save_checkpoint(tmp_path, model=model, optimizer="adamw", state={})
    with pytest.raises(TypeError, match="scheduler must be"):
        save_checkpoint(tmp_path, model=model, scheduler=3, state={})
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        save_checkpoint(tmp_path, model=model, state={}, keep=0)
    with pytest.raises(TypeError, match="directory must be a path"):
        save_checkpoint(None, model=model, state={})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        save_checkpoint(tmp_path / "file", model=model, state={})
    assert not any(p.name.startswith("ckpt") for p in tmp_path.iterdir())
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="no checkpoint here"):
        load_checkpoint(tmp_path)
    with pytest.raises(TypeError, match="restore_rng must be a bool"):
        load_checkpoint(tmp_path, restore_rng=1)
    splitformer.save(model, tmp_path / "saved")
    with pytest.raises(CheckpointError, match="saved by splitformer.save.*splitformer.load"):
        load_checkpoint(tmp_path / "saved")
    with pytest.raises(ValueError, match="holds other files"):
        splitformer.save(model, tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        splitformer.load(tmp_path / "nowhere")
