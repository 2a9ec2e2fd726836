#!/usr/bin/env bash
# issue 17's no-regression bar, as an A/B: `splitformer bench encoder` at the commit before the
# token grid (8d41c72^, a git worktree at OLD) and at this checkout, alternated ROUNDS times on
# an idle machine, each run's JSON kept; `benchmarks/ab_encoder.py OUT` prints the comparison.
#   git worktree add /tmp/ab-old 8d41c72^ && bash benchmarks/ab_encoder.sh /tmp/ab-old OUT [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?the worktree of the old commit}; OUT=${2:?the output folder}; ROUNDS=${3:-3}
PY=$PWD/.venv/bin/python
ARGS="encoder --size d256 --repeats 7 --warmup 1 --paths train,no_grad --threads 2"
mkdir -p "$OUT"
for i in $(seq 1 "$ROUNDS"); do
  for side in old new; do
    [ -f "$OUT/$side-$i.json" ] && continue
    root=$PWD; [ $side = old ] && root=$OLD
    PYTHONPATH=$root/src $PY "$root/benchmarks/bench.py" $ARGS --out "$OUT/.$side-$i.json" > /dev/null
    mv "$OUT/.$side-$i.json" "$OUT/$side-$i.json"
    echo "$side $i done"
  done
done
