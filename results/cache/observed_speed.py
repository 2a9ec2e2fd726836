# Compress-once prefill time of an observing policy against the full cache (docs/cache.md,
# "In the code"): 2 passkey prompts of 1024 tokens, one thread, each twice, interleaved.
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/observed_speed.py \
#       > results/cache/observed-speed.log
import time

import torch

import splitformer
from splitformer.experiments.passkey import prompts, run_row
from splitformer.operators.cache_policy import cache_policy

torch.set_num_threads(1)
m = splitformer.from_hf("smollm2").eval()
ids, keys = prompts(m.tokenizer, 1024, 2)
for spec in ["full", "snapkv:window=10", "full", "snapkv:window=10"]:
    t = time.time()
    policy = cache_policy(spec, 1.0 if spec == "full" else 0.25)
    r = run_row(m, ids, keys, policy, 1024, "append")
    print(spec, round(time.time() - t, 1), r["right"], flush=True)
