"""The resumable row files of the long experiments (depth_llm, context, passkey): one JSON
object per line, appended and fsynced as each row is done (``splitformer.files.append_line``:
a killed run loses at most the row in progress, and a line torn by the kill is cut before the
next one is appended; rerunning skips the rows already there), the progress lines they print,
and ``answered``: Ctrl-C and a corrupt row file answered in one line. Several processes may
append to one row file at once (the two-core queues run two, each with its own rows): each
line is written whole under a lock, and a row that another process finished first (the same
key) is not written twice."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..files import CorruptFileError, append_line, read_jsonl

__all__ = ["answered", "append_row", "read_rows", "say"]


def say(text: str) -> None:
    """A progress line on stderr, stamped with the time."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def read_rows(path: Path) -> list[dict]:
    """The rows of ``path`` (none when it does not exist yet); a torn last line (a kill in the
    middle of a write) is not a row, a corrupt line before it is a ``CorruptFileError``."""
    if not path.is_file():
        return []
    return read_jsonl(path)


def append_row(path: Path, row: dict, key: Sequence[str] = ()) -> bool:
    """``row`` appended to ``path`` as one line, fsynced (the folder made when missing), unless
    a row already there has the same values of the fields ``key`` (another process finished
    it first); whether it was appended."""
    path.parent.mkdir(parents=True, exist_ok=True)
    same = (lambda r: isinstance(r, dict) and all(r.get(k) == row.get(k) for k in key)) \
        if key else None
    return append_line(path, json.dumps(row), unless=same)


def answered(prog: str, work: Callable[[], object], kept: Path | None = None) -> None:
    """``work()`` (a phase of an experiment's command), with Ctrl-C one line and exit status
    130 (naming ``kept``, the row file that keeps the rows finished so far, for a phase that
    appends rows) and a corrupt row file one line and exit status 2."""
    try:
        work()
    except KeyboardInterrupt:
        rows = f" (finished rows, if any, are kept in {kept})" if kept is not None else ""
        sys.stderr.write(f"{prog}: interrupted{rows}\n")
        raise SystemExit(130) from None
    except CorruptFileError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        raise SystemExit(2) from None
