#!/bin/bash
# The sweeps docs/results.md quotes, in order: the digits part (sections a-e), the language
# model (f), then Fashion-MNIST (a, b). Each is resumable: run this script again after a kill
# and it continues where it stopped (a finished run is never redone). Writes results/<name>/
# (results.jsonl, table.md, table.json, figures; runs/ holds the run folders, not committed)
# and appends each invocation's wall time to results/<name>/wall.txt.
#   bash benchmarks/results_sweep.sh [NAME ...]     (default: every sweep below)
cd "$(dirname "$0")/.."
SWEEPS=${*:-schemes-digits kernels-digits depth-digits lm-text schemes-fashion kernels-fashion}
for name in $SWEEPS; do
  mkdir -p "results/$name"
  t0=$(date +%s)
  .venv/bin/splitformer experiment "experiments/$name.toml" --jobs 2 \
      > "results/$name/stdout.txt" 2> "results/$name/stderr.txt" || exit 1
  echo "$(date -u +%FT%TZ) $(( $(date +%s) - t0 )) s" >> "results/$name/wall.txt"
done
