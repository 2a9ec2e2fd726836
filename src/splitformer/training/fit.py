"""The fit loop: training as optimal control by the discrete adjoint (docs/training.md).

    min_theta  mean_i loss(R(u_i(T)), target_i)  [+ running costs]
    subject to the evolution u_i(0) = f(input_i), u_i(T) = S_tau^{N_t} u_i(0)

``fit(config)`` builds the data set and the model family of a ``TrainConfig``, minimises the
objective with AdamW or SGD (linear warm-up, then cosine or constant), evaluates on the test
split after every epoch, writes metrics as JSON lines (``metrics.jsonl``) and returns the final
metrics. It is deterministic for a given seed: the batches of epoch e are drawn from a generator
seeded with (seed, e), so a resumed run sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..control import ControlProblem, ControlRegularity, KineticEnergy
from .checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import ConfigError, TrainConfig
from .data import Dataset, load_dataset
from .families import FAMILIES, build_model

__all__ = ["FitResult", "TrainingError", "fit", "evaluate", "new_run_dir"]


class TrainingError(RuntimeError):
    """A run that cannot go on (a non-finite loss): the message names the step."""


@dataclass
class FitResult:
    """The final metrics (``metrics``), the trained model, where the run was written."""

    metrics: dict[str, Any]
    model: nn.Module
    out: Path
    history: list[dict[str, Any]] = field(default_factory=list)


def new_run_dir(root: str | Path = "runs") -> Path:
    """A fresh folder runs/<date>-<time>[-n]."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / stamp
    p, n = base, 1
    while p.exists():
        n += 1
        p = Path(f"{base}-{n}")
    return p


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


# -- batches ---------------------------------------------------------------------------------
def batches(data: Dataset, cfg: TrainConfig, epoch: int) -> list[tuple[torch.Tensor, ...]]:
    """The batches of one epoch, drawn from a generator seeded with (seed, epoch)."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
    if data.task == "lm":
        ids, n = data.train.x, cfg.seq_len
        count = max(1, (len(ids) - 1) // n)
        starts = torch.randint(0, len(ids) - n, (count,), generator=g)
        windows = torch.stack([ids[s:s + n] for s in starts.tolist()])
        return [(windows[i:i + cfg.batch_size],)
                for i in range(0, count, cfg.batch_size)]
    order = torch.randperm(len(data.train), generator=g)
    x, y = data.train.x[order], data.train.y[order]
    return [(x[i:i + cfg.batch_size], y[i:i + cfg.batch_size])
            for i in range(0, len(order), cfg.batch_size)]


def _test_windows(data: Dataset, n: int) -> torch.Tensor:
    ids = data.test.x
    count = (len(ids) - 1) // n
    return ids[: count * n].view(count, n)


# -- the objective -----------------------------------------------------------------------------
def _lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-character cross entropy: logits at x predict the id at x + 1."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def control_problem(model: nn.Module, data: Dataset, cfg: TrainConfig) -> ControlProblem:
    """The objective of ``cfg``: the task's terminal loss, the running costs it weights, the
    adjoint it names."""
    costs = []
    if cfg.kinetic:
        costs.append(KineticEnergy(cfg.kinetic))
    if cfg.control_reg:
        costs.append(ControlRegularity(cfg.control_reg))
    loss = _lm_loss if data.task == "lm" else F.cross_entropy
    return ControlProblem(model, loss, costs, cfg.adjoint, logits=FAMILIES[cfg.family].read)


def _step_on(problem: ControlProblem, cfg: TrainConfig, batch: tuple):
    """(objective, correct predictions or None, examples) of one batch."""
    family = FAMILIES[cfg.family]
    if len(batch) == 1:  # language modelling: the ids are input and target
        (ids,) = batch
        return problem(family.inputs(ids), ids), None, ids.shape[0]
    x, y = batch
    obj = problem(family.inputs(x), y)
    correct = int((family.read(obj.output).argmax(-1) == y).sum())
    return obj, correct, y.shape[0]


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, cfg: TrainConfig) -> dict[str, float]:
    """Test accuracy (classifiers) or test loss and bits per character (LM), in eval mode."""
    was = model.training
    model.eval()
    logits = FAMILIES[cfg.family].logits
    try:
        if data.task == "lm":
            windows = _test_windows(data, cfg.seq_len)
            total, count = 0.0, 0
            for i in range(0, len(windows), cfg.batch_size):
                ids = windows[i:i + cfg.batch_size]
                out = logits(model, ids)
                total += float(F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]),
                                               ids[:, 1:].reshape(-1), reduction="sum"))
                count += ids[:, 1:].numel()
            loss = total / max(count, 1)
            return {"test_loss": loss, "test_bpc": loss / math.log(2)}
        correct = 0
        for i in range(0, len(data.test), 512):
            x, y = data.test.x[i:i + 512], data.test.y[i:i + 512]
            correct += int((logits(model, x).argmax(-1) == y).sum())
        return {"test_accuracy": correct / len(data.test)}
    finally:
        model.train(was)


def _optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    return torch.optim.AdamW(groups, lr=cfg.lr)


def lr_factor(cfg: TrainConfig, total: int) -> Callable[[int], float]:
    """Linear warm-up over ``warmup * total`` steps, then cosine to 0 (or constant)."""
    warm = int(cfg.warmup * total)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - warm) / max(1, total - warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return factor


# -- the loop ------------------------------------------------------------------------------------
def fit(cfg: TrainConfig, *, out: str | Path | None = None, progress: bool = False,
        data: Dataset | None = None, resume: str | Path | None = None) -> FitResult:
    """Train a model as ``cfg`` says; returns the final metrics with keys ``test_accuracy``
    (classifiers) or ``test_loss``/``test_bpc`` (LM), ``epochs``, ``seconds``, ``parameters``.

    ``out`` (default ``cfg.out``, else a fresh folder under runs/) receives ``config.json``,
    ``metrics.jsonl`` (one JSON object per logged step and per epoch), checkpoints (every
    ``checkpoint_every`` optimiser steps, or every epoch, and at the end) and ``final.json``.
    ``resume``: a run folder; the run continues from its last complete checkpoint with the
    config recorded there (``cfg`` must equal it) and writes into that folder; the loss curve is
    the uninterrupted run's. ``progress`` shows a live progress bar (rich).
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"fit(cfg) takes a TrainConfig, got {type(cfg).__name__}")
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    if resume is not None:
        run_dir = Path(resume)
        if latest_checkpoint(run_dir) is None:
            raise ConfigError(f"resume: {str(run_dir)!r} holds no complete checkpoint")
    else:
        run_dir = Path(out if out is not None else cfg.out if cfg.out is not None
                       else new_run_dir())
    data = data if data is not None else load_dataset(cfg.data, cfg.data_dir)
    seed_everything(cfg.seed)
    model = build_model(cfg, data)
    model.train()
    problem = control_problem(model, data, cfg)
    optimizer = _optimizer(model, cfg)
    per_epoch = len(batches(data, cfg, 0))
    total = per_epoch * cfg.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, total))
    step = 0
    if resume is not None:
        state = load_checkpoint(run_dir, model=model, optimizer=optimizer, scheduler=scheduler)
        if state.get("config") != cfg.to_dict():
            changed = sorted(k for k, v in cfg.to_dict().items()
                             if state.get("config", {}).get(k) != v)
            raise ConfigError(f"resume: the run in {str(run_dir)!r} was made with another "
                              f"config (differs in {changed}); resume it without changing them")
        step = int(state["step"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    history = _metrics_until(run_dir / "metrics.jsonl", step)
    log = (run_dir / "metrics.jsonl").open("a" if resume is not None else "w")

    def record(row: dict[str, Any]) -> None:
        history.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()

    def checkpoint(epoch: int) -> None:
        save_checkpoint(run_dir, model=model, optimizer=optimizer, scheduler=scheduler,
                        state={"step": step, "epoch": epoch, "config": cfg.to_dict()})

    start = time.perf_counter()
    bar = _Bar(total, enabled=progress)
    bar.update(step, None, None, 0.0)
    try:
        for epoch in range(step // per_epoch, cfg.epochs):
            seen, t0 = 0, time.perf_counter()
            for batch in batches(data, cfg, epoch)[step - epoch * per_epoch:]:
                obj, correct, n = _step_on(problem, cfg, batch)
                loss = obj.total
                if not torch.isfinite(loss):
                    raise TrainingError(
                        f"the loss is {loss.item()} at step {step} (epoch {epoch}); the last "
                        f"good checkpoint is kept in {str(run_dir)!r}; lower lr or check the "
                        "data")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                scheduler.step()
                step += 1
                seen += n
                rate = seen / max(time.perf_counter() - t0, 1e-9)
                if step % cfg.log_every == 0 or step == total:
                    row = {"step": step, "epoch": epoch, "lr": scheduler.get_last_lr()[0],
                           **{k: v.item() for k, v in obj.parts.items()}, "loss": loss.item(),
                           "examples_per_s": rate}
                    if correct is not None:
                        row["accuracy"] = correct / n
                    record(row)
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    checkpoint(epoch)
                bar.update(step, loss.item(), correct / n if correct is not None else None,
                           rate)
            record({"epoch": epoch, "step": step, **evaluate(model, data, cfg)})
            if not cfg.checkpoint_every:
                checkpoint(epoch + 1)
    finally:
        bar.close()
        log.close()
    if cfg.checkpoint_every and step % cfg.checkpoint_every:
        checkpoint(cfg.epochs)
    seconds = time.perf_counter() - start
    metrics = {**evaluate(model, data, cfg), "epochs": cfg.epochs, "seconds": seconds,
               "parameters": sum(p.numel() for p in model.parameters()), "steps": step}
    (run_dir / "final.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return FitResult(metrics, model, run_dir, history)


def _metrics_until(path: Path, step: int) -> list[dict[str, Any]]:
    """The logged rows up to ``step`` (a resumed run drops what came after its checkpoint)."""
    if step == 0 or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


class _Bar:
    """A rich progress bar (loss, accuracy, examples/s, ETA), or nothing when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.progress = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn())
        self.task = self.progress.add_task("train", total=total, info="")
        self.progress.start()

    def update(self, step: int, loss: float | None, acc: float | None, rate: float) -> None:
        if self.progress is None:
            return
        info = "" if loss is None else f"loss {loss:.3f}"
        info += f" acc {acc:.3f}" if acc is not None else ""
        self.progress.update(self.task, completed=step, info=f"{info} {rate:.0f} ex/s")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
