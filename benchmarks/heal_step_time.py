"""Seconds per healing step on this machine (issue 18, docs/depth.md "Budget"): the 10-minute
budget of each healing row is enforced as max_steps = 600 / (seconds per step), measured here
on an idle machine, so that rows measured later under other load get the same work.

    python benchmarks/heal_step_time.py [--threads 2] [--out results/depth-minilm/step_seconds.json]

For each setting (method, N_t, objective, merge, window length x batch, precision, shortest
cut, what is healed): the median of 8 timed optimiser steps after 2 untimed ones
(``compression.heal`` machinery: Distillation + AdamW; with cut lengths the mean of 24, the
lengths drawn as healing draws them), in
``--rounds`` rounds over all settings; the fastest round's median is kept (the machine is
shared: slower rounds are other load), every round recorded. ``--only S``: the settings whose
name contains S, added to an existing ``--out`` (its rounds under "only").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from splitformer.compression.coarsenings import plan
from splitformer.compression.heal import HealConfig, _cut, _optimiser_step, healed_copy
from splitformer.control.healing import Distillation
from splitformer.experiments import depth_eval
from splitformer.experiments.text_benchmarks import load_minilm
from splitformer.files import write_atomic
from splitformer.interop import from_hf

SETTINGS = {  # name: (method, steps, shooting, merge, length, batch[, precision[, min_length
    #                                                                       [, healed]]])
    "drop N3 distill 16x128": ("drop", 3, 0.0, 0, 128, 16),
    "drop N3 shoot 16x128": ("drop", 3, 1.0, 0, 128, 16),
    "coarsen-linear N3 shoot 16x128": ("coarsen-linear", 3, 1.0, 0, 128, 16),
    "coarsen-linear N2 shoot 16x128": ("coarsen-linear", 2, 1.0, 0, 128, 16),
    "N6 shoot 16x128": ("drop", 6, 1.0, 0, 128, 16),
    "N6 shoot merge40 8x256": ("drop", 6, 1.0, 40, 256, 8),
    "drop N3 shoot merge40 8x256": ("drop", 3, 1.0, 40, 256, 8),
    "drop N3 distill 16x128 bf16": ("drop", 3, 0.0, 0, 128, 16, "bfloat16"),
    "drop N3 shoot 16x128 bf16": ("drop", 3, 1.0, 0, 128, 16, "bfloat16"),
    "drop N3 shoot 16x48-128 bf16": ("drop", 3, 1.0, 0, 128, 16, "bfloat16", 48),
    "drop N3 shoot 16x48-128 bf16 controls": ("drop", 3, 1.0, 0, 128, 16, "bfloat16", 48,
                                              "controls"),
    "drop N3 shoot 8x48-128 bf16 controls": ("drop", 3, 1.0, 0, 128, 8, "bfloat16", 48,
                                             "controls"),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="results/depth-minilm/step_seconds.json")
    p.add_argument("--only", default=None, help="settings whose name contains this")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    mini = load_minilm()
    teacher = from_hf(mini.model).eval()
    path = Path(args.out)
    out = {"threads": args.threads, "rounds": [], "seconds_per_step": {}}
    if args.only and path.exists():  # the other settings' measurements are kept
        out = json.loads(path.read_text())
        if out.get("threads") != args.threads:
            raise SystemExit(f"--only: {path} was measured with {out.get('threads')} threads, "
                             f"not --threads {args.threads}")
        out.setdefault("only", {})[args.only] = []
    for _ in range(args.rounds):
        times = _round(args, mini, teacher)
        (out["only"][args.only] if "only" in out else out["rounds"]).append(times)
        for name, t in times.items():
            out["seconds_per_step"][name] = min(t, out["seconds_per_step"].get(name, t))
        write_atomic(path, json.dumps(out, indent=1) + "\n")
    return 0


def _round(args, mini, teacher) -> dict[str, float]:
    times_of = {}
    for name, (method, n, shoot, merge, length, batch, *more) in SETTINGS.items():
        precision, min_length, healed = (*more, *("float32", None, "all")[len(more):])
        if args.only and args.only not in name:
            continue
        w = depth_eval.healing_windows(mini.tokenizer, length, 4 * batch, 0)
        base = healed_copy(teacher, healed)
        c = plan(method, base, n, {"input_ids": w[:8]})
        c = c.with_merging(merge, metric="state", where="step")
        d = Distillation(c.apply(base).eval(), teacher, c.fine_points, shooting=shoot,
                         embedding=1.0)
        opt = torch.optim.AdamW([q for q in base.parameters() if q.requires_grad], lr=1e-5)
        cfg = HealConfig(length=length, min_length=min_length)
        times = []
        for i in range(10 if min_length is None else 26):  # cut lengths: the mean of 24
            t0 = time.perf_counter()
            _optimiser_step(d, opt, _cut(w[(i % 4) * batch:(i % 4 + 1) * batch], cfg, i),
                            1e-5, i, precision)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        times_of[name] = (statistics.median if min_length is None else statistics.mean)(times)
        print(f"{name}: {times_of[name]:.3f} s/step", flush=True)
    return times_of


if __name__ == "__main__":
    raise SystemExit(main())
