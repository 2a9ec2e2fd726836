"""from_torch(m) against m: time ratios for a training step and for inference.

    python benchmarks/bench_encoder.py [--repeats 7] [--batch 32] [--seq 128] [--threads N]

Prints a table: median seconds of torch.nn and splitformer, and their ratio, for
(1) forward + backward in train mode (dropout 0) and (2) forward in eval under no_grad (torch's
fused inference path), post-LN and pre-LN.
Targets (issue 2): ratio <= 1.05 for (1), <= 1.15 for (2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

import splitformer


def _median_time(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(args) -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for norm_first in (False, True):
        layer = nn.TransformerEncoderLayer(args.d_model, args.heads, args.ff, dropout=0.0,
                                           batch_first=True, norm_first=norm_first)
        ref = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
        ours = splitformer.from_torch(ref)
        x = torch.randn(args.batch, args.seq, args.d_model)

        def train_step(m, x=x):
            def run():
                m.zero_grad(set_to_none=True)
                m(x).square().mean().backward()
            return run

        def infer(m, x=x):
            def run():
                with torch.no_grad():
                    m(x)
            return run

        for label, mode, make in (("train fwd+bwd", True, train_step), ("eval no_grad", False,
                                                                        infer)):
            ref.train(mode)
            ours.train(mode)
            # interleave to share machine noise
            t_ref, t_ours = [], []
            for _ in range(args.rounds):
                t_ref.append(_median_time(make(ref), args.repeats))
                t_ours.append(_median_time(make(ours), args.repeats))
            tr, to = min(t_ref), min(t_ours)
            rows.append({"layout": "pre-LN" if norm_first else "post-LN", "path": label,
                         "torch_s": tr, "splitformer_s": to, "ratio": to / tr})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--ff", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; min taken")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = bench(args)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"d_model {args.d_model}, heads {args.heads}, layers {args.layers}, ff {args.ff}, "
          f"batch {args.batch}, seq {args.seq}, float32, threads {torch.get_num_threads()}")
    print(f"{'layout':8} {'path':15} {'torch.nn (s)':>12} {'splitformer (s)':>16} {'ratio':>7}")
    for r in rows:
        print(f"{r['layout']:8} {r['path']:15} {r['torch_s']:12.4f} {r['splitformer_s']:16.4f} "
              f"{r['ratio']:7.3f}")


if __name__ == "__main__":
    main()
