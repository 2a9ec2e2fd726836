"""The checks of `splitformer compress`'s inputs against each other and against MODEL, made
before anything is written (``commands.compress``): each refusal names its flag."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import UsageError

DATA_DRIVEN = ("drop", "angular", "sleb", "pairs")  # compression.coarsenings.DATA_DRIVEN


NOTHING_TO_FIT = ("parallel", "coarsen", "coarsen-linear")
"""The methods whose grids have no absorbing steps (``--fit`` keep only; its default there)."""

def check_grid(cfg, teacher, folder: Path) -> None:
    """The coarse grids exist and the windows fit the model: checked before anything is
    written (the method's own refusal, named by its flag)."""
    from ..compression.coarsenings import plan

    layers = teacher.evolution.num_steps
    bad = [n for n in cfg.steps if n > layers]
    if bad:
        raise UsageError(f"argument --steps: {bad} exceed the model's {layers} steps")
    if len(cfg.steps) == 1 and cfg.steps[0] == layers and not cfg.merge:
        raise UsageError(f"argument --steps: {layers} is the model itself; ask for fewer, or "
                         "give --merge R to heal the merged network at full depth")
    for n in cfg.steps:
        if cfg.method == "every-other" and n != layers and layers % n:
            raise UsageError(f"argument --steps: every-other needs N_t dividing the model's "
                             f"{layers} steps, got {n}")
        if cfg.method not in DATA_DRIVEN:  # the data-free grids: built now
            try:
                plan(cfg.method, teacher, n)
            except ValueError as e:
                raise UsageError(f"argument --method: {e}") from None
    positions = json.loads((folder / "config.json").read_text()).get(
        "max_position_embeddings", 512)
    if not 3 <= cfg.length <= positions:
        raise UsageError(f"argument --length: expected 3 to {positions} tokens (the model's "
                         f"learned positions; [CLS] and [SEP] included), got {cfg.length}")


def check_windows(args: argparse.Namespace) -> None:
    """The flags of the healing windows (--batch-size, --aligned, --probe, --wiki, --news)
    against each other and --windows: UsageError naming the flag."""
    if args.batch_size > args.windows:
        raise UsageError(f"argument --batch-size: at most --windows ({args.windows}) windows a "
                         f"step, got {args.batch_size}")
    if args.aligned and not args.news:
        raise UsageError("argument --aligned: aligns the news windows, but --news is "
                         + ("not given; add --news F" if args.news is None else
                            "0 (no news window); give --news F > 0 or drop --aligned"))
    if args.probe is not None and args.probe > args.windows:
        raise UsageError(f"argument --probe: at most --windows ({args.windows}) windows, got "
                         f"{args.probe}")
    if args.probe is not None and args.method not in DATA_DRIVEN:
        raise UsageError(f"argument --probe: only {', '.join(DATA_DRIVEN)} read a probe, but "
                         f"--method is {args.method}")
    if args.wiki and round(args.wiki * args.windows) == 0:
        raise UsageError(f"argument --wiki: {args.wiki:g} of --windows {args.windows} is no "
                         "window; give a larger fraction")
    if args.news is not None and args.wiki and args.news + args.wiki > 1:
        raise UsageError(f"argument --wiki: --news + --wiki must be at most 1 (fractions of "
                         f"the windows), got {args.news:g} + {args.wiki:g}")


def check_lm_grid(cfg, teacher) -> None:
    """The coarse grids exist and the windows fit a causal LM (checked before anything is
    written)."""
    from ..compression.coarsenings import plan

    layers = teacher.evolution.num_steps
    bad = [n for n in cfg.steps if n >= layers]
    if bad:
        raise UsageError(f"argument --steps: expected fewer than the model's {layers} steps, "
                         f"got {bad}")
    for n in cfg.steps:
        if cfg.method == "every-other" and layers % n:
            raise UsageError(f"argument --steps: every-other needs N_t dividing the model's "
                             f"{layers} steps, got {n}")
        if cfg.method == "pairs" and 2 * (layers - n) > layers:
            raise UsageError(f"argument --steps: pairs merges {layers - n} disjoint pairs, "
                             f"which needs at least {(layers + 1) // 2} steps, got {n}")
        if cfg.method not in DATA_DRIVEN:
            try:
                plan(cfg.method, teacher, n)
            except ValueError as e:
                raise UsageError(f"argument --method: {e}") from None
    if cfg.fit != "keep" and (cfg.method in NOTHING_TO_FIT or cfg.merge):
        raise UsageError(f"argument --fit: {cfg.fit} fits the absorbing steps of a grid of "
                         f"kept steps; --method {cfg.method} has none (use --fit keep, or "
                         "--method pairs for merged pairs)")
    trained = teacher.trained_positions
    if trained is not None and not 2 <= cfg.length <= trained:
        raise UsageError(f"argument --length: expected 2 to {trained} tokens (the model's "
                         f"trained context), got {cfg.length}")


def check_model(spec: str | None, decoder: bool) -> None:
    """MODEL's checks that read no weights: the packaged name spelled as it is, a ``.gguf``
    file that exists, or a folder of a causal LM or of an encoder compress heals; UsageError
    naming MODEL otherwise (``decoder``: whether ``compress_lm.is_decoder`` reads it as a
    causal LM). None (the packaged MiniLM) is checked when it is read."""
    from ..interop.gguf import PACKAGED
    from ..subjects.resolve import locate_gguf
    from ..subjects.subject import InputError

    if spec is None or spec in PACKAGED:
        return
    if spec.strip().lower() in PACKAGED:
        raise UsageError(f"argument MODEL: {spec!r} is not a model name; the packaged model "
                         f"is {spec.strip().lower()!r}")
    if spec.lower().endswith(".gguf"):
        try:
            locate_gguf(spec)  # in the words generate uses for the same MODEL
        except InputError as e:
            raise UsageError(str(e)) from None
    elif not decoder:
        model_folder(spec)


def model_folder(arg: str | None) -> Path:
    """The encoder folder MODEL names (None: the packaged MiniLM), checked from its
    config.json alone: a compress result, a missing folder, another model_type refused by
    name."""
    from ..experiments.text_benchmarks import minilm_folder
    from ..interop.families import compressible
    from ..training.data import DatasetError

    if arg is None:
        try:
            return minilm_folder()
        except DatasetError as e:
            raise UsageError(f"argument MODEL: {e}") from None
    folder = Path(arg)
    if not folder.exists():
        raise UsageError(f"argument MODEL: {arg!r} does not exist (expected smollm2, a .gguf "
                         "file or a Hugging Face model folder)")
    if not folder.is_dir():
        raise UsageError(f"argument MODEL: {arg!r} is a file, not a Hugging Face model folder "
                         "(nor a .gguf file)")
    if (folder / "compress.json").is_file() and not (folder / "config.json").is_file():
        hint = (f"; its network as a transformers folder is {str(folder / 'hf')!r}"
                if (folder / "hf" / "config.json").is_file() else "")
        raise UsageError(f"argument MODEL: {arg!r} is a compress result folder, not a Hugging "
                         f"Face model folder{hint}")
    if not (folder / "config.json").is_file():
        raise UsageError(f"argument MODEL: {arg!r} is not a Hugging Face model folder (no "
                         "config.json)")
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"argument MODEL: {folder / 'config.json'}: {e}") from None
    if model_type is None:
        raise UsageError(f"argument MODEL: {folder / 'config.json'} has no model_type: not a "
                         "transformers model folder")
    healed = compressible("encoder")  # the family records (interop.families) say which
    if not any(model_type in f.model_types for f in healed):
        labels = " or ".join(f.label for f in healed)
        types = ", ".join(repr(t) for f in healed for t in f.model_types)
        raise UsageError(f"argument MODEL: compress heals {labels} text encoders (model_type "
                         f"{types}), got model_type {model_type!r}")
    return folder
