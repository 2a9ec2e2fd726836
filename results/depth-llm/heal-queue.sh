#!/bin/sh
# Session 8's healed rows at N = 22 (issue 31), the same KL phase as every healed row (260 steps,
# lr 1e-4, one thread): the third seed of deletion (drop + keep), SLEB's and reverse order's
# choices healed as deletions, and SLEB again at seed 1. keep-first reads no probe (compress
# refuses --probe for it). Resumable (a finished row is skipped, an unfinished DIR resumes from
# its checkpoint); each compress.json copied to results/depth-llm/healed/.
#   nohup results/depth-llm/heal-queue.sh > results/depth-llm/heal-queue.log 2>&1 &
for run in drop:keep:2 sleb:keep:0 keep-first:keep:0 sleb:keep:1; do
    method=${run%%:*}
    rest=${run#*:}
    fit=${rest%%:*}
    seed=${rest##*:}
    name=heal-22-$method-$fit-s$seed
    probe="--probe 4"
    [ "$method" = keep-first ] && probe=""
    [ -s results/depth-llm/healed/$name.json ] && continue
    .venv/bin/splitformer compress smollm2 --steps 22 --method $method $probe --fit $fit \
        --heal kl --max-steps 260 --budget 2h --lr 1e-4 --out out/$name --seed $seed --threads 1 \
        > results/depth-llm/$name.log 2>&1 &&
        cp out/$name/compress.json results/depth-llm/healed/$name.json
done
