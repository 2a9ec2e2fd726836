"""torch's scaled_dot_product_attention on the CPU, forward and forward + backward, by dtype
and backend: why ``operators.sdpa.sdpa`` runs a differentiated half-precision call in
float32 on the CPU (docs/performance.md, "Half precision on the CPU").

    python benchmarks/sdpa_cpu.py [--threads 2] [--repeats 15] [--json OUT]

For each shape (batch, heads 12, tokens, head size 32) and dtype, the median milliseconds of
``--repeats`` calls after 3 untimed ones: torch's own choice (``default``), the math backend,
and ``operators.sdpa.sdpa`` (the library's call: float32 inside for a differentiated
bfloat16 / float16 call on the CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from splitformer.operators.sdpa import sdpa

SHAPES = ((16, 88), (16, 128), (8, 256))


def _median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e3, 2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    print(f"{'dtype':9} {'shape':>9}  {'path':8} {'forward ms':>10} {'fwd+bwd ms':>10}")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for batch, tokens in SHAPES:
            q, k, v = (torch.randn(batch, 12, tokens, 32, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            g = torch.randn(batch, 12, tokens, 32, dtype=dtype)
            for path, call in (("default", F.scaled_dot_product_attention),
                               ("math", F.scaled_dot_product_attention), ("sdpa", sdpa)):

                def forward(call=call, q=q, k=k, v=v):
                    with torch.no_grad():
                        call(q, k, v)

                def both(call=call, q=q, k=k, v=v, g=g):
                    call(q, k, v).backward(g)

                with sdpa_kernel(SDPBackend.MATH) if path == "math" else nullcontext():
                    row = {"dtype": str(dtype).removeprefix("torch."), "batch": batch,
                           "tokens": tokens, "path": path,
                           "forward_ms": _median_ms(forward, args.repeats),
                           "forward_backward_ms": _median_ms(both, args.repeats)}
                rows.append(row)
                print(f"{row['dtype']:9} {batch:>3}x{tokens:<5}  {path:8} "
                      f"{row['forward_ms']:>10} {row['forward_backward_ms']:>10}", flush=True)
    summary = {"threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
               "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
