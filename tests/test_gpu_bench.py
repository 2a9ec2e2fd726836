"""benchmarks/gpu_bench.py on this CPU machine: the dry run (every part that can run on the CPU,
the tiny size) writes JSON whose rows are complete and whose ratios are the medians' ratios; a
bad --repeats, a bad --out (a folder, a missing folder, an unwritable one) and a missing CUDA
device are one-line refusals with exit code 2, before any work; Ctrl-C is one line and exit code
130; a failed write of the JSON is one line and exit code 1; a part that fails is recorded and the
others still run. No timing is asserted (benchmarks never are)."""

from __future__ import annotations

import errno
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_bench.py"
TIMED_PARTS = ("fp32", "bf16_autocast", "bf16_cast", "schemes", "compile")


def _env() -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TORCHINDUCTOR_COMPILE_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                      env.get("PYTHONPATH")]))
    return env


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=_env(), cwd=ROOT, timeout=timeout)


def _load():
    spec = importlib.util.spec_from_file_location("gpu_bench_under_test", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _refusal(proc: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refusal with exit code 2 (and no traceback)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_bench")
    out = folder / "bench.json"
    proc = _run("--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), folder, proc


def test_dry_run_writes_every_part(dry_run):
    doc, folder, proc = dry_run
    assert [p.name for p in folder.iterdir()] == ["bench.json"]  # no temporary file left
    assert doc["dry_run"] is True and doc["torch"] and doc["device"].startswith("cpu")
    assert set(doc["sizes"]) == {"tiny"} and doc["repeats"] == 2
    assert doc["parts"] == {"peaks": "ok", "fp32": "ok", "bf16_autocast": "ok",
                            "bf16_cast": "ok", "cuda_graphs": "skipped: needs CUDA",
                            "schemes": "ok", "memory": "ok", "compile": "ok", "flops": "ok"}
    rows = doc["rows"]
    assert not [r for r in rows if r["status"] == "error"]
    parts = {r["part"] for r in rows}
    assert parts == {"peaks", "fp32", "bf16_autocast", "bf16_cast", "cuda_graphs", "schemes",
                     "memory", "compile", "flops"}
    for r in rows:
        if r["part"] in TIMED_PARTS:
            assert r["status"] == "ok", r
            assert all(_positive(r[k]) for k in ("median_s", "min_s", "max_s", "ratio")), r
            assert len(r["times_s"]) == doc["repeats"]
            assert all(_positive(t) for t in r["times_s"])
            assert r["median_s"] == pytest.approx(statistics.median(r["times_s"]))
            assert r["min_s"] <= r["median_s"] <= r["max_s"]
    graphs = [r for r in rows if r["part"] == "cuda_graphs"]
    assert {r["setting"] for r in graphs} == {"fp32", "bf16"}
    assert all(r["status"] == "skipped" and r["reason"] == "skipped: needs CUDA" for r in graphs)
    assert all(_positive(doc["matmul_peak_flops"][k]) for k in ("fp32", "bf16"))
    assert doc["flash"]["tiny"] == {"torch.nn": "ok", "splitformer": "ok"}
    # the tables went to stdout
    assert "torch.nn" in proc.stdout and "splitformer" in proc.stdout


def test_dry_run_has_the_pairs_and_their_ratios(dry_run):
    doc = dry_run[0]
    rows = [r for r in doc["rows"] if r["status"] == "ok" and "ratio" in r]
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault((r["part"], r["size"], r["setting"], r["path"]), {})[r["contender"]] = r
    for part, settings, paths in (("fp32", {"fp32"}, {"train", "no_grad"}),
                                  ("bf16_autocast", {"bf16-autocast"}, {"train", "no_grad"}),
                                  ("bf16_cast", {"bf16"}, {"inference"}),
                                  ("compile", {"fp32"}, {"train", "no_grad"}),
                                  ("memory", {"fp32", "bf16-autocast"}, {"train"})):
        found = {(k[2], k[3]) for k in groups if k[0] == part}
        assert found == {(s, p) for s in settings for p in paths}, part
    for key, group in groups.items():
        if key[0] in ("fp32", "bf16_autocast", "bf16_cast", "memory"):
            assert set(group) == {"torch.nn", "splitformer"}, key
            assert group["splitformer"]["baseline"] == "torch.nn"
        if key[0] == "compile":
            assert set(group) == {"torch.nn", "splitformer", "torch.nn compiled",
                                  "splitformer compiled"}
            assert group["splitformer compiled"]["baseline"] == "torch.nn compiled"
            for name in ("torch.nn", "splitformer"):
                row = group[f"{name} compiled"]
                assert row["speedup_vs_eager"] == pytest.approx(
                    group[name]["median_s"] / row["median_s"])
        if key[0] == "schemes":
            assert set(group) == {"lie", "strang half-ff", "prenorm", "heun"}
            assert group["strang half-ff"]["flops_ratio"] == pytest.approx(1.0)
            assert group["heun"]["flops_ratio"] == pytest.approx(2.0)
            assert group["heun"]["vs_prenorm"] == pytest.approx(
                group["heun"]["median_s"] / group["prenorm"]["median_s"])
        value = "peak_bytes" if key[0] == "memory" else "median_s"
        for name, r in group.items():
            base = group[r["baseline"]]
            assert base["baseline"] == base["contender"] and base["ratio"] == 1.0
            if key[0] == "memory":
                assert r[value] > 0
            assert r["ratio"] == pytest.approx(r[value] / base[value], rel=1e-12), (key, name)


def test_dry_run_flops_rows(dry_run):
    doc = dry_run[0]
    flops = [r for r in doc["rows"] if r["part"] == "flops"]
    assert {r["source"] for r in flops} == {"fp32", "bf16_autocast", "bf16_cast", "compile"}
    for r in flops:
        assert r["forward_flops"] == doc["sizes"][r["size"]]["forward_flops"]
        assert r["flops_per_s"] == pytest.approx(r["forward_flops"] / r["median_s"])
        peak = doc["matmul_peak_flops"][r["peak_dtype"]]
        assert r["fraction"] == pytest.approx(r["flops_per_s"] / peak) and _positive(r["fraction"])


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_repeats_must_be_a_positive_int(value):
    proc = _run("--dry-run", "--repeats", value, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--repeats" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_without_dry_run_and_without_cuda_it_refuses_in_one_line(tmp_path):
    out = tmp_path / "x.json"
    proc = _run("--out", str(out), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["gpu_bench: no CUDA device; use --dry-run"]
    assert not out.exists()


def test_out_a_folder_is_refused(tmp_path):
    for value in (str(tmp_path), str(tmp_path) + os.sep):
        line = _refusal(_run("--dry-run", "--out", value, timeout=60))
        assert line == (f"gpu_bench: argument --out: expected a file name, not a folder, "
                        f"got {value!r}")
    assert list(tmp_path.iterdir()) == []


def test_out_in_a_missing_folder_is_refused_and_not_created(tmp_path):
    missing = tmp_path / "missing" / "deeper"
    line = _refusal(_run("--dry-run", "--out", str(missing / "x.json"), timeout=60))
    assert line == f"gpu_bench: argument --out: folder {str(missing)!r} does not exist"
    assert list(tmp_path.iterdir()) == []  # no folder made


def test_out_in_an_unwritable_folder_is_refused(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes in a read-only folder anyway (/proc is tested instead)")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        line = _refusal(_run("--dry-run", "--out", str(folder / "x.json"), timeout=60))
        assert list(folder.iterdir()) == []  # the probe's temporary file is gone too
    finally:
        folder.chmod(0o700)
    assert line.startswith(f"gpu_bench: argument --out: cannot create a file in folder "
                           f"{str(folder)!r} (")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_out_under_proc_is_refused():
    line = _refusal(_run("--dry-run", "--out", "/proc/x.json", timeout=60))
    assert line.startswith("gpu_bench: argument --out: cannot create a file in folder '/proc' (")


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT,
        # background jobs here start with SIGINT ignored; the child gets the default back
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    # the progress lines ("gpu_bench: [  t s] part ...") come before; the interruption is one line
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("gpu_bench: [")]
    if out.exists():  # a part had finished: the line says where its JSON is, and it is whole
        assert lines == [f"gpu_bench: interrupted (the parts finished so far are in {out})"]
        assert json.loads(out.read_text())["parts"]
    else:
        assert lines == ["gpu_bench: interrupted"]
    assert [p.name for p in tmp_path.iterdir()] in ([], ["g.json"])  # no temporary file left


def test_a_failed_write_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    bench = _load()

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bench, "write_json", full)
    out = tmp_path / "w.json"
    assert bench.main(["--dry-run", "--out", str(out), "--parts", "peaks"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"gpu_bench: cannot write {out}: {os.strerror(errno.ENOSPC)}")
    assert not out.exists()


def test_a_failing_part_is_recorded_and_the_rest_run(tmp_path, monkeypatch):
    bench = _load()

    def broken(self):
        with self.guard("schemes", self.sizes[0]):
            raise RuntimeError("broken on purpose\nsecond line")

    monkeypatch.setattr(bench.Bench, "part_schemes", broken)
    out = tmp_path / "b.json"
    rc = bench.main(["--dry-run", "--out", str(out), "--parts", "peaks,fp32,schemes,flops"])
    assert rc == 1
    doc = json.loads(out.read_text())
    assert doc["parts"]["schemes"] == "error at tiny: RuntimeError: broken on purpose"
    assert doc["parts"]["fp32"] == doc["parts"]["flops"] == "ok"
    assert {r["part"] for r in doc["rows"]} == {"peaks", "fp32", "schemes", "flops"}
    assert [r["error"] for r in doc["rows"] if r["status"] == "error"] == [
        "RuntimeError: broken on purpose"]
