#!/bin/sh
# The passkey test at 50 placements (issue 32 asks 50 per length, 1k-6k), compressed once after
# the question with the decoded tokens appended (kvpress's protocol), budget 25%. One thread;
# resumable (rows already in results/cache/passkey50/passkey.jsonl are skipped).
#   nohup results/cache/passkey50.sh > results/cache/passkey50.log 2>&1 &
# 1024 tokens: the full cache, StreamingLLM, TOVA, plain quadrature, and the two question-window
# settings of docs/cache.md ("The question as the observation window"); then the same two with
# a pooling kernel of 9 (the misses at 1024 kept a key's first digits and lost its last:
# docs/cache.md, "50 placements"). 2048 and 4096 tokens: the full cache and the four
# question-window settings.
run() {
    OMP_NUM_THREADS=1 .venv/bin/python -m splitformer.experiments.passkey run --threads 1 \
        --out results/cache/passkey50 --placements 50 --budgets 0.25 --decode append "$@"
}
Q=snapkv:window=10,adaptive:window=10:recent=0.25:protect=0.9
Q9=snapkv:window=10:kernel=9,adaptive:window=10:recent=0.25:protect=0.9:kernel=9
run --lengths 1024 --chunk 1024 --batch 10 --policies full,$Q,streaming,tova,quadrature
run --lengths 1024 --chunk 1024 --batch 10 --policies $Q9
run --lengths 2048 --chunk 2048 --batch 5 --policies full,$Q9,$Q
run --lengths 4096 --chunk 4096 --batch 2 --policies full,$Q9,$Q
run --lengths 6144 --chunk 6144 --batch 1 --policies full,$Q9
