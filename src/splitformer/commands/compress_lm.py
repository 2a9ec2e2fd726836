"""`splitformer compress` for a causal language model of the Llama family (docs/depth-llm.md):
the parts of the command that differ from a text encoder's (``commands.compress``).

MODEL: ``smollm2`` (the packaged SmolLM2-135M-Instruct of ``make data``), a ``.gguf`` file, or
a local transformers folder of the Llama family (``interop.families``: Llama, Mistral, Qwen2,
Qwen3, Gemma2, Gemma3). The healing text is ``lm_eval.healing_windows``: King James windows
outside the held-out books and the first pages of gensim's Wikipedia extract (``--wiki``, the
Wikipedia share, default 0.5), never its last pages, which the evaluation reads. ``--fit``
chooses what the steps that absorb a removed stretch compute (``compression.fitting``),
``--heal kl`` (the default here) heals on the next-token distributions (KL to the teacher's),
after the local phase of ``--fit step`` (``--fit-budget``). The evaluation (unless
``--no-eval``) is ``lm_eval.LMEvaluation`` on the held-out pages: perplexity, bits per byte,
KL, top-1 agreement and greedy continuations against MODEL.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import UsageError

DEFAULTS = {"method": "drop", "heal": "kl", "windows": 2048}
"""The defaults for a causal LM, where a flag is not given (docs/depth-llm.md says why: drop is
ahead of SLEB training-free at 22 of SmolLM2's 30 steps, and SLEB's lead after healing is not
separated once its choice is charged to the budget; healing windows of --length 128 tokens,
the flag's default). ``--fit`` is :func:`default_fit`'s."""


def default_fit(heal: str, method: str) -> str:
    """``--fit`` where it is not given, decided by the measurements (docs/depth-llm.md):
    training-free (``--heal none``) the least-squares map (``linear``: 2.74x the teacher's
    perplexity at 22 steps against 3.42x deleted); healed, deletion (``keep``: 1.836x +-
    0.008 against 1.907x +- 0.014 for the maps over three seeds each after the same 260 KL
    steps, Welch p 0.0038; level at 26 steps). ``keep`` for the grids that have no absorbing
    steps to fit (``parallel``, ``coarsen``, ``coarsen-linear``)."""
    from .compress_checks import NOTHING_TO_FIT

    if method in NOTHING_TO_FIT:
        return "keep"
    return "linear" if heal == "none" else "keep"

HEALING_DEFAULTS = {"batch_size": 4, "lr": 3e-4, "healed": "controls", "wiki": 0.5}
"""The healing flags' defaults for a causal LM (``commands.compress._DEFAULTS`` otherwise).
lr: the best of 1e-4, 3e-4 and 1e-3 measured on SmolLM2 at 22 steps (docs/depth-llm.md, "The
KL phase's learning rate": 1.708x +- 0.007 against 1.836x +- 0.008 at 1e-4, three seeds each;
at 1e-3 the loss stayed above both)."""

ENCODER_ONLY = (("--recipe", "recipe"), ("--news", "news"), ("--aligned", "aligned"),
                ("--embedding", "embedding"), ("--relation", "relation"),
                ("--merge", "merge"), ("--min-length", "min_length"))


def is_decoder(spec: str | None) -> bool:
    """Whether MODEL names a causal LM of the Llama family (the short name, a .gguf file, or a
    folder whose config.json has such a model_type); False for the default MiniLM and BERT."""
    from ..interop.families import compressible
    from ..interop.gguf import PACKAGED

    if spec is None:
        return False
    if spec in PACKAGED or spec.lower().endswith(".gguf"):
        return True
    config = Path(spec) / "config.json"
    if not config.is_file():
        return False
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return False
    return any(model_type in f.model_types for f in compressible("causal-lm"))


def apply_defaults(args: argparse.Namespace) -> None:
    """The causal-LM defaults for the flags not given; the encoder-only flags refused."""
    for flag, key in ENCODER_ONLY:
        value = getattr(args, key, None)
        if value not in (None, False, 0):
            raise UsageError(f"argument {flag}: applies to text encoders (MiniLM, BERT); MODEL "
                             f"{args.model!r} is a causal language model")
    if args.heal is not None and args.heal not in ("none", "kl", "distill", "shoot"):
        raise UsageError(f"argument --heal: expected none, kl, distill or shoot, got "
                         f"{args.heal!r}")
    for key, value in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.fit is None:
        args.fit = default_fit(args.heal, args.method)
    args.steps = args.steps or (22,)
    if args.fit != "keep" and len(args.steps) != 1:
        raise UsageError(f"argument --steps: --fit {args.fit} fits the absorbing steps of one "
                         f"grid; give one N, got {','.join(map(str, args.steps))} (or --fit "
                         "keep)")
    if args.fit == "step" and args.fit_budget is None and args.fit_steps is None:
        args.fit_budget = 240.0
    if args.fit == "step" and not args.fit_budget and not args.fit_steps:  # --fit-budget 0
        raise UsageError("argument --fit-budget: --fit step fits the absorbing steps by AdamW, "
                         "which needs time: give a --fit-budget above 0 or --fit-steps")
    if args.fit != "step":
        for flag, key in (("--fit-init", "fit_init"), ("--fit-budget", "fit_budget"),
                          ("--fit-steps", "fit_steps")):
            if getattr(args, key) is not None:
                raise UsageError(f"argument {flag}: sets the AdamW fit of --fit step, but "
                                 f"--fit is {args.fit}")


def refuse_lm_flags(args: argparse.Namespace) -> None:
    """For a text encoder: the causal-LM flags refused by name; its defaults (3 steps, the
    absorbing steps kept) set."""
    if args.heal == "kl":
        raise UsageError("argument --heal: kl heals a causal LM's next-token distributions; "
                         "MODEL is a text encoder (distill, shoot or none)")
    for flag, key in (("--fit", "fit"), ("--fit-init", "fit_init"),
                      ("--fit-budget", "fit_budget"), ("--fit-steps", "fit_steps")):
        if getattr(args, key) is not None:
            raise UsageError(f"argument {flag}: fits the steps of a causal LM's dropped grid; "
                             "MODEL is a text encoder")
    args.steps = args.steps or (3,)
    args.fit = "keep"


def load(spec: str) -> tuple[Any, Any]:
    """(the splitformer model, its tokenizer) of MODEL; UsageError naming MODEL otherwise."""
    from ..models.causal import CausalLM
    from ..subjects.resolve import load_subject
    from ..subjects.subject import InputError

    try:
        sub = load_subject(spec)
    except InputError as e:
        raise UsageError(str(e)) from None
    model = sub.model
    if not isinstance(model, CausalLM):
        raise UsageError(f"argument MODEL: {sub.what}, not a causal language model with an "
                         "LM head")
    tokenizer = vars(model).get("tokenizer")
    if tokenizer is None and Path(spec).is_dir():
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(spec, local_files_only=True)
        except (OSError, ValueError) as e:
            raise UsageError(f"argument MODEL: {spec!r} has no tokenizer that transformers "
                             f"reads ({' '.join(str(e).split())[:200]})") from None
    if tokenizer is None:
        raise UsageError(f"argument MODEL: {spec!r} has no tokenizer (the healing text is "
                         "encoded with it)")
    return model.eval(), tokenizer


def windows(tokenizer, args: argparse.Namespace, cfg) -> Any:
    """The healing windows (M, n) of ``lm_eval.healing_windows``."""
    from ..experiments import lm_eval
    from ..training.data import DatasetError

    try:
        return lm_eval.healing_windows(tokenizer, cfg.length, args.windows, cfg.seed,
                                       wiki=args.wiki)
    except DatasetError as e:
        raise UsageError(f"the healing text is missing: {e}") from None
    except ValueError as e:
        raise UsageError(f"argument --length: {e}") from None


def evaluate(teacher, tokenizer, students: dict[int, Any], say) -> dict[str, Any]:
    """``lm_eval.LMEvaluation`` of each student against the teacher on the held-out pages."""
    from ..experiments import lm_eval

    try:
        text = lm_eval.lm_text(tokenizer)
        say("evaluating the teacher on the held-out pages (32 windows of 512 tokens)")
        evaluation = lm_eval.LMEvaluation(teacher, text)
    except ValueError as e:  # a tokenizer whose held-out text holds too few prompts
        raise UsageError(f"argument --no-eval: MODEL's tokenizer cannot be evaluated on the "
                         f"held-out pages ({e}); the same command with --no-eval writes DIR "
                         "(the healing's checkpoint is kept)") from None
    out = {}
    for n, student in students.items():
        say(f"evaluating the {n}-step model")
        row = evaluation(student)
        out[str(n)] = {k: row[k] for k in ("perplexity", "perplexity_ratio", "bits_per_byte",
                                           "kl", "top1", "match_tokens", "match_full")
                       if k in row}
        out[str(n)]["teacher_perplexity"] = row["teacher"]["perplexity"]
    return out
