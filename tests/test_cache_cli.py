"""`splitformer cache`: a text streamed through a causal LM under each cache policy and budget;
the full row is transformers' perplexity on the same ids; refusals as one line and exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _cli import cli
from _tiny_lm import save_tiny_llama

transformers = pytest.importorskip("transformers")

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. ") * 6


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    """A tiny Llama (grouped heads 4 / 2, rotary) with a byte-level tokenizer, saved offline."""
    folder = save_tiny_llama(tmp_path_factory.mktemp("llama"))
    (folder / "text.txt").write_text(TEXT, encoding="utf-8")
    return folder


def _json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_cache_json_rows_and_the_full_row_is_transformers_perplexity(llama_folder, capsys):
    rc, out, err = cli(["cache", str(llama_folder), "--text", str(llama_folder / "text.txt"),
                        "--policy", "full,streaming,quadrature", "--budget", "0.5,0.25",
                        "--chunk", "16", "--decode", "8", "--json"], capsys)
    assert rc == 0, err
    got = _json(out)
    rows = got["rows"]
    assert [(r["policy"], r["budget"]) for r in rows] == [
        ("full", 1.0), ("streaming", 0.5), ("streaming", 0.25), ("quadrature", 0.5),
        ("quadrature", 0.25)]
    for r in rows:
        assert {"policy", "budget", "perplexity", "bits_per_byte", "cache_bytes",
                "decode_tokens_per_s"} <= set(r)
        assert r["decode_tokens_per_s"] > 0
    n = got["tokens"]
    tok = transformers.AutoTokenizer.from_pretrained(str(llama_folder))
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    assert n == ids.shape[1] == len(TEXT.encode())
    hf = transformers.LlamaForCausalLM.from_pretrained(str(llama_folder)).eval()
    with torch.no_grad():
        loss = float(hf(ids, labels=ids).loss)
    full = rows[0]
    assert abs(math.log(full["perplexity"]) - loss) <= 1e-5
    assert abs(full["bits_per_byte"] - loss * (n - 1) / math.log(2) / (n - 1)) <= 1e-5
    # the cache's memory follows the budget: K and V of 2 evaluations x 2 heads x 8 features
    plain = 2 * 2 * 2 * 8 * 4 * n
    assert full["cache_bytes"] == plain
    for r in rows[1:]:
        assert r["entries"] == math.ceil(r["budget"] * n)
        assert r["cache_bytes"] < (r["budget"] + 0.1) * plain
    assert "splitformer cache:" in err


def test_slack_lets_the_cache_exceed_the_budget_and_is_in_the_json(llama_folder, capsys):
    """--slack N: the policy compresses when the past exceeds the budget by more than N, so
    the peak is above slack 0's and below budget + N entries (plus a chunk); the full row is
    the same; the JSON says the slack."""
    got = {}
    for slack in (0, 24):
        rc, out, err = cli(["cache", str(llama_folder), "--text", str(llama_folder / "text.txt"),
                            "--policy", "full,streaming", "--budget", "0.25", "--chunk", "16",
                            "--decode", "8", "--slack", str(slack), "--json"], capsys)
        assert rc == 0, err
        got[slack] = _json(out)
    assert got[24]["slack"] == 24 and got[0]["slack"] == 0
    assert got[24]["rows"][0]["perplexity"] == got[0]["rows"][0]["perplexity"]
    tight, loose = got[0]["rows"][1], got[24]["rows"][1]
    # slack 0's peak: the budget's past and one chunk's new nodes (weights, coordinates too)
    per_entry = tight["cache_bytes"] / (tight["entries"] + 16)
    assert loose["cache_bytes"] > tight["cache_bytes"]
    assert loose["cache_bytes"] <= (tight["entries"] + 24 + 16) * per_entry * 1.001
    assert tight["entries"] <= loose["entries"] <= tight["entries"] + 24


def test_cache_prints_one_table(llama_folder, capsys):
    rc, out, err = cli(["cache", str(llama_folder), "--text", str(llama_folder / "text.txt"),
                        "--policy", "streaming,h2o", "--budget", "0.5", "--chunk", "32",
                        "--decode", "4"], capsys)
    assert rc == 0, err
    assert "perplexity" in out and "bits/byte" in out and "h2o" in out
    assert out.count("streaming") == 1


def test_a_policy_with_options_is_its_own_row(llama_folder, capsys):
    """``--policy snapkv:window=4`` runs SnapKV with a window of 4 queries: its own row, named
    by the spec, whose perplexity is not the default window's (64, so every query of a
    16-token forward)."""
    rc, out, err = cli(["cache", str(llama_folder), "--text", str(llama_folder / "text.txt"),
                        "--policy", "snapkv,snapkv:window=4", "--budget", "0.25",
                        "--chunk", "16", "--decode", "4", "--json"], capsys)
    assert rc == 0, err
    rows = {r["policy"]: r for r in _json(out)["rows"]}
    assert set(rows) == {"snapkv", "snapkv:window=4"}
    assert rows["snapkv"]["perplexity"] != rows["snapkv:window=4"]["perplexity"]


@pytest.mark.parametrize("flags,word", [
    (["--budget", "0"], "--budget"), (["--budget", "1.5"], "--budget"),
    (["--budget", "-0.25"], "--budget"), (["--budget", "nan"], "--budget"),
    (["--budget", "0.5,x"], "--budget"), (["--policy", "lru"], "--policy"),
    (["--policy", "full,"], "--policy"), (["--chunk", "0"], "--chunk"),
    (["--max-tokens", "-3"], "--max-tokens"), (["--decode", "-1"], "--decode"),
    (["--slack", "-1"], "--slack"), (["--slack", "2.5"], "--slack"),
    (["--policy", "snapkv:window=0"], "window"), (["--policy", "snapkv:windo=3"], "windo"),
    (["--policy", "snapkv:budget=3"], "--budget"), (["--policy", "quadrature:recent"], "recent"),
    (["--policy", "h2o:slack=2"], "--slack"), (["--policy", "full:sinks=1"], "sinks"),
])
def test_bad_arguments_are_one_line_and_exit_2(llama_folder, capsys, flags, word):
    rc, out, err = cli(["cache", str(llama_folder), "--text", str(llama_folder / "text.txt"),
                        *flags], capsys)
    assert rc == 2
    assert word in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_bad_text_and_model_are_refused(llama_folder, tmp_path, capsys):
    rc, _, err = cli(["cache", str(llama_folder), "--text", str(tmp_path / "none.txt")], capsys)
    assert rc == 2 and "--text" in err and "Traceback" not in err
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    rc, _, err = cli(["cache", str(llama_folder), "--text", str(empty)], capsys)
    assert rc == 2 and "--text" in err
    rc, _, err = cli(["cache", str(llama_folder), "--text", str(llama_folder / "text.txt"),
                      "--decode", "5000"], capsys)
    assert rc == 2 and "--decode" in err
    rc, _, err = cli(["cache", str(tmp_path / "nothing"), "--text",
                      str(llama_folder / "text.txt")], capsys)
    assert rc == 2 and "MODEL" in err and "Traceback" not in err


def test_cache_help(capsys):
    rc, out, _ = cli(["cache", "--help"], capsys)
    assert rc == 0 and "--budget" in out and "quadrature" in out


def test_too_few_tokens_for_decode_is_refused_before_the_model_loads(llama_folder, capsys,
                                                                     monkeypatch):
    """--max-tokens below --decode + 2 can never be scored: refused from the flags alone."""
    from splitformer.commands import generate

    def no_load(model):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(generate, "_load", no_load)
    rc, _, err = cli(["cache", str(llama_folder), "--text", str(llama_folder / "text.txt"),
                      "--max-tokens", "10", "--decode", "9"], capsys)
    assert rc == 2 and "--max-tokens" in err and "--decode 9" in err
    assert len(err.strip().splitlines()) == 1
