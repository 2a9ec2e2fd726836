"""``python -m splitformer.experiments.context`` (docs/context.md): run and table are
subcommands with their own options, refusals are one line before any model loads, Ctrl-C
is one line."""

from __future__ import annotations

import pytest


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
    with pytest.raises(SystemExit) as e:
        context.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0], err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["rows", "rows.jsonl"]


def test_ctrl_c_in_a_context_run_is_one_line(tmp_path, capsys, monkeypatch):
    from splitformer.experiments import context

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(context, "run", interrupted)
    with pytest.raises(SystemExit) as e:
        context.main(["run", "--out", str(tmp_path / "rows")])
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0] and "rows.jsonl" in err[0], err
