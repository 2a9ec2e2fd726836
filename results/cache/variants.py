# quadrature merging recent-window variants against StreamingLLM on 512 KJV tokens of SmolLM2
# (nice -n 10 python results/cache/variants.py > results/cache/variants-512.log)
import time

import torch

import splitformer
from splitformer.models.generation import score_stream
from splitformer.operators.cache_policy import QuadratureMerging, StreamingLLM

m = splitformer.from_hf("smollm2").eval()
tok = m.tokenizer
text = open("results/cache/kjv-0.txt").read()
ids = torch.tensor([tok(text)["input_ids"][:512]])
n = ids.shape[1]
for pol in [QuadratureMerging(128, recent=0.75), QuadratureMerging(128, recent=0.9),
            QuadratureMerging(32, recent=0.75), StreamingLLM(32)]:
    t = time.time()
    r = score_stream(m, ids, policy=pol, chunk=64, decode=0)
    print(pol, r.perplexity, round(time.time()-t, 1), flush=True)
