#!/bin/sh
# The remaining cache measurements of docs/cache.md, one core, in order (run after the
# context ablation; resumable piece by piece: each command writes its own file).
set -x
export OMP_NUM_THREADS=1
S=.venv/bin/splitformer
P=".venv/bin/python -m splitformer.experiments.passkey"
[ -s results/cache/kjv-0-1024-rest.json ] || $S cache smollm2 --text results/cache/kjv-0.txt \
    --max-tokens 1024 --chunk 64 --decode 8 --policy h2o,tova,snapkv,merge-values,adaptive,quadrature \
    --budget 0.5,0.25,0.125 --json > results/cache/kjv-0-1024-rest.json.tmp \
    && mv results/cache/kjv-0-1024-rest.json.tmp results/cache/kjv-0-1024-rest.json
$P run --threads 1 --lengths 1024,2048 --policies adaptive --budgets 0.25,0.125
$P run --threads 1 --lengths 1024 --chunk 1024 --budgets 0.25
$P run --threads 1 --lengths 2048 --chunk 2048 --budgets 0.25 --policies full,streaming,snapkv,quadrature,adaptive
$S bench generate --size smollm2 --repeats 3 --threads 1 --policies streaming,quadrature,adaptive \
    --budgets 0.25,0.125 --contexts 4096,8192 --out results/cache/bench-generate.json
