"""`splitformer verify`: the paper's correspondence table, each row measured against the
reference library on random weights, in float64 and float32."""

from __future__ import annotations

import argparse
import json
import os
import textwrap
import warnings

import torch

from ..verification import TOLERANCES, group_names, run_checks
from . import bounded_int, stripped
from .progress import Progress

HELP = "measure the paper's correspondence table against torch.nn (and HF / timm families)"
WIDTH = 100  # every line of the table fits this many columns
# torch crashes (segmentation fault) on absurd thread counts: at most 256, or the number of
# CPUs where that is larger
MAX_THREADS = max(256, os.cpu_count() or 1)
EPILOG: str | None = None  # nothing after the options in --help


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", "--family", dest="group", action="append", choices=group_names(),
                   default=None, type=stripped,
                   help="only these groups of checks, each against one reference library "
                   "(repeatable; --family is the old name); default: all")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--threads", default=None,
                   type=bounded_int(MAX_THREADS, f"(torch threads; this machine has "
                                                 f"{os.cpu_count()} CPUs)"),
                   help=f"torch threads, an integer from 1 to {MAX_THREADS} (256, or the number "
                        "of CPUs where that is larger; default: torch's)")


def _fmt(err: float | None) -> str:
    return "-" if err is None else f"{err:.1e}"


def format_table(rows: list[dict], width: int = WIDTH) -> list[str]:
    """The rows as one block per group of checks: status, the two errors, then the continuous
    model and (under it) the reference network, wrapped so that no line is longer than ``width``."""
    cols = [
        ("status", [r["status"] for r in rows]),
        ("float64", [_fmt(r["errors"].get("float64")) for r in rows]),
        ("float32", [_fmt(r["errors"].get("float32")) for r in rows]),
    ]
    widths = [max(len(head), *(len(v) for v in vals)) for head, vals in cols]
    indent = sum(widths) + 2 * len(widths)
    text_width = max(width - indent, 20)

    def wrap(text: str, first: str = "", later: str = "") -> list[str]:
        return textwrap.wrap(text, text_width, initial_indent=first, subsequent_indent=later,
                             break_on_hyphens=False) or [first]

    lines = [" " * (widths[0] + 2) + "max|diff|",
             "  ".join(h.ljust(w) for (h, _), w in zip(cols, widths, strict=True))
             + "  continuous model (splitformer)",
             " " * indent + "vs network (reference)",
             "  ".join("-" * w for w in [*widths, text_width])]
    group = None
    for i, r in enumerate(rows):
        if r["group"] != group:
            group = r["group"]
            lines += ["", group]
        text = wrap(r["name"])
        if r.get("reference", "-") != "-":
            text += wrap(r["reference"], "vs ", "   ")
        if r.get("reason"):
            text += wrap(r["reason"], "skipped: " if r["status"] == "SKIP" else "reason: ", "   ")
        cells = [vals[i].ljust(w) for (_, vals), w in zip(cols, widths, strict=True)]
        lines.append("  ".join(cells) + "  " + text[0])
        lines += [" " * indent + t for t in text[1:]]
    return lines


def run(args: argparse.Namespace) -> int:
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # main() may run in a longer-lived process (tests)


def _run(args: argparse.Namespace) -> int:
    wanted = list(dict.fromkeys(args.group)) if args.group else None  # repeats once
    progress = Progress(enabled=not args.json)
    with warnings.catch_warnings():
        # the reference libraries warn about their own paths (nested tensors, mask types)
        warnings.simplefilter("ignore")
        rows = list(run_checks(wanted, progress=progress))
    progress.close()
    failed = sum(r["status"] == "FAIL" for r in rows)
    if args.json:
        tol = {str(k).replace("torch.", ""): v for k, v in TOLERANCES.items()}
        print(json.dumps({"tolerances": tol, "rows": rows, "failed": failed}))  # one line
        return 1 if failed else 0
    for line in format_table(rows):
        print(line.rstrip())
    n_pass = sum(r["status"] == "PASS" for r in rows)
    n_skip = sum(r["status"] == "SKIP" for r in rows)
    print(f"\n{n_pass} passed, {failed} failed, {n_skip} skipped "
          f"(tolerance: float64 {TOLERANCES[torch.float64]:g}, "
          f"float32 {TOLERANCES[torch.float32]:g})")
    return 1 if failed else 0
