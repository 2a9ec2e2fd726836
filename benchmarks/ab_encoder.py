"""The comparison of ``benchmarks/ab_encoder.sh``'s runs (issue 17's no-regression bar):
for each group and path of `splitformer bench encoder`, splitformer's ratio to its peer (the
first peer of the group) at the old commit and at this one, the median over the rounds, and
new / old - 1. Prints a markdown table; with a ``steps.jsonl`` in OUT (``benchmarks/ab_step.sh``:
one group timed with its peers interleaved in one process) a second one.

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
    if len(sys.argv) != 2:
        print("usage: python benchmarks/ab_encoder.py OUT", file=sys.stderr)
        return 2
    folder = Path(sys.argv[1])
    if not (any(folder.glob("old-*.json")) and any(folder.glob("new-*.json"))):
        print(f"ab_encoder: {folder} holds no old-*.json and new-*.json runs "
              "(benchmarks/ab_encoder.sh writes them)", file=sys.stderr)
        return 2
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
    steps = folder / "steps.jsonl"
    if steps.exists():
        print(steps_table([json.loads(line) for line in steps.read_text().splitlines()
                           if line.strip()]))
    return 0


def steps_table(rows: list[dict]) -> str:
    """``benchmarks/ab_step.sh``'s runs: per group and measure (splitformer's milliseconds, its
    ratio to each peer) the old and new medians over the rounds and new / old - 1."""
    cells: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        cells[(r["group"], "splitformer ms", r["side"])].append(r["ms"]["splitformer"])
        for peer, v in r["ratios"].items():
            cells[(r["group"], f"ratio to {peer}", r["side"])].append(v)
    lines = ["", "| group (train) | measure | old (runs) | new (runs) | new / old - 1 |",
             "|---|---|---|---|---|"]
    for group, what in dict.fromkeys((g, w) for g, w, _ in cells):
        old, new = cells[(group, what, "old")], cells[(group, what, "new")]
        if not old or not new:
            continue
        a, b = statistics.median(old), statistics.median(new)
        f = "{:.1f}" if what.endswith("ms") else "{:.3f}"
        lines.append(f"| {group} | {what} | {f.format(a)} ({', '.join(map(f.format, old))}) | "
                     f"{f.format(b)} ({', '.join(map(f.format, new))}) | {b / a - 1:+.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
