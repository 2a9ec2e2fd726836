"""Random time step per batch under torchrun: every rank draws the step's tau from (seed, step)
(``TrainGrid``), so 2 gloo ranks train the single-process run (before, tau_choices was refused
under torchrun). Uses tests/test_distributed.py's launcher."""

from __future__ import annotations

import torch
from test_distributed import FLAGS, TINY, _losses, _max_diff, _torchrun, _untimed

from splitformer.training import TrainConfig
from splitformer.training.grid import TrainGrid
from splitformer.training.loop import fit


def test_two_ranks_with_tau_choices_equal_one_process(tmp_path):
    cfg = TrainConfig(**TINY, optimizer="sgd", lr=0.05, tau_choices=(1.0, 0.5, 0.25))
    grid = TrainGrid.of(cfg)
    assert len({grid.tau_at(s) for s in range(9)}) > 1  # the 9 steps do change tau
    single = fit(cfg, out=tmp_path / "single")
    r, ranks = _torchrun(tmp_path, "tau", *FLAGS, "--optimizer", "sgd", "--lr", "0.05",
                         "--tau-choices", "1,0.5,0.25", "--json", "--out",
                         str(tmp_path / "ddp"))
    (p0, info0), (p1, info1) = ranks
    assert all(torch.equal(p0[k], p1[k]) for k in p0), "ranks differ"
    assert _untimed(info0["history"]) == _untimed(info1["history"])
    taus = [(row["step"], row["tau"]) for row in info0["history"] if "tau" in row]
    assert taus == [(row["step"], row["tau"]) for row in single.history if "tau" in row]
    assert taus == [(s, grid.tau_at(s - 1)) for s in range(1, 10)]
    a, b = _losses(single.history), _losses(info0["history"])
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, 10))
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b, strict=True)) <= 1e-5
    assert _max_diff(p0, dict(single.model.state_dict())) <= 1e-5


def test_two_ranks_with_adamw_what_holds(tmp_path):
    """The default AdamW, 2 gloo ranks against one process (docs/training.md prints these
    numbers: `pytest -s tests/test_training_distributed.py -k adamw`): every logged loss and
    every parameter but the attention's key bias agree to round-off; the key bias, whose
    gradient is zero in exact arithmetic (softmax does not see it), gets round-off gradients
    that AdamW normalises into lr-sized steps, so it moves by up to about 2e-4."""
    cfg = TrainConfig(**TINY)
    single = fit(cfg, out=tmp_path / "single")
    _, ranks = _torchrun(tmp_path, "adamw", *FLAGS, "--json", "--out", str(tmp_path / "ddp"))
    (p0, info0), _ = ranks
    ref = dict(single.model.state_dict())
    key_bias, rest = 0.0, 0.0
    for name, value in p0.items():
        diff = (value.double() - ref[name].double()).abs()
        if name.endswith("attention.qkv_bias"):  # [q | k | v], one width each
            w = diff.numel() // 3
            key_bias = max(key_bias, float(diff[w:2 * w].max()))
            diff = torch.cat([diff[:w], diff[2 * w:]])
        rest = max(rest, float(diff.max()))
    a, b = _losses(single.history), _losses(info0["history"])
    loss = max(abs(x - y) for (_, x), (_, y) in zip(a, b, strict=True))
    print(f"\nAdamW, 2 ranks vs 1 process: parameters but the key bias {rest:.1e}, key bias "
          f"{key_bias:.1e}, logged losses {loss:.1e}")
    assert rest <= 1e-6 and loss <= 1e-5
    assert key_bias <= 1e-3  # round-off turned into lr-sized steps: why SGD is the exact test


def test_a_corrupt_log_stops_every_rank_in_one_line(tmp_path, cut_fit):
    """Resuming under torchrun a run whose metrics.jsonl is corrupt in the middle: rank 0 finds
    it and every rank stops with the one-line error (``loop._rank0_error``). Before, the other
    rank waited at a barrier rank 0 never reached; torchrun's agent then killed it, but a
    launcher that does not tear the job down (srun, mpirun) would hang. (Under torchrun the old
    code also ended, the agent killing the waiting rank, so this test shows the one line; the
    fix is for launchers that wait.)"""
    import os
    import subprocess
    import sys

    from test_distributed import _free_port

    cut_fit(TrainConfig(**TINY, checkpoint_every=4), 5, out=tmp_path / "cut")
    log = tmp_path / "cut" / "metrics.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    assert len(lines) >= 3
    log.write_text(lines[0] + '{"step": 2, "loss": \n' + "".join(lines[2:]))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
                        "-m", "splitformer", "train", "--resume", str(tmp_path / "cut")],
                       capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert r.returncode != 0
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("splitformer train: error")]
    # rank 0 reports it (the other ranks exit with the same status, silently: commands.train)
    assert len(errors) == 1, r.stderr[-3000:]
    assert all("metrics.jsonl: line 2" in ln for ln in errors), errors
    # no traceback of ours (the launcher prints its own ChildFailedError summary)
    assert "splitformer/" not in r.stderr.replace(str(tmp_path), ""), r.stderr[-4000:]
