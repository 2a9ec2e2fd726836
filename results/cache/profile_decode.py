# cProfile of 8 decode steps after 2048 random tokens (prefilled in chunks of 256), the plain tape
# and StreamingLLM at 25%, one thread (docs/cache.md, amortised compression):
#   .venv/bin/python results/cache/profile_decode.py
import cProfile
import pstats
import time

import torch

import splitformer
from splitformer.operators.cache_policy import cache_policy
from splitformer.operators.tape import KVTape

torch.set_num_threads(1)
m = splitformer.from_hf("smollm2").eval()
ids = torch.randint(0, 49000, (1, 2048), generator=torch.Generator().manual_seed(0))
for pol in [None, cache_policy("streaming", 0.25)]:
    tape = KVTape(capacity=0 if pol else 2100, policy=pol)
    with torch.no_grad():
        for s in range(0, 2048, 256):
            lg = m(ids[:, s:s+256], tape=tape).logits
        nxt = lg[:, -1].argmax(-1, keepdim=True)
        t = time.perf_counter()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(8):
            lg = m(nxt, tape=tape).logits
        pr.disable()
        print(pol, (time.perf_counter() - t) / 8)
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
