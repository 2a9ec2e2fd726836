"""docs/cache.md's table: the rows of `splitformer cache --json` runs (results/cache/*.json), with
the loss added to the full cache's per token, ln(ppl) / ln(ppl_full) - 1 (the full row of any of
the files on the same text and number of tokens: the full cache is exact whatever the chunking).

    python results/cache/table.py results/cache/kjv-0-1024.json [...]
"""

import json
import math
import sys

runs = {p: json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:]}
# the full row of the same text and length (any file: the full cache is exact whatever the
# chunking)
fulls = {(g["text"], g["tokens"]): r for g in runs.values() for r in g["rows"]
         if r["policy"] == "full"}
for path, got in runs.items():
    rows = got["rows"]
    full = fulls.get((got["text"], got["tokens"]))
    print(f"{path}: {got['tokens']} tokens, chunk {got['chunk']}, decode {got['decode']}")
    print("| policy | budget | perplexity | bits/byte | added loss | cache bytes (peak) "
          "| decode tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        added = "" if full is None else \
            f"{100 * (math.log(r['perplexity']) / math.log(full['perplexity']) - 1):+.2f}%"
        rate = r["decode_tokens_per_s"]
        print(f"| {r['policy']} | {r['budget']:g} | {r['perplexity']:.4f} | "
              f"{r['bits_per_byte']:.4f} | {added} | {r['cache_bytes']:,} | "
              f"{'' if rate is None else f'{rate:.1f}'} |")
