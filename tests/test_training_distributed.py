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
