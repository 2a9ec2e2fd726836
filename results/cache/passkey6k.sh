#!/bin/sh
# The passkey test at 6144 tokens (issue 32: 50 placements per length, 1k-6k), the protocol of
# passkey50.sh (compressed once after the question, decoded tokens appended, 25%). Two one-thread
# processes on the two cores, each appending its own rows to results/cache/passkey50/passkey.jsonl
# (one line per row, resumable):
#   nohup results/cache/passkey6k.sh > results/cache/passkey6k.log 2>&1 &
run() {
    OMP_NUM_THREADS=1 .venv/bin/python -m splitformer.experiments.passkey run --threads 1 \
        --out results/cache/passkey50 --placements 50 --budgets 0.25 --decode append \
        --lengths 6144 --chunk 6144 --batch 1 "$@"
}
run --policies full,snapkv:window=10:kernel=9 &
run --policies adaptive:window=10:recent=0.25:protect=0.9:kernel=9 &
wait
