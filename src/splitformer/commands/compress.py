"""`splitformer compress`: fewer steps (and tokens) for a pretrained text encoder, healed as
an optimal-control problem within a wall-clock budget (docs/depth.md).

MODEL is a local Hugging Face BERT folder (as ``save_pretrained`` writes it; default: the
packaged all-MiniLM-L6-v2 of ``make data``). ``--method`` chooses the coarse grid
(``compression.coarsenings``), ``--steps`` its N_t (several, comma-separated: one set of
parameters healed to serve each, drawn per step: random-tau healing), ``--heal`` the objective
(``control.healing.Distillation``): "distill" matches u(T) only, "shoot" also the states at the
coarse grid's times (multiple shooting, weight ``--shooting``, which with "kl" adds them to
the next-token KL), "none" writes the
training-free coarse model. The healing text is King James windows outside the held-out books
plus gensim's lee_background.cor (``--news``) and its shortened English Wikipedia (``--wiki``;
``experiments.depth_eval.healing_windows``); the evaluation documents never reach it.
``--healed controls`` optimises theta(t) alone (the embeddings stay the teacher's).
``--merge R`` heals with token merging on (R nodes per unit of time, metric state, at the
start of each step; with it ``--steps`` may be the model's own depth). ``--recipe best`` is
the recipe that kept the most fidelity in docs/depth.md's measurements, as one flag
(``RECIPES``; a flag given beside it wins).

Writes DIR (``--out``): compress.json (with the SHA-256 of model.safetensors, checked by
``splitformer.load``), model.safetensors, hf/ (the N_t-layer network that transformers
loads, when the grid is a layer list) and heal/ (the healing run, absent with ``--heal
none``: rerunning the same command resumes it, also with a longer ``--budget`` or more
``--max-steps``; a checkpoint every 100 steps or 60 s; once DIR is finished its checkpoints
are removed, its config, metrics and final.json kept, and the same command with a longer
budget heals the finished DIR on from its healed parameters, anything else is refused).
The lock files go when the run ends; one left at the start was a killed run's. A write that
fails (a full disk) is one line and exit status 1, and a folder this run made is removed.
``splitformer.load(DIR)`` rebuilds the model. Prints a line on stderr as each phase starts
(seconds since the start in brackets), the result and, unless ``--no-eval``, its fidelity to
the original on held-out text (mean cosine of the sentence embeddings, Lee-50 pair-cosine
Spearman); ``--json`` prints one JSON object on the last line (and no progress): its "hf"
is the path of hf/ or null, "hf_note" says why.

Data parallel healing, for a model that outgrows one machine (docs/training.md), with the same
flags: ``torchrun --nproc_per_node 2 -m splitformer compress MODEL --steps N ... --out DIR``.
Every rank reads MODEL and cuts the same healing text; each optimiser step's global batch
(``--batch-size``) is split over the ranks (``compression.heal``), which equals one process.
Only rank 0 prints, takes DIR's lock, writes heal/, evaluates and writes DIR; the others exit 0
when the healing ends (the process group ends there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..usage import (
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
from . import UsageError, check_out
from .compress_checks import (
    DATA_DRIVEN,
    check_grid,
    check_lm_grid,
    check_model,
    check_windows,
    model_folder,
)

MAX_WINDOWS = 100_000  # (count, length) int64 ids: 410 MB at 512 tokens
HELP = "coarsen a pretrained encoder in depth (and tokens) and heal it within a budget"
EPILOG = ("exit status: 0 done, 1 the folder could not be written (a full disk: one line on "
          "stderr; a folder this run made is removed), 2 bad input (one line on stderr), 130 "
          "interrupted by Ctrl-C or SIGTERM (the healing checkpoints are kept: the same "
          "command resumes)")

RECIPES = {
    "best": {"method": "drop", "heal": "shoot", "embedding": 4.0, "lr": 6e-4, "news": 0.5,
             "wiki": 0.25, "precision": "bfloat16", "min_length": 48, "windows": 65536,
             "healed": "controls", "probe": 512},
}
"""``--recipe NAME``: the flags it stands for (docs/depth.md: "best" is the measured best
N_t = 3 recipe); a flag given beside it wins."""


def _add_healing_text(p: argparse.ArgumentParser) -> None:
    """The flags of the healing windows (``depth_eval.healing_windows``, the cut lengths)."""
    p.add_argument("--news", type=fraction, default=None,
                   help="fraction of the healing windows drawn from gensim's Lee background "
                        "news, the rest from the King James text (default: uniform over the "
                        "text, where the news is 7%%)")
    p.add_argument("--wiki", type=fraction, default=None,
                   help="fraction of the healing windows drawn from gensim's shortened English "
                        "Wikipedia (106 articles), in place of as many of the others (default "
                        "0, 0.5 for a causal LM; with --news, --news + --wiki <= 1)")
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
                   default=None, help=f"healing windows drawn from the text (4096, 2048 for a "
                                      f"causal LM; at most {MAX_WINDOWS})")


def _add_recipe(p: argparse.ArgumentParser) -> None:
    """--recipe (``RECIPES``) and what it costs."""
    p.add_argument("--recipe", type=stripped, choices=tuple(RECIPES), default=None,
                   help="best: the recipe that kept the most fidelity in docs/depth.md's "
                        "measurements, as one flag: " + _recipe_flags("best") + " (a flag "
                        "given beside it wins). What it costs: the same --budget (default "
                        "10m) as the defaults, and before the healing about 15 s more on 2 "
                        "cores (65,536 windows to cut, 512 to probe; docs/depth.md); its "
                        "text needs gensim's test data and the wiki parser mwparserfromhell "
                        "(`make data`), and the first run parses the shortened English "
                        "Wikipedia (about a minute, cached); bfloat16 is faster only on a CPU "
                        "with bfloat16 arithmetic (AVX512-BF16). Not the default, so that a "
                        "command and its folder keep their meaning (docs/depth.md)")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """--seed, --threads, --out, --no-eval, --json."""
    p.add_argument("--seed", type=bounded_int(2**31 - 1, "(a seed)", minimum=0), default=0,
                   help="seed (default 0; 0 .. 2^31 - 1)")
    p.add_argument("--threads", type=bounded_int(os.cpu_count() or 1, "(torch threads)"),
                   default=None, help="torch threads")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="result folder (default out/compress-<method>-<steps>)")
    p.add_argument("--no-eval", action="store_true",
                   help="skip the fidelity check on held-out text")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on the last line of stdout (no progress lines)")


def _add_fit(p: argparse.ArgumentParser) -> None:
    """--fit, --fit-init, --fit-budget, --fit-steps: the absorbing steps of a causal LM's
    grid."""
    p.add_argument("--fit", type=stripped, choices=("keep", "average", "linear", "step"),
                   default=None,
                   help="causal LMs: what a step that absorbs removed steps computes: keep "
                        "(deletion; the default when healing), average (one step of tau = m "
                        "at the average controls), linear (ReplaceMe's least-squares map, "
                        "folded into the FFN's output; the default with --heal none), step "
                        "(the step fitted by AdamW on cached teacher states: local healing, "
                        "--fit-budget)")
    p.add_argument("--fit-init", type=stripped, choices=("keep", "average", "linear"),
                   default=None,
                   help="with --fit step: where the AdamW fit starts: keep (the kept step's "
                        "trained controls; the default), average (the average of the steps "
                        "it covers), linear (the kept step with the least-squares map of "
                        "--fit linear folded in; its solve, seconds, is not counted in "
                        "--fit-budget)")
    p.add_argument("--fit-budget", type=duration, default=None,
                   help="with --fit step: seconds of the local fits, all absorbing steps "
                        "together (default 4m unless --fit-steps is given; before the "
                        "--budget of --heal)")
    p.add_argument("--fit-steps", type=positive_int, default=None,
                   help="with --fit step: AdamW steps of the local fits at most, all "
                        "absorbing steps together (split evenly between them)")


def _add_healing(p: argparse.ArgumentParser) -> None:
    """The global phase: its objective, the objective's weights, and its budget and rate."""
    p.add_argument("--heal", type=stripped, choices=("distill", "shoot", "kl", "none"),
                   default=None,
                   help="distill: match u(T); shoot: also the states at the coarse grid's "
                        "times; kl (causal LMs, their default): the next-token "
                        "distributions, KL to MODEL's (with --shooting: the states too); "
                        "none: training-free (default distill for an encoder)")
    p.add_argument("--shooting", type=nonnegative_float, default=None,
                   help="weight of the shooting terms (the states at the coarse grid's "
                        "times): with --heal shoot (default 1), or added to --heal kl's KL "
                        "(default 0; each token relative to its own norm)")
    p.add_argument("--embedding", type=nonnegative_float, default=None,
                   help="weight of 1 - cos of the sentence embeddings (default 0)")
    p.add_argument("--relation", type=nonnegative_float, default=None,
                   help="weight of the squared differences of the pair cosines of a batch's "
                        "sentence embeddings (default 0)")
    p.add_argument("--budget", type=duration, default=None,
                   help="healing wall-clock budget: seconds (600, 1e3) or 90s, 10m, 1h "
                        "(default 10m); a longer one on the same --out heals a run on")
    p.add_argument("--max-steps", type=nonnegative_int, default=_DEFAULTS["max_steps"],
                   help="at most this many optimiser steps (default: the budget alone)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help="AdamW rate (1e-4; 3e-4 for a causal LM)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="windows a step (16; 4 for a causal LM)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..compression import method_names

    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a local Hugging Face BERT folder (default: the packaged "
                        "all-MiniLM-L6-v2, `make data`), or a causal LM of the Llama family: "
                        "smollm2 (the packaged SmolLM2-135M-Instruct), a .gguf file or a "
                        "local Llama/Mistral/Qwen/Gemma folder (docs/depth-llm.md)")
    p.add_argument("--steps", type=int_list(1, why="coarse N_t", repeats=False), default=None,
                   help="the coarse number of steps; several (6,3,2): one healed network "
                        "serves each, the first is the one hf/ holds and load(DIR) builds "
                        "(default 3 for an encoder, 22 for a causal LM)")
    _add_recipe(p)
    p.add_argument("--method", type=stripped, choices=method_names(), default=None,
                   help="how the coarse grid is chosen (default drop: ShortGPT's block "
                        "influence); keep-first is "
                        "the 'reverse order' baseline, sleb and pairs read a causal LM's "
                        "next-token loss and merge errors (docs/depth-llm.md)")
    _add_fit(p)
    p.add_argument("--probe", type=bounded_int(MAX_WINDOWS, "(probe windows)"), default=None,
                   help="healing windows the fine model is run on to choose the grid of drop "
                        "and angular (default 32, or all the windows if fewer; at most "
                        "--windows)")
    _add_healing(p)
    _add_healing_text(p)
    p.add_argument("--precision", type=stripped, choices=("float32", "bfloat16"),
                   default=None, help="the healing's arithmetic: float32 (default) or bfloat16 "
                                      "(mixed precision under autocast, float32 parameters; "
                                      "more steps per second on a CPU with AVX512-BF16, "
                                      "docs/depth.md)")
    p.add_argument("--healed", type=stripped, choices=("all", "controls"), default=None,
                   help="what the healing optimises: all (the default; controls for a "
                        "causal LM) or controls (theta(t) only; the embeddings stay the "
                        "teacher's, a faster step)")
    p.add_argument("--merge", type=nonnegative_int, default=None,
                   help="heal with token merging on: nodes merged per unit of time (0: off); "
                        "with it --steps may be the model's own depth (the merged network "
                        "healed at full depth)")
    _add_run_flags(p)
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
_PLAIN = {"method": "drop", "heal": "distill", "windows": 4096}  # the defaults without --recipe


def _recipe_flags(name: str) -> str:
    return " ".join(f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else
                    f"--{k.replace('_', '-')} {v}" for k, v in RECIPES[name].items())


def _apply_recipe(args: argparse.Namespace) -> None:
    """Fill the flags not given from ``--recipe`` (and then from the plain defaults)."""
    if args.recipe is not None:
        if args.heal == "none":
            raise UsageError(f"argument --recipe: {args.recipe} is a healing recipe (--heal "
                             f"{RECIPES[args.recipe]['heal']}), but --heal is none; drop one "
                             "of them")
        for key, value in RECIPES[args.recipe].items():
            if getattr(args, key) is not None:
                continue  # given beside the recipe: it wins
            if key == "probe":  # what drop and angular read: all the windows if fewer
                if args.method not in DATA_DRIVEN:
                    continue
                value = min(value, args.windows)
            setattr(args, key, value)
    for key, value in _PLAIN.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


_OURS = ("heal", "model.safetensors", "hf", "tokenizer", ".lock", "compress.json")


def _check_out(args: argparse.Namespace, cfg) -> tuple[Path, dict | None]:
    """DIR, and its compress.json when it is a finished compression that this command heals
    on (the same settings, a longer budget or more steps); every other use of a finished DIR,
    and a healing run of another config, refused by name before anything is loaded."""
    from ..compression.heal import check_resumable

    if args.out is not None and not args.out.strip():
        raise UsageError("argument --out: expected a folder, got an empty name (the default "
                         "is out/compress-<method>-<steps>)")
    out = Path(args.out if args.out is not None else
               f"out/compress-{args.method}-{'-'.join(map(str, args.steps))}")
    check_out(str(out))  # a file, or a folder that cannot be made: before MODEL is read
    if out.is_dir():  # ours, or a temporary file of ours a kill left (files' .name.tmp-*)
        extra = sorted(p.name for p in out.iterdir() if p.name not in _OURS
                       and not (p.name.startswith(".") and ".tmp" in p.name))
        if extra:
            raise UsageError(f"argument --out: {str(out)!r} holds other files ({extra[:3]}); "
                             "choose a new or empty folder")
    if args.heal == "none":
        if (out / "compress.json").exists() or (out / "heal").exists():
            what = ("a finished compression (compress.json)" if (out / "compress.json")
                    .exists() else "a healing run (heal/)")
            raise UsageError(f"argument --out: {str(out)!r} holds {what}; --heal none writes "
                             "a new folder: choose another")
        return out, None
    try:
        check_resumable(out / "heal", cfg)
    except ValueError as e:
        raise UsageError(f"argument --out: {str(e).removeprefix('out: ')}") from None
    if not (out / "compress.json").exists():
        return out, None
    return out, _finished(out, args, cfg)


def _finished(out: Path, args: argparse.Namespace, cfg) -> dict:
    """compress.json of the finished DIR when this command heals it on; UsageError else."""
    from ..compression.heal import more_steps

    try:
        record = json.loads((out / "compress.json").read_text())
        metrics, windows = record["metrics"], record["windows"]
        steps, seconds = int(metrics["steps_taken"]), float(metrics["seconds"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"argument --out: {str(out)!r} holds a finished compression whose "
                         f"compress.json cannot be read ({e}); choose another folder") from None
    now = {"count": args.windows, "length": cfg.length, "news": args.news,
           "aligned": args.aligned, "wiki": args.wiki or 0.0}
    flags = {"count": "--windows", "length": "--length", "news": "--news",
             "aligned": "--aligned", "wiki": "--wiki"}
    changed = [flags[k] for k in now if windows.get(k) != now[k]]
    if record.get("objective") != args.heal:
        changed.insert(0, "--heal")
    if changed or record.get("objective") == "none":
        what = f" of other settings (differs in {changed})" if changed else ""
        raise UsageError(f"argument --out: {str(out)!r} holds a finished compression{what}; "
                         "choose another folder")
    if not more_steps(cfg, steps, seconds):
        raise UsageError(f"argument --out: {str(out)!r} holds a finished compression ({steps} "
                         f"optimiser steps in {seconds:.0f} s); give a longer --budget or "
                         "more --max-steps to heal it on, or choose another folder")
    return record


def _healing_budget(args: argparse.Namespace, given: list[str]) -> tuple[float, int | None]:
    """(budget, max_steps) of the healing: (0, 0) with --heal none, where a healing flag in
    ``given`` is refused; else the flags', a 0 refused."""
    if args.heal == "none":
        if given:
            raise UsageError(f"argument {given[0]}: sets the healing, but --heal is none "
                             "(the training-free model); drop it or choose a healing (kl, distill "
                             "or shoot)")
        return 0.0, 0
    if args.budget == 0:
        raise UsageError("argument --budget: 0 heals nothing; use --heal none for the "
                         "training-free model, or give a budget")
    if args.max_steps == 0:
        raise UsageError("argument --max-steps: 0 heals nothing; use --heal none for the "
                         "training-free model, or give steps")
    return args.budget, args.max_steps


def _check_flag_pairs(args: argparse.Namespace) -> None:
    """The flags that contradict each other (or the launch), refused by name."""
    if args.method == "parallel" and min(args.steps) < 2:  # whatever the model: no data read
        raise UsageError(f"argument --method: parallel superposes the middle steps into one, so "
                         f"--steps {min(args.steps)} would superpose all of them; ask for at "
                         "least 2")
    if args.min_length is not None and not 2 <= args.min_length <= args.length:
        raise UsageError(f"argument --min-length: expected an int in [2, --length="
                         f"{args.length}], got {args.min_length}")
    from ..training.distributed import env_world_size

    if args.relation and env_world_size() > 1:
        raise UsageError("argument --relation: compares the pairs of a whole batch, which the "
                         "ranks of torchrun split; heal with --relation in one process")
    if args.relation and args.batch_size < 2:
        raise UsageError(f"argument --relation: compares the pairs of a batch, which needs "
                         f"--batch-size >= 2, got {args.batch_size}")
    if args.heal not in ("shoot", "kl") and args.shooting is not None:
        raise UsageError(f"argument --shooting: weights the shooting terms of --heal shoot "
                         f"or kl, but --heal is {args.heal}")


def _shooting(args: argparse.Namespace) -> float:
    """w_s: --shooting, else 1 with --heal shoot and 0 otherwise (kl's KL alone)."""
    if args.shooting is not None:
        return args.shooting
    return 1.0 if args.heal == "shoot" else 0.0


def _heal_config(args: argparse.Namespace):
    """The HealConfig the flags ask for, checked before anything is loaded: the healing-only
    flags refused with --heal none (a flag left at None was not given), a budget or step
    count of 0 refused when healing, a batch no larger than the windows."""
    from ..compression.heal import HealConfig
    from .compress_lm import HEALING_DEFAULTS, apply_defaults, is_decoder, refuse_lm_flags

    decoder = is_decoder(args.model)
    check_model(args.model, decoder)  # before --out is compared with its config (MODEL sets)
    if decoder:
        apply_defaults(args)
    else:
        refuse_lm_flags(args)
    _apply_recipe(args)
    given = [flag for flag, key in _HEALING_FLAGS if getattr(args, key) is not None]
    if args.aligned:  # a switch: given when set
        given.append("--aligned")
    defaults = {**_DEFAULTS, **HEALING_DEFAULTS} if decoder else _DEFAULTS
    for _, key in _HEALING_FLAGS:  # None: not given (so that a default typed out is seen)
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    budget, max_steps = _healing_budget(args, given)
    check_windows(args)
    _check_flag_pairs(args)
    probe = 32 if args.probe is None else args.probe  # windows[:32]: fewer if fewer
    try:
        return HealConfig(method=args.method, steps=tuple(args.steps), budget=budget,
                         max_steps=max_steps, lr=args.lr, batch_size=args.batch_size,
                         length=args.length, seed=args.seed, merge=args.merge,
                         shooting=_shooting(args),
                         embedding=args.embedding, relation=args.relation,
                         precision=args.precision, min_length=args.min_length,
                         healed=args.healed, probe=probe,
                         next_token=1.0 if args.heal == "kl" else 0.0,
                         terminal=0.0 if args.heal == "kl" else 1.0, fit=args.fit,
                         # an encoder's --fit flags were refused (None) by refuse_lm_flags
                         fit_budget=args.fit_budget or 0.0, fit_steps=args.fit_steps,
                         fit_init=args.fit_init or "keep")
    except ValueError as e:
        raise UsageError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    """Compress; under torchrun (``WORLD_SIZE`` > 1) the healing is data parallel, and only
    rank 0 prints, takes DIR's lock, evaluates and writes DIR (the others heal, then exit 0;
    on bad input with rank 0's status, silently)."""
    from ..training import distributed

    with distributed.session() as ranks:
        try:
            return _run(args, ranks.main)
        except UsageError:
            if not ranks.main:  # every rank finds the same error: rank 0 reports it
                return 2
            raise


def _run(args: argparse.Namespace, main: bool) -> int:
    cfg = _heal_config(args)
    # before MODEL: neither needs the other (nor the packaged MiniLM)
    out, finished = _check_out(args, cfg)
    import tempfile

    import torch

    from ..files import remove_path
    from ..training.distributed import rank0_error

    say = _say(args.json or not main)
    clock = time.perf_counter()

    def phase(text: str) -> None:
        say(f"  [{time.perf_counter() - clock:.0f} s] {text}")

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="splitformer-tokenizer-") as scratch:
        source = _source(args, cfg, say, Path(scratch))
        teacher = source.teacher
        say(_header(args, cfg, teacher, out, finished))
        if not main:  # rank 0's lock taken (or its error), this rank heals its share
            error = rank0_error(None, (UsageError,))
            if error is not None:
                return 2 if isinstance(error, UsageError) else 1
            _healed(args, cfg, source, out, say, phase, finished)
            return 0
        fresh = not out.exists()
        killed = (out / ".lock").exists()  # a run that ended removed it: a kill left this one
        lock, error = None, None
        try:
            lock = _lock(out)
        except (UsageError, OSError) as e:
            error = e
        rank0_error(error, (UsageError,))  # the other ranks, under torchrun, learn it
        if isinstance(error, OSError):  # a full disk: the lock's pid cannot be written
            return _write_failed(error, out, fresh, None)
        if error is not None:
            raise error
        try:
            if killed and not (out / "heal" / ".lock").exists() and not _has_checkpoint(out):
                say("  starting over: the killed run left no checkpoint")
            return _compress(args, cfg, source, out, say, phase, finished)
        except OSError as e:  # a write failed (a full disk): one line, nothing of this run kept
            return _write_failed(e, out, fresh, lock)
        except BaseException:
            if fresh and not any(p.name != ".lock" for p in out.iterdir()):
                lock.release(remove=True)
                remove_path(out)  # nothing of ours was written: leave no empty folder
            raise
        finally:
            lock.release(remove=True)


def _lock(out: Path):
    """DIR made and its lock taken (UsageError naming --out; OSError: the disk is full)."""
    from ..files import FolderLock, FolderLockedError

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"argument --out: cannot make the folder {str(out)!r} "
                         f"({e.strerror or e})") from None
    try:
        return FolderLock(out, what="compression folder").acquire()
    except FolderLockedError as e:
        raise UsageError(f"argument --out: {e}") from None


@dataclass
class _Source:
    """What the command compresses: the teacher, the folder its tokenizer files are copied
    from, how the healing windows are cut, how the result is evaluated against the teacher
    (N -> student -> measures) and the report's own keys."""

    teacher: Any
    tokenizer_from: Path | None
    windows: Callable[[], Any]
    evaluate: Callable[[dict[int, Any], Callable[[str], None]], dict[str, Any]]
    report: dict[str, Any]


def _source(args: argparse.Namespace, cfg, say, scratch: Path) -> _Source:
    """The encoder (MiniLM, BERT) or causal LM (``compress_lm``) that MODEL names."""
    from .compress_lm import is_decoder

    if is_decoder(args.model):
        from . import compress_lm

        say(f"compress: reading MODEL {args.model}")
        teacher, tokenizer = compress_lm.load(args.model)
        check_lm_grid(cfg, teacher)
        tokenizer.save_pretrained(str(scratch))
        return _Source(
            teacher, scratch, lambda: compress_lm.windows(tokenizer, args, cfg),
            lambda students, tell: compress_lm.evaluate(teacher, tokenizer, students, tell),
            {"model": str(args.model)} | ({} if args.no_eval else {
                "measures": "lm_eval.LMEvaluation on the last pages of gensim's Wikipedia "
                            "extract (32 windows of 512 tokens)"}))
    from ..experiments import depth_eval
    from ..experiments.text_benchmarks import load_minilm
    from ..interop import from_hf
    from ..training.data import DatasetError

    folder = model_folder(args.model)
    say(f"compress: reading MODEL {folder}")
    try:
        minilm = load_minilm(folder)
    except (DatasetError, OSError, ValueError) as e:
        raise UsageError(f"argument MODEL: {' '.join(str(e).split())}") from None
    teacher = from_hf(minilm.model).eval()
    check_grid(cfg, teacher, folder)

    def windows():
        try:
            return depth_eval.healing_windows(minilm.tokenizer, cfg.length, args.windows,
                                              cfg.seed, news=args.news,
                                              aligned=args.aligned, wiki=args.wiki or 0.0)
        except DatasetError as e:
            raise UsageError(f"the healing text is missing: {e}") from None
        except ValueError as e:
            raise UsageError(f"argument --length: {e}") from None

    def evaluate(students, tell):
        if not minilm.sentence_transformers:
            tell("  MODEL has no sentence-transformers modules.json: the fidelity compares "
                 "the masked means of u(T), normalised")
        evaluation = depth_eval.Evaluation(minilm)
        return {str(n): {k: v for k, v in evaluation(depth_eval.minilm_embed(student),
                                                     full=False).items()
                         if "cosine" in k or "fidelity" in k}
                for n, student in students.items()}

    embedding = ("sentence-transformers' modules" if minilm.sentence_transformers else
                 "masked mean of u(T), normalised (MODEL has no sentence-transformers "
                 "modules.json)")
    return _Source(teacher, folder, windows, evaluate,
                   {"model": str(args.model) if args.model else "all-MiniLM-L6-v2",
                    "sentence_embedding": embedding})


def _has_checkpoint(out: Path) -> bool:
    from ..training.checkpoints import CheckpointError, latest_checkpoint

    try:
        return (out / "heal").is_dir() and latest_checkpoint(out / "heal") is not None
    except CheckpointError:
        return True  # a damaged pointer: heal says so


def _write_failed(e: OSError, out: Path, fresh: bool, lock) -> int:
    """One line on stderr for a write that failed after the inputs were accepted (exit
    status 1): a folder this run made is removed; an existing one keeps its healing
    checkpoint (the same command resumes once there is room) and loses the partial result."""
    from ..files import remove_path

    if lock is not None:
        lock.release(remove=True)
    if fresh:
        remove_path(out)
        kept = f"nothing kept ({out} removed)"
    else:
        if not (out / "compress.json").exists():  # a result half-written: not a result
            for name in ("model.safetensors", "hf", "tokenizer"):
                remove_path(out / name)
        kept = (f"{out / 'heal'} keeps the healing's last checkpoint: free space and run the "
                "same command to resume" if _has_checkpoint(out) else
                f"{out} holds no checkpoint of this run")
    reason = e.strerror or str(e)
    print(f"splitformer compress: error: cannot write {out}: {reason}; {kept}",
          file=sys.stderr, flush=True)
    return 1


def _header(args, cfg, teacher, out: Path, finished: dict | None) -> str:
    header = (f"compress: {cfg.method} {teacher.evolution.num_steps} -> "
              f"{','.join(map(str, cfg.steps))} steps, heal {args.heal}"
              + (f" ({args.recipe} recipe)" if args.recipe else "")
              + (f" for {cfg.budget:g} s" if cfg.budget else "")
              + (f" or {cfg.max_steps} optimiser step{'s' * (cfg.max_steps != 1)}"
                 if cfg.budget and cfg.max_steps
                 else "") + f", out {out}")
    if finished is not None:
        m = finished["metrics"]
        return header + (f" (healing on the finished run: {m['steps_taken']} steps in "
                         f"{float(m['seconds']):.0f} s)")
    from ..training.checkpoints import CheckpointError, latest_checkpoint

    try:
        last = latest_checkpoint(out / "heal") if (out / "heal").is_dir() else None
    except CheckpointError:
        last = None
    if last is not None:
        header += f" (resuming the run in {out / 'heal'}, {last.name})"
    return header


def _healed(args, cfg, source: _Source, out: Path, say, phase, finished: dict | None):
    """The healing text cut and healed on (``_heal``); under torchrun every rank's part,
    after which the process group ends (rank 0 alone evaluates and writes DIR)."""
    from ..compression.store import healed_weights
    from ..training import distributed
    from ..training.checkpoints import CheckpointError

    mixture = ", ".join(f"{k} {v:g}" for k, v in (("news", args.news), ("wiki", args.wiki))
                        if v)
    phase(f"healing text: {args.windows} windows of {cfg.length} tokens"
          + (f" ({mixture})" if mixture else ""))
    windows = source.windows()
    healed = None
    if finished is not None:  # its checkpoints were removed: on from the healed parameters
        try:
            healed = healed_weights(out, finished)
        except (CheckpointError, ValueError, OSError) as e:
            raise UsageError(f"argument --out: {' '.join(str(e).split())}") from None
    result = _heal(args, cfg, source.teacher, windows, out, say, phase, healed)
    distributed.cleanup()
    return result


def _compress(args, cfg, source: _Source, out: Path, say, phase,
              finished: dict | None) -> int:
    from ..compression.store import write_result
    from ..training.checkpoints import remove_checkpoints

    result = _healed(args, cfg, source, out, say, phase, finished)
    # Ctrl-C from here on: DIR is written last of all (compress.json last), so a stop before
    # it is complete leaves the healing's checkpoint, if any, for the same command
    if _checkpointed(cfg, out):
        args._interrupted = (f" after healing, before {out} was complete (the healing's "
                             f"checkpoint in {out / 'heal'} is kept: the same command "
                             "evaluates and writes it)")
    else:
        args._interrupted = f" before {out} was complete (nothing to resume)"
    report = _report(args, cfg, source, result)
    if not args.no_eval:
        phase("evaluating on held-out text (the fidelity to MODEL)")
        report["fidelity"] = source.evaluate({n: result.student(n) for n in cfg.steps},
                                             phase)
    phase(f"writing {out}")
    record = write_result(out, base=result.base, coarsenings=result.coarsenings,
                          default=cfg.steps[0], info={"heal": cfg.to_dict(), **report},
                          tokenizer_from=source.tokenizer_from)
    # a finished DIR is healed on from model.safetensors, not from them: the healing
    # checkpoints (the base's weights and AdamW's moments, three times model.safetensors)
    # serve nothing; config and metrics stay
    args._interrupted = f" after {out} was written (it is complete)"
    remove_checkpoints(out / "heal")
    report["out"] = str(out)
    report["hf"] = str(out / "hf") if record["hf"] else None
    report["hf_note"] = record["hf_note"]
    if args.json:
        print(json.dumps(report))
    else:
        _print_result(report, result, out)
    return 0


def _report(args, cfg, source: _Source, result) -> dict:
    """What compress.json and --json say of the run (the fidelity and the paths added)."""
    return {"model": source.report["model"],
            "method": cfg.method, "steps": list(cfg.steps), "objective": args.heal,
            "recipe": args.recipe,
            "windows": {"count": args.windows, "length": cfg.length, "news": args.news,
                        "aligned": args.aligned, "wiki": args.wiki or 0.0},
            "heal": cfg.to_dict(),
            "metrics": result.metrics,
            "grids": {str(n): str(c) for n, c in result.coarsenings.items()},
            "notes": {str(n): dict(c.note or {}) for n, c in result.coarsenings.items()},
            **{k: v for k, v in source.report.items() if k != "model"}}


def _checkpointed(cfg, out: Path) -> bool:
    """Whether the healing left a checkpoint in DIR/heal (what the same command resumes)."""
    return bool(cfg.budget) and (out / "heal" / "latest").is_file()


def _heal(args, cfg, teacher, windows, out: Path, say, phase, healed):
    """``compression.heal`` into DIR/heal/ (nothing written with --heal none), its phases and
    steps on stderr."""
    from ..compression import Diverged
    from ..compression.heal import heal
    from ..training.checkpoints import CheckpointError

    def progress(row: dict) -> None:
        say(f"  step {row['step']} ({row['seconds']:.0f} s) N_t={row['steps']} "
            f"lr {row['lr']:.3g} loss {row['loss']:.4g}")

    try:
        return heal(cfg, teacher=teacher, windows=windows,
                    out=out / "heal" if cfg.budget else None, progress=progress,
                    notice=phase, healed=healed)
    except KeyboardInterrupt:  # say what is kept: a checkpoint only once one was written
        if _checkpointed(cfg, out):
            args._interrupted = (f" (the healing's last checkpoint in {out / 'heal'} is kept: "
                                 "the same command resumes)")
        else:
            args._interrupted = " before the healing's first checkpoint (nothing to resume)"
        raise
    except Diverged as e:
        kept = f"; the checkpoint in {out / 'heal'} before it is kept" \
            if _checkpointed(cfg, out) else ""
        raise UsageError(f"argument --lr: the healing diverged at lr {cfg.lr:g} (the loss is "
                         f"{e.loss} at step {e.step}): lower --lr{kept}") from None
    except (CheckpointError, ValueError) as e:
        text = " ".join(str(e).split())
        raise UsageError(f"argument --out: {text.removeprefix('out: ')}") from None


def _print_result(report: dict, result, out: Path) -> None:
    """Each healed grid, its method's notes and fidelity, and where DIR went."""
    for n, c in result.coarsenings.items():
        print(f"{c}")
        for key, values in (c.note or {}).items():
            print(f"  {key}: "
                  + ", ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in values))
        for k, v in report.get("fidelity", {}).get(str(n), {}).items():
            print(f"  {k}: {v:.4f}")
    m = result.metrics
    print(f"healed: {m['steps_taken']} optimiser steps in {m['seconds']:.0f} s; "
          f"wrote {out} (hf: {report['hf'] or report['hf_note']})")


def _say(quiet: bool):
    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)
    return say
