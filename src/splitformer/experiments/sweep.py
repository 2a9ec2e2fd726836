"""A sweep: many training runs that differ in a few settings, run resumably (docs/results.md).

A ``Sweep`` is a base ``TrainConfig`` (a dict of its keys), labelled ``variants`` (each a dict
of keys that override the base, with a ``label``), ``axes`` (key -> list of values; the sweep
is the Cartesian product variants x axes) and an ``Evaluation`` (what to measure on each
trained network besides the test metric). It comes from a TOML file

    [sweep]                       # name, metric ("test_accuracy" or "test_bpc"), seeds
    name = "schemes-digits"
    [base]                        # TrainConfig keys (docs/training.md)
    data = "digits"
    epochs = 50
    [axes]                        # lists: every combination is a run
    seed = [0, 1, 2]
    [[variants]]                  # labelled overrides; none: one variant, the base
    label = "Strang, half-width FFN"
    scheme = "strang"
    ffn_ratio = 1.0
    [evaluate]                    # Evaluation fields (experiments.evaluation)
    taus = [1, 0.5, 0.25]

or from ``Sweep.from_flags`` (the command line). ``Sweep.runs()`` lists the ``Run`` values in a
fixed order; a run's ``id`` hashes its config (without ``out`` and ``threads``) and its
evaluation, so the same settings always name the same run.

``run_sweep(sweep, out)`` writes into ``out``:

    results.jsonl     one JSON object per finished run (config, final metrics, evaluation,
                      seconds per epoch, the command that reproduces it)
    runs/<id>/        each run's folder (config, metrics.jsonl, checkpoints, final.json)

and is resumable: a run with a line in results.jsonl is never redone; a run killed during
training continues from its last checkpoint (``fit(resume=...)``); a run killed after training
but before its line was written is evaluated from its final checkpoint. ``jobs`` > 1 runs that
many worker processes (each with ``threads = cores // jobs`` unless the config sets threads).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shlex
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..training.config import ConfigError, TrainConfig
from .evaluation import Evaluation

__all__ = ["Run", "Sweep", "SweepError", "read_results", "run_sweep", "train_command"]

# keys that do not change what a run computes (where it writes, how many threads)
_NOT_IDENTITY = ("out", "threads")


class SweepError(ValueError):
    """A bad sweep specification: the message names the key and what was expected."""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "-", text).strip("-")[:48] or "run"


def train_command(config: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """The ``splitformer train`` command line of ``config`` (only the keys that differ from
    ``base``, default: the built-in defaults; ``out`` and ``threads`` left out)."""
    ref = base if base is not None else TrainConfig().to_dict()
    parts = ["splitformer", "train"]
    for key, value in config.items():
        if key == "seed":
            continue
        if key in _NOT_IDENTITY or ref.get(key) == value or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, (list, tuple)):
            value = ",".join(f"{v:g}" for v in value)
        elif isinstance(value, float):
            value = f"{value:g}"
        parts += [flag, str(value)]
    parts += ["--seed", str(config.get("seed", 0))]  # always shown: a row lists its seeds
    return shlex.join(parts)


@dataclass(frozen=True)
class Run:
    """One training run of a sweep: its label (the variant's and the axis values', without
    the seed), its full config, the evaluation to do after training."""

    label: str
    config: TrainConfig
    evaluation: Evaluation
    seed: int

    @property
    def id(self) -> str:
        cfg = {k: v for k, v in self.config.to_dict().items() if k not in _NOT_IDENTITY}
        doc = json.dumps({"config": cfg, "evaluate": self.evaluation.to_dict()},
                         sort_keys=True)
        digest = hashlib.sha1(doc.encode()).hexdigest()[:10]
        return f"{_slug(self.label)}-s{self.seed}-{digest}"

    @property
    def command(self) -> str:
        return train_command(self.config.to_dict())


@dataclass
class Sweep:
    """Base config, variants, axes and evaluation of a sweep (module docstring)."""

    name: str = "sweep"
    base: dict[str, Any] = field(default_factory=dict)
    variants: list[dict[str, Any]] = field(default_factory=list)
    axes: dict[str, list[Any]] = field(default_factory=dict)
    evaluation: Evaluation = field(default_factory=Evaluation)
    metric: str | None = None  # None: test_accuracy for classifiers, test_bpc for the LM

    def __post_init__(self) -> None:
        keys = set(TrainConfig.keys())
        if not isinstance(self.name, str) or not self.name.strip():
            raise SweepError(f"sweep.name must be a non-empty string, got {self.name!r}")
        for where, d in [("base", self.base)] + [(f"variants[{i}]", v)
                                                for i, v in enumerate(self.variants)]:
            if not isinstance(d, dict):
                raise SweepError(f"{where} must be a table of TrainConfig keys, got "
                                 f"{type(d).__name__}")
            unknown = sorted(set(d) - keys - ({"label"} if where != "base" else set()))
            if unknown:
                raise SweepError(f"{where}: unknown keys {unknown}; TrainConfig keys: "
                                 f"{sorted(keys)}")
        for key, values in self.axes.items():
            if key not in keys:
                raise SweepError(f"axes: unknown key {key!r}; TrainConfig keys: {sorted(keys)}")
            if not isinstance(values, list) or not values:
                raise SweepError(f"axes.{key} must be a non-empty list of values, got "
                                 f"{values!r}")
            if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
                raise SweepError(f"axes.{key} lists a value twice: {values!r}")
        labels = [v.get("label") for v in self.variants]
        for i, label in enumerate(labels):
            if not isinstance(label, str) or not label.strip():
                raise SweepError(f"variants[{i}] needs a label (a non-empty string), got "
                                 f"{label!r}")
        if len(set(labels)) != len(labels):
            raise SweepError(f"variants: every label must be distinct, got {labels}")
        if self.metric is not None and self.metric not in ("test_accuracy", "test_bpc",
                                                           "test_loss"):
            raise SweepError(f"sweep.metric must be test_accuracy, test_bpc or test_loss, got "
                             f"{self.metric!r}")
        if not isinstance(self.evaluation, Evaluation):
            raise SweepError(f"evaluate must be an Evaluation, got "
                             f"{type(self.evaluation).__name__}")
        self.runs()  # every combination is a valid TrainConfig

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, doc: dict[str, Any], name: str = "sweep") -> Sweep:
        known = {"sweep", "base", "axes", "variants", "evaluate"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise SweepError(f"unknown tables {unknown}; a sweep file has {sorted(known)}")
        head = doc.get("sweep", {})
        if not isinstance(head, dict) or set(head) - {"name", "metric"}:
            raise SweepError(f"[sweep] takes the keys name and metric, got {head!r}")
        variants = doc.get("variants", [])
        if not isinstance(variants, list):
            raise SweepError("variants must be an array of tables ([[variants]])")
        axes = doc.get("axes", {})
        if not isinstance(axes, dict):
            raise SweepError("axes must be a table of lists ([axes])")
        evaluate = doc.get("evaluate", {})
        if not isinstance(evaluate, dict):
            raise SweepError("evaluate must be a table ([evaluate])")
        try:
            evaluation = Evaluation.from_dict(evaluate)
        except (TypeError, ValueError) as e:
            raise SweepError(f"evaluate: {e}") from None
        return cls(name=head.get("name", name), base=dict(doc.get("base", {})),
                   variants=[dict(v) for v in variants], axes=dict(axes),
                   evaluation=evaluation, metric=head.get("metric"))

    @classmethod
    def from_toml(cls, path: str | Path) -> Sweep:
        p = Path(path)
        if not p.is_file():
            raise SweepError(f"sweep file {str(p)!r} does not exist")
        try:
            doc = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise SweepError(f"sweep file {str(p)!r} is not valid TOML: {e}") from None
        return cls.from_dict(doc, name=p.stem)

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": {"name": self.name, **({"metric": self.metric} if self.metric else {})},
                "base": self.base, "axes": self.axes, "variants": self.variants,
                "evaluate": self.evaluation.to_dict()}

    def runs(self) -> list[Run]:
        """Every run, variants outermost, then the axes in their order (seed varies fastest
        when it is the last axis)."""
        variants = self.variants or [{"label": ""}]
        names = list(self.axes)
        out = []
        for variant in variants:
            for values in itertools.product(*(self.axes[k] for k in names)):
                settings = {**self.base, **{k: v for k, v in variant.items() if k != "label"},
                            **dict(zip(names, values, strict=True))}
                try:
                    cfg = TrainConfig.from_dict(settings)
                except ConfigError as e:
                    where = f"variant {variant['label']!r}" if variant["label"] else "base"
                    raise SweepError(f"{where}, axes {dict(zip(names, values, strict=True))}: "
                                     f"{e}") from None
                shown = [variant["label"]] if variant["label"] else []
                shown += [f"{k}={_show(v)}" for k, v in zip(names, values, strict=True)
                          if k != "seed" and len(self.axes[k]) > 1]
                out.append(Run(" ".join(shown) or "base", cfg, self.evaluation, cfg.seed))
        ids = [r.id for r in out]
        if len(set(ids)) != len(ids):
            raise SweepError("two runs of the sweep have the same settings (a variant repeats "
                             "another, or an axis repeats a variant's key with its value)")
        return out

    def metric_of(self, run: Run) -> str:
        if self.metric:
            return self.metric
        return "test_bpc" if run.config.family == "lm" else "test_accuracy"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_show(v) for v in value)
    return str(value)


# -- results -------------------------------------------------------------------------------------
def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The finished runs of results.jsonl (a line cut short by a kill is dropped)."""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _append(path: Path, row: dict[str, Any]) -> None:
    text = path.read_text() if path.exists() else ""
    if text and not text.endswith("\n"):  # a line cut short by a kill
        text = text[: text.rfind("\n") + 1]
        path.write_text(text)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _epochs_done(run_dir: Path) -> int:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return 0
    return sum(1 for row in read_results(p) if "lr" not in row and "epoch" in row)


def execute(run: Run, run_dir: Path, metric: str) -> dict[str, Any]:
    """Train ``run`` into ``run_dir`` (resuming it if it was cut off) and evaluate it: the
    line results.jsonl gets."""
    from ..training.checkpoints import latest_checkpoint, load_checkpoint
    from ..training.data import load_dataset
    from ..training.families import build_model
    from ..training.loop import fit

    cfg = run.config
    data = load_dataset(cfg.data, cfg.data_dir)
    resumed = False
    if (run_dir / "final.json").exists():  # trained; killed before its line was written
        model = build_model(cfg, data)
        load_checkpoint(run_dir, model=model, restore_rng=False)
        metrics = json.loads((run_dir / "final.json").read_text())
        epochs_run = cfg.epochs
    else:
        if latest_checkpoint(run_dir) is not None:
            resumed = True
            before = _epochs_done(run_dir)
            result = fit(cfg, data=data, resume=run_dir)
            epochs_run = max(1, cfg.epochs - before)
        else:
            if run_dir.exists():  # a run killed before its first checkpoint: start again
                for name in ("metrics.jsonl", "config.json"):
                    (run_dir / name).unlink(missing_ok=True)
            result = fit(cfg, data=data, out=run_dir)
            epochs_run = cfg.epochs
        model, metrics = result.model, result.metrics
    t0 = time.perf_counter()
    evaluation = run.evaluation.measure(model, data, cfg)
    eval_seconds = time.perf_counter() - t0
    return {"id": run.id, "label": run.label, "seed": run.seed, "metric": metric,
            "value": metrics[metric], "metrics": metrics, "evaluation": evaluation,
            "parameters": metrics["parameters"],
            "seconds_per_epoch": metrics["seconds"] / epochs_run, "resumed": resumed,
            "eval_seconds": eval_seconds, "config": run.config.to_dict(),
            "command": run.command, "run_dir": str(run_dir)}


def _worker(args: tuple[Run, str, str, int | None]) -> dict[str, Any]:
    run, run_dir, metric, threads = args
    import torch

    if threads is not None and run.config.threads is None:
        torch.set_num_threads(threads)
    return execute(run, Path(run_dir), metric)


def run_sweep(sweep: Sweep, out: str | Path, *, jobs: int = 1,
              on_event: Callable[[str, Run, dict[str, Any] | None], None] | None = None,
              select: set[str] | None = None) -> list[dict[str, Any]]:
    """Run every run of ``sweep`` not yet in ``out/results.jsonl`` (module docstring); returns
    the results of every run of the sweep, in the sweep's order. ``on_event(kind, run, row)``
    is told "skip", "start" and "done". ``select``: the ids of the runs to do (and return);
    None: all."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise SweepError(f"jobs must be an integer >= 1, got {jobs!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "sweep.json"
    spec.write_text(json.dumps(sweep.to_dict(), indent=2) + "\n")
    results_path = out / "results.jsonl"
    done = {row["id"]: row for row in read_results(results_path)}
    runs = [r for r in sweep.runs() if select is None or r.id in select]
    todo = []
    for run in runs:
        if run.id in done:
            if on_event:
                on_event("skip", run, done[run.id])
        else:
            todo.append(run)
    tell = on_event or (lambda kind, run, row: None)

    def finished(run: Run, row: dict[str, Any]) -> None:
        _append(results_path, row)
        done[run.id] = row
        tell("done", run, row)

    if jobs == 1 or len(todo) <= 1:
        for run in todo:
            tell("start", run, None)
            finished(run, execute(run, out / "runs" / run.id, sweep.metric_of(run)))
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        threads = max(1, (os.cpu_count() or 1) // jobs)
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {}
            for run in todo:
                tell("start", run, None)
                futures[pool.submit(_worker, (run, str(out / "runs" / run.id),
                                              sweep.metric_of(run), threads))] = run
            for fut in cf.as_completed(futures):
                finished(futures[fut], fut.result())
    return [done[r.id] for r in runs]


def iter_labels(rows: list[dict[str, Any]]) -> Iterator[str]:
    """The labels of ``rows`` in first-seen order."""
    seen: set[str] = set()
    for row in rows:
        if row["label"] not in seen:
            seen.add(row["label"])
            yield row["label"]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
