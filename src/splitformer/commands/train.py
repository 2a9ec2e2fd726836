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
from pathlib import Path

from ..files import CorruptFileError, FolderLock, FolderLockedError
from ..training import DATASETS, FAMILIES, ConfigError, DatasetError, TrainConfig
from ..training.checkpoints import CheckpointError, latest_checkpoint, recorded_config
from ..training.config import settings, tau_list
from . import UsageError

__all__ = ["HELP", "add_arguments", "config_of", "run", "tau_list"]

HELP = "train a model family (scheme, kernel, tau, adjoint, running costs) on real data"
EPILOG: str | None = None  # nothing after the options in --help


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="a TOML file of settings (flags override)")
    for key, s in settings().items():  # every TrainConfig key: its flag (training.config)
        p.add_argument(s.flag, dest=key, type=s.parse, default=None,
                       help=s.text(families=FAMILIES))
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run in DIR from its last complete checkpoint")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(_interrupted="; the run's last checkpoint is kept (continue it with "
                   "--resume DIR)")


def flag_of(message: str, given: set[str]) -> str | None:
    """The flag of the config key a ConfigError message starts with (``"lr must be ..."``,
    ``"tau=0.3 must divide ..."``),
    when that key is in ``given``; else None."""
    table = settings()
    key = next((k for k in given if message.startswith((k + " ", k + "="))), None)
    return table[key].flag if key is not None else None


def config_of(args: argparse.Namespace) -> TrainConfig:
    """Defaults <- the TOML file <- the flags (a resumed run: its recorded config <- flags).
    A bad value is named by its flag, or by the file and key it came from."""
    flags = {key: v for key in settings() if (v := getattr(args, key)) is not None}
    values = _file_values(args.config)
    if args.resume is not None:
        return _resumed_config(args.resume, {**values, **flags})
    try:
        cfg = TrainConfig.from_dict({**values, **flags})
    except ConfigError as e:
        flag = flag_of(str(e), set(flags))
        if flag is None and values and _file_error(values) == str(e):  # the file's own value
            raise UsageError(f"config file {str(args.config)!r}: {e}") from None
        raise UsageError(f"argument {flag}: {e}" if flag else str(e)) from None
    for key, names in (("family", FAMILIES), ("data", DATASETS)):
        if getattr(cfg, key) not in names:
            raise UsageError(f"argument --{key}: expected one of {sorted(names)}, got "
                             f"{getattr(cfg, key)!r}")
    return cfg


def _file_values(path: str | None) -> dict:
    """The settings of a ``--config`` TOML file (a bad key or type is named by the file and
    the key); {} without a file."""
    if path is None:
        return {}
    try:
        return TrainConfig.toml_values(path)  # names the file and the key of a bad value
    except ConfigError as e:
        text = str(e)
        raise UsageError(text if text.startswith("config file ")
                         else f"config file {str(path)!r}: {text}") from None


def _file_error(values: dict) -> str | None:
    """The error the file's settings give on their own (with the defaults), or None."""
    try:
        TrainConfig.from_dict(values)
    except ConfigError as e:
        return str(e)
    return None


def _resumed_config(folder: str, flags: dict) -> TrainConfig:
    """The config a run folder was made with (config.json, or, without it, its newest
    checkpoint's record); a flag or a ``--config`` value may repeat a recorded value, not
    change it."""
    try:
        if not Path(folder).is_dir():
            raise UsageError(f"argument --resume: {folder!r} is not a folder (a run folder to "
                             "continue)")
        if latest_checkpoint(folder) is None:
            try:  # a run still writing its first checkpoint: name it
                FolderLock(folder, what="run folder").acquire().release()
            except FolderLockedError as e:
                raise UsageError(f"argument --resume: {' '.join(str(e).split())}") from None
            raise UsageError(f"argument --resume: {folder!r} holds no complete checkpoint (a "
                             "run killed before its first one: start it again with --out)")
        if (Path(folder) / "final.json").exists():
            raise UsageError(f"argument --resume: the run in {folder!r} is complete "
                             "(final.json); nothing to resume")
        base = recorded_config(folder)
    except (OSError, ValueError) as e:  # CheckpointError and ConfigError included
        raise UsageError(f"argument --resume: {e}") from None
    changed = sorted(k for k, v in flags.items() if getattr(base, k) != v)
    if changed:
        raise UsageError(f"argument --resume: the run was made with other values of "
                         f"{changed}; resume it without changing them")
    return base


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
    except (FolderLockedError, CorruptFileError) as e:  # another writer; a corrupt metrics file
        raise UsageError(" ".join(str(e).split())) from None
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
