#!/usr/bin/env bash
# benchmarks/ab_step.py at an old checkout (a git worktree at OLD) and at this one, alternated
# ROUNDS times, one JSON line per run into OUT (issue 17's no-regression bar, docs/space.md):
#   git worktree add /tmp/ab-old 8d41c72^ && bash benchmarks/ab_step.sh /tmp/ab-old OUT [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?the worktree of the old commit}; OUT=${2:?the output file}; ROUNDS=${3:-3}
PY=$PWD/.venv/bin/python
for i in $(seq 1 "$ROUNDS"); do
  for group in timm hf; do
    for side in old new; do
      root=$PWD; [ $side = old ] && root=$OLD
      line=$(PYTHONPATH=$root/src $PY benchmarks/ab_step.py $group --path train --json | tail -1)
      echo "{\"side\": \"$side\", \"round\": $i, ${line#\{}" >> "$OUT"
      echo "$side $group $i: $line"
    done
  done
done
