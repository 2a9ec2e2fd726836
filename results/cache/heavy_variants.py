# exploring merging with observed attention on 1024 KJV tokens of SmolLM2 (chunk 64, decode 8):
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/heavy_variants.py TEXT > LOG
import sys
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

import splitformer
from splitformer.models.generation import score_stream
from splitformer.operators import cache_policy as cp


@dataclass(frozen=True)
class Scored(cp.HeavyHitters):
    """sinks + recent whole; the middle merged with the observed Ward cost."""
    sinks: int = 4
    name: ClassVar[str] = "scored"
    merges_keys: ClassVar[bool] = True

    def compress(self, grid, keep, rotation):
        n = len(grid)
        s = min(self.sinks, keep - 1)
        r = min(int(self.recent * (keep - s)), keep - s - 1)
        dev = grid.keys.device
        b, h = grid.keys.shape[:2]
        middle = grid.take(torch.arange(s, n - r, device=dev).expand(b, h, n - r - s).contiguous())
        middle = cp._merge_neighbours(middle, keep - s - r, rotation, observed=True)
        head = grid.take(torch.arange(s, device=dev).expand(b, h, s).contiguous())
        tail = grid.take(torch.arange(n - r, n, device=dev).expand(b, h, r).contiguous())
        return head.cat(middle).cat(tail)


m = splitformer.from_hf("smollm2").eval()
text = open(sys.argv[1]).read()
ids = torch.tensor([m.tokenizer(text)["input_ids"][:1024]])
class ObservedPool(cp.HeavyQuadrature):
    """HeavyQuadrature whose pool is merged with the observed Ward cost."""
    name: ClassVar[str] = "observed-pool"

    def compress(self, grid, keep, rotation):
        orig = cp._merge_neighbours
        cp._merge_neighbours = lambda g, k, r: orig(g, k, r, observed=True)
        try:
            return super().compress(grid, keep, rotation)
        finally:
            cp._merge_neighbours = orig


pols = [cp.FullCache()]
for b in (256, 128):
    pols += [cp.StreamingLLM(b), cp.HeavyHitters(b)]
    pols += [cp.HeavyQuadrature(b, merged=f) for f in (1 / 128, 1 / 64, 1 / 32, 1 / 16)]
    pols += [ObservedPool(b, merged=f) for f in (1 / 64, 1 / 32)]
for pol in pols:
    t = time.time()
    r = score_stream(m, ids, policy=pol, chunk=64, decode=8)
    print(pol, f"perplexity {r.perplexity:.4f}", f"({time.time() - t:.0f} s)", flush=True)
