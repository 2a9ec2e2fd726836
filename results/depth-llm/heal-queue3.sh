#!/bin/sh
# Session 10's healed rows (issue 31): the KL phase's learning rate at N = 22 (every earlier
# row used lr 1e-4), and SLEB's grid deleted at N = 15 (820 KL steps, the 60-minute budget of
# heal-15-drop-linear-s0). One thread each; resumable as heal-queue.sh (a finished row is
# skipped, a killed one resumes from out/NAME's checkpoint).
# Runs as STEPS:METHOD:FIT:SEED:KLSTEPS:LR; one queue per core:
#   nohup results/depth-llm/heal-queue3.sh 22:drop:keep:0:260:3e-4 > results/depth-llm/heal-queue3a.log 2>&1 &
#   nohup results/depth-llm/heal-queue3.sh 15:sleb:keep:0:820:1e-4 > results/depth-llm/heal-queue3b.log 2>&1 &
for run in "$@"; do
    IFS=: read -r steps method fit seed klsteps lr <<END
$run
END
    name=heal-$steps-$method-$fit-s$seed
    [ "$lr" = 1e-4 ] || name=heal-$steps-$method-$fit-lr$lr-s$seed
    [ -s results/depth-llm/healed/$name.json ] && continue
    probe="--probe 4"
    [ "$method" = keep-first ] && probe=
    .venv/bin/splitformer compress smollm2 --steps $steps --method $method $probe --fit $fit \
        --heal kl --max-steps $klsteps --budget 4h --lr $lr --out out/$name --seed $seed \
        --threads 1 > results/depth-llm/$name.log 2>&1 &&
        cp out/$name/compress.json results/depth-llm/healed/$name.json
done
