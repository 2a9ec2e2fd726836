"""Data-parallel training: `torchrun --nproc_per_node 2 -m splitformer train` on 2 CPU processes
(gloo) against single-process training on the same global batch.

The launcher runs ``splitformer.cli.main`` through a small script that wraps
``training.loop.fit`` and writes each rank's trained parameters to a file (a test-side hook: the
library has none). digits has 1433 training examples, so with a global batch of 179 the full
batches split 90/89 and the last batch holds one example (rank 1's shard is empty), which
exercises the weighting of uneven shards.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import safetensors.torch
import torch

from splitformer.training import FAMILIES, TrainConfig, load_dataset
from splitformer.training.checkpoints import load_model
from splitformer.training.distributed import loss_weight, shard_bounds
from splitformer.training.loop import fit

TINY = {"width": 16, "heads": 2, "depth": 2, "epochs": 1, "batch_size": 179, "dropout": 0.0,
        "log_every": 1, "threads": 1}
# the CLI flags of TINY
FLAGS = ["--width", "16", "--heads", "2", "--depth", "2", "--epochs", "1", "--batch-size", "179",
         "--dropout", "0", "--log-every", "1", "--threads", "1"]

_LAUNCHED = """
import json, os, sys
import safetensors.torch
from splitformer.training import loop as fit_module

real = fit_module.fit

def fit(*args, **kwargs):
    result = real(*args, **kwargs)
    rank = os.environ["RANK"]
    state = {k: v.detach().cpu().clone() for k, v in result.model.state_dict().items()}
    safetensors.torch.save_file(state, os.path.join(DUMP, f"rank{rank}.safetensors"))
    with open(os.path.join(DUMP, f"rank{rank}.json"), "w") as f:
        json.dump({"metrics": result.metrics, "history": result.history}, f)
    return result

fit_module.fit = fit
from splitformer.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, list]:
    """Launch 2 CPU ranks of `splitformer train ARGS`; returns the process and each rank's
    (parameters, {metrics, history})."""
    dump = tmp_path / f"dump-{name}"
    dump.mkdir()
    script = tmp_path / f"launch_{name}.py"
    script.write_text(f"DUMP = {str(dump)!r}\n" + textwrap.dedent(_LAUNCHED))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on the CPU even where a GPU is present
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
                        str(script), "train", *args],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [(safetensors.torch.load_file(dump / f"rank{i}.safetensors"),
              json.loads((dump / f"rank{i}.json").read_text())) for i in range(2)]
    return r, ranks


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("examples_per_s", "seconds")} for r in rows]


def _losses(history) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in history if "loss" in r]


def _test_logits(model) -> torch.Tensor:
    data = load_dataset("digits")
    with torch.no_grad():
        return FAMILIES["vit"].logits(model, data.test.x).double()


def test_shards_and_weights():
    assert [shard_bounds(179, r, 2) for r in range(2)] == [(0, 90), (90, 179)]
    assert [shard_bounds(1, r, 2) for r in range(2)] == [(0, 1), (1, 1)]
    assert [shard_bounds(10, r, 3) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [shard_bounds(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    # what DDP averages, sum_r w_r mean_r / world, is the global batch's mean
    values = torch.randn(179, dtype=torch.float64)
    for world in (2, 3):
        parts = [values[slice(*shard_bounds(179, r, world))] for r in range(world)]
        averaged = sum(loss_weight(len(p), 179, world) * p.mean() for p in parts) / world
        assert float(averaged) == pytest.approx(float(values.mean()), abs=1e-14)
    with pytest.raises(ValueError):
        shard_bounds(5, 2, 2)


def test_two_ranks_equal_one_process(tmp_path):
    """2 gloo ranks (SGD): the ranks hold identical parameters, and the run equals
    single-process training on the same global batch (parameters and every logged loss to
    1e-5). Only rank 0 prints and writes the run folder."""
    cfg = TrainConfig(**TINY, optimizer="sgd", lr=0.05)
    single = fit(cfg, out=tmp_path / "single")
    r, ranks = _torchrun(tmp_path, "sgd", *FLAGS, "--optimizer", "sgd", "--lr", "0.05",
                         "--json", "--out", str(tmp_path / "ddp"))
    (p0, info0), (p1, info1) = ranks
    assert all(torch.equal(p0[k], p1[k]) for k in p0), "ranks differ"
    ref = {k: v for k, v in single.model.state_dict().items()}
    assert _max_diff(p0, ref) <= 1e-5
    assert _untimed(info0["history"]) == _untimed(info1["history"])
    assert _untimed([info0["metrics"]]) == _untimed([info1["metrics"]])
    a, b = _losses(single.history), _losses(info0["history"])
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, 10))
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b, strict=True)) <= 1e-5
    assert info0["metrics"]["test_accuracy"] == single.metrics["test_accuracy"]
    # rank 0 alone printed (one JSON line) and wrote metrics.jsonl, config.json, final.json
    # and the checkpoint (which holds the trained parameters)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1 and json.loads(lines[0])["steps"] == 9
    logged = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().split("\n")
              if x.strip()]
    assert logged == info0["history"]
    assert (tmp_path / "ddp" / "final.json").exists()
    assert (tmp_path / "ddp" / "config.json").exists()
    saved = load_model(tmp_path / "ddp").state_dict()
    assert all(torch.equal(saved[k], p0[k]) for k in p0)


def test_resume_under_two_ranks(tmp_path, cut_fit):
    """A single-process AdamW run cut after step 5 (checkpoint at step 4) resumed by 2 gloo ranks
    reproduces the uninterrupted single-process run: every logged loss and the test logits to
    1e-5. (Parameters are compared through the logits: the key bias of attention has a zero
    gradient in exact arithmetic, and AdamW turns its round-off into lr-sized steps that no
    output sees.)"""
    cfg = TrainConfig(**TINY, checkpoint_every=4)
    whole = fit(cfg, out=tmp_path / "whole")
    cut_fit(cfg, 5, out=tmp_path / "cut")
    _, ranks = _torchrun(tmp_path, "resume", "--resume", str(tmp_path / "cut"), "--json")
    (p0, info0), (p1, info1) = ranks
    assert all(torch.equal(p0[k], p1[k]) for k in p0), "ranks differ"
    a, b = _losses(whole.history), _losses(info0["history"])
    assert [s for s, _ in a] == [s for s, _ in b]
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b, strict=True)) <= 1e-5
    resumed = load_model(tmp_path / "cut")
    assert all(torch.equal(v, p0[k]) for k, v in resumed.state_dict().items())
    diff = (_test_logits(resumed) - _test_logits(whole.model.eval())).abs().max()
    assert float(diff) <= 1e-5
