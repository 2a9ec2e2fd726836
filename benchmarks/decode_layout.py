"""One decode step of GPT-2 small on the KV tape with each memory layout of the linear weights,
against transformers' own decode step with its DynamicCache (docs/performance.md, "Generation").

    python benchmarks/decode_layout.py [--threads 1] [--rounds 3] [--steps 30]

Decoding reads every weight once per token from memory (a matrix-vector product per weight).
``from_hf`` keeps GPT-2's Conv1D weights in transformers' (in, out) memory layout
(``interop.hf_gpt2.source_layout_``); the row "(out, in) contiguous" is the same model with
those weights copied into the row-major (out, in) layout ``nn.Linear`` uses. Random weights,
a prompt of 128 tokens, the median of ``--steps`` decode steps, rounds interleaved; prints one
line per round (ms per decode step).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    import transformers

    import splitformer
    from splitformer.operators.tape import KVTape

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_positions=512, eos_token_id=None, pad_token_id=0,
                                  attn_implementation="sdpa")
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    source = splitformer.from_hf(hf).eval()
    rowmajor = splitformer.from_hf(hf).eval()
    with torch.no_grad():
        for p_ in rowmajor.parameters():
            if p_.dim() == 2 and not p_.is_contiguous():
                p_.data = p_.data.contiguous()
    ids = torch.randint(0, cfg.vocab_size, (1, 128 + args.steps))

    def ours(model) -> float:
        tape = KVTape(capacity=ids.shape[1])
        with torch.no_grad():
            model(ids[:, :128], tape=tape, logits_to_keep=1)
            ts = []
            for i in range(128, ids.shape[1]):
                t = time.perf_counter()
                model(ids[:, i:i + 1], tape=tape, logits_to_keep=1)
                ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    def theirs() -> float:
        with torch.no_grad():
            out = hf(ids[:, :128], use_cache=True, logits_to_keep=1)
            cache, ts = out.past_key_values, []
            for i in range(128, ids.shape[1]):
                t = time.perf_counter()
                out = hf(ids[:, i:i + 1], past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
                cache = out.past_key_values
                ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    print(f"GPT-2 small, one decode step after 128 tokens, {args.threads} thread(s), median of "
          f"{args.steps} steps (ms)")
    for r in range(args.rounds):
        print(f"round {r + 1}: splitformer, source layout {ours(source) * 1e3:.1f}; "
              f"(out, in) contiguous {ours(rowmajor) * 1e3:.1f}; transformers "
              f"{theirs() * 1e3:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
