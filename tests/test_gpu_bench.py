"""benchmarks/gpu_bench.py on this CPU machine: the dry run (every part that can run on the CPU,
the tiny size) writes JSON whose rows are complete and whose ratios are the medians' ratios; a
bad --repeats and a missing CUDA device are one-line refusals with exit code 2; a part that fails
is recorded and the others still run. No timing is asserted (benchmarks never are)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
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


def test_a_failing_part_is_recorded_and_the_rest_run(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_bench_under_test", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

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
