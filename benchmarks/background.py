"""The main of the long benchmarks: ``--background LOG`` relaunches the same command, without
the flag, as a new session writing to LOG, so the sweep survives the shell that started it
(resumable: each benchmark skips what its output folder already holds); ``run_sweep`` runs a
sweep and writes its tables."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from splitformer.files import write_atomic


def without_flag(argv: list[str], flag: str = "--background") -> list[str]:
    """``argv`` less ``flag VALUE`` and ``flag=VALUE``."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            rest.append(a)
    return rest


def relaunch(script: str, log: str, argv: list[str] | None) -> int:
    """Start ``script`` with ``argv`` (default ``sys.argv[1:]``) less ``--background``, detached,
    its output appended to ``log``; print its pid and return 0."""
    rest = without_flag(list(argv if argv is not None else sys.argv[1:]))
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, os.path.abspath(script), *rest],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    print(f"started pid {proc.pid}; output in {log}")
    return 0


def run_sweep(script: str, args: argparse.Namespace, argv: list[str] | None,
              sweep: Callable[[argparse.Namespace], Any],
              tables: Callable[[Any, argparse.Namespace], str]) -> int:
    """The main of a resumable sweep: relaunched with ``--background``, else ``sweep(args)``
    and its tables written to ``args.out``/table.md (atomically) and printed."""
    if args.background is not None:
        return relaunch(script, args.background, argv)
    text = tables(sweep(args), args)
    write_atomic(Path(args.out) / "table.md", text + "\n")
    print(text)
    return 0
