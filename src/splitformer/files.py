"""Files that are never half-written, and folders that one process writes at a time.

The one room for writing to disk; everything splitformer writes goes through here, directly or
into a folder that ``atomic_folder`` builds (an analyze report's figures):

* ``write_atomic(path, data)``: data goes into a temporary file in the same folder, is
  flushed and fsynced, gets the permissions a new file gets here (the umask), and is renamed
  over ``path`` (``os.replace``: a reader sees the old file or the new one, never a part);
  the folder is fsynced so that the rename survives a power cut.
* ``atomic_folder(final)``: a context manager yielding a temporary folder next to ``final``;
  on a clean exit its files are fsynced, it is renamed to ``final`` (an existing ``final`` is
  swapped out and removed), and the parent folder is fsynced; on an error it is removed.
* ``save_figure(fig, path)``: a matplotlib figure through ``write_atomic``, without a date
  and with fixed SVG ids, so that drawing the same figure again gives the same file.
* ``append_line(path, line)``: one line appended to a JSON-lines file and fsynced, after
  cutting a torn last line (a kill or a full disk leaves one; a whole JSON value that only
  lost its newline is kept) so that the new line starts a line of its own; the file is held
  (an exclusive flock, waited for) while it is mended and written, so several processes may
  append to one file, and ``unless`` skips a line whose row is there already.
* ``read_jsonl(path)``: the JSON objects of a JSON-lines file; a torn last line is dropped
  (and, with ``repair=True``, cut off the file), a corrupt line before it is refused with
  ``CorruptFileError`` naming the file and the line.
* ``FolderLock(folder)``: an exclusive lock (``fcntl.flock`` on ``folder/.lock``, which records
  the holder's process id); a second writer gets ``FolderLockedError`` naming the first's
  process (or, in the holding process, says it holds it already). The lock is released when
  the holder exits, however it exits (the kernel drops a flock with the process; the file is
  opened non-inheritable, so a program it starts does not keep it, though a child made by a
  bare ``fork()`` shares it until it exits), so a stale lock file never blocks a later run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "CorruptFileError",
    "FolderLock",
    "FolderLockedError",
    "append_line",
    "atomic_folder",
    "remove_path",
    "save_figure",
    "fsync_dir",
    "read_jsonl",
    "write_atomic",
    "write_synced",
]

LOCK_NAME = ".lock"
_HELD: set[str] = set()  # the folders this process holds (a flock does not refuse its own fd)


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


def save_figure(fig: Any, path: str | os.PathLike, **savefig: Any) -> Path:
    """A matplotlib figure written to ``path`` at once (``write_atomic``), in the format its
    suffix names; ``savefig``: matplotlib's options (dpi, bbox_inches, ...)."""
    import io

    import matplotlib

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or None
    buffer = io.BytesIO()
    if fmt in ("svg", "pdf", "png"):  # no date: the same figure gives the same bytes
        savefig.setdefault("metadata", {"Date": None} if fmt != "png" else {"Software": None})
    with matplotlib.rc_context({"svg.hashsalt": "splitformer"}):  # stable ids in an SVG
        fig.savefig(buffer, format=fmt, **savefig)
    return write_atomic(path, buffer.getvalue())


def remove_path(path: str | os.PathLike) -> None:
    """Remove a file, a link or a folder with everything in it; nothing if it is not there."""
    path = Path(path)
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
            try:
                os.rename(tmp, final)
            except BaseException:
                os.rename(old, final)  # the previous folder back where it was
                raise
            fsync_dir(parent)
            remove_path(old)
        else:
            os.rename(tmp, final)
        fsync_dir(parent)
    except BaseException:
        remove_path(tmp)
        raise


def _parse(data: bytes, path: Path, whole: bool = True) -> tuple[list[Any], bool]:
    """The JSON values of the lines of ``data`` (blank lines skipped; with ``whole=False``
    only the last line is read) and whether the last line is torn (it has no newline and does
    not parse: a kill mid-write). A line that does not parse anywhere else raises
    ``CorruptFileError`` naming ``path`` and the line number."""
    lines = data.split(b"\n")
    if not whole:
        lines = lines[-1:]
    ends = data.endswith(b"\n") or data == b""
    values = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except (ValueError, UnicodeDecodeError):
            if not ends and n == len(lines):
                return values, True
            raise CorruptFileError(
                f"{path}: line {n} is not JSON ({line[:60]!r}...); the file is corrupt in the "
                "middle (not a torn last line): move it away or mend that line") from None
    return values, False


def _tail(f: Any, block: int = 1 << 16) -> tuple[int, bytes]:
    """(where it starts, the bytes) of the shortest suffix of the open file ``f`` that holds
    its last line whole: from the last newline before the last line on, read backwards in
    blocks (a log of millions of lines is not read to append one)."""
    pos = f.seek(0, os.SEEK_END)
    data = b""
    while pos > 0:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        data = f.read(step) + data
        if b"\n" in data[:-1]:
            break
    return pos, data


def _held(path: Path, whole: bool) -> tuple[Any, list[Any]]:
    """``path`` opened to append (made when missing) and held (an exclusive flock, waited
    for; released when the file closes), its torn last line cut, and its values (``_parse``;
    with ``whole=False`` only the last line is read)."""
    f = open(path, "a+b")  # the caller closes it
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        if whole:
            f.seek(0)
            start, data = 0, f.read()
        else:
            start, data = _tail(f)
        values, torn = _parse(data, path, whole)
        if torn:
            f.truncate(start + data.rfind(b"\n") + 1)
            f.flush()
            os.fsync(f.fileno())
        return f, values
    except BaseException:
        f.close()
        raise


def append_line(path: str | os.PathLike, line: str,
                unless: Callable[[Any], bool] | None = None) -> bool:
    """Append ``line`` (no newline in it) and a newline to the JSON-lines file ``path``,
    fsynced; a last line already there without its newline is completed when it is a whole
    JSON value and cut when it is torn. The file is held (``fcntl.flock``, exclusive, waited
    for) from reading its tail to the fsync, so that processes appending to one file at once
    never cut or interleave each other's lines. With ``unless``, the line is not appended when
    a value already in the file satisfies it (checked under the same hold: two processes that
    finish the same row write it once; a line corrupt in the middle is then a
    ``CorruptFileError``). Returns whether the line was appended."""
    if "\n" in line:
        raise ValueError("append_line: the line must not contain a newline")
    f, values = _held(Path(path), whole=unless is not None)
    with f:
        if unless is not None and any(unless(v) for v in values):
            return False
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
        # a whole value that lost its newline stays a line of its own
        prefix = "\n" if size and f.read(1) != b"\n" else ""
        f.write((prefix + line + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    return True


def read_jsonl(path: str | os.PathLike, *, repair: bool = False) -> list[Any]:
    """The JSON values of the lines of ``path`` (blank lines skipped). A last line without
    its newline that does not parse is torn (a kill mid-write): dropped, and with
    ``repair=True`` cut off the file (held as ``append_line`` holds it, so that a line another
    process is writing is not cut). A line that does not parse anywhere else raises
    ``CorruptFileError`` naming the file and the line number."""
    path = Path(path)
    values, torn = _parse(path.read_bytes(), path)
    if torn and repair:
        f, values = _held(path, whole=True)
        f.close()
    return values


class FolderLock:
    """An exclusive lock on ``folder`` for one writing process (module doc).

    ``with FolderLock(folder, what="run folder"):`` or ``lock.acquire()`` / ``lock.release()``.
    The folder must exist. Refuses with ``FolderLockedError`` at once (never waits)."""

    def __init__(self, folder: str | os.PathLike, what: str = "folder") -> None:
        self.folder = Path(folder)
        self.what = what
        self._fd: int | None = None
        self._key = ""

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def acquire(self) -> FolderLock:
        if self._fd is not None:
            return self
        key = os.path.realpath(self.folder)
        if key in _HELD:
            raise FolderLockedError(
                f"{self.what} {str(self.folder)!r} is in use by this process already (pid "
                f"{os.getpid()}): one writer at a time, or give another folder")
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
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}".encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)  # a full disk: no lock is kept
            raise
        self._fd, self._key = fd, key
        _HELD.add(key)
        return self

    def release(self, remove: bool = False) -> None:
        """Drop the lock; ``remove=True`` also deletes the lock file (while still holding it),
        so that a finished folder keeps none and a lock file found later is one a killed
        writer left."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _HELD.discard(self._key)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        if remove:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(fd)  # drops the flock

    def __del__(self) -> None:  # a lock object dropped without release: the lock goes too
        with contextlib.suppress(Exception):
            self.release()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
