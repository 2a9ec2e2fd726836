# quadrature merging's recent window at 1024 KJV tokens of SmolLM2, the settings of focus.sh
# (chunk 64, decode 8):
#   nice -n 10 .venv/bin/python results/cache/variants1024.py > results/cache/variants-1024.log
import time

import torch

import splitformer
from splitformer.models.generation import score_stream
from splitformer.operators.cache_policy import QuadratureMerging, ValueMerging

m = splitformer.from_hf("smollm2").eval()
text = open("results/cache/kjv-0.txt").read()
ids = torch.tensor([m.tokenizer(text)["input_ids"][:1024]])
for pol in [QuadratureMerging(128, recent=0.9), QuadratureMerging(256, recent=0.9),
            QuadratureMerging(128, recent=0.5), ValueMerging(256), ValueMerging(128)]:
    t = time.time()
    r = score_stream(m, ids, policy=pol, chunk=64, decode=8)
    print(pol, f"perplexity {r.perplexity:.4f} nll/token {r.nll / r.tokens:.5f}",
          f"({time.time() - t:.0f} s)", flush=True)
