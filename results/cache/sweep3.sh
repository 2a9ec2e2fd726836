#!/bin/sh
# heavy-quadrature (and the full cache, its reference) on the five texts of sweep2.sh, one core,
# resumable per file; results/cache/summary.py reads these beside the *-all.json files.
export OMP_NUM_THREADS=1
for f in kjv-1 wiki-0 kjv-2 wiki-1 kjv-3; do
    out=results/cache/$f-1024-heavy.json
    [ -s $out ] && continue
    .venv/bin/splitformer cache smollm2 --text results/cache/$f.txt --max-tokens 1024 --chunk 64 \
        --decode 8 --policy full,heavy-quadrature --budget 0.5,0.25,0.125 --json > $out.tmp && mv $out.tmp $out
done
