"""The format of a splitformer checkpoint or saved model, and its verification (no I/O but reads).

What ``training.checkpoints`` writes and reads, as values: JSON documents sealed with the sha256
of their own canonical form (``_sealed`` / ``_unseal``), the size and sha256 of every file
(``_file_entry`` / ``_check_bytes``), state_dicts as JSON with tensors standing as
``{"__tensor__": name}`` (``_encode`` / ``_decode``; tuples, non-str keys and non-finite floats
tagged so that they come back as they were), and the model's two files (``model.safetensors``,
tied tensors once, and ``model.json``: ``_model_files`` / ``_read_model`` /
``_check_fits_model``). Every check raises ``CheckpointError`` naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

VERSION = 1
CHECKPOINT_FORMAT = "splitformer.checkpoint"
MODEL_FORMAT = "splitformer.model"
_TAGS = ("__tensor__", "__tuple__", "__dict__", "__float__")


class CheckpointError(ValueError):
    """A checkpoint or saved model that cannot be loaded: the message names the file and what
    is wrong with it. Nothing was changed."""


# -- small helpers ------------------------------------------------------------------------------
def _path(directory: Any, name: str = "directory") -> Path:
    if isinstance(directory, bool) or not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got "
                        f"{type(directory).__name__}")
    if str(directory).strip() == "":
        raise ValueError(f"{name} must be a non-empty path")
    return Path(directory)


def _unwrap(model: Any, name: str = "model") -> nn.Module:
    """The module itself: DistributedDataParallel's ``.module``, torch.compile's ``_orig_mod``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module, got {type(model).__name__}")
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def _qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=True).encode()


def _sealed(doc: dict[str, Any]) -> bytes:
    """``doc`` as JSON text with ``sha256``: the hash of its own canonical form (an edit of the
    file is detected)."""
    doc = dict(doc)
    doc["sha256"] = _sha256(_canonical(doc))
    return (json.dumps(doc, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


def _unseal(path: Path, data: bytes, fmt: str) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        raise CheckpointError(f"{path}: not valid JSON (truncated or edited?): {e}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != fmt:
        raise CheckpointError(f"{path}: format must be {fmt!r}, got {doc.get('format')!r}")
    if doc.get("version") != VERSION:
        raise CheckpointError(f"{path}: format version {doc.get('version')!r} is not supported "
                              f"(this splitformer reads version {VERSION})")
    claimed = doc.pop("sha256", None)
    if not isinstance(claimed, str):
        raise CheckpointError(f"{path}: the 'sha256' of the file's content is missing")
    if _sha256(_canonical(doc)) != claimed:
        raise CheckpointError(f"{path}: content does not match its sha256 (the file was edited "
                              f"or damaged)")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _field(path: Path, doc: dict[str, Any], key: str, types: type | tuple[type, ...],
           what: str) -> Any:
    if key not in doc:
        raise CheckpointError(f"{path}: key {key!r} is missing")
    value = doc[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        raise CheckpointError(f"{path}: {key!r} must be {what}, got {value!r}")
    return value


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)

def _file_entry(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": _sha256(data)}


def _check_bytes(path: Path, data: bytes, entry: Any, listed_in: Path) -> bytes:
    """``data`` (the content of ``path``), after checking its size and sha256 against the
    ``entry`` that ``listed_in`` holds for it."""
    if (not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int)
            or not isinstance(entry.get("sha256"), str)):
        raise CheckpointError(f"{listed_in}: the entry of {path.name!r} must be "
                              f"{{'bytes': int, 'sha256': str}}, got {entry!r}")
    if len(data) != entry["bytes"]:
        raise CheckpointError(f"{path}: {len(data)} bytes, {listed_in.name} says "
                              f"{entry['bytes']} (truncated, edited or damaged)")
    if _sha256(data) != entry["sha256"]:
        raise CheckpointError(f"{path}: content does not match the sha256 in {listed_in.name} "
                              f"(edited, damaged or replaced)")
    return data


def _read_checked(path: Path, entry: Any, listed_in: Path) -> bytes:
    """The file's bytes, after checking its size and sha256 against ``entry``."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file is missing (listed in {listed_in.name})")
    return _check_bytes(path, path.read_bytes(), entry, listed_in)


def _tensors_from(path: Path, data: bytes) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load(data)
    except Exception as e:  # safetensors' own error type is not exported stably
        raise CheckpointError(f"{path}: not a valid safetensors file: {e}") from None


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _listing(names: Any, limit: int = 6) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(repr(n) for n in names[:limit]) + more


# -- JSON with tensors: the encoding of state_dicts -----------------------------------------
def _encode(obj: Any, where: str, parts: list[str],
            tensors: dict[str, torch.Tensor] | None) -> Any:
    """``obj`` as JSON: tensors go to ``tensors`` (named by their path) and stand as
    {"__tensor__": name}; tuples, dicts with non-str keys and non-finite floats are tagged so
    that they come back as they were. ``tensors=None``: tensors are refused."""
    if isinstance(obj, torch.Tensor):
        if tensors is None:
            raise TypeError(f"{where} is a torch.Tensor; a checkpoint's state must be JSON "
                            f"values (use .item() or .tolist())")
        name = "/".join(parts)
        while name in tensors:  # keys 1 and "1" in one dict
            name += "#"
        tensors[name] = obj.detach().cpu().contiguous()
        return {"__tensor__": name}
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else {"__float__": repr(float(obj))}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{where}[{i}]", [*parts, str(i)], tensors)
                              for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{where}[{i}]", [*parts, str(i)], tensors)
                for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        plain = all(isinstance(k, str) for k in obj) and not any(k in _TAGS for k in obj)
        if plain:
            return {k: _encode(v, f"{where}[{k!r}]", [*parts, k], tensors)
                    for k, v in obj.items()}
        pairs = []
        for k, v in obj.items():
            if not (k is None or isinstance(k, bool | int | float | str | tuple)):
                raise TypeError(f"{where} has a key {k!r} of type {type(k).__name__}; keys "
                                f"must be str, int, float, bool, None or tuples of them")
            pairs.append([_encode(k, f"{where} key {k!r}", [*parts, "key"], None),
                          _encode(v, f"{where}[{k!r}]", [*parts, str(k)], tensors)])
        return {"__dict__": pairs}
    raise TypeError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__} ({obj!r:.60}),"
                    f" which a checkpoint cannot store: only JSON values (dict, list, tuple, str, "
                    f"int, float, bool, None) and tensors where noted")


def _decode(obj: Any, tensors: dict[str, torch.Tensor], used: set[str], path: Path,
            tensor_file: Path | None) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, used, path, tensor_file) for v in obj]
    if not isinstance(obj, dict):
        return obj
    tag = next((k for k in _TAGS if k in obj), None)
    if tag is None:
        return {k: _decode(v, tensors, used, path, tensor_file) for k, v in obj.items()}
    if len(obj) != 1:
        raise CheckpointError(f"{path}: a {tag!r} entry must be alone in its object, got "
                              f"{sorted(obj)}")
    value = obj[tag]
    if tag == "__tensor__":
        if not isinstance(value, str):
            raise CheckpointError(f"{path}: a tensor reference must be a name, got {value!r}")
        if value not in tensors:
            where = tensor_file if tensor_file is not None else path
            raise CheckpointError(f"{where}: tensor {value!r} is missing (named in "
                                  f"{path.name})")
        used.add(value)
        return tensors[value]
    if tag == "__float__":
        if value not in ("nan", "inf", "-inf"):
            raise CheckpointError(f"{path}: a non-finite float must be 'nan', 'inf' or '-inf', "
                                  f"got {value!r}")
        return float(value)
    if not isinstance(value, list):
        raise CheckpointError(f"{path}: a {tag!r} entry must hold a list, got {value!r:.60}")
    items = [_decode(v, tensors, used, path, tensor_file) for v in value]
    if tag == "__tuple__":
        return tuple(items)
    out = {}
    for pair in items:
        if not isinstance(pair, list) or len(pair) != 2:
            raise CheckpointError(f"{path}: a '__dict__' entry must hold [key, value] pairs, "
                                  f"got {pair!r:.60}")
        try:
            out[pair[0]] = pair[1]
        except TypeError:
            raise CheckpointError(f"{path}: dict key {pair[0]!r:.60} is not hashable") from None
    return out


# -- the model's part (model.safetensors + model.json) --------------------------------------
def _identity(t: torch.Tensor) -> tuple | None:
    if t.numel() == 0:
        return None
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), _shape(t),
            t.stride(), t.dtype)


def _state_of(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The model's state_dict split into the tensors to store and the names that are the same
    tensor as an earlier one (tied weights): ``{alias: name}``."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in model.state_dict().items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"model.state_dict()[{name!r}] is a {type(t).__name__}, not a "
                            f"tensor; a checkpoint stores tensors only")
        key = _identity(t)
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        tensors[name] = t
    return tensors, aliases


def _model_files(model: nn.Module, source: Any, note: str | None,
                 extra: dict[str, Any] | None = None) -> tuple[bytes, bytes]:
    """model.safetensors and model.json (sealed; ``extra``: more keys of model.json, e.g. the
    evolutions and kernels of a model read from transformers, ``training.model_record``)."""
    tensors, aliases = _state_of(model)
    stored: dict[str, torch.Tensor] = {}
    storages: set[tuple] = set()
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        storage = (t.untyped_storage().data_ptr(),) if t.numel() else None
        if storage is not None and storage in storages:  # a view of another stored tensor
            t = t.clone()
        elif storage is not None:
            storages.add(storage)
        stored[name] = t
    try:
        weights = safetensors.torch.save(stored, metadata={"format": "pt"})
    except Exception as e:
        raise TypeError(f"model's tensors cannot be stored in safetensors: {e}") from None
    doc = {"format": MODEL_FORMAT, "version": VERSION, "class": _qualname(model),
           "source": source, "source_note": note, "aliases": aliases,
           "files": {"model.safetensors": _file_entry(weights)}}
    clash = sorted(set(extra or {}) & set(doc))
    if clash:
        raise ValueError(f"model.json: the keys {clash} are the format's own")
    return weights, _sealed({**doc, **(extra or {})})


def _read_model(folder: Path, raw: dict[str, bytes] | None = None
                ) -> tuple[dict[str, Any], dict[str, torch.Tensor], Path]:
    """model.json and the tensors of model.safetensors (the full state_dict, aliases filled
    in), checked. ``raw``: both files' bytes, already checked against checkpoint.json."""
    meta_path, weights_path = folder / "model.json", folder / "model.safetensors"
    if raw is None:
        if not meta_path.is_file():
            raise CheckpointError(f"{meta_path}: file is missing")
        raw = {"model.json": meta_path.read_bytes()}
    meta = _unseal(meta_path, raw["model.json"], MODEL_FORMAT)
    files = _field(meta_path, meta, "files", dict, "an object")
    aliases = _field(meta_path, meta, "aliases", dict, "an object {alias: name}")
    _field(meta_path, meta, "source_note", (str, type(None)), "a string or null")
    if "source" not in meta:
        raise CheckpointError(f"{meta_path}: key 'source' is missing")
    if "model.safetensors" in raw:
        data = _check_bytes(weights_path, raw["model.safetensors"],
                            files.get("model.safetensors"), meta_path)
    else:
        data = _read_checked(weights_path, files.get("model.safetensors"), meta_path)
    tensors = _tensors_from(weights_path, data)
    for alias, name in aliases.items():
        if not isinstance(name, str) or name not in tensors or alias in tensors:
            raise CheckpointError(f"{meta_path}: alias {alias!r} -> {name!r} does not name "
                                  f"a stored tensor of {weights_path.name}")
        tensors[alias] = tensors[name]
    return meta, tensors, weights_path


def _check_fits_model(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> None:
    live = model.state_dict()
    missing, unexpected = set(live) - set(tensors), set(tensors) - set(live)
    problems = []
    if missing:
        problems.append(f"tensors missing from the file: {_listing(missing)}")
    if unexpected:
        problems.append(f"tensors the model does not have: {_listing(unexpected)}")
    for name in sorted(set(live) & set(tensors)):
        a, b = tensors[name], live[name]
        if _shape(a) != _shape(b):
            problems.append(f"{name!r} has shape {_shape(a)} in the file, {_shape(b)} in "
                            f"the model")
        elif a.dtype != b.dtype:
            problems.append(f"{name!r} has dtype {a.dtype} in the file, {b.dtype} in the model")
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more"
                                           if len(problems) > 6 else "")
        raise CheckpointError(f"{path}: does not fit the {type(model).__name__} given: {shown}")
    _, live_aliases = _state_of(model)
    for alias, name in live_aliases.items():
        if tensors[alias] is not tensors[name] and not torch.equal(tensors[alias],
                                                                   tensors[name]):
            raise CheckpointError(f"{path}: {alias!r} and {name!r} are one tensor in the "
                                  f"model (tied) but differ in the file")
