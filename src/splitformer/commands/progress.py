"""A minimal progress display on stderr (silent when stderr is not a terminal or under --json)."""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int | None = None, enabled: bool = True) -> None:
        self.total = total
        self.count = 0
        self.enabled = enabled and sys.stderr.isatty()

    def __call__(self, message: str) -> None:
        self.count += 1
        if not self.enabled:
            return
        head = f"[{self.count}/{self.total}]" if self.total else f"[{self.count}]"
        sys.stderr.write(f"\r\033[K{head} {message}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
