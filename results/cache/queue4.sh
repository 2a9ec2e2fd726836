#!/bin/sh
# This session's one-core queue after the 2048-token sweep (each step resumable or short):
# the passkey rows of heavy-quadrature, the question-window variants, the slack timing, then
# the 4096-token sweep on two texts.
#   nohup results/cache/queue4.sh > results/cache/queue4.log 2>&1 &
export OMP_NUM_THREADS=1
py=.venv/bin/python
$py -m splitformer.experiments.passkey run --threads 1 --lengths 1024 --budgets 0.25,0.125 \
    --policies heavy-quadrature
$py -m splitformer.experiments.passkey run --threads 1 --lengths 1024 --chunk 1024 --budgets 0.25 \
    --decode append --policies heavy-quadrature
if [ ! -s results/cache/passkey-variants.log ]; then
    $py results/cache/passkey_variants.py > results/cache/passkey-variants.log.tmp &&
        mv results/cache/passkey-variants.log.tmp results/cache/passkey-variants.log
fi
for slack in 0 64; do
    out=results/cache/bench-generate-slack$slack.json
    [ -s $out ] || .venv/bin/splitformer bench generate --size smollm2 --repeats 1 --threads 1 \
        --new-tokens 8 --policies streaming,h2o,quadrature --budgets 0.25 --contexts 4096 \
        --slack $slack --out $out
done
results/cache/sweep_long.sh 4096 kjv-1 wiki-0
