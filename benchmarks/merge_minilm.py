"""Token merging on the pretrained all-MiniLM-L6-v2, training-free: the full grid (issue 17).

For r in 0, 4, ..., 32 merged per step, with and without proportional attention, the plain
ToMe peer (bench.merge_peers) and splitformer's with_token_merging (skipped, with a line saying
so, until the library has it): throughput over r = 0 at 64, 128, 256 and 512 tokens (King James
passages; eval, no_grad, batch 8, the repeats interleaved over every setting, medians), the
mean cosine of the embeddings with the unmerged model's, and once per setting the Lee-50
fidelity (Spearman of the 1,225 pair cosines with the unmerged model's), the human Lee-50
Spearman, the 10-fold polarity probe, WordSim-353 and SimLex-999; the break-even length.
Rows go to --out (JSON lines) as they are measured; a rerun skips the rows already there.

    python benchmarks/merge_minilm.py [--out results/merge-minilm.jsonl] [--threads 2]
        [--rs 0,4,...,32] [--lengths 64,128,256,512] [--passages 32] [--batch 8]
        [--repeats 10] [--warmup 2] [--lee-r-at 256]
        [--families peer,splitformer,splitformer-state,splitformer-keys+state]
        [--option key=value ...]

Needs `make data` (all-MiniLM-L6-v2, gensim's test data, the King James text).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from splitformer.commands import int_list


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    if key.strip() == "metric":
        raise argparse.ArgumentTypeError("the metric is the family's: choose it with "
                                         "--families (splitformer, splitformer-state, ...)")
    return key.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/merge-minilm.jsonl"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rs", type=int_list(0), default=tuple(range(0, 33, 4)))
    ap.add_argument("--lengths", type=int_list(3, 512, "(tokens)"), default=(64, 128, 256, 512))
    ap.add_argument("--passages", type=int, default=32, help="passages a length (cosine)")
    ap.add_argument("--batch", type=int, default=8, help="passages timed together")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--families",
                    default="peer,splitformer,splitformer-state,splitformer-keys+state")
    ap.add_argument("--lee-r-at", type=int, default=None, metavar="N",
                    help="quality with r scaled to each text's length as round(r N_text / N) "
                         "(default: the same r on every text)")
    ap.add_argument("--option", type=_option, action="append", default=[],
                    help="key=value passed to model.with_token_merging (e.g. metric=keys)")
    ap.add_argument("--curve", type=int, default=None, metavar="N",
                    help="measure nothing: print the fidelity-throughput curves of --out at N "
                         "tokens against one r = 0 reference (experiments.merging.curve_table)")
    args = ap.parse_args(argv)
    if args.lee_r_at is not None and args.lee_r_at < 1:
        ap.error("--lee-r-at: expected a positive length")
    if args.curve is not None:
        from splitformer.experiments.merging import curve_table
        from splitformer.files import read_jsonl

        if not args.out.exists():
            ap.error(f"--curve: {args.out} does not exist")
        try:
            print(curve_table(read_jsonl(args.out), args.curve, args.lee_r_at))
        except ValueError as e:
            ap.error(f"--curve: {e}")
        return 0
    if args.batch < 1 or args.passages < args.batch:
        ap.error("--passages must be at least --batch >= 1")

    from splitformer.bench.merge_suite import OURS

    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    known = ("peer", *OURS)
    if not families or set(families) - set(known):
        ap.error(f"--families: expected some of {', '.join(known)}, got "
                 f"{args.families!r}")

    import torch
    from rich.console import Console

    from splitformer.experiments.merging import grid_table, run_grid
    from splitformer.training.data import DatasetError

    torch.set_num_threads(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        rows = run_grid(args.out, rs=tuple(dict.fromkeys((0, *args.rs))), lengths=args.lengths,
                        passages=args.passages, batch=args.batch, repeats=args.repeats,
                        warmup=args.warmup, families=families, options=dict(args.option),
                        lee_r_at=args.lee_r_at, say=lambda m: print(m, file=sys.stderr, flush=True))
    except DatasetError as e:
        print(f"merge_minilm: {e}", file=sys.stderr)
        return 2
    console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(grid_table(rows, quality_length=256 if 256 in args.lengths
                             else args.lengths[0], lee_r_at=args.lee_r_at))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
