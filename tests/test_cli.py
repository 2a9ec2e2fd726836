"""The command line: `splitformer verify`, `splitformer convergence` and `python -m splitformer`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

import splitformer
from splitformer.analysis.convergence import CONFIGURATIONS, REFERENCES
from splitformer.cli import build_parser, main
from splitformer.commands import convergence as conv_cmd
from splitformer.commands import verify as verify_cmd
from splitformer.operators.kernels import KERNELS
from splitformer.time.integrators import INTEGRATORS
from splitformer.time.schemes import FORMS, scheme_names, strang, unsplit
from splitformer.verification import families


@pytest.fixture(scope="module")
def verify_rows() -> list[dict]:
    """`splitformer verify --json`, every family, run once for the tests that read its rows."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["verify", "--json"])
    out = json.loads(buf.getvalue())
    assert rc == 0 and out["failed"] == 0
    return out["rows"]


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


def test_verify_every_family(verify_rows):
    fams = {r["family"] for r in verify_rows if r["status"] == "PASS"}
    # timm runs here because the test set-up makes `import timm` work
    assert fams == {"core", "bert", "vit", "cvt", "timm", "gpt2", "transformer"}


def test_convergence_table(capsys):
    assert main(["convergence", "--scheme", "lie", "--ks", "2-3", "--ref-k", "5"]) == 0
    out = capsys.readouterr().out
    assert "observed order" in out and "attention norm1:project ffn norm2:project" in out


# -- usage errors: one line on stderr, exit status 2, before any computation ------------------

def _usage_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect a usage error: exit status 2 and exactly one line on stderr, which
    is returned."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def no_computation(monkeypatch):
    """Any usage error must be found before the model is built or the study runs."""

    def fail(*args, **kwargs):
        raise AssertionError("computation started before the inputs were checked")

    monkeypatch.setattr(conv_cmd, "convergence", fail)
    monkeypatch.setattr(conv_cmd, "configuration", fail)
    monkeypatch.setattr(verify_cmd, "run_checks", fail)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    files = {"encoder": d / "encoder.pt", "state_dict": d / "state_dict.pt",
             "linear": d / "linear.pt", "text": d / "notes.txt", "empty": d / "empty.pt",
             "splitformer": d / "splitformer.pt"}
    torch.save(enc, files["encoder"])
    torch.save(enc.state_dict(), files["state_dict"])
    torch.save(nn.Linear(3, 3), files["linear"])
    files["text"].write_text("not a pickle\n")
    files["empty"].write_bytes(b"")
    torch.save(splitformer.from_torch(enc), files["splitformer"])
    return {k: str(v) for k, v in files.items()}


@pytest.mark.parametrize("argv,flag,needle", [
    (["--ks", "1,1,1"], "--ks", "increase without repeats"),
    (["--ks", "3,2"], "--ks", "increase without repeats"),
    (["--ks", "2,3,3"], "--ks", "increase without repeats"),
    (["--ks", "3-1"], "--ks", "must go up"),
    (["--ks", "2-2"], "--ks", "must go up"),
    (["--ks", "1.5,2"], "--ks", "integers k >= 0"),
    (["--ks", "a"], "--ks", "integers k >= 0"),
    (["--ks=-1,2"], "--ks", "integers k >= 0"),
    (["--ks", ""], "--ks", "integers k >= 0"),
    (["--ks", "4"], "--ks", "at least two"),
    (["--ks", "1-12"], "--ks", "below --ref-k 10"),
    (["--ks", "2,5", "--ref-k", "5"], "--ks", "below --ref-k 5"),
    (["--ref-k", "0"], "--ref-k", "positive integer"),
    (["--ref-k", "-3"], "--ref-k", "positive integer"),
    (["--scheme", "nope"], "--scheme", "unknown scheme 'nope'"),
    (["--scheme", "attention:bogus"], "--scheme", "bogus"),
    (["--scheme", "foo bar"], "--scheme", "['foo', 'bar']"),
    (["--scheme", "paper"], "--scheme", "no limit as tau -> 0"),
    (["--scheme", "attention norm1:project ffn norm2:project", "--integrator", "heun"],
     "--integrator", "named schemes"),
    (["--scheme", "attention norm1:project ffn norm2:project", "--substep-form", "tangent"],
     "--substep-form", "named schemes"),
    (["--scheme", "prenorm", "--substep-form", "tangent"], "--substep-form", "form must be"),
    (["--integrator", "rk9"], "--integrator", "invalid choice"),
    (["--model", "nonesuch"], "--model", "smooth, relu"),
    (["--controls", "cubic"], "--controls", "invalid choice"),
    (["--reference", "nope"], "--reference", "invalid choice"),
    (["--seed", "x"], "--seed", "invalid int"),
    (["--plot", "missing-folder/c.png"], "--plot", "'missing-folder' of"),
    (["--plot", "c.txt"], "--plot", "'.txt'"),
    (["--plot", "c"], "--plot", "no extension"),
])
def test_convergence_usage_errors(capsys, no_computation, argv, flag, needle):
    line = _usage_error(capsys, ["convergence", *argv])
    assert line.startswith(f"splitformer convergence: error: argument {flag}: "), line
    assert needle in line, line


def test_unknown_scheme_names_every_scheme(capsys, no_computation):
    line = _usage_error(capsys, ["convergence", "--scheme", "nope"])
    assert "unknown scheme 'nope'" in line and "named schemes only" not in line
    assert ", ".join(scheme_names()) in line


@pytest.mark.parametrize("kind,needle", [
    ("state_dict", "state dict"),
    ("linear", "torch.nn.modules.linear.Linear"),
    ("text", "cannot read"),
    ("empty", "cannot read"),
])
def test_convergence_bad_model_files(capsys, no_computation, model_files, kind, needle):
    line = _usage_error(capsys, ["convergence", "--model", model_files[kind]])
    assert line.startswith("splitformer convergence: error: argument --model: "), line
    assert needle in line and "nn.TransformerEncoder" in line, line


def test_plot_folder_is_checked_before_the_run(capsys, no_computation, tmp_path):
    line = _usage_error(capsys, ["convergence", "--plot", str(tmp_path / "nope" / "c.png")])
    assert "argument --plot" in line and "does not exist" in line


@pytest.mark.parametrize("value", ["-1", "0", "two"])
def test_verify_threads_must_be_positive(capsys, no_computation, value):
    line = _usage_error(capsys, ["verify", "--threads", value])
    assert line.startswith("splitformer verify: error: argument --threads: "), line
    assert "positive integer" in line


def test_argparse_errors_are_one_line_too(capsys):
    line = _usage_error(capsys, ["verify", "--family", "nope"])
    assert "argument --family: invalid choice: 'nope'" in line
    line = _usage_error(capsys, ["nonesuch"])
    assert line.startswith("splitformer: error: ")


# -- schemes, defaults, model files ---------------------------------------------------------

def _convergence_json(capsys, *argv: str) -> dict:
    assert main(["convergence", "--ks", "2-3", "--ref-k", "5", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_convergence_takes_a_scheme_string(capsys):
    """The string form of the post-LN Lie scheme gives the named scheme's numbers."""
    named = _convergence_json(capsys, "--scheme", "lie")
    text = _convergence_json(capsys, "--scheme", "attention norm1:project ffn norm2:project")
    assert text["scheme_text"] == named["scheme_text"]
    assert text["errors"] == named["errors"] and text["reference"] == named["reference"]
    tangent = _convergence_json(capsys, "--scheme",
                                "ffn:heun*0.5~norm2 norm2:project attention:heun~norm1 "
                                "norm1:project ffn:heun*0.5~norm2 norm2:project")
    strang = _convergence_json(capsys, "--scheme", "strang", "--substep-form", "tangent")
    assert tangent["errors"] == strang["errors"]


def test_convergence_integrator_defaults_to_the_schemes_own(capsys):
    """No --integrator / --substep-form: the scheme's own defaults, as in the Python API."""
    default = _convergence_json(capsys, "--scheme", "strang")
    heun = _convergence_json(capsys, "--scheme", "strang", "--integrator", "heun")
    assert default["integrator"] == strang().meta["integrator"] == "heun"
    assert default["errors"] == heun["errors"]
    unsplit_default = _convergence_json(capsys, "--scheme", "unsplit")
    own = unsplit()
    assert (unsplit_default["integrator"], unsplit_default["form"]) == (
        own.meta["integrator"], own.meta["form"])
    lie_default = _convergence_json(capsys, "--scheme", "lie")
    euler = _convergence_json(capsys, "--scheme", "lie", "--integrator", "euler",
                              "--substep-form", "raw")
    assert lie_default["errors"] == euler["errors"]
    p = subprocess.run([sys.executable, "-m", "splitformer", "convergence", "--help"],
                       capture_output=True, text=True, check=True)
    assert "the scheme's own (strang: heun" in " ".join(p.stdout.split())


@pytest.mark.parametrize("kind", ["encoder", "splitformer"])
def test_convergence_model_file(capsys, model_files, kind):
    out = _convergence_json(capsys, "--model", model_files[kind])
    assert len(out["errors"]) == 2 and out["errors"][0] > out["errors"][1] > 0


# -- registries -----------------------------------------------------------------------------

def _subparser(name: str) -> argparse.ArgumentParser:
    action = next(a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _choices(parser: argparse.ArgumentParser, flag: str):
    return next(a for a in parser._actions if flag in a.option_strings).choices


def test_choices_come_from_the_registries():
    conv = _subparser("convergence")
    assert list(_choices(conv, "--integrator")) == list(INTEGRATORS)
    assert list(_choices(conv, "--substep-form")) == list(FORMS)
    assert list(_choices(conv, "--reference")) == list(REFERENCES)
    help_text = " ".join(conv.format_help().split())
    assert f"a named scheme ({', '.join(scheme_names())})" in help_text
    assert f"a configuration ({', '.join(CONFIGURATIONS)})" in help_text
    assert list(_choices(_subparser("verify"), "--family")) == families()
    for parser in (conv, _subparser("verify")):  # no kernel choice today; if one comes, it reads
        for action in parser._actions:           # the registry
            if "kernel" in action.dest:
                assert list(action.choices) == [*KERNELS, "alibi", "rotary"]


# -- verify: every row within 100 columns ---------------------------------------------------

def test_verify_table_fits_100_columns(capsys, monkeypatch, verify_rows):
    """Every row of `splitformer verify` (all families, as measured), and SKIP / FAIL rows with
    long reasons, print within 100 columns, and nothing is cut."""
    extra = [
        {"family": "timm", "name": "pre-LN ViT (class token, token pooling) = prenorm scheme",
         "reference": "timm VisionTransformer model(x), forward_features(x)", "status": "SKIP",
         "reason": "timm cannot be imported (ModuleNotFoundError: No module named "
                   "'torchvision') " * 2, "errors": {}},
        {"family": "nonesuch", "name": "nonesuch", "reference": "-", "status": "SKIP",
         "reason": "not available in this version", "errors": {}},
        {"family": "core", "name": "x" * 150, "reference": "y" * 120, "status": "FAIL",
         "errors": {"float64": 3.5e-3, "float32": float("nan")}},
    ]
    rows = verify_rows + extra
    monkeypatch.setattr(verify_cmd, "run_checks", lambda *a, **k: iter(rows))
    assert main(["verify"]) == 1  # the made-up FAIL row
    out = capsys.readouterr().out
    too_long = [line for line in out.splitlines() if len(line) > 100]
    assert not too_long, too_long
    flat = " ".join(out.split())
    for r in verify_rows:
        assert " ".join(r["name"].split()) in flat and " ".join(r["reference"].split()) in flat
        assert f"{r['errors']['float64']:.1e}" in flat
