#!/bin/sh
# Every policy at every budget on 1024 tokens of 6 texts (4 King James, 2 Wikipedia), one core:
# the variation across texts that docs/cache.md states the margins against. Resumable per file.
#   python -c "..." (docs/cache.md) wrote kjv-0..3.txt; wiki-0/1.txt are 40,000 characters of
#   gensim's Wikipedia extract (its articles joined by blank lines) at offsets 0 and the middle.
export OMP_NUM_THREADS=1
for f in kjv-1 wiki-0 kjv-2 wiki-1 kjv-3; do
    out=results/cache/$f-1024-all.json
    [ -s $out ] && continue
    .venv/bin/splitformer cache smollm2 --text results/cache/$f.txt --max-tokens 1024 --chunk 64 \
        --decode 8 --policy full,streaming,h2o,tova,snapkv,merge-values,quadrature,adaptive \
        --budget 0.5,0.25,0.125 --json > $out.tmp && mv $out.tmp $out
done
