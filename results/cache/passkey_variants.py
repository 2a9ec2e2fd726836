# The passkey test (splitformer.experiments.passkey, compressed once after the question, kvpress's
# append protocol) with policies whose observation window is the question's length, at 1024
# tokens, budget 0.25: does observing the question's queries alone keep the key?
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/passkey_variants.py \
#       > results/cache/passkey-variants.log
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/passkey_variants.py second \
#       > results/cache/passkey-variants-2.log
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/passkey_variants.py 2048 \
#       > results/cache/passkey-variants-2048.log
import json
import sys
import time

import torch

import splitformer
from splitformer.experiments.passkey import QUESTION, prompts, run_row
from splitformer.operators import cache_policy as cp

torch.set_num_threads(1)
m = splitformer.from_hf("smollm2").eval()
q = len(m.tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
length = 2048 if "2048" in sys.argv[1:] else 1024
ids, keys = prompts(m.tokenizer, length, 10)
keep = int(0.25 * length)
# the first run (results/cache/passkey-variants.log); `second` (passkey-variants-2.log): more of
# the merged stretch protected, with SnapKV's pooling
pols = [cp.SnapKV(keep, window=q), cp.SnapKV(keep, window=q, kernel=1),
        cp.AdaptiveQuadrature(keep, window=q), cp.AdaptiveQuadrature(keep, window=q, recent=0.25),
        cp.AdaptiveQuadrature(keep, window=q, recent=0.25, protect=0.75, kernel=1)]
if sys.argv[1:] == ["second"]:
    pols = [cp.AdaptiveQuadrature(keep, window=q, recent=0.25, protect=0.75),
            cp.AdaptiveQuadrature(keep, window=q, recent=0.25, protect=0.9)]
if "2048" in sys.argv[1:]:  # passkey-variants-2048.log: the two that kept 9/10 at 1024
    pols = [cp.SnapKV(keep, window=q),
            cp.AdaptiveQuadrature(keep, window=q, recent=0.25, protect=0.9)]
print(f"question: {q} tokens; {length} tokens, 10 placements, budget {keep} nodes", flush=True)
for pol in pols:
    t = time.time()
    row = run_row(m, ids, keys, pol, chunk=length, decode="append")
    print(json.dumps({"policy": repr(pol), "right": row["right"], "answers": row["answers"],
                      "seconds": round(time.time() - t)}), flush=True)
