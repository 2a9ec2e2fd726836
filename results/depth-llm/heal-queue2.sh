#!/bin/sh
# Session 9's healed rows (issue 31): SLEB deleted at a third seed (N = 22), then ShortGPT's
# grid deleted at N = 26 (against the least-squares maps' 1.24x there). The KL phase of every
# healed row: 260 steps, lr 1e-4, one thread. Resumable as heal-queue.sh.
# Runs (STEPS:METHOD:FIT:SEED) as arguments, default both in turn; one queue per core:
#   nohup results/depth-llm/heal-queue2.sh 22:sleb:keep:2 > results/depth-llm/heal-queue2a.log 2>&1 &
#   nohup results/depth-llm/heal-queue2.sh 26:drop:keep:0 > results/depth-llm/heal-queue2b.log 2>&1 &
[ $# -gt 0 ] || set -- 22:sleb:keep:2 26:drop:keep:0
for run in "$@"; do
    steps=${run%%:*}
    rest=${run#*:}
    method=${rest%%:*}
    rest=${rest#*:}
    fit=${rest%%:*}
    seed=${rest##*:}
    name=heal-$steps-$method-$fit-s$seed
    [ -s results/depth-llm/healed/$name.json ] && continue
    .venv/bin/splitformer compress smollm2 --steps $steps --method $method --probe 4 --fit $fit \
        --heal kl --max-steps 260 --budget 2h --lr 1e-4 --out out/$name --seed $seed --threads 1 \
        > results/depth-llm/$name.log 2>&1 &&
        cp out/$name/compress.json results/depth-llm/healed/$name.json
done
