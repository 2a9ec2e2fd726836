"""The fit loop: training as optimal control by the discrete adjoint (docs/training.md).

    min_theta  mean_i loss(R(u_i(T)), target_i)  [+ running costs]
    subject to the evolution u_i(0) = f(input_i), u_i(T) = S_tau^{N_t} u_i(0)

``fit(config)`` builds the data set and the model family of a ``TrainConfig``, minimises the
objective with AdamW or SGD (linear warm-up, then cosine or constant), evaluates on the test
split after every epoch, writes metrics as JSON lines (``metrics.jsonl``) and returns the final
metrics. It is deterministic for a given seed: the batches of epoch e are drawn from a generator
seeded with (seed, e), so a resumed run sees the same batches as an uninterrupted one.

The run's time grid is computed once (``training.grid.TrainGrid``: T, tau, N_t, the choices).
Random time step per batch (``tau_choices``): optimiser step s runs its batch on the model
refined to ``grid.tau_at(s)``, drawn uniformly from the choices by a generator seeded with
(seed, s), so a resumed run and every rank draw the same taus. Each choice tau / k is
``model.refine(k)`` of the model at the config's tau (the same parameters; its own control
problem, so a running cost reads the refined path: ``_Variants``); each logged step records
its "tau". Evaluation stays at the config's tau.
Random patch size per batch (``patch_choices``, the vit family): step s also draws
``grid.patch_at(s)`` and runs on ``model.refine(k).with_patch_size(p)`` (the same parameters:
the kernel PI-resized and the position table resampled from them in the forward pass); each
logged step records its "patch"; evaluation stays at the config's ``patch``.

The run folder is locked by rank 0 for the run (``files.FolderLock``): a second writer is
refused naming this process. Its files go through ``splitformer.files``: config.json and
final.json atomically, each metrics.jsonl row appended and fsynced; on resume metrics.jsonl is
read with ``files.read_jsonl`` (a torn last line dropped, a corrupt one before it refused).

Under torchrun (``WORLD_SIZE`` > 1) the same loop runs data parallel (``training.distributed``):
``batch_size`` stays the global batch, each rank takes its contiguous shard of it, the model is
wrapped in DistributedDataParallel and each rank's objective is weighted by its share, so an
optimiser step is the single-process step on the same global batch (to round-off). Evaluation
is sharded over the ranks and summed. Only rank 0 shows progress and writes config.json,
metrics.jsonl, checkpoints and final.json; every rank loads the checkpoint on ``resume``.
Dropout masks are drawn per rank from a generator seeded with (seed, step, rank) at every step,
so a resumed data-parallel run also replays them.
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
from ..files import (
    CorruptFileError,
    FolderLock,
    FolderLockedError,
    append_line,
    read_jsonl,
    write_atomic,
)
from . import distributed
from .checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import ConfigError, TrainConfig
from .data import Dataset, load_dataset
from .distributed import Ranks
from .families import FAMILIES, build_model
from .grid import TrainGrid

__all__ = ["FitResult", "TrainingError", "fit", "evaluate", "new_run_dir", "tau_at"]


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


def test_windows(data: Dataset, n: int) -> torch.Tensor:
    """The test text cut into consecutive windows of ``n`` ids, (count, n)."""
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


def tau_at(cfg: TrainConfig, step: int) -> float:
    """The time step of optimiser step ``step``: one of ``cfg.tau_choices`` drawn uniformly by
    a generator seeded with (seed, step) (the same for a resumed run and on every rank), or the
    config's tau T / N_t without ``tau_choices`` (``TrainGrid.tau_at``)."""
    return TrainGrid.of(cfg).tau_at(step)


def _step_on(problem: nn.Module, cfg: TrainConfig, batch: tuple, variant: str = "1"):
    """(objective, correct predictions or None, examples) of one batch, on the ``variant``
    (``TrainGrid.variant(k, p)``: refined k times, at patch size p; ``problem``: a
    ``_Variants``, or DistributedDataParallel of one)."""
    family = FAMILIES[cfg.family]
    if len(batch) == 1:  # language modelling: the ids are input and target
        (ids,) = batch
        return problem(family.inputs(ids), ids, variant=variant), None, ids.shape[0]
    x, y = batch
    obj = problem(family.inputs(x), y, variant=variant)
    correct = int((family.read(obj.output).argmax(-1) == y).sum())
    return obj, correct, y.shape[0]


class _Variants(nn.Module):
    """The control problem of each variant a step may train on: (k, p) -> the problem on
    ``model.refine(k)`` at patch size p (``with_patch_size``; None: the model's own), named
    ``TrainGrid.variant(k, p)`` (shared parameters, its own train/eval flag and path, so a
    running cost reads the refined path; (1, None) is the model itself). One module, so that
    one DistributedDataParallel holds every variant's (shared) parameters once."""

    def __init__(self, model: nn.Module, data: Dataset, cfg: TrainConfig,
                 variants: tuple[tuple[int, int | None], ...]) -> None:
        super().__init__()
        problems = {}
        for k, patch in variants:
            variant = model if k == 1 else model.refine(k)
            if patch is not None:
                variant = variant.with_patch_size(patch)
            variant.train()
            problems[TrainGrid.variant(k, patch)] = control_problem(variant, data, cfg)
        self.problems = nn.ModuleDict(problems)

    def forward(self, inputs: tuple, target: torch.Tensor, variant: str = "1"):
        return self.problems[variant](inputs, target)


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, cfg: TrainConfig) -> dict[str, float]:
    """Test accuracy (classifiers) or test loss and bits per character (LM), in eval mode, on
    the whole test set in this process."""
    return _evaluate(model, data, cfg, Ranks())


@torch.no_grad()
def _evaluate(model: nn.Module, data: Dataset, cfg: TrainConfig,
              ranks: Ranks) -> dict[str, float]:
    """``evaluate`` with the test set sharded over the ranks and the sums all-reduced (every
    rank gets the same metrics; one rank of one: the whole test set)."""
    was = model.training
    model.eval()
    logits = FAMILIES[cfg.family].logits
    p = next(model.parameters(), None)
    dev = p.device if p is not None else torch.device("cpu")
    try:
        if data.task == "lm":
            windows = test_windows(data, cfg.seq_len)
            lo, hi = distributed.shard_bounds(len(windows), ranks.rank, ranks.world)
            windows = windows[lo:hi]
            total, count = 0.0, 0
            for i in range(0, len(windows), cfg.batch_size):
                ids = windows[i:i + cfg.batch_size].to(dev)
                out = logits(model, ids)
                total += float(F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]),
                                               ids[:, 1:].reshape(-1), reduction="sum"))
                count += ids[:, 1:].numel()
            if ranks.distributed:
                total, count = distributed.all_reduce_sum([total, count]).tolist()
            loss = total / max(count, 1)
            return {"test_loss": loss, "test_bpc": loss / math.log(2)}
        lo, hi = distributed.shard_bounds(len(data.test), ranks.rank, ranks.world)
        correct = 0
        for i in range(lo, hi, 512):
            j = min(i + 512, hi)
            x, y = data.test.x[i:j].to(dev), data.test.y[i:j].to(dev)
            correct += int((logits(model, x).argmax(-1) == y).sum())
        if ranks.distributed:
            correct = int(distributed.all_reduce_sum([correct])[0])
        return {"test_accuracy": correct / len(data.test)}
    finally:
        model.train(was)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The optimiser's groups: matrices decayed by ``weight_decay``, vectors (gains, biases)
    not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": rest, "weight_decay": 0.0}]


def _optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = parameter_groups(model, cfg.weight_decay)
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
    ``seconds`` is the training time of every attempt: a resumed run adds the seconds its
    checkpoint recorded (the work lost after that checkpoint is redone and counted once).

    ``out`` (default ``cfg.out``, else a fresh folder under runs/) receives ``config.json``,
    ``metrics.jsonl`` (one JSON object per logged step and per epoch), checkpoints (every
    ``checkpoint_every`` optimiser steps, or every epoch, and at the end) and ``final.json``.
    ``resume``: a run folder; the run continues from its last complete checkpoint with the
    config recorded there (``cfg`` must equal it) and writes into that folder; the loss curve is
    the uninterrupted run's. ``progress`` shows a live progress bar (rich).

    Under torchrun (``WORLD_SIZE`` > 1) the run is data parallel (module docstring): the
    process group is initialised here unless the caller did, and ended here if it was. Every
    rank returns the same metrics and model (the unwrapped model); only rank 0 writes.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"fit(cfg) takes a TrainConfig, got {type(cfg).__name__}")
    with distributed.session() as ranks:
        return _fit(cfg, out=out, progress=progress and ranks.main, data=data, resume=resume,
                    ranks=ranks)


def _fit(cfg: TrainConfig, *, out: str | Path | None, progress: bool, data: Dataset | None,
         resume: str | Path | None, ranks: Ranks) -> FitResult:
    grid = TrainGrid.of(cfg)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    run_dir = _run_folder(cfg, out, resume, ranks)
    lock: FolderLock | None = None
    try:
        lock = _claim(run_dir, resume, ranks)
        run = _Run(cfg, grid, data if data is not None else load_dataset(cfg.data, cfg.data_dir),
                   run_dir, ranks)
        if resume is not None:  # every rank loads the checkpoint
            run.restore()
        run.open_log(resumed=resume is not None)
        return run.train(progress)
    finally:
        if lock is not None:
            lock.release()


def _run_folder(cfg: TrainConfig, out: str | Path | None, resume: str | Path | None,
                ranks: Ranks) -> Path:
    """The run's folder: ``resume``'s (with a complete checkpoint), ``out`` or ``cfg.out``, or
    a fresh one under runs/ (rank 0's name on every rank)."""
    if resume is not None:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise ConfigError(f"resume: {str(run_dir)!r} is not a folder (a run folder to "
                              "continue)")
        if latest_checkpoint(run_dir) is None:
            raise ConfigError(f"resume: {str(run_dir)!r} holds no complete checkpoint")
        return run_dir
    if out is not None or cfg.out is not None:
        return Path(out if out is not None else cfg.out)
    run_dir = new_run_dir()
    if ranks.distributed:  # rank 0's stamp
        run_dir = Path(distributed.broadcast_object(str(run_dir)))
    return run_dir


def _refusal(run_dir: Path) -> ConfigError | None:
    """Why a NEW run may not start in ``run_dir``, or None. A folder with a checkpoint holds a
    run to resume; one with final.json a finished run. A folder with only config.json and
    metrics.jsonl is what a run killed before its first checkpoint leaves: nothing can resume
    it, so a new run starts over it (its rows are replaced)."""
    if (run_dir / "final.json").exists():
        return ConfigError(f"out: {str(run_dir)!r} holds a finished run (final.json); choose "
                           "another folder")
    if latest_checkpoint(run_dir) is not None:
        return ConfigError(f"out: {str(run_dir)!r} holds a run already; resume it (--resume) "
                           "or choose another folder")
    return None


def _claim(run_dir: Path, resume: str | Path | None, ranks: Ranks) -> FolderLock | None:
    """Rank 0 locks the run folder (``files.FolderLock``: a second writer is refused naming
    this process) and checks that a new run's folder holds no run yet; every rank gets the
    same error."""
    lock, error = None, None
    if ranks.main:
        try:
            if run_dir.exists() and not run_dir.is_dir():
                raise ConfigError(f"out: {str(run_dir)!r} is a file, expected a folder")
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"out: cannot make the folder {str(run_dir)!r} "
                                  f"({e.strerror or e})") from None
            lock = FolderLock(run_dir, what="run folder").acquire()
            if resume is None:
                error = _refusal(run_dir)
        except (FolderLockedError, ConfigError) as e:
            error = e
    error = _rank0_error(error, ranks)
    if error is not None:
        if lock is not None:
            lock.release()
        raise error
    return lock


_SHARED_ERRORS = {e.__name__: e for e in (ConfigError, FolderLockedError, CorruptFileError)}


def _rank0_error(error: Exception | None, ranks: Ranks) -> Exception | None:
    """The error rank 0 met (a locked folder, a refused folder, a corrupt log), on every rank:
    under torchrun the other ranks would otherwise wait at the next collective forever."""
    if not ranks.distributed:
        return error
    text = distributed.broadcast_object(None if error is None
                                        else [type(error).__name__, str(error)])
    if text is not None and error is None:
        error = _SHARED_ERRORS.get(text[0], ConfigError)(text[1])
    return error


class _Run:
    """One training run's state: the model, its variants (``_Variants``, under DDP wrapped),
    the optimiser and schedule, the step, the metrics log; ``train`` runs the loop."""

    def __init__(self, cfg: TrainConfig, grid: TrainGrid, data: Dataset, run_dir: Path,
                 ranks: Ranks) -> None:
        self.cfg, self.grid, self.data, self.run_dir, self.ranks = cfg, grid, data, run_dir, ranks
        seed_everything(cfg.seed)
        model = build_model(cfg, data)
        if ranks.device.type != "cpu":
            model = model.to(ranks.device)
        model.train()
        self.model = model
        variants = _Variants(model, data, cfg, grid.variants())
        # DistributedDataParallel (a single process: the variants themselves); it holds the
        # model, so the running costs see its evolutions
        self.engine = distributed.wrap(variants) if ranks.distributed else variants
        self.optimizer = _optimizer(model, cfg)
        self.per_epoch = len(batches(data, cfg, 0))
        self.total = self.per_epoch * cfg.epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                           lr_factor(cfg, self.total))
        self.step = 0
        self.seconds_before = 0.0  # training seconds of earlier attempts (a resumed run)
        self.start = time.perf_counter()
        self.history: list[dict[str, Any]] = []
        self.metrics_path = run_dir / "metrics.jsonl"

    def restore(self) -> None:
        """Load the run folder's last checkpoint (the same config, or refused naming the keys
        that differ)."""
        state = load_checkpoint(self.run_dir, model=self.model, optimizer=self.optimizer,
                                scheduler=self.scheduler)
        mine = self.cfg.to_dict()
        if state.get("config") != mine:
            changed = sorted(k for k, v in mine.items() if state.get("config", {}).get(k) != v)
            raise ConfigError(f"resume: the run in {str(self.run_dir)!r} was made with another "
                              f"config (differs in {changed}); resume it without changing them")
        self.step = int(state["step"])
        self.seconds_before = float(state.get("seconds", 0.0))

    def open_log(self, resumed: bool) -> None:
        """Rank 0 writes config.json (back, on a resume) and cuts metrics.jsonl back to the
        checkpoint's step (a torn last line cut, a corrupt middle refused); every rank reads
        the rows up to that step."""
        error = None
        if self.ranks.main:
            write_atomic(self.run_dir / "config.json",
                         json.dumps(self.cfg.to_dict(), indent=2) + "\n")
            if not resumed:
                write_atomic(self.metrics_path, "")
            try:
                self.history = _metrics_until(self.metrics_path, self.step)
            except CorruptFileError as e:
                error = e
        # every rank learns of a corrupt log, after rank 0 has cut metrics.jsonl back to the
        # checkpoint's step (the broadcast is the barrier)
        error = _rank0_error(error, self.ranks)
        if error is not None:
            raise error
        if not self.ranks.main:
            self.history = _metrics_until(self.metrics_path, self.step, rewrite=False)

    def record(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        if self.ranks.main:
            append_line(self.metrics_path, json.dumps(row))

    def checkpoint(self, epoch: int) -> None:
        if self.ranks.main:
            seconds = self.seconds_before + time.perf_counter() - self.start
            save_checkpoint(self.run_dir, model=self.model, optimizer=self.optimizer,
                            scheduler=self.scheduler,
                            state={"step": self.step, "epoch": epoch,
                                   "config": self.cfg.to_dict(), "seconds": seconds})

    def test_row(self, epoch: int) -> None:
        """The test-set row of ``epoch`` (the model at the end of it)."""
        self.record({"epoch": epoch, "step": self.step,
                     **_evaluate(self.model, self.data, self.cfg, self.ranks)})

    def mend_test_row(self) -> None:
        """A kill between an epoch's last checkpoint and its test-set row (with
        ``checkpoint_every`` dividing the epoch's last step, the last epoch's included): the
        row is made now (the model is the one that row was for), so the log loses nothing."""
        step, per_epoch = self.step, self.per_epoch
        if step and step % per_epoch == 0:
            done = step // per_epoch - 1
            if not any(r.get("epoch") == done and "lr" not in r for r in self.history):
                self.test_row(done)

    def train(self, progress: bool) -> FitResult:
        """The epochs left, the last checkpoint, the final metrics (final.json)."""
        cfg = self.cfg
        self.mend_test_row()
        self.start = time.perf_counter()
        bar = _Bar(self.total, enabled=progress)
        bar.update(self.step, None, None, 0.0)
        try:
            for epoch in range(self.step // self.per_epoch, cfg.epochs):
                self.epoch(epoch, bar)
        finally:
            bar.close()
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every:
            self.checkpoint(cfg.epochs)
        seconds = self.seconds_before + time.perf_counter() - self.start
        metrics = {**_evaluate(self.model, self.data, cfg, self.ranks), "epochs": cfg.epochs,
                   "seconds": seconds, "steps": self.step,
                   "parameters": sum(p.numel() for p in self.model.parameters())}
        if self.ranks.main:
            write_atomic(self.run_dir / "final.json", json.dumps(metrics, indent=2) + "\n")
        return FitResult(metrics, self.model, self.run_dir, self.history)

    def epoch(self, epoch: int, bar: _Bar) -> None:
        """The batches of ``epoch`` left after the step reached (a logged row every
        ``log_every`` steps, checkpoints), then its test row (and the epoch's checkpoint)."""
        cfg = self.cfg
        seen, t0 = 0, time.perf_counter()
        for batch in batches(self.data, cfg, epoch)[self.step - epoch * self.per_epoch:]:
            parts, correct, n, drawn = self.optimise(batch, epoch)
            seen += n
            rate = seen / max(time.perf_counter() - t0, 1e-9)
            if self.step % cfg.log_every == 0 or self.step == self.total:
                row = {"step": self.step, "epoch": epoch,
                       "lr": self.scheduler.get_last_lr()[0], **parts, "examples_per_s": rate,
                       **drawn}
                if correct is not None:
                    row["accuracy"] = correct / n
                self.record(row)
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                self.checkpoint(epoch)
            bar.update(self.step, parts["loss"], correct / n if correct is not None else None,
                       rate)
        self.test_row(epoch)
        if not cfg.checkpoint_every:
            self.checkpoint(epoch + 1)

    def optimise(self, batch: tuple, epoch: int):
        """One optimiser step on ``batch`` at the step's tau and patch size: (logged parts with
        "loss", correct predictions or None, examples, what the step drew: "tau" and "patch"
        where there are choices)."""
        cfg, step = self.cfg, self.step
        k, step_tau = self.grid.draw(step)
        patch = self.grid.patch_at(step)
        drawn = {**({"tau": step_tau} if cfg.tau_choices is not None else {}),
                 **({"patch": patch} if patch is not None else {})}
        variant = TrainGrid.variant(k, patch)
        if self.ranks.distributed:
            obj, weight, parts, correct, n = _shard_step(self.engine, cfg, batch, self.ranks,
                                                         step, variant)
            loss = obj.total * weight
        else:
            obj, correct, n = _step_on(self.engine, cfg, batch, variant)
            loss = obj.total
            parts = {**{name: v.item() for name, v in obj.parts.items()}, "loss": loss.item()}
        if not math.isfinite(parts["loss"]):
            kept = (f"the last good checkpoint is kept in {str(self.run_dir)!r}"
                    if latest_checkpoint(self.run_dir) is not None
                    else "no checkpoint was written yet")
            raise TrainingError(f"the loss is {parts['loss']} at step {step} (epoch {epoch}); "
                                f"{kept}; lower lr or check the data")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return parts, correct, n, drawn


def _step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of rank ``rank``'s random draws (dropout) at optimiser step ``step``."""
    return ((seed * 1_000_003 + step) * 10_007 + rank) % 2**63


def _shard_step(engine: nn.Module, cfg: TrainConfig, batch: tuple, ranks: Ranks, step: int,
                variant: str = "1"):
    """This rank's part of the global ``batch``: (its objective, the weight of its objective in
    ``backward``, the global batch's logged parts and "loss", its correct predictions or None,
    its size). The rank's objective is a mean over its shard of n_r examples; weighted by
    world * n_r / n its gradient, averaged over the ranks by DistributedDataParallel, is the
    gradient of the mean over the global batch of n examples. Logged values are
    sum_r (n_r / n) * value_r (running costs that do not depend on the batch come out
    unchanged). A rank with an empty shard runs one example with weight 0: every rank must
    take part in the gradient all-reduce."""
    torch.manual_seed(_step_seed(cfg.seed, step, ranks.rank))  # dropout: per rank and step
    n = len(batch[0])
    local = distributed.shard(batch, ranks.rank, ranks.world)
    n_local = len(local[0])
    share = n_local / n
    if share == 0:
        local = tuple(t[:1] for t in batch)
    local = tuple(t.to(ranks.device) for t in local)
    obj, correct, _ = _step_on(engine, cfg, local, variant)
    names = list(obj.parts)
    values = torch.stack([obj.parts[k].detach().reshape(()) for k in names]
                         + [obj.total.detach().reshape(())]).double() * share
    if share == 0:
        values = torch.zeros_like(values)
    count = float(correct) if correct is not None and share > 0 else 0.0
    reduced = distributed.all_reduce_sum(torch.cat([values, values.new_tensor([count])]))
    parts = dict(zip([*names, "loss"], reduced[:-1].tolist(), strict=True))
    correct = int(round(reduced[-1].item())) if correct is not None else None
    return obj, distributed.loss_weight(n_local, n, ranks.world), parts, correct, n


def _metrics_until(path: Path, step: int, rewrite: bool = True) -> list[dict[str, Any]]:
    """The logged rows up to ``step`` (a resumed run drops what came after its checkpoint;
    ``rewrite``: also in the file). A torn last line (a kill or a full disk) is dropped; a
    corrupt line before it raises ``files.CorruptFileError`` naming the file and the line."""
    if step == 0 or not path.exists():
        return []
    rows = [r for r in read_jsonl(path) if isinstance(r, dict) and r.get("step", 0) <= step]
    if rewrite:
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
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
