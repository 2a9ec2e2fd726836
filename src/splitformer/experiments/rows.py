"""The resumable row files of the long experiments (depth_llm, context, passkey): one JSON
object per line, appended as each row is done (a killed run loses at most the row in
progress; rerunning skips the rows already there), and the progress lines they print."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

__all__ = ["append_row", "read_rows", "say"]


def say(text: str) -> None:
    """A progress line on stderr, stamped with the time."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def read_rows(path: Path) -> list[dict]:
    """The rows of ``path`` (none when it does not exist yet)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_row(path: Path, row: dict) -> None:
    """``row`` appended to ``path`` as one line (the folder made when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
