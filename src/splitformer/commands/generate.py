"""`splitformer generate`: text from a causal language model, decoded on a KV tape.

MODEL is what ``splitformer analyze`` takes (``subjects.resolve.load_subject``): a built-in
model (gpt2-tiny), a folder written by ``splitformer.save``, a ``splitformer train`` run folder
of the lm family (its characters), or a local Hugging Face folder of a causal LM (GPT-2; its own
tokenizer). The prompt is encoded as ``analyze --text`` encodes a text; the new tokens are
chosen by ``models.generation.generate`` (greedy, or ``--sample`` with ``--temperature``,
``--top-k``, ``--top-p`` and ``--seed``) and stop at ``--max-new-tokens`` or at the
tokenizer's end-of-text id. MODEL may also be a GGUF network (``smollm2``: the packaged
SmolLM2-135M-Instruct of ``make data``, or a ``.gguf`` path), read by transformers and mapped
by ``from_hf``, with the file's tokenizer.

``--chat`` makes PROMPT a user's message: the tokenizer's chat template (``apply_chat_template``
with the generation prompt: the assistant's turn opened) gives the ids, generation also stops at
the tokenizer's eos (SmolLM2's ``<|im_end|>``: the end of the turn), and the answer alone is
printed (not the templated prompt). A MODEL whose tokenizer has no chat template is refused in
one line (exit status 2).

The text streams to stdout as it is made (the prompt first, then each piece as soon as it
decodes to whole characters). ``--json`` streams nothing and prints one JSON object on the
last line of stdout: ``prompt``, ``text`` (the new text), ``ids`` (the new ids),
``prompt_tokens``, ``new_tokens``, ``stopped`` ("max_new_tokens", "eos" or "interrupted"),
``prefill_seconds`` (the prompt's forward and the first token), ``decode_tokens_per_s``,
``cache`` (whether the KV tape was used), ``chat`` (whether --chat was given) and ``model``.
Ctrl-C (or SIGTERM) stops at once: the line is finished, what was made is kept (and printed as
the JSON object under ``--json``), one line on stderr says how many tokens, exit status 130.
``--no-cache`` runs the cacheless oracle (every token from the whole prefix), for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from . import UsageError, bounded_int, nonnegative_int, positive_float

HELP = "generate text from a causal language model (KV tape; greedy or sampled)"
EPILOG = ("MODEL: as for `splitformer analyze` (gpt2-tiny, a run folder of the lm family, a "
          "local Hugging Face GPT-2 folder with its tokenizer), or a GGUF network: smollm2 (the "
          "packaged SmolLM2-135M-Instruct, `make data`) or a .gguf path. Exit status 130 after "
          "Ctrl-C (what was made is kept).")


def _unit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="built-in name, run folder, saved folder or "
                   "local Hugging Face folder of a causal LM")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=nonnegative_int, default=32, metavar="N",
                   help="tokens to generate at most (default 32)")
    p.add_argument("--sample", action="store_true",
                   help="sample the next token (default: greedy, the most probable)")
    p.add_argument("--temperature", type=positive_float, default=1.0,
                   help="with --sample: divide the logits by T (default 1)")
    p.add_argument("--top-k", type=nonnegative_int, default=0, metavar="K",
                   help="with --sample: keep the K most probable tokens (default 0: all)")
    p.add_argument("--top-p", type=_unit_interval, default=1.0, metavar="P",
                   help="with --sample: keep the most probable tokens of total probability P "
                   "(default 1: all)")
    p.add_argument("--seed", type=bounded_int(2 ** 31 - 1, "(0 .. 2^31 - 1)", minimum=0),
                   default=0, help="with --sample: the random seed (default 0; 0 .. 2^31 - 1)")
    p.add_argument("--chat", action="store_true",
                   help="read PROMPT as a user's message: the tokenizer's chat template makes "
                   "the prompt (the assistant's turn opened), generation stops at the "
                   "tokenizer's end of turn (eos), and the answer alone is printed; refused "
                   "when the tokenizer has no chat template")
    p.add_argument("--no-cache", action="store_true",
                   help="re-run the whole prefix for every token (the cacheless oracle)")
    p.add_argument("--json", action="store_true",
                   help="no streaming; one JSON object on the last line of stdout")
    p.set_defaults(_interrupted="")


def _load(spec: str) -> Any:
    from ..models.causal import CausalLM
    from ..subjects.resolve import load_subject
    from ..subjects.subject import InputError

    try:
        sub = load_subject(spec)
    except InputError as e:
        raise UsageError(str(e)) from None
    if not isinstance(sub.model, CausalLM) or sub.encode is None or sub.decode is None:
        raise UsageError(f"argument MODEL: {sub.what}, not a causal language model with a "
                         "tokenizer (one with an LM read-out that reads and writes text)")
    return sub


class _Stream:
    """Prints the new text as it decodes to whole characters (a piece of a multi-byte
    character waits for the rest)."""

    def __init__(self, decode, enabled: bool, prompt: str) -> None:
        self.decode, self.enabled, self.prompt = decode, enabled, prompt
        self.ids: list[int] = []
        self.shown = ""
        self.stamps: list[float] = []
        self.printed = False  # the prompt goes out with the first new token

    def _prompt(self) -> None:
        """The prompt, printed once, with the first new token (a refusal prints nothing)."""
        if self.enabled and not self.printed:
            self.printed = True
            sys.stdout.write(self.prompt)

    def __call__(self, ids) -> None:
        self.stamps.append(time.perf_counter())
        self.ids.append(int(ids[0]))
        if not self.enabled:
            return
        self._prompt()
        text = self.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.shown):
            return
        sys.stdout.write(text[len(self.shown):])
        sys.stdout.flush()
        self.shown = text

    def finish(self) -> None:
        if self.enabled:
            self._prompt()
            text = self.decode(self.ids)
            if text.startswith(self.shown):
                sys.stdout.write(text[len(self.shown):])
            sys.stdout.write("\n")
            sys.stdout.flush()


def _prompt_ids(sub: Any, args: argparse.Namespace):
    """The prompt as the model's ids, checked against its positions (one-line refusals)."""
    from ..subjects.subject import InputError

    try:
        if args.chat:
            enc = _chat_ids(sub, args)
        else:
            enc = sub.encode([args.prompt], "--prompt")
    except InputError as e:
        raise UsageError(str(e)) from None
    ids = enc.inputs["input_ids"]
    if enc.unknown:
        sys.stderr.write(f"splitformer generate: note: {enc.unknown} {enc.unknown_kind} of "
                         f"--prompt are not in the model's vocabulary and were read as its "
                         f"unknown mark ({enc.unknown_what}); the model continues that text\n")
    if sub.max_len is not None and enc.full > ids.shape[1]:
        raise UsageError(f"argument --prompt: {enc.full} tokens, more than the model's "
                         f"{sub.max_len} positions")
    limit = sub.model.max_positions
    if limit is not None and ids.shape[1] + args.max_new_tokens > limit:
        raise UsageError(f"argument --max-new-tokens: max_new_tokens={args.max_new_tokens}: "
                         f"the prompt ({ids.shape[1]} tokens) and the new tokens exceed the "
                         f"model's {limit} learned positions")
    return ids


def _chat_ids(sub: Any, args: argparse.Namespace) -> Any:
    """--chat: PROMPT as a user's message through the tokenizer's chat template (the subject's
    ``chat``, ``subjects.hf``); the tokenizer's eos ids join the subject's stop ids."""
    chat = getattr(sub, "chat", None)
    if chat is None:
        raise UsageError(f"argument --chat: MODEL {args.model!r} ({sub.what}) has no tokenizer "
                         "with a chat template; without --chat the prompt is continued as text")
    enc, ends = chat(args.prompt, "--chat")
    sub.eos_token_ids = tuple(dict.fromkeys((*sub.eos_token_ids, *ends)))
    return enc


def _check_sampling(args: argparse.Namespace) -> None:
    if args.prompt == "":
        raise UsageError("argument --prompt: expected a text to continue, got ''")
    if not args.sample:
        given = [flag for flag, value, default in (
            ("--temperature", args.temperature, 1.0), ("--top-k", args.top_k, 0),
            ("--top-p", args.top_p, 1.0), ("--seed", args.seed, 0)) if value != default]
        if given:
            raise UsageError(f"argument {given[0]}: it acts on sampling; add --sample (without "
                             "it the most probable token is taken)")


def _decode(sub: Any, ids, args: argparse.Namespace, stream: _Stream) -> str:
    """Generate into ``stream``; what stopped it ("max_new_tokens", "eos", "interrupted")."""
    from ..operators.tape import TapeError

    options: dict[str, Any] = {"eos_token_id": list(sub.eos_token_ids) or None,
                               "use_cache": not args.no_cache}
    if args.sample:
        options.update(do_sample=True, temperature=args.temperature, seed=args.seed,
                       top_k=args.top_k or None, top_p=args.top_p)
    try:
        sub.model.eval().generate(ids, args.max_new_tokens, streamer=stream, **options)
    except KeyboardInterrupt:
        return "interrupted"
    except ValueError as e:  # the model refuses (a kernel that cannot be cached exactly)
        if stream.ids and not args.json:
            sys.stdout.write("\n")
        hint = " (or pass --no-cache)" if isinstance(e, TapeError) else ""
        raise UsageError(f"argument MODEL: {e}{hint}") from None
    new = stream.ids
    return "eos" if new and sub.eos_token_ids and new[-1] in sub.eos_token_ids \
        else "max_new_tokens"


def run(args: argparse.Namespace) -> int:
    import torch

    _check_sampling(args)
    t0 = time.perf_counter()
    sub = _load(args.model)
    ids = _prompt_ids(sub, args)
    if not args.json:
        kind = "chat prompt (template)" if args.chat else "prompt"
        sys.stderr.write(f"splitformer generate: {sub.what}; {kind} {ids.shape[1]} tokens "
                         f"(loaded in {time.perf_counter() - t0:.1f} s)\n")
    # a chat prints the answer alone; a continuation the prompt first
    stream = _Stream(sub.decode, not args.json, "" if args.chat else args.prompt)
    start = time.perf_counter()
    stopped = _decode(sub, ids, args, stream)
    stream.finish()
    new, stamps = stream.ids, stream.stamps
    prefill = stamps[0] - start if stamps else None
    decode_rate = (len(new) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None
    if stopped == "interrupted":
        sys.stderr.write(f"splitformer generate: interrupted after {len(new)} new tokens "
                         "(kept above)\n")
    elif not args.json:
        rate = f", decode {decode_rate:.1f} tokens/s" if decode_rate else ""
        sys.stderr.write(f"splitformer generate: {len(new)} new tokens ({stopped}){rate}\n")
    if args.json:
        print(json.dumps({
            "model": args.model, "prompt": args.prompt, "text": sub.decode(new), "ids": new,
            "prompt_tokens": int(ids.shape[1]), "new_tokens": len(new), "stopped": stopped,
            "prefill_seconds": prefill, "decode_tokens_per_s": decode_rate,
            "cache": not args.no_cache, "sample": bool(args.sample), "chat": bool(args.chat),
            "torch_threads": torch.get_num_threads()}))
    return 130 if stopped == "interrupted" else 0
