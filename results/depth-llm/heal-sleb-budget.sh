#!/bin/sh
# SLEB + keep at N = 22 with the KL phase shortened by the time SLEB takes to choose its grid
# (issue 31, the 20-minute budget counted in steps): in the seed-2 run SLEB chose in 236 s and a
# KL step took 1691 / 260 = 6.5 s on the same core, so 236 s is 36 steps: 260 - 36 = 224.
# Block influence chooses in about 1 s. One thread; resumable as heal-queue.sh.
# Seeds as arguments (default 0):
#   nohup results/depth-llm/heal-sleb-budget.sh 0 1 > results/depth-llm/heal-sleb-budget.log 2>&1 &
[ $# -gt 0 ] || set -- 0
for seed in "$@"; do
    name=heal-22-sleb-keep-224-s$seed
    [ -s results/depth-llm/healed/$name.json ] && continue
    .venv/bin/splitformer compress smollm2 --steps 22 --method sleb --probe 4 --fit keep \
        --heal kl --max-steps 224 --budget 2h --lr 1e-4 --out out/$name --seed $seed \
        --threads 1 > results/depth-llm/$name.log 2>&1 &&
        cp out/$name/compress.json results/depth-llm/healed/$name.json
done
