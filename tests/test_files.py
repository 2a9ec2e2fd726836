"""splitformer.files: atomic writes, torn JSON lines, folder locks across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from splitformer.files import (
    CorruptFileError,
    FolderLock,
    FolderLockedError,
    append_line,
    atomic_folder,
    read_jsonl,
    write_atomic,
)


def test_write_atomic_replaces_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "a.json"
    write_atomic(p, "old")
    write_atomic(p, b"new")
    assert p.read_text() == "new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~mask


def test_write_atomic_error_keeps_the_old_file(tmp_path):
    p = tmp_path / "a.json"
    write_atomic(p, "old")
    with pytest.raises(TypeError):
        write_atomic(p, 3)  # type: ignore[arg-type]
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.json"]


def test_atomic_folder_appears_whole_or_not_at_all(tmp_path):
    final = tmp_path / "out"
    with atomic_folder(final) as tmp:
        (tmp / "x").write_text("1")
        assert not final.exists()
    assert (final / "x").read_text() == "1"
    with pytest.raises(RuntimeError), atomic_folder(final) as tmp:
        (tmp / "x").write_text("2")
        raise RuntimeError("cut")
    assert (final / "x").read_text() == "1"
    with atomic_folder(final) as tmp:  # an existing folder is swapped out
        (tmp / "y").write_text("3")
    assert sorted(p.name for p in final.iterdir()) == ["y"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_torn_last_line_is_dropped_and_cut_a_corrupt_middle_refused(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_jsonl(p) == [{"a": 1}, {"a": 2}]
    assert p.read_text().endswith('{"a": ')  # reading alone does not change the file
    assert read_jsonl(p, repair=True) == [{"a": 1}, {"a": 2}]
    assert p.read_text() == '{"a": 1}\n{"a": 2}\n'
    append_line(p, json.dumps({"a": 3}))
    assert read_jsonl(p) == [{"a": 1}, {"a": 2}, {"a": 3}]
    p.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(CorruptFileError, match="line 2"):
        read_jsonl(p)


def test_append_line_cuts_a_torn_tail_first(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": 2')
    append_line(p, '{"a": 3}')
    assert p.read_text() == '{"a": 1}\n{"a": 3}\n'


_HOLD = textwrap.dedent("""
    import sys, time
    from splitformer.files import FolderLock
    lock = FolderLock(sys.argv[1], what="run folder").acquire()
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_second_process_is_refused_naming_the_first(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLockedError, match=f"pid {holder.pid}"):
            FolderLock(tmp_path, what="run folder").acquire()
    finally:
        holder.kill()
        holder.wait()
    with FolderLock(tmp_path) as lock:  # a killed holder leaves no stale lock
        assert lock.held
    assert not lock.held
