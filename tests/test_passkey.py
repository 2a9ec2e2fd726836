"""The passkey test of docs/cache.md (``splitformer.experiments.passkey``) on a tiny Llama with a
byte-level tokenizer: prompts of exactly the asked length with the key at spread depths, the
full cache's answers equal to transformers' greedy continuation, batches that change nothing,
and rows that name the policy spec they ran."""

from __future__ import annotations

import pytest
import torch
from _tiny_lm import save_tiny_llama

from splitformer.experiments import passkey

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import splitformer

    folder = save_tiny_llama(tmp_path_factory.mktemp("llama"))
    model = splitformer.from_hf(str(folder)).eval()
    model.tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    ref = transformers.LlamaForCausalLM.from_pretrained(str(folder)).eval()
    return model, ref


def test_prompts_hold_the_key_once_at_spread_depths_and_end_with_the_question(tiny):
    model, _ = tiny
    ids, keys = passkey.prompts(model.tokenizer, 400, 5)
    assert ids.shape == (5, 400)
    assert len(set(keys)) == 5 and all(len(k) == 5 and k.isdigit() for k in keys)
    depths = []
    for row, key in zip(ids.tolist(), keys, strict=True):
        text = model.tokenizer.decode(row)
        assert text.endswith(passkey.QUESTION)
        assert text.count(passkey.NEEDLE.format(key=key)) == 1
        depths.append(text.index(key))
    assert depths == sorted(depths) and depths[0] < 40 and depths[-1] > 300
    with pytest.raises(ValueError, match="too short"):
        passkey.prompts(model.tokenizer, 100, 2)


def test_the_full_cache_answers_are_transformers_greedy_continuations(tiny):
    model, ref = tiny
    ids, keys = passkey.prompts(model.tokenizer, 320, 3)
    row = passkey.run_row(model, ids, keys, None, chunk=64)
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=passkey.NEW_TOKENS, pad_token_id=256)
    texts = model.tokenizer.batch_decode(want[:, ids.shape[1]:], skip_special_tokens=True)
    assert row["answers"] == texts
    assert row["right"] == [k in t for k, t in zip(keys, texts, strict=True)]


def test_batches_change_no_answer_and_rows_name_their_spec(tiny, tmp_path, capsys):
    model, _ = tiny
    specs = ["full", "snapkv:window=10", "adaptive:window=10:recent=0.25:protect=0.9"]
    for batch, out in ((2, tmp_path / "b2"), (5, tmp_path / "b5")):
        passkey.run(out, [320], 5, specs, [0.25], chunk=320, decode="append", batch=batch,
                    model=model)
    rows = {b: {r["policy"]: r for r in passkey.read_rows(tmp_path / b / "passkey.jsonl")}
            for b in ("b2", "b5")}
    assert set(rows["b2"]) == set(specs)
    for spec in specs:
        assert rows["b2"][spec]["answers"] == rows["b5"][spec]["answers"]
        assert len(rows["b2"][spec]["right"]) == 5 and rows["b2"][spec]["batch"] == 2
    # the window of 10 queries is not SnapKV's default (64): the spec reached the policy
    passkey.run(tmp_path / "b5", [320], 5, ["snapkv"], [0.25], chunk=320, decode="append",
                batch=5, model=model)
    default = [r for r in passkey.read_rows(tmp_path / "b5" / "passkey.jsonl")
               if r["policy"] == "snapkv"]
    assert default and default[0]["answers"] != rows["b5"]["snapkv:window=10"]["answers"]
    capsys.readouterr()
    passkey.table(tmp_path / "b5", seconds=True)
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("| snapkv:window=10 | 0.25 |"))
    assert f"{sum(rows['b5']['snapkv:window=10']['right'])}/5 (" in row and " s) |" in row


@pytest.mark.parametrize("flags,word", [
    (["--placements", "5,10"], "--placements"), (["--batch", "2,3"], "--batch"),
    (["--chunk", "0"], "--chunk"), (["--threads", "2,3"], "--threads"),
    (["--budgets", "0.25,x"], "--budgets"), (["--policies", "snapkv:windo=3"], "windo"),
    (["--lengths", "100"], "--lengths"), (["--seconds"], "--seconds"),
])
def test_bad_run_arguments_are_refused_naming_them(flags, word, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        passkey.main(["run", "--out", str(tmp_path), *flags])
    assert e.value.code == 2 and word in capsys.readouterr().err
    assert not (tmp_path / "passkey.jsonl").exists()


def test_the_table_compares_each_row_with_the_full_cache_by_mcnemars_test(tmp_path, capsys):
    """Rows compressed once (chunk = length) at two lengths are one table; each row is set
    against the full cache's answers prompt by prompt: b right where the full cache is wrong,
    c the reverse, p McNemar's exact test (the binomial test of min(b, c) in b + c at 1/2)."""
    from scipy import stats

    full = [True] * 8 + [False] * 2
    other = [True] * 3 + [False] * 5 + [True, False]
    keys = [str(10000 + i) for i in range(10)]
    for n in (256, 512):
        for policy, budget, right in (("full", 1.0, full), ("snapkv:window=4", 0.25, other)):
            passkey.append_row(tmp_path / "passkey.jsonl", {
                "length": n, "policy": policy, "budget": budget, "placements": 10, "chunk": n,
                "decode": "append", "right": right, "keys": keys, "seconds": 1.0})
    passkey.table(tmp_path)
    out = capsys.readouterr().out
    assert out.count("compressed once, after the question") == 1
    assert "| snapkv:window=4 | 0.25 | 4/10 | 4/10 |" in out
    p = stats.binomtest(1, 6, 0.5).pvalue
    assert f"| snapkv:window=4 | 0.25 | 512 | 1 | 5 | {p:.2g} |" in out


@pytest.mark.parametrize("argv,word", [
    ([], "{run,table}"), (["bogus"], "invalid choice"),
    (["table", "--out", "{jsonl}"], "expected the folder of passkey.jsonl"),
    (["run", "--out", "{jsonl}"], "expected the folder of passkey.jsonl"),
    (["table", "--out", "{folder}", "--batch", "3"], "unrecognized arguments: --batch 3"),
    (["table", "--out", "{folder}", "--policies", "full"], "unrecognized arguments: --policies"),
    (["table", "--out", "{folder}", "--batch", "10"], "unrecognized arguments: --batch 10"),
    (["table", "--out", "{folder}", "--budgets", "0.25"], "unrecognized arguments: --budgets"),
    (["run", "--out", "{folder}", "--seconds"], "unrecognized arguments: --seconds"),
])
def test_the_passkey_command_refuses_on_one_line(tmp_path, capsys, argv, word):
    """A usage error of ``python -m splitformer.experiments.passkey`` is one line and exit 2,
    before any model loads (run with a file as --out included)."""
    from splitformer.experiments import passkey

    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "passkey.jsonl").write_text("")
    argv = [a.format(jsonl=folder / "passkey.jsonl", folder=folder) for a in argv]
    with pytest.raises(SystemExit) as e:
        passkey.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0], err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["passkey.jsonl", "rows"]  # no folder


def test_a_refused_run_makes_no_folder(tmp_path, capsys):
    """run's --out is checked, not made, before the other refusals: a refused run leaves
    nothing behind; a file in its path is named."""
    from splitformer.experiments import passkey

    for argv in (["run", "--out", str(tmp_path / "a" / "b"), "--seconds"],
                 ["run", "--out", str(tmp_path / "f" / "b")]):
        (tmp_path / "f").write_text("")
        with pytest.raises(SystemExit) as e:
            passkey.main(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--seconds" in err[0] and "not a folder" in err[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_row_another_process_finished_first_is_not_written_twice(tmp_path):
    """Two queues may append to one row file; a row whose key is there already is skipped."""
    from splitformer.experiments.rows import append_row, read_rows

    path = tmp_path / "rows.jsonl"
    assert append_row(path, {"length": 1024, "policy": "full", "accuracy": 0.9},
                      key=("length", "policy"))
    assert not append_row(path, {"length": 1024, "policy": "full", "accuracy": 0.8},
                          key=("length", "policy"))
    assert append_row(path, {"length": 2048, "policy": "full"}, key=("length", "policy"))
    assert [r.get("accuracy") for r in read_rows(path)] == [0.9, None]


def test_a_row_torn_by_a_kill_is_dropped_and_cut_before_the_next(tmp_path):
    """A kill in the middle of a row's write leaves a torn last line: it is not a row, and the
    next row starts a line of its own (the file reads whole again)."""
    from splitformer.experiments.rows import append_row, read_rows

    path = tmp_path / "rows.jsonl"
    append_row(path, {"a": 1})
    with open(path, "a") as f:
        f.write('{"a": 2, "b"')  # the kill
    assert read_rows(path) == [{"a": 1}]
    append_row(path, {"a": 3})
    assert read_rows(path) == [{"a": 1}, {"a": 3}]
    assert path.read_text() == '{"a": 1}\n{"a": 3}\n'


def test_a_corrupt_row_file_is_one_line(tmp_path, capsys, monkeypatch):
    """A row file corrupt in the middle (not a torn last line) stops the run with one line
    naming the file and the line, exit 2, the file untouched."""
    from splitformer.experiments import passkey

    folder = tmp_path / "rows"
    folder.mkdir()
    path = folder / "passkey.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    monkeypatch.setattr(passkey, "run", lambda out, *a, **k: passkey.read_rows(path))
    with pytest.raises(SystemExit) as e:
        passkey.main(["run", "--out", str(folder)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 2" in err[0] and str(path) in err[0], err
    assert path.read_text() == '{"a": 1}\nnot json\n{"a": 2}\n'


def test_lengths_past_the_trained_positions_are_warned_about(tiny, tmp_path, capsys):
    """A prompt longer than the model's trained grid is extrapolation in x: run says so (one
    warning line naming --lengths), and measures it."""
    import splitformer

    folder = save_tiny_llama(tmp_path / "llama", positions=300)
    model = splitformer.from_hf(str(folder)).eval()
    model.tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    passkey.run(tmp_path / "rows", [320], 1, ["full"], [0.25], chunk=320, model=model)
    err = capsys.readouterr().err
    assert "warning: --lengths 320 past the model's 300 trained positions" in err, err
    assert len(passkey.read_rows(tmp_path / "rows" / "passkey.jsonl")) == 1
    passkey.run(tmp_path / "rows2", [320], 1, ["full"], [0.25], chunk=320, model=tiny[0])
    assert "warning" not in capsys.readouterr().err  # 1024 trained positions
