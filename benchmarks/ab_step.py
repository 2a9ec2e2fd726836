"""One group of `splitformer bench encoder` timed with every contender interleaved in one
process (issue 17's no-regression bar, docs/space.md): `bench encoder`'s own measurement
(``bench.timing.measure``: the repeats interleaved, medians) with more repeats and one group
per process, and splitformer's ratio to each peer. Run it with PYTHONPATH at the old and the
new checkout in turn (``benchmarks/ab_step.sh``): splitformer's own milliseconds and its ratio
to the steadiest peer say whether the library got slower, where the ratio of a 3-run `bench
encoder` moves with a noisy peer (Hugging Face's eager attention under training spreads by
30%).

    python benchmarks/ab_step.py GROUP [--path train] [--repeats 15] [--threads 2] [--json]

GROUP: timm (timm ViT), hf (Hugging Face BERT eager and sdpa), post (torch.nn post-LN),
pre (torch.nn pre-LN); at the d256 size of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "_stubs"))
from standin import import_timm  # noqa: E402

sys.path.pop(0)
import_timm()

import torch  # noqa: E402

from splitformer.bench import peers  # noqa: E402
from splitformer.bench.sizes import SIZES  # noqa: E402
from splitformer.bench.timing import PATHS, measure  # noqa: E402

GROUPS = {
    "timm": lambda size: peers.timm_vit(size),
    "hf": lambda size: peers.hf_bert(size),
    "post": lambda size: peers.torch_encoder(size),
    "pre": lambda size: peers.torch_encoder(size, norm_first=True),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("group", choices=sorted(GROUPS),
                    help="timm (timm ViT), hf (HF BERT eager, sdpa), post / pre (torch.nn "
                         "post-LN / pre-LN encoder)")
    ap.add_argument("--path", choices=PATHS, default="train")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = ap.parse_args()
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    contenders = GROUPS[args.group](SIZES["d256"])
    result = measure(contenders, args.path, repeats=args.repeats, warmup=2)
    ms = {name: r["median_s"] for name, r in result.items()}
    ours = ms["splitformer"]
    row = {"group": args.group, "path": args.path,
           "ms": {k: round(m * 1e3, 2) for k, m in ms.items()},
           "ratios": {k: round(ours / m, 4) for k, m in ms.items() if k != "splitformer"}}
    print(json.dumps(row) if args.json else
          "  ".join([f"{k} {v:.1f} ms" for k, v in row["ms"].items()]
                    + [f"/ {k} {v:.3f}" for k, v in row["ratios"].items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
