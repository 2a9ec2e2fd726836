"""The offline text benchmarks (gensim 4.4.0's test data, read as files), the King James
passages and the sentence embeddings of all-MiniLM-L6-v2: the readers' counts and orders
against the files, a missing file naming `make data`, gensim never imported, the embeddings of
splitformer.from_hf equal to transformers' to 1e-5, the unmerged human Lee-50 Spearman 0.508,
and the metrics against hand-made cases."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from _optional_data import needs

from splitformer.experiments import text_benchmarks as tb
from splitformer.training.data import DatasetError

needs_gensim = needs("gensim")


@needs_gensim
def test_lee_documents_and_the_1225_human_ratings_in_row_major_order():
    docs = tb.lee_documents()
    assert len(docs) == 50 and all(d.strip() for d in docs)
    assert any("\u00a33,000" in d for d in docs)  # the one non-ASCII byte, 0xa3, is a pound
    human = tb.lee_human()
    assert human.shape == (1225,) and np.all((0 <= human) & (human <= 1))
    rows = (tb.gensim_data_dir() / "similarities0-1.txt").read_text().splitlines()
    first, second = rows[0].split("\t"), rows[1].split("\t")
    # pairs (0,1), (0,49), (1,2), (1,49), (48,49): row i then j = i+1..49
    assert human[0] == float(first[1]) == 0.3 and human[48] == float(first[49]) == 0.5
    assert human[49] == float(second[2]) == 0.28 and human[49 + 47] == float(second[49])
    assert human[-1] == float(rows[48].split("\t")[49])


@needs_gensim
def test_background_polarity_and_word_pairs():
    assert len(tb.lee_background()) == 300
    texts, labels = tb.polarity()
    assert len(texts) == 200 and labels.tolist() == [0] * 100 + [1] * 100
    assert texts[0] == "simplistic , silly and tedious ."
    joined = " ".join(texts)
    assert "clich\u00e9s" in joined and "\u2014" in joined  # cp1252: 0xe9 and 0x97
    ws, sl = tb.word_pairs("wordsim353"), tb.word_pairs("simlex999")
    assert len(ws) == 353 and ws[0] == ("love", "sex", 6.77)
    assert len(sl) == 999 and sl[0] == ("old", "new", 1.58)
    with pytest.raises(ValueError, match="wordsim353"):
        tb.word_pairs("men3000")


@needs_gensim
@needs("wiki")
def test_wiki_articles_are_the_dumps_106_articles_as_plain_text():
    articles = tb.wiki_articles()
    assert len(articles) == 106
    assert articles[0].startswith("Anarchism is a political philosophy that advocates "
                                  "self-governed societies based on voluntary institutions.")
    assert articles[3].startswith("A (named , plural As, A's, as, a's or aes) is the first "
                                  "letter")
    text = "\n".join(articles)
    for markup in ("[[", "]]", "{{", "}}", "<ref", "</ref>", "'" * 3, "Category:", "thumb|"):
        assert markup not in text, markup
    assert all(len(line) >= 80 for a in articles for line in a.split("\n"))
    assert sum(map(len, articles)) == 2_709_315 and len(text.split("\n")) == 5892  # depth.md


@needs_gensim
@needs("wiki")
def test_wiki_articles_are_cached_in_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    tb._wiki_articles.cache_clear()
    monkeypatch.setattr(tb, "_parse_wiki", lambda path: ("parsed",) * 106)
    try:
        assert tb.wiki_articles() == ["parsed"] * 106  # parsed, and written
        cache = tb._wiki_cache(str(tb.gensim_data_dir() / tb.WIKI_DUMP))
        assert cache.parent == tmp_path / "splitformer" and cache.is_file()
        cached = ["cached"] * 106
        cache.write_text(json.dumps({"sha256": tb._digest(cached), "articles": cached}))
        tb._wiki_articles.cache_clear()
        assert tb.wiki_articles() == cached  # read back, not parsed
        # a damaged cache is parsed again and rewritten: not JSON, the old format, entries
        # that are not text, text that is not what its checksum says
        for damaged in ("[not json", json.dumps(cached), json.dumps(
                {"sha256": tb._digest(cached), "articles": [None] * 106}), json.dumps(
                {"sha256": tb._digest(cached), "articles": ["short"] * 106})):
            cache.write_text(damaged)
            tb._wiki_articles.cache_clear()
            assert tb.wiki_articles() == ["parsed"] * 106
            assert json.loads(cache.read_text())["articles"] == ["parsed"] * 106
        # a relative XDG_CACHE_HOME is ignored (the XDG rule): ~/.cache
        monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
        dump = str(tb.gensim_data_dir() / tb.WIKI_DUMP)
        assert tb._wiki_cache(dump).parent == tb.Path.home() / ".cache" / "splitformer"
    finally:
        tb._wiki_articles.cache_clear()


def test_the_wiki_text_without_its_parser_names_make_data(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mwparserfromhell" else real(name, *a))
    tb._wiki_articles.cache_clear()
    try:
        with pytest.raises(DatasetError, match="mwparserfromhell.*make data"):
            tb._wiki_articles("any.bz2")
    finally:
        tb._wiki_articles.cache_clear()


def test_a_missing_file_names_the_file_and_make_data(tmp_path):
    for read, name in ((tb.lee_documents, "lee.cor"), (tb.lee_human, "similarities0-1.txt"),
                       (tb.polarity, "pang_lee_polarity.cor"),
                       (lambda f: tb.word_pairs("simlex999", f), "simlex999.txt")):
        with pytest.raises(DatasetError, match="make data") as e:
            read(tmp_path)
        assert name in str(e.value)
    (tmp_path / "lee.cor").write_text("one document\nanother\n")
    with pytest.raises(DatasetError, match="2 documents, expected 50"):
        tb.lee_documents(tmp_path)


@needs_gensim
def test_the_readers_never_import_gensim():
    code = ("import sys; from splitformer.experiments import text_benchmarks as tb; "
            "tb.lee_documents(); tb.lee_human(); tb.polarity(); tb.word_pairs('wordsim353'); "
            "assert 'gensim' not in sys.modules, 'gensim imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_metrics_on_hand_made_cases():
    e = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    np.testing.assert_allclose(tb.pair_cosines(e), [0.0, 2 ** -0.5, 2 ** -0.5], atol=1e-12)
    assert tb.spearman([1, 2, 3, 4], [10, 20, 30, 25]) == pytest.approx(0.8)
    g = torch.Generator().manual_seed(0)
    labels = np.array([0, 1] * 20)
    x = torch.randn(40, 8, generator=g) * 0.1
    x[:, 0] += torch.tensor(labels * 2.0 - 1.0)
    mean, std = tb.probe_accuracy(x, labels)
    assert mean == 1.0 and std == 0.0
    vectors = {"a": [1.0, 0.0], "b": [1.0, 0.1], "c": [1.0, 1.0], "d": [0.0, 1.0]}
    pairs = [("a", "b", 9.0), ("a", "c", 5.0), ("a", "d", 1.0)]

    def embed(words):
        return torch.tensor([vectors[w] for w in words])

    assert tb.word_similarity(embed, pairs) == pytest.approx(1.0)
    assert tb.word_similarity(embed, [(a, b, -s) for a, b, s in pairs]) == pytest.approx(-1.0)


@pytest.fixture(scope="module")
def minilm():
    return tb.load_minilm()


@needs("minilm", "text")
def test_kjv_passages_have_exactly_n_tokens(minilm):
    verses = tb.kjv_verses()
    assert len(verses) == 31169 and verses[1].startswith("In the beginning God created")
    special = set(minilm.tokenizer.all_special_ids)
    for n in (64, 512):
        ids = tb.kjv_passages(minilm.tokenizer, n, 4, verses)
        assert ids.shape == (4, n)
        assert (ids[:, 0] == minilm.tokenizer.cls_token_id).all()
        assert (ids[:, -1] == minilm.tokenizer.sep_token_id).all()
        assert not set(ids[:, 1:-1].flatten().tolist()) & special
        assert len({tuple(row) for row in ids.tolist()}) == 4
    start = minilm.tokenizer("The First Book of Moses, called Genesis In the beginning",
                             add_special_tokens=False)["input_ids"]
    assert tb.kjv_passages(minilm.tokenizer, 64, 1, verses)[0, 1:1 + len(start)].tolist() \
        == start
    with pytest.raises(ValueError, match="n must be"):
        tb.kjv_passages(minilm.tokenizer, 2, 1, verses)


@needs("text")
@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="no setitimer")
def test_a_signal_while_the_king_james_text_is_read_is_never_lost():
    """A Python signal handler that raises (Ctrl-C's KeyboardInterrupt) at any moment of
    kjv_verses is raised, in it or at the latest just after it: numpy 2.4 iterating an array of
    str clears an exception raised meanwhile, and compress lost Ctrl-C at its "healing text"
    step that way. Timer signals at 12 offsets across the read; the old reader lost most."""
    import signal
    import time

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop

    tb.kjv_verses()  # the SWORD module decompressed once (cached); the read itself remains
    start = time.perf_counter()
    expected = tb.kjv_verses()
    took = time.perf_counter() - start
    before = signal.signal(signal.SIGALRM, stop)
    lost, inside = [], 0
    try:
        for k in range(12):
            at = max(1e-3, took * (k + 0.5) / 12)
            try:
                signal.setitimer(signal.ITIMER_REAL, at)
                try:
                    verses = tb.kjv_verses()
                except Stop:
                    inside += 1
                    continue
                assert verses == expected
                deadline = time.perf_counter() + at + 1.0
                while time.perf_counter() < deadline:  # a signal not yet due arrives here
                    time.sleep(0.001)
                lost.append(at)
            except Stop:
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert not lost, f"signals at {lost} s of a {took:.2f} s read were lost"
    assert inside, "every signal came after the read: the test tested nothing"


@needs("minilm")
def test_minilm_reads_its_sentence_transformers_config(minilm):
    assert minilm.max_seq_length == 256
    long = minilm.tokenize(["word " * 400])[0]
    assert len(long) == 256 and long[-1] == minilm.tokenizer.sep_token_id


@needs("minilm")
def test_from_hf_embeddings_equal_transformers_on_minilm(minilm):
    from splitformer import from_hf
    from splitformer.bench.merge_suite import LastHidden, embed

    texts = ["Operator splitting turns a Transformer into a time discretisation.",
             "The token grid is a quadrature rule in x.", "Short.",
             "In the beginning God created the heaven and the earth."]
    # transformers run directly, on a padded batch: mean over the mask, then L2 normalise
    batch = minilm.tokenizer(texts, padding=True, truncation=True, max_length=256,
                             return_tensors="pt")
    with torch.no_grad():
        h = minilm.model(**batch).last_hidden_state
    m = batch["attention_mask"][..., None].float()
    reference = (h * m).sum(1) / m.sum(1)
    reference = reference / reference.norm(dim=-1, keepdim=True)
    ours = embed(LastHidden(from_hf(minilm.model).eval()), minilm.tokenize(texts))
    theirs = embed(LastHidden(minilm.model), minilm.tokenize(texts))
    assert (ours - reference).abs().max() < 1e-5
    assert (theirs - reference).abs().max() < 1e-5
    assert torch.allclose(ours.norm(dim=-1), torch.ones(4), atol=1e-6)


@needs("minilm")
@needs_gensim
def test_unmerged_minilm_scores_0508_on_lee_50(minilm):
    from splitformer.bench.merge_suite import LastHidden, embed

    docs = minilm.tokenize(tb.lee_documents())
    assert min(map(len, docs)) == 53 and max(map(len, docs)) == 154
    e = embed(LastHidden(minilm.model), docs)
    rho = tb.spearman(tb.pair_cosines(e), tb.lee_human())
    assert rho == pytest.approx(0.508, abs=5e-4), rho
