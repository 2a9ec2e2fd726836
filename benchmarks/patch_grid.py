"""Refinement in x on Fashion-MNIST (issue 17, item 4; docs/space.md "Refinement in x").

    python benchmarks/patch_grid.py [--out results/patch_grid] [--background LOG]

For each seed: one ViT trained at each patch size alone (``--patch P``, its own kernel and
position table) and one random-patch model (``--patch BASE --patch-choices 4,7,14``: one set
of parameters at the base patch, each optimiser step on ``model.with_patch_size(p)``), every
model then evaluated at every patch size (``with_patch_size``: the kernel PI-resized, the
position table resampled). Prints the accuracy table (mean +- std over the seeds) and the
convergence of the pooled output as the grid refines, for the random-patch and the fixed
base-patch model:

* patch refinement on the 28 x 28 image: p = 14, 7, 4, 2 against p = 1 (h = p / 28);
* image refinement: the image as its bilinear interpolant, sampled at 28 k x 28 k pixels
  (k = 1, 2, 4) at patch 7 (``with_image_size``; h = 7 / (28 k)), against k = 8;

e_h = mean_i |v_h,i - v_ref,i| / mean_i |v_ref,i| of the pooled vector v (the class token
after the final norm, float64), and the observed order: the least-squares slope of log e_h
against log h (and each pair's). Resumable: every run is a run folder (``--out``/runs/<id>)
and its results are written to ``--out``/results.json as each finishes; a finished run is
skipped, a killed one resumed from its last checkpoint. ``--background LOG`` starts the same
command detached, its output in LOG, and returns.

Defaults (``--train-size 12800 --epochs 4 --batch-size 128``: 400 optimiser steps; width 32,
depth 2, 4 heads): a run at patch 4 takes about 2 minutes on one core, at patch 14 about 20 s,
the random-patch one about 1 minute (measured on a shared 2-core machine; see the report).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from splitformer.files import write_atomic
from splitformer.training import TrainConfig
from splitformer.training.checkpoints import latest_checkpoint, load_checkpoint
from splitformer.training.data import Dataset, Split, load_dataset
from splitformer.training.families import build_model
from splitformer.training.loop import evaluate, fit

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # the sibling module background.py, run or imported
    sys.path.insert(0, _HERE)
from background import run_sweep  # noqa: E402  (main: --background LOG, table.md)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/patch_grid", help="results folder")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--patches", default="4,7,14", help="the patch sizes trained and evaluated")
    p.add_argument("--base", type=int, default=7, help="the random-patch model's own patch")
    p.add_argument("--train-size", type=int, default=12800, help="training examples used")
    p.add_argument("--test-size", type=int, default=10000, help="test examples evaluated")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--random-epochs", type=int, default=None,
                   help="the random-patch model's epochs (default --epochs; 3 x --epochs "
                        "gives each patch size the steps its specialist had)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--conv-images", type=int, default=256,
                   help="test images of the convergence study (0: none)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--background", default=None, metavar="LOG",
                   help="start this command detached, its output in LOG, and return")
    return p.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


# -- data and runs -----------------------------------------------------------------------------
def subset(data: Dataset, n_train: int, n_test: int) -> Dataset:
    """The first ``n_train`` training and ``n_test`` test examples (file order)."""
    return dataclasses.replace(data, train=Split(data.train.x[:n_train], data.train.y[:n_train]),
                               test=Split(data.test.x[:n_test], data.test.y[:n_test]))


def run_configs(args: argparse.Namespace) -> dict[str, TrainConfig]:
    """id -> config: "fixed<p>-s<seed>" for each patch, "random-s<seed>" (the choices)."""
    base = TrainConfig(family="vit", data="fashion-mnist", data_dir=args.data_dir,
                       width=args.width, depth=args.depth, heads=args.heads,
                       epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                       dropout=0.0, threads=args.threads, log_every=50)
    out: dict[str, TrainConfig] = {}
    for seed in _ints(args.seeds):
        for p in _ints(args.patches):
            out[f"fixed{p}-s{seed}"] = dataclasses.replace(base, seed=seed, patch=p)
        out[f"random-s{seed}"] = dataclasses.replace(
            base, seed=seed, patch=args.base, patch_choices=tuple(_ints(args.patches)),
            epochs=args.random_epochs or args.epochs)
    return out


def trained(cfg: TrainConfig, data: Dataset, folder: Path) -> tuple[torch.nn.Module, float]:
    """The model of the run in ``folder`` (trained now, resumed, or loaded when finished) and
    its training seconds."""
    if (folder / "final.json").exists():
        model = build_model(cfg, data)
        load_checkpoint(folder, model=model, restore_rng=False)
        return model, json.loads((folder / "final.json").read_text())["seconds"]
    resume = folder if folder.is_dir() and latest_checkpoint(folder) is not None else None
    result = fit(cfg, out=None if resume else folder, resume=resume, data=data)
    return result.model, float(result.metrics["seconds"])


# -- the convergence of the pooled output ---------------------------------------------------------
def pooled(model: torch.nn.Module, x: torch.Tensor, batch: int = 16) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model.forward_head(model.forward_features(x[i:i + batch]),
                                             pre_logits=True) for i in range(0, len(x), batch)])


def order(hs: list[float], errors: list[float]) -> dict[str, Any]:
    """The least-squares slope of log e against log h, and each consecutive pair's."""
    lh, le = [math.log(h) for h in hs], [math.log(max(e, 1e-300)) for e in errors]
    mh, me = sum(lh) / len(lh), sum(le) / len(le)
    den = sum((a - mh) ** 2 for a in lh)
    slope = sum((a - mh) * (b - me) for a, b in zip(lh, le, strict=True)) / den if den else None
    pairs = [(le[i] - le[i + 1]) / (lh[i] - lh[i + 1]) for i in range(len(hs) - 1)]
    return {"order": slope, "pair_orders": pairs}


def convergence(model: torch.nn.Module, x: torch.Tensor, base: int) -> dict[str, Any]:
    """e_h of the pooled output under patch refinement and image refinement (module doc)."""
    m = copy.deepcopy(model).double().eval()
    x = x.double()
    size = x.shape[-1]
    out: dict[str, Any] = {}
    patches = [p for p in (14, 7, 4, 2) if size % p == 0]
    ref = pooled(m.with_patch_size(1), x)
    scale = float(ref.norm(dim=-1).mean())
    errs = [float((pooled(m.with_patch_size(p), x) - ref).norm(dim=-1).mean()) / scale
            for p in patches]
    out["patch"] = {"h": [p / size for p in patches], "errors": errs,
                    **order([p / size for p in patches], errs)}
    ks = (1, 2, 4)

    def at(k: int) -> torch.Tensor:
        big = F.interpolate(x, scale_factor=k, mode="bilinear", align_corners=False)
        return pooled(m.with_patch_size(base).with_image_size(size * k), big)

    ref = at(8)
    scale = float(ref.norm(dim=-1).mean())
    errs = [float((at(k) - ref).norm(dim=-1).mean()) / scale for k in ks]
    hs = [base / (size * k) for k in ks]
    out["image"] = {"h": hs, "errors": errs, **order(hs, errs)}
    return out


# -- the sweep ----------------------------------------------------------------------------------
def one_run(run_id: str, cfg: TrainConfig, data: Dataset, args: argparse.Namespace,
            folder: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    model, seconds = trained(cfg, data, folder / "runs" / run_id)
    row: dict[str, Any] = {"config": cfg.to_dict(), "train_seconds": seconds,
                           "accuracy": {}}
    for p in _ints(args.patches):
        row["accuracy"][str(p)] = evaluate(model.with_patch_size(p), data,
                                           cfg)["test_accuracy"]
    if args.conv_images and (run_id.startswith("random") or run_id.startswith(
            f"fixed{args.base}-")):
        row["convergence"] = convergence(model, data.test.x[:args.conv_images], args.base)
    row["seconds"] = time.perf_counter() - t0
    return row


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    torch.set_num_threads(args.threads)
    data = subset(load_dataset("fashion-mnist", args.data_dir), args.train_size, args.test_size)
    for run_id, cfg in run_configs(args).items():
        if run_id in results and results[run_id]["config"] == cfg.to_dict():
            continue
        print(f"[patch_grid] {run_id} ...", file=sys.stderr, flush=True)
        results[run_id] = one_run(run_id, cfg, data, args, folder)
        write_atomic(path, json.dumps(results, indent=1) + "\n")
        acc = ", ".join(f"p{p} {a:.4f}" for p, a in results[run_id]["accuracy"].items())
        print(f"[patch_grid] {run_id}: {acc} ({results[run_id]['seconds']:.0f} s)",
              file=sys.stderr, flush=True)
    return results


# -- the tables -----------------------------------------------------------------------------------
def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 \
        else 0.0
    return f"{100 * m:.2f} +- {100 * s:.2f}"


def tables(results: dict[str, Any], args: argparse.Namespace) -> str:
    patches, seeds = _ints(args.patches), _ints(args.seeds)
    models = [f"fixed{p}" for p in patches] + ["random"]
    lines = ["test accuracy (%), mean +- std over seeds " + ",".join(map(str, seeds)), "",
             "| trained | " + " | ".join(f"eval p={p}" for p in patches) + " |",
             "|---|" + "---|" * len(patches)]
    for name in models:
        label = (f"patch {name[5:]} alone" if name.startswith("fixed")
                 else f"random {{{args.patches}}} (base {args.base})")
        cells = [_mean_std([results[f"{name}-s{s}"]["accuracy"][str(p)] for s in seeds
                            if f"{name}-s{s}" in results]) for p in patches]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    gaps = [_mean_std([results[f"random-s{s}"]["accuracy"][str(p)]
                       - results[f"fixed{p}-s{s}"]["accuracy"][str(p)] for s in seeds
                       if f"random-s{s}" in results and f"fixed{p}-s{s}" in results])
            for p in patches]
    lines.append("| random - alone, same size | " + " | ".join(gaps) + " |")
    lines += ["", "convergence of the pooled output, e_h = mean|v_h - v_ref| / mean|v_ref|",
              "", "| model | refinement | h | e_h (mean over seeds) | observed order |",
              "|---|---|---|---|---|"]
    for name in ("random", f"fixed{args.base}"):
        for kind in ("patch", "image"):
            rows = [results[f"{name}-s{s}"]["convergence"][kind] for s in seeds
                    if "convergence" in results.get(f"{name}-s{s}", {})]
            if not rows:
                continue
            hs = rows[0]["h"]
            errs = [sum(r["errors"][i] for r in rows) / len(rows) for i in range(len(hs))]
            orders = [r["order"] for r in rows]
            lines.append(f"| {name} | {kind} | " + ", ".join(f"{h:.3g}" for h in hs) + " | "
                         + ", ".join(f"{e:.3g}" for e in errs) + " | "
                         + ", ".join(f"{o:.2f}" for o in orders) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_sweep(__file__, arguments(argv), argv, sweep, tables)


if __name__ == "__main__":
    raise SystemExit(main())
