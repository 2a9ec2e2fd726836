"""The evaluation harness of issue 18 (experiments.depth_eval): the held-out King James part and
the Lee documents never in the healing text (token sequences searched in the whole healing
stream, with a positive control), the healing windows, the evaluation keys against hand-made
embeddings (a rotation keeps the pair Spearmans, not the cosines), the interleaved throughput's
bookkeeping, and paraphrase-MiniLM-L3-v2: its ONNX initializers mapped into a transformers
BertModel give onnxruntime's last hidden state to 1e-5 (padded batches too), its tokenizer
is all-MiniLM-L6-v2's (word-embedding rows of the same id agree), paraphrases score higher than
unrelated sentences."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from _optional_data import needs

from splitformer.experiments import depth_eval as de
from splitformer.experiments import text_benchmarks as tb
from splitformer.training.data import DatasetError

needs_text = needs("minilm", "text", "gensim")
needs_l3 = needs("onnx-l3", "minilm")


@pytest.fixture(scope="module")
def minilm():
    return tb.load_minilm()


@pytest.fixture(scope="module")
def texts(minilm):
    return de.held_out(minilm)


def _grams(ids: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit polynomial hash of every n-token window of a 1-D id array (a collision can only
    report a shared window that is not there: the tests stay on the safe side)."""
    ids = ids.astype(np.uint64)
    h = np.zeros(len(ids) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * np.uint64(1_000_003) + ids[k:len(ids) - n + 1 + k]
    return h


def _shared(texts: list[np.ndarray], pool: np.ndarray, n: int) -> int:
    """How many n-token windows of ``texts`` are in ``pool`` (sorted ``_grams`` of a stream)."""
    grams = np.concatenate([_grams(t, n) for t in texts if len(t) >= n])
    where = np.minimum(np.searchsorted(pool, grams), len(pool) - 1)
    return int((pool[where] == grams).sum())


@pytest.fixture(scope="module")
def pools(minilm):
    """The sorted hashes of the healing stream's 8-, 24- and 30-token windows."""
    stream = de.healing_stream(minilm.tokenizer).numpy()
    return {n: np.sort(_grams(stream, n)) for n in (8, 24, 30)}


@needs("text")
def test_kjv_split_holds_out_hebrews_to_revelation():
    healing, held = de.kjv_split()
    assert len(healing) == 30022 and len(held) == 1147
    assert held[0] == de.HELD_OUT_TITLE and held[1].startswith("God, who at sundry times")
    assert held[-1] == "The grace of our Lord Jesus Christ be with you all. Amen."
    assert healing[-1].startswith("The grace of our Lord Jesus Christ be with your spirit.")
    with pytest.raises(DatasetError, match="make data"):
        de.kjv_split(["In the beginning", "God created"])


@needs_text
def test_no_held_out_text_in_the_healing_stream(minilm, texts, pools):
    passages = [row[1:-1].numpy() for row in texts.kjv_list]
    lee = [d[1:-1].numpy() for d in texts.lee]
    # Hebrews quotes the Old Testament: some 16-token sequences recur; none of 24
    assert _shared(passages, pools[24], 24) == 0
    assert _shared(lee, pools[8], 8) == 0
    # positive control: passages of the healing part are found
    healing, _ = de.kjv_split()
    control = tb.kjv_passages(minilm.tokenizer, 128, 4, healing)
    assert _shared([row[1:-1].numpy() for row in control], pools[24], 24) == 4 * (126 - 23)


@needs_text
def test_healing_stream_is_kjv_then_the_lee_background(minilm):
    stream = de.healing_stream(minilm.tokenizer)
    assert de.healing_stream(minilm.tokenizer) is stream  # cached
    tok = minilm.tokenizer
    head = tok("The First Book of Moses, called Genesis", add_special_tokens=False)["input_ids"]
    tail = tok(tb.lee_background()[-1], add_special_tokens=False, verbose=False)["input_ids"]
    assert stream[:len(head)].tolist() == head and stream[-len(tail):].tolist() == tail
    # the token counts of the two parts (module doc)
    assert len(stream) == 975445 + 73180


@needs_text
def test_healing_windows(minilm, pools):
    tok = minilm.tokenizer
    w = de.healing_windows(tok, 32, 500, seed=3)
    assert w.shape == (500, 32) and w.dtype == torch.long
    assert (w[:, 0] == tok.cls_token_id).all() and (w[:, -1] == tok.sep_token_id).all()
    assert torch.equal(w, de.healing_windows(tok, 32, 500, seed=3))
    assert not torch.equal(w, de.healing_windows(tok, 32, 500, seed=4))
    stream = de.healing_stream(tok).numpy()
    bodies = [b for b in w[:, 1:-1].numpy()]
    # every body is a slice of the stream: its 30-token hash is among the stream's
    assert _shared(bodies, pools[30], 30) == 500
    # both sources are drawn (the background is 7% of the stream's tokens)
    assert 5 < _shared(bodies, np.sort(_grams(stream[-73180:], 30)), 30) < 100
    for length, count, seed, word in ((2, 1, 0, "length"), (8, 0, 0, "count"),
                                      (8, True, 0, "count"), (8, 1, 0.5, "seed"),
                                      (len(stream) + 3, 1, 0, "length must be at most")):
        with pytest.raises(ValueError, match=word):
            de.healing_windows(tok, length, count, seed)
    # news=f: round(f * count) windows within the background news, the rest within the Bible
    news_pool = np.sort(_grams(stream[-73180:], 30))
    for f, want in ((0.0, 0), (0.5, 250), (1.0, 500)):
        wf = de.healing_windows(tok, 32, 500, seed=3, news=f)
        bodies = [b for b in wf[:, 1:-1].numpy()]
        assert _shared(bodies, pools[30], 30) == 500
        assert _shared(bodies, news_pool, 30) == want, f
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="news must be"):
            de.healing_windows(tok, 32, 5, news=bad)
    # aligned: every news window starts at a background document's first tokens
    from splitformer.experiments import text_benchmarks as tb

    firsts = {tuple(tok(d, add_special_tokens=False)["input_ids"][:8])
              for d in tb.lee_background()}
    wa = de.healing_windows(tok, 32, 500, seed=3, news=0.5, aligned=True)
    bodies = [b for b in wa[:, 1:-1].numpy()]
    in_news = [b for b in bodies if _shared([b], news_pool, 30)]
    assert len(in_news) == 250 and all(tuple(b[:8]) in firsts for b in in_news)
    plain = [b for b in wf[:, 1:-1].numpy()]  # news=1.0, uniform starts: rarely a first token
    assert sum(tuple(b[:8]) in firsts for b in plain) < 10
    with pytest.raises(ValueError, match="aligned"):
        de.healing_windows(tok, 32, 5, aligned=True)


@needs_text
@needs("wiki")
def test_wiki_windows_replace_others_and_hold_no_evaluation_text(minilm, texts, pools):
    tok = minilm.tokenizer
    wiki = de.wiki_stream(tok).numpy()
    assert de.wiki_stream(tok) is de.wiki_stream(tok)  # cached
    head = tok("Anarchism is a political philosophy", add_special_tokens=False)["input_ids"]
    assert wiki[:len(head)].tolist() == head and len(wiki) == 566453  # docs/depth.md
    # no evaluation text in the Wikipedia healing text (positive control: its own windows)
    pool8, pool24 = np.sort(_grams(wiki, 8)), np.sort(_grams(wiki, 24))
    assert _shared([d[1:-1].numpy() for d in texts.lee], pool8, 8) == 0
    assert _shared([row[1:-1].numpy() for row in texts.kjv_list], pool24, 24) == 0
    assert _shared([wiki[1000:1100]], pool24, 24) == 100 - 23
    # wiki=0 draws what healing_windows drew before the option (SHA-256 of the windows that
    # commit c7e8305, before it, drew); wiki=f replaces round(f count)
    import hashlib

    for news, digest in ((None, "b14077ed4beb2136"), (0.5, "3e46245385db9293")):
        old = de.healing_windows(tok, 32, 400, seed=3, news=news)
        assert hashlib.sha256(old.numpy().tobytes()).hexdigest()[:16] == digest
    # the fractions rounded as one: 15 windows, half news and half Wikipedia, are 15
    odd = de.healing_windows(tok, 32, 15, seed=3, news=0.5, wiki=0.5)
    assert odd.shape == (15, 32)
    with pytest.raises(ValueError, match="gives no window"):
        de.healing_windows(tok, 32, 15, wiki=0.01)
    wiki30 = np.sort(_grams(wiki, 30))
    for news in (None, 0.5):
        plain = de.healing_windows(tok, 32, 400, seed=3, news=news)
        assert torch.equal(plain, de.healing_windows(tok, 32, 400, seed=3, news=news, wiki=0.0))
        w = de.healing_windows(tok, 32, 400, seed=3, news=news, wiki=0.25)
        bodies = [b for b in w[:, 1:-1].numpy()]
        assert _shared(bodies, wiki30, 30) == 100
        assert _shared(bodies, pools[30], 30) == 300  # the rest from the stream
        if news is not None:
            news_pool = np.sort(_grams(de.healing_stream(tok).numpy()[-73180:], 30))
            assert _shared(bodies, news_pool, 30) == 200
    for bad, word in ((-0.1, "wiki must be"), (1.5, "wiki must be"), (True, "wiki must be"),
                      (0.6, "news \\+ wiki")):
        with pytest.raises(ValueError, match=word):
            de.healing_windows(tok, 32, 5, news=0.5, wiki=bad)


@needs_text
def test_held_out_texts(minilm, texts):
    assert list(texts.kjv) == [128, 256]
    assert texts.kjv[128].shape == (64, 128) and texts.kjv[256].shape == (16, 256)
    assert len(texts.kjv_list) == 80 and len(texts.lee) == 50
    first = minilm.tokenizer(de.HELD_OUT_TITLE + " God, who at sundry times",
                             add_special_tokens=False)["input_ids"]
    assert texts.kjv[128][0, 1:1 + len(first)].tolist() == first
    assert texts.lee[0].tolist() == minilm.tokenize(tb.lee_documents()[:1])[0].tolist()


class _Lookup:
    """An embedding function that returns given rows for known id sequences."""

    def __init__(self, seqs, rows) -> None:
        self.table = {tuple(s.tolist()): r for s, r in zip(seqs, rows, strict=True)}

    def __call__(self, seqs):
        return torch.stack([self.table[tuple(s.tolist())] for s in seqs])


@pytest.fixture(scope="module")
def evaluation(minilm, texts):
    """The evaluation on 8 + 2 of the held-out passages (and the 50 Lee documents)."""
    few = de.HeldOut({128: texts.kjv[128][:8], 256: texts.kjv[256][:2]}, texts.lee)
    return de.Evaluation(minilm, texts=few, full=False)


@needs_text
def test_evaluation_keys_and_the_reference_against_itself(evaluation):
    texts = evaluation.texts
    ref = _Lookup(texts.kjv_list + texts.lee,
                  torch.cat([evaluation.reference_kjv, evaluation.reference_lee]))
    s = evaluation(ref)
    assert tuple(s) == de.KEYS
    for k in de.KEYS[:-1]:
        assert s[k] == pytest.approx(1.0, abs=1e-12), k
    assert s["lee_human_spearman"] == pytest.approx(0.508, abs=5e-4)


@needs_text
def test_a_rotation_keeps_the_pair_spearmans_not_the_cosines(evaluation):
    texts = evaluation.texts
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(384, 384, generator=g, dtype=torch.float64))
    e = torch.cat([evaluation.reference_kjv, evaluation.reference_lee]).double()
    s = evaluation(_Lookup(texts.kjv_list + texts.lee, e @ q))
    assert s["kjv_pair_spearman"] == pytest.approx(1.0, abs=1e-9)
    assert s["lee_fidelity_spearman"] == pytest.approx(1.0, abs=1e-9)
    assert s["lee_human_spearman"] == pytest.approx(0.508, abs=5e-4)
    assert abs(s["mean_cosine"]) < 0.2 and abs(s["lee_mean_cosine"]) < 0.2
    # the parts: a flip of the 256-token passages only
    flip = e.clone()
    flip[8:10] *= -1
    s = evaluation(_Lookup(texts.kjv_list + texts.lee, flip))
    assert s["kjv128_mean_cosine"] == pytest.approx(1.0) and s["lee_mean_cosine"] == \
        pytest.approx(1.0)
    assert s["kjv256_mean_cosine"] == pytest.approx(-1.0)
    assert s["kjv_mean_cosine"] == pytest.approx((8 - 2) / 10)
    assert s["mean_cosine"] == pytest.approx((8 - 2 + 50) / 60)
    with pytest.raises(ValueError, match=r"\(10, d\) tensor"):
        evaluation(lambda seqs: torch.zeros(3, 384))


def test_throughput_bookkeeping():
    calls = {"a": 0, "b": 0}
    threads = torch.get_num_threads()

    def fn(name):
        def run(ids, mask):
            assert ids.shape == mask.shape == (2, ids.shape[1]) and not torch.is_grad_enabled()
            calls[name] += 1
            return (ids * mask).sum()
        return run

    inputs = {16: torch.zeros(4, 16, dtype=torch.long), 32: torch.zeros(4, 32, dtype=torch.long)}
    out = de.throughput({"a": fn("a"), "b": fn("b")}, lengths=(16, 32), batch=2, repeats=3,
                        warmup=2, threads=2, baseline="b", inputs=inputs)
    assert calls == {"a": 2 * 5, "b": 2 * 5} and torch.get_num_threads() == threads
    assert set(out) == {"a", "b"} and set(out["a"]) == {16, 32}
    for n in (16, 32):
        assert out["b"][n]["speedup"] == 1.0
        assert out["a"][n]["speedup"] == out["b"][n]["median_s"] / out["a"][n]["median_s"]
        assert out["a"][n]["min_s"] <= out["a"][n]["median_s"] <= out["a"][n]["max_s"]
    with pytest.raises(ValueError, match="baseline must be one of"):
        de.throughput({"a": fn("a")}, baseline="c", inputs=inputs, lengths=(16,))
    with pytest.raises(ValueError, match="no ids of length"):
        de.throughput({"a": fn("a")}, inputs=inputs, lengths=(64,))
    with pytest.raises(ValueError, match="fns must name"):
        de.throughput({})


# -- paraphrase-MiniLM-L3-v2 ------------------------------------------------------------------

@pytest.fixture(scope="module")
def l3():
    return de.paraphrase_l3(threads=1)


@pytest.fixture(scope="module")
def l3_bert(l3):
    return de.paraphrase_l3_bert(l3.path)


SENTENCES = ["A man is playing a guitar.", "Someone plays the guitar.",
             "The stock market fell sharply today.",
             "In the beginning God created the heaven and the earth."]


@needs_l3
def test_l3_weights_in_transformers_equal_onnxruntime(minilm, l3, l3_bert):
    c = l3_bert.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) \
        == (3, 384, 12, 1536)
    assert c.vocab_size == len(minilm.tokenizer) == 30522 and c.hidden_act == "gelu"
    batch = minilm.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (mask == 0).any()  # a padded batch
    with torch.no_grad():
        theirs = l3_bert(input_ids=ids, attention_mask=mask).last_hidden_state
    ours = l3.forward(ids, mask)
    keep = mask.bool()
    assert (theirs - ours)[keep].abs().max() < 1e-5
    # the graph's own mean pooling over the mask, normalised, is the sentence embedding
    pooled = l3.session.run([l3.pooled], {"input_ids": ids.numpy(),
                                          "attention_mask": mask.numpy()})[0]
    pooled = torch.nn.functional.normalize(torch.from_numpy(pooled), dim=-1)
    assert (pooled - l3.embed(minilm.tokenize(SENTENCES))).abs().max() < 1e-5


@needs_l3
def test_l3_reads_all_minilm_l6_v2s_token_ids(minilm, l3, l3_bert):
    # the two models embed the same token for the same id: their word-embedding rows agree
    # (both descend from one MiniLM); a shift by one id breaks it
    w3 = l3_bert.embeddings.word_embeddings.weight
    w6 = minilm.model.embeddings.word_embeddings.weight
    cos = torch.nn.functional.cosine_similarity
    assert cos(w3, w6, dim=-1).mean() > 0.8 and cos(w3, w6.roll(1, 0), dim=-1).mean() < 0.2
    e = l3.embed(minilm.tokenize(SENTENCES))
    assert torch.allclose(e.norm(dim=-1), torch.ones(4), atol=1e-6)
    sim = e @ e.T
    assert sim[0, 1] > 0.6 and sim[0, 1] > 3 * sim[0, 2:].abs().max()


@needs_l3
@needs_text
def test_l3_embeds_alike_in_both_runtimes(texts, l3, l3_bert):
    seqs = [texts.kjv[128][0], texts.kjv[256][0], *texts.lee[:4]]
    a, b = l3.embed(seqs), de.minilm_embed(l3_bert)(seqs)
    assert a.shape == (6, 384) and (a - b).abs().max() < 1e-5


@needs("onnx")  # onnx.load reads the file
def test_onnx_reader_refuses_other_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x0f\x00")  # field 1, wire type 7
    with pytest.raises(DatasetError, match="not an ONNX model"):
        de.onnx_graph(bad)
    bad.write_bytes(b"\x08\x07")  # field 1 = 7 (ir_version), no graph
    with pytest.raises(DatasetError, match="no ONNX graph"):
        de.onnx_graph(bad)


def test_without_onnx_or_the_model_package_the_reader_names_make_data(tmp_path, monkeypatch):
    import importlib.util
    from importlib import metadata

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnx" else real(name, *a))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07")
    with pytest.raises(DatasetError, match=r"needs the onnx package: run `make data`"):
        de.onnx_graph(bad)

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(DatasetError, match="make data"):
        de.paraphrase_l3_path()


@needs_l3
@needs_text
def test_depth_eval_never_imports_gensim(minilm, l3_bert):
    # after the healing stream, the held-out texts and the ONNX graph were read (fixtures)
    de.healing_stream(minilm.tokenizer)
    assert "gensim" not in sys.modules


def test_the_report_command_names_make_data(monkeypatch, capsys):
    def missing(*_a, **_k):
        raise DatasetError("the reference needs X: run `make data`")

    monkeypatch.setattr(de, "report", missing)
    with pytest.raises(SystemExit) as e:
        de.main(["--quick"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make data" in err
