"""The command line: `splitformer verify`, `splitformer convergence` and `python -m splitformer`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import subprocess
import sys
from pathlib import Path

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
from splitformer.verification import group_names


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
    rc = main(["verify", "--group", "core", "--json"])
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
    assert "--json" in r.stdout and "--group" in r.stdout
    r = subprocess.run([sys.executable, "-m", "splitformer", "verify", "--family", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_verify_every_family(verify_rows):
    fams = {r["group"] for r in verify_rows if r["status"] == "PASS"}
    # timm runs here because the test set-up makes `import timm` work
    assert fams == {"core", "bert", "vit", "cvt", "timm", "gpt2", "llama", "mistral", "qwen2",
                    "qwen3", "gemma2", "gemma3", "transformer"}


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
    (["--ref-k", "0"], "--ref-k", "an integer in [1, 16]"),
    (["--ref-k", "-3"], "--ref-k", "an integer in [1, 16]"),
    (["--ref-k", "2.5"], "--ref-k", "an integer in [1, 16]"),
    (["--ref-k", "40"], "--ref-k", "an integer in [1, 16]"),
    (["--ref-k", "17"], "--ref-k", "got 17"),
    (["--ks", "1-1000000000"], "--ks", "k in [0, 15]"),
    (["--ks", "2,20"], "--ks", "got 20"),
    (["--ks", "0-16"], "--ks", "k in [0, 15]"),
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
    (["--seed", "x"], "--seed", "an integer in [-2^63, 2^64 - 1]"),
    (["--seed", "99999999999999999999999"], "--seed", "torch.manual_seed's range"),
    (["--seed", str(2**64)], "--seed", "an integer in [-2^63, 2^64 - 1]"),
    (["--seed", str(-2**63 - 1)], "--seed", "an integer in [-2^63, 2^64 - 1]"),
    (["--scheme", "prenorm", "--reference", "projected-ode"], "--reference",
     "operators composed inside them"),
    (["--scheme", "attention norm1:project"], "--scheme",
     "does not use the model's field operator ffn"),
    (["--scheme", "ffn norm2:project"], "--scheme", "field operator attention"),
    (["--scheme", "norm1>attention", "--reference", "projected-ode"], "--scheme", "ffn"),
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


@pytest.mark.parametrize("value", ["-1", "0", "two", "100000", "1000000000"])
def test_verify_threads_must_be_positive_and_bounded(capsys, no_computation, value):
    """--threads 100000 crashed torch (segmentation fault): a usage error now."""
    line = _usage_error(capsys, ["verify", "--threads", value])
    assert line.startswith("splitformer verify: error: argument --threads: "), line
    assert "positive integer" in line and f"at most {verify_cmd.MAX_THREADS}" in line


def test_verify_threads_just_above_the_bound(capsys, no_computation):
    line = _usage_error(capsys, ["verify", "--threads", str(verify_cmd.MAX_THREADS + 1)])
    assert f"at most {verify_cmd.MAX_THREADS} (torch threads" in line


def test_verify_threads_bound_is_documented_and_accepted():
    assert verify_cmd.MAX_THREADS >= 256
    args = build_parser().parse_args(["verify", "--threads", str(verify_cmd.MAX_THREADS)])
    assert args.threads == verify_cmd.MAX_THREADS
    help_text = " ".join(_subparser("verify").format_help().split())
    assert f"from 1 to {verify_cmd.MAX_THREADS}" in help_text


def test_verify_restores_the_thread_count(monkeypatch):
    monkeypatch.setattr(verify_cmd, "run_checks", lambda *a, **k: iter([]))
    before = torch.get_num_threads()
    with contextlib.redirect_stdout(io.StringIO()):
        main(["verify", "--threads", "1", "--json"])
    assert torch.get_num_threads() == before


def test_argparse_errors_are_one_line_too(capsys):
    line = _usage_error(capsys, ["verify", "--group", "nope"])
    assert "argument --group/--family: invalid choice: 'nope'" in line
    line = _usage_error(capsys, ["nonesuch"])
    assert line.startswith("splitformer: error: ")


def test_no_command_is_one_line(capsys):
    from splitformer.cli import COMMANDS

    line = _usage_error(capsys, [])
    assert line == (f"splitformer: error: a command is required ({', '.join(COMMANDS)}) "
                    "(see 'splitformer --help')")


def test_seed_ref_k_and_ks_bounds_are_accepted_and_documented():
    conv = _subparser("convergence")
    for seed in ("-1", str(-2**63), str(2**64 - 1)):
        assert conv.parse_args(["--seed", seed]).seed == int(seed)
    assert conv.parse_args(["--ref-k", "16"]).ref_k == 16
    assert conv.parse_args(["--ks", "0-15"]).ks == tuple(range(16))
    help_text = " ".join(conv.format_help().split())
    assert "an integer from 1 to 16" in help_text and "each from 0 to 15" in help_text
    assert "[-2^63, 2^64 - 1]" in help_text
    assert "exit status: 0 done; 2 a usage error" in help_text


@pytest.mark.parametrize("argv,dest,value", [
    (["verify", "--group", "core "], "group", ["core"]),
    (["verify", "--family", " bert", "--group", "\tvit\n"], "group", ["bert", "vit"]),
    (["convergence", "--scheme", "lie "], "scheme", "lie"),
    (["convergence", "--integrator", " heun "], "integrator", "heun"),
    (["convergence", "--substep-form", "tangent "], "substep_form", "tangent"),
    (["convergence", "--controls", " linear"], "controls", "linear"),
    (["convergence", "--reference", "same-scheme "], "reference", "same-scheme"),
    (["convergence", "--model", " relu "], "model", "relu"),
])
def test_choices_are_read_without_surrounding_whitespace(argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value


@pytest.mark.parametrize("flag,text,argument,api_value", [
    ("--ks", "2,1", "ks", (2, 1)),
    ("--ks", "3", "ks", (3,)),
    ("--ks", "1,99", "ks", (1, 99)),
    ("--ref-k", "40", "ref_k", 40),
    ("--ref-k", "x", "ref_k", "x"),
    ("--seed", str(2**64), "seed", 2**64),
])
def test_cli_and_api_refuse_with_the_same_words(capsys, no_computation, flag, text, argument,
                                                api_value):
    """The CLI's argparse types call the API's checks: same refusal, same detail."""
    from splitformer.analysis import checks

    check = {"ks": checks.check_ks, "ref_k": checks.check_ref_k, "seed": checks.check_seed}
    with pytest.raises(checks.ArgumentError) as exc:
        check[argument](api_value)
    assert exc.value.argument == argument and str(exc.value).startswith(f"{argument}: ")
    line = _usage_error(capsys, ["convergence", flag, text])
    assert line.startswith(f"splitformer convergence: error: argument {flag}: "
                           f"{exc.value.detail}"), line


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


def test_convergence_model_file_with_nan_weights(capsys, tmp_path):
    """A NaN weight would give NaN errors and a NaN order: refused, naming --model."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    with torch.no_grad():
        layer.linear1.weight[0, 0] = float("nan")
    path = tmp_path / "nan.pt"
    torch.save(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), path)
    line = _usage_error(capsys, ["convergence", "--model", str(path), "--ks", "2-3",
                                 "--ref-k", "5"])
    assert line.startswith("splitformer convergence: error: argument --model: "), line
    assert "expected finite parameters" in line


def test_convergence_non_finite_run_is_one_line_exit_1(capsys, monkeypatch):
    """A reference that blew up is not a usage error: one line on stderr, exit status 1."""
    # the module (the package's name 'convergence' is the function)
    conv_mod = importlib.import_module("splitformer.analysis.convergence")
    monkeypatch.setattr(conv_mod, "reference_solution",
                        lambda evo, u0, *a, **k: torch.full_like(u0, float("nan")))
    assert main(["convergence", "--ks", "2-3", "--ref-k", "5"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("splitformer convergence: error: the reference u(T)"), lines[0]
    assert "not finite" in lines[0] and "nan" not in captured.out


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
    assert list(_choices(_subparser("verify"), "--group")) == group_names()
    for parser in (conv, _subparser("verify")):  # no kernel choice today; if one comes, it reads
        for action in parser._actions:           # the registry
            if "kernel" in action.dest:
                assert list(action.choices) == [*KERNELS, "alibi", "rotary"]


# -- verify: every row within 100 columns ---------------------------------------------------

def test_verify_table_fits_100_columns(capsys, monkeypatch, verify_rows):
    """Every row of `splitformer verify` (all families, as measured), and SKIP / FAIL rows with
    long reasons, print within 100 columns, and nothing is cut."""
    extra = [
        {"group": "timm", "name": "pre-LN ViT (class token, token pooling) = prenorm scheme",
         "reference": "timm VisionTransformer model(x), forward_features(x)", "status": "SKIP",
         "reason": "timm cannot be imported (ModuleNotFoundError: No module named "
                   "'torchvision') " * 2, "errors": {}},
        {"group": "nonesuch", "name": "nonesuch", "reference": "-", "status": "SKIP",
         "reason": "not available in this version", "errors": {}},
        {"group": "core", "name": "x" * 150, "reference": "y" * 120, "status": "FAIL",
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


def test_ctrl_c_says_what_the_command_keeps_by_then(monkeypatch, capsys):
    """A command that changes what Ctrl-C keeps while it runs (compress, once its healing has
    a checkpoint) is answered with the new words, not those of its start."""
    from splitformer import cli as cli_module
    from splitformer.commands import compress

    def healing(args):
        args._interrupted = " (the healing's last checkpoint is kept)"
        raise KeyboardInterrupt

    monkeypatch.setattr(compress, "run", healing)
    assert cli_module.main(["compress", "--heal", "none"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["splitformer compress: interrupted (the healing's last checkpoint is kept)"]


def test_sigterm_is_read_as_ctrl_c(monkeypatch, capsys):
    """SIGTERM (timeout, schedulers, docker stop) ends a command as Ctrl-C does: its one line,
    exit 130, and what the command keeps on Ctrl-C kept; the handler is put back after."""
    import os
    import signal
    import time

    from splitformer import cli as cli_module
    from splitformer.commands import compress

    def terminated(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises before this returns
        return 0

    monkeypatch.setattr(compress, "run", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert cli_module.main(["compress", "--heal", "none"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["splitformer compress: interrupted before healing began (nothing to resume)"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_main_runs_outside_the_main_thread(monkeypatch):
    """cli.main from another thread (where Python refuses signal handlers) runs the command."""
    import threading

    from splitformer.commands import compress

    monkeypatch.setattr(compress, "run", lambda args: 7)
    codes = []
    t = threading.Thread(target=lambda: codes.append(main(["compress", "--heal", "none"])))
    t.start()
    t.join()
    assert codes == [7]


_SIGNAL_AT_START = """
import os, signal, sys
from splitformer import cli
# Python's own handlers, whatever this test's runner left (a background job inherits an
# ignored Ctrl-C)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
if {ignored}:
    signal.signal(signal.SIG{name}, signal.SIG_IGN)
before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
real = cli.build_parser
def build_parser():
    os.kill(os.getpid(), signal.SIG{name})  # as if it came inside an import
    sys.stderr.write("import finished\\n")  # the import goes on to its end
    return real()
cli.build_parser = build_parser
code = cli.main(["nonesuch"])
assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
raise SystemExit(code)
"""


@pytest.mark.parametrize("name,ignored,code,line", [
    ("INT", False, 130, "splitformer: interrupted"),
    ("TERM", False, 130, "splitformer: interrupted"),
    ("INT", True, 2, "splitformer: error: argument COMMAND: invalid choice"),
])
def test_a_signal_while_the_commands_are_imported_is_one_line(name, ignored, code, line):
    """Ctrl-C or SIGTERM before a command runs (building the parser imports every command and
    torch, for seconds) is held until the imports are done, then answered by the process's
    handler: one line and exit 130, never a traceback and never lost; an ignored Ctrl-C (a
    background job's) stays ignored; the handlers are put back after. In a child process, so
    that a regression cannot stop the test session."""
    done = subprocess.run([sys.executable, "-c", _SIGNAL_AT_START.format(name=name,
                                                                         ignored=ignored)],
                          capture_output=True, text=True, timeout=300)
    err = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr
    assert err[0] == "import finished" and len(err) == 2 and err[1].startswith(line), err


def test_the_entry_point_imports_no_torch():
    """The console script's import (splitformer.cli, and splitformer itself) does not import
    torch, so that Ctrl-C during it reaches main's handler; the public names load on use."""
    code = ("import sys, types, splitformer.cli, splitformer; "
            "assert 'torch' not in sys.modules; "
            "names = {n: getattr(splitformer, n) for n in splitformer.__all__}; "
            "assert 'torch' in sys.modules; "
            "assert all(isinstance(getattr(splitformer, m), types.ModuleType) "
            "for m in set(dir(splitformer)) - set(splitformer.__all__) - {'__version__'}); "
            "print(len(names))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(len(splitformer.__all__))


def test_the_package_lists_each_public_name_once():
    """splitformer.__all__ is exactly the names the package loads on use, each a real object,
    and an unknown name is an AttributeError naming it."""
    assert sorted(splitformer.__all__) == sorted({*splitformer._PUBLIC, *splitformer._RENAMED})
    assert splitformer.save is importlib.import_module(
        "splitformer.training.checkpoints").save_model
    assert splitformer.from_hf is importlib.import_module("splitformer.interop").from_hf
    with pytest.raises(AttributeError, match="nonesuch"):
        splitformer.nonesuch  # noqa: B018
    assert set(splitformer.__all__) <= set(dir(splitformer))
    package = Path(splitformer.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} | {p.parent.name
                                                       for p in package.glob("*/__init__.py")}
    assert set(dir(splitformer)) - set(splitformer.__all__) == modules - {
        "__init__", "__main__", "cli", "commands"} | {"__version__"}
    assert splitformer.time.Evolution is splitformer.Evolution  # a subpackage, as `import` gives
