"""How steady ShortGPT's choice is on all-MiniLM-L6-v2 (docs/depth.md, "a steadier probe"):
the block influence BI_n = 1 - mean_x cos(u_n(x), u_{n+1}(x)) of each step on the first 32
healing windows (what ``HealConfig.probe`` = 32 reads) and on the first 512, for each window
mixture of the healing rows, with the three steps each would drop; and over the 16 blocks of
32 windows among those 512, how often the choice is steps 1, 2, 3.

    python benchmarks/depth_probe.py [--threads 1]
"""

from __future__ import annotations

import argparse

import torch

from splitformer.analysis.geometry import block_influence
from splitformer.experiments import depth_eval
from splitformer.experiments.text_benchmarks import load_minilm
from splitformer.interop import from_hf

MIXTURES = {"news=0.5": {"news": 0.5}, "news=0.75": {"news": 0.75},
            "news=0.5:wiki=0.25": {"news": 0.5, "wiki": 0.25},
            "news=0.5:wiki=0.5": {"news": 0.5, "wiki": 0.5}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    mini = load_minilm()
    model = from_hf(mini.model).eval()
    for name, kw in MIXTURES.items():
        ids = depth_eval.healing_windows(mini.tokenizer, 128, 32768, 0, **kw)[:512]
        with torch.no_grad():
            blocks = torch.stack([block_influence(list(model.trajectory(
                input_ids=ids[i:i + 32]).state_list)) for i in range(0, 512, 32)])
        drop = [sorted(sorted(range(6), key=lambda n, b=b: float(b[n]))[:3]) for b in blocks]
        mean = blocks.mean(0)
        print(f"{name}: first 32 {[round(float(b), 4) for b in blocks[0]]} -> drop {drop[0]}; "
              f"512 {[round(float(b), 4) for b in mean]} -> drop "
              f"{sorted(sorted(range(6), key=lambda n: float(mean[n]))[:3])}; blocks of 32 "
              f"choosing [1, 2, 3]: {sum(d == [1, 2, 3] for d in drop)} of 16", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
