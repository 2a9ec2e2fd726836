"""The folder a compression writes, and ``splitformer.load`` of it (docs/depth.md "The result
folder").

    DIR/compress.json       what was done: the base model's source (its transformers config),
                            the healing config, the coarse grid of every healed N_t (the
                            operations on the base), the default N_t, the metrics
    DIR/model.safetensors   the healed parameters, in the base model's structure (its size
                            and SHA-256 in compress.json's "files", checked by ``load``)
    DIR/hf/                 the default N_t as an ordinary network (``as_network``, ``to_hf``),
                            with the base folder's tokenizer: ``transformers.AutoModel
                            .from_pretrained(DIR/hf)`` loads it (absent when the scheme cannot be
                            a layer list, e.g. with token merging)
    DIR/tokenizer/          the base folder's tokenizer files (what ``analyze`` / ``theory``
                            encode text with when MODEL is DIR; absent without one)
    DIR/heal/               the healing run (config, metrics.jsonl, checkpoints: resumable)

``load(DIR)`` rebuilds the base model from its source (random weights, nothing downloaded),
loads the healed parameters and applies the coarse grid of the default N_t (``steps=`` another
healed one); a folder without compress.json is ``training.checkpoints.load_model``'s.
compress.json is written last: a folder without it is not a finished compression. The weights
file is checked against the size and SHA-256 that compress.json records for it (the entries
and the check of ``training.checkpoint_format``, as a training checkpoint's files), so a
damaged or replaced file is refused by name (``CheckpointError``); a folder written before the
record existed loads with a warning that its weights are not checked.
"""

from __future__ import annotations

import json
import numbers
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from ..files import atomic_folder, remove_path, write_atomic, write_synced
from ..training.checkpoint_format import _file_entry, _read_checked, _state_of, _tensors_from
from ..training.checkpoints import load_model as load_training_model
from .coarsenings import Coarsening

__all__ = ["FORMAT", "healed_weights", "load", "load_compressed", "tokenizer_folder",
           "write_result"]

FORMAT = "splitformer-compression/1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json", "chat_template.jinja")


def _base_record(model) -> dict[str, Any]:
    """The base model's source as compress.json keeps it: the ``store`` kind of its family
    and its typed config (``interop.families``: the record says how a family is stored)."""
    from ..interop.families import stored

    source = model.source
    for record in stored():
        if isinstance(source, record.source_type()):
            return record.stored(source)
    names = " or ".join(f"a {r.library} {r.label}" for r in stored())
    raise ValueError(f"the compressed model must come from {names} (from_hf), got a model "
                     f"whose source is {type(source).__name__}")


def _rebuild(record: dict[str, Any]):
    from ..interop.families import family_of_store, stored

    family = family_of_store(record.get("kind"))
    if family is None:
        kinds = " or ".join(repr(r.store) for r in stored())
        raise ValueError(f"unknown base kind {record.get('kind')!r} (expected {kinds})")
    return family.rebuild(record)


def write_result(folder: str | os.PathLike, *, base, coarsenings: dict[int, Coarsening],
                 default: int, info: dict[str, Any], tokenizer_from: str | os.PathLike | None
                 ) -> dict[str, Any]:
    """Write the result files (module doc) into ``folder`` (it exists; one writer: the caller
    holds its lock); returns the record of compress.json. compress.json, the completion mark,
    is removed first and written last, each file replaced at once (``files``), so a kill
    leaves no record beside other files. The HF folder is written when the default grid is a
    layer list."""
    from ..interop import to_hf

    clash = sorted({"format", "base", "default_steps", "coarsenings", "hf", "hf_note",
                    "tokenizer", "files", "aliases"}
                   & set(info))
    if clash:
        raise ValueError(f"write_result(info): the keys {clash} are the record's own")
    folder = Path(folder)
    remove_path(folder / "compress.json")
    state, aliases = _state_of(base)  # tied tensors (a tied LM head) once
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    weights = save(tensors)
    write_atomic(folder / "model.safetensors", weights)
    student = coarsenings[default].apply(base).eval()
    hf_note = None
    try:
        exported = to_hf(student)
    except ValueError as e:
        hf_note = f"not exported: {e}"
        exported = None
    if exported is not None:
        from transformers.utils import logging

        shown = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()
        try:
            with atomic_folder(folder / "hf") as staging:
                exported.save_pretrained(staging)
                # transformers writes its weights file 0600: give it the mode of the config
                # file it wrote beside it (the umask's), as every other file here has
                mode = (staging / "config.json").stat().st_mode & 0o777
                for written in staging.iterdir():
                    written.chmod(mode)
                for name in TOKENIZER_FILES if tokenizer_from is not None else ():
                    src = Path(tokenizer_from) / name
                    if src.is_file():
                        write_synced(staging / name, src.read_bytes())
        finally:
            if shown:
                logging.enable_progress_bar()
    else:
        remove_path(folder / "hf")
    tokenizer = _write_tokenizer(folder / "tokenizer", tokenizer_from)
    record = {"format": FORMAT, "base": _base_record(base), "default_steps": default,
              "coarsenings": {str(n): c.to_dict() for n, c in coarsenings.items()},
              "hf": "hf" if exported is not None else None, "hf_note": hf_note,
              "tokenizer": tokenizer, "files": {"model.safetensors": _file_entry(weights)},
              **({"aliases": aliases} if aliases else {}), **info}
    write_atomic(folder / "compress.json", json.dumps(record, indent=2) + "\n")
    return record


def _write_tokenizer(target: Path, tokenizer_from: str | os.PathLike | None) -> str | None:
    """The tokenizer files of ``tokenizer_from`` copied into ``target`` (whole or not at
    all); its name relative to the result folder, or None (and no folder) without any."""
    files = [] if tokenizer_from is None else [
        Path(tokenizer_from) / name for name in TOKENIZER_FILES
        if (Path(tokenizer_from) / name).is_file()]
    if not files:
        remove_path(target)
        return None
    with atomic_folder(target) as staging:
        for src in files:
            write_synced(staging / src.name, src.read_bytes())
    return target.name


def tokenizer_folder(folder: str | os.PathLike) -> Path | None:
    """Where the tokenizer of a result folder is: DIR/tokenizer, else DIR/hf (folders written
    before DIR/tokenizer existed), else None."""
    for sub in ("tokenizer", "hf"):
        path = Path(folder) / sub
        if any((path / name).is_file() for name in TOKENIZER_FILES):
            return path
    return None


def _record(folder: Path) -> dict[str, Any]:
    path = folder / "compress.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a compression record ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        got = record.get("format") if isinstance(record, dict) else record
        raise ValueError(f"{path}: format {got!r}, expected {FORMAT!r}")
    return record


def healed_weights(folder: str | os.PathLike,
                   record: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The healed parameters of the result folder ``folder`` (model.safetensors), checked
    against the size and SHA-256 in its compress.json (``CheckpointError`` naming the file
    otherwise; a folder written before the record: a warning, not checked)."""
    folder = Path(folder)
    record = _record(folder) if record is None else record
    weights = folder / "model.safetensors"
    files = record.get("files")
    if files is None:
        warnings.warn(f"{folder / 'compress.json'} records no SHA-256 of model.safetensors "
                      "(written by an older splitformer): its weights are not checked",
                      stacklevel=3)
        return load_file(str(weights))
    entry = files.get("model.safetensors") if isinstance(files, dict) else None
    tensors = _tensors_from(weights, _read_checked(weights, entry, folder / "compress.json"))
    for alias, name in (record.get("aliases") or {}).items():  # tied: stored once
        tensors[alias] = tensors[name]
    return tensors


def load_compressed(folder: str | os.PathLike, steps: int | None = None):
    """The compressed model of ``folder`` at its default N_t (or ``steps``), eval mode."""
    folder = Path(folder)
    record = _record(folder)
    grids = {int(n): Coarsening.from_dict(c) for n, c in record["coarsenings"].items()}
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, numbers.Integral)):
        raise TypeError(f"steps must be an int (one healed N_t) or None, got "
                        f"{type(steps).__name__} {steps!r}")
    n = int(record["default_steps"]) if steps is None else int(steps)
    if n not in grids:
        raise ValueError(f"steps={n!r}: {folder} was healed for N_t in {sorted(grids)}")
    base = _rebuild(record["base"])
    base.load_state_dict(healed_weights(folder, record), strict=True)
    return grids[n].apply(base.eval()).eval()


def load(directory: str | os.PathLike, steps: int | None = None):
    """``splitformer.load``: a compression folder (compress.json; ``steps``: which healed N_t)
    or a folder of ``splitformer.save`` / a training run (``training.checkpoints
    .load_model``)."""
    if (Path(directory) / "compress.json").is_file():
        return load_compressed(directory, steps)
    if steps is not None:
        raise ValueError(f"load(steps={steps!r}): {str(directory)!r} is not a compression "
                         "folder (no compress.json)")
    return load_training_model(directory)
