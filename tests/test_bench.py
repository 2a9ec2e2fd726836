"""`splitformer bench` and its parts: every suite of the registry runs and gives consistent rows;
the timing harness interleaves; peak memory reads the allocator; the training step's peak
memory is not above torch.nn's (a deterministic quantity, so a test); bad inputs are one line
and exit 2."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from splitformer.bench import Contender, Size, measure, parse_size, peak_memory
from splitformer.bench.suites import SUITES, Options, run_suite
from splitformer.cli import main

MICRO = Size(16, 2, 1, 32, 2, 8, "micro")
OPTS = Options(repeats=1, warmup=0, ks=(1, 2), seqs=(4, 8), backend="eager", new_tokens=3,
               prefixes=(8, 16), contexts=(40,), policies=("streaming", "quadrature"),
               budgets=(0.5, 0.25))


@pytest.mark.parametrize("name", sorted(SUITES))
def test_every_suite_runs_and_its_ratios_are_its_medians(name):
    rows = run_suite(name, MICRO, OPTS)
    assert rows
    timed = [r for r in rows if "median_s" in r]
    by_group: dict[tuple, dict[str, float]] = {}
    for r in timed:
        assert math.isfinite(r["median_s"]) and r["median_s"] > 0
        by_group.setdefault((r["size"], r["group"], r["path"]), {})[r["name"]] = r["median_s"]
    for r in timed:
        medians = by_group[(r["size"], r["group"], r["path"])]
        for other, ratio in r["ratios"].items():
            assert ratio == pytest.approx(r["median_s"] / medians[other])
    assert any(r.get("splitformer") for r in rows if "skipped" not in r)
    for r in rows:  # a peer that cannot run says why
        assert "skipped" not in r or r["skipped"].strip()


def test_measure_interleaves_the_repeats():
    calls: list[str] = []

    class Tick(nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name = name
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x):
            calls.append(self.name)
            return x * self.w

    x = torch.ones(3)
    result = measure([Contender("a", Tick("a"), (x,)), Contender("b", Tick("b"), (x,))],
                     "no_grad", repeats=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert set(result) == {"a", "b"} and len(result["a"]["times_s"]) == 3
    with pytest.raises(ValueError, match="repeats"):
        measure([], "no_grad", repeats=0)
    with pytest.raises(ValueError, match="path"):
        measure([], "backward")


def test_peak_memory_reads_the_allocator():
    n = 1 << 20

    def one_block():
        torch.empty(n, dtype=torch.uint8).fill_(1)

    def two_blocks_alive():
        a = torch.empty(n, dtype=torch.uint8)
        b = torch.empty(n, dtype=torch.uint8)
        a.fill_(1), b.fill_(1)

    assert peak_memory(one_block) == n
    assert peak_memory(two_blocks_alive) == 2 * n


@pytest.mark.parametrize("norm_first", [False, True])
def test_training_step_peak_memory_is_not_above_torch_nn(norm_first):
    """The issue's memory bar, at a small size: forward, loss, backward of from_torch(m) holds
    at most what m's does (the allocator's own records: deterministic)."""
    from splitformer.bench import peers
    from splitformer.bench.timing import step_fn

    size = Size(64, 4, 2, 256, 4, 32)
    peaks = {}
    for c in peers.torch_encoder(size, norm_first=norm_first):
        run = step_fn(c, "train")
        run()
        c.model.zero_grad(set_to_none=True)
        peaks[c.name] = peak_memory(run)
    assert peaks["splitformer"] <= peaks["torch.nn"], peaks


def test_sizes_parse_and_refuse():
    assert parse_size("d768").dim == 768
    s = parse_size("dim=32,heads=4")
    assert (s.dim, s.heads, s.layers) == (32, 4, 6)
    for bad, word in (("d999", "expected one of"), ("dim=x", "not an integer"),
                      ("depth=3", "unknown key"), ("dim=30,heads=4", "must divide"),
                      ("dim=0", "positive")):
        with pytest.raises(ValueError, match=word):
            parse_size(bad)
    assert MICRO.forward_flops() == 1 * (8 * 16 * 16 * 16 + 4 * 2 * 64 * 16 + 4 * 16 * 16 * 32)


def test_command_writes_json_and_prints_tables(tmp_path, capsys):
    out = tmp_path / "b.json"
    code = main(["bench", "refine", "memory", "--size", "dim=16,heads=2,layers=1,ff=32,batch=2,"
                 "seq=8", "--repeats", "1", "--warmup", "0", "--ks", "1,2,2", "--out", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["suites"] == ["refine", "memory"] == data["suites_done"]
    assert data["complete"] is True
    assert {r["suite"] for r in data["rows"]} == {"refine", "memory"}
    assert data["machine"]["torch"] == torch.__version__
    assert [r["k"] for r in data["rows"] if r["suite"] == "refine" and r["path"] == "train"] \
        == [1, 2]  # k = 2 once
    text = capsys.readouterr().out
    assert "splitformer bench refine" in text and "peak" in text and str(out) in text
    assert not list(tmp_path.glob(".bench-*"))  # no temporary file left


@pytest.mark.parametrize("argv, flag", [
    (["nosuch"], "SUITE"),
    (["refine,,memory"], "SUITE"),
    (["--repeats", "0"], "--repeats"),
    (["--warmup", "-1"], "--warmup"),
    (["--size", "dim=abc"], "--size"),
    (["--size", "huge"], "--size"),
    (["--paths", "train,backward"], "--paths"),
    (["--ks", "0,1"], "--ks"),
    (["--threads", "100000"], "--threads"),
    (["--backend", "tvm"], "--backend"),
    (["--out", "/nonexistent-folder/b.json"], "--out"),
    (["--out", "."], "--out"),
    (["memory", "--paths", "no_grad"], "--paths"),
    (["--seed", str(2 ** 70)], "--seed"),
    (["schemes", "--size", "dim=16,heads=2,ff=1"], "--size"),
    (["--repeats", "1000000000"], "--repeats"),
    (["--warmup", "1000"], "--warmup"),
    (["refine", "--ks", "1,1000000"], "--ks"),
    (["--size", "dim=4096,heads=8,batch=100000,seq=1024"], "--size"),
    (["--out", "/proc/bench.json"], "--out"),
    (["generate", "--slack", "-1"], "--slack"),
    (["generate", "--slack", "5000"], "--slack"),
    (["generate", "--size", "tiny", "--slack", "3"], "--slack"),
    (["refine", "--slack", "3"], "--slack"),
    (["encoder", "--size", "tiny", "--policies", "snapkv:window=10"], "--policies"),
    (["generate", "--size", "tiny", "--budgets", "0.5"], "--budgets"),
    (["refine", "--contexts", "512"], "--contexts"),
    (["generate", "--policies", "snapkv:windo=10"], "windo"),
])
def test_bad_inputs_are_one_line_and_exit_2(argv, flag, tmp_path):
    r = subprocess.run([sys.executable, "-m", "splitformer", "bench", *argv,
                        *([] if "--out" in argv else ["--out", str(tmp_path / "b.json")])],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], r.stderr
    assert not (tmp_path / "b.json").exists()


def test_list_names_every_suite(capsys):
    assert main(["bench", "--list"]) == 0
    text = capsys.readouterr().out
    for name in SUITES:
        assert name in text


def test_list_json_and_suites_as_a_comma_list(capsys, tmp_path):
    assert main(["bench", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert set(listed["suites"]) == set(SUITES) and "d768" in listed["sizes"]
    out = tmp_path / "b.json"
    assert main(["bench", "refine,memory", "--size", "dim=16,heads=2,layers=1,ff=32,batch=2,"
                 "seq=8", "--repeats", "1", "--warmup", "0", "--ks", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["suites"] == ["refine", "memory"]


def test_generate_suite_same_ids_same_cache_bytes_and_a_flat_linear_tape():
    """The generate suite's deterministic parts: both libraries generate the same ids (float32)
    with the same bytes of keys and values per token; the linear kernel's tape does not grow
    with the prefix while the softmax kernel's grows linearly."""
    rows = run_suite("generate", MICRO, OPTS)
    pairs = [r for r in rows if r["group"].startswith("generate ")]
    assert {(r["dtype"], r["name"]) for r in pairs} == {
        (d, n) for d in ("float32", "bfloat16") for n in ("splitformer", "transformers")}
    f32 = {r["name"]: r for r in pairs if r["dtype"] == "float32"}
    assert f32["splitformer"]["same_ids"]
    for d in ("float32", "bfloat16"):
        by = {r["name"]: r for r in pairs if r["dtype"] == d}
        assert by["splitformer"]["cache_bytes_per_token"] == \
            by["transformers"]["cache_bytes_per_token"] > 0
        assert by["splitformer"]["decode_ratio"] == pytest.approx(
            by["splitformer"]["decode_tokens_per_s"] / by["transformers"]["decode_tokens_per_s"])
    lin = {(r["kernel"], r["prefix"]): r["cache_bytes"] for r in rows
           if r["group"] == "linear decode"}
    assert lin[("linear", 8)] == lin[("linear", 16)]
    assert lin[("softmax", 16)] == 2 * lin[("softmax", 8)]


MICRO_LLAMA = {"num_key_value_heads": 2, "head_dim": 8, "vocab_size": 100, "rope_theta": 1e4}


def test_generate_suite_on_the_llama_family_same_ids_and_cache_bytes():
    """The Llama rows (the smollm2 size's code path, at a micro shape with random weights):
    both libraries generate the same ids in float32 and bfloat16 (transformers' rotary
    frequencies kept in float32 by the cast, as from_pretrained keeps them) with the same
    bytes of keys and values per token (the H_kv heads), and the rows say which weights."""
    from splitformer.bench.generation import llama_rows

    size = Size(48, 6, 2, 96, 2, 8, "micro-llama")
    rows = llama_rows(size, OPTS, lambda text: None, extra=MICRO_LLAMA, packaged=False)
    cache = [r for r in rows if r.get("group") == "cache decode"]
    rows = [r for r in rows if r.get("group") != "cache decode"]
    assert {(r["dtype"], r["name"]) for r in rows} == {
        (d, n) for d in ("float32", "bfloat16") for n in ("splitformer", "transformers")}
    for d in ("float32", "bfloat16"):
        by = {r["name"]: r for r in rows if r["dtype"] == d}
        assert by["splitformer"]["same_ids"]
        width = 2 if d == "bfloat16" else 4
        assert by["splitformer"]["cache_bytes_per_token"] == \
            by["transformers"]["cache_bytes_per_token"] == 2 * 2 * 2 * 8 * width
        assert by["splitformer"]["prefill_ratio"] == pytest.approx(
            by["transformers"]["prefill_s"] / by["splitformer"]["prefill_s"])
    assert {r["weights"] for r in rows} == {"random"}
    # the cache rows: the full cache holds every token (2 layers x 2 kv heads x 8 x K, V x 4
    # bytes = 256 bytes a token); a policy at budget b keeps ceil(b N) entries per head, each
    # with 8 bytes of weight and coordinate per evaluation and head
    by = {(r["policy"], r["budget"]): r for r in cache}
    assert set(by) == {("full", 1.0), *((p, b) for p in ("streaming", "quadrature")
                                        for b in (0.5, 0.25))}
    assert by["full", 1.0]["entries"] == 56 and by["full", 1.0]["cache_bytes"] == 56 * 256
    for (p, b), r in by.items():
        if p != "full":
            n = math.ceil(b * 56)
            assert r["entries"] == n and r["cache_bytes"] == n * (256 + 2 * 2 * 8), (p, b)
            assert r["peak_bytes"] < by["full", 1.0]["peak_bytes"]
        assert r["context"] == 40 and r["decode_tokens_per_s"] > 0
    with pytest.raises(ValueError, match="SmolLM2's shape"):
        llama_rows(size, OPTS, lambda text: None, extra=MICRO_LLAMA, packaged=True)


def test_cache_rows_with_slack_time_the_compressions_and_the_command_repeats_it():
    """--slack N: the cache rows decode 2 (N + 1) steps and report their mean (the policy
    compresses now and then), the entries after the decode steps stay within budget + N,
    and the recorded command spells out --slack with the other cache-row options."""
    import argparse
    from dataclasses import replace

    import transformers

    import splitformer
    from splitformer.bench.generation import SMOLLM2, _llama_config, cache_rows
    from splitformer.commands.bench import _command, add_arguments

    size = Size(48, 6, 2, 96, 2, 8, "micro-llama")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(_llama_config(size, MICRO_LLAMA)).eval()
    ours = splitformer.from_hf(hf).eval()
    rows = cache_rows(size, ours, 100, replace(OPTS, slack=3, budgets=(0.25,)), lambda t: None)
    by = {r["policy"]: r for r in rows}
    assert set(by) == {"full", "streaming", "quadrature"}
    for p, r in by.items():
        assert r["slack"] == 3 and r["decode_tokens_per_s"] == 1.0 / r["mean_s"]
        assert "mean of 8 (slack 3)" in r["note"]
        if p != "full":  # after 40 + 8 tokens: the capacity ceil(0.25 x 48) = 12, plus slack
            assert 12 <= r["entries"] <= 12 + 3
            # 10 entries after the context, due when 10 + k > ceil(0.25 (40 + k)) + 3: at k = 6
            # (back to 12), next at k = 11, past the 8 steps: one compression, not 8 / 4
            assert r["compressions"] == 1, r["compressions"]
        else:
            assert r["compressions"] == 0
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["generate", "--size", "smollm2", "--slack", "7",
                              "--policies", "h2o,heavy-quadrature", "--budgets", "0.25"])
    cmd = _command(["generate"], [SMOLLM2], args)
    assert "--slack 7" in cmd and "--policies h2o,heavy-quadrature" in cmd
    assert "--budgets 0.25" in cmd and "--contexts 4096,8192" in cmd


def test_smollm2_is_a_size_of_the_generate_suite_only(capsys):
    from splitformer.bench.generation import SMOLLM2
    from splitformer.commands.bench import _sizes_arg

    assert _sizes_arg("smollm2") == [SMOLLM2] and SMOLLM2.seq == 512
    assert main(["bench", "--list"]) == 0
    assert "smollm2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "encoder", "--size", "smollm2", "--repeats", "1"])
    assert exit_.value.code == 2
    assert "generate suite only" in capsys.readouterr().err


def test_the_llama_speed_paths_give_the_bits_of_the_plain_ones(monkeypatch):
    """What the generate suite's Llama rows time: the stacked lifts ([W_Q; W_K; W_V] u and
    [W_g; W_u] u in one product each, Q and K rotated in one call) give the logits and ids of
    the separate products bit for bit, in float32 and bfloat16; the stacked product is used
    only where its probe found the same bits, and parameters moved by Module.to (no longer
    stacked) take the separate products."""
    from splitformer.interop import from_hf
    from splitformer.operators import feature

    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                   num_hidden_layers=2, intermediate_size=256, vocab_size=97,
                                   attn_implementation="sdpa")
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    used = []
    stacked = feature.StackedProduct.__call__

    def counted(self, u, weights, biases):
        out = stacked(self, u, weights, biases)
        used.append(out is not None)
        return out

    def run(model):
        with torch.no_grad():
            return model(ids).logits, model.generate(ids, 5)

    monkeypatch.setattr(feature.StackedProduct, "__call__", counted)
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        ours = from_hf(transformers.LlamaForCausalLM(cfg).to(dtype).eval()).eval()
        used.clear()
        fast = run(ours)
        assert any(used) or not any(feature._SAME_BITS.values())  # unused only where refused
        with monkeypatch.context() as m:
            m.setattr(feature, "_SAME_BITS", {})
            m.setattr(feature, "_same_bits", lambda *a: False)
            used.clear()
            plain = run(ours)
            assert used and not any(used)
        assert torch.equal(fast[0], plain[0]) and torch.equal(fast[1], plain[1])
    used.clear()
    run(ours.to(torch.float64))  # Module.to: the parameters no longer lie stacked
    assert used and not any(used)
