# heavy-quadrature's merged fraction, and its partners chosen by the observed Ward cost
# (observed=True), against StreamingLLM and H2O on the first 1024 tokens of TEXT (chunk 64,
# decode 8); results/cache/ratios.py LOG prints each row against H2O at its budget:
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/heavy_variants.py TEXT > LOG
import sys
import time

import torch

import splitformer
from splitformer.models.generation import score_stream
from splitformer.operators import cache_policy as cp

m = splitformer.from_hf("smollm2").eval()
text = open(sys.argv[1]).read()
ids = torch.tensor([m.tokenizer(text)["input_ids"][:1024]])
pols = [cp.FullCache()]
for b in (256, 128):
    pols += [cp.StreamingLLM(b), cp.HeavyHitters(b)]
    pols += [cp.HeavyQuadrature(b, merged=f) for f in (1 / 128, 1 / 64, 1 / 32, 1 / 16)]
    pols += [cp.HeavyQuadrature(b, merged=f, observed=True) for f in (1 / 64, 1 / 32)]
for pol in pols:
    t = time.time()
    r = score_stream(m, ids, policy=pol, chunk=64, decode=8)
    print(pol, f"perplexity {r.perplexity:.4f}", f"({time.time() - t:.0f} s)", flush=True)
