#!/bin/sh
# Every policy at every budget on the first LEN tokens of each text, one core, resumable per
# file (results/cache/<text>-<LEN>-all.json; summary.py reads them):
#   nohup results/cache/sweep_long.sh 2048 kjv-1 wiki-0 kjv-2 > results/cache/sweep-2048.log 2>&1 &
export OMP_NUM_THREADS=1
len=$1
shift
for f in "$@"; do
    out=results/cache/$f-$len-all.json
    [ -s $out ] && continue
    .venv/bin/splitformer cache smollm2 --text results/cache/$f.txt --max-tokens $len --chunk 64 \
        --decode 8 --policy full,streaming,h2o,tova,snapkv,merge-values,quadrature,adaptive,heavy-quadrature \
        --budget 0.5,0.25,0.125 --json > $out.tmp && mv $out.tmp $out
done
