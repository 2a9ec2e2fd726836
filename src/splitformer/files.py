"""Files that are never half-written, and folders that one process writes at a time.

The one room for writing to disk; everything splitformer writes goes through here:

* ``write_atomic(path, data)``: data goes into a temporary file in the same folder, is
  flushed and fsynced, gets the permissions a new file gets here (the umask), and is renamed
  over ``path`` (``os.replace``: a reader sees the old file or the new one, never a part);
  the folder is fsynced so that the rename survives a power cut.
* ``atomic_folder(final)``: a context manager yielding a temporary folder next to ``final``;
  on a clean exit its files are fsynced, it is renamed to ``final`` (an existing ``final`` is
  swapped out and removed), and the parent folder is fsynced; on an error it is removed.
* ``append_line(path, line)``: one line appended and fsynced, after cutting a torn last line
  (a kill or a full disk leaves one) so that the new line starts a line of its own.
* ``read_jsonl(path)``: the JSON objects of a JSON-lines file; a torn last line is dropped
  (and, with ``repair=True``, cut off the file), a corrupt line before it is refused with
  ``CorruptFileError`` naming the file and the line.
* ``FolderLock(folder)``: an exclusive lock (``fcntl.flock`` on ``folder/.lock``, which records
  the holder's process id); a second writer gets ``FolderLockedError`` naming the first's
  process. The lock is released when the holder exits, however it exits (the kernel drops a
  flock with the process), so a stale lock file never blocks a later run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "CorruptFileError",
    "FolderLock",
    "FolderLockedError",
    "append_line",
    "atomic_folder",
    "fsync_dir",
    "read_jsonl",
    "write_atomic",
    "write_synced",
]

LOCK_NAME = ".lock"


class CorruptFileError(ValueError):
    """A file whose content cannot be read back (a corrupt line in the middle of a JSON-lines
    file); the message names the file and the line."""


class FolderLockedError(RuntimeError):
    """Another process holds the folder's lock; the message names that process."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a folder, so that renames and new entries in it are on disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to a new file ``path`` (inside a folder being built) and fsync it."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with open(path, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Replace ``path`` by a file holding ``data`` (str: UTF-8) at once: a temporary file in
    the same folder, fsynced, given the umask's permissions, renamed over ``path``; the folder
    is fsynced. Nothing is left behind on an error. Returns ``path``."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(folder)
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_folder(final: str | os.PathLike) -> Iterator[Path]:
    """Build a folder that appears at ``final`` all at once (module doc). The temporary folder
    is ``.<name>.tmp-<random>`` next to ``final``, made with the usual permissions; its
    parent must exist."""
    final = Path(final)
    parent = final.absolute().parent
    while True:
        tmp = parent / f".{final.name}.tmp-{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
        except FileExistsError:
            continue
        break
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_dir():
                fsync_dir(p)
        fsync_dir(tmp)
        if final.exists():
            old = parent / f".{final.name}.old-{secrets.token_hex(4)}"
            os.rename(final, old)
            os.rename(tmp, final)
            fsync_dir(parent)
            _remove(old)
        else:
            os.rename(tmp, final)
        fsync_dir(parent)
    except BaseException:
        _remove(tmp)
        raise


def _cut_torn_tail(path: Path) -> None:
    """Cut a last line without its newline off ``path`` (left by a kill mid-write)."""
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append ``line`` (no newline in it) and a newline to ``path``, fsynced; a torn last line
    already there is cut first."""
    if "\n" in line:
        raise ValueError("append_line: the line must not contain a newline")
    path = Path(path)
    if path.exists():
        _cut_torn_tail(path)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike, *, repair: bool = False) -> list[Any]:
    """The JSON values of the lines of ``path`` (blank lines skipped). A last line without
    its newline that does not parse is torn (a kill mid-write): dropped, and with
    ``repair=True`` cut off the file. A line that does not parse anywhere else raises
    ``CorruptFileError`` naming the file and the line number."""
    path = Path(path)
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    torn = not raw.endswith(b"\n") and raw != b""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except (ValueError, UnicodeDecodeError):
            if torn and n == len(lines):
                if repair:
                    _cut_torn_tail(path)
                break
            raise CorruptFileError(
                f"{path}: line {n} is not JSON ({line[:60]!r}...); the file is corrupt in the "
                "middle (not a torn last line): move it away or mend that line") from None
    return out


class FolderLock:
    """An exclusive lock on ``folder`` for one writing process (module doc).

    ``with FolderLock(folder, what="run folder"):`` or ``lock.acquire()`` / ``lock.release()``.
    The folder must exist. Refuses with ``FolderLockedError`` at once (never waits)."""

    def __init__(self, folder: str | os.PathLike, what: str = "folder") -> None:
        self.folder = Path(folder)
        self.what = what
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def acquire(self) -> FolderLock:
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise FolderLockedError(
                f"{self.what} {str(self.folder)!r} is in use by another process ({holder}); "
                "wait for it to finish, or give another folder") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
