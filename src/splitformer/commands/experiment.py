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
from . import UsageError, bounded_int
from .train import _FLAGS, tau_list

# keys whose one value is a comma-separated list: several values only by repeating the flag
_LIST_KEYS = ("tau_choices",)

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
    for flag, (key, kind, text) in _FLAGS.items():
        if key == "out":
            continue
        more = ("; one list per flag: repeat the flag for an axis" if key in _LIST_KEYS
                else " (several values, comma-separated or the flag repeated: an axis)")
        p.add_argument(flag, dest=key, action="append", default=None, help=text + more)
        p.set_defaults(**{f"_kind_{key}": kind})
    p.set_defaults(_interrupted="; finished runs are kept in --out (run the same command "
                   "again to continue)")


def _values(key: str, given: list[str], kind: Any, flag: str) -> list[Any]:
    pieces: list[str] = []
    for text in given:
        parts = text.split(",")
        if key == "scheme":
            if all(t.strip() in (*scheme_names(), "network") for t in parts):
                parts = [t.strip() for t in parts]  # names
            else:
                parts = [text]  # a scheme string
        if key in _LIST_KEYS:
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
        for flag, (key, _, _) in _FLAGS.items():
            given = getattr(args, key, None)
            if key == "out" or given is None:
                continue
            values = _values(key, given, getattr(args, f"_kind_{key}"), flag)
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
        given = {k for _, (k, _, _) in _FLAGS.items() if getattr(args, k, None) is not None}
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
    for flag, (key, _, _) in _FLAGS.items():
        if key in given and (f": {key} " in message or message.startswith(f"{key} ")):
            return f"argument {flag}: {message}"
    return message


def _check_out(out: Path) -> None:
    """The results folder exists or can be made, and can be written (before any training)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"argument --out: {str(out)!r} is a file, expected a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"argument --out: cannot write into {str(out)!r} "
                         f"({e.strerror or type(e).__name__})") from None


def _read(path: str) -> dict[str, Any]:
    from ..experiments import SweepError
    from ..training.config import read_toml

    return read_toml(path, SweepError, "sweep file")


def run(args: argparse.Namespace) -> int:
    from ..experiments import RunError, finished, markdown, run_sweep, summarise
    from ..experiments.plots import draw_all
    from ..experiments.sweep import skipped_lines
    from ..training import DATASETS, FAMILIES, DatasetError, load_dataset
    from ..training.families import build_model

    sweep = sweep_of(args)
    out = Path(args.sweep_out) if args.sweep_out else Path("results") / sweep.name
    _check_out(out)
    runs = [r for r in sweep.runs() if not args.only or r.label in args.only]
    for r in runs:  # every model checked before anything trains
        for key, names in (("family", FAMILIES), ("data", DATASETS)):
            if getattr(r.config, key) not in names:
                raise UsageError(f"argument --{key}: expected one of {sorted(names)}, got "
                                 f"{getattr(r.config, key)!r}")
    if not args.table_only:
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
    show = not args.no_progress and not args.json
    total = len(runs)
    count = {"n": 0}
    t_start = time.perf_counter()

    def tell(kind: str, run, row) -> None:
        if not show:
            return
        if kind == "skip":
            count["n"] += 1
            print(f"[{count['n']}/{total}] {run.label} seed {run.seed}: done already",
                  file=sys.stderr)
        elif kind == "done":
            count["n"] += 1
            print(f"[{count['n']}/{total}] {run.label} seed {run.seed}: {row['metric']} "
                  f"{row['value']:.4f} ({row['seconds_per_epoch']:.1f} s/epoch)",
                  file=sys.stderr)
        elif kind == "failed":
            count["n"] += 1
            print(f"[{count['n']}/{total}] {run.label} seed {run.seed}: failed", file=sys.stderr)

    if not args.table_only:
        try:
            run_sweep(sweep, out, jobs=args.jobs, on_event=tell, select={r.id for r in runs})
        except RunError as e:  # runs that failed after the sweep was accepted
            print(f"splitformer experiment: error: {' '.join(str(e).split())[:600]}",
                  file=sys.stderr)
            return 1
    # the table and figures hold every finished run of the sweep (--only trains fewer)
    results = finished(sweep, out)
    bad = skipped_lines(out / "results.jsonl")
    if bad and not args.json:
        print(f"note: {len(bad)} line(s) of {str(out / 'results.jsonl')!r} are not results of "
              f"a run (line {', '.join(str(n) for n in bad[:5])}); left out", file=sys.stderr)
    if not results:
        raise UsageError(f"argument --out: {str(out)!r} holds no finished run of this sweep "
                         "(results.jsonl)")
    rows = summarise(results)
    (out / "table.md").write_text(markdown(rows))
    (out / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    figures = draw_all(results, rows, out, sweep.name)
    if args.json:
        print(json.dumps({"rows": rows, "out": str(out),
                          "figures": [str(p) for p in figures]}))
    else:
        print(markdown(rows, commands=False), end="")
        print(f"\n{len(results)} runs in {str(out)!r} (table.md, table.json, "
              f"{len(figures)} figures); {time.perf_counter() - t_start:.0f} s")
    return 0

