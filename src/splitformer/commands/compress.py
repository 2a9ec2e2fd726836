"""`splitformer compress`: fewer steps (and tokens) for a pretrained text encoder, healed as
an optimal-control problem within a wall-clock budget (docs/depth.md).

MODEL is a local Hugging Face BERT folder (as ``save_pretrained`` writes it; default: the
packaged all-MiniLM-L6-v2 of ``make data``). ``--method`` chooses the coarse grid
(``compression.coarsenings``), ``--steps`` its N_t (several, comma-separated: one set of
parameters healed to serve each, drawn per step: random-tau healing), ``--heal`` the objective
(``control.healing.Distillation``): "distill" matches u(T) only, "shoot" also the states at the
coarse grid's times (multiple shooting, weight ``--shooting``), "none" writes the
training-free coarse model. The healing text is King James windows outside the held-out books
plus gensim's lee_background.cor (``--news``) and its shortened English Wikipedia (``--wiki``;
``experiments.depth_eval.healing_windows``); the evaluation documents never reach it.
``--healed controls`` optimises theta(t) alone (the embeddings stay the teacher's).
``--merge R`` heals with token merging on (R nodes per unit of time, metric state, at the
start of each step).

Writes DIR (``--out``): compress.json, model.safetensors, hf/ (the N_t-layer network that
transformers loads, when the grid is a layer list) and heal/ (the healing run: rerunning the
same command resumes it; once DIR is finished its checkpoints are removed, its config,
metrics and final.json kept, and the finished DIR is refused). ``splitformer.load(DIR)``
rebuilds the model. Prints the result and, unless ``--no-eval``, its fidelity to the original
on held-out text (mean cosine of the sentence embeddings, Lee-50 pair-cosine Spearman);
``--json`` prints one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import (
    UsageError,
    bounded_int,
    duration,
    fraction,
    int_list,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    stripped,
)

MAX_WINDOWS = 100_000  # (count, length) int64 ids: 410 MB at 512 tokens
HELP = "coarsen a pretrained encoder in depth (and tokens) and heal it within a budget"
EPILOG = ("exit status: 0 done, 2 bad input (one line on stderr), 130 interrupted by Ctrl-C or "
          "SIGTERM (the healing checkpoints are kept: the same command resumes)")


def _add_healing_text(p: argparse.ArgumentParser) -> None:
    """The flags of the healing windows (``depth_eval.healing_windows``, the cut lengths)."""
    p.add_argument("--news", type=fraction, default=None,
                   help="fraction of the healing windows drawn from gensim's Lee background "
                        "news, the rest from the King James text (default: uniform over the "
                        "text, where the news is 7%%)")
    p.add_argument("--wiki", type=fraction, default=None,
                   help="fraction of the healing windows drawn from gensim's shortened English "
                        "Wikipedia (106 articles), in place of as many of the others (default "
                        "0; with --news, --news + --wiki <= 1)")
    p.add_argument("--aligned", action="store_true",
                   help="with --news: the news windows start where a background document "
                        "starts, as a document read whole does")
    p.add_argument("--length", type=positive_int, default=128,
                   help="tokens a healing window (128)")
    p.add_argument("--min-length", type=bounded_int(2**31 - 1, "(tokens)", minimum=2),
                   default=None,
                   help="cut each step's windows to a length drawn in [N, --length] (first "
                        "tokens and [SEP] kept), so that short inputs are healed too (default: "
                        "whole windows)")
    p.add_argument("--windows", type=bounded_int(MAX_WINDOWS, "(healing windows)"),
                   default=4096, help=f"healing windows drawn from the text (4096; at most "
                                      f"{MAX_WINDOWS})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..compression import method_names

    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a local Hugging Face BERT folder (default: the packaged "
                        "all-MiniLM-L6-v2, `make data`)")
    p.add_argument("--steps", type=int_list(1, why="coarse N_t", repeats=False), default=(3,),
                   help="the coarse number of steps; several (6,3,2): one healed network "
                        "serves each, the first is the one hf/ holds and load(DIR) builds "
                        "(default 3)")
    p.add_argument("--method", type=stripped, choices=method_names(), default="drop",
                   help="how the coarse grid is chosen (default drop: ShortGPT's block "
                        "influence)")
    p.add_argument("--probe", type=bounded_int(MAX_WINDOWS, "(probe windows)"), default=None,
                   help="healing windows the fine model is run on to choose the grid of drop "
                        "and angular (default 32, or all the windows if fewer; at most "
                        "--windows)")
    p.add_argument("--heal", type=stripped, choices=("distill", "shoot", "none"),
                   default="distill",
                   help="distill: match u(T); shoot: also the states at the coarse grid's "
                        "times; none: training-free (default distill)")
    p.add_argument("--shooting", type=nonnegative_float, default=1.0,
                   help="weight of the shooting terms with --heal shoot (default 1)")
    p.add_argument("--embedding", type=nonnegative_float, default=None,
                   help="weight of 1 - cos of the sentence embeddings (default 0)")
    p.add_argument("--relation", type=nonnegative_float, default=None,
                   help="weight of the squared differences of the pair cosines of a batch's "
                        "sentence embeddings (default 0)")
    p.add_argument("--budget", type=duration, default=None,
                   help="healing wall-clock budget: seconds or 90s, 10m, 1h (default 10m)")
    p.add_argument("--max-steps", type=nonnegative_int, default=_DEFAULTS["max_steps"],
                   help="at most this many optimiser steps (default: the budget alone)")
    p.add_argument("--lr", type=positive_float, default=None, help="AdamW rate (1e-4)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="windows a step (16)")
    _add_healing_text(p)
    p.add_argument("--precision", type=stripped, choices=("float32", "bfloat16"),
                   default=None, help="the healing's arithmetic: float32 (default) or bfloat16 "
                                      "(mixed precision under autocast, float32 parameters; "
                                      "more steps per second on a CPU with AVX512-BF16, "
                                      "docs/depth.md)")
    p.add_argument("--healed", type=stripped, choices=("all", "controls"), default=None,
                   help="what the healing optimises: all (default) or controls (theta(t) "
                        "only; the embeddings stay the teacher's, a faster step)")
    p.add_argument("--merge", type=nonnegative_int, default=None,
                   help="heal with token merging on: nodes merged per unit of time (0: off)")
    p.add_argument("--seed", type=bounded_int(2**31 - 1, "(a seed)", minimum=0), default=0,
                   help="seed (default 0; 0 .. 2^31 - 1)")
    p.add_argument("--threads", type=bounded_int(os.cpu_count() or 1, "(torch threads)"),
                   default=None, help="torch threads")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="result folder (default out/compress-<method>-<steps>)")
    p.add_argument("--no-eval", action="store_true",
                   help="skip the fidelity check on held-out text")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on the last line of stdout")
    p.set_defaults(_interrupted=" before healing began (nothing to resume)")


# the flags that only the healing reads, and their defaults (refused with --heal none)
_HEALING_FLAGS = (("--budget", "budget"), ("--max-steps", "max_steps"), ("--lr", "lr"),
                  ("--batch-size", "batch_size"), ("--embedding", "embedding"),
                  ("--relation", "relation"), ("--news", "news"), ("--merge", "merge"),
                  ("--precision", "precision"), ("--min-length", "min_length"),
                  ("--healed", "healed"), ("--wiki", "wiki"))
_DEFAULTS = {"budget": 600.0, "max_steps": None, "lr": 1e-4, "batch_size": 16,
             "embedding": 0.0, "relation": 0.0, "news": None,
             "merge": 0, "precision": "float32", "healed": "all", "wiki": None,
             "min_length": None}  # max_steps, news, min_length: None is the default itself


def _model_folder(arg: str | None) -> Path:
    from ..experiments.text_benchmarks import minilm_folder
    from ..interop.families import compressible
    from ..training.data import DatasetError

    if arg is None:
        try:
            return minilm_folder()
        except DatasetError as e:
            raise UsageError(f"argument MODEL: {e}") from None
    folder = Path(arg)
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
    healed = compressible()  # the family records (interop.families) say which it heals
    if not any(model_type in f.model_types for f in healed):
        labels = " or ".join(f.label for f in healed)
        types = ", ".join(repr(t) for f in healed for t in f.model_types)
        raise UsageError(f"argument MODEL: compress heals {labels} text encoders (model_type "
                         f"{types}), got model_type {model_type!r}")
    return folder


_OURS = ("heal", "model.safetensors", "hf", "tokenizer", ".lock")


def _check_out(args: argparse.Namespace) -> Path:
    out = Path(args.out if args.out is not None else
               f"out/compress-{args.method}-{'-'.join(map(str, args.steps))}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"argument --out: {str(out)!r} is a file, expected a folder")
    if (out / "compress.json").exists():
        raise UsageError(f"argument --out: {str(out)!r} holds a finished compression "
                         "(compress.json); choose another folder")
    if out.is_dir():  # ours, or a temporary file of ours a kill left (files' .name.tmp-*)
        extra = sorted(p.name for p in out.iterdir() if p.name not in _OURS
                       and not (p.name.startswith(".") and ".tmp" in p.name))
        if extra:
            raise UsageError(f"argument --out: {str(out)!r} holds other files ({extra[:3]}); "
                             "choose a new or empty folder")
    return out


def _check_grid(cfg, teacher, folder: Path) -> None:
    """The coarse grids exist and the windows fit the model: checked before anything is
    written (the method's own refusal, named by its flag)."""
    from ..compression.coarsenings import plan

    layers = teacher.evolution.num_steps
    bad = [n for n in cfg.steps if n > layers]
    if bad:
        raise UsageError(f"argument --steps: {bad} exceed the model's {layers} steps")
    if len(cfg.steps) == 1 and cfg.steps[0] == layers:
        raise UsageError(f"argument --steps: {layers} is the model itself; ask for fewer")
    for n in cfg.steps:
        if cfg.method == "every-other" and n != layers and layers % n:
            raise UsageError(f"argument --steps: every-other needs N_t dividing the model's "
                             f"{layers} steps, got {n}")
        if cfg.method not in ("drop", "angular"):  # the data-free grids: built now
            try:
                plan(cfg.method, teacher, n)
            except ValueError as e:
                raise UsageError(f"argument --method: {e}") from None
    positions = json.loads((folder / "config.json").read_text()).get(
        "max_position_embeddings", 512)
    if not 3 <= cfg.length <= positions:
        raise UsageError(f"argument --length: expected 3 to {positions} tokens (the model's "
                         f"learned positions; [CLS] and [SEP] included), got {cfg.length}")


def _check_windows(args: argparse.Namespace) -> None:
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
    if args.probe is not None and args.method not in ("drop", "angular"):
        raise UsageError(f"argument --probe: only drop and angular read a probe, but "
                         f"--method is {args.method}")
    if args.wiki and round(args.wiki * args.windows) == 0:
        raise UsageError(f"argument --wiki: {args.wiki:g} of --windows {args.windows} is no "
                         "window; give a larger fraction")
    if args.news is not None and args.wiki and args.news + args.wiki > 1:
        raise UsageError(f"argument --wiki: --news + --wiki must be at most 1 (fractions of "
                         f"the windows), got {args.news:g} + {args.wiki:g}")


def _heal_config(args: argparse.Namespace):
    """The HealConfig the flags ask for, checked before anything is loaded: the healing-only
    flags refused with --heal none (a flag left at None was not given), a budget or step
    count of 0 refused when healing, a batch no larger than the windows."""
    from ..compression.heal import HealConfig

    given = [flag for flag, key in _HEALING_FLAGS if getattr(args, key) is not None]
    if args.aligned:  # a switch: given when set
        given.append("--aligned")
    for _, key in _HEALING_FLAGS:  # None: not given (so that a default typed out is seen)
        if getattr(args, key) is None:
            setattr(args, key, _DEFAULTS[key])
    if args.heal == "none":
        if given:
            raise UsageError(f"argument {given[0]}: sets the healing, but --heal is none "
                             "(the training-free model); drop it or choose distill or shoot")
        budget, max_steps = 0.0, 0
    else:
        budget, max_steps = args.budget, args.max_steps
        if budget == 0:
            raise UsageError("argument --budget: 0 heals nothing; use --heal none for the "
                             "training-free model, or give a budget")
        if max_steps == 0:
            raise UsageError("argument --max-steps: 0 heals nothing; use --heal none for the "
                             "training-free model, or give steps")
    _check_windows(args)
    if args.method == "parallel" and min(args.steps) < 2:  # whatever the model: no data read
        raise UsageError(f"argument --method: parallel superposes the middle steps into one, so "
                         f"--steps {min(args.steps)} would superpose all of them; ask for at "
                         "least 2")
    probe = 32 if args.probe is None else args.probe  # windows[:32]: fewer if fewer
    if args.min_length is not None and not 2 <= args.min_length <= args.length:
        raise UsageError(f"argument --min-length: expected an int in [2, --length="
                         f"{args.length}], got {args.min_length}")
    if args.relation and args.batch_size < 2:
        raise UsageError(f"argument --relation: compares the pairs of a batch, which needs "
                         f"--batch-size >= 2, got {args.batch_size}")
    if args.heal != "shoot" and args.shooting != 1.0:
        raise UsageError(f"argument --shooting: weights the shooting terms of --heal shoot, "
                         f"but --heal is {args.heal}")
    try:
        return HealConfig(method=args.method, steps=tuple(args.steps), budget=budget,
                         max_steps=max_steps, lr=args.lr, batch_size=args.batch_size,
                         length=args.length, seed=args.seed, merge=args.merge,
                         shooting=args.shooting if args.heal == "shoot" else 0.0,
                         embedding=args.embedding, relation=args.relation,
                         precision=args.precision, min_length=args.min_length,
                         healed=args.healed, probe=probe)
    except ValueError as e:
        raise UsageError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    cfg = _heal_config(args)
    out = _check_out(args)  # before MODEL: neither needs the other (nor the packaged MiniLM)
    folder = _model_folder(args.model)
    import torch

    from ..experiments.text_benchmarks import load_minilm
    from ..files import FolderLock, FolderLockedError
    from ..interop import from_hf
    from ..training.data import DatasetError

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        minilm = load_minilm(folder)
    except (DatasetError, OSError, ValueError) as e:
        raise UsageError(f"argument MODEL: {' '.join(str(e).split())}") from None
    teacher = from_hf(minilm.model).eval()
    _check_grid(cfg, teacher, folder)
    fresh = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"argument --out: cannot make the folder {str(out)!r} "
                         f"({e.strerror or e})") from None
    try:
        lock = FolderLock(out, what="compression folder").acquire()
    except FolderLockedError as e:
        raise UsageError(f"argument --out: {e}") from None
    try:
        return _compress(args, cfg, minilm, teacher, folder, out)
    except BaseException:
        if fresh and not any(p.name != ".lock" for p in out.iterdir()):
            lock.release()
            lock = None
            from ..files import remove_path

            remove_path(out)  # nothing of ours was written: leave no empty folder
        raise
    finally:
        if lock is not None:
            lock.release()


def _compress(args, cfg, minilm, teacher, folder: Path, out: Path) -> int:
    from ..compression.store import write_result
    from ..experiments import depth_eval
    from ..training.checkpoints import remove_checkpoints
    from ..training.data import DatasetError

    try:
        windows = depth_eval.healing_windows(minilm.tokenizer, cfg.length, args.windows,
                                             cfg.seed, news=args.news,
                                             aligned=args.aligned, wiki=args.wiki or 0.0)
    except DatasetError as e:
        raise UsageError(f"the healing text is missing: {e}") from None
    except ValueError as e:
        raise UsageError(f"argument --length: {e}") from None
    say = _say(args.json)
    result = _heal(args, cfg, teacher, windows, out, say)
    if not minilm.sentence_transformers and not args.no_eval:
        say("  MODEL has no sentence-transformers modules.json: the fidelity compares the "
            "masked means of u(T), normalised")
    report: dict = {"model": str(args.model) if args.model else "all-MiniLM-L6-v2",
                    "method": cfg.method, "steps": list(cfg.steps), "objective": args.heal,
                    "windows": {"count": args.windows, "length": cfg.length,
                                "news": args.news, "aligned": args.aligned,
                                "wiki": args.wiki or 0.0},
                    "heal": cfg.to_dict(),
                    "metrics": result.metrics,
                    "grids": {str(n): str(c) for n, c in result.coarsenings.items()},
                    "notes": {str(n): dict(c.note or {})
                              for n, c in result.coarsenings.items()},
                    "sentence_embedding": "sentence-transformers' modules" if
                    minilm.sentence_transformers else "masked mean of u(T), normalised (MODEL "
                    "has no sentence-transformers modules.json)"}
    if not args.no_eval:
        evaluation = depth_eval.Evaluation(minilm)
        report["fidelity"] = {
            str(n): {k: v for k, v in evaluation(depth_eval.minilm_embed(result.student(n)),
                                                 full=False).items()
                     if "cosine" in k or "fidelity" in k}
            for n in cfg.steps}
    record = write_result(out, base=result.base, coarsenings=result.coarsenings,
                          default=cfg.steps[0], info={"heal": cfg.to_dict(), **report},
                          tokenizer_from=folder)
    # a finished DIR is refused, not resumed: the healing checkpoints (the base's weights and
    # AdamW's moments, three times model.safetensors) serve nothing; config and metrics stay
    remove_checkpoints(out / "heal")
    report["out"] = str(out)
    report["hf"] = str(out / "hf") if record["hf"] else record["hf_note"]
    if args.json:
        print(json.dumps(report))
    else:
        _print_result(report, result, out)
    return 0


def _heal(args, cfg, teacher, windows, out: Path, say):
    """``compression.heal`` into DIR/heal/, its progress on stderr after a header line that
    is printed once healing runs (a refused folder prints its one error line alone)."""
    from ..compression.heal import heal
    from ..training.checkpoints import CheckpointError

    header = (f"compress: {cfg.method} {teacher.evolution.num_steps} -> "
              f"{','.join(map(str, cfg.steps))} steps, heal {args.heal}"
              + (f" for {cfg.budget:g} s" if cfg.budget else "")
              + (f" or {cfg.max_steps} optimiser step{'s' * (cfg.max_steps != 1)}"
                 if cfg.budget and cfg.max_steps
                 else "") + f", out {out}")
    from ..training.checkpoints import latest_checkpoint

    last = latest_checkpoint(out / "heal") if (out / "heal").is_dir() else None
    if last is not None:
        header += f" (resuming the run in {out / 'heal'}, {last.name})"
    announced = False

    def announce() -> None:
        nonlocal announced
        if not announced:
            say(header)
            announced = True

    def progress(row: dict) -> None:
        announce()
        say(f"  step {row['step']} ({row['seconds']:.0f} s) N_t={row['steps']} "
            f"loss {row['loss']:.4g}")

    args._interrupted = (f" (a checkpoint of the healing is written in {out / 'heal'}; the "
                         "same command resumes)")
    try:
        result = heal(cfg, teacher=teacher, windows=windows, out=out / "heal", progress=progress)
    except (CheckpointError, ValueError) as e:
        text = " ".join(str(e).split())
        raise UsageError(f"argument --out: {text.removeprefix('out: ')}") from None
    announce()
    return result


def _print_result(report: dict, result, out: Path) -> None:
    """Each healed grid, its method's notes and fidelity, and where DIR went."""
    for n, c in result.coarsenings.items():
        print(f"{c}")
        for key, values in (c.note or {}).items():
            print(f"  {key}: {', '.join(f'{v:.4f}' for v in values)}")
        for k, v in report.get("fidelity", {}).get(str(n), {}).items():
            print(f"  {k}: {v:.4f}")
    m = result.metrics
    print(f"healed: {m['steps_taken']} optimiser steps in {m['seconds']:.0f} s; "
          f"wrote {out} (hf: {report['hf']})")


def _say(quiet: bool):
    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)
    return say
