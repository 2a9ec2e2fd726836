#!/bin/sh
# The passkey test at 50 placements (issue 32 asks 50 per length, 1k-6k), compressed once after
# the question with the decoded tokens appended (kvpress's protocol), budget 25%: the full
# cache, StreamingLLM, TOVA, plain quadrature, and the two question-window settings of
# docs/cache.md ("The question as the observation window"). One thread; resumable (rows already
# in results/cache/passkey50/passkey.jsonl are skipped). 4096 tokens: the four that decide the goal.
#   nohup results/cache/passkey50.sh > results/cache/passkey50.log 2>&1 &
run() {
    OMP_NUM_THREADS=1 .venv/bin/python -m splitformer.experiments.passkey run --threads 1 \
        --out results/cache/passkey50 --placements 50 --budgets 0.25 --decode append "$@"
}
Q=snapkv:window=10,adaptive:window=10:recent=0.25:protect=0.9
run --lengths 1024 --chunk 1024 --batch 10 --policies full,$Q,streaming,tova,quadrature
run --lengths 2048 --chunk 2048 --batch 5 --policies full,$Q,streaming,tova,quadrature
run --lengths 4096 --chunk 4096 --batch 2 --policies full,$Q,streaming
run --lengths 6144 --chunk 6144 --batch 1 --policies full,$Q
