"""The node-splitting table of docs/space.md: for every family x kernel, splitting node 2 into
two copies at x_2 with half its weight changes every read-out by at most round-off; copies with
the full weight move it. Run from the repository root:

    .venv/bin/python benchmarks/token_grid_split.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_token_grid_families as T  # noqa: E402

from splitformer.operators.kernels import KERNEL_NAMES  # noqa: E402


def main() -> None:
    worst_half, least_full = 0.0, float("inf")
    print(f"{'family':18s} {'kernel':9s} {'half weights':>12s} {'full weights':>12s}")
    for name in T.GRID_FAMILIES:
        for kernel in [None, *sorted(KERNEL_NAMES)]:
            built = T.family(name, kernel)
            if built is None:
                continue
            model, inputs = built
            u0, ctx = T.skeleton(model, inputs)
            b, n = u0.shape[:2]
            g = torch.Generator().manual_seed(1)
            w = torch.rand(b, n, generator=g, dtype=T.D) + 0.2
            c = torch.sort(torch.rand(b, n, generator=g, dtype=T.D) * n, -1).values
            y = T.solve_on(model, u0, T.on_grid(ctx, w, c))
            half = T.split_error(y, T.solve_on(model, *T.split_context(u0, ctx, w, c, 2)), 2)
            full = T.split_error(y, T.solve_on(
                model, *T.split_context(u0, ctx, w, c, 2, halve=False)), 2)
            worst_half, least_full = max(worst_half, half), min(least_full, full)
            print(f"{name:18s} {kernel or '(own)':9s} {half:12.1e} {full:12.1e}")
    print(f"largest change with half weights {worst_half:.1e}; "
          f"smallest change with full-weight copies {least_full:.3g}")


if __name__ == "__main__":
    main()
