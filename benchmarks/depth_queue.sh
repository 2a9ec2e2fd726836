#!/usr/bin/env bash
# The measurements of docs/depth.md, in order (resumable: rerun it; finished rows are skipped).
#   nohup bash benchmarks/depth_queue.sh > results/depth-minilm/log.txt 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
S="$PY benchmarks/depth_minilm.py --out results/depth-minilm --threads 2"
E=":embedding=1"
$S --speed
$S --heal drop:3:distill --heal "drop:3:shoot$E"
$S --free
$S --heal "coarsen-linear:6,3,2:shoot$E" --heal "coarsen-linear:3:shoot$E" \
   --heal "coarsen-linear:2:shoot$E"
$S --heal "drop:6:shoot$E:merge=40:length=256:batch_size=8" \
   --heal "drop:3:shoot$E:merge=40:length=256:batch_size=8"
$S --table > results/depth-minilm/table.md
