"""Token merging on the pretrained all-MiniLM-L6-v2, training-free: fidelity, quality and
throughput against r and sequence length (issue 17; docs/space.md).

Settings (``bench.merge_suite``): the transformers ``BertModel`` unmerged (the reference), the
plain ToMe peer (``bench.merge_peers``) and splitformer's ``with_token_merging`` (the one
library call, ``bench.merge_suite.ours_merged``), each at r = 0 and at every r > 0 with and
without proportional attention. Measured for each:

* speed, at each length n of ``lengths`` (King James passages of exactly n tokens, the first
  ``batch`` timed together, eval under no_grad, the repeats interleaved over every setting,
  medians): ``speedup`` = its family's r = 0 median over its median; ``mean_cosine`` of its
  sentence embeddings of all the passages with the unmerged model's;
* quality, once (the Lee documents at their own lengths, 53 to 154 tokens, never padded):
  ``lee_fidelity_spearman`` (Spearman of its 1,225 Lee pair cosines with the unmerged
  model's), ``lee_mean_cosine``, ``lee_human_spearman`` (against the human ratings), and in the
  full grid ``probe_accuracy`` +- ``probe_std`` (10-fold logistic regression on Pang-Lee
  polarity), ``wordsim353`` and ``simlex999`` (Spearman of the word-pair cosines). These
  texts are shorter than the passages (a word is 3 tokens), so the same r merges a larger part
  of them; with ``lee_r_at`` = n_ref a text of N tokens merges round(r N / n_ref) per step
  instead (the fraction merged at n_ref).

``quick_rows(options, say)`` is ``splitformer bench merge``: 8 passages at ``options.tokens``
(256), r in ``options.rs`` (0, 16, 32), the Lee quality. ``run_grid(out, ...)`` is the full grid
(``benchmarks/merge_minilm.py``): every row appended to the JSON-lines file ``out`` as it is
measured (``files.append_line``), the rows already there skipped (resumable: a length whose
speed rows are all in is not timed again, a setting with its quality row is not measured
again). ``break_even`` reads the length where merging starts to pay from the speed rows.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from ..bench.merge_suite import (
    FAMILIES,
    METRIC_OF,
    OURS,
    Embed,
    LastHidden,
    MergeWorkload,
    embed,
    encoder,
    mean_cosine,
    merge_rows,
    quality_embedding,
    settings,
)
from ..files import append_line, read_jsonl
from ..interop import from_hf
from ..training.data import DatasetError
from . import text_benchmarks as tb

__all__ = ["LABEL", "break_even", "curve_table", "curves", "grid_table", "lee_quality",
           "minilm_workload", "quick_rows", "run_grid"]

LABEL = "all-MiniLM-L6-v2"
Say = Callable[[str], None]


def lee_quality(minilm: tb.MiniLM, *, full: bool = False, batch: int = 8
                ) -> Callable[[Embed], dict[str, float]]:
    """The quality measures of a setting's embedding function (module doc); ``full`` adds the
    polarity probe and the word similarities."""
    docs = minilm.tokenize(tb.lee_documents())
    human = tb.lee_human()
    reference = embed(LastHidden(minilm.model), docs, batch)
    reference_pairs = tb.pair_cosines(reference)
    if full:
        sentences, labels = tb.polarity()
        sentences = minilm.tokenize(sentences)
        words = {name: tb.word_pairs(name) for name in tb.WORD_PAIRS}

    def quality(embed_fn: Embed) -> dict[str, float]:
        e = embed_fn(docs)
        pairs = tb.pair_cosines(e)
        out = {"lee_mean_cosine": mean_cosine(e, reference),
               "lee_fidelity_spearman": tb.spearman(pairs, reference_pairs),
               "lee_human_spearman": tb.spearman(pairs, human)}
        if full:
            out["probe_accuracy"], out["probe_std"] = tb.probe_accuracy(embed_fn(sentences),
                                                                        labels)
            for name, pairs_ in words.items():
                out[name] = tb.word_similarity(lambda w: embed_fn(minilm.tokenize(w)), pairs_)
        return out

    return quality


def minilm_workload(minilm: tb.MiniLM, lengths: Sequence[int], *, passages: int = 8,
                    batch: int = 8, quality: Callable | None = None,
                    options: dict | None = None, quality_r_at: int | None = None
                    ) -> MergeWorkload:
    """all-MiniLM-L6-v2 on ``passages`` King James passages at each length."""
    verses = tb.kjv_verses()
    texts = {n: tb.kjv_passages(minilm.tokenizer, n, passages, verses) for n in lengths}
    note = f"pretrained, {passages} KJV passages; quality: " + (
        "r on every text" if quality_r_at is None else f"r scaled as r N / {quality_r_at}")
    return MergeWorkload(LABEL, minilm.model, texts, batch=batch, quality=quality,
                         options=options, note=note, quality_r_at=quality_r_at)


def quick_rows(opts, say: Say | None = None, *, lee_r_at: int | None = None) -> list[dict]:
    """``splitformer bench merge`` on the pretrained model (``opts``: bench ``Options``); a
    missing data set is one row with ``skipped`` naming ``make data``. ``lee_r_at``: r scaled
    to each Lee document's length (``MergeWorkload.quality_r_at``; default the same r)."""
    try:
        minilm = tb.load_minilm()
        workload = minilm_workload(minilm, opts.tokens, quality=lee_quality(minilm),
                                   quality_r_at=lee_r_at)
    except DatasetError as e:
        return [{"suite": "merge", "size": LABEL, "group": "token merging", "skipped": str(e)}]
    return merge_rows(workload, opts.rs, repeats=opts.repeats, warmup=opts.warmup, say=say)


def _key(row: dict) -> tuple:
    """speed rows: ("speed", seq, setting); quality rows: ("quality", lee_r_at, setting)."""
    where = row.get("seq") if row.get("kind") == "speed" else row.get("lee_r_at")
    return (row.get("kind"), where, row["family"], row["r"], row["proportional"])


def _speed(workload: MergeWorkload, out: Path, done: set, rs, families, repeats: int,
           warmup: int, say: Say) -> None:
    keys = [s.key for s in settings(rs, families)]
    for n, ids in workload.passages.items():
        if all(("speed", n, *k) in done for k in keys):
            say(f"merge grid: {n} tokens done")
            continue
        one = MergeWorkload(workload.label, workload.bert, {n: ids}, batch=workload.batch,
                            options=workload.options)
        for row in merge_rows(one, rs, repeats=repeats, warmup=warmup, families=families,
                              say=say):
            row = {"kind": "speed", **row}
            if "skipped" not in row and _key(row) not in done:
                append_line(out, json.dumps(row))


def _quality(workload: MergeWorkload, minilm: tb.MiniLM, ours, out: Path, done: set, rs,
             families, full: bool, say: Say) -> None:
    at = workload.quality_r_at
    todo = [s for s in settings(rs, families) if ("quality", at, *s.key) not in done]
    quality = lee_quality(minilm, full=full, batch=workload.batch) if todo else None
    for s in todo:
        net = encoder(s, minilm.model, ours, **(workload.options or {}))
        say(f"merge grid: quality of {s.name}")
        row = {"kind": "quality", "name": s.name, "family": s.family, "r": s.r,
               "proportional": s.key[2], "lee_r_at": at,
               **quality(quality_embedding(workload, s, net, ours))}
        append_line(out, json.dumps(row))


def run_grid(out: str | Path, *, rs: Sequence[int] = tuple(range(0, 33, 4)),
             lengths: Sequence[int] = (64, 128, 256, 512), passages: int = 32, batch: int = 8,
             repeats: int = 10, warmup: int = 2, families: Sequence[str] = ("peer", *OURS),
             options: dict | None = None, full_quality: bool = True,
             lee_r_at: int | None = None, say: Say | None = None) -> list[dict]:
    """The full grid into the JSON-lines file ``out`` (module doc; ``full_quality=False``:
    the Lee measures only; ``lee_r_at``: the quality with r scaled to each text's length as
    round(r N / lee_r_at), rows of their own); returns all its rows."""
    say = say or (lambda _m: None)
    out = Path(out)
    rows = read_jsonl(out, repair=True) if out.exists() else []
    done = {_key(r) for r in rows if r.get("kind") in ("speed", "quality")}
    minilm = tb.load_minilm()
    families = list(dict.fromkeys(families))
    ours = from_hf(minilm.model).eval() if set(OURS) & set(families) else None
    workload = minilm_workload(minilm, lengths, passages=passages, batch=batch, options=options,
                               quality_r_at=lee_r_at)
    _speed(workload, out, done, rs, families, repeats, warmup, say)
    _quality(workload, minilm, ours, out, done, rs, families, full_quality, say)
    return read_jsonl(out)


def break_even(rows: Sequence[dict]) -> dict[tuple, str]:
    """Per setting (family, r, proportional) with r > 0: the length n* from which merging pays
    (speedup > 1 at every measured length >= n*), interpolated in log n between the last
    length where speedup <= 1 and the next; "< n_min" or "> n_max" outside the lengths."""
    curves: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r.get("kind", "speed") == "speed" and "speedup" in r and r["r"] > 0:
            curves.setdefault((r["family"], r["r"], r["proportional"]), {})[r["seq"]] = \
                r["speedup"]
    out = {}
    for key, curve in curves.items():
        ns = sorted(curve)
        slow = [i for i, n in enumerate(ns) if curve[n] <= 1]
        if not slow:
            out[key] = f"< {ns[0]}"
        elif slow[-1] == len(ns) - 1:
            out[key] = f"> {ns[-1]}"
        else:
            (n1, n2), (s1, s2) = ns[slow[-1]:slow[-1] + 2], (curve[ns[slow[-1]]],
                                                             curve[ns[slow[-1] + 1]])
            t = (1 - s1) / (s2 - s1)
            out[key] = f"{math.exp(math.log(n1) + t * (math.log(n2) - math.log(n1))):.0f}"
    return out


def grid_table(rows: Sequence[dict], quality_length: int = 256, lee_r_at: int | None = None):
    """A rich table: per setting its speedup at each length, the mean cosine at
    ``quality_length``, the quality measures (those measured with ``lee_r_at``) and the
    break-even length."""
    from rich.table import Table

    speed = {(r["seq"], r["family"], r["r"], r["proportional"]): r for r in rows
             if r.get("kind") == "speed"}
    quality = {(r["family"], r["r"], r["proportional"]): r for r in rows
               if r.get("kind") == "quality" and r.get("lee_r_at") == lee_r_at}
    lengths = sorted({k[0] for k in speed})
    keys = sorted({k[1:] for k in speed} | set(quality),
                  key=lambda k: (FAMILIES.index(k[0]), k[2], k[1]))
    even = break_even(list(speed.values()))
    how = "r" if lee_r_at is None else f"r N / {lee_r_at}"
    table = Table(title=f"token merging on {LABEL} (speed-up over r = 0; fidelity to the "
                        f"unmerged model; the Lee, probe and word columns merge {how} per "
                        "step)", title_justify="left")
    columns = ["setting", *[f"x @ {n}" for n in lengths], f"cos @ {quality_length}",
               "Lee fid. rho", "Lee human rho", "probe", "WS353", "SL999", "break-even n"]
    for c in columns:
        table.add_column(c, justify="left" if c == "setting" else "right")
    for key in keys:
        q = quality.get(key, {})
        s = speed.get((quality_length, *key), {})
        name = s.get("name") or q.get("name") or str(key)
        cells = [name, *[_fmt(speed.get((n, *key), {}).get("speedup"), "{:.2f}x")
                         for n in lengths],
                 _fmt(s.get("mean_cosine"), "{:.3f}"),
                 _fmt(q.get("lee_fidelity_spearman"), "{:.3f}"),
                 _fmt(q.get("lee_human_spearman"), "{:.3f}"),
                 (f"{q['probe_accuracy']:.3f} +- {q['probe_std']:.3f}"
                  if "probe_accuracy" in q else ""),
                 _fmt(q.get("wordsim353"), "{:.3f}"), _fmt(q.get("simlex999"), "{:.3f}"),
                 even.get(key, "")]
        table.add_row(*cells)
    return table


def _fmt(value, spec: str) -> str:
    return "" if value is None else spec.format(value)


def curves(rows: Sequence[dict], seq: int, lee_r_at: int | None = None
           ) -> dict[tuple[str, bool], list[tuple[float, float, float]]]:
    """The fidelity-throughput curve of each family and weighting at length ``seq``: points
    (throughput, mean cosine, Lee fidelity), sorted by throughput, (1, 1, 1) first (the
    unmerged model). The throughput is against ONE reference for every family, the median of
    the r = 0 medians (every r = 0 row runs the same network, so their spread is timing noise,
    not a property of the family; a family's own r = 0 row would carry that noise into its
    whole curve)."""
    speed = {(r["family"], r["r"], r["proportional"]): r for r in rows
             if r.get("kind") == "speed" and r.get("seq") == seq}
    quality = {(r["family"], r["r"], r["proportional"]): r for r in rows
               if r.get("kind") == "quality" and r.get("lee_r_at") == lee_r_at}
    base = [r["median_s"] for k, r in speed.items() if k[1] == 0]
    if not base:
        raise ValueError(f"curves: no r = 0 speed rows at {seq} tokens")
    if not quality:
        have = sorted({str(r.get("lee_r_at")) for r in rows if r.get("kind") == "quality"})
        raise ValueError(f"curves: no quality rows with lee_r_at = {lee_r_at} (the rows have "
                         f"{', '.join(have) or 'none'}; pass --lee-r-at to match)")
    ref = statistics.median(base)
    out: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    for (family, r, prop), row in speed.items():
        q = quality.get((family, r, prop))
        if r == 0 or q is None:
            continue
        out.setdefault((family, prop), [(1.0, 1.0, 1.0)]).append(
            (ref / row["median_s"], row["mean_cosine"], q["lee_fidelity_spearman"]))
    return {k: sorted(v) for k, v in out.items()}


def _at(points: list[tuple[float, float, float]], x: float) -> tuple[float, float] | None:
    """(cos, Lee fidelity) linearly interpolated at throughput x; None outside the points."""
    for (x0, c0, l0), (x1, c1, l1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1 and x1 > x0:
            t = (x - x0) / (x1 - x0)
            return c0 + t * (c1 - c0), l0 + t * (l1 - l0)
    return None


def curve_table(rows: Sequence[dict], seq: int = 256, lee_r_at: int | None = None,
                at: Sequence[float] = (1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9)) -> str:
    """Markdown: at each throughput in ``at``, with and without the weights, the Lee fidelity /
    cosine of ToMe (the peer) and of every splitformer rule, interpolated on its curve
    (``curves``; "-" beyond a curve's fastest point), a rule in bold where it is above ToMe in
    both."""
    c = curves(rows, seq, lee_r_at)
    ours = [f for f in OURS if any(k[0] == f for k in c)]
    lines = ["| throughput | weights | ToMe: Lee fid. / cos | "
             + " | ".join(METRIC_OF[f] for f in ours) + " |",
             "|---|---|---|" + "---|" * len(ours)]
    for prop in (False, True):
        peer = c.get(("peer", prop))
        for x in at:
            tome = _at(peer, x) if peer else None
            if tome is None:
                continue
            cells = []
            for f in ours:
                v = _at(c.get((f, prop), []), x)
                text = "-" if v is None else f"{v[1]:.3f} / {v[0]:.3f}"
                above = v is not None and v[0] > tome[0] and v[1] > tome[1]
                cells.append(f"**{text}**" if above else text)
            lines.append(f"| {x:.2f}x | {'with' if prop else 'without'} | {tome[1]:.3f} / "
                         f"{tome[0]:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
