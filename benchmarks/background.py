"""``--background LOG`` for the long benchmarks: the same command, without the flag, as a new
session writing to LOG, so the sweep survives the shell that started it (resumable: each
benchmark skips what its output folder already holds)."""

from __future__ import annotations

import os
import subprocess
import sys


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
