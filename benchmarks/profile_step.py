"""Where the time of one step goes: torch.nn against splitformer, by kind of operation.

    python benchmarks/profile_step.py [--size d256] [--path train|no_grad] [--threads 2]

Profiles (``torch.profiler``, CPU) one call of each network of ``bench.peers.torch_encoder`` at
the size, after two warm-up calls, and prints the self time of its ATen operations grouped as
matrix products (mm, addmm, bmm, baddbmm, _addmm_activation), attention kernels (SDPA's flash
forward and backward, softmax and its backward, torch.nn's qkv re-layout) and everything else,
and the operations that take longest. The profiles of "What limits speed" in
docs/performance.md come from here.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch

from splitformer.bench import parse_size
from splitformer.bench.peers import torch_encoder
from splitformer.bench.timing import quiet_stderr, step_fn
from splitformer.commands import positive_int

MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
ATTENTION = ("flash_attention", "aten::_softmax", "aten::_softmax_backward_data",
             "aten::_transform_bias_rescale_qkv", "aten::_masked_softmax")


def kind(name: str) -> str:
    if name in MATMUL:
        return "matmul"
    if any(a in name for a in ATTENTION):
        return "attention"
    return "other"


def profile(run) -> tuple[dict[str, float], dict[str, float]]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    for _ in range(2):
        run()
    with quiet_stderr(), prof(activities=[ProfilerActivity.CPU]) as p:  # its C++ lines
        run()
    groups: dict[str, float] = defaultdict(float)
    ops: dict[str, float] = defaultdict(float)
    for e in p.key_averages():
        if e.key.startswith("aten::") or "flash" in e.key:
            groups[kind(e.key)] += e.self_cpu_time_total / 1e6
            ops[e.key] += e.self_cpu_time_total / 1e6
    return groups, ops


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(2, f"profile_step: error: {' '.join(str(message).split())}\n")


def _size(text: str):
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main() -> int:
    ap = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default=parse_size("d256"), type=_size)
    ap.add_argument("--path", default="train", choices=["train", "no_grad"])
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--top", type=positive_int, default=6, help="operations listed per network")
    args = ap.parse_args()
    size = args.size
    torch.set_num_threads(args.threads)
    flops = size.forward_flops() * (3 if args.path == "train" else 1)
    print(f"{size.describe()}, path {args.path}, {args.threads} threads, "
          f"{flops / 1e9:.1f} GFLOP of matrix products (Size.forward_flops, 3x in training)")
    for c in torch_encoder(size):
        groups, ops = profile(step_fn(c, args.path))
        total = sum(groups.values())
        shares = ", ".join(f"{k} {groups.get(k, 0.0) * 1e3:,.0f} ms "
                           f"({100 * groups.get(k, 0.0) / total:.0f}%)"
                           for k in ("matmul", "attention", "other"))
        print(f"\n{c.name}: {total * 1e3:,.0f} ms of operations: {shares}")
        for name, t in sorted(ops.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"    {name:60} {t * 1e3:9,.1f} ms")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("profile_step: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
