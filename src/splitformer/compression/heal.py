"""The healing loop: optimal control of a coarse network towards the fine one, within a
wall-clock budget (docs/depth.md "Healing"; the objective is ``control.healing.Distillation``).

    result = heal(HealConfig(method="drop", steps=(3,), budget=600), teacher=model,
                  windows=ids, out="DIR/heal")

The parameters healed are a copy of the teacher's (``result.base``); each N_t of
``config.steps`` is a coarsening of that copy (``compression.coarsenings.plan``), so with
several N_t (random-tau healing, the t-analogue of ``--tau-choices``) one set of parameters is
asked to serve every depth: optimiser step s trains the depth drawn uniformly by a generator
seeded with (seed, s). The batches are windows of healing text (``windows``: (M, n) token ids,
no padding, n = ``length``), a seeded permutation per pass. AdamW (matrices decayed, gains and
biases not: ``training.loop.parameter_groups``); the learning rate warms up linearly over
``warmup`` steps or over the first ``WARMUP_SHARE`` (10%) of the progress, whichever ends
first (so that a short run does not end inside its warm-up; ``notice`` says when the share
cuts it), then follows a half cosine of the progress: step / max_steps when ``max_steps`` is
given (the budget is then only a cut-off, and the run does not depend on the machine's speed),
else seconds / budget. Dropout is off (the student runs in eval mode; the teacher too, its flag
restored after: a deterministic problem).

A resumed run must heal the same teacher on the same windows: the checkpoint records a SHA-256
of the teacher's state and of the windows, and another teacher (``MODEL``) or other windows
(``--windows``, ``--length``) are refused by name. Its config must be the run's, except the
keys of ``RESUMABLE`` (the budget, max_steps and how often it logs and checkpoints): a run is
resumed, or a finished one healed on, with a longer budget; the cosine then follows the new
budget's progress from the steps and seconds already spent.

``out`` receives config.json, metrics.jsonl (a row every ``log_every`` steps) and checkpoints
(``training.checkpoints``: safetensors + JSON, every ``checkpoint_every`` steps, every
``checkpoint_seconds`` seconds, and at the end; none when nothing is healed); a folder with a
checkpoint of the same config is resumed (the seconds spent are counted), a finished one
(final.json) is returned as it is unless the config allows more steps (then it heals on: from
its last checkpoint, or, where the checkpoints were removed, from the healed parameters the
caller gives as ``healed``, AdamW's moments then starting afresh with a new warm-up); one
writer per folder (``files.FolderLock``, its lock file removed when the run ends; one found at
the start was left by a killed run: with no checkpoint ``notice`` says "starting over").

Data parallel (``torchrun --nproc_per_node N -m splitformer compress ...``): when the caller
has set up a process group of world > 1 (``training.distributed.session()``), every rank passes
the same teacher and windows (their fingerprints and the coarse grids are checked across the
ranks) and the ranks heal one problem, as ``training.loop`` trains: every rank draws the same
global batch of ``batch_size`` windows (``_batch``, ``_cut``: seeded by (seed, step)), takes its
contiguous shard (``distributed.shard_bounds``) and backpropagates its objective weighted by
world * n_r / n; the gradients are summed over the ranks and divided by the world before
AdamW's step (the parameters the grid leaves without a gradient are skipped on every rank); the
loss and parts logged are the global batch's. Rank 0's clock decides for every rank (the stop
at the budget, a budget's cosine), so that no rank waits at a collective. The local fit runs
on rank 0 alone (``fit_budget`` is its clock's) and its parameters are broadcast. Only rank 0
prints (``progress``, ``notice``), takes the folder's lock and writes it; the others load the
same checkpoint and learn its errors. Exact where the objective is a mean over windows (the
next-token KL on windows of one length, the shooting terms beside it, the embedding term):
then N ranks take one process's steps to round-off (tests/test_heal_distributed.py). The
other relative squared errors (terminal; shooting without the KL) are ratios of sums over the
batch's tokens, which each shard normalises by its own reference: there the ranks descend the
shards' weighted mean of relative errors, not the batch's ratio (equal when the shards'
references are); ``relation`` (pairs across a batch) is refused under torchrun.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..control.healing import Distillation
from ..files import LOCK_NAME, FolderLock, FolderLockedError, append_line, read_jsonl, write_atomic
from ..training import distributed
from ..training.checkpoints import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from ..training.loop import parameter_groups
from . import Diverged
from .coarsenings import DATA_DRIVEN, METHODS, Coarsening, plan
from .fitting import ABSORB, INIT, FitConfig, fit

__all__ = ["HEALED", "PRECISIONS", "RESUMABLE", "WARMUP_SHARE", "HealConfig", "HealResult",
           "check_resumable", "heal", "healed_copy", "more_steps", "student_of"]

PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16}
"""The arithmetic of a healing step: float32, or bfloat16 under autocast (mixed precision)."""

HEALED = {"all": "every parameter of the model",
          "controls": "the controls theta(t) only (the parameters of model.evolution); the "
                      "lift u(0) = E(ids) (the embeddings) and any read-out head stay the "
                      "teacher's"}
"""What a healing run optimises (``HealConfig.healed``)."""

RESUMABLE = ("budget", "max_steps", "checkpoint_every", "checkpoint_seconds", "log_every")
"""The ``HealConfig`` keys a resumed run may change (how long it heals, how often it logs and
checkpoints); the others must be the run's."""

WARMUP_SHARE = 0.1
"""The warm-up ends after ``HealConfig.warmup`` steps or this share of the progress (steps of
max_steps, else seconds of the budget), whichever comes first."""


@dataclass(frozen=True)
class HealConfig:
    """How to coarsen and heal (module doc). ``steps``: the N_t the healed parameters serve
    (one: that depth alone; several: random-tau healing); ``budget``: seconds of healing (0:
    none, the training-free coarse model); ``max_steps``: optimiser steps at most (None: the
    budget alone); ``shooting``/``embedding``/``relation``: the weights of ``Distillation``;
    ``merge``: r nodes merged per unit of time while healing (0: none); ``min_length``: None
    (every step's windows whole), or the shortest cut: step s cuts its batch to l tokens, l
    drawn uniformly in [min_length, length] (seeded with (seed, s)), each window keeping its
    first l - 1 tokens and its last (the [SEP] of ``depth_eval.healing_windows``), so that
    short inputs are healed too; ``precision``: "float32", or "bfloat16" (the objective,
    teacher and student, computed under ``torch.autocast``: its matrix products in bfloat16,
    the states, norms and losses in float32 as autocast keeps them, the parameters and the
    optimiser float32: mixed precision; the healed model is evaluated and saved in
    float32); ``healed``: "all" (every parameter), or "controls" (``HEALED``: only theta(t) is
    optimised, so the coarse evolution starts from the fine one's initial state u(0) and the
    healing is an optimal-control problem in theta alone; on MiniLM it also spares AdamW the
    11.7M-entry token table: a shorter step, ``benchmarks/heal_step_time.py``);
    ``checkpoint_every`` / ``checkpoint_seconds``: a checkpoint after that many optimiser steps
    or seconds since the last one, whichever comes first (a kill loses at most that much);
    ``next_token`` / ``terminal``: the weights of the next-token KL and of the terminal cost
    (``Distillation``: a causal LM heals on its next-token laws); ``fit``: what the absorbing
    steps of a dropped grid compute before the healing begins (``fitting.ABSORB``: "keep",
    "average", "linear", "step"), fitted on the first ``fit_windows`` windows, "step" for
    ``fit_budget`` seconds or ``fit_steps`` AdamW steps at ``fit_lr`` from ``fit_init``
    (``fitting.INIT``: the kept step, the average, or the least-squares map) (the local phase:
    multiple shooting, each absorbing step alone on cached teacher states; the budget is the
    global phase's, after it). A run with a checkpoint resumes from it and does not fit
    again (the checkpoint holds the fitted parameters: one is written as the fit ends)."""

    method: str = "drop"
    steps: tuple[int, ...] = (3,)
    budget: float = 600.0
    max_steps: int | None = None
    lr: float = 1e-4
    weight_decay: float = 0.01
    batch_size: int = 16
    length: int = 128
    min_length: int | None = None
    shooting: float = 0.0
    embedding: float = 0.0
    relation: float = 0.0
    warmup: int = 20
    seed: int = 0
    merge: int = 0
    precision: str = "float32"
    healed: str = "all"
    checkpoint_every: int = 100
    log_every: int = 20
    probe: int = 32
    checkpoint_seconds: float = 60.0
    next_token: float = 0.0
    terminal: float = 1.0
    fit: str = "keep"
    fit_budget: float = 0.0
    fit_steps: int | None = None
    fit_lr: float = 2e-4
    fit_windows: int = 64
    fit_init: str = "keep"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {list(METHODS)}, got {self.method!r}")
        steps = self.steps
        if isinstance(steps, int):
            steps = (steps,)
        steps = tuple(steps)
        if not steps or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                            for s in steps) or len(set(steps)) != len(steps):
            raise ValueError(f"steps must be distinct ints >= 1 (the N_t healed), got "
                             f"{self.steps!r}")
        object.__setattr__(self, "steps", steps)
        for name in ("budget", "lr", "shooting", "embedding", "relation", "weight_decay",
                     "next_token", "terminal", "fit_budget", "fit_lr"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        for name in ("batch_size", "length", "checkpoint_every", "log_every", "probe",
                     "fit_windows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name in ("warmup", "seed", "merge"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if self.min_length is not None and (isinstance(self.min_length, bool) or not isinstance(
                self.min_length, int) or not 2 <= self.min_length <= self.length):
            raise ValueError(f"min_length must be None or an int in [2, length={self.length}], "
                             f"got {self.min_length!r}")
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or not isinstance(
                self.max_steps, int) or self.max_steps < 0):
            raise ValueError(f"max_steps must be None or an int >= 0, got {self.max_steps!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got "
                             f"{self.precision!r}")
        if self.healed not in HEALED:
            raise ValueError(f"healed must be one of {list(HEALED)}, got {self.healed!r}")
        if self.relation and self.batch_size < 2:
            raise ValueError(f"relation needs batch_size >= 2 (pairs within a batch), got "
                             f"batch_size={self.batch_size}")
        self.fit_config()  # the fit's own checks, by name
        v = self.checkpoint_seconds
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                math.isfinite(v) and v > 0):
            raise ValueError(f"checkpoint_seconds must be a finite number > 0, got {v!r}")

    def fit_config(self) -> FitConfig:
        """The ``fitting.FitConfig`` of the local phase."""
        if self.fit not in ABSORB:
            raise ValueError(f"fit must be one of {list(ABSORB)}, got {self.fit!r}")
        if self.fit_steps is not None and (isinstance(self.fit_steps, bool) or not isinstance(
                self.fit_steps, int) or self.fit_steps < 0):
            raise ValueError(f"fit_steps must be None or an int >= 0, got {self.fit_steps!r}")
        if self.fit_init not in INIT:
            raise ValueError(f"fit_init must be one of {list(INIT)}, got {self.fit_init!r}")
        if self.fit_init != "keep" and self.fit != "step":
            raise ValueError(f"fit_init={self.fit_init!r} is where fit='step' starts; fit is "
                             f"{self.fit!r}")
        if self.fit == "step" and not (self.fit_budget or self.fit_steps):
            raise ValueError("fit='step' fits the absorbing steps by AdamW: give fit_budget "
                             "(seconds) or fit_steps")
        if self.fit != "keep" and len(self.steps) != 1:
            raise ValueError(f"fit={self.fit!r} fits the absorbing steps of one grid; steps "
                             f"holds {len(self.steps)} depths")
        return FitConfig(absorb=self.fit, budget=self.fit_budget, max_steps=self.fit_steps,
                         lr=self.fit_lr, seed=self.seed, init=self.fit_init)

    def objective(self, coarsening, base: nn.Module, teacher: nn.Module) -> Distillation:
        """The healing objective of ``coarsening`` of ``base`` against ``teacher``, with this
        config's weights."""
        return Distillation(coarsening.apply(base).eval(), teacher, coarsening.fine_points,
                            shooting=self.shooting, embedding=self.embedding,
                            relation=self.relation, next_token=self.next_token,
                            terminal=self.terminal)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["steps"] = list(self.steps)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HealConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(f"HealConfig: unknown keys {extra}")
        d = dict(data)
        if "steps" in d:
            d["steps"] = tuple(d["steps"])
        return cls(**d)


@dataclass
class HealResult:
    """The healed parameters (``base``, the teacher's structure), the coarsening of each
    healed N_t, the metrics (steps, seconds, last losses) and the logged rows."""

    base: nn.Module
    coarsenings: dict[int, Coarsening]
    metrics: dict[str, Any]
    history: list[dict[str, Any]]

    def student(self, steps: int | None = None) -> nn.Module:
        """The coarse model of ``steps`` (default: the first healed N_t), eval mode."""
        n = next(iter(self.coarsenings)) if steps is None else steps
        if n not in self.coarsenings:
            raise ValueError(f"steps={n!r}: healed for {list(self.coarsenings)}")
        return self.coarsenings[n].apply(self.base).eval()


def healed_copy(teacher: nn.Module, healed: str = "all") -> nn.Module:
    """A copy of ``teacher`` whose parameters of ``healed`` (``HEALED``) require gradients and
    the others not: what a healing run optimises."""
    if healed not in HEALED:
        raise ValueError(f"healed must be one of {list(HEALED)}, got {healed!r}")
    base = copy.deepcopy(teacher).requires_grad_(healed == "all")
    base.evolution.requires_grad_(True)
    return base


def student_of(base: nn.Module, coarsening: Coarsening) -> nn.Module:
    return coarsening.apply(base).eval()


def _progress(cfg: HealConfig, step: int, seconds: float) -> float:
    """How far the run is: step / max_steps when max_steps is given, else seconds / budget."""
    if cfg.max_steps:
        return step / cfg.max_steps
    return seconds / cfg.budget if cfg.budget else 0.0


def _warm(cfg: HealConfig, step: int, seconds: float, since: tuple[int, float] = (0, 0.0)
          ) -> tuple[float, bool]:
    """The warm-up factor at ``step`` of a run whose AdamW moments began at ``since`` (step,
    seconds), and whether ``WARMUP_SHARE`` of the progress ended it before ``warmup`` steps."""
    if not cfg.warmup:
        return 1.0, False
    by_steps = (step - since[0] + 1) / cfg.warmup
    by_share = (_progress(cfg, step, seconds) - _progress(cfg, *since)) / WARMUP_SHARE
    return min(1.0, max(by_steps, by_share)), by_share >= 1.0 > by_steps


def _progress_lr(cfg: HealConfig, step: int, seconds: float,
                 since: tuple[int, float] = (0, 0.0)) -> float:
    done = _progress(cfg, step, seconds)
    return cfg.lr * _warm(cfg, step, seconds, since)[0] * 0.5 * (
        1 + math.cos(math.pi * min(done, 1.0)))


def more_steps(cfg: HealConfig, step: int, seconds: float) -> bool:
    """Whether a run at ``step`` after ``seconds`` heals on under ``cfg`` (its budget and
    max_steps)."""
    return bool(cfg.budget) and seconds < cfg.budget and (cfg.max_steps is None
                                                          or step < cfg.max_steps)


def _batch(windows: torch.Tensor, cfg: HealConfig, step: int) -> torch.Tensor:
    m = len(windows)
    start = step * cfg.batch_size
    rows = []
    while len(rows) < cfg.batch_size:
        epoch, offset = divmod(start + len(rows), m)
        g = torch.Generator().manual_seed(cfg.seed * 100003 + epoch)
        perm = torch.randperm(m, generator=g)
        take = min(cfg.batch_size - len(rows), m - offset)
        rows.extend(perm[offset:offset + take].tolist())
    return windows[rows]


def _cut(batch: torch.Tensor, cfg: HealConfig, step: int) -> torch.Tensor:
    """The batch of step ``step`` cut to its drawn length (``HealConfig.min_length``)."""
    if cfg.min_length is None or cfg.min_length == batch.shape[1]:
        return batch
    n = random.Random(f"heal length {cfg.seed} {step}").randint(cfg.min_length, batch.shape[1])
    return torch.cat([batch[:, :n - 1], batch[:, -1:]], dim=1)


def _draw(cfg: HealConfig, step: int) -> int:
    if len(cfg.steps) == 1:
        return cfg.steps[0]
    return random.Random(f"heal steps {cfg.seed} {step}").choice(cfg.steps)


def fingerprint(*tensors: torch.Tensor) -> str:
    """SHA-256 of the tensors' shapes, dtypes and bytes (in order)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(f"{tuple(t.shape)} {t.dtype};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def coarsenings_for(cfg: HealConfig, base: nn.Module, windows: torch.Tensor
                    ) -> dict[int, Coarsening]:
    """The coarse grid of each N_t of ``cfg`` for ``base`` (the data-driven methods read the
    first ``cfg.probe`` windows), with ``cfg.merge`` added."""
    probe = {"input_ids": windows[:cfg.probe]}
    return {n: plan(cfg.method, base, n, probe).with_merging(
        cfg.merge, **({"metric": "state", "where": "step"} if cfg.merge else {}))
        for n in cfg.steps}


def heal(cfg: HealConfig, *, teacher: nn.Module, windows: torch.Tensor,
         out: str | Path | None, progress: Callable[[dict[str, Any]], None] | None = None,
         notice: Callable[[str], None] | None = None,
         healed: dict[str, torch.Tensor] | None = None) -> HealResult:
    """Heal (module doc). ``teacher``: the fine model (not changed); ``windows``: (M, n)
    token ids; ``out``: the healing folder (None: nothing written, no resume); ``progress``:
    called with each logged row and with the first step's; ``notice``: called with a line of
    text as each phase starts (choosing the grid, healing, healing on, a warm-up cut short,
    starting over after a kill); ``healed``: the healed parameters (a state_dict of the
    teacher's structure) of the finished run in ``out`` whose checkpoints were removed
    (``splitformer compress``'s finished folder keeps them as model.safetensors)."""
    if not isinstance(cfg, HealConfig):
        raise TypeError(f"heal(cfg) takes a HealConfig, got {type(cfg).__name__}")
    if not (isinstance(windows, torch.Tensor) and windows.dim() == 2 and not
            windows.is_floating_point() and len(windows) >= 1):
        raise ValueError(f"windows must be a 2-D integer tensor (M, n) of token ids, got "
                         f"{getattr(windows, 'shape', type(windows).__name__)}")
    if windows.shape[1] != cfg.length:
        raise ValueError(f"windows: {windows.shape[1]} tokens each, the config's length is "
                         f"{cfg.length}")
    was_training = teacher.training
    try:
        return _heal(cfg, teacher.eval(), windows, out, progress,
                     notice or (lambda text: None), healed)
    finally:
        teacher.train(was_training)


_ADDED = {"precision": "float32", "min_length": None,  # HealConfig keys added 2026-12-03
          "healed": "all", "checkpoint_seconds": 60.0,
          "next_token": 0.0, "terminal": 1.0, "fit": "keep",  # added 2026-12-06
          "fit_budget": 0.0, "fit_steps": None, "fit_lr": 2e-4, "fit_windows": 64,
          "fit_init": "keep"}  # added 2026-12-07
_FINGERPRINTS = "fingerprints"  # final.json's key of the teacher's and the windows' SHA-256


def _another_config(folder: Path, saved: Any, cfg: HealConfig) -> ValueError | None:
    """The refusal of a run in ``folder`` whose config ``saved`` differs from ``cfg`` in a key
    that is not ``RESUMABLE`` (None when it does not)."""
    # a key added since a run was written has its default there (a run from before the key)
    saved = {**_ADDED, **saved} if isinstance(saved, dict) else {}
    now = cfg.to_dict()
    changed = sorted(k for k in set(now) | set(saved)
                     if k not in RESUMABLE and saved.get(k, "?") != now.get(k, "?"))
    if not changed:
        return None
    was = ", ".join(f"{k}={saved.get(k)!r}" for k in changed)
    return ValueError(f"out: {str(folder)!r} holds a healing run of another config (differs "
                      f"in {changed}; the run's: {was}); choose another folder, or resume "
                      "with the run's settings")


def _refuse_another_run(folder: Path, state: dict[str, Any], cfg: HealConfig,
                        identity: dict[str, str]) -> None:
    """ValueError when the run in ``folder`` (its checkpoint's ``state``, or final.json's
    fingerprints) is of another config, teacher or windows."""
    error = _another_config(folder, state.get("config"), cfg)
    if error is not None:
        raise error
    for key, what in (("teacher", "the teacher (MODEL)"),
                      ("windows", "the healing windows (--windows, --length, --news, "
                                  "--wiki, --aligned, --seed)")):
        if state.get(key) != identity[key]:
            raise ValueError(f"out: {str(folder)!r} holds a healing run of another {key}: "
                             f"{what} differs from the run's; choose another folder")


def check_resumable(folder: str | Path, cfg: HealConfig) -> None:
    """ValueError when ``folder`` holds a healing run (a checkpoint or final.json) of another
    config than ``cfg`` (``RESUMABLE`` keys aside): what ``heal`` refuses, read from its
    config.json alone (no tensor), so that a caller refuses it before loading anything."""
    folder = Path(folder)
    if not (folder / "config.json").is_file() or not (
            (folder / "final.json").is_file() or latest_checkpoint(folder) is not None):
        return
    try:
        saved = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return  # heal reads the checkpoint's own record
    error = _another_config(folder, saved, cfg)
    if error is not None:
        raise error


def _read_final(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """final.json: (the metrics, the fingerprints it records or {})."""
    final = json.loads((folder / "final.json").read_text())
    fingerprints = final.pop(_FINGERPRINTS, None)
    return final, fingerprints if isinstance(fingerprints, dict) else {}


def _history(folder: Path, step: int) -> list[dict[str, Any]]:
    if not (folder / "metrics.jsonl").exists():
        return []
    return [r for r in read_jsonl(folder / "metrics.jsonl", repair=True)
            if isinstance(r, dict) and r.get("step", 0) <= step]


def _resume(folder: Path, cfg: HealConfig, base: nn.Module, optimizer: torch.optim.Optimizer,
            identity: dict[str, str], healed: dict[str, torch.Tensor] | None,
            tell: Callable[[str], None], killed: bool
            ) -> tuple[int, float, list[dict[str, Any]], dict[str, Any] | None,
                       tuple[int, float]]:
    """(step, seconds, metrics rows, final metrics or None, where AdamW's moments began) of
    the run in ``folder``, its parameters (and moments) loaded into ``base`` and
    ``optimizer``; (0, 0, [], None, (0, 0)) for a new folder. Unless the run is finished
    (final metrics returned), config.json (this config) and metrics.jsonl (the rows up to the
    step) are written."""
    step, before, history, since = 0, 0.0, [], (0, 0.0)
    finished = (folder / "final.json").exists()
    if latest_checkpoint(folder) is not None:
        # the run's config first: another config's tensors may not fit the optimiser
        _refuse_another_run(folder, load_checkpoint(folder, restore_rng=False), cfg, identity)
        state = load_checkpoint(folder, model=base, optimizer=optimizer, restore_rng=False)
        step, before = int(state["step"]), float(state["seconds"])
        warm_from = state.get("warm_from")
        if isinstance(warm_from, (list, tuple)) and len(warm_from) == 2:
            since = (int(warm_from[0]), float(warm_from[1]))
        history = _history(folder, step)
        if finished:
            final, _ = _read_final(folder)
            if not more_steps(cfg, step, before):
                return step, before, history, final, since
            tell(f"healing on from step {step} ({before:.0f} s spent): this config allows "
                 "more")
        else:
            tell(f"resuming from step {step} ({before:.0f} s spent)")
    elif finished:  # a finished run whose checkpoints were removed: from ``healed``
        final, fingerprints = _read_final(folder)
        saved = json.loads((folder / "config.json").read_text()) if (
            folder / "config.json").is_file() else None
        if not fingerprints:
            raise ValueError(f"out: {str(folder)!r} holds a finished healing run that records "
                             "no fingerprint of its teacher and windows (written by an older "
                             "splitformer); choose another folder")
        _refuse_another_run(folder, {"config": saved, **fingerprints}, cfg, identity)
        if healed is None:
            raise ValueError(f"out: {str(folder)!r} holds a finished healing run whose "
                             "checkpoints were removed; pass its healed parameters (healed=) "
                             "or choose another folder")
        base.load_state_dict(healed, strict=True)
        step, before = int(final["steps_taken"]), float(final["seconds"])
        history = _history(folder, step)
        if not more_steps(cfg, step, before):
            return step, before, history, final, since
        since = (step, before)
        tell(f"healing on from step {step} ({before:.0f} s spent) from the healed parameters: "
             "AdamW's moments start afresh (the finished run kept none), with a new warm-up")
    elif killed:
        tell("starting over: the killed run left no checkpoint")
    write_atomic(folder / "config.json", json.dumps(cfg.to_dict(), indent=2) + "\n")
    write_atomic(folder / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in history))
    return step, before, history, None, since


def _optimiser_step(problem: Distillation, optimizer: torch.optim.Optimizer,
                    batch: torch.Tensor, lr: float, step: int, precision: str = "float32"
                    ) -> dict[str, float]:
    """One AdamW step on the healing objective at rate ``lr`` (``precision``: the
    objective's arithmetic, ``PRECISIONS``): its loss and parts. A loss that is not finite is
    refused before the parameters change."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    dtype = PRECISIONS[precision]
    with torch.autocast(batch.device.type, dtype=dtype or torch.bfloat16,
                        enabled=dtype is not None):
        obj = problem({"input_ids": batch})
    loss = float(obj.total.detach())
    if not math.isfinite(loss):
        raise Diverged(loss, step)
    optimizer.zero_grad(set_to_none=True)
    obj.total.backward()
    optimizer.step()
    return {"loss": loss, **{k: float(v.detach()) for k, v in obj.parts.items()}}


def _shard_step(problem: Distillation, optimizer: torch.optim.Optimizer, batch: torch.Tensor,
                lr: float, step: int, precision: str, ranks: distributed.Ranks
                ) -> dict[str, float]:
    """``_optimiser_step`` under torchrun: this rank's contiguous shard of the global
    ``batch`` (n_r of n windows) backpropagates its objective weighted by world * n_r / n, the
    gradients are summed over the ranks and divided by the world (the global batch's mean
    gradient: a rank with no window runs one with weight 0), the loss and its parts are the
    global batch's (sum_r (n_r / n) value_r), and a loss that is not finite is refused on
    every rank before the parameters change. The parameters without a gradient (the controls
    of the steps the grid drops) are the same on every rank, and AdamW skips them as it does
    in one process."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    lo, hi = distributed.shard_bounds(len(batch), ranks.rank, ranks.world)
    weight = distributed.loss_weight(hi - lo, len(batch), ranks.world)
    dtype = PRECISIONS[precision]
    with torch.autocast(batch.device.type, dtype=dtype or torch.bfloat16,
                        enabled=dtype is not None):
        obj = problem({"input_ids": batch[lo:hi] if hi > lo else batch[:1]})
    optimizer.zero_grad(set_to_none=True)
    (obj.total * weight).backward()
    grads = [p.grad for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None]
    share = (hi - lo) / len(batch)
    values = distributed.all_reduce_sum(
        [share * float(obj.total.detach()), *(share * float(v.detach())
                                              for v in obj.parts.values()), len(grads)])
    if int(values[-1]) != ranks.world * len(grads):
        raise RuntimeError(f"heal: the ranks' gradients differ in number at step {step} (this "
                           f"rank {len(grads)}, all {int(values[-1])})")
    loss = float(values[0])
    if not math.isfinite(loss):
        raise Diverged(loss, step)
    distributed.all_reduce_sum_(grads)
    for g in grads:
        g.div_(ranks.world)
    optimizer.step()
    return {"loss": loss, **{k: float(v) for k, v in zip(obj.parts, values[1:-1],
                                                          strict=True)}}


def _heal(cfg: HealConfig, teacher: nn.Module, windows: torch.Tensor, out: str | Path | None,
          progress: Callable[[dict[str, Any]], None] | None, tell: Callable[[str], None],
          healed: dict[str, torch.Tensor] | None) -> HealResult:
    ranks = distributed.Ranks.current()
    if ranks.distributed and cfg.relation:  # every rank refuses it: no collective yet
        raise ValueError("relation compares the pairs of a whole batch, which the ranks' "
                         "shards split: heal with relation on one process")
    if not ranks.main:  # only rank 0 prints
        progress, tell = None, (lambda text: None)
    base = healed_copy(teacher, cfg.healed)
    identity = {"teacher": fingerprint(*teacher.state_dict().values()),
                "windows": fingerprint(windows)}
    if cfg.method in DATA_DRIVEN:
        tell(f"choosing the grid: {cfg.method} reads the fine model on "
             f"{min(cfg.probe, len(windows))} probe windows")
    coarse = coarsenings_for(cfg, base, windows)
    if ranks.distributed:
        distributed.same_on_every_rank(
            {**identity, "grids": [str(c) for c in coarse.values()]},
            "heal: under torchrun every rank heals the same teacher on the same windows "
            "(and chooses the same grid)")
    problems = {n: cfg.objective(c, base, teacher) for n, c in coarse.items()}
    optimizer = torch.optim.AdamW(parameter_groups(base, cfg.weight_decay), lr=cfg.lr)
    folder = None if out is None else Path(out)
    run = _Run(cfg, base, optimizer, folder if ranks.main else None, identity, tell,
               ranks=ranks)
    lock = None
    try:
        lock, final, fresh = _open(run, folder, healed)
        if final is not None:
            return HealResult(base, coarse, final, run.history)
        fitted = None
        if fresh and cfg.fit != "keep":
            if ranks.main:  # the local phase: rank 0 alone, its parameters then broadcast
                fitted = _fit(cfg, base, teacher, coarse, windows, tell)
            if ranks.distributed:
                fitted = distributed.broadcast_object(fitted)
                distributed.broadcast_([*base.parameters(), *base.buffers()])
            if cfg.fit == "step" and run.folder is not None and more_steps(cfg, 0, 0.0):
                run.start = time.perf_counter()  # no healing second spent yet
                run.checkpoint()  # a kill in the global phase resumes from the fitted steps
        metrics = run.loop(problems, windows, progress)
        if fitted is not None:
            metrics = {**metrics, "fit": fitted}
        return HealResult(base, coarse, metrics, run.history)
    finally:
        if lock is not None:
            lock.release(remove=True)


def _open(run: _Run, folder: Path | None, healed: dict[str, torch.Tensor] | None
          ) -> tuple[FolderLock | None, dict[str, Any] | None, bool]:
    """(the folder's lock, the final metrics of a finished run or None, whether the run is
    new): rank 0 takes the lock and resumes the run in ``folder`` (``_resume``); under
    torchrun the others then learn its outcome (its error, raised on every rank, so that none
    waits at a collective) and load the same checkpoint (the parameters and AdamW's moments),
    or the same ``healed`` parameters."""
    lock, final, fresh, error = None, None, True, None
    if run.ranks.main and folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            killed = (folder / LOCK_NAME).exists()  # a writer that ended well removed it
            lock = FolderLock(folder, what="healing folder").acquire()
            fresh = latest_checkpoint(folder) is None and not (folder / "final.json").exists()
            run.step, run.before, run.history, final, run.since = _resume(
                folder, run.cfg, run.base, run.optimizer, run.identity, healed, run.tell,
                killed)
        except BaseException as e:  # told to every rank, then raised
            if lock is not None:
                lock.release(remove=True)
            if not isinstance(e, Exception):  # Ctrl-C: the launcher ends every rank
                raise
            error = e
    error = distributed.rank0_error(error, (CheckpointError, FolderLockedError))
    if error is not None:
        raise error
    if not run.ranks.distributed:
        return lock, final, fresh
    shared = distributed.broadcast_object(
        {"fresh": fresh, "final": final, "step": run.step, "before": run.before,
         "since": run.since, "history": run.history,
         "checkpoint": folder is not None and latest_checkpoint(folder) is not None})
    if not run.ranks.main:
        run.step, run.before, run.since = shared["step"], shared["before"], shared["since"]
        run.history = shared["history"]
        if shared["checkpoint"]:
            load_checkpoint(folder, model=run.base, optimizer=run.optimizer, restore_rng=False)
        elif shared["final"] is not None or shared["step"]:  # from the healed parameters
            run.base.load_state_dict(healed, strict=True)
    return lock, shared["final"], shared["fresh"]


def _fit(cfg: HealConfig, base: nn.Module, teacher: nn.Module,
         coarse: dict[int, Coarsening], windows: torch.Tensor, tell: Callable[[str], None]
         ) -> dict[str, Any]:
    """The local phase (``fitting.fit``) on the one grid of ``cfg``."""
    (coarsening,) = coarse.values()
    tell(f"fitting the absorbing steps ({cfg.fit}: {ABSORB[cfg.fit]}) on "
         f"{min(cfg.fit_windows, len(windows))} windows"
         + (f", from {cfg.fit_init}" if cfg.fit == "step" else "")
         + (f", {cfg.fit_budget:g} s" if cfg.fit == "step" and cfg.fit_budget else "")
         + (f", {cfg.fit_steps} AdamW steps" if cfg.fit == "step" and cfg.fit_steps else ""))
    start = time.perf_counter()
    report = fit(base, coarsening, cfg.fit_config(), teacher=teacher,
                 calibration=windows[:cfg.fit_windows], say=tell)
    report["seconds"] = round(time.perf_counter() - start, 3)
    return report


@dataclass
class _Run:
    """The state of one healing run between optimiser steps (``_heal``): where it is (step,
    seconds spent before this process, where AdamW's moments began), its rows, and when it
    last wrote a checkpoint (and whether it said that the warm-up was cut)."""

    cfg: HealConfig
    base: nn.Module
    optimizer: torch.optim.Optimizer
    folder: Path | None
    identity: dict[str, str]
    tell: Callable[[str], None]
    step: int = 0
    before: float = 0.0
    since: tuple[int, float] = (0, 0.0)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    start: float = 0.0
    saved_at: float = 0.0
    said_cut: bool = False
    ranks: distributed.Ranks = dataclasses.field(default_factory=distributed.Ranks)

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.start

    def now(self) -> float:
        """The seconds spent, rank 0's on every rank (under torchrun the stop and the
        learning rate follow one clock, so that every rank takes the same steps)."""
        if not self.ranks.distributed:
            return self.seconds()
        mine = self.seconds() if self.ranks.main else 0.0
        return float(distributed.all_reduce_sum([mine])[0])

    def checkpoint(self) -> None:
        if self.folder is not None:
            save_checkpoint(self.folder, model=self.base, optimizer=self.optimizer,
                            state={"step": self.step, "seconds": self.seconds(),
                                   "config": self.cfg.to_dict(), "warm_from": list(self.since),
                                   **self.identity})
            self.saved_at = time.perf_counter()

    def loop(self, problems: dict[int, Distillation], windows: torch.Tensor,
             progress: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        """Optimiser steps while the config allows; the final metrics (final.json, and a last
        checkpoint when a step was taken)."""
        cfg = self.cfg
        self.start = self.saved_at = time.perf_counter()
        first = self.step
        if more_steps(cfg, self.step, self.seconds()) and not self.step:
            self.tell("healing" + (f": {cfg.budget:g} s" if cfg.budget else "")
                      + (f" or {cfg.max_steps} steps" if cfg.max_steps else "")
                      + (f", a checkpoint every {cfg.checkpoint_every} steps or "
                         f"{cfg.checkpoint_seconds:g} s" if self.folder is not None else ""))
        last: dict[str, float] = {}
        try:
            while more_steps(cfg, self.step, now := self.now()):
                last = self.one_step(problems, windows, progress, first, now)
        except KeyboardInterrupt:  # between optimiser steps the state is whole: keep it
            if self.step > first:
                self.checkpoint()
            raise
        metrics = {"steps_taken": self.step, "seconds": round(self.seconds(), 3), **last}
        if self.folder is not None:
            if self.step > first:  # nothing healed: no checkpoint (no weights, no moments)
                self.checkpoint()
            write_atomic(self.folder / "final.json", json.dumps(
                {**metrics, _FINGERPRINTS: self.identity}, indent=2) + "\n")
        return metrics

    def one_step(self, problems: dict[int, Distillation], windows: torch.Tensor,
                 progress: Callable[[dict[str, Any]], None] | None, first: int, now: float
                 ) -> dict[str, float]:
        """One optimiser step at ``now`` seconds, its row logged (every log_every steps, and
        the first step of this process to ``progress``) and a checkpoint when one is due."""
        cfg, step = self.cfg, self.step
        n = _draw(cfg, step)
        lr = _progress_lr(cfg, step, now, self.since)
        if (_warm(cfg, step, now, self.since)[1] and step - self.since[0] < cfg.warmup
                and not self.said_cut):
            self.said_cut = True
            k = step - self.since[0]
            self.tell(f"warm-up cut to {k} step{'s' * (k != 1)} of {cfg.warmup}: "
                      f"{WARMUP_SHARE:.0%} of the " + ("steps" if cfg.max_steps else "budget")
                      + " had passed (a short run does not end inside its warm-up)")
        batch = _cut(_batch(windows, cfg, step), cfg, step)
        last = (_shard_step(problems[n], self.optimizer, batch, lr, step, cfg.precision,
                            self.ranks) if self.ranks.distributed else
                _optimiser_step(problems[n], self.optimizer, batch, lr, step, cfg.precision))
        self.step = step = step + 1
        row = {"step": step, "seconds": round(self.seconds(), 3), "lr": lr, "steps": n, **last}
        if step % cfg.log_every == 0:
            self.history.append(row)
            if self.folder is not None:
                append_line(self.folder / "metrics.jsonl", json.dumps(row))
        if progress is not None and (step % cfg.log_every == 0 or step == first + 1):
            progress(row)
        if (step % cfg.checkpoint_every == 0
                or time.perf_counter() - self.saved_at >= cfg.checkpoint_seconds):
            self.checkpoint()
        return last
