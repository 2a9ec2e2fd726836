#!/bin/sh
# One healed row of docs/depth-llm.md (issue 31), resumable: a finished row (its compress.json
# copied to results/depth-llm/healed/NAME.json) is skipped, a killed one resumes from
# out/NAME's checkpoint. One thread; the KL phase, --probe 4 (none for keep-first), the rest
# as given after KLSTEPS (--lr, --length, --batch-size, --healed ...: lr 1e-4 when not given).
#   results/depth-llm/heal-one.sh NAME STEPS METHOD FIT SEED KLSTEPS [compress flags]
# e.g. (session 10: healing windows of 512 tokens, one a step, as many tokens as 4 x 128):
#   nohup results/depth-llm/heal-one.sh heal-22-drop-keep-len512-s0 22 drop keep 0 260 \
#       --length 512 --batch-size 1 > /dev/null 2>&1 &
name=$1 steps=$2 method=$3 fit=$4 seed=$5 klsteps=$6
shift 6
[ -s results/depth-llm/healed/$name.json ] && exit 0
probe="--probe 4"
[ "$method" = keep-first ] && probe=
case " $* " in *" --lr "*) lr= ;; *) lr="--lr 1e-4" ;; esac
.venv/bin/splitformer compress smollm2 --steps $steps --method $method $probe --fit $fit \
    --heal kl --max-steps $klsteps --budget 4h $lr --out out/$name --seed $seed --threads 1 \
    "$@" > results/depth-llm/$name.log 2>&1 &&
    cp out/$name/compress.json results/depth-llm/healed/$name.json
