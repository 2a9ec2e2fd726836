"""`splitformer train`: train a model family as an optimal-control problem (docs/training.md).

Settings come from the built-in defaults (a small ViT evolution on digits), then a TOML file
(``--config``), then flags; every setting is checked before the run starts. Prints the final
metrics (``--json``: one JSON object with ``test_accuracy`` or ``test_loss``/``test_bpc``,
``epochs``, ``seconds``, ``parameters``).

Data parallel: ``torchrun --nproc_per_node N -m splitformer train ...`` (``training.distributed``:
gloo on the CPU, NCCL with one GPU per process); ``--batch-size`` is the global batch, split
over the processes; only rank 0 prints and writes the run folder."""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from pathlib import Path

from ..control import adjoint_names
from ..operators.kernels import KERNEL_NAMES
from ..time.integrators import INTEGRATORS
from ..time.schemes import scheme_names
from ..training import DATASETS, FAMILIES, ConfigError, DatasetError, TrainConfig
from ..training.checkpoints import CheckpointError, latest_checkpoint
from . import UsageError, stripped

HELP = "train a model family (scheme, kernel, tau, adjoint, running costs) on real data"


def tau_list(text: str) -> tuple[float, ...]:
    """argparse type of --tau-choices: comma-separated time steps ("1,0.5,0.25" or "1,1/2,1/4")
    as a tuple of floats; anything else is a one-line usage error. (Whether each divides the
    config's tau is the config's check.)"""
    try:
        values = tuple(float(Fraction(part.strip())) for part in text.split(","))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated time steps such as '1,0.5,0.25' or '1,1/2,1/4', got "
            f"{text!r}") from None
    return values


# flag -> (config key, type, help); every TrainConfig key has one
_FLAGS: dict[str, tuple[str, object, str]] = {
    "--family": ("family", stripped, f"model family: {', '.join(sorted(FAMILIES))}"),
    "--data": ("data", stripped, f"data set: {', '.join(sorted(DATASETS))}"),
    "--data-dir": ("data_dir", str, "folder of the data set's files (default: the package's)"),
    "--scheme": ("scheme", str, "'network' (the family's own), a name ("
                 + ", ".join(scheme_names()) + ") or a scheme string"),
    "--integrator": ("integrator", stripped, f"substep integrator: {', '.join(INTEGRATORS)} "
                     "(default: the scheme's own)"),
    "--kernel": ("kernel", stripped, f"attention kernel: {', '.join(sorted(KERNEL_NAMES))}"),
    "--tau": ("tau", float, "time step (T = depth; tau must divide T)"),
    "--tau-choices": ("tau_choices", tau_list, "train with a random time step per batch, "
                      "drawn from these (comma-separated, e.g. '1,0.5,0.25'; each = tau / k)"),
    "--steps": ("steps", int, "N_t, the number of time steps (a multiple of depth)"),
    "--depth": ("depth", int, "L, the number of control sets (T = L)"),
    "--width": ("width", int, "feature width N_y"),
    "--heads": ("heads", int, "attention heads"),
    "--ffn-ratio": ("ffn_ratio", float, "hidden width of the FFN / width"),
    "--patch": ("patch", int, "patch size (vit, cvt)"),
    "--dropout": ("dropout", float, "dropout rate"),
    "--seq-len": ("seq_len", int, "characters per example (lm)"),
    "--adjoint": ("adjoint", stripped, f"gradient: {', '.join(adjoint_names())}"),
    "--kinetic": ("kinetic", float, "weight of the kinetic energy of the path"),
    "--control-reg": ("control_reg", float, "weight of the control regularity"),
    "--epochs": ("epochs", int, "epochs"),
    "--batch-size": ("batch_size", int, "examples per optimiser step"),
    "--lr": ("lr", float, "peak learning rate"),
    "--weight-decay": ("weight_decay", float, "weight decay (matrices only)"),
    "--optimizer": ("optimizer", stripped, "adamw or sgd"),
    "--momentum": ("momentum", float, "SGD momentum"),
    "--schedule": ("schedule", stripped, "cosine or constant (after the warm-up)"),
    "--warmup": ("warmup", float, "fraction of the steps with a linear warm-up"),
    "--grad-clip": ("grad_clip", float, "gradient norm clip"),
    "--seed": ("seed", int, "seed (runs are deterministic for a seed)"),
    "--out": ("out", str, "run folder (default: a fresh folder under runs/)"),
    "--checkpoint-every": ("checkpoint_every", int, "optimiser steps between checkpoints "
                           "(0: every epoch)"),
    "--log-every": ("log_every", int, "optimiser steps between metrics lines"),
    "--threads": ("threads", int, "torch threads"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="a TOML file of settings (flags override)")
    for flag, (key, kind, text) in _FLAGS.items():
        p.add_argument(flag, dest=key, type=kind, default=None, help=text)
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run in DIR from its last complete checkpoint")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(_interrupted="; the run's last checkpoint is kept (continue it with "
                   "--resume DIR)")


def config_of(args: argparse.Namespace) -> TrainConfig:
    """Defaults <- the TOML file <- the flags (a resumed run: its recorded config <- flags)."""
    flags = {key: getattr(args, key) for key, _, _ in _FLAGS.values()}
    try:
        if args.resume is not None:
            if latest_checkpoint(args.resume) is None:
                raise UsageError(f"argument --resume: {args.resume!r} holds no complete "
                                 "checkpoint")
            if (Path(args.resume) / "final.json").exists():
                raise UsageError(f"argument --resume: the run in {args.resume!r} is complete "
                                 "(final.json); nothing to resume")
            base = TrainConfig.from_dict(json.loads(
                (Path(args.resume) / "config.json").read_text()))
            changed = sorted(k for k, v in flags.items()
                             if v is not None and getattr(base, k) != v)
            if changed:
                raise UsageError(f"argument --resume: the run was made with other values of "
                                 f"{changed}; resume it without changing them")
        elif args.config is not None:
            base = TrainConfig.from_toml(args.config)
        else:
            base = TrainConfig()
        cfg = base.replace(**flags)
    except ConfigError as e:
        flag = next((f for f, (k, _, _) in _FLAGS.items() if str(e).startswith(k + " ")), None)
        raise UsageError(f"argument {flag}: {e}" if flag else str(e)) from None
    except (OSError, ValueError) as e:
        raise UsageError(f"argument --resume: {e}") from None
    for key, names in (("family", FAMILIES), ("data", DATASETS)):
        if getattr(cfg, key) not in names:
            raise UsageError(f"argument --{key}: expected one of {sorted(names)}, got "
                             f"{getattr(cfg, key)!r}")
    return cfg


def run(args: argparse.Namespace) -> int:
    """Train; under torchrun (``WORLD_SIZE`` > 1) data parallel, and only rank 0 prints (the
    other ranks exit with the same status, silently)."""
    from ..training import distributed

    try:
        return _run(args, distributed.is_main())
    except UsageError:
        if not distributed.is_main():  # every rank finds the same error: rank 0 reports it
            return 2
        raise


def _run(args: argparse.Namespace, main: bool) -> int:
    from ..training.families import build_model
    from ..training.loop import TrainingError, fit

    cfg = config_of(args)
    try:
        from ..training.data import load_dataset

        data = load_dataset(cfg.data, cfg.data_dir)
        build_model(cfg, data)  # every model setting checked before the run
    except (ConfigError, DatasetError) as e:
        raise UsageError(str(e)) from None
    except ValueError as e:  # a scheme or kernel the family refuses
        raise UsageError(str(e).splitlines()[0]) from None
    except (MemoryError, RuntimeError) as e:
        if "allocate" not in str(e) and not isinstance(e, MemoryError):
            raise
        raise UsageError(f"the model does not fit in memory (width={cfg.width}, depth="
                         f"{cfg.depth}, heads={cfg.heads})") from None
    progress = main and not args.json and not args.no_progress and sys.stdout.isatty()
    try:
        result = fit(cfg, data=data, progress=progress, resume=args.resume)
    except TrainingError as e:
        if main:
            print(f"splitformer train: error: {e}", file=sys.stderr)
        return 1
    except CheckpointError as e:
        raise UsageError(f"argument --resume: {e}") from None
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if not main:
        return 0
    metrics = {**result.metrics, "out": str(result.out)}
    if args.json:
        print(json.dumps(metrics))
    else:
        for k, v in metrics.items():
            print(f"{k:>15}  {v:.4g}" if isinstance(v, float) else f"{k:>15}  {v}")
    return 0
