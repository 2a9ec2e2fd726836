"""The comparison of ``benchmarks/ab_encoder.sh``'s runs (issue 17's no-regression bar):
for each group and path of `splitformer bench encoder`, splitformer's ratio to its peer (the
first peer of the group) at the old commit and at this one, the median over the rounds, and
new / old - 1. Prints a markdown table.

    python benchmarks/ab_encoder.py OUT
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def ratios(path: Path) -> dict[tuple[str, str], float]:
    rows = json.loads(path.read_text())["rows"]
    out = {}
    for r in rows:
        if r["splitformer"] and r.get("ratios"):
            out[(r["group"], r["path"])] = next(iter(r["ratios"].values()))
    return out


def main() -> int:
    folder = Path(sys.argv[1])
    sides: dict[str, dict[tuple[str, str], list[float]]] = {"old": defaultdict(list),
                                                              "new": defaultdict(list)}
    for side in sides:
        for f in sorted(folder.glob(f"{side}-*.json")):
            for key, v in ratios(f).items():
                sides[side][key].append(v)
    print("| group | path | old ratio (runs) | new ratio (runs) | new / old - 1 |")
    print("|---|---|---|---|---|")
    for key in sides["new"]:
        old, new = sides["old"].get(key, []), sides["new"][key]
        if not old:
            continue
        a, b = statistics.median(old), statistics.median(new)
        print(f"| {key[0]} | {key[1]} | {a:.3f} ({', '.join(f'{x:.3f}' for x in old)}) | "
              f"{b:.3f} ({', '.join(f'{x:.3f}' for x in new)}) | {b / a - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
