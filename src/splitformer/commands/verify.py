"""`splitformer verify`: the paper's correspondence table, each row measured against the
reference library on random weights, in float64 and float32."""

from __future__ import annotations

import argparse
import json
import warnings

import torch

from ..verification import TOLERANCES, families, run_checks
from .progress import Progress

HELP = "measure the paper's correspondence table against torch.nn (and HF / timm families)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", action="append", choices=families(), default=None,
                   help="only these families (repeatable); default: all")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--threads", type=int, default=None, help="torch threads")


def _fmt(err: float | None) -> str:
    return "-" if err is None else f"{err:.1e}"


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    progress = Progress(enabled=not args.json)
    with warnings.catch_warnings():
        # the reference libraries warn about their own paths (nested tensors, mask types)
        warnings.simplefilter("ignore")
        rows = list(run_checks(args.family, progress=progress))
    progress.close()
    failed = sum(r["status"] == "FAIL" for r in rows)
    if args.json:
        tol = {str(k).replace("torch.", ""): v for k, v in TOLERANCES.items()}
        print(json.dumps({"tolerances": tol, "rows": rows, "failed": failed}, indent=2))
        return 1 if failed else 0
    headers = ("family", "continuous model (splitformer)", "network (reference)",
               "max|diff| f64", "max|diff| f32", "")
    table = [headers] + [
        (r["family"], r["name"], r["reference"], _fmt(r["errors"].get("float64")),
         _fmt(r["errors"].get("float32")),
         r["status"] + (f" ({r['reason']})" if r.get("reason") else ""))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers) - 1)]
    for k, row in enumerate(table):
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
        print("  ".join(cells) + "  " + row[-1])
        if k == 0:
            print("  ".join("-" * w for w in widths) + "  ------")
    n_pass = sum(r["status"] == "PASS" for r in rows)
    n_skip = sum(r["status"] == "SKIP" for r in rows)
    print(f"\n{n_pass} passed, {failed} failed, {n_skip} skipped "
          f"(tolerance: float64 {TOLERANCES[torch.float64]:g}, "
          f"float32 {TOLERANCES[torch.float32]:g})")
    return 1 if failed else 0
