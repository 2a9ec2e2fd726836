"""The evaluation of compressed decoder LLMs against their teacher (issue 31, deliverable 4):
held-out text, healing text that never touches it, the quality and fidelity measures, and
prefill / decode speed.

**Text.** gensim's shortened English Wikipedia (``text_benchmarks.wiki_articles``: 106
articles, one paragraph a line) is joined with blank lines (``"\\n\\n".join(articles)``) and
tokenised once by the model's tokenizer, without special tokens: the stream s_0 .. s_{S-1}
(``wiki_ids``; SmolLM2's tokenizer: 595,652 tokens). ``lm_text(tokenizer, length=n,
evaluation=M, calibration=K)`` cuts it into

* ``evaluation`` (M, n): the last M * n tokens of the stream, in order, as M non-overlapping
  windows (the last pages of the extract);
* ``calibration`` (K, n): the first K * n tokens, as K windows (its first pages); K * n <=
  S - M * n is asserted, so the two never share a token;
* ``prompts``: ``PROMPTS`` (20) prompts of ``PROMPT_TOKENS`` (24) ids, the first 24 tokens
  (the paragraph tokenised alone, no special tokens) of 20 distinct paragraphs that lie wholly
  in the decoded evaluation text and have at least 24 + ``NEW_TOKENS`` tokens, drawn with a
  torch generator seeded with ``seed`` and kept in stream order;
* ``bytes_per_token`` = B / T: T = M (n - 1) the tokens scored (each window predicts its tokens
  1 .. n-1 from the ones before), B the UTF-8 bytes of their text, per window
  len(decode(w).encode()) - len(decode(w[:1]).encode()) (decoded without cleaning up spaces).

``healing_windows`` draws training windows from the calibration side of the Wikipedia stream
(never its last ``held_out`` tokens, by default those of the default evaluation, 32 x 512) and
from the King James text before the held-out books (``depth_eval.kjv_split()[0]``, lines joined
with newlines, tokenised once).

**Measures** (``LMEvaluation``; all in nats unless said, under ``torch.no_grad()``, the model in
eval mode, ``batch`` windows a forward). With p_t the teacher's and q_t the model's next-token
distribution at position t of a window w (softmax of the float32 logits), over the windows'
predicted tokens (t = 0 .. n-2, target w_{t+1}):

    loss        = mean_{w,t} -log q_t(w_{t+1})             (nats per token)
    perplexity  = exp(loss)
    bits/byte   = loss * T / (B * ln 2) = loss / (bytes_per_token * ln 2)
    kl          = mean_{w,t} sum_v p_t(v) (log p_t(v) - log q_t(v))    (KL(teacher || model))
    top1        = mean_{w,t} [argmax_v q_t(v) = argmax_v p_t(v)]

kl and top1 run over the first ``kl_windows`` evaluation windows and every position of them
(t = 0 .. n-1). ``match_tokens`` is the mean over the prompts of the length of the common prefix
of the model's and the teacher's greedy continuations (``NEW_TOKENS`` = 32 new ids each, no
stop at an end-of-sequence id: 0 .. 32), ``match_full`` the number of prompts whose 32 ids all
agree.

**Speed** (``speed``): as ``bench.generation`` measures it, greedy generation of 1 and of
``new`` new tokens after a prompt of ``prompt`` tokens, the repeats of the two models
interleaved, medians of each:

    prefill tokens/s = prompt / t(1),     decode tokens/s = (new - 1) / (t(new) - t(1)).

A model is a splitformer causal model or a transformers causal LM: ``model(input_ids=ids)``
returns an output with ``.logits``.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..bench.generation import _timed
from ..usage import Parser
from . import text_benchmarks as tb
from .depth_eval import kjv_split

__all__ = ["EVALUATION_TOKENS", "NEW_TOKENS", "PROMPTS", "PROMPT_TOKENS", "LMEvaluation",
           "LMText", "bits_per_byte", "greedy", "healing_windows", "kjv_ids", "lm_text",
           "perplexity", "scored_bytes", "speed", "token_losses", "wiki_ids"]

PROMPTS = 20
PROMPT_TOKENS = 24
NEW_TOKENS = 32
EVALUATION_TOKENS = 32 * 512
"""The tokens at the end of the Wikipedia stream that the default evaluation scores and that
``healing_windows`` never draws from."""

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _positive_int(name: str, value, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


# -- text -----------------------------------------------------------------------------------

def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _decode(tokenizer, ids) -> str:
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@functools.lru_cache(maxsize=2)
def _wiki(tokenizer) -> tuple[torch.Tensor, tuple[str, ...]]:
    articles = tb.wiki_articles()
    ids = torch.tensor(_encode(tokenizer, "\n\n".join(articles)), dtype=torch.long)
    return ids, tuple(p for a in articles for p in a.split("\n"))


def wiki_ids(tokenizer) -> torch.Tensor:
    """The 1-D ids of gensim's Wikipedia extract, the articles joined with ``"\\n\\n"`` and
    tokenised once without special tokens (cached per tokenizer)."""
    return _wiki(tokenizer)[0]


@functools.lru_cache(maxsize=2)
def kjv_ids(tokenizer) -> torch.Tensor:
    """The 1-D ids of the King James lines before the held-out books
    (``depth_eval.kjv_split()[0]``), joined with ``"\\n"`` and tokenised once without special
    tokens (cached per tokenizer)."""
    healing, _ = kjv_split()
    return torch.tensor(_encode(tokenizer, "\n".join(healing)), dtype=torch.long)


def scored_bytes(tokenizer, windows: torch.Tensor) -> int:
    """The UTF-8 bytes of the text that the windows' tokens 1 .. n-1 spell: per window,
    len(decode(w)) - len(decode(w[:1])) in bytes (decoded without cleaning up spaces)."""
    total = 0
    for w in windows:
        total += len(_decode(tokenizer, w).encode("utf-8"))
        total -= len(_decode(tokenizer, w[:1]).encode("utf-8"))
    return total


@dataclass(frozen=True)
class LMText:
    """Evaluation and calibration text of a causal LM (module docstring): ``evaluation`` (M, n)
    and ``calibration`` (K, n) long ids, ``bytes_per_token`` of the evaluation windows' scored
    tokens (for bits per byte), ``prompts`` (1-D long ids each, for greedy continuations)."""

    evaluation: torch.Tensor
    calibration: torch.Tensor
    bytes_per_token: float
    prompts: list[torch.Tensor]

    @property
    def length(self) -> int:
        return int(self.evaluation.shape[1])


def lm_text(tokenizer, *, length: int = 512, evaluation: int = 32, calibration: int = 64,
            seed: int = 0) -> LMText:
    """The ``LMText`` of the Wikipedia stream tokenised by ``tokenizer`` (module docstring):
    ``evaluation`` windows of ``length`` from its end, ``calibration`` windows from its start,
    ``PROMPTS`` prompts of ``PROMPT_TOKENS`` from distinct evaluation paragraphs (seeded).
    ValueError naming the argument when the text is too short for the request; the loaders'
    DatasetError (data not installed: `make data`) passes through."""
    _positive_int("length", length, 2)
    _positive_int("evaluation", evaluation)
    _positive_int("calibration", calibration)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    stream, paragraphs = _wiki(tokenizer)
    s = len(stream)
    if (evaluation + calibration) * length > s:
        raise ValueError(
            f"evaluation={evaluation} and calibration={calibration} windows of length={length} "
            f"need {(evaluation + calibration) * length:,} tokens; the Wikipedia text has "
            f"{s:,}: ask for fewer or shorter windows")
    start = s - evaluation * length
    ev = stream[start:].reshape(evaluation, length).clone()
    cal = stream[:calibration * length].reshape(calibration, length).clone()
    assert calibration * length <= start, "calibration overlaps the evaluation"
    text = _decode(tokenizer, stream[start:])
    eligible: list[torch.Tensor] = []
    seen: set[str] = set()
    for p in paragraphs:
        if p in seen or p not in text:
            continue
        seen.add(p)
        ids = _encode(tokenizer, p)
        if len(ids) >= PROMPT_TOKENS + NEW_TOKENS:
            eligible.append(torch.tensor(ids[:PROMPT_TOKENS], dtype=torch.long))
    if len(eligible) < PROMPTS:
        raise ValueError(f"evaluation={evaluation} windows of length={length} hold "
                         f"{len(eligible)} whole paragraphs of at least "
                         f"{PROMPT_TOKENS + NEW_TOKENS} tokens, fewer than the {PROMPTS} "
                         "prompts: ask for more evaluation windows")
    g = torch.Generator().manual_seed(seed)
    chosen = sorted(torch.randperm(len(eligible), generator=g)[:PROMPTS].tolist())
    tokens = evaluation * (length - 1)
    return LMText(ev, cal, scored_bytes(tokenizer, ev) / tokens, [eligible[i] for i in chosen])


def healing_windows(tokenizer, length: int, count: int, seed: int = 0, *, wiki: float = 0.5,
                    held_out: int = EVALUATION_TOKENS) -> torch.Tensor:
    """(count, length) long ids of healing text: round(wiki * count) windows drawn uniformly
    within the Wikipedia stream without its last ``held_out`` tokens (``wiki_ids``; the
    default keeps off the default evaluation, 32 windows of 512; give evaluation * length of
    the ``lm_text`` in use), the others uniformly within the King James text before the
    held-out books (``kjv_ids``); starts drawn by a torch generator seeded with ``seed``
    (Wikipedia first), the windows then shuffled by it. No special tokens."""
    _positive_int("length", length, 2)
    _positive_int("count", count)
    _positive_int("held_out", held_out, 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if isinstance(wiki, bool) or not isinstance(wiki, (int, float)) or not 0 <= wiki <= 1:
        raise ValueError(f"wiki must be a fraction in [0, 1], got {wiki!r}")
    kw = round(wiki * count)
    g = torch.Generator().manual_seed(seed)
    parts = []
    for name, k, ids in (("Wikipedia", kw, lambda: wiki_ids(tokenizer)[:-held_out or None]),
                         ("King James", count - kw, lambda: kjv_ids(tokenizer))):
        if not k:
            continue
        stream = ids()
        if len(stream) < length:
            raise ValueError(f"length={length} exceeds the {name} healing text's "
                             f"{len(stream):,} tokens")
        starts = torch.randint(0, len(stream) - length + 1, (k,), generator=g)
        parts.append(stream[starts[:, None] + torch.arange(length)])
    return torch.cat(parts)[torch.randperm(count, generator=g)]


# -- measures -------------------------------------------------------------------------------

def _device(model: nn.Module) -> torch.device:
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


class _EvalMode:
    """The model in eval mode under no_grad for the block, its training flag restored."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was = model, model.training
        self.grad = torch.no_grad()

    def __enter__(self) -> nn.Module:
        self.model.eval()
        self.grad.__enter__()
        return self.model

    def __exit__(self, *exc) -> None:
        self.grad.__exit__(*exc)
        self.model.train(self.was)


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The float32 logits (B, n, V) of ``model(input_ids=ids)``."""
    return model(input_ids=ids.to(_device(model))).logits.float()


def _windows(windows: torch.Tensor, name: str = "windows") -> torch.Tensor:
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.shape[1] < 2 \
            or windows.is_floating_point():
        got = tuple(windows.shape) if isinstance(windows, torch.Tensor) else \
            type(windows).__name__
        raise ValueError(f"{name} must be a (count, n) integer tensor with n >= 2, got {got}")
    return windows.long()


def _nll(logits: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(B, n-1) -log q_t(w_{t+1}) from (B, n, V) float32 logits."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), w[:, 1:].reshape(-1).to(logits.device),
                           reduction="none").view(w.shape[0], -1)


def token_losses(model: nn.Module, windows: torch.Tensor, *, batch: int = 4,
                 say: Say | None = None) -> torch.Tensor:
    """(count, n-1) float32: -log q(w_{t+1} | w_0 .. w_t) in nats, each window scored on its
    tokens 1 .. n-1, ``batch`` windows a forward (no_grad, eval mode)."""
    windows = _windows(windows)
    _positive_int("batch", batch)
    say = say or _quiet
    out = []
    with _EvalMode(model):
        for a in range(0, len(windows), batch):
            say(f"loss: windows {a + 1}..{min(a + batch, len(windows))} of {len(windows)}")
            w = windows[a:a + batch]
            out.append(_nll(_logits(model, w), w).cpu())
    return torch.cat(out)


def perplexity(model: nn.Module, windows: torch.Tensor, *, batch: int = 4) -> float:
    """exp(mean_{w,t} -log q(w_{t+1} | w_0 .. w_t)): every window scored on its tokens
    1 .. n-1, the mean over all of them (``token_losses``)."""
    return math.exp(token_losses(model, windows, batch=batch).double().mean().item())


def bits_per_byte(loss: float, bytes_per_token: float) -> float:
    """loss (nats per token) / (bytes_per_token * ln 2) = loss * T / (B * ln 2)."""
    return loss / (bytes_per_token * math.log(2))


def _is_transformers(model) -> bool:
    hf = sys.modules.get("transformers")  # never imported here: a transformers model has
    return hf is not None and isinstance(model, hf.PreTrainedModel)


def greedy(model: nn.Module, prompts: torch.Tensor, new: int, *,
           min_new: bool = False) -> torch.Tensor:
    """(B, new) ids: the greedy continuation of each row of ``prompts`` (B, N) (one batch, no
    padding), ``new`` ids with no stop at an end-of-sequence id. A transformers model runs its
    own ``generate`` (a copy of its generation config without eos; ``min_new``: also
    min_new_tokens = new, as the speed runs do), a splitformer model ``model.generate``."""
    ids = prompts.to(_device(model))
    with _EvalMode(model):
        if _is_transformers(model):
            cfg = copy.deepcopy(model.generation_config)
            cfg.eos_token_id = None
            cfg.max_new_tokens, cfg.do_sample = new, False
            cfg.min_new_tokens = new if min_new else None
            cfg.pad_token_id = 0 if cfg.pad_token_id is None else cfg.pad_token_id
            for k in ("temperature", "top_k", "top_p"):
                setattr(cfg, k, None)
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 generation_config=cfg)
        else:
            out = model.generate(ids, new, do_sample=False, eos_token_id=None)
    return out[:, ids.shape[1]:].cpu()


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B,) the length of the common prefix of each row of a and b (B, k)."""
    n = min(a.shape[1], b.shape[1])
    same = (a[:, :n] == b[:, :n]).long()
    return same.cumprod(dim=1).sum(dim=1)


class LMEvaluation:
    """A teacher's evaluation on ``text``, against which models are scored (module docstring:
    perplexity, bits per byte, KL(teacher || model), top-1 agreement, greedy match).

    The constructor runs the teacher once and keeps: its per-token losses (M, n-1)
    (``teacher_loss``), its float32 log-probabilities on the first ``kl_windows`` evaluation
    windows (``teacher_logp``, (kl_windows, n, V): kl_windows * n * V * 4 bytes, 805 MB for
    SmolLM2 at 8 x 512 x 49,152), and its greedy continuations of the prompts (``teacher_new``,
    (20, 32)). ``batch`` windows go through a forward at a time; ``say`` gets progress."""

    def __init__(self, teacher: nn.Module, text: LMText, *, batch: int = 4,
                 kl_windows: int = 8, say: Say | None = None) -> None:
        _windows(text.evaluation, "text.evaluation")
        _positive_int("batch", batch)
        _positive_int("kl_windows", kl_windows)
        if kl_windows > len(text.evaluation):
            raise ValueError(f"kl_windows={kl_windows} exceeds the {len(text.evaluation)} "
                             "evaluation windows")
        if text.bytes_per_token <= 0:
            raise ValueError(f"text.bytes_per_token must be > 0, got {text.bytes_per_token}")
        self.text, self.batch, self.kl_windows = text, batch, kl_windows
        self.say = say or _quiet
        self.prompts = torch.stack(list(text.prompts)) if text.prompts else None
        self.say("teacher: losses and log-probabilities")
        losses, logp = [], []
        with _EvalMode(teacher):
            for a in range(0, len(text.evaluation), batch):
                self.say(f"teacher: windows {a + 1}.."
                         f"{min(a + batch, len(text.evaluation))} of {len(text.evaluation)}")
                w = text.evaluation[a:a + batch]
                logits = _logits(teacher, w)
                losses.append(_nll(logits, w).cpu())
                if a < kl_windows:
                    logp.append(logits[:kl_windows - a].log_softmax(-1).cpu())
                del logits
        self.teacher_loss = torch.cat(losses)
        self.teacher_logp = torch.cat(logp)
        self.teacher_new = None
        if self.prompts is not None:
            self.say(f"teacher: greedy continuations of {len(self.prompts)} prompts")
            self.teacher_new = greedy(teacher, self.prompts, NEW_TOKENS)
        loss = self.teacher_loss.double().mean().item()
        self.teacher = {"perplexity": math.exp(loss),
                        "bits_per_byte": bits_per_byte(loss, text.bytes_per_token),
                        "loss": loss}

    def __call__(self, model: nn.Module, *, continuations: bool = True) -> dict:
        """The model's measures: perplexity, bits_per_byte, loss, kl, top1, and with
        ``continuations`` (and prompts) match_tokens, match_full; ``teacher`` (the teacher's
        perplexity, bits_per_byte, loss) and the ratio perplexity / the teacher's."""
        ev, b, k = self.text.evaluation, self.batch, self.kl_windows
        losses = []
        kl_sum = torch.zeros((), dtype=torch.float64)
        agree, positions = 0, 0
        with _EvalMode(model):
            for a in range(0, len(ev), b):
                self.say(f"model: windows {a + 1}..{min(a + b, len(ev))} of {len(ev)}")
                w = ev[a:a + b]
                logits = _logits(model, w)
                losses.append(_nll(logits, w).cpu())
                if a < k:
                    logq = logits[:k - a].log_softmax(-1).cpu()
                    logp = self.teacher_logp[a:a + len(logq)]
                    kl_sum += F.kl_div(logq, logp, reduction="sum", log_target=True).double()
                    agree += int((logq.argmax(-1) == logp.argmax(-1)).sum())
                    positions += logq.shape[0] * logq.shape[1]
                del logits
        loss = torch.cat(losses).double().mean().item()
        out = {"perplexity": math.exp(loss),
               "bits_per_byte": bits_per_byte(loss, self.text.bytes_per_token),
               "loss": loss, "kl": kl_sum.item() / positions, "top1": agree / positions}
        if continuations and self.teacher_new is not None:
            self.say(f"model: greedy continuations of {len(self.prompts)} prompts")
            prefix = _common_prefix(greedy(model, self.prompts, NEW_TOKENS), self.teacher_new)
            out["match_tokens"] = prefix.double().mean().item()
            out["match_full"] = int((prefix == NEW_TOKENS).sum())
        out["perplexity_ratio"] = out["perplexity"] / self.teacher["perplexity"]
        out["teacher"] = dict(self.teacher)
        return out


# -- speed ----------------------------------------------------------------------------------

def _prompt_ids(source, prompt: int) -> torch.Tensor:
    if isinstance(source, LMText):
        ids = source.evaluation.reshape(-1)
    elif isinstance(source, torch.Tensor):
        if source.is_floating_point() or source.dim() > 2 or (
                source.dim() == 2 and source.shape[0] != 1):
            raise ValueError(f"tokenizer_or_ids: ids must be 1-D or (1, N) integers, got "
                             f"{tuple(source.shape)} {source.dtype}")
        ids = source.reshape(-1)
    else:  # a tokenizer: the end of the Wikipedia stream (evaluation text)
        ids = wiki_ids(source)[-prompt:]
    if len(ids) < prompt:
        raise ValueError(f"prompt={prompt}: tokenizer_or_ids gives only {len(ids)} tokens")
    return ids[:prompt].long()[None]


def speed(model: nn.Module, reference: nn.Module, tokenizer_or_ids, *, prompt: int = 512,
          new: int = 64, repeats: int = 3, warmup: int = 1) -> dict:
    """Prefill and decode speed of ``model`` and ``reference`` (module docstring): greedy
    generation of 1 and of ``new`` tokens after a prompt of ``prompt`` tokens (the first of
    ``tokenizer_or_ids``: ids (1-D or (1, N)), an ``LMText`` (its evaluation windows in
    order), or a tokenizer (the last ``prompt`` tokens of the Wikipedia stream)), ``warmup``
    untimed calls of each, then ``repeats`` rounds interleaving the two models
    (``bench.generation``'s timing), medians taken. Keys: ``model`` and ``reference`` (each
    prefill_s, total_s, decode_s, prefill_tokens_per_s, decode_tokens_per_s and the raw
    times), ``prefill_ratio`` and ``decode_ratio`` (model / reference tokens/s), ``prompt``,
    ``new``, ``repeats``."""
    _positive_int("prompt", prompt)
    _positive_int("new", new, 2)
    _positive_int("repeats", repeats)
    _positive_int("warmup", warmup, 0)
    ids = _prompt_ids(tokenizer_or_ids, prompt)
    calls = {name: (lambda n, m=m: greedy(m, ids, n, min_new=True))
             for name, m in (("model", model), ("reference", reference))}
    times: dict[str, dict[int, list[float]]] = {k: {1: [], new: []} for k in calls}
    for call in calls.values():
        for _ in range(warmup):
            call(1)
    for _ in range(repeats):
        for name, call in calls.items():
            for n in (1, new):
                times[name][n].append(_timed(lambda call=call, n=n: call(n))[0])
    out: dict = {"prompt": prompt, "new": new, "repeats": repeats}
    for name in calls:
        t1, tn = statistics.median(times[name][1]), statistics.median(times[name][new])
        out[name] = {"prefill_s": t1, "total_s": tn, "decode_s": tn - t1,
                     "prefill_tokens_per_s": prompt / t1,
                     "decode_tokens_per_s": (new - 1) / max(tn - t1, 1e-12),
                     "times_prefill_s": times[name][1], "times_total_s": times[name][new]}
    for k in ("prefill", "decode"):
        out[f"{k}_ratio"] = (out["model"][f"{k}_tokens_per_s"]
                             / out["reference"][f"{k}_tokens_per_s"])
    return out


def _summary(result: dict, keys: Sequence[str] = ("perplexity", "bits_per_byte", "kl", "top1",
                                                   "match_tokens", "match_full")) -> str:
    return ", ".join(f"{k} {result[k]:.4g}" for k in keys if k in result)


def report(argv: Sequence[str] | None = None) -> dict:
    """``python -m splitformer.experiments.lm_eval``: the packaged SmolLM2
    (``interop.from_hf("smollm2")``, float32) evaluated against itself on ``lm_text``
    (``--windows`` of ``--length``), the time of the teacher's pass (the constructor) and of
    one model's (``__call__``) printed, and the measures as one JSON line."""
    import json
    import time

    from ..interop import from_hf

    parser = Parser(prog="python -m splitformer.experiments.lm_eval")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = from_hf("smollm2").eval()
    text = lm_text(model.tokenizer, length=args.length, evaluation=args.windows)
    t0 = time.perf_counter()
    evaluation = LMEvaluation(model, text, say=print)
    t1 = time.perf_counter()
    result = evaluation(model)
    t2 = time.perf_counter()
    out = {"threads": torch.get_num_threads(), "windows": args.windows, "length": args.length,
           "bytes_per_token": text.bytes_per_token, "teacher_s": t1 - t0, "model_s": t2 - t1,
           **result}
    print(f"teacher pass {t1 - t0:.1f} s, model pass {t2 - t1:.1f} s: {_summary(result)}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    report()
