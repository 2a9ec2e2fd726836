"""`splitformer experiment`: a resumable sweep of training runs, its table and figures
(docs/results.md).

The sweep comes from a TOML file (``experiments.Sweep``: [base], [axes], [[variants]],
[evaluate]) and/or flags: every flag of ``splitformer train`` is accepted and takes one value or
several (comma-separated, or the flag repeated); a flag with several values is an axis of the
sweep, one value sets it for every run (overriding the file, variants included). ``--scheme``
splits on commas only when every piece is a scheme name (a scheme string may hold commas);
``--tau-choices`` never does (its one value is a list): repeat it for an axis.

Writes into ``--out`` (default ``results/<name>``): results.jsonl (one line per finished run),
runs/<id>/ (each run's folder), table.md, table.json and the figures (PNG and SVG). A finished
run is never redone; a killed sweep continues where it stopped when the same command is run
again. Prints the Markdown table (``--json``: the table's rows as JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..time.schemes import scheme_names
from ..training import FAMILIES
from ..training.config import Setting, settings, tau_list
from . import UsageError, bounded_int, check_out
from .train import flag_of

HELP = "run a resumable sweep of training runs (scheme x kernel x tau x ...) into a table"
EPILOG = ("exit status: 0 done; 1 a run failed after the sweep was accepted (the finished "
          "runs are kept); 2 a bad input")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep", nargs="?", default=None, metavar="SWEEP.toml",
                   help="a sweep file ([base], [axes], [[variants]], [evaluate])")
    p.add_argument("--name", default=None, help="the sweep's name (default: the file's stem, "
                   "or 'sweep')")
    p.add_argument("--out", dest="sweep_out", default=None, metavar="DIR",
                   help="folder of the results (default: results/<name>)")
    p.add_argument("--jobs", type=bounded_int(256, "(worker processes)"), default=1,
                   help="runs at once, each in its own process (threads = cores / jobs)")
    p.add_argument("--only", action="append", default=None, metavar="LABEL",
                   help="run (and tabulate) only the rows with this label; repeatable")
    p.add_argument("--eval-tau", default=None, metavar="TAUS",
                   help="after training, the test metric at each tau (comma-separated)")
    p.add_argument("--eval-order", action="store_true",
                   help="after training, the observed order of u(T) in tau")
    p.add_argument("--eval-kinetic", action="store_true",
                   help="after training, the kinetic energy of the path on test inputs")
    p.add_argument("--eval-adaptive", default=None, metavar="TOLS",
                   help="after training, adaptive depth at each tolerance (comma-separated)")
    p.add_argument("--table-only", action="store_true",
                   help="train nothing: tabulate and draw the finished runs in --out")
    p.add_argument("--json", action="store_true", help="print the table's rows as JSON")
    p.add_argument("--no-progress", action="store_true", help="no line per run on stderr")
    for key, s in _sweep_settings().items():
        more = ("; one list per flag: repeat the flag for an axis" if s.is_list
                else " (several values, comma-separated or the flag repeated: an axis)")
        p.add_argument(s.flag, dest=key, action="append", default=None,
                       help=s.text(families=FAMILIES) + more)
    p.set_defaults(_interrupted="; finished runs are kept in --out (run the same command "
                   "again to continue)")


def _sweep_settings() -> dict[str, Setting]:
    """The TrainConfig keys a sweep takes from flags: all but ``out`` (the sweep places each
    run's folder; ``--out`` is the sweep's)."""
    return {k: s for k, s in settings().items() if k != "out"}


def _values(key: str, given: list[str], s: Setting) -> list[Any]:
    kind, flag = s.parse, s.flag
    pieces: list[str] = []
    for text in given:
        parts = text.split(",")
        if key == "scheme":
            if all(t.strip() in (*scheme_names(), "network") for t in parts):
                parts = [t.strip() for t in parts]  # names
            else:
                parts = [text]  # a scheme string
        if s.is_list:
            parts = [text]  # the value is itself a comma-separated list
        pieces += parts
    values: list[Any] = []
    for text in pieces:
        if not text.strip():
            raise UsageError(f"argument {flag}: an empty value in {','.join(given)!r}")
        try:
            value = kind(text.strip()) if kind is not str else text
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise UsageError(f"argument {flag}: {e}") from None
        values.append(list(value) if isinstance(value, tuple) else value)
    if len({json.dumps(v) for v in values}) != len(values):
        raise UsageError(f"argument {flag}: a value is given twice in {','.join(given)!r}")
    return values


def _numbers(text: str, flag: str) -> list[float]:
    """Comma-separated numbers ("1,0.5" or "1,1/2"), as --tau-choices reads them."""
    try:
        return list(tau_list(text))
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"argument {flag}: {e}") from None


def sweep_of(args: argparse.Namespace):
    """The sweep of the file and the flags (module docstring)."""
    from ..experiments import Evaluation, Sweep, SweepError

    try:
        if args.sweep is not None:
            doc = _read(args.sweep)
            name = Path(args.sweep).stem
        else:
            doc, name = {}, "sweep"
        doc.setdefault("axes", {})
        for key, s in _sweep_settings().items():
            given = getattr(args, key, None)
            if given is None:
                continue
            values = _values(key, given, s)
            doc["axes"][key] = values
            doc.get("base", {}).pop(key, None)
        evaluate = dict(doc.get("evaluate", {}))
        if args.eval_tau is not None:
            evaluate["taus"] = _numbers(args.eval_tau, "--eval-tau")
        if args.eval_adaptive is not None:
            evaluate["adaptive"] = _numbers(args.eval_adaptive, "--eval-adaptive")
        if args.eval_order:
            evaluate["order"] = True
        if args.eval_kinetic:
            evaluate["kinetic"] = True
        try:
            Evaluation.from_dict(evaluate)
        except (TypeError, ValueError) as e:
            key = str(e).split()[0]
            flag = {"taus": ("--eval-tau", args.eval_tau),
                    "adaptive": ("--eval-adaptive", args.eval_adaptive)}.get(key)
            if flag is not None and flag[1] is not None:
                raise UsageError(f"argument {flag[0]}: {e}") from None
            raise UsageError(f"[evaluate] of the sweep file: {e}") from None
        doc["evaluate"] = evaluate
        if args.name is not None:
            doc.setdefault("sweep", {})["name"] = args.name
        sweep = Sweep.from_dict(doc, name=name)
    except SweepError as e:
        given = {k for k in _sweep_settings() if getattr(args, k, None) is not None}
        raise UsageError(_flag_of(str(e), given)) from None
    if args.only:
        labels = [r.label for r in sweep.runs()]
        missing = [x for x in args.only if x not in labels]
        if missing:
            raise UsageError(f"argument --only: no row is labelled {missing[0]!r}; labels: "
                             f"{sorted(set(labels))}")
    return sweep


def _flag_of(message: str, given: set[str]) -> str:
    """Name the flag of a config key in a sweep error (``...: lr must be ...``) when that key
    came from a flag (``given``); an error of the file's keys keeps the file's words."""
    flag = flag_of(message, given)
    if flag is None:
        table = settings()
        key = next((k for k in given if f": {k} " in message), None)
        flag = table[key].flag if key is not None else None
    return f"argument {flag}: {message}" if flag else message


def _make_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"argument --out: cannot write into {str(out)!r} "
                         f"({e.strerror or type(e).__name__})") from None


def _read(path: str) -> dict[str, Any]:
    from ..experiments import SweepError
    from ..training.config import read_toml

    return read_toml(path, SweepError, "sweep file")


def run(args: argparse.Namespace) -> int:
    from ..experiments import RunError, run_sweep
    from ..files import CorruptFileError, FolderLockedError

    _need_matplotlib()
    sweep = sweep_of(args)
    out = Path(args.sweep_out) if args.sweep_out else Path("results") / sweep.name
    check_out(str(out))
    runs = [r for r in sweep.runs() if not args.only or r.label in args.only]
    _check_runs(runs, build=not args.table_only)
    t_start = time.perf_counter()
    if not args.table_only:
        _make_out(out)
        tell = _Progress(len(runs), show=not args.no_progress and not args.json)
        try:
            run_sweep(sweep, out, jobs=args.jobs, on_event=tell, select={r.id for r in runs})
        except (FolderLockedError, CorruptFileError) as e:  # another sweep; a corrupt file
            raise UsageError(f"argument --out: {' '.join(str(e).split())}") from None
        except RunError as e:  # runs that failed after the sweep was accepted
            print(f"splitformer experiment: error: {' '.join(str(e).split())[:600]}",
                  file=sys.stderr)
            return 1
    return _tabulate(sweep, out, args, t_start)


def _need_matplotlib() -> None:
    """The figures need matplotlib (a dependency of the package): refused in one line before
    any training when it cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("splitformer experiment draws its figures with matplotlib, which "
                         "cannot be imported here; install it (pip install matplotlib, or "
                         "reinstall splitformer with its dependencies)") from None


def _check_runs(runs: list, build: bool) -> None:
    """Every run's family and data set are known and (``build``) every model builds, before
    anything trains (one model per config up to the seed)."""
    from ..training import DATASETS, FAMILIES, DatasetError, load_dataset
    from ..training.families import build_model

    for r in runs:
        for key, names in (("family", FAMILIES), ("data", DATASETS)):
            if getattr(r.config, key) not in names:
                raise UsageError(f"argument --{key}: expected one of {sorted(names)}, got "
                                 f"{getattr(r.config, key)!r}")
    if not build:
        return
    checked: set[str] = set()
    for r in runs:
        key = json.dumps({k: v for k, v in r.config.to_dict().items() if k != "seed"},
                         sort_keys=True)
        if key in checked:
            continue
        checked.add(key)
        try:
            build_model(r.config, load_dataset(r.config.data, r.config.data_dir))
        except DatasetError as e:
            raise UsageError(f"argument --data: {e}") from None
        except ValueError as e:  # a scheme or kernel the family refuses; a bad size
            raise UsageError(f"{r.label}: {str(e).splitlines()[0]}") from None


class _Progress:
    """``run_sweep``'s ``on_event``: a line on stderr per finished, skipped or failed run."""

    def __init__(self, total: int, show: bool) -> None:
        self.total, self.show, self.count = total, show, 0

    def __call__(self, kind: str, run, row) -> None:
        if not self.show or kind == "start":
            return
        self.count += 1
        what = {"skip": "done already", "failed": "failed"}.get(kind)
        if what is None:  # done
            what = (f"{row['metric']} {row['value']:.4f} ({row['seconds_per_epoch']:.1f} "
                    "s/epoch)")
        print(f"[{self.count}/{self.total}] {run.label} seed {run.seed}: {what}",
              file=sys.stderr)


def _tabulate(sweep, out: Path, args: argparse.Namespace, t_start: float) -> int:
    """The table (table.md, table.json) and figures of every finished run of the sweep in
    ``out`` (--only trains fewer), printed."""
    from ..experiments import finished, markdown, summarise
    from ..experiments.plots import draw_all
    from ..experiments.sweep import skipped_lines
    from ..files import write_atomic

    results = finished(sweep, out)
    bad = skipped_lines(out / "results.jsonl")
    if bad and not args.json:
        print(f"note: {len(bad)} line(s) of {str(out / 'results.jsonl')!r} are not results of "
              f"a run (line {', '.join(str(n) for n in bad[:5])}); left out", file=sys.stderr)
    if not results:
        raise UsageError(f"argument --out: {str(out)!r} holds no finished run of this sweep "
                         "(results.jsonl)")
    rows = summarise(results)
    write_atomic(out / "table.md", markdown(rows))
    write_atomic(out / "table.json", json.dumps(rows, indent=2) + "\n")
    figures = draw_all(results, rows, out, sweep.name)
    if args.json:
        print(json.dumps({"rows": rows, "out": str(out),
                          "figures": [str(p) for p in figures]}))
    else:
        print(markdown(rows, commands=False), end="")
        print(f"\n{len(results)} runs in {str(out)!r} (table.md, table.json, "
              f"{len(figures)} figures); {time.perf_counter() - t_start:.0f} s")
    return 0
