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


def _append_many(path: str, tag: int, n: int, start) -> None:
    start.wait()  # both processes append at the same time
    for i in range(n):
        append_line(path, json.dumps({"tag": tag, "i": i, "pad": "x" * 20000}))


def test_two_processes_appending_to_one_file_never_tear_a_line(tmp_path):
    """Two processes append 150 lines of 20 kB each (more than one write of a pipe's atomic
    size) to one file at once: every line reads whole, none lost; without the hold, a tail
    mended by one process while the other writes would be cut."""
    import multiprocessing

    p = tmp_path / "rows.jsonl"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_append_many, args=(str(p), tag, 150, start))
             for tag in (0, 1)]
    for q in procs:
        q.start()
    for q in procs:
        q.join(120)
    assert [q.exitcode for q in procs] == [0, 0]
    rows = read_jsonl(p)
    assert len(rows) == 300 and p.read_text().count("\n") == 300
    for tag in (0, 1):
        assert [r["i"] for r in rows if r["tag"] == tag] == list(range(150))


def test_append_line_unless_skips_a_row_already_there(tmp_path):
    p = tmp_path / "r.jsonl"
    assert append_line(p, '{"k": 1, "v": 1}', unless=lambda r: r["k"] == 1)
    assert not append_line(p, '{"k": 1, "v": 2}', unless=lambda r: r["k"] == 1)
    assert read_jsonl(p) == [{"k": 1, "v": 1}]


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


def test_a_second_lock_in_the_same_process_is_refused_as_its_own(tmp_path):
    first = FolderLock(tmp_path).acquire()
    with pytest.raises(FolderLockedError, match="in use by this process already"):
        FolderLock(tmp_path).acquire()  # flock alone would grant it: another fd, same process
    first.release()
    with FolderLock(tmp_path):
        pass
    dropped = FolderLock(tmp_path).acquire()
    del dropped  # a lock object dropped without release frees the folder
    with FolderLock(tmp_path):
        pass


def test_a_failed_lock_file_write_keeps_no_lock(tmp_path, monkeypatch):
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(28, "full")))
    with pytest.raises(OSError):
        FolderLock(tmp_path).acquire()
    monkeypatch.setattr(os, "write", real)
    holder = subprocess.run([sys.executable, "-c", _HOLD.replace("time.sleep(60)", ""),
                             str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert holder.returncode == 0 and holder.stdout.strip() == "held", holder.stderr


def test_a_failed_swap_keeps_the_previous_folder(tmp_path, monkeypatch):
    final = tmp_path / "out"
    with atomic_folder(final) as tmp:
        (tmp / "x").write_text("1")
    real = os.rename
    calls = {"n": 0}

    def rename(a, b):
        calls["n"] += 1
        if calls["n"] == 2:  # final -> old went through; tmp -> final fails
            raise OSError(5, "I/O error")
        return real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError), atomic_folder(final) as tmp:
        (tmp / "x").write_text("2")
    monkeypatch.setattr(os, "rename", real)
    assert (final / "x").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_whole_last_line_without_its_newline_is_kept(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}')  # read_jsonl reads it: append_line must not cut it
    assert read_jsonl(p) == [{"a": 1}, {"a": 2}]
    append_line(p, '{"a": 3}')
    assert read_jsonl(p) == [{"a": 1}, {"a": 2}, {"a": 3}]


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_the_same_figure_gives_the_same_file(tmp_path, suffix):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from splitformer.files import save_figure

    def draw(path):
        fig, ax = plt.subplots()
        ax.plot([0, 1, 2], [1, 3, 2], label="u")
        ax.legend()
        save_figure(fig, path, dpi=50)
        plt.close(fig)
        return path.read_bytes()

    assert draw(tmp_path / f"a{suffix}") == draw(tmp_path / f"b{suffix}")


def test_append_line_mends_a_tail_longer_than_one_read(tmp_path):
    """The tail is read backwards in 64 KiB blocks: a torn or unterminated last line longer
    than a block is cut, or kept whole, as a short one."""
    p = tmp_path / "r.jsonl"
    big = json.dumps({"pad": "y" * 150_000})
    p.write_text('{"a": 1}\n' + big + "\n" + big[:100_000])  # torn after 100 kB
    append_line(p, '{"a": 3}')
    assert read_jsonl(p) == [{"a": 1}, json.loads(big), {"a": 3}]
    p.write_text('{"a": 1}\n' + big)  # whole, without its newline
    append_line(p, '{"a": 3}')
    assert read_jsonl(p) == [{"a": 1}, json.loads(big), {"a": 3}]
    p.write_text(big[:70_000])  # one torn line, the whole file
    append_line(p, '{"a": 3}')
    assert p.read_text() == '{"a": 3}\n'
