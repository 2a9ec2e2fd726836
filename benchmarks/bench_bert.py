"""from_hf(bert) against transformers' BertModel (eager and sdpa attention): wall-clock times.

Config: hidden 256, 8 heads, 6 layers, intermediate 1024, GELU, batch 32, sequence 128, float32,
random weights. Two paths: forward + backward in train mode with dropout 0, and forward in eval
mode under no_grad. Each time is the median of --repeats runs after warm-up; the ratio columns
are splitformer / transformers (below 1 = splitformer faster).

    python benchmarks/bench_bert.py [--repeats 10] [--batch 32] [--seq 128] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def _time_pair(fa, fb, repeats: int, warmup: int) -> tuple[float, float]:
    """Medians of fa and fb, run interleaved (a, b, b, a, ...) so that load on a shared machine
    weighs on both alike."""
    for _ in range(warmup):
        fa()
        fb()
    ta: list[float] = []
    tb: list[float] = []
    for i in range(repeats):
        order = ((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta))
        for fn, acc in order:
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--pad", action="store_true", help="pad the second half of every other row")
    args = ap.parse_args(argv)

    import torch
    import transformers

    from splitformer.interop.hf_bert import from_hf_model

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (args.batch, args.seq))
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    if args.pad:
        mask[::2, args.seq // 2:] = 0

    print(f"# BERT hidden={args.hidden} heads={args.heads} layers={args.layers} "
          f"intermediate={args.intermediate} batch={args.batch} seq={args.seq} float32 "
          f"pad={args.pad} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"transformers={transformers.__version__}")
    print(f"# median of {args.repeats} interleaved runs after {args.warmup} warm-up; "
          "ratio = splitformer / HF")
    header = (f"{'attn':<6} {'path':<24} {'HF (ms)':>10} {'splitformer (ms)':>17} "
              f"{'ratio':>7}")
    print(header)
    print("-" * len(header))
    for attn in ("eager", "sdpa"):
        config = transformers.BertConfig(
            vocab_size=1000, hidden_size=args.hidden, num_hidden_layers=args.layers,
            num_attention_heads=args.heads, intermediate_size=args.intermediate,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            max_position_embeddings=max(512, args.seq),
        )
        config._attn_implementation = attn
        hf = transformers.BertModel(config)
        ours = from_hf_model(hf)

        def train_step(model):
            model.train()

            def run():
                out = model(input_ids=ids, attention_mask=mask)
                loss = out.last_hidden_state.square().mean() + out.pooler_output.sum()
                loss.backward()
                model.zero_grad(set_to_none=True)

            return run

        def eval_step(model):
            model.eval()

            def run():
                with torch.no_grad():
                    model(input_ids=ids, attention_mask=mask)

            return run

        for path, make in (("train fwd+bwd (drop 0)", train_step),
                           ("eval fwd (no_grad)", eval_step)):
            t_hf, t_us = _time_pair(make(hf), make(ours), args.repeats, args.warmup)
            print(f"{attn:<6} {path:<24} {1e3 * t_hf:>10.1f} {1e3 * t_us:>17.1f} "
                  f"{t_us / t_hf:>7.2f}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
