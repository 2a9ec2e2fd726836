"""docs/cache.md's amortised-compression table: the cache rows of two `splitformer bench generate`
runs (slack 0 and 64) side by side.

    python results/cache/slack_table.py results/cache/bench-generate-slack0.json \\
        results/cache/bench-generate-slack64.json
"""

import json
import sys

print("| slack | cache | decode tokens/s | x full | timed | cache bytes after | peak bytes |")
print("|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    rows = [r for r in json.load(open(path))["rows"] if r.get("group") == "cache decode"]
    full = next(r for r in rows if r["policy"] == "full")
    for r in rows:
        name = "full" if r["policy"] == "full" else f"{r['policy']} {r['budget']:g}"
        steps = r["note"].split(" of ")[1].split(" ")[0]
        timed = f"median of {steps}" if "median_s" in r else f"mean of {steps}"
        print(f"| {r['slack']} | {name} | {r['decode_tokens_per_s']:.2f} | "
              f"{r['decode_tokens_per_s'] / full['decode_tokens_per_s']:.2f} | {timed} | "
              f"{r['cache_bytes']:,} | {r['peak_bytes']:,} |")
