"""Cost per step of each scheme relative to Lie, at equal parameters.

    python benchmarks/bench_schemes.py [--batch 8] [--seq 128] [--repeats 5] [--threads N]

Same controls (d_model 256, 8 heads, ff 1024, 6 layers, post-LN, float32), forward under
no_grad at tau = 1: time per step, ratio to Lie, and field evaluations per step (attention A and
FFN G: Euler 1, Heun 2, RK4 4 per stage). Last row: Strang on controls with half-width FFNs
(ff 512, used twice per step: Macaron's parameter parity) against Lie with ff 1024.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import splitformer

EVALS = {"euler": 1, "heun": 2, "rk2": 2, "rk4": 4}


def field_evaluations(scheme) -> dict[str, float]:
    counts: dict[str, float] = {}

    def walk(stages):
        for st in stages:
            if st.kind == "parallel":
                for b in st.branches:
                    walk(b)
            elif st.kind == "field":
                for f in st.fields():
                    counts[f] = counts.get(f, 0) + EVALS[st.integrator]

    walk(scheme.stages)
    return counts


def timed(model, x, repeats):
    with torch.no_grad():
        for _ in range(2):
            model(x)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(x)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def build(ff, layers=6, d=256, heads=8):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
    return splitformer.from_torch(nn.TransformerEncoder(layer, layers,
                                                        enable_nested_tensor=False)).eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build(1024)
    x = torch.randn(args.batch, args.seq, 256)
    variants = [
        ("lie", {}),
        ("lie", {"form": "tangent"}),
        ("prenorm", {}),
        ("strang", {"integrator": "euler"}),
        ("strang", {"integrator": "heun"}),
        ("strang", {"integrator": "heun", "form": "tangent"}),
        ("strang", {"integrator": "rk4"}),
        ("parallel", {}),
    ]
    steps = model.evolution.num_steps
    timed(model, x, args.repeats)  # warm-up of the whole machine
    rows = []
    for name, opts in variants:
        m = model.with_scheme(name, **opts)
        label = name + "".join(f" {k}={v}" for k, v in opts.items())
        ev = field_evaluations(m.evolution.scheme)
        rows.append((label, ev.get("attention", 0), ev.get("ffn", 0),
                     timed(m, x, args.repeats) / steps))
    half = build(512).with_scheme("strang", integrator="euler")
    rows.append(("strang, half-width FFN (ff 512)", 1, 2, timed(half, x, args.repeats) / steps))
    base = rows[0][3]
    print(f"d_model 256, 8 heads, ff 1024, 6 steps, batch {args.batch}, seq {args.seq}, "
          f"float32, threads {torch.get_num_threads()}")
    print(f"{'scheme':38} {'A evals':>7} {'G evals':>7} {'ms/step':>8} {'vs Lie':>7}")
    for label, a, g, t in rows:
        note = "   <- Macaron parity, target <= 1.1" if "half-width" in label else ""
        print(f"{label:38} {a:7g} {g:7g} {1e3 * t:8.2f} {t / base:7.3f}{note}")

if __name__ == "__main__":
    main()
