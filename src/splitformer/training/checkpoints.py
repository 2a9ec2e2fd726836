"""Checkpoints of a training run, and models saved on their own; never pickle.

    save_checkpoint(DIR, model=m, optimizer=opt, scheduler=sched, state={...}) -> Path
    load_checkpoint(DIR, model=m, optimizer=opt, scheduler=sched) -> state
    save_model(m, DIR) / load_model(DIR)        (``splitformer.save`` / ``splitformer.load``)

A training checkpoint folder ``DIR`` holds (names outside these are left alone, so DIR can be
the run's own folder)::

    DIR/latest                   the name of the newest complete checkpoint ("ckpt-000000120")
    DIR/ckpt-000000120/          one checkpoint (the step, 9 digits; ".1", ".2" if saved twice)
        model.safetensors        the model's state_dict (tied tensors once, see model.json)
        model.json               model.source (how to rebuild it), tied-tensor aliases, hashes
        optimizer.safetensors    every tensor of the optimizer's and scheduler's state_dicts
        rng.safetensors          torch CPU (and CUDA) generator states, python random's and
                                 numpy's Mersenne Twister keys
        checkpoint.json          format version, the caller's ``state`` (step, epoch, config,
                                 metrics, ...), the rest of the optimizer and scheduler
                                 state_dicts (tensors stand as {"__tensor__": name}), the rest
                                 of the RNG states, and the size and sha256 of every file above
    DIR/.ckpt-000000120.tmp-*/   a checkpoint being written, or an older one being deleted
                                 (``.tmp-retired``; removed by the next save)
    DIR/.lock                    while ``fit`` trains into DIR (``files.FolderLock``; not read)

Writing is atomic (``splitformer.files``): every file goes into a temporary sibling folder and
is fsynced, the folder is fsynced and renamed to ``ckpt-...`` (``files.atomic_folder``), then
``latest`` is replaced by an fsynced temporary file (``files.write_atomic``: the commit point),
and only then are older checkpoints deleted (each renamed to a leftover's name first). A
process killed at any moment (SIGKILL included) leaves ``latest`` naming a complete
checkpoint.

The format and its checks are ``training.checkpoint_format`` (sealed JSON, file hashes, JSON
with tensors, the model's files) and ``training.checkpoint_state`` (optimizer, scheduler, RNG).

Loading checks everything before it changes anything: each JSON file's own sha256, the size and
sha256 of every file, the JSON schema, the tensor names, shapes and dtypes against the model, the
optimizer's parameter groups and per-parameter state shapes, the scheduler's keys and the RNG
states. A bad checkpoint raises ``CheckpointError`` naming the file and what is wrong, and
nothing is loaded half: if applying one part still fails, the parts already applied are rolled
back.

``save_model`` writes ``model.safetensors`` and ``model.json`` (the same two files as in a
checkpoint) for a model built by ``training.families.build_model``, whose ``model.source``
(family, config, data) is what ``load_model`` rebuilds it from, and for a model made by
``from_hf`` (a family with a store record: BERT, ViT, CvT, GPT-2), changed or not by
``with_scheme``, ``refine``, ``coarsen``, ``drop_steps``, ``with_controls_in_time``,
``with_kernel`` or ``with_token_merging``: model.json then records its family's source, each
evolution's scheme, grid, controls and merging, and the kernels (``training.model_record``),
which ``load_model`` applies to the base model rebuilt from the source before loading the
parameters. What such a record cannot hold exactly is refused by name. Other models are
refused (their source does not say how to rebuild them).
"""

from __future__ import annotations

import copy
import json
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from ..files import atomic_folder, remove_path, write_atomic, write_synced
from .checkpoint_format import (
    CHECKPOINT_FORMAT,
    VERSION,
    CheckpointError,
    _check_fits_model,
    _decode,
    _encode,
    _field,
    _file_entry,
    _listing,
    _model_files,
    _path,
    _qualname,
    _read_checked,
    _read_model,
    _sealed,
    _shape,
    _tensors_from,
    _unseal,
    _unwrap,
)
from .checkpoint_state import (
    _check_optimizer,
    _check_rng,
    _check_scheduler,
    _rng_apply,
    _rng_capture,
)
from .config import ConfigError, TrainConfig
from .families import FAMILIES, build_model

__all__ = [
    "CheckpointError",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model",
    "recorded_config",
    "remove_checkpoints",
    "save_checkpoint",
    "save_model",
]
POINTER = "latest"
_TMP_PREFIX = ".tmp-ckpt-"  # temporary folders of splitformer versions before files.py
_NAME = re.compile(r"ckpt(-[0-9]{9})?(\.[0-9]+)?")

# the writer of each file of a checkpoint (a name of this module, so that a test can slow it)
_write = write_synced


# -- which models save_model can rebuild ----------------------------------------------------
def _describe_source(source: Any) -> str:
    if source is None:
        return "it has no model.source"
    if isinstance(source, dict):
        text = repr(source)
        return f"its model.source is {text[:120] + '...' if len(text) > 120 else text}"
    return f"its model.source is a {type(source).__name__}"


def _rebuild(source: dict[str, Any], device: str | None = None) -> nn.Module:
    """``build_model`` from a training source, without touching the global RNG."""
    cfg = TrainConfig.from_dict(source["config"])
    with torch.random.fork_rng(devices=[]):
        if device is None:
            return build_model(cfg, source["data"])
        with torch.device(device):
            return build_model(cfg, source["data"])


def _training_source(model: nn.Module) -> tuple[dict[str, Any] | None, str | None]:
    """(model.source as JSON, None) for a model that ``build_model`` rebuilds exactly (same
    modules, names and shapes), else (None, why not)."""
    from ..models.base import EvolutionModel

    source = model.source if isinstance(model, EvolutionModel) else None
    if not (isinstance(source, dict) and set(source) == {"family", "config", "data"}):
        return None, (f"{_describe_source(source)}, not a training family's "
                      f"{{'family', 'config', 'data'}}")
    if source["family"] not in FAMILIES:
        return None, (f"its model.source family {source['family']!r} is not one of "
                      f"{sorted(FAMILIES)}")
    if not isinstance(source["config"], dict) or not isinstance(source["data"], dict):
        return None, "its model.source config and data must be dicts"
    if source["config"].get("family") != source["family"]:
        return None, (f"its model.source family {source['family']!r} differs from the "
                      f"config's {source['config'].get('family')!r}")
    try:
        as_json = json.loads(json.dumps(source, allow_nan=False))
    except (TypeError, ValueError) as e:
        return None, f"its model.source is not JSON: {e}"
    try:
        with warnings.catch_warnings():  # the caller saw build_model's warnings when it built
            warnings.simplefilter("ignore")
            try:
                built = _rebuild(as_json, "meta")  # the structure only: no memory, no init
            except ConfigError:
                raise
            except Exception:
                built = _rebuild(as_json)
    except Exception as e:
        return None, f"its model.source does not rebuild: {type(e).__name__}: {e}"
    theirs = {k: _shape(v) for k, v in built.state_dict().items()}
    ours = {k: _shape(v) for k, v in model.state_dict().items()}
    if repr(built) != repr(model) or theirs != ours:
        return None, ("it differs from what its model.source builds (changed after "
                      "build_model, e.g. by refine, with_scheme, with_kernel or a new "
                      "module), so a rebuilt model would not be this one")
    return as_json, None

# -- training checkpoints -------------------------------------------------------------------
def _check_state(state: Any) -> Any:
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict (step, epoch, config, metrics, ...), got "
                        f"{type(state).__name__}")
    return _encode(state, "state", [], None)


def _step_of(state: dict[str, Any]) -> int | None:
    step = state.get("step")
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        return step
    return None


def _is_leftover(p: Path) -> bool:
    """What a killed save leaves: a temporary checkpoint folder (``files.atomic_folder``'s
    ``.ckpt-*.tmp-*``, an older checkpoint being deleted, ``.ckpt-*.tmp-retired``, or an
    older version's ``.tmp-ckpt-*``) or pointer file
    (``files.write_atomic``'s ``.latest.*.tmp``, or an older version's ``latest.tmp-*``)."""
    name = p.name
    if p.is_dir() and not p.is_symlink():
        return name.startswith(_TMP_PREFIX) or (name.startswith(".ckpt") and ".tmp-" in name)
    return p.is_file() and (name.startswith(POINTER + ".tmp-")
                            or (name.startswith(f".{POINTER}.") and name.endswith(".tmp")))


def _clean_leftovers(directory: Path) -> None:
    """Remove what killed saves left (``_is_leftover``)."""
    for p in directory.iterdir():
        if _is_leftover(p):
            remove_path(p)


def _checkpoints(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir()
            if p.is_dir() and not p.is_symlink() and _NAME.fullmatch(p.name)]


def _check_parts(optimizer: Any, scheduler: Any) -> None:
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got "
                        f"{type(optimizer).__name__}")
    if scheduler is not None and not (callable(getattr(scheduler, "state_dict", None))
                                      and callable(getattr(scheduler, "load_state_dict", None))):
        raise TypeError(f"scheduler must be a learning-rate scheduler (with state_dict and "
                        f"load_state_dict) or None, got {type(scheduler).__name__}")


def save_checkpoint(directory: str | os.PathLike, *, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    state: dict[str, Any], keep: int = 1) -> Path:
    """Write one checkpoint into ``directory`` (created if needed) and return its folder.

    ``state`` is the caller's record (step, epoch, config dict, metrics, ...): JSON values, and
    tuples, non-str keys and non-finite floats, which come back as they were. An int
    ``state["step"]`` names the folder. ``keep``: how many complete checkpoints to keep (the
    newest; older ones are deleted after the new one is committed). One writer per directory.
    """
    folder = _path(directory)
    model = _unwrap(model)
    _check_parts(optimizer, scheduler)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}")
    encoded_state = _check_state(state)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"directory {str(folder)!r} exists and is not a directory")
    # everything in memory first: a bad argument fails before anything is written
    files = _checkpoint_files(model, optimizer, scheduler, encoded_state)
    folder.mkdir(parents=True, exist_ok=True)
    _clean_leftovers(folder)
    step = _step_of(state)
    base = f"ckpt-{step:09d}" if step is not None else "ckpt"
    name, i = base, 0
    while (folder / name).exists():
        i += 1
        name = f"{base}.{i}"
    with atomic_folder(folder / name) as tmp:  # fsynced files, renamed into place
        for file, data in files.items():
            _write(tmp / file, data)
    write_atomic(folder / POINTER, name + "\n")  # the commit point
    older = sorted((p for p in _checkpoints(folder) if p.name != name),
                   key=lambda p: (p.stat().st_mtime_ns, p.name))
    for p in older[:max(0, len(older) - (keep - 1))]:
        _retire(p)
    return folder / name


def _retire(checkpoint: Path) -> None:
    """Delete an older checkpoint folder: renamed first to a leftover's name (one atomic
    step), so that a kill during the deletion leaves a leftover the next save removes
    (``_is_leftover``), never a half-deleted folder under a checkpoint's name."""
    gone = checkpoint.with_name(f".{checkpoint.name}.tmp-retired")
    remove_path(gone)
    try:
        checkpoint.rename(gone)
    except OSError:  # the new checkpoint is committed: delete in place, as before
        gone = checkpoint
    remove_path(gone)


def _checkpoint_files(model: nn.Module, optimizer: Any, scheduler: Any,
                      encoded_state: Any) -> dict[str, bytes]:
    """The files of one checkpoint, name -> bytes, checkpoint.json last (module docstring)."""
    source, note = _training_source(model)
    weights, model_json = _model_files(model, source, note)
    opt_tensors: dict[str, torch.Tensor] = {}
    opt_doc = sched_doc = None
    if optimizer is not None:
        opt_doc = {"class": _qualname(optimizer),
                   "state_dict": _encode(optimizer.state_dict(), "optimizer.state_dict()",
                                         ["optimizer"], opt_tensors)}
    if scheduler is not None:
        sched_doc = {"class": _qualname(scheduler),
                     "state_dict": _encode(scheduler.state_dict(), "scheduler.state_dict()",
                                           ["scheduler"], opt_tensors)}
    rng_tensors, rng_meta = _rng_capture()
    files = {"model.safetensors": weights, "model.json": model_json,
             "rng.safetensors": safetensors.torch.save(rng_tensors)}
    if optimizer is not None or scheduler is not None:
        files["optimizer.safetensors"] = safetensors.torch.save(opt_tensors)
    doc = {"format": CHECKPOINT_FORMAT, "version": VERSION, "state": encoded_state,
           "optimizer": opt_doc, "scheduler": sched_doc, "rng": rng_meta,
           "files": {name: _file_entry(data) for name, data in files.items()}}
    files["checkpoint.json"] = _sealed(doc)
    return files


def remove_checkpoints(directory: str | os.PathLike) -> None:
    """Delete every checkpoint of ``directory``, the ``latest`` pointer first (so that a kill
    in between leaves no pointer to a removed folder) and the leftovers of killed saves; the
    directory's other files stay."""
    folder = _path(directory)
    if not folder.is_dir():
        return
    (folder / POINTER).unlink(missing_ok=True)
    for p in [*_checkpoints(folder), *(q for q in folder.iterdir() if _is_leftover(q))]:
        remove_path(p)


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The folder of the newest complete checkpoint in ``directory`` (what ``latest`` names),
    the folder itself if it is one checkpoint, or None when there is none yet."""
    folder = _path(directory)
    if (folder / "checkpoint.json").is_file():
        return folder
    pointer = folder / POINTER
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{pointer}: cannot be read: {e}") from None
    if not _NAME.fullmatch(name):
        raise CheckpointError(f"{pointer}: must name a checkpoint folder ('ckpt-<step>'), got "
                              f"{name[:60]!r}")
    target = folder / name
    if not (target / "checkpoint.json").is_file():
        raise CheckpointError(f"{pointer}: names {name!r}, but {target / 'checkpoint.json'} "
                              f"does not exist")
    return target


def _resolve_checkpoint(directory: Any) -> Path:
    folder = _path(directory)
    if not folder.exists():
        raise CheckpointError(f"checkpoint directory {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint directory {str(folder)!r} is not a directory")
    found = latest_checkpoint(folder)
    if found is None:
        if (folder / "model.json").is_file():
            raise CheckpointError(f"{folder} holds a model saved by splitformer.save, not a "
                                  f"training checkpoint (load it with splitformer.load)")
        raise CheckpointError(f"{folder}: no checkpoint here (neither a {POINTER!r} file nor "
                              f"a checkpoint.json)")
    return found


def load_checkpoint(directory: str | os.PathLike, *, model: nn.Module | None = None,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Load the newest checkpoint of ``directory`` (or the checkpoint folder itself) into the
    objects given and return its ``state``. Every file is checked before anything changes;
    a bad checkpoint raises ``CheckpointError`` and leaves everything as it was."""
    if model is not None:
        model = _unwrap(model)
    _check_parts(optimizer, scheduler)
    if not isinstance(restore_rng, bool):
        raise TypeError(f"restore_rng must be a bool, got {restore_rng!r}")
    folder = _resolve_checkpoint(directory)
    doc, raw = _read_checkpoint(folder)
    cpath = folder / "checkpoint.json"
    _, model_tensors, weights_path = _read_model(folder, raw)
    parts, state = _decoded_parts(folder, doc, raw)
    # check the parts against the objects given
    if model is not None:
        _check_fits_model(model, model_tensors, weights_path)
    opt_sd = sched_sd = None
    if optimizer is not None:
        if parts["optimizer"] is None:
            raise CheckpointError(f"{cpath}: holds no optimizer state (saved without "
                                  f"optimizer=); pass optimizer=None")
        opt_sd = _check_optimizer(optimizer, parts["optimizer"], cpath,
                                  folder / "optimizer.safetensors")
    if scheduler is not None:
        if parts["scheduler"] is None:
            raise CheckpointError(f"{cpath}: holds no scheduler state (saved without "
                                  f"scheduler=); pass scheduler=None")
        sched_sd = _check_scheduler(scheduler, parts["scheduler"], cpath)
    rng = None
    if restore_rng:
        rpath = folder / "rng.safetensors"
        rng_tensors = _tensors_from(rpath, raw["rng.safetensors"])
        meta = _decode(doc.get("rng"), {}, set(), cpath, None)
        rng = (rng_tensors, _check_rng(rng_tensors, meta, cpath, rpath))
    _apply(folder, model, model_tensors, optimizer, opt_sd, scheduler, sched_sd, rng)
    return state


def _read_checkpoint(folder: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """checkpoint.json (sealed) and the bytes of every file it lists (size and sha256
    checked), after checking its schema."""
    cpath = folder / "checkpoint.json"
    doc = _unseal(cpath, cpath.read_bytes(), CHECKPOINT_FORMAT)
    entries = _field(cpath, doc, "files", dict, "an object {file: {bytes, sha256}}")
    required = {"model.safetensors", "model.json", "rng.safetensors"}
    if doc.get("optimizer") is not None or doc.get("scheduler") is not None:
        required.add("optimizer.safetensors")
    if not required <= set(entries) or not set(entries) <= required | {"optimizer.safetensors"}:
        raise CheckpointError(f"{cpath}: 'files' must list {_listing(required)}, got "
                              f"{_listing(entries)}")
    raw = {name: _read_checked(folder / name, entry, cpath) for name, entry in entries.items()}
    _field(cpath, doc, "state", dict, "an object")
    for key in ("optimizer", "scheduler"):
        part = doc.get(key, "missing")
        if part is not None and not (isinstance(part, dict) and isinstance(part.get("class"), str)
                                     and "state_dict" in part):
            raise CheckpointError(f"{cpath}: {key!r} must be null or an object with 'class' "
                                  f"and 'state_dict'")
    return doc, raw


def _decoded_parts(folder: Path, doc: dict[str, Any], raw: dict[str, bytes]
                   ) -> tuple[dict[str, Any], Any]:
    """The optimizer's and scheduler's parts with their state_dicts decoded (every tensor of
    optimizer.safetensors named exactly once), and the caller's state."""
    cpath, opath = folder / "checkpoint.json", folder / "optimizer.safetensors"
    opt_tensors = _tensors_from(opath, raw["optimizer.safetensors"]) \
        if "optimizer.safetensors" in raw else {}
    used: set[str] = set()
    parts = {key: None if doc[key] is None else
             {**doc[key], "state_dict": _decode(doc[key]["state_dict"], opt_tensors, used, cpath,
                                                opath)}
             for key in ("optimizer", "scheduler")}
    if set(opt_tensors) - used:
        raise CheckpointError(f"{opath}: tensors that checkpoint.json does not name: "
                              f"{_listing(set(opt_tensors) - used)}")
    return parts, _decode(doc["state"], {}, set(), cpath, None)


def _apply(folder: Path, model: nn.Module | None, model_tensors: dict[str, torch.Tensor],
           optimizer: Any, opt_sd: Any, scheduler: Any, sched_sd: Any, rng: Any) -> None:
    """Load the checked parts into the objects given, rolling back what was applied if a later
    part fails (``CheckpointError`` naming both failures if the roll-back fails too)."""
    undo: list[Callable[[], None]] = []
    try:
        if model is not None:
            before = {k: v.detach().clone() for k, v in model.state_dict().items()}
            undo.append(lambda: model.load_state_dict(before, strict=True))
            model.load_state_dict(model_tensors, strict=True)
        if optimizer is not None:
            old = optimizer.state_dict()
            old = {"state": old["state"], "param_groups": copy.deepcopy(old["param_groups"])}
            undo.append(lambda: optimizer.load_state_dict(old))
            optimizer.load_state_dict(opt_sd)
        if scheduler is not None:
            old_sched = copy.deepcopy(scheduler.state_dict())
            undo.append(lambda: scheduler.load_state_dict(old_sched))
            scheduler.load_state_dict(copy.deepcopy(sched_sd))
        if rng is not None:
            old_rng = _rng_capture()
            undo.append(lambda: _rng_apply(*old_rng))
            _rng_apply(*rng)
    except Exception as e:
        failed = []
        for step in reversed(undo):
            try:
                step()
            except Exception as again:  # keep rolling back the other parts
                failed.append(f"{type(again).__name__}: {again}")
        if failed:
            raise CheckpointError(f"{folder}: loading failed ({type(e).__name__}: {e}) and "
                                  f"rolling back failed too: {'; '.join(failed)}") from e
        raise CheckpointError(f"{folder}: loading failed and was rolled back: "
                              f"{type(e).__name__}: {e}") from e


def recorded_config(run_dir: str | os.PathLike) -> TrainConfig:
    """The config a run folder was made with: its config.json, or, where that is missing,
    the config its newest checkpoint records (every checkpoint of ``fit`` does). Raises
    ``CheckpointError`` (or ``ConfigError``, for a config.json that is not a valid config)
    naming the file."""
    folder = _path(run_dir, "run_dir")
    path = folder / "config.json"
    if path.is_file():
        try:
            return TrainConfig.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not valid JSON: {e}") from None
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    state = load_checkpoint(folder, restore_rng=False)
    config = state.get("config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{latest_checkpoint(folder)}: records no config (a checkpoint "
                              f"not written by fit), and {path} is missing")
    return TrainConfig.from_dict(config)


# -- models on their own: splitformer.save / splitformer.load -------------------------------
_MODEL_FILES = {"model.json", "model.safetensors"}
TOKENIZER_DIR = "tokenizer"  # a from_hf model's text tokenizer (a GGUF's), when it keeps one


def save_model(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Save a model built by ``training.build_model`` (or ``splitformer train``) or made by
    ``from_hf`` (and changed by its copies: module doc) into ``directory``:
    ``model.safetensors`` and ``model.json`` (its source: family, config, data; or the
    family's source and the model's evolutions and kernels, ``training.model_record``).
    ``directory`` must not exist, be empty, or hold an earlier ``save``; it is written into a
    temporary sibling and renamed into place. ``load`` rebuilds the model. ValueError naming
    what cannot be recorded (nothing is written)."""
    model = _unwrap(model)
    folder = Path(os.path.abspath(_path(directory)))
    source, note = _training_source(model)
    extra = None
    if source is None:
        from .model_record import family_of, record_of, stored_labels

        if family_of(model) is None:
            raise ValueError(f"splitformer.save saves models built by splitformer.training "
                             f"(build_model, splitformer train), whose model.source records "
                             f"the family, config and data that load rebuilds them from, and "
                             f"models made by splitformer.from_hf ({stored_labels()}); this "
                             f"{type(model).__name__} cannot be saved: {note}. Other models "
                             f"are not supported yet (use to_torch / to_hf and their own "
                             f"save).")
        try:
            extra = record_of(model)
        except ValueError as e:
            raise ValueError(f"splitformer.save: this {type(model).__name__} cannot be "
                             f"saved: {e}") from None
        source = extra.pop("source")
    if folder.exists():
        if not folder.is_dir():
            raise ValueError(f"directory {str(folder)!r} exists and is not a directory")
        present = {p.name for p in folder.iterdir()}
        if present and present - {TOKENIZER_DIR} != _MODEL_FILES:
            raise ValueError(f"directory {str(folder)!r} holds other files "
                             f"({_listing(present - _MODEL_FILES or present)}); save writes "
                             f"into a new or empty folder or over an earlier save")
    weights, meta = _model_files(model, source, None, extra)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = vars(model).get("tokenizer")  # a GGUF's (interop.hf.from_hf keeps it)
    with atomic_folder(folder) as tmp:  # over an empty folder or an earlier save: swapped
        write_synced(tmp / "model.safetensors", weights)
        write_synced(tmp / "model.json", meta)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
    return folder


def load_model(directory: str | os.PathLike) -> nn.Module:
    """The model saved in ``directory`` by ``save`` or in a training checkpoint folder (its
    newest checkpoint), rebuilt from its source with the saved weights, in eval mode."""
    folder = _path(directory)
    if not folder.exists():
        raise CheckpointError(f"directory {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise CheckpointError(f"{str(folder)!r} is not a directory")
    if (folder / "model.json").is_file() and not (folder / "checkpoint.json").is_file():
        meta, tensors, weights_path = _read_model(folder)
    else:
        ckpt = _resolve_checkpoint(folder)
        cpath = ckpt / "checkpoint.json"
        doc = _unseal(cpath, cpath.read_bytes(), CHECKPOINT_FORMAT)
        entries = _field(cpath, doc, "files", dict, "an object {file: {bytes, sha256}}")
        raw = {name: _read_checked(ckpt / name, entries.get(name), cpath)
               for name in ("model.json", "model.safetensors")}
        meta, tensors, weights_path = _read_model(ckpt, raw)
    meta_path = weights_path.parent / "model.json"
    source = meta["source"]
    if "evolutions" in meta:  # a model made by from_hf: its family's source and its changes
        model = _load_recorded(meta, tensors, weights_path, meta_path)
        words = weights_path.parent / TOKENIZER_DIR
        if words.is_dir():
            import transformers

            model.tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(words), local_files_only=True)
        return model
    if source is None:
        raise CheckpointError(f"{meta_path}: the model has no training source, so it cannot "
                              f"be rebuilt ({meta['source_note'] or 'not recorded'}); load its "
                              f"weights into a model you build with load_checkpoint(model=...)")
    if not (isinstance(source, dict) and set(source) == {"family", "config", "data"}
            and source["family"] in FAMILIES and isinstance(source["config"], dict)):
        raise CheckpointError(f"{meta_path}: 'source' must be {{family, config, data}} of a "
                              f"training family {sorted(FAMILIES)}, got {source!r:.120}")
    try:
        model = _rebuild(source)
    except Exception as e:
        raise CheckpointError(f"{meta_path}: the model's source does not rebuild: "
                              f"{type(e).__name__}: {e}") from None
    floating = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(floating) == 1:
        model = model.to(floating.pop())
    _check_fits_model(model, tensors, weights_path)
    model.load_state_dict(tensors, strict=True)
    return model.eval()


def _load_recorded(meta: dict[str, Any], tensors: dict[str, torch.Tensor], weights_path: Path,
                   meta_path: Path) -> nn.Module:
    """The model of a model.json that records a family's source, evolutions and kernels
    (``training.model_record``): rebuilt, checked against the file, loaded, eval mode."""
    from .model_record import check, rebuild

    _field(meta_path, meta, "evolutions", list, "a list (one record per evolution)")
    _field(meta_path, meta, "kernels", list, "a list (the attention kernels)")
    _field(meta_path, meta, "source", dict, "an object (the family's store record)")
    floating = {t.dtype for t in tensors.values() if t.is_floating_point()}
    model = rebuild(meta, meta_path, floating.pop() if len(floating) == 1 else None)
    if _qualname(model) != meta.get("class"):
        raise CheckpointError(f"{meta_path}: records a {meta.get('class')}, its source "
                              f"rebuilds a {_qualname(model)}")
    _check_fits_model(model, tensors, weights_path)
    model.load_state_dict(tensors, strict=True)
    check(model, meta, meta_path)
    return model.eval()
