#!/bin/sh
# docs/cache.md's measurements: every policy and budget on 1024-token windows of KJV (resumable:
# a document whose JSON exists is skipped)
cd "$(dirname "$0")/../.."
for doc in kjv-0 kjv-1 kjv-2; do
  out=results/cache/$doc-1024.json
  [ -s "$out" ] && continue
  .venv/bin/splitformer cache smollm2 --text results/cache/$doc.txt --max-tokens 1024 \
    --chunk 64 --decode 32 --json > "$out.part" 2> results/cache/$doc-1024.log && mv "$out.part" "$out"
done
