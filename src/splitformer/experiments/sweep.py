"""A sweep: many training runs that differ in a few settings, run resumably (docs/results.md).

A ``Sweep`` is a base ``TrainConfig`` (a dict of its keys), labelled ``variants`` (each a dict
of keys that override the base, with a ``label``), ``axes`` (key -> list of values; the sweep
is the Cartesian product variants x axes) and an ``Evaluation`` (what to measure on each
trained network besides the test metric). It comes from a TOML file

    [sweep]                       # name; metric: test_accuracy (classifiers, the default) or
                                  # test_bpc / test_loss (lm; default test_bpc)
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

or from the command line (``splitformer experiment``). ``Sweep.runs()`` lists the ``Run``
values in a fixed order. A run is identified by its config (without ``out`` and ``threads``):
a line of results.jsonl is the run's when every key it records has the run's value and every
key it lacks (one added to TrainConfig later) is at its default; the folder name ``id`` is the
label, the seed and a hash of the config. Two runs of one sweep with the same config are
refused.

``run_sweep(sweep, out)`` writes into ``out``:

    results.jsonl     one JSON object per finished run (config, final metrics, evaluation,
                      seconds per epoch, the command that reproduces it)
    runs/<id>/        each run's folder (config, metrics.jsonl, checkpoints, final.json)

and is resumable: a run with a line in results.jsonl is never retrained; a run killed during
training continues from its last checkpoint (``fit(resume=...)``); a run killed after training
but before its line was written, or whose line holds another evaluation than the sweep's, is
evaluated from its final checkpoint (a new line; the last line of a run counts). A run that
fails does not stop the others: ``run_sweep`` finishes every run it can, then raises
``RunError`` naming the failures. ``jobs`` > 1 runs that many worker processes (each with
``threads = cores // jobs`` unless the config sets threads). ``run_dir`` in a line is relative
to the sweep's folder.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import FolderLock, append_line, write_atomic
from ..training.config import ConfigError, TrainConfig, read_toml
from .evaluation import Evaluation

__all__ = ["Run", "RunError", "Sweep", "SweepError", "finished", "read_results", "run_sweep",
           "train_command"]

# keys that do not change what a run computes (where it writes, how many threads)
_NOT_IDENTITY = ("out", "threads")


class SweepError(ValueError):
    """A bad sweep specification: the message names the key and what was expected."""


class RunError(RuntimeError):
    """Runs of an accepted sweep failed (the others finished and are in results.jsonl)."""


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
            value = ",".join(_number(v) for v in value)
        elif isinstance(value, float):
            value = _number(value)
        parts += [flag, str(value)]
    parts += ["--seed", str(config.get("seed", 0))]  # always shown: a row lists its seeds
    return shlex.join(parts)


def _number(v: float) -> str:
    """The shortest text that reads back as exactly ``v``."""
    short = f"{v:g}"
    return short if float(short) == v else repr(float(v))


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _NOT_IDENTITY}


def same_config(recorded: dict[str, Any], config: TrainConfig) -> bool:
    """Whether a config recorded in results.jsonl is ``config``: every recorded key has its
    value, every key it lacks is at its default."""
    defaults = TrainConfig().to_dict()
    mine = config.to_dict()
    for key, value in _identity(mine).items():
        if recorded.get(key, defaults[key]) != value:
            return False
    return True


@dataclass(frozen=True)
class Run:
    """One training run of a sweep: its label (the variant's and the axis values', without
    the seed), its full config, the evaluation to do after training."""

    label: str
    config: TrainConfig
    evaluation: Evaluation
    seed: int

    @property
    def digest(self) -> str:
        doc = json.dumps(_identity(self.config.to_dict()), sort_keys=True)
        return hashlib.sha1(doc.encode()).hexdigest()[:10]

    @property
    def id(self) -> str:
        """The run's folder name: label, seed and a hash of the config."""
        return f"{_slug(self.label)}-s{self.seed}-{self.digest}"

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
        keys = set(TrainConfig.keys()) - {"out"}  # the sweep places each run's folder
        if (not isinstance(self.name, str) or not self.name.strip()
                or not re.fullmatch(r"[A-Za-z0-9._+=-]+", self.name) or self.name in (".", "..")):
            raise SweepError(f"sweep.name must be a plain file name (letters, digits, . _ + = -), "
                             f"got {self.name!r}")
        for where, d in [("base", self.base)] + [(f"variants[{i}]", v)
                                                for i, v in enumerate(self.variants)]:
            if not isinstance(d, dict):
                raise SweepError(f"{where} must be a table of TrainConfig keys, got "
                                 f"{type(d).__name__}")
            if "out" in d:
                raise SweepError(f"{where}: out is not a sweep key (each run's folder is "
                                 "runs/<id> under the sweep's --out)")
            unknown = sorted(set(d) - keys - ({"label"} if where != "base" else set()))
            if unknown:
                raise SweepError(f"{where}: unknown keys {unknown}; TrainConfig keys: "
                                 f"{sorted(keys)}")
        for key, values in self.axes.items():
            if key == "out":
                raise SweepError("axes: out is not a sweep key (each run's folder is "
                                 "runs/<id> under the sweep's --out)")
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
        runs = self.runs()  # every combination is a valid TrainConfig
        metrics = {self.metric_of(r) for r in runs}
        if len(metrics) > 1:
            raise SweepError(f"the runs of one sweep share one metric, these need "
                             f"{sorted(metrics)}: put classifiers and language models in "
                             "separate sweeps")
        lm = [r for r in runs if r.config.family == "lm"]
        if self.metric == "test_accuracy" and lm or (
                self.metric in ("test_bpc", "test_loss") and len(lm) != len(runs)):
            raise SweepError(f"sweep.metric {self.metric!r} does not fit the families: "
                             "test_accuracy for classifiers, test_bpc or test_loss for lm")

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
        return cls.from_dict(read_toml(p, SweepError, "sweep file"), name=p.stem)

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
                    axes = {k: v for k, v in zip(names, values, strict=True)
                            if len(self.axes[k]) > 1}
                    at = f" at {axes}" if axes else ""
                    raise SweepError(f"{where}{at}: {e}") from None
                shown = [variant["label"]] if variant["label"] else []
                shown += [f"{k}={_show(v)}" for k, v in zip(names, values, strict=True)
                          if k != "seed" and len(self.axes[k]) > 1]
                out.append(Run(" ".join(shown) or "base", cfg, self.evaluation, cfg.seed))
        seen: dict[str, str] = {}
        for r in out:
            if r.digest in seen:
                raise SweepError(f"two runs of the sweep have the same settings "
                                 f"({seen[r.digest]!r} and {r.label!r}, seed {r.seed}): a "
                                 "variant repeats another, or an axis repeats a variant's key "
                                 "with its value")
            seen[r.digest] = r.label
            try:
                self.evaluation.check(r.config)
            except ValueError as e:
                raise SweepError(f"evaluate, run {r.label!r}: {e}") from None
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
    """The results of results.jsonl. A line that is not a run's result (cut short by a kill,
    not JSON, or JSON without id, config and value) is skipped, wherever it is: each line is a
    record of its own, and ``skipped_lines`` names the skipped ones (the command prints them).
    (Not ``files.read_jsonl``, which refuses a corrupt line before the last: results.jsonl
    keeps every other run's result readable.)"""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if _is_result(row):
            rows.append(row)
    return rows


def _is_result(row: Any) -> bool:
    return isinstance(row, dict) and {"id", "config", "value"} <= set(row)


def skipped_lines(path: str | Path) -> list[int]:
    """The numbers (from 1) of the non-empty lines of results.jsonl that ``read_results``
    leaves out (not JSON, or not a run's result)."""
    p = Path(path)
    if not p.exists():
        return []
    bad = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad.append(n)
            continue
        if not _is_result(row):
            bad.append(n)
    return bad


def run_dir_of(out: str | Path, row: dict[str, Any]) -> Path:
    """The run folder of a line: relative to the sweep's folder (older lines: as written)."""
    rd = Path(row["run_dir"])
    inside = Path(out) / rd
    return inside if inside.exists() or not rd.exists() else rd


def _match(rows: list[dict[str, Any]], run: Run) -> dict[str, Any] | None:
    """The last line of ``rows`` that is ``run``'s (module docstring), or None."""
    found = None
    for row in rows:
        if row.get("seed") == run.seed and same_config(row["config"], run.config):
            found = row
    return found


def finished(sweep: Sweep, out: str | Path,
             select: set[str] | None = None) -> list[dict[str, Any]]:
    """The lines of the sweep's finished runs (``select``: of those ids only), in the sweep's
    order, labelled as the sweep labels them now."""
    rows = read_results(Path(out) / "results.jsonl")
    done = []
    for run in sweep.runs():
        if select is not None and run.id not in select:
            continue
        row = _match(rows, run)
        if row is not None:
            done.append({**row, "label": run.label, "id": run.id})
    return done


def execute(run: Run, out: Path, metric: str, run_dir: Path | None = None) -> dict[str, Any]:
    """Train ``run`` into ``out/runs/<id>`` (or ``run_dir``), resuming it if it was cut off,
    and evaluate it: the line results.jsonl gets."""
    from ..training.checkpoints import latest_checkpoint, load_checkpoint
    from ..training.data import load_dataset
    from ..training.families import build_model
    from ..training.loop import fit

    cfg = run.config
    run_dir = run_dir if run_dir is not None else out / "runs" / run.id
    data = load_dataset(cfg.data, cfg.data_dir)
    resumed = False
    if (run_dir / "final.json").exists():  # trained: only its evaluation is missing
        model = build_model(cfg, data)
        load_checkpoint(run_dir, model=model, restore_rng=False)
        metrics = json.loads((run_dir / "final.json").read_text())
    else:
        if latest_checkpoint(run_dir) is not None:
            resumed = True
            result = fit(cfg, data=data, resume=run_dir)
        else:
            if run_dir.exists():  # killed before its first checkpoint: start again
                for name in ("metrics.jsonl", "config.json"):
                    (run_dir / name).unlink(missing_ok=True)
            result = fit(cfg, data=data, out=run_dir)
        model, metrics = result.model, result.metrics
    t0 = time.perf_counter()
    evaluation = run.evaluation.measure(model, data, cfg)
    eval_seconds = time.perf_counter() - t0
    try:
        where = str(run_dir.relative_to(out))
    except ValueError:
        where = str(run_dir)
    return {"id": run.id, "label": run.label, "seed": run.seed, "metric": metric,
            "value": metrics[metric], "metrics": metrics, "evaluation": evaluation,
            "evaluate": run.evaluation.to_dict(), "parameters": metrics["parameters"],
            "seconds_per_epoch": metrics["seconds"] / cfg.epochs, "resumed": resumed,
            "eval_seconds": eval_seconds, "config": run.config.to_dict(),
            "command": run.command, "run_dir": where}


def _die_with_parent() -> None:
    """Worker initializer: on Linux, the worker gets SIGKILL when the sweep's process dies
    (kill -9 of the sweep must not leave workers training in the background)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the sweep's to handle
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: nothing to arrange
        pass


def _worker(args: tuple[Run, str, str, str | None, int | None]) -> dict[str, Any]:
    run, out, metric, run_dir, threads = args
    import torch

    if threads is not None and run.config.threads is None:
        torch.set_num_threads(threads)
    return execute(run, Path(out), metric, Path(run_dir) if run_dir else None)


def _failure(run: Run, e: BaseException) -> str:
    return f"{run.label!r} seed {run.seed}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"


def run_sweep(sweep: Sweep, out: str | Path, *, jobs: int = 1,
              on_event: Callable[[str, Run, dict[str, Any] | None], None] | None = None,
              select: set[str] | None = None) -> list[dict[str, Any]]:
    """Do every run of ``sweep`` (``select``: of those ids only) that has no line of its own in
    ``out/results.jsonl`` (module docstring); returns their lines, in the sweep's order.
    ``on_event(kind, run, row)`` is told "skip", "start", "done" and "failed" (row None).
    Raises ``RunError`` after the others finished when runs failed.

    The sweep's folder is locked for the whole sweep (``files.FolderLock``, held by this
    process; each run's folder is locked by the process that trains it): a second sweep on
    ``out`` is refused with ``files.FolderLockedError`` naming this process."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise SweepError(f"jobs must be an integer >= 1, got {jobs!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with FolderLock(out, what="sweep folder"):
        write_atomic(out / "sweep.json", json.dumps(sweep.to_dict(), indent=2) + "\n")
        results_path = out / "results.jsonl"
        runs = [r for r in sweep.runs() if select is None or r.id in select]
        tell = on_event or (lambda kind, run, row: None)
        todo = _todo(runs, out, read_results(results_path), tell)

        def finish(run: Run, row: dict[str, Any]) -> None:
            append_line(results_path, json.dumps(row))
            tell("done", run, row)

        if jobs == 1 or len(todo) <= 1:
            failures = _run_here(todo, out, sweep, tell, finish)
        else:
            failures = _run_in_pool(todo, out, sweep, jobs, tell, finish)
    if failures:
        raise RunError(f"{len(failures)} of {len(todo)} runs failed (the others are in "
                       f"{str(results_path)!r}): " + "; ".join(failures))
    return finished(sweep, out, {r.id for r in runs})


def _todo(runs: list[Run], out: Path, rows: list[dict[str, Any]],
          tell: Callable[[str, Run, dict[str, Any] | None], None]
          ) -> list[tuple[Run, Path | None]]:
    """The runs to do, each with the folder to evaluate it from (trained with another
    evaluation) or None (new); the runs done already are told "skip"."""
    todo: list[tuple[Run, Path | None]] = []
    for run in runs:
        row = _match(rows, run)
        if row is not None and row.get("evaluate", run.evaluation.to_dict()) == \
                run.evaluation.to_dict():
            tell("skip", run, row)
        else:  # new, or trained with another evaluation: evaluate it from its folder
            folder = run_dir_of(out, row) if row is not None else None
            todo.append((run, folder if folder is not None and folder.exists() else None))
    return todo


def _run_here(todo: list[tuple[Run, Path | None]], out: Path, sweep: Sweep, tell,
              finish: Callable[[Run, dict[str, Any]], None]) -> list[str]:
    """The runs one after the other in this process; returns the failures."""
    failures: list[str] = []
    for run, folder in todo:
        tell("start", run, None)
        try:
            row = execute(run, out, sweep.metric_of(run), folder)
        except Exception as e:  # the others still run; named at the end
            failures.append(_failure(run, e))
            tell("failed", run, None)
            continue
        finish(run, row)
    return failures


def _run_in_pool(todo: list[tuple[Run, Path | None]], out: Path, sweep: Sweep, jobs: int, tell,
                 finish: Callable[[Run, dict[str, Any]], None]) -> list[str]:
    """The runs in ``jobs`` worker processes (threads = cores / workers each); returns the
    failures. Ctrl-C or an error here stops the workers and keeps what is done."""
    import concurrent.futures as cf
    import multiprocessing as mp

    failures: list[str] = []
    workers = min(jobs, len(todo))
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                  initializer=_die_with_parent)
    try:
        futures = {}
        for run, folder in todo:
            tell("start", run, None)
            task = (run, str(out), sweep.metric_of(run), str(folder) if folder else None,
                    threads)
            futures[pool.submit(_worker, task)] = run
        for fut in cf.as_completed(futures):
            run = futures[fut]
            try:
                row = fut.result()
            except Exception as e:
                failures.append(_failure(run, e))
                tell("failed", run, None)
                continue
            finish(run, row)
    except BaseException:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return failures


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
