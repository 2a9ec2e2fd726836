"""The generate suite: text generation on the KV tape against transformers' ``generate``.

On one random-weight GPT-2 (``transformers.GPT2LMHeadModel`` at the size; vocabulary 50257)
and ``splitformer.from_hf`` of it (the same weights, dtype and threads), for float32 and
bfloat16, each contender's ``generate`` is timed with 1 new token (the prefill: the prompt's
forward and the first token) and with ``Options.new_tokens`` new tokens, greedy, the repeats of
the two contenders interleaved. From the medians:

    prefill tokens/s = batch * prompt / t(1),
    decode tokens/s  = batch * (new - 1) / (t(new) - t(1)),

so each library's fixed cost of a call (its logits processors, its cache set-up) is in the
prefill. ``same_ids`` says whether the two produced the same ids; ``cache_bytes_per_token`` is
the memory of the keys and values per token (the tape's used part; transformers' DynamicCache)
and ``tape_allocated_bytes`` what the tape preallocated (prompt + new tokens).

The linear kernel's rows (``linear decode``): the per-token decode time of the same network
with the linear kernel, after a prefix of each of ``Options.prefixes`` tokens (prefilled in
chunks of 256 on the tape: the recurrent form), against the softmax kernel after the same
prefix: the running sums make the linear kernel's time flat in the prefix, the softmax kernel's
grows with it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..operators.tape import KVTape
from .sizes import Size

__all__ = ["GPT2_VOCAB", "generate_rows", "linear_rows"]

GPT2_VOCAB = 50257
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _config(size: Size, positions: int):
    from transformers import GPT2Config

    return GPT2Config(n_embd=size.dim, n_head=size.heads, n_layer=size.layers, n_inner=size.ff,
                      vocab_size=GPT2_VOCAB, n_positions=positions, bos_token_id=0,
                      eos_token_id=None, pad_token_id=0, attn_implementation="sdpa")


def _pair(size: Size, positions: int, dtype: torch.dtype, seed: int):
    import transformers

    from ..interop import from_hf

    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(_config(size, positions)).to(dtype).eval()
    return hf, from_hf(hf).eval()


def _hf_cache_bytes(hf, ids: torch.Tensor) -> int:
    with torch.no_grad():
        out = hf(ids, use_cache=True)
    # transformers 5 names the cache ``cache`` (``past_key_values`` warns as deprecated)
    cache = out["cache"] if "cache" in out else out.past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (layer.keys, layer.values))


def _timed(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def generate_rows(size: Size, opts, say) -> list[dict]:
    """Prefill and decode tokens/s of splitformer and transformers (module docstring), one
    row per contender and dtype, with the ratios splitformer / transformers."""
    g = torch.Generator().manual_seed(opts.seed)
    ids = torch.randint(0, GPT2_VOCAB, (size.batch, size.seq), generator=g)
    rows: list[dict] = []
    for dname, dtype in DTYPES.items():
        rows += _pair_rows(size, opts, say, ids, dname, dtype)
    return rows + linear_rows(size, opts, say)


def _pair_rows(size: Size, opts, say, ids: torch.Tensor, dname: str, dtype: torch.dtype
               ) -> list[dict]:
    new = opts.new_tokens
    hf, ours = _pair(size, size.seq + new, dtype, opts.seed)
    mask = torch.ones_like(ids)
    calls = {
        "transformers": lambda n: hf.generate(ids, attention_mask=mask, max_new_tokens=n,
                                              min_new_tokens=n, do_sample=False,
                                              pad_token_id=0),
        "splitformer": lambda n: ours.generate(ids, n),
    }
    times: dict[str, dict[int, list[float]]] = {k: {1: [], new: []} for k in calls}
    outs: dict[str, torch.Tensor] = {}
    for call in calls.values():  # warm-up
        for _ in range(opts.warmup):
            call(1)
    for r in range(opts.repeats):
        say(f"generate {size.label} {dname}: repeat {r + 1}/{opts.repeats}")
        for name, call in calls.items():
            for n in (1, new):
                t, out = _timed(lambda call=call, n=n: call(n))
                times[name][n].append(t)
                if n == new:
                    outs[name] = out
    tape = KVTape()
    with torch.no_grad():
        ours(ids, tape=tape, logits_to_keep=1)
    cache = {"splitformer": tape.nbytes(), "transformers": _hf_cache_bytes(hf, ids)}
    same = bool(torch.equal(outs["splitformer"], outs["transformers"]))
    measured = {}
    for name in calls:
        t1, tn = statistics.median(times[name][1]), statistics.median(times[name][new])
        measured[name] = {
            "prefill_s": t1, "total_s": tn, "decode_s": tn - t1,
            "prefill_tokens_per_s": size.batch * size.seq / t1,
            "decode_tokens_per_s": size.batch * (new - 1) / max(tn - t1, 1e-12),
            "times_prefill_s": times[name][1], "times_total_s": times[name][new],
            "cache_bytes_per_token": cache[name] / (size.batch * size.seq)}
    rows = []
    for name, m in measured.items():
        other_name = "transformers" if name == "splitformer" else "splitformer"
        other = measured[other_name]
        rows.append({
            "suite": "generate", "size": size.label, "group": f"generate {dname}",
            "path": "no_grad", "name": name, "splitformer": name == "splitformer",
            "dtype": dname, "prompt": size.seq, "batch": size.batch, "new_tokens": new,
            "median_s": m["total_s"], **m, "same_ids": same,
            "prefill_ratio": m["prefill_tokens_per_s"] / other["prefill_tokens_per_s"],
            "decode_ratio": m["decode_tokens_per_s"] / other["decode_tokens_per_s"],
            "ratios": {other_name: m["total_s"] / other["total_s"]},
            "tape_allocated_bytes": m["cache_bytes_per_token"] * size.batch
            * (size.seq + new) if name == "splitformer" else None,
            "note": "random GPT-2 weights; greedy; interleaved repeats"})
    return rows


def _decode_step_s(model, prefix: int, steps: int, seed: int) -> tuple[float, int]:
    """The median time of one decode step after ``prefix`` tokens on a tape (prefilled in
    chunks of 256), and the tape's bytes after the prefix."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, GPT2_VOCAB, (1, prefix + steps), generator=g)
    tape = KVTape(capacity=prefix + steps)
    times = []
    with torch.no_grad():
        for a in range(0, prefix, 256):
            model(ids[:, a:min(prefix, a + 256)], tape=tape, logits_to_keep=1)
        nbytes = tape.nbytes()
        for i in range(prefix, prefix + steps):
            t0 = time.perf_counter()
            model(ids[:, i:i + 1], tape=tape, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), nbytes


def linear_rows(size: Size, opts, say) -> list[dict]:
    """The decode step's time against the prefix length, linear kernel and softmax kernel
    (float32, batch 1), and the tape's bytes after the prefix."""
    rows = []
    longest = max(opts.prefixes)
    _hf, ours = _pair(size, longest + 32, torch.float32, opts.seed)
    del _hf
    kernels = {"softmax": ours, "linear": ours.with_kernel("linear")}
    for prefix in opts.prefixes:
        for kname, model in kernels.items():
            say(f"generate {size.label}: {kname} kernel, decode after {prefix} tokens")
            step, nbytes = _decode_step_s(model, prefix, 16, opts.seed)
            rows.append({
                "suite": "generate", "size": size.label, "group": "linear decode",
                "path": "no_grad", "name": f"splitformer {kname}", "splitformer": True,
                "kernel": kname, "prefix": prefix, "median_s": step,
                "decode_tokens_per_s": 1.0 / step, "ratios": {},
                "cache_bytes": nbytes,
                "note": "batch 1, float32, median of 16 decode steps"})
    return rows
