"""A minimal progress display on stderr.

On a terminal: one line rewritten in place (``[k/n] phase``) and erased by ``close()``. Off a
terminal (a pipe, a log file, CI) it is silent, unless the command asks for ``lines=True``
(``splitformer analyze`` and ``theory``, whose phases take seconds to minutes): then each phase
is one line ``[k/n] phase`` of its own, flushed at once, so that a log shows where a long run
is. ``enabled=False`` (``--json``, ``--no-progress``) is silent everywhere.
"""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int | None = None, enabled: bool = True,
                 lines: bool = False) -> None:
        self.total = total
        self.count = 0
        self.tty = sys.stderr.isatty()
        self.enabled = enabled and (self.tty or lines)

    def __call__(self, message: str) -> None:
        self.count += 1
        if not self.enabled:
            return
        head = f"[{self.count}/{self.total}]" if self.total else f"[{self.count}]"
        if self.tty:
            sys.stderr.write(f"\r\033[K{head} {message}")
        else:
            sys.stderr.write(f"{head} {message}\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
