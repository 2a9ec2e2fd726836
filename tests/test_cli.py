"""The command line: `splitformer verify` and `python -m splitformer`."""

from __future__ import annotations

import json
import subprocess
import sys

from splitformer.cli import main


def test_verify_json_core_passes(capsys):
    rc = main(["verify", "--family", "core", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["failed"] == 0
    names = " ".join(r["name"] for r in out["rows"])
    for claim in ("Lie step", "N_t = 6", "J = 2", "S1", "S2", "head integral", "literal"):
        assert claim in names
    for r in out["rows"]:
        assert r["status"] == "PASS"
        assert r["errors"]["float64"] <= 1e-10 and r["errors"]["float32"] <= 1e-5


def test_verify_table(capsys):
    assert main(["verify", "--family", "core"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "FAIL" not in out and "passed, 0 failed" in out


def test_python_dash_m_and_help():
    r = subprocess.run([sys.executable, "-m", "splitformer", "--help"], capture_output=True,
                       text=True, check=True)
    assert "verify" in r.stdout
    r = subprocess.run([sys.executable, "-m", "splitformer", "verify", "--help"],
                       capture_output=True, text=True, check=True)
    assert "--json" in r.stdout and "--family" in r.stdout
    r = subprocess.run([sys.executable, "-m", "splitformer", "verify", "--family", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_verify_every_family(capsys):
    rc = main(["verify", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["failed"] == 0
    fams = {r["family"] for r in out["rows"] if r["status"] == "PASS"}
    # timm runs here because the test set-up makes `import timm` work
    assert fams == {"core", "bert", "vit", "cvt", "timm", "gpt2", "transformer"}


def test_convergence_table(capsys):
    assert main(["convergence", "--scheme", "lie", "--ks", "2-3", "--ref-k", "5"]) == 0
    out = capsys.readouterr().out
    assert "observed order" in out and "attention norm1:project ffn norm2:project" in out
