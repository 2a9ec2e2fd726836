"""``python -m splitformer.experiments.context`` (docs/context.md): run and table are
subcommands with their own options, refusals are one line before any model loads; Ctrl-C in
context's and passkey's runs is one line."""

from __future__ import annotations

import pytest


def _stderr_of_exit(main, argv, capsys, code: int = 2) -> list[str]:
    """The stderr lines of ``main(argv)``, which must exit with ``code``."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == code
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("argv, word", [
    (["table", "--out", "{folder}", "--rules", "yarn"], "unrecognized arguments: --rules"),
    (["table", "--out", "{folder}", "--threads", "1"], "unrecognized arguments: --threads"),
    (["table", "--out", "{missing}"], "no rows.jsonl"),
    (["run", "--out", "{folder}", "--factors", "1"], "--factors"),
    (["run", "--out", "{folder}", "--rules", "nope"], "--rules"),
    (["run", "--out", "{folder}", "--docs", "kjv,bible"], "--docs"),
    (["run", "--out", "{folder}/rows.jsonl"], "--out"),
    (["walk"], "invalid choice"),
])
def test_the_context_command_refuses_on_one_line(tmp_path, capsys, argv, word):
    from splitformer.experiments import context

    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "rows.jsonl").write_text("")
    argv = [a.format(folder=folder, missing=tmp_path / "none") for a in argv]
    err = _stderr_of_exit(context.main, argv, capsys)
    assert len(err) == 1 and word in err[0], err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["rows", "rows.jsonl"]


@pytest.mark.parametrize("name, rows", [("context", "rows.jsonl"),
                                        ("passkey", "passkey.jsonl")])
def test_ctrl_c_in_a_run_is_one_line_naming_the_kept_rows(name, rows, tmp_path, capsys,
                                                          monkeypatch):
    """Ctrl-C during ``run`` of the long LM experiments: one line naming the row file that
    keeps the finished rows, exit 130."""
    import importlib

    module = importlib.import_module(f"splitformer.experiments.{name}")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupted)
    err = _stderr_of_exit(module.main, ["run", "--out", str(tmp_path / "rows")], capsys, code=130)
    assert err == [f"python -m splitformer.experiments.{name}: interrupted (finished rows, "
                   f"if any, are kept in {tmp_path / 'rows' / rows})"]


@pytest.mark.parametrize("name, argv, rows", [
    ("context", ["table"], "rows.jsonl"),
    ("passkey", ["table"], "passkey.jsonl"),
    ("depth_llm", ["table"], "training-free.jsonl"),
])
def test_a_corrupt_row_file_is_one_line(name, argv, rows, tmp_path, capsys):
    """A row file corrupt in the middle (not a torn last line): table says which file and
    line in one line, exit 2, the file untouched."""
    import importlib

    module = importlib.import_module(f"splitformer.experiments.{name}")
    (tmp_path / rows).write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    err = _stderr_of_exit(module.main, [*argv, "--out", str(tmp_path)], capsys)
    assert len(err) == 1 and "line 2" in err[0] and rows in err[0], err
    assert (tmp_path / rows).read_text() == '{"a": 1}\nnot json\n{"a": 2}\n'


def test_context_run_reads_its_row_file_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import splitformer.interop
    from splitformer.experiments import context

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the row file was read")

    monkeypatch.setattr(splitformer.interop, "from_hf", loaded)
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    err = _stderr_of_exit(context.main, ["run", "--out", str(tmp_path)], capsys)
    assert len(err) == 1 and "line 2" in err[0], err


@pytest.mark.parametrize("argv, word", [
    (["free", "--configs", "bogus"], "--configs"),
    (["free", "--configs", "drop/bogus"], "--configs"),
    (["free", "--steps", "0"], "--steps"),
    (["free", "--steps", "30"], "--steps"),
    (["free", "--out", "{file}"], "--out"),
    (["table", "--out", "{file}"], "--out"),
])
def test_depth_llm_refuses_on_one_line_before_the_model_loads(argv, word, tmp_path, capsys):
    from splitformer.experiments import depth_llm

    (tmp_path / "f").write_text("")
    err = _stderr_of_exit(depth_llm.main, [a.format(file=tmp_path / "f") for a in argv], capsys)
    assert len(err) == 1 and word in err[0], err
