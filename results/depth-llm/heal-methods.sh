#!/bin/sh
# Healed rows of the other methods at N = 22 (issue 31: every method healed with the same
# budget): the same KL phase as heal-22-drop-linear (260 steps, lr 1e-4, seed 0, one thread),
# run one after the other, resumable (a finished DIR is skipped; an unfinished one resumes from
# its checkpoint); each compress.json copied to results/depth-llm/healed/.
#   nohup results/depth-llm/heal-methods.sh > results/depth-llm/heal-methods.log 2>&1 &
for run in drop:keep angular:keep keep-first:keep sleb:linear; do
    method=${run%%:*}
    fit=${run##*:}
    name=heal-22-$method-$fit-s0
    [ -s results/depth-llm/healed/$name.json ] && continue
    probe="--probe 4"
    [ "$method" = keep-first ] && probe=""
    .venv/bin/splitformer compress smollm2 --steps 22 --method $method $probe --fit $fit \
        --heal kl --max-steps 260 --budget 2h --lr 1e-4 --out out/$name --seed 0 --threads 1 \
        > results/depth-llm/$name.log 2>&1 &&
        cp out/$name/compress.json results/depth-llm/healed/$name.json
done
