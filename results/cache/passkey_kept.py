# Which of the key's digits SnapKV keeps (docs/cache.md, "50 placements"): the 1024-token
# prompts of the 50-placement run that the question-window SnapKV answered wrong (placements 7,
# 15, 19, 35, 42), compressed once to 25% with pooling widths 5 and 9; per digit of each of the
# key's two statements, the share of (attention evaluation, key/value head) grids that keep it.
#   OMP_NUM_THREADS=1 .venv/bin/python results/cache/passkey_kept.py \
#       > results/cache/passkey-kept.log
import torch

import splitformer
from splitformer.experiments.passkey import prompts
from splitformer.operators.cache_policy import cache_policy
from splitformer.operators.tape import KVTape

torch.set_num_threads(1)
m = splitformer.from_hf("smollm2").eval()
ids, keys = prompts(m.tokenizer, 1024, 50)
for i in (7, 15, 19, 35, 42):
    row = ids[i].tolist()
    digits = [m.tokenizer(d, add_special_tokens=False)["input_ids"][0] for d in keys[i]]
    starts = [j for j in range(len(row) - 5) if row[j:j + 5] == digits]
    for kernel in (5, 9):
        tape = KVTape(capacity=0, policy=cache_policy(f"snapkv:window=10:kernel={kernel}", 0.25))
        with torch.no_grad():
            m(ids[i:i + 1], tape=tape)
        kept = torch.stack([e.grid.coords[0] for e in tape.entries])  # (evaluations, H_kv, n)
        shares = []
        for s in starts:
            shares.append(" ".join(f"{float((kept == s + d).any(-1).float().mean()):.2f}"
                                   for d in range(5)))
        print(f"placement {i} key {keys[i]} kernel {kernel}: digits kept (share of grids), "
              + " | ".join(shares), flush=True)
