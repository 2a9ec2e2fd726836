"""Generation: the causal evolution extended by one node of the token grid at a time.

The causal evolution is a Volterra operator in x (docs/math.md 3.19): appending node x_{N+1}
never changes u(x_j, ., t) for j <= N. So the next-token distribution at x_N,

    p(v | x_0 .. x_N) = softmax_v( <P_f u(x_N, ., T), W(v, .)> ),

needs only the new node's state, and the past enters through the keys and values of every
attention evaluation, which are final and kept on a KV tape (``operators.tape.KVTape``).
``generate`` is that loop: one forward over the prompt (prefill, recording the tape), then one
forward per new node (decode), reading and extending the tape.

``generate_without_cache`` is the oracle: nanoGPT's cacheless loop, re-running the whole
prefix for every token (O(N^2) forwards' worth of work). The tape equals it token for token
and in logits (tests/test_generation.py: float64 <= 1e-10 for every scheme and cacheable
kernel).

Token choice follows transformers' ``generate``: the last position's logits are read in float32;
greedy takes the argmax; sampling applies the temperature, then top-k, then top-p (nucleus),
as transformers' logits warpers do in that order, and draws with ``torch.multinomial`` (from
``generator``, or the global RNG: with ``torch.manual_seed(s)`` before both, the same draws as
transformers' sampling). A row that produced ``eos_token_id`` is finished: it is continued
with ``pad_token_id``, and the loop stops when every row is. Left padding (0 in
``attention_mask`` before the prompt) gives every row the positions its tokens would have
alone (transformers' rule: position = cumsum(mask) - 1).

``cache_policy`` (an ``operators.cache_policy.CachePolicy``) coarsens the tape's past after the
prompt's forward and after every new token (docs/cache.md); None keeps every node. ``score_stream``
is the teacher-forced counterpart that ``splitformer cache`` measures: a text streamed through
the model on one tape, in chunks (chunked prefill) and then one token at a time (decoding),
with the log-likelihood of every token, the cache's peak bytes and the decoding speed.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from ..operators.cache_policy import CachePolicy
from ..operators.tape import KVTape
from .outputs import ModelOutput

__all__ = ["GenerationConfig", "GenerationOutput", "StreamScore", "generate",
           "generate_without_cache", "next_tokens", "score_stream", "warp_scores"]


@dataclass
class GenerationOutput(ModelOutput):
    """``sequences`` (B, N + new): the prompt and the new ids; ``logits``: the raw logits of
    every new token, a tuple of (B, V) tensors in the model's dtype (when asked for)."""

    sequences: torch.Tensor | None = None
    logits: tuple[torch.Tensor, ...] | None = None


@dataclass(frozen=True)
class GenerationConfig:
    """How the next token is chosen (checked; see the module docstring)."""

    max_new_tokens: int = 20
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {self.max_new_tokens!r}")
        if not isinstance(self.do_sample, bool):
            raise TypeError(f"do_sample must be a bool, got {self.do_sample!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not (
                math.isfinite(t) and t > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {t!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(
                self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or an int >= 1, got {self.top_k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Real)
                              or not 0 < p <= 1):
            raise ValueError(f"top_p must be None or a number in (0, 1], got {p!r}")
        for e in self.eos_token_id:
            if isinstance(e, bool) or not isinstance(e, int) or e < 0:
                raise ValueError(f"eos_token_id must be an int >= 0 or a list of them, got "
                                 f"{self.eos_token_id!r}")
        if self.pad_token_id is not None and (isinstance(self.pad_token_id, bool) or
                                              not isinstance(self.pad_token_id, int) or
                                              self.pad_token_id < 0):
            raise ValueError(f"pad_token_id must be None or an int >= 0, got "
                             f"{self.pad_token_id!r}")

    @property
    def pad(self) -> int | None:
        """The id that continues a finished row: pad_token_id, else the first eos id."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_id[0] if self.eos_token_id else None


def warp_scores(scores: torch.Tensor, cfg: GenerationConfig) -> torch.Tensor:
    """transformers' sampling warpers in its order: scores / temperature; top-k (every score
    below the k-th largest set to -inf); top-p (the smallest set of tokens, by decreasing
    probability, whose probability exceeds 1 - p is removed, the top token always kept)."""
    if cfg.temperature != 1.0:
        scores = scores / cfg.temperature
    if cfg.top_k is not None:
        k = min(cfg.top_k, scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        ordered, index = torch.sort(scores, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - cfg.top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, index, remove), -float("inf"))
    return scores


def next_tokens(logits: torch.Tensor, cfg: GenerationConfig,
                generator: torch.Generator | None) -> torch.Tensor:
    """The next id of every row from the last position's logits (B, V), read in float32."""
    scores = logits.to(torch.float32)
    if not cfg.do_sample:
        return scores.argmax(dim=-1)
    probs = warp_scores(scores, cfg).softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """transformers' position ids of a left-padded batch: cumsum(mask) - 1, 1 at padding."""
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 1)


def _shape(t: object) -> object:
    """A tensor's shape, else the type's name (for error messages)."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_inputs(model, input_ids, attention_mask, generator, seed):
    if model.training:
        raise ValueError("generate: the model is in training mode (dropout would act at every "
                         "token); call model.eval() first")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or \
            input_ids.shape[1] < 1 or input_ids.is_floating_point():
        raise ValueError(f"input_ids must be an integer tensor of shape (batch, seq) with seq "
                         f">= 1, got {_shape(input_ids)}")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or \
                tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask must be a tensor of the shape of input_ids "
                             f"{tuple(input_ids.shape)}, got "
                             f"{_shape(attention_mask)}")
        if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must hold 1 (token) and 0 (padding) only")
        if not bool(attention_mask[:, -1].bool().all()):
            raise ValueError("attention_mask: every row must end with a token (pad on the "
                             "left: generation continues from the last column)")
    if generator is not None and seed is not None:
        raise ValueError("pass generator or seed, not both")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
            raise ValueError(f"seed must be an int in [0, 2^63), got {seed!r}")
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    return generator


def _config(max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, pad_token_id
            ) -> GenerationConfig:
    eos = () if eos_token_id is None else (
        (eos_token_id,) if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool)
        else tuple(eos_token_id) if isinstance(eos_token_id, Sequence) else (eos_token_id,))
    return GenerationConfig(max_new_tokens, do_sample, temperature, top_k, top_p, eos,
                            pad_token_id)


# nodes a tape preallocates beyond the prompt (it grows by doubling past them): a huge
# max_new_tokens that eos ends early must not allocate its whole length up front
PREALLOCATE = 1024


def _check_length(model, n: int, cfg: GenerationConfig) -> None:
    limit = model.max_positions
    if limit is not None and n + cfg.max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={cfg.max_new_tokens}: the prompt ({n} tokens) and the "
                         f"new tokens exceed the model's {limit} learned positions")
    context = model.context_positions
    if limit is None and context is not None and n + cfg.max_new_tokens > context:
        warnings.warn(f"generate: the prompt ({n} tokens) and max_new_tokens="
                      f"{cfg.max_new_tokens} go past the {context} positions the rotary kernel "
                      "is read for (trained, or extended by its rope_type's factor): beyond them "
                      "the model extrapolates (transformers does not refuse either; "
                      "model.with_rope(...) reads the kernel on a longer interval)",
                      UserWarning, stacklevel=4)


def _steps(model, input_ids, mask, cfg: GenerationConfig, generator, use_cache: bool,
           policy: CachePolicy | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(next ids (B,), raw logits (B, V)) per new token, with the tape or without it."""
    b, n = input_ids.shape
    tape = KVTape(capacity=n + min(cfg.max_new_tokens, PREALLOCATE), policy=policy) \
        if use_cache else None
    seq, cur = input_ids, input_ids
    positions = None if mask is None else _positions(mask)
    for _ in range(cfg.max_new_tokens):
        if use_cache:
            # the new nodes' part only: the tape holds the past's padding (no re-check)
            new = slice(-cur.shape[1], None)
            logits = model(cur, attention_mask=None if mask is None else mask[:, new],
                           position_ids=None if positions is None else positions[:, new],
                           tape=tape, logits_to_keep=1).logits[:, -1]
        else:
            logits = model(seq, attention_mask=mask, position_ids=positions,
                           logits_to_keep=1).logits[:, -1]
        nxt = next_tokens(logits, cfg, generator)
        yield nxt, logits
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        cur = nxt[:, None]
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
            positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)


def generate(model, input_ids: torch.Tensor, max_new_tokens: int = 20, *,
             do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, eos_token_id: int | Sequence[int] | None = None,
             pad_token_id: int | None = None, attention_mask: torch.Tensor | None = None,
             generator: torch.Generator | None = None, seed: int | None = None,
             use_cache: bool = True, return_logits: bool = False,
             streamer: Callable[[torch.Tensor], None] | None = None,
             cache_policy: CachePolicy | None = None
             ) -> torch.Tensor | GenerationOutput:
    """The prompt ``input_ids`` (B, N) and up to ``max_new_tokens`` new ids, (B, N + new), as
    transformers' ``generate`` returns them (``return_logits``: a ``GenerationOutput`` with
    the raw logits of every new token too). ``use_cache=False`` runs the cacheless oracle
    (``generate_without_cache``). ``streamer(ids)`` is called with each new (B,) ids as they
    come (the CLI prints them). Greedy unless ``do_sample``; the module docstring says how a
    token is chosen. ``cache_policy``: the tape's coarsening of the past (None: every node)."""
    cfg = _config(max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id,
                  pad_token_id)
    if not cfg.do_sample:
        ignored = [name for name, value, default in (
            ("temperature", temperature, 1.0), ("top_k", top_k, None), ("top_p", top_p, None),
            ("seed", seed, None), ("generator", generator, None)) if value != default]
        if ignored:
            warnings.warn(f"generate: {', '.join(ignored)} act(s) on sampling and do_sample is "
                          "False: greedy decoding ignores them (pass do_sample=True)",
                          UserWarning, stacklevel=3)
    if cache_policy is not None:
        if not isinstance(cache_policy, CachePolicy):
            raise TypeError(f"cache_policy must be None or an operators.cache_policy."
                            f"CachePolicy (e.g. cache_policy('streaming', 0.25)), got "
                            f"{type(cache_policy).__name__}")
        if not use_cache:
            raise ValueError("cache_policy acts on the KV tape: use_cache=False has none")
    generator = _check_inputs(model, input_ids, attention_mask, generator, seed)
    _check_length(model, input_ids.shape[1], cfg)
    if streamer is not None and not callable(streamer):
        raise TypeError(f"streamer must be callable (it gets each new token's ids), got "
                        f"{type(streamer).__name__}")
    mask = None
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        mask = attention_mask.to(device=input_ids.device, dtype=torch.long)
    out, logits = [input_ids], []
    unfinished = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    eos = torch.tensor(cfg.eos_token_id, dtype=input_ids.dtype, device=input_ids.device)
    with torch.no_grad():
        for nxt, lg in _steps(model, input_ids, mask, cfg, generator, use_cache, cache_policy):
            if cfg.eos_token_id:
                pad = cfg.pad
                nxt = torch.where(unfinished, nxt, torch.full_like(nxt, pad))
                unfinished = unfinished & ~torch.isin(nxt, eos)
            out.append(nxt[:, None].to(input_ids.dtype))
            if return_logits:
                logits.append(lg)
            if streamer is not None:
                streamer(nxt)
            if cfg.eos_token_id and not bool(unfinished.any()):
                break
    sequences = torch.cat(out, dim=1)
    return GenerationOutput(sequences=sequences, logits=tuple(logits)) if return_logits \
        else sequences


def generate_without_cache(model, input_ids: torch.Tensor, max_new_tokens: int = 20,
                           **options) -> torch.Tensor | GenerationOutput:
    """The oracle: every token from a forward over the whole prefix (nanoGPT's ``generate``:
    no tape, O(N) work per token that the tape saves). Same options as ``generate``."""
    return generate(model, input_ids, max_new_tokens, use_cache=False, **options)


@dataclass
class StreamScore:
    """What ``score_stream`` measured: ``tokens`` scored, ``nll`` (the sum of -log p of each
    scored token given its prefix, nats), ``peak_bytes`` (the cache's largest size at the end
    of a forward, ``KVTape.peak_bytes``), ``entries`` (cache entries per evaluation and
    key/value head at the end), and the decoding part's token count and seconds."""

    tokens: int
    nll: float
    peak_bytes: int
    entries: int
    decode_tokens: int
    decode_seconds: float
    prefill_seconds: float

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.tokens) if self.tokens else math.nan

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else math.nan


def score_stream(model, input_ids: torch.Tensor, *, policy: CachePolicy | None = None,
                 chunk: int = 64, decode: int = 0,
                 progress: Callable[[int, int], None] | None = None) -> StreamScore:
    """The text ``input_ids`` (B, N) streamed through the causal ``model`` on one KV tape with
    the cache ``policy``: the first N - ``decode`` tokens in forwards of ``chunk`` new nodes
    (chunked prefill), the last ``decode`` one forward each (decoding, timed), the policy acting
    after every forward. Token x_{i+1} is scored by the logits at x_i,

        nll = - sum_{i=0}^{N-2} log p(id_{i+1} | id_0 .. id_i)

    (teacher forcing: the model reads the text, not its own choices). ``progress(done, N)``
    is called after every forward."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or \
            input_ids.is_floating_point() or input_ids.shape[1] < 2:
        raise ValueError(f"input_ids must be an integer tensor (batch, seq) with seq >= 2, got "
                         f"{_shape(input_ids)}")
    n = input_ids.shape[1]
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an int >= 1 (new nodes per prefill forward), got "
                         f"{chunk!r}")
    if isinstance(decode, bool) or not isinstance(decode, int) or not 0 <= decode < n:
        raise ValueError(f"decode must be an int in [0, {n}) (tokens decoded one at a time at "
                         f"the end), got {decode!r}")
    if model.training:
        raise ValueError("score_stream: the model is in training mode; call model.eval()")
    tape = KVTape(capacity=0 if policy is not None and policy.compresses else n, policy=policy)
    nll = 0.0
    scored = 0
    decode_seconds = prefill_seconds = 0.0
    start = 0
    with torch.no_grad():
        while start < n:
            size = chunk if start < n - decode else 1
            end = min(start + size, n - decode) if start < n - decode else start + 1
            t0 = time.perf_counter()
            logits = model(input_ids[:, start:end], tape=tape).logits
            targets = input_ids[:, start + 1:end + 1]
            lp = logits[:, :targets.shape[1]].float().log_softmax(-1)
            nll -= float(lp.gather(-1, targets[..., None]).sum())
            scored += targets.numel()
            elapsed = time.perf_counter() - t0
            if start >= n - decode:
                decode_seconds += elapsed
            else:
                prefill_seconds += elapsed
            start = end
            if progress is not None:
                progress(start, n)
    return StreamScore(tokens=scored, nll=nll, peak_bytes=tape.peak_bytes,
                       entries=tape.entries_per_head, decode_tokens=decode,
                       decode_seconds=decode_seconds, prefill_seconds=prefill_seconds)
