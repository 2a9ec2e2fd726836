#!/bin/sh
# heavy-quadrature re-measured after its heavy hitters became tokens only (the review fix):
# 1024 (sweep3.sh), 2048 and 4096 rows (results/cache/<text>-<LEN>-heavy.json), the tuning
# log, and its passkey rows. Two chains, one core each:
#   nohup results/cache/heavy_rerun.sh a > results/cache/heavy-rerun-a.log 2>&1 &
#   nohup results/cache/heavy_rerun.sh b > results/cache/heavy-rerun-b.log 2>&1 &
export OMP_NUM_THREADS=1
heavy() {  # LEN TEXT...
    len=$1; shift
    for f in "$@"; do
        out=results/cache/$f-$len-heavy.json
        [ -s $out ] && continue
        .venv/bin/splitformer cache smollm2 --text results/cache/$f.txt --max-tokens $len --chunk 64 \
            --decode 8 --policy full,heavy-quadrature --budget 0.5,0.25,0.125 --json > $out.tmp && mv $out.tmp $out
    done
}
if [ "$1" = a ]; then
    results/cache/sweep3.sh
    heavy 4096 kjv-1 wiki-0
else
    .venv/bin/python results/cache/heavy_variants.py results/cache/kjv-0.txt > results/cache/heavy-variants-kjv0.log.tmp &&
        mv results/cache/heavy-variants-kjv0.log.tmp results/cache/heavy-variants-kjv0.log
    heavy 2048 kjv-1 wiki-0 kjv-2 wiki-1 kjv-3
    .venv/bin/python -m splitformer.experiments.passkey run --threads 1 --lengths 1024 --budgets 0.25,0.125 \
        --policies heavy-quadrature
    .venv/bin/python -m splitformer.experiments.passkey run --threads 1 --lengths 1024 --chunk 1024 \
        --budgets 0.25 --decode append --policies heavy-quadrature
fi
