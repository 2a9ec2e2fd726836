#!/bin/sh
# the comparison the issue's goal asks for, cut to fit the session: quadrature merging against
# StreamingLLM at 25% and 12.5% of 1024 KJV tokens (the full row is results/cache/kjv-0-1024.json.part)
cd "$(dirname "$0")/../.."
.venv/bin/splitformer cache smollm2 --text results/cache/kjv-0.txt --max-tokens 1024 --chunk 64 \
  --decode 8 --policy quadrature,streaming --budget 0.25,0.125 --json \
  > results/cache/kjv-0-1024-focus.json 2> results/cache/kjv-0-1024-focus.log
