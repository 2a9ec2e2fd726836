"""Seconds per healing step on this machine (issue 18, docs/depth.md "Budget"): the 10-minute
budget of each healing row is enforced as max_steps = 600 / (seconds per step), measured here
on an idle machine, so that rows measured later under other load get the same work.

    python benchmarks/heal_step_time.py [--threads 2] [--out results/depth-minilm/step_seconds.json]

For each setting (N_t, objective, merge, window length x batch): the median of 8 timed
optimiser steps after 2 untimed ones (``compression.heal`` machinery: Distillation + AdamW).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from splitformer.compression.coarsenings import plan
from splitformer.control.healing import Distillation
from splitformer.experiments import depth_eval
from splitformer.experiments.text_benchmarks import load_minilm
from splitformer.files import write_atomic
from splitformer.interop import from_hf

SETTINGS = {  # name: (steps, shooting, merge, length, batch)
    "N3 distill 16x128": (3, 0.0, 0, 128, 16),
    "N3 shoot 16x128": (3, 1.0, 0, 128, 16),
    "N2 shoot 16x128": (2, 1.0, 0, 128, 16),
    "N6 shoot 16x128": (6, 1.0, 0, 128, 16),
    "N6 shoot merge40 8x256": (6, 1.0, 40, 256, 8),
    "N3 shoot merge40 8x256": (3, 1.0, 40, 256, 8),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="results/depth-minilm/step_seconds.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    mini = load_minilm()
    teacher = from_hf(mini.model).eval()
    out = {"threads": args.threads, "seconds_per_step": {}}
    for name, (n, shoot, merge, length, batch) in SETTINGS.items():
        w = depth_eval.healing_windows(mini.tokenizer, length, 4 * batch, 0)
        base = copy.deepcopy(teacher)
        c = plan("coarsen-linear" if n != 3 else "drop", base, n, {"input_ids": w[:8]})
        c = c.with_merging(merge, metric="state", where="step")
        d = Distillation(c.apply(base).eval(), teacher, c.fine_points, shooting=shoot,
                         embedding=1.0)
        opt = torch.optim.AdamW(base.parameters(), lr=1e-5)
        times = []
        for i in range(10):
            t0 = time.perf_counter()
            obj = d({"input_ids": w[(i % 4) * batch:(i % 4 + 1) * batch]})
            opt.zero_grad()
            obj.total.backward()
            opt.step()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        out["seconds_per_step"][name] = statistics.median(times)
        print(f"{name}: {statistics.median(times):.3f} s/step", flush=True)
    write_atomic(Path(args.out), json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
