"""Token merging measured (`splitformer bench merge`): the plain ToMe peer against transformers'
BertModel (r = 0: the same output to 1e-5; r > 0: N - L r nodes, sizes adding to N, the class
token never merged, the read-out unmerged by the source map), ToMe's matching on a hand-made
case, proportional attention exact on duplicated nodes, the one library call refusing until
the library merges, the rows of the suite, the break-even length, the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from _optional_data import needs

from splitformer import from_hf
from splitformer.bench import Size
from splitformer.bench.merge_peers import PlainToMeBert, bipartite_soft_matching, merged_length
from splitformer.bench.merge_suite import (
    Setting,
    embed,
    merge_rows,
    ours_merged,
    quality_embedding,
    random_workload,
    sentence_embeddings,
    settings,
)
from splitformer.cli import main
from splitformer.experiments.merging import break_even, curve_table, curves

transformers = pytest.importorskip("transformers")
TINY = "dim=16,heads=2,layers=2,ff=32,batch=2,seq=12"


def tiny_bert(attn: str = "sdpa", layers: int = 3) -> torch.nn.Module:
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=128, attn_implementation=attn)
    torch.manual_seed(0)
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def ids(batch: int = 2, n: int = 33, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 100, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_peer_at_r0_is_transformers_bert(attn):
    bert, x = tiny_bert(attn), ids()
    mask = torch.ones_like(x)
    with torch.no_grad():
        reference = bert(input_ids=x, attention_mask=mask).last_hidden_state
        for proportional in (False, True):
            out = PlainToMeBert(bert, 0, proportional=proportional).eval()(x, mask)
            assert (out - reference).abs().max() < 1e-5


def test_peer_merges_r_per_layer_and_unmerges_by_the_source_map():
    bert, x = tiny_bert(), ids(n=33)
    peer = PlainToMeBert(bert, 4).eval()
    with torch.no_grad():
        merged = peer.merged(x)
        out = peer(x)
    assert merged.state.shape == (2, 33 - 3 * 4, 32) and merged_length(33, 4, 3) == 21
    assert torch.equal(merged.sizes.sum(1), torch.full((2,), 33.0))
    assert (merged.sizes >= 1).all() and torch.equal(merged.sizes, merged.sizes.round())
    assert (merged.sizes[:, 0] == 1).all() and (merged.source[:, 0] == 0).all()  # [CLS]
    counts = torch.stack([torch.bincount(s, minlength=21) for s in merged.source]).float()
    assert torch.equal(counts, merged.sizes)  # the source map agrees with the sizes
    assert out.shape == (2, 33, 32)
    assert torch.equal(out[0], merged.state[0][merged.source[0]])
    # mean pooling of the unmerged read-out = the size-weighted mean of the merged nodes
    s = merged.sizes[..., None]
    weighted = F.normalize((merged.state * s).sum(1) / s.sum(1), dim=-1)
    assert torch.allclose(sentence_embeddings(out, torch.ones(2, 33)), weighted, atol=1e-6)


def test_the_merge_is_tomes_merge_wavg():
    bert, x = tiny_bert(), ids(n=40)
    with torch.no_grad():
        fast = PlainToMeBert(bert, 6, proportional=True).eval().merged(x)
        literal = PlainToMeBert(bert, 6, proportional=True, literal=True).eval().merged(x)
    assert torch.equal(fast.sizes, literal.sizes) and torch.equal(fast.source, literal.source)
    assert (fast.state - literal.state).abs().max() < 1e-5
    metric = torch.randn(3, 11, 4, generator=torch.Generator().manual_seed(3))
    size = torch.randint(1, 5, (3, 11, 1)).float()
    value = torch.randn(3, 11, 5, generator=torch.Generator().manual_seed(4))
    m = bipartite_soft_matching(metric, 4)
    assert m.targets[2].tolist() == [1, 1, 2, 2]  # two sources join one target: covered
    mean, s = m.merge_mean(value, size)
    assert torch.equal(s, m.merge_sum(size))
    assert torch.allclose(mean, m.merge_sum(value * size) / m.merge_sum(size), atol=1e-6)


def test_peer_caps_r_at_half_the_unprotected_nodes():
    bert, x = tiny_bert(), ids(n=17)
    with torch.no_grad():
        merged = PlainToMeBert(bert, 100).eval().merged(x)
    assert merged.state.shape[1] == merged_length(17, 100, 3) == 3  # 17 -> 9 -> 5 -> 3
    assert (merged.sizes[:, 0] == 1).all()


def test_bipartite_soft_matching_merges_the_most_similar_edges():
    # A = nodes 0, 2, 4 (0 the class token); B = nodes 1, 3
    metric = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.05], [1.0, 0.0], [0.1, 1.0]]])
    m = bipartite_soft_matching(metric, 1)
    assert m.sources.tolist() == [[1]] and m.targets.tolist() == [[1]]  # node 2 -> node 3
    assert m.new_index().tolist() == [[0, 2, 3, 3, 1]]  # [A kept: 0, 4] then [B: 1, 3]
    m2 = bipartite_soft_matching(metric, 5)  # capped at (5 - 1) // 2 = 2: 4 joins 1
    assert sorted(m2.sources[0].tolist()) == [1, 2] and m2.new_index().tolist() == [
        [0, 1, 2, 2, 1]]
    x = torch.arange(5.0).view(1, 5, 1)
    assert m.merge_sum(x).flatten().tolist() == [0.0, 4.0, 1.0, 5.0]
    assert bipartite_soft_matching(metric[:, :2], 3) is None


def test_proportional_attention_is_exact_on_duplicated_nodes():
    """Two copies of a node merged into one of size 2 leave every other node's attention
    output unchanged with proportional attention (softmax(a + log s)), not without it."""
    bert = tiny_bert()
    layer = bert.encoder.layer[0]
    peer = PlainToMeBert(bert, 1, proportional=True).eval()
    plain = PlainToMeBert(bert, 1).eval()
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(2))
    doubled = torch.cat([x, x[:, 3:4]], dim=1)
    size = torch.ones(1, 6, 1)
    size[0, 3] = 2
    with torch.no_grad():
        fine, _ = peer._attention(layer, doubled, torch.ones(1, 7, 1))
        coarse, _ = peer._attention(layer, x, size)
        plain_coarse, _ = plain._attention(layer, x, torch.ones(1, 6, 1))
    assert (fine[:, :6] - coarse).abs().max() < 1e-5
    assert (fine[:, :6] - plain_coarse).abs().max() > 1e-3


def test_peer_refuses_padding_training_and_bad_r():
    bert, x = tiny_bert(), ids()
    mask = torch.ones_like(x)
    mask[0, -1] = 0
    with pytest.raises(ValueError, match="padding"):
        PlainToMeBert(bert, 2).eval()(x, mask)
    with pytest.raises(RuntimeError, match="eval"):
        PlainToMeBert(bert, 2).train()(x)
    with pytest.raises(ValueError, match="r must be"):
        PlainToMeBert(bert, -1)


def test_the_library_call_merges_and_reads_out_on_the_input_grid():
    ours = from_hf(tiny_bert()).eval()
    assert ours_merged(ours, 0, proportional=True) is ours
    merged = ours_merged(ours, 4, proportional=True)
    with torch.no_grad():
        plain = ours(input_ids=ids(), attention_mask=torch.ones(2, 33)).last_hidden_state
        out = merged(input_ids=ids(), attention_mask=torch.ones(2, 33)).last_hidden_state
    assert out.shape == (2, 33, 32)  # read out unmerged to the input's N
    assert (out - plain).abs().max() > 1e-4  # and it did merge


def test_settings_names_and_refusals():
    chosen = settings((0, 16, 16, 32), families=("peer",))
    assert [s.name for s in chosen] == ["transformers BertModel", "ToMe peer r=0",
                                        "ToMe peer r=16", "ToMe peer r=16 prop",
                                        "ToMe peer r=32", "ToMe peer r=32 prop"]
    assert Setting("peer", 0, True).key == Setting("peer", 0, False).key
    for bad, word in ((dict(family="tome"), "family"), (dict(family="peer", r=-1), "r must"),
                      (dict(family="transformers", r=2), "does not merge")):
        with pytest.raises(ValueError, match=word):
            Setting(**bad)


def test_embed_groups_by_length_without_padding():
    bert = tiny_bert()
    seqs = [ids(1, n, seed=n)[0] for n in (5, 9, 5, 7)]
    with torch.no_grad():
        got = embed(PlainToMeBert(bert, 0).eval(), seqs, batch=1)
        for seq, e in zip(seqs, got, strict=True):
            h = bert(input_ids=seq[None]).last_hidden_state
            assert torch.allclose(F.normalize(h.mean(1), dim=-1)[0], e, atol=1e-6)


def test_merge_rows_on_a_random_bert():
    rows = merge_rows(random_workload(Size(32, 4, 2, 64, 2, 16, "tiny-merge")), (0, 4),
                      repeats=1, warmup=0)
    timed = {r["name"]: r for r in rows if "median_s" in r}
    assert {"transformers BertModel", "ToMe peer r=0", "ToMe peer r=4", "ToMe peer r=4 prop",
            "splitformer r=0"} <= set(timed)
    for r in timed.values():
        base = timed[r["name"].split(" r=")[0] + " r=0"] if r["r"] else None
        if base is not None:
            assert r["speedup"] == pytest.approx(base["median_s"] / r["median_s"])
        assert r["tokens_out"] == (16 - 2 * 4 if r["r"] else 16)
    assert timed["ToMe peer r=0"]["mean_cosine"] == pytest.approx(1.0, abs=1e-9)
    assert timed["ToMe peer r=4"]["mean_cosine"] < 1 - 1e-6
    skipped = [r for r in rows if "skipped" in r]
    assert bool(skipped) == ("with_token_merging" not in dir(from_hf(tiny_bert())))


def test_quality_with_r_scaled_to_each_length():
    from dataclasses import replace

    bert = tiny_bert()
    workload = replace(random_workload(Size(32, 4, 3, 64, 2, 16)), bert=bert, quality_r_at=32)
    seqs = [ids(1, n, seed=n)[0] for n in (16, 40, 64)]
    setting = Setting("peer", 8, proportional=True)
    got = quality_embedding(workload, setting, None, None)(seqs)
    with torch.no_grad():
        for seq, e in zip(seqs, got, strict=True):  # r = round(8 N / 32): 4, 10, 16
            peer = PlainToMeBert(bert, round(8 * len(seq) / 32), proportional=True).eval()
            assert torch.allclose(embed(peer, [seq])[0], e, atol=1e-6)
    fixed = quality_embedding(replace(workload, quality_r_at=None), setting,
                              PlainToMeBert(bert, 8, proportional=True), None)(seqs)
    assert torch.allclose(fixed[1:2], embed(PlainToMeBert(bert, 8, proportional=True),
                                            seqs[1:2]), atol=1e-6)
    assert not torch.allclose(fixed[1], got[1], atol=1e-3)


def test_break_even_interpolates_in_log_length():
    def row(seq, speedup, r=16):
        return {"kind": "speed", "family": "peer", "r": r, "proportional": False, "seq": seq,
                "speedup": speedup}

    rows = [row(64, 0.8), row(128, 1.2), row(256, 1.5), row(64, 1.1, 8), row(128, 1.2, 8),
            row(64, 0.9, 4), row(128, 0.95, 4)]
    even = break_even(rows)
    assert even[("peer", 16, False)] == "91"  # 64 * 2 ** 0.5
    assert even[("peer", 8, False)] == "< 64" and even[("peer", 4, False)] == "> 128"



def test_bench_merge_help_and_list(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--rs" in text and "--tokens" in text and "merge" in text
    assert main(["bench", "--list"]) == 0
    assert "merge" in capsys.readouterr().out


def test_bench_merge_runs_at_a_size(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["bench", "merge", "--size", TINY, "--repeats", "1", "--warmup", "0", "--rs",
                 "4", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(out.read_text()) and data["complete"]
    assert data["options"]["rs"] == [0, 4]
    assert "--rs 0,4" in data["command"] and "--size" in data["command"]
    names = {r["name"] for r in data["rows"] if "median_s" in r}
    assert {"ToMe peer r=4", "ToMe peer r=4 prop", "splitformer r=0"} <= names
    assert main(["bench", "merge", "--size", TINY, "--repeats", "1", "--warmup", "0",
                 "--rs", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "splitformer bench merge" in text and f"wrote {out}" in text


@pytest.mark.parametrize("argv, flag", [(["merge", "--rs", "-1"], "--rs"),
                                        (["merge", "--rs", "a"], "--rs"),
                                        (["merge", "--tokens", "1000"], "--tokens"),
                                        (["merge", "--tokens", "2"], "--tokens"),
                                        (["merge", "--size", TINY, "--tokens", "64"],
                                         "--tokens")])
def test_bench_merge_bad_inputs_are_one_line_and_exit_2(argv, flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", *argv, "--out", str(tmp_path / "b.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err.strip().splitlines()[-1] and "Traceback" not in err, err
    assert not (tmp_path / "b.json").exists()


def test_bench_merge_bad_input_from_the_shell_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "splitformer", "bench", "merge", "--rs", "-1",
                        "--out", str(tmp_path / "b.json")], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--rs" in lines[0], r.stderr


@pytest.mark.slow
@needs("minilm", "text")
def test_bench_merge_on_minilm(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["bench", "merge", "--tokens", "32", "--rs", "8", "--repeats", "1",
                 "--warmup", "0", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sizes"] == {} and "--size" not in data["command"]
    rows = {r["name"]: r for r in data["rows"] if "median_s" in r}
    assert rows["transformers BertModel"]["size"] == "all-MiniLM-L6-v2"
    assert rows["ToMe peer r=0"]["lee_human_spearman"] == pytest.approx(0.508, abs=5e-4)
    assert rows["ToMe peer r=0"]["lee_fidelity_spearman"] == pytest.approx(1.0)
    assert rows["ToMe peer r=8"]["tokens_out"] == merged_length(32, 8, 6)
    assert 0 < rows["ToMe peer r=8"]["mean_cosine"] < 1


@pytest.mark.slow
@needs("minilm", "text")
def test_the_grid_appends_as_it_goes_and_resumes(tmp_path):
    from splitformer.experiments.merging import grid_table, run_grid
    from splitformer.files import read_jsonl

    out = tmp_path / "grid.jsonl"
    kw = dict(rs=(0, 8), lengths=(16, 24), passages=2, batch=2, repeats=1, warmup=0,
              families=("peer",), full_quality=False)
    rows = run_grid(out, **kw)
    speed = [r for r in rows if r["kind"] == "speed"]
    quality = [r for r in rows if r["kind"] == "quality"]
    assert len(speed) == 2 * 4 and len(quality) == 4  # transformers, r=0, r=8, r=8 prop
    assert {r["seq"] for r in speed} == {16, 24}
    assert all(r["lee_fidelity_spearman"] == pytest.approx(1.0) for r in quality if not r["r"])
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10])  # a torn last line
    again = run_grid(out, **kw)
    assert len(again) == len(rows) and read_jsonl(out) == again  # only the torn row redone
    assert grid_table(again, quality_length=16).row_count == 4


def test_bench_merge_json_records_the_path_and_the_r_that_ran(tmp_path, capsys):
    """The JSON said --paths train,eval,no_grad (the merge suite times no_grad only) and the
    r asked for: it records the path timed, and each row's r_used, the nodes each layer
    merged after the clip to half the unprotected nodes left, which is what the library's
    own trace of the same model shows."""
    from splitformer.bench.sizes import parse_size

    out = tmp_path / "m.json"
    assert main(["bench", "merge", "--size", TINY, "--repeats", "1", "--warmup", "0", "--rs",
                 "100", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "--paths no_grad " in data["command"] and "train" not in data["command"]
    assert data["options"]["paths"] == ["no_grad"]
    rows = {r["name"]: r for r in data["rows"] if "median_s" in r}
    assert {r["path"] for r in rows.values()} == {"no_grad"}
    for name in ("ToMe peer r=100", "splitformer r=100 prop", "splitformer state r=100"):
        row = rows[name]  # 12 tokens, 2 layers, [CLS] protected: 12 -> 7 -> 4
        assert (row["r"], row["r_used"], row["tokens_out"]) == (100, [5, 3], 4), row
    assert rows["splitformer r=0"]["r_used"] == [0, 0]
    workload = random_workload(parse_size(TINY))
    ours = ours_merged(from_hf(workload.bert).eval(), 100, proportional=True)
    x = workload.passages[12]
    with torch.no_grad():
        trace = ours.merge_trace(input_ids=x, attention_mask=torch.ones_like(x))
    assert [12 - trace.nodes[0], trace.nodes[0] - trace.nodes[1]] == [5, 3]


def test_bench_merge_table_keeps_its_width_when_piped(monkeypatch, capsys):
    """Piped (stdout not a terminal) rich fell back to 80 columns and folded every cell of
    the merge table; the tables print at TABLE_WIDTH columns there, as benchmarks/ do
    (COLUMNS, when set, still wins)."""
    from splitformer.commands import bench

    monkeypatch.delenv("COLUMNS", raising=False)
    row = {"suite": "merge", "size": "all-MiniLM-L6-v2", "group": "256 tokens, batch 8",
           "path": "no_grad", "name": "splitformer state r=32 prop", "splitformer": True,
           "family": "splitformer-state", "r": 32, "r_used": [32] * 5 + [16], "seq": 256,
           "tokens_out": 64, "median_s": 0.33, "speedup": 1.52,
           "ratios": {"splitformer state r=0": 0.66}, "mean_cosine": 0.971,
           "lee_fidelity_spearman": 0.944, "lee_human_spearman": 0.499}
    bench.print_tables([row], "merge", {})
    lines = capsys.readouterr().out.splitlines()
    assert 80 < max(map(len, lines)) <= bench.TABLE_WIDTH
    assert any("splitformer state r=32 prop" in line for line in lines), lines
    assert any("0.660x splitformer state r=0" in line for line in lines), lines
    assert "r clipped to 32,32,32,32,32,16 per layer" in " ".join(
        " ".join(line.split("│")[-2].split()) for line in lines if line.count("│") > 2)
    monkeypatch.setenv("COLUMNS", "70")
    bench.print_tables([row], "merge", {})
    assert max(map(len, capsys.readouterr().out.splitlines())) <= 70


def test_curves_read_every_family_against_one_reference_and_interpolate():
    """The r = 0 rows of two families run the same network at 1.0 s and 1.2 s: both curves
    use their median (1.1 s), so equal times at r > 0 are equal throughputs; the table reads
    ToMe's curve by linear interpolation and bolds a rule above it in both measures."""
    def speed(family, r, t, cos=1.0):
        return {"kind": "speed", "seq": 8, "family": family, "r": r, "proportional": False,
                "median_s": t, "mean_cosine": cos}

    def quality(family, r, lee):
        return {"kind": "quality", "lee_r_at": None, "family": family, "r": r,
                "proportional": False, "lee_fidelity_spearman": lee}
    rows = [speed("peer", 0, 1.0), speed("splitformer-state", 0, 1.2),
            speed("peer", 2, 0.55, 0.9), quality("peer", 2, 0.8),
            speed("splitformer-state", 2, 0.55, 0.95), quality("splitformer-state", 2, 0.85)]
    c = curves(rows, 8)
    assert c[("peer", False)] == c[("splitformer-state", False)][:1] + [(2.0, 0.9, 0.8)]
    assert c[("splitformer-state", False)][1] == (2.0, 0.95, 0.85)
    table = curve_table(rows, 8, at=(1.5,))
    assert "| 1.50x | without | 0.900 / 0.950 | **0.925 / 0.975** |" in table
    with pytest.raises(ValueError, match="no r = 0"):
        curves(rows, 16)
    with pytest.raises(ValueError, match="lee_r_at = 256 .the rows have None"):
        curves(rows, 8, 256)


def test_each_family_runs_its_own_metric_and_a_metric_option_is_refused():
    """The family is the metric (METRIC_OF): every splitformer family's network merges with
    the library's metric of that name, and a metric passed as an option is refused (it would
    run one rule under another family's label)."""
    from splitformer.bench.merge_suite import METRIC_OF, OURS, encoder

    bert = tiny_bert()
    ours = from_hf(bert)
    x = ids()
    for family in OURS:
        net = encoder(Setting(family, 4, True), bert, ours)
        want = ours.with_token_merging(4, metric=METRIC_OF[family])
        with torch.no_grad():
            assert torch.equal(net(x, torch.ones_like(x)), want(input_ids=x).last_hidden_state)
        with pytest.raises(ValueError, match="the metric is the family's"):
            encoder(Setting(family, 4, True), bert, ours, metric="state")
