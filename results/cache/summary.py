"""docs/cache.md's cross-text tables: every policy at every budget on 1024 (2048, 4096) tokens
of several texts (``results/cache/sweep2.sh``, ``sweep_long.sh``: results/cache/*-all.json),
the loss each adds to the full cache's per token (ln ppl / ln ppl_full - 1), its mean and
spread over the texts, and on how many texts it adds less than StreamingLLM.

    python results/cache/summary.py results/cache/*-1024-all.json
"""

import json
import math
import statistics
import sys

# several files of one text (e.g. *-1024-all.json and *-1024-heavy.json) are one run: their rows
# joined, the full cache's row read from the first
runs: list[dict] = []
for path in sys.argv[1:]:
    got = json.loads(open(path).read().strip().splitlines()[-1])
    same = [r for r in runs if r["text"] == got["text"]]
    if same:
        seen = {(r["policy"], r["budget"]) for r in same[0]["rows"]}
        same[0]["rows"] += [r for r in got["rows"] if (r["policy"], r["budget"]) not in seen]
    else:
        runs.append(got)
texts = [r["text"].split("/")[-1].removesuffix(".txt") for r in runs]
added: dict[tuple[str, float], list[float]] = {}
for got in runs:
    full = next(r for r in got["rows"] if r["policy"] == "full")
    for r in got["rows"]:
        if r["policy"] != "full":
            added.setdefault((r["policy"], r["budget"]), []).append(
                100 * (math.log(r["perplexity"]) / math.log(full["perplexity"]) - 1))
tokens = sorted({r["tokens"] for r in runs})
print(f"{len(runs)} texts: {', '.join(texts)}; {'/'.join(map(str, tokens))} tokens each, "
      f"chunk {runs[0]['chunk']}, decode {runs[0]['decode']}")
print("| budget | policy | " + " | ".join(texts) + " | mean | std | below streaming |")
print("|---|---|" + "---|" * len(texts) + "---|---|---|")
for budget in sorted({b for _, b in added}, reverse=True):
    order = sorted((p for p, b in added if b == budget),
                   key=lambda p: statistics.mean(added[p, budget]))
    stream = added[("streaming", budget)]
    for p in order:
        xs = added[p, budget]
        wins = sum(x < s for x, s in zip(xs, stream, strict=True))
        cells = " | ".join(f"{x:+.2f}%" for x in xs)
        print(f"| {budget:g} | {p} | {cells} | {statistics.mean(xs):+.2f}% | "
              f"{statistics.stdev(xs) if len(xs) > 1 else 0:.2f} | {wins}/{len(xs)} |")
