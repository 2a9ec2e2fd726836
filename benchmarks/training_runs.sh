#!/bin/bash
# The training runs docs/training.md quotes: each resumable (a killed run continues from its
# last checkpoint when this script is run again; a finished run is not redone).
#   bash benchmarks/training_runs.sh            (writes runs/<name>/ and runs/<name>.out/.err)
cd "$(dirname "$0")/.."
run() { name=$1; shift
  if [ -f "runs/$name/final.json" ]; then return; fi
  if [ -f "runs/$name/latest" ]; then set -- --resume "runs/$name"; else set -- "$@" --out "runs/$name"; fi
  /usr/bin/time -v .venv/bin/splitformer train "$@" --json --no-progress \
      > "runs/$name.out" 2> "runs/$name.err"; }
mkdir -p runs
run lm-text --family lm --data text --width 128 --heads 4 --depth 4 --seq-len 64 --epochs 1 \
    --batch-size 64 --lr 2e-3 --dropout 0.0 --checkpoint-every 100 --log-every 50
run vit-fashion --family vit --data fashion-mnist --patch 4 --width 64 --heads 4 --depth 6 \
    --epochs 12 --batch-size 128 --lr 2e-3 --dropout 0.1 --log-every 50
run cvt-fashion --family cvt --data fashion-mnist --width 64 --heads 4 --depth 4 \
    --epochs 10 --batch-size 128 --lr 2e-3 --dropout 0.1 --log-every 50
