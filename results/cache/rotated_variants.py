# merged keys averaged as the tape holds them (rotated at their own coordinates: the first-order
# exact mean score of the rotary kernel) against unrotated and rotated at the merged coordinate
# (the policies' rule), on LEN tokens of TEXT (chunk 64, decode 8):
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/rotated_variants.py TEXT LEN > LOG
import sys
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

import splitformer
from splitformer.models.generation import score_stream
from splitformer.operators import cache_policy as cp


def rotated(cls):
    @dataclass(frozen=True)
    class Rotated(cls):
        name: ClassVar[str] = cls.name + "-rotated"

        def compress(self, grid, keep, rotation):
            return super().compress(grid, keep, None)

    Rotated.__name__ = cls.__name__ + "Rotated"
    return Rotated


m = splitformer.from_hf("smollm2").eval()
text = open(sys.argv[1]).read()
ids = torch.tensor([m.tokenizer(text)["input_ids"][:int(sys.argv[2])]])
n = ids.shape[1]
pols = [cp.FullCache()]
for b in (0.25, 0.125):
    k = int(-(-b * n // 1))
    pols += [cp.HeavyHitters(k), cp.HeavyQuadrature(k), rotated(cp.HeavyQuadrature)(k),
             cp.HeavyQuadrature(k, merged=1 / 32), rotated(cp.HeavyQuadrature)(k, merged=1 / 32),
             cp.QuadratureMerging(k), rotated(cp.QuadratureMerging)(k)]
for pol in pols:
    t = time.time()
    r = score_stream(m, ids, policy=pol, chunk=64, decode=8)
    print(type(pol).__name__, pol, f"perplexity {r.perplexity:.4f}", f"({time.time() - t:.0f} s)",
          flush=True)
