# The passkey's best rules (an observation window of the question's 10 queries) on perplexity:
# each text's first 1024 tokens streamed (chunk 64, decode 8), so the window is each forward's
# last 10 queries; the loss added to the full cache's per token.
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/question_window.py \
#       > results/cache/question-window-1024.log
import math

import torch

import splitformer
from splitformer.models.generation import score_stream
from splitformer.operators import cache_policy as cp

m = splitformer.from_hf("smollm2").eval()
for name in ("kjv-1", "kjv-2", "kjv-3", "wiki-0", "wiki-1"):
    text = open(f"results/cache/{name}.txt").read()
    ids = torch.tensor([m.tokenizer(text)["input_ids"][:1024]])
    full = score_stream(m, ids, chunk=64, decode=8).perplexity
    for b in (512, 256, 128):
        for pol in (cp.SnapKV(b, window=10),
                    cp.AdaptiveQuadrature(b, window=10, recent=0.25, protect=0.9)):
            p = score_stream(m, ids, policy=pol, chunk=64, decode=8).perplexity
            print(name, b, pol, f"perplexity {p:.4f}",
                  f"added {100 * (math.log(p) / math.log(full) - 1):+.2f}%", flush=True)
