"""`splitformer cache`: a text streamed through a causal LM under each KV cache policy and budget.

MODEL is what ``splitformer generate`` takes (a built-in model, a saved or run folder, a local
Hugging Face folder of a causal LM, or a GGUF network: ``smollm2``, the packaged SmolLM2 of
``make data``). The text of ``--text FILE`` is tokenized by the model's tokenizer (at most
``--max-tokens`` tokens, and at most the model's positions) and read once per row by
``models.generation.score_stream``: the first N - ``--decode`` tokens in forwards of
``--chunk`` new tokens (chunked prefill), the last ``--decode`` tokens one forward each
(decoding, timed), on one KV tape whose policy (``operators.cache_policy``) coarsens the past
after every forward.

A budget b in (0, 1] is a fraction of the text: each attention evaluation and key/value head
keeps ceil(b N) cache entries (N the tokens read), so that b is the fraction of the full
cache at the end of the text. The ``full`` policy is run once (budget 1: the plain tape).

Each row: policy, budget, token perplexity exp(nll / tokens scored), bits per byte
(nll / ln 2 / the UTF-8 bytes of the scored tokens' text), the cache's peak bytes (the largest
cache held at the end of a forward: keys, values, and a compressed cache's weights and
coordinates) and decode tokens per second. One rich table on stdout; progress lines on stderr;
``--json``: one JSON object on the last line of stdout with ``rows`` (objects with ``policy``,
``budget``, ``perplexity``, ``bits_per_byte``, ``cache_bytes``, ``decode_tokens_per_s``,
``entries``, ``tokens``, ``seconds``) and the settings. Ctrl-C (or SIGTERM) stops at once: the
rows done are printed, exit status 130.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ..operators.cache_policy import POLICIES
from . import (
    UsageError,
    bounded_int,
    cache_budgets,
    cache_policies,
    nonnegative_int,
    positive_int,
)

HELP = "stream a text through a causal LM under KV cache policies (perplexity, memory, speed)"
EPILOG = ("MODEL: as for `splitformer generate` (smollm2: the packaged SmolLM2-135M-Instruct, "
          f"`make data`). Policies: {', '.join(POLICIES)} (docs/cache.md). Exit status 130 "
          "after Ctrl-C (the rows done are printed).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a causal LM with a tokenizer (as for "
                   "`splitformer generate`)")
    p.add_argument("--text", required=True, metavar="FILE", help="the text to stream (UTF-8)")
    p.add_argument("--budget", type=cache_budgets, default=(0.5, 0.25, 0.125), metavar="B,B,...",
                   help="fractions of the full cache kept per attention evaluation and "
                   "key/value head (default 0.5,0.25,0.125)")
    p.add_argument("--policy", type=cache_policies, metavar="P,P,...",
                   default=tuple(POLICIES),
                   help=f"cache policies (default: all of {', '.join(POLICIES)}), each a "
                   "name or a name with its options, name:key=value:... "
                   "(snapkv:window=10; docs/cache.md)")
    p.add_argument("--slack", type=nonnegative_int, default=0, metavar="N",
                   help="entries per evaluation and head above the budget before a policy "
                   "compresses back to it (default 0: after every forward; docs/cache.md, "
                   "amortised compression)")
    p.add_argument("--chunk", type=positive_int, default=64, metavar="N",
                   help="new tokens per prefill forward (default 64)")
    p.add_argument("--max-tokens", type=positive_int, default=2048, metavar="N",
                   help="read at most the first N tokens of the text (default 2048)")
    p.add_argument("--decode", type=bounded_int(10 ** 6, "(tokens)", minimum=0), default=32,
                   metavar="N", help="the last N tokens are decoded one forward each and timed "
                   "(default 32)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on the last line of stdout")
    p.set_defaults(_interrupted="")


def _read_text(args: argparse.Namespace) -> str:
    """The --text file's text (read before the model loads: a bad path fails at once)."""
    path = Path(args.text)
    if not path.is_file():
        raise UsageError(f"argument --text: {args.text!r} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"argument --text: cannot read {args.text!r} as UTF-8 text: {e}"
                         ) from None
    if not text.strip():
        raise UsageError(f"argument --text: {args.text!r} holds no text")
    return text


def _text_ids(sub: Any, args: argparse.Namespace, text: str):
    from ..subjects.subject import InputError

    try:
        enc = sub.encode([text], "--text")
    except InputError as e:
        raise UsageError(str(e)) from None
    ids = enc.inputs["input_ids"][:, :args.max_tokens]
    n = ids.shape[1]
    if n < args.decode + 2:
        raise UsageError(f"argument --text: {n} tokens, too few to score with --decode "
                         f"{args.decode} (at least decode + 2 are needed)")
    return ids


def _rows(sub: Any, ids, args: argparse.Namespace, rows: list[dict]) -> None:
    from ..models.generation import score_stream
    from ..operators.cache_policy import cache_policy

    n = ids.shape[1]
    text_bytes = len(sub.decode(ids[0, 1:].tolist()).encode("utf-8"))
    runs = [(name, 1.0) if name == "full" else (name, b)
            for name in args.policy for b in ((1.0,) if name == "full" else args.budget)]
    model = sub.model.eval()
    for name, b in runs:
        count = n if name == "full" else max(1, math.ceil(b * n))
        t0 = time.perf_counter()
        score = score_stream(model, ids, policy=cache_policy(name, count, slack=args.slack),
                             chunk=args.chunk, decode=args.decode)
        seconds = time.perf_counter() - t0
        rate = score.decode_tokens_per_s
        row = {"policy": name, "budget": b, "perplexity": score.perplexity,
               "bits_per_byte": score.nll / math.log(2) / max(text_bytes, 1),
               "cache_bytes": score.peak_bytes,
               "decode_tokens_per_s": None if math.isnan(rate) else rate,
               "entries": score.entries, "tokens": score.tokens, "seconds": seconds}
        rows.append(row)
        sys.stderr.write(f"splitformer cache: {name} {b:g}: perplexity {row['perplexity']:.4f}, "
                         f"{row['cache_bytes']} bytes, {score.entries} entries "
                         f"({seconds:.1f} s)\n")
        sys.stderr.flush()


def _table(rows: list[dict], title: str) -> None:
    from rich.table import Table

    from .bench import table_console

    table = Table(title=title, title_justify="left")
    for col in ("policy", "budget", "perplexity", "bits/byte", "cache bytes (peak)",
                "decode tokens/s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        rate = r["decode_tokens_per_s"]
        table.add_row(r["policy"], f"{r['budget']:g}", f"{r['perplexity']:.4f}",
                      f"{r['bits_per_byte']:.4f}", f"{r['cache_bytes']:,}",
                      "" if rate is None else f"{rate:.1f}")
    table_console().print(table)


def run(args: argparse.Namespace) -> int:
    import torch

    from .generate import _load

    if args.max_tokens < args.decode + 2:  # refused before the model loads
        raise UsageError(f"argument --max-tokens: {args.max_tokens} tokens, too few to score "
                         f"with --decode {args.decode} (at least decode + 2 are needed)")
    text = _read_text(args)
    t0 = time.perf_counter()
    sub = _load(args.model)
    ids = _text_ids(sub, args, text)
    sys.stderr.write(f"splitformer cache: {sub.what}; {ids.shape[1]} tokens of {args.text} "
                     f"(loaded in {time.perf_counter() - t0:.1f} s), chunk {args.chunk}, "
                     f"decode {args.decode}\n")
    rows: list[dict] = []
    interrupted = False
    try:
        _rows(sub, ids, args, rows)
    except KeyboardInterrupt:
        interrupted = True
        sys.stderr.write(f"splitformer cache: interrupted after {len(rows)} rows (printed)\n")
    except ValueError as e:  # the model refuses a policy (a kernel that is not the softmax)
        raise UsageError(f"argument MODEL: {e}") from None
    title = (f"splitformer cache {args.model}: {ids.shape[1]} tokens, chunk {args.chunk}, "
             f"decode {args.decode}" + (f", slack {args.slack}" if args.slack else ""))
    if args.json:
        print(json.dumps({"model": args.model, "text": args.text, "tokens": int(ids.shape[1]),
                          "chunk": args.chunk, "decode": args.decode, "slack": args.slack,
                          "rows": rows,
                          "interrupted": interrupted,
                          "torch_threads": torch.get_num_threads()}))
    else:
        _table(rows, title)
    return 130 if interrupted else 0
