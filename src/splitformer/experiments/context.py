"""The measurements of docs/context.md: SmolLM2-135M (trained context n0 = 8,192) read at 2x and
4x its context by every rope rule, training-free, on long offline text.

    python -m splitformer.experiments.context run   [--out results/context] [--docs kjv,wiki]
    python -m splitformer.experiments.context table [--out results/context]

``run`` streams each document's first s n0 tokens (s = 2, 4) through the model on one KV tape
(chunked prefill, ``--chunk`` tokens a forward; the rotary kernel computed per forward at the
absolute positions, as transformers' cache does) under each rule, and appends one JSON row per
(document, length, rule) to OUT/rows.jsonl: the summed negative log-likelihood of every token
given the ones before it, over all tokens and over the tokens past n0. The reference row
("windows") scores the same tokens in independent windows of n0 with the trained kernel: the
n0 figure on the same text. ``short`` rows score 16 windows of 512 tokens of the same text
under each rule at factor 4 (is the trained range unchanged?). A row already in the file is not
recomputed (kill and rerun resumes). ``table`` prints the tables the docs quote.

The documents: "kjv", the held-out King James books (Hebrews to Revelation,
``depth_eval.kjv_split()[1]``) joined with newlines; "wiki", gensim's Wikipedia extract, its
articles joined with blank lines (``lm_eval.wiki_ids``). The rules (``RULES``): the trained
kernel extrapolated ("default"), Position Interpolation ("linear"), NTK-aware "dynamic" as one
forward over the whole text computes it (the base of n = s n0 for every token: a fixed base;
transformers' dynamic under a cache changes the base as the text grows, with earlier keys
rotated at the old one: "dynamic-chunked"), "yarn", and splitformer's "bandwidth" at the
derivation's bound, the bands kept from 1 turn on (with and without its log n temperature;
"bandwidth-32": the bands kept from 32 turns on, yarn's beta_fast, the library's default
since these rows; "bandwidth-follow": s = max(1, n / n0) from the current length n, on a tape
that re-rotates the stored keys to each forward's frequencies, so that every token is read at
its own length and the trained interval is untouched; "bandwidth-follow-32" both). Every rule
names its turns, so a row keeps its meaning whatever the default.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from ..usage import Parser, int_list, positive_int
from .rows import answered, append_row, read_rows, say

__all__ = ["RULES", "main", "rule_model"]

RULES = ("bandwidth", "yarn", "dynamic", "linear", "default", "bandwidth-notemp",
         "dynamic-chunked", "bandwidth-32", "bandwidth-follow", "bandwidth-follow-32")
# the rules scored on a tape that re-rotates the keys (KVTape(follow_length=True))
FOLLOW = ("bandwidth-follow", "bandwidth-follow-32")
FACTORS = (2, 4)
SHORT = (16, 512)  # short-context check: 16 windows of 512 tokens


def rule_model(model, rule: str, factor: float, length: int):
    """``model`` (shared parameters) reading its rotary kernel by ``rule`` at ``factor`` for a
    text of ``length`` tokens (module doc)."""
    rope = next(iter(model.rotary.values()))
    n0 = rope.max_position_embeddings
    if rule == "default":
        return model
    if rule == "linear":
        return model.with_rope("linear", factor=float(factor))
    if rule == "dynamic":  # one forward over n tokens: b' = b (s n / n0 - (s - 1))^(d / (d - 2))
        d = rope.dim
        base = rope.base * ((factor * max(length, n0) / n0) - (factor - 1)) ** (d / (d - 2))
        return model.with_rope("default", rope_theta=base)
    if rule == "dynamic-chunked":
        return model.with_rope("dynamic", factor=float(factor))
    if rule == "yarn":
        return model.with_rope("yarn", factor=float(factor))
    if rule == "bandwidth":  # the derivation's bound: the bands turning once kept
        return model.with_rope("bandwidth", factor=float(factor), turns=1)
    if rule == "bandwidth-notemp":
        return model.with_rope("bandwidth", factor=float(factor), temperature="none", turns=1)
    if rule == "bandwidth-follow":  # s = max(1, n / n0) from the current length
        return model.with_rope("bandwidth", factor=None, turns=1)
    if rule == "bandwidth-follow-32":
        return model.with_rope("bandwidth", factor=None, turns=32)
    if rule == "bandwidth-32":  # the ablation: bands kept from yarn's beta_fast = 32 turns on
        return model.with_rope("bandwidth", factor=float(factor), turns=32)
    raise ValueError(f"rule: one of {', '.join(RULES)}, got {rule!r}")


def stream_nll(model, ids: torch.Tensor, *, chunk: int, split: int,
               follow_length: bool = False) -> dict:
    """Summed nll of ids[1:] given their prefixes, streamed on one tape in ``chunk``-token
    forwards: over all tokens and over the targets at positions >= ``split``.
    ``follow_length``: the tape re-rotates its keys to each forward's frequencies."""
    from ..operators.tape import KVTape

    n = ids.shape[1]
    tape = KVTape(capacity=n, follow_length=follow_length)
    total = past = heads = 0.0  # heads: targets at split, 2 split, ... (a window's first)
    t0 = time.perf_counter()
    with torch.no_grad():
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            logits = model(ids[:, start:end], tape=tape).logits
            targets = ids[:, start + 1:end + 1]
            lp = logits[:, :targets.shape[1]].float().log_softmax(-1)
            nll = -lp.gather(-1, targets[..., None])[..., 0][0]
            positions = torch.arange(start + 1, start + 1 + targets.shape[1])
            total += float(nll.sum())
            past += float(nll[positions >= split].sum())
            heads += float(nll[positions % split == 0].sum())
            del logits, lp
    return {"nll": total, "tokens": n - 1, "nll_past": past, "nll_heads": heads,
            "tokens_past": max(0, n - split), "seconds": time.perf_counter() - t0}


def _documents(tokenizer, names: Sequence[str]) -> dict[str, torch.Tensor]:
    from . import lm_eval
    from .depth_eval import kjv_split

    out = {}
    for name in names:
        if name == "kjv":
            _, held = kjv_split()
            out[name] = torch.tensor(lm_eval._encode(tokenizer, "\n".join(held)))
        elif name == "wiki":
            out[name] = lm_eval.wiki_ids(tokenizer)
        else:
            raise ValueError(f"--docs: 'kjv' or 'wiki', got {name!r}")
    return out


def run(out: Path, docs: Sequence[str], rules: Sequence[str], factors: Sequence[int],
        chunk: int) -> None:
    from ..interop import from_hf

    path = out / "rows.jsonl"  # read first: a corrupt row file is named before the model loads
    done = {(r["doc"], r["kind"], r["length"], r["rule"]) for r in read_rows(path)}
    model = from_hf("smollm2").eval()
    n0 = model.trained_positions
    texts = _documents(model.tokenizer, docs)
    for doc, ids in texts.items():
        say(f"{doc}: {ids.numel()} tokens")
        if ids.numel() < max(factors) * n0:
            raise SystemExit(f"{doc}: {ids.numel()} tokens, fewer than {max(factors) * n0}")
    work = []
    for doc in texts:  # the cheap rows first: the n0 reference and the short-context check
        work.append((doc, "windows", max(factors) * n0, "default", 1))
        work += [(doc, "short", SHORT[1], r, max(factors))
                 for r in ("default", *(r for r in rules if r != "default"))]
    for factor in sorted(factors):
        for doc in texts:
            work += [(doc, "long", factor * n0, r, factor) for r in rules]
    for doc, kind, length, rule, factor in work:
        if (doc, kind, length, rule) in done:
            continue
        ids = texts[doc]
        m = rule_model(model, rule, factor, length)
        say(f"{doc} {kind} {length} {rule} x{factor}")
        if kind == "windows":
            parts = [stream_nll(m, ids[None, s:s + n0], chunk=chunk, split=n0)
                     for s in range(0, length, n0)]
            # the window reference scores token n0 k (each window's first) with no context:
            # its nll is kept apart so that the long rows' and these targets are the same
            row = {"nll": sum(p["nll"] for p in parts), "tokens": sum(p["tokens"] for p in parts),
                   "windows": [p["nll"] for p in parts],
                   "seconds": sum(p["seconds"] for p in parts)}
        elif kind == "short":
            parts = [stream_nll(m, ids[None, s:s + length], chunk=length, split=length)
                     for s in range(0, SHORT[0] * length, length)]
            row = {"nll": sum(p["nll"] for p in parts), "tokens": sum(p["tokens"] for p in parts),
                   "seconds": sum(p["seconds"] for p in parts)}
        else:
            row = stream_nll(m, ids[None, :length], chunk=chunk, split=n0,
                             follow_length=rule in FOLLOW)
        row.update(doc=doc, kind=kind, length=length, rule=rule, factor=factor, chunk=chunk,
                   threads=torch.get_num_threads())
        append_row(path, row, key=("doc", "kind", "length", "rule"))
        say(f"  ppl {math.exp(row['nll'] / row['tokens']):.3f} in {row['seconds']:.0f} s")


def table(out: Path) -> None:
    rows = read_rows(out / "rows.jsonl")
    ref: dict[str, dict] = {}  # per document, the windows row of the most windows
    for r in rows:
        if r["kind"] == "windows" and len(r["windows"]) > len(ref.get(r["doc"], {}).get(
                "windows", [])):
            ref[r["doc"]] = r
    for doc in sorted({r["doc"] for r in rows}):
        short = {r["rule"]: r for r in rows if r["doc"] == doc and r["kind"] == "short"}
        if short:
            base = math.exp(short["default"]["nll"] / short["default"]["tokens"]) \
                if "default" in short else None
            print(f"\n{doc}: {SHORT[0]} windows of {SHORT[1]} tokens (factor 4)")
            print("| rule | perplexity | change |\n|---|---|---|")
            for rule, r in short.items():
                p = math.exp(r["nll"] / r["tokens"])
                change = f"{100 * (p / base - 1):+.2f}%" if base else ""
                print(f"| {rule} | {p:.3f} | {change} |")
        print("\n(perplexity: over the targets the windows score, i.e. without the tokens at "
              "n0, 2 n0, ...; past n0: the targets at positions >= n0)")
        for length in sorted({r["length"] for r in rows if r["doc"] == doc
                              and r["kind"] == "long"}):
            w = ref.get(doc)
            n0 = 8192
            # the reference on the same targets: the first length tokens in windows of n0
            k = length // n0
            wref = wfirst = wpast = None
            if w is not None and len(w.get("windows", [])) >= k:
                wref = math.exp(sum(w["windows"][:k]) / (k * (n0 - 1)))
                wfirst = math.exp(w["windows"][0] / (n0 - 1))
                wpast = (math.exp(sum(w["windows"][1:k]) / ((k - 1) * (n0 - 1))) if k > 1
                         else None)
            fmt = (lambda v: "" if v is None else f"{v:.3f}")  # noqa: E731
            print(f"\n{doc}: {length} tokens (s = {k}); in windows of {n0}: {fmt(wref)} "
                  f"(first window {fmt(wfirst)}, the others {fmt(wpast)})")
            print("| rule | perplexity | vs windows | first n0 | past n0 | past n0 vs windows |")
            print("|---|---|---|---|---|---|")
            for r in rows:
                if r["doc"] != doc or r["kind"] != "long" or r["length"] != length:
                    continue
                p = math.exp((r["nll"] - r["nll_heads"]) / (r["tokens"] - k + 1))
                first = math.exp((r["nll"] - r["nll_past"]) / (n0 - 1))
                # past n0 without the window heads (the targets the other windows score)
                heads = r["nll_heads"]
                past = (math.exp((r["nll_past"] - heads) / (r["tokens_past"] - (k - 1)))
                        if r["tokens_past"] > k - 1 else float("nan"))
                vs = f"{100 * (p / wref - 1):+.1f}%" if wref else ""
                vp = f"{100 * (past / wpast - 1):+.1f}%" if wpast else ""
                print(f"| {r['rule']} | {p:.3f} | {vs} | {first:.3f} | {past:.3f} | {vp} |")


def _names(allowed: Sequence[str], what: str):
    def parse(text: str) -> list[str]:
        names = [t.strip() for t in text.split(",") if t.strip()]
        bad = [n for n in names if n not in allowed]
        if not names or bad:
            raise argparse.ArgumentTypeError(f"expected {what} among {', '.join(allowed)} "
                                             f"separated by commas, got {text!r}")
        return names
    return parse


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None,
          rows: str) -> argparse.Namespace:
    """The experiment's arguments: --threads set, and for ``table`` the row file ``rows`` in
    --out (a usage error naming --out when it is missing)."""
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.out.exists() and not a.out.is_dir():
        p.error(f"argument --out: expected the folder of {rows}, got the file {str(a.out)!r}")
    if a.what == "table" and not (a.out / rows).is_file():
        p.error(f"argument --out: no {rows} in {str(a.out)!r} (run first)")
    if a.what == "run":  # refused before the model loads, not after its first row
        made = next(d for d in (a.out, *a.out.absolute().parents) if d.exists())
        if not made.is_dir() or not os.access(made, os.W_OK | os.X_OK):
            p.error(f"argument --out: cannot make or write the folder {str(a.out)!r} "
                    f"({str(made)!r} is {'not a folder' if not made.is_dir() else 'read-only'})")
    return a


def main(argv: Sequence[str] | None = None) -> None:
    p = Parser(
        prog="python -m splitformer.experiments.context",
        description="SmolLM2 read at 2x and 4x its trained context by each rope rule "
                    "(docs/context.md): run appends rows to OUT/rows.jsonl (resumable), table "
                    "prints the tables the docs quote.")
    sub = p.add_subparsers(dest="what", required=True, metavar="{run,table}")
    run_p = sub.add_parser("run", help="run the measurements, appending the rows not yet in "
                                       "--out")
    table_p = sub.add_parser("table", help="print the tables of the rows in --out")
    for q in (run_p, table_p):
        q.add_argument("--out", type=Path, default=Path("results/context"),
                       help="folder of rows.jsonl (default results/context)")
    run_p.add_argument("--docs", type=_names(("kjv", "wiki"), "documents"),
                       default=["kjv", "wiki"],
                       help="documents: kjv (the held-out King James books), wiki (gensim's "
                            "Wikipedia extract); default kjv,wiki")
    run_p.add_argument("--rules", type=_names(RULES, "rules"), default=list(RULES),
                       help=f"rope rules (default all: {', '.join(RULES)})")
    run_p.add_argument("--factors", type=int_list(2, why="(factors)"), default=list(FACTORS),
                       help="lengths as multiples of the trained 8192 (default 2,4)")
    run_p.add_argument("--chunk", type=positive_int, default=1024,
                       help="tokens per forward of the chunked prefill (default 1024)")
    run_p.add_argument("--threads", type=positive_int, default=None,
                       help="torch threads (default: torch's choice)")
    table_p.set_defaults(threads=None)
    a = parse(p, argv, "rows.jsonl")
    if a.what == "table":
        answered(p.prog, lambda: table(a.out))
        return
    answered(p.prog, lambda: run(a.out, a.docs, a.rules, a.factors, a.chunk),
             kept=a.out / "rows.jsonl")


if __name__ == "__main__":
    main()
