"""Measured exactness of the Llama family's map: the tables of docs/decoders.md.

For every family whose record's map is ``hf_llama`` (Llama, Mistral, Qwen2, Qwen3, Gemma2,
Gemma3 text), the transformers model of the record's example config (seeded, every parameter
perturbed by 0.2 N(0, 1): norm gains away from 1) is read by ``splitformer.from_hf`` and both
run on a left-padded batch of 3 x 9 tokens; printed: the max |logits difference| on the kept
tokens per dtype and attention path, whether the round trip to_hf(from_hf(m)) is the identity,
and whether greedy ``generate`` (16 new tokens on the KV tape, left padding) gives transformers'
ids. transformers' eager path in float64 computes its softmax in float32 and turns left-padded
rows NaN, so that column is measured without padding and is not a bar check (except Gemma2,
whose soft-capped kernel follows transformers' eager path). Bars: float64 1e-10, float32 1e-5
("!" and exit status 1 above them). With ``--smollm2`` (needs `make data`): the packaged
SmolLM2-135M-Instruct, logits on 2 x 64 tokens of Genesis 1 (KJV) against transformers' own
dequantised network (bar 1e-4, float32).

    python benchmarks/decoder_exactness.py [--smollm2] [--threads N]
"""

from __future__ import annotations

import argparse
import sys

import torch

import splitformer
from splitformer.interop.families import families
from splitformer.verification.references import perturb_

BARS = {torch.float64: 1e-10, torch.float32: 1e-5}
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
        "moved upon the face of the waters. And God said, Let there be light: and there was "
        "light. And God saw the light, that it was good: and God divided the light from the "
        "darkness. And God called the light Day, and the darkness he called Night. And the "
        "evening and the morning were the first day. And God said, Let there be a firmament "
        "in the midst of the waters, and let it divide the waters from the waters.")


def _inputs(vocab: int, b: int = 3, n: int = 9, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, :3] = 0
    return ids, mask


def _reference(family, dtype, impl):
    model = family.reference(family.classes[1], dtype=dtype)
    model.config._attn_implementation = impl
    return perturb_(model, seed=7)


def _logits_error(family, dtype, impl) -> float:
    ref = _reference(family, dtype, impl)
    ours = splitformer.from_hf(ref)
    ids, mask = _inputs(int(family.example["vocab_size"]))
    if dtype == torch.float64 and impl == "eager":
        mask = torch.ones_like(mask)  # transformers' float32 softmax: NaN on padded rows
    with torch.no_grad():
        d = ref(input_ids=ids, attention_mask=mask).logits - \
            ours(input_ids=ids, attention_mask=mask).logits
    return d[mask.bool()].abs().max().item()


def _round_trip(family, impl) -> bool:
    ref = _reference(family, torch.float64, impl)
    back = splitformer.to_hf(splitformer.from_hf(ref))
    a, b = ref.state_dict(), back.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _generate_equal(family, impl) -> bool:
    dtype = torch.float32 if impl == "eager" else torch.float64
    ref = _reference(family, dtype, impl)
    ours = splitformer.from_hf(ref)
    ids, mask = _inputs(int(family.example["vocab_size"]), b=2, n=7)
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                            pad_token_id=0, eos_token_id=None)
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=16, pad_token_id=0,
                            eos_token_id=None)
    return torch.equal(want, got)


def family_table() -> bool:
    ok = True
    print("| family | f64 sdpa | f64 eager | f32 sdpa | f32 eager | round trip | generate |")
    print("|---|---|---|---|---|---|---|")
    for f in families("transformers"):
        if f.map != "hf_llama":
            continue
        softcap = bool(f.traits.get("softcap") and f.example.get("attn_logit_softcapping"))
        cells = []
        for dtype in (torch.float64, torch.float32):
            for impl in ("sdpa", "eager"):
                if softcap and impl == "sdpa":
                    cells.append("refused by transformers")
                    continue
                e = _logits_error(f, dtype, impl)
                checked = not (dtype == torch.float64 and impl == "eager" and not softcap)
                bad = checked and e > BARS[dtype]
                ok &= not bad
                cells.append(f"{e:.1e}{' !' if bad else ''}")
        impl = "eager" if softcap else "sdpa"
        rt, gen = _round_trip(f, impl), _generate_equal(f, impl)
        ok &= rt and gen
        print(f"| {f.label} | " + " | ".join(cells) + f" | {'identity' if rt else 'DIFFERS !'}"
              f" | {'same ids' if gen else 'DIFFERENT !'} |")
    return ok


def smollm2_row() -> bool:
    from splitformer.interop.gguf import read_gguf

    ref, tok = read_gguf("smollm2")
    ours = splitformer.from_hf(ref)
    ids = torch.tensor(tok(TEXT)["input_ids"][:128]).view(2, 64)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        d = (ref(input_ids=ids, attention_mask=mask).logits
             - ours(input_ids=ids, attention_mask=mask).logits)[mask.bool()].abs().max().item()
    print(f"SmolLM2-135M-Instruct (GGUF, float32, 2 x 64 tokens of English, left padding): "
          f"max |logits difference| {d:.1e} (bar 1e-4)")
    return d <= 1e-4


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smollm2", action="store_true", help="also the packaged SmolLM2")
    p.add_argument("--threads", type=int, default=None, help="torch threads (>= 1)")
    args = p.parse_args()
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    ok = family_table()
    if args.smollm2:
        ok &= smollm2_row()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
