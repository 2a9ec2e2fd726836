#!/bin/sh
while kill -0 26071 2>/dev/null; do sleep 5; done
results/cache/sweep2.sh
OMP_NUM_THREADS=1 .venv/bin/splitformer bench generate --size smollm2 --repeats 3 --threads 1 --new-tokens 32 \
    --policies streaming,quadrature --budgets 0.25 --contexts 4096,8192 --out results/cache/bench-generate.json
