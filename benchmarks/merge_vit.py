"""Token merging on a ViT evolution trained on Fashion-MNIST (issue 17, item 3; docs/space.md
"Coarsening in x: token merging").

    python benchmarks/merge_vit.py [--out results/merge_vit] [--seeds 0,1,2] [--threads 1]
        [--background LOG]

For each seed: one ViT trained at patch 4 (49 patch nodes and the class token) without merging
("plain") and one trained with merging on (``TrainConfig.merge = r``: ToMe's rule, keys after
the attention substep, proportional weights) for each r of ``--train-merge``, the same budget
and seed. Every model is then evaluated on the test set with ``with_token_merging(r, metric,
where, proportional)`` for every r of ``--rs`` (r per layer = per unit of time; clipped to half
the mergeable nodes, the class token never merges) and each of the four variants

    "keys +w"  metric="keys",  proportional=True    (ToMe with proportional attention)
    "keys"     metric="keys",  proportional=False   (ToMe's ablation: weight 1 per node)
    "state +w" metric="state", proportional=True    (merge where the state is flat)
    "state"    metric="state", proportional=False

training-free on the plain model, and on the merge-trained model (its own merge replaced: r = 0
is that model with merging off). The throughput is measured once, on the first seed's plain
model: images/s of the forward (eval, no_grad, a batch of ``--time-batch`` test images) at
every (variant, r), all of them interleaved in one process (``bench.timing.measure``: A B C
A B C ..., the median of ``--repeats``), as the ratio to r = 0; the weights do not change the
cost (the number of nodes after each merge depends on r only), so one model stands for all.

Resumable: training runs are run folders (``--out``/runs/<id>, checkpoints every epoch); each
run's accuracy grid and the throughput are written to ``--out``/results.json as each finishes
(atomically); a finished part with the same settings is skipped (an r added to ``--rs``
evaluates only its cells), a killed training resumed from its last checkpoint.
``--background LOG`` starts the same command detached, its output in LOG.
The per-epoch test rows of training use the first ``--monitor-size`` test images only (the
accuracy grid uses ``--test-size``). Prints the tables and writes them to ``--out``/table.md.

Defaults (12800 training examples, 12 epochs of batch 128: 1200 optimiser steps; width 64,
depth 4, 4 heads, patch 4; r = 0, 2, ..., 12, 16, 20, 24; 31 timed repeats): with
``--threads 1`` on this shared 2-core machine a plain run trained in 223-308 s, a merge-8 run
in 171-259 s, an accuracy grid (37 settings on the 10000 test images) took 3-4 min and the
timing 2 min: about 50 min in all (the results in results/merge_vit were made in three
sittings of the same command as the defaults grew; each evaluated only what was new).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from splitformer.bench.timing import Contender, measure
from splitformer.commands import int_list
from splitformer.experiments.sweep import mean_std
from splitformer.files import write_atomic
from splitformer.training import TrainConfig
from splitformer.training.data import Dataset, load_dataset
from splitformer.training.loop import evaluate

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # the sibling script patch_grid.py, run or imported
    sys.path.insert(0, _HERE)
from background import run_sweep  # noqa: E402  (main: --background LOG, table.md)
from patch_grid import subset, trained  # noqa: E402  (the first N examples; train or resume)

# variant -> with_token_merging options (besides r and where)
VARIANTS: dict[str, dict[str, Any]] = {
    "keys +w": {"metric": "keys", "proportional": True},
    "keys": {"metric": "keys", "proportional": False},
    "state +w": {"metric": "state", "proportional": True},
    "state": {"metric": "state", "proportional": False},
}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/merge_vit", help="results folder")
    p.add_argument("--seeds", type=int_list(0), default=(0, 1, 2))
    p.add_argument("--rs", type=int_list(0), default=(0, 2, 4, 6, 8, 10, 12, 16, 20, 24),
                   help="r per layer evaluated (0 is always included)")
    p.add_argument("--train-merge", type=int_list(0), default=(8,),
                   help="r of the models trained with merging on (0: none)")
    p.add_argument("--where", choices=("attention", "step"), default="attention",
                   help="where the evaluated merges run (training: ToMe's, after attention)")
    p.add_argument("--train-size", type=int, default=12800, help="training examples used")
    p.add_argument("--test-size", type=int, default=10000, help="test images evaluated")
    p.add_argument("--monitor-size", type=int, default=1000,
                   help="test images of the per-epoch rows while training")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--time-batch", type=int, default=256, help="images per timed forward")
    p.add_argument("--repeats", type=int, default=31, help="timed repeats (medians)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--background", default=None, metavar="LOG",
                   help="start this command detached, its output in LOG, and return")
    args = p.parse_args(argv)
    for name in ("train_size", "test_size", "monitor_size", "epochs", "batch_size", "time_batch",
                 "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, got "
                    f"{getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup: expected an integer >= 0, got {args.warmup}")
    args.rs = tuple(sorted({0, *args.rs}))
    args.train_merge = tuple(r for r in args.train_merge if r > 0)
    return args


# -- data and runs -----------------------------------------------------------------------------
def run_configs(args: argparse.Namespace) -> dict[str, TrainConfig]:
    """id -> config: "plain-s<seed>" (no merging) and "merge<r>-s<seed>" for each r of
    ``--train-merge`` (the same budget and seed, ``merge=r``)."""
    base = TrainConfig(family="vit", data="fashion-mnist", data_dir=args.data_dir,
                       patch=args.patch, width=args.width, depth=args.depth, heads=args.heads,
                       epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                       dropout=0.0, threads=args.threads, log_every=50)
    out: dict[str, TrainConfig] = {}
    for seed in args.seeds:
        out[f"plain-s{seed}"] = dataclasses.replace(base, seed=seed)
        for r in args.train_merge:
            out[f"merge{r}-s{seed}"] = dataclasses.replace(base, seed=seed, merge=r)
    return out


def merged(model: torch.nn.Module, r: int, variant: str, where: str) -> torch.nn.Module:
    """``model`` (shared parameters) merging r nodes per layer with ``variant``'s options;
    r = 0: the model without merging (any merge it trained with removed)."""
    base = model.with_token_merging(None)
    return base if r == 0 else base.with_token_merging(r, where=where, **VARIANTS[variant])


def accuracy_grid(model: torch.nn.Module, data: Dataset, cfg: TrainConfig,
                  args: argparse.Namespace, rs: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """variant -> r -> test accuracy of ``merged(model, r, variant)`` for r in ``rs`` (r = 0:
    evaluated once, the same model under every variant)."""
    at0 = evaluate(merged(model, 0, "keys +w", args.where), data, cfg)["test_accuracy"] \
        if 0 in rs else None
    return {v: {str(r): at0 if r == 0 else
                evaluate(merged(model, r, v, args.where), data, cfg)["test_accuracy"]
                for r in rs} for v in VARIANTS}


def grid_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What an accuracy grid's cells depend on besides the run's config and r (a change
    reruns the grid; an r not yet evaluated is added to it)."""
    return {"variants": list(VARIANTS), "where": args.where, "test_size": args.test_size}


def _same_grid(row: dict[str, Any], args: argparse.Namespace) -> bool:
    return {k: v for k, v in row["grid"].items() if k != "rs"} == grid_settings(args)


def one_run(run_id: str, cfg: TrainConfig, data: Dataset, args: argparse.Namespace,
            folder: Path, row: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's row: the model trained (or resumed, or loaded), evaluated as trained and at
    every r of ``--rs`` that ``row`` (a finished row of the same run and grid) lacks."""
    t0 = time.perf_counter()
    monitor = subset(data, len(data.train), min(args.monitor_size, len(data.test)))
    model, seconds = trained(cfg, monitor, folder / "runs" / run_id)
    if row is None:
        row = {"config": cfg.to_dict(), "grid": {**grid_settings(args), "rs": []},
               "train_seconds": seconds,
               "as_trained": evaluate(model, data, cfg)["test_accuracy"],
               "accuracy": {v: {} for v in VARIANTS}, "seconds": 0.0}
    missing = tuple(r for r in args.rs if r not in row["grid"]["rs"])
    for v, cells in accuracy_grid(model, data, cfg, args, missing).items():
        row["accuracy"][v].update(cells)
        row["accuracy"][v] = dict(sorted(row["accuracy"][v].items(), key=lambda c: int(c[0])))
    row["grid"]["rs"] = sorted({*row["grid"]["rs"], *args.rs})
    row["seconds"] += time.perf_counter() - t0
    return row


# -- throughput -----------------------------------------------------------------------------------
def timing_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"rs": list(args.rs), "variants": list(VARIANTS), "where": args.where,
            "batch": args.time_batch, "repeats": args.repeats, "warmup": args.warmup,
            "threads": args.threads, "patch": args.patch, "width": args.width,
            "depth": args.depth, "heads": args.heads}


def throughput(model: torch.nn.Module, x: torch.Tensor, args: argparse.Namespace
               ) -> dict[str, Any]:
    """images/s of the forward (eval, no_grad) of ``merged(model, r, variant)`` on the batch
    ``x`` at every (variant, r), the repeats interleaved over all of them (medians), the ratio
    to r = 0, and the node counts after each merge (``merge_trace(...).nodes``)."""
    model = model.eval()
    contenders = [Contender("r=0", merged(model, 0, "keys +w", args.where), (x,))]
    for v in VARIANTS:
        contenders += [Contender(f"{v} r={r}", merged(model, r, v, args.where), (x,))
                       for r in args.rs if r > 0]
    times = measure(contenders, "no_grad", repeats=args.repeats, warmup=args.warmup)
    n0 = int(model.with_token_merging(None).embedding.num_tokens)
    base = times["r=0"]["median_s"]
    rows: dict[str, dict[str, Any]] = {}
    for v in VARIANTS:
        rows[v] = {}
        for r in args.rs:
            name, m = ("r=0", None) if r == 0 else (f"{v} r={r}", merged(model, r, v, args.where))
            if m is None:
                nodes = [n0]
            else:
                with torch.no_grad():
                    nodes = [n0, *m.merge_trace(x[:2]).nodes]
            med = times[name]["median_s"]
            rows[v][str(r)] = {"median_s": med, "images_per_s": len(x) / med,
                               "ratio": base / med, "nodes": nodes,
                               "times_s": times[name]["times_s"]}
    return rows


# -- the sweep ----------------------------------------------------------------------------------
def _say(text: str) -> None:
    print(f"[merge_vit] {text}", file=sys.stderr, flush=True)


def sweep(args: argparse.Namespace, data: Dataset | None = None) -> dict[str, Any]:
    """Every run and the throughput, each skipped when results.json has it with the same
    settings; ``data`` (default: Fashion-MNIST from ``--data-dir``) is cut to the sizes."""
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results.setdefault("runs", {})
    torch.set_num_threads(args.threads)
    if data is None:
        data = load_dataset("fashion-mnist", args.data_dir)
    data = subset(data, args.train_size, args.test_size)
    configs = run_configs(args)
    for run_id, cfg in configs.items():
        done = results["runs"].get(run_id)
        if not (done and done["config"] == cfg.to_dict() and _same_grid(done, args)):
            done = None
        elif set(args.rs) <= set(done["grid"]["rs"]):
            continue
        _say(f"{run_id} ..." if done is None else f"{run_id}: r = "
             f"{','.join(str(r) for r in args.rs if r not in done['grid']['rs'])} ...")
        results["runs"][run_id] = one_run(run_id, cfg, data, args, folder, done)
        write_atomic(path, json.dumps(results, indent=1) + "\n")
        row = results["runs"][run_id]
        _say(f"{run_id}: as trained {row['as_trained']:.4f}, r=0 "
             f"{row['accuracy']['keys +w']['0']:.4f} (train {row['train_seconds']:.0f} s, "
             f"all {row['seconds']:.0f} s)")
    done = results.get("throughput")
    if not done or done["settings"] != timing_settings(args):
        _say("throughput ...")
        first = f"plain-s{args.seeds[0]}"
        model, _ = trained(configs[first], data, folder / "runs" / first)
        x = data.test.x[:args.time_batch]
        if len(x) < args.time_batch:
            x = x.repeat((args.time_batch + len(x) - 1) // len(x), 1, 1, 1)[:args.time_batch]
        t0 = time.perf_counter()
        results["throughput"] = {"settings": timing_settings(args), "model": first,
                                 "rows": throughput(model, x, args),
                                 "seconds": time.perf_counter() - t0}
        write_atomic(path, json.dumps(results, indent=1) + "\n")
    return results


# -- the tables -----------------------------------------------------------------------------------
def _cell(values: list[float], signed: bool = False) -> str:
    """100 x the mean +- the sample std of ``values`` (points); ``signed``: with its sign."""
    if not values:
        return "-"
    m, s = mean_std(values)
    return f"{100 * m:{'+' if signed else ''}.2f} +- {100 * s:.2f}"


def tables(results: dict[str, Any], args: argparse.Namespace) -> str:
    seeds, runs = args.seeds, results["runs"]
    tp = results.get("throughput", {}).get("rows")
    names = ["plain", *(f"merge{r}" for r in args.train_merge)]
    lines = [f"ViT on Fashion-MNIST (patch {args.patch}: 1 + {(28 // args.patch) ** 2} nodes, "
             f"width {args.width}, depth {args.depth}, {args.heads} heads, {args.epochs} epochs "
             f"of {args.train_size} examples), merging where={args.where!r}", ""]
    if tp:
        s = results["throughput"]["settings"]
        lines += [f"throughput: forward (eval, no_grad) of {s['batch']} images, "
                  f"{s['threads']} thread(s), median of {s['repeats']} repeats interleaved over "
                  f"every setting; images/s (ratio to r = 0)", "",
                  "| r per layer | nodes after each merge | " + " | ".join(VARIANTS) + " |",
                  "|---|---|" + "---|" * len(VARIANTS)]
        for r in args.rs:
            row = [tp[v][str(r)] for v in VARIANTS]
            lines.append(f"| {r} | " + " > ".join(map(str, row[0]["nodes"])) + " | "
                         + " | ".join(f"{c['images_per_s']:.0f} ({c['ratio']:.2f}x)"
                                      for c in row) + " |")
        lines.append("")
    def accuracy_table(caption: str, cell) -> list[str]:
        """One row per r: the merge throughput ratio x, then ``cell(name, variant, r)``."""
        out = [caption, "",
               "| r | x | " + " | ".join(f"{n}: {v}" for n in names for v in VARIANTS) + " |",
               "|---|---|" + "---|" * (len(names) * len(VARIANTS))]
        for r in args.rs:
            x = f"{tp['keys +w'][str(r)]['ratio']:.2f}" if tp else "-"
            out.append(f"| {r} | {x} | "
                       + " | ".join(cell(n, v, str(r)) for n in names for v in VARIANTS) + " |")
        return out

    lines += accuracy_table(
        f"test accuracy (%) on {args.test_size} test images, mean +- std over seeds "
        + ",".join(map(str, seeds)) + "; plain: trained without merging; merge<r>: trained with "
        "merge=r (keys +w, after attention); x: the keys +w throughput ratio",
        lambda n, v, r: _cell([runs[f"{n}-s{s}"]["accuracy"][v][r] for s in seeds
                               if f"{n}-s{s}" in runs]))
    lines.append("")
    lines += accuracy_table(
        "the same, as the change against the plain model unmerged (r = 0) of the same seed, in "
        "points (mean +- std over the seeds: the seed-to-seed spread of the accuracy itself "
        "cancels)",
        lambda n, v, r: _cell([runs[f"{n}-s{s}"]["accuracy"][v][r]
                               - runs[f"plain-s{s}"]["accuracy"][v]["0"] for s in seeds
                               if f"{n}-s{s}" in runs and f"plain-s{s}" in runs], signed=True))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_sweep(__file__, arguments(argv), argv, sweep, tables)


if __name__ == "__main__":
    raise SystemExit(main())
