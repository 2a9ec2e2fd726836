"""Peak memory and time of one training step (forward + backward) for each adjoint at N_t = 48.

    python benchmarks/bench_adjoints.py [--depth 4] [--steps 48] [--width 64] [--heads 4]
                                        [--image 32] [--patch 4] [--batch 32] [--threads N]
                                        [--kinetic 0.0] [--rss] [--json]

A ViT evolution (timm read-out, float32, random weights; ``--depth`` control sets refined to
``--steps`` time steps: tau = depth / steps) on a batch of random images; the objective is
cross entropy (``control.ControlProblem``), plus the kinetic energy when ``--kinetic`` > 0.
Rows: "backprop" and "checkpoint" on the network's scheme (pre-norm), and "backprop" and
"reversible" on the reversible scheme (its own reference, same controls).

Peak memory is measured with torch's profiler (``profile_memory=True``): every allocation and
free of a tensor during the step (forward, backward, the parameters' .grad) in order, and the
largest running total above what was allocated when the step began. It counts tensor storage
only (exactly, not process RSS). The ratio column is backprop (of the same scheme) / the row.
Each row also checks that its gradients equal those of backprop of the same scheme (max
relative difference per parameter tensor, floored at 1e-6 of the largest gradient).

``--rss`` adds a cross-check in process memory: each row in a fresh subprocess (warmed up
on one example), the growth of the peak resident set size (VmHWM, reset before the step) over
the resident set size before the step, with glibc's mmap threshold fixed at 64 kB
(MALLOC_MMAP_THRESHOLD_=65536: large blocks are returned to the system when freed; with the
default dynamic threshold glibc keeps freed blocks in its heap, reusable but counted in the
RSS, which added 50 to 60 MiB to every row of the default run).

Bars (issue 8): checkpoint >= 4x lower than backprop, reversible >= 8x lower.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from splitformer.control import ControlProblem, KineticEnergy
from splitformer.models import build_vit

ROWS = (("network", "backprop"), ("network", "checkpoint"), ("reversible", "backprop"),
        ("reversible", "reversible"))


def build(args, scheme: str):
    torch.manual_seed(0)
    m = build_vit(image_size=args.image, patch_size=args.patch, in_chans=3, dim=args.width,
                  depth=args.depth, num_heads=args.heads, hidden_dim=2 * args.width,
                  num_classes=10, read_out="timm")
    if scheme != "network":
        m = m.with_scheme(scheme)
    return m.refine(args.steps // args.depth) if args.steps != args.depth else m


def step(problem, x, y) -> None:
    problem.zero_grad(set_to_none=True)
    problem((x,), y).total.backward()


def peak_bytes(fn) -> int:
    """The largest running total of tensor bytes allocated (minus freed) while fn runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    total = peak = 0
    for e in events:
        total += e.nbytes()
        peak = max(peak, total)
    return peak


def grads(problem) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in problem.parameters() if p.grad is not None]


def rel_diff(gs: list[torch.Tensor], refs: list[torch.Tensor]) -> float:
    """max over the parameters of |g - r|_inf / max(|r|_inf, 1e-6 max_k |r_k|_inf)."""
    scale = max(r.abs().max().item() for r in refs)
    return max(((g - r).abs().max() / max(r.abs().max().item(), 1e-6 * scale)).item()
               for g, r in zip(gs, refs, strict=True))


def measure(args, scheme: str, adjoint: str, x, y) -> dict:
    costs = [KineticEnergy(args.kinetic)] if args.kinetic > 0 else []
    problem = ControlProblem(build(args, scheme), F.cross_entropy, costs, adjoint=adjoint)
    problem.train()
    step(problem, x, y)  # warm-up: lazy initialisation outside the measurement
    problem.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    step(problem, x, y)
    seconds = time.perf_counter() - t0
    g = grads(problem)
    problem.zero_grad(set_to_none=True)
    peak = peak_bytes(lambda: step(problem, x, y))
    return {"scheme": scheme, "adjoint": adjoint, "peak_bytes": peak, "seconds": seconds,
            "grads": g, "N_t": problem.model.evolution.num_steps,
            "tau": problem.model.evolution.tau}


def _status_bytes(key: str) -> int:
    """A "kB" field of /proc/self/status (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def rss_growth(args, scheme: str, adjoint: str, x, y) -> int:
    """In this process: the peak RSS of one step (VmHWM, reset before it through
    /proc/self/clear_refs) minus the RSS before it, in bytes; warmed up by a step on one
    example, so that code pages and thread pools are not counted. (Not getrusage's ru_maxrss:
    Linux carries the parent's high-water mark into a vforked child across exec.)"""
    costs = [KineticEnergy(args.kinetic)] if args.kinetic > 0 else []
    problem = ControlProblem(build(args, scheme), F.cross_entropy, costs, adjoint=adjoint)
    problem.train()
    step(problem, x[:1], y[:1])  # code paths and thread pools warm, little memory
    problem.zero_grad(set_to_none=True)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    except OSError:
        pass  # then the peak may include the small warm-up step
    before = _status_bytes("VmRSS")
    step(problem, x, y)
    return _status_bytes("VmHWM") - before


def rss_row(scheme: str, adjoint: str) -> int:
    argv = [a for a in sys.argv[1:] if a not in ("--rss", "--json")]
    out = subprocess.run([sys.executable, __file__, *argv, "--rss-row", f"{scheme}:{adjoint}"],
                         check=True, capture_output=True, text=True,
                         env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}).stdout
    return int(out.split()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--kinetic", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rss", action="store_true")
    p.add_argument("--rss-row", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.steps % args.depth:
        p.error("--steps must be a multiple of --depth")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    x = torch.randn(args.batch, 3, args.image, args.image)
    y = torch.randint(0, 10, (args.batch,))
    if args.rss_row:
        print(rss_growth(args, *args.rss_row.split(":"), x, y))
        return
    rows = [measure(args, s, a, x, y) for s, a in ROWS]
    if args.rss:
        for r in rows:
            r["rss_bytes"] = rss_row(r["scheme"], r["adjoint"])
    ref = {r["scheme"]: r for r in rows if r["adjoint"] == "backprop"}
    for r in rows:
        base = ref[r["scheme"]]
        r["ratio"] = base["peak_bytes"] / r["peak_bytes"]
        r["grad_rel_diff"] = rel_diff(r["grads"], base["grads"])
    for r in rows:
        r.pop("grads", None)
    if args.json:
        print(json.dumps({"config": vars(args), "rows": rows}))
        return
    n = rows[0]
    print(f"ViT d={args.width} heads={args.heads} tokens={(args.image // args.patch) ** 2 + 1} "
          f"batch={args.batch} float32; depth {args.depth} refined to N_t = {n['N_t']} "
          f"(tau = {n['tau']:g}); kinetic weight {args.kinetic:g}; "
          f"threads {torch.get_num_threads()}")
    print(f"{'scheme':<12}{'adjoint':<12}{'peak MiB':>10}{'backprop/row':>14}{'step s':>9}"
          f"{'grad rel diff':>15}" + (f"{'RSS growth MiB':>16}" if args.rss else ""))
    for r in rows:
        rss = f"{r['rss_bytes'] / 2**20:>16.1f}" if args.rss else ""
        print(f"{r['scheme']:<12}{r['adjoint']:<12}{r['peak_bytes'] / 2**20:>10.1f}"
              f"{r['ratio']:>13.1f}x{r['seconds']:>9.2f}{r['grad_rel_diff']:>15.1e}{rss}")


if __name__ == "__main__":
    main()
