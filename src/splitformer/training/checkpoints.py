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
    DIR/.tmp-ckpt-*/             a checkpoint being written (removed by the next save)

Writing is atomic: every file goes into a temporary sibling folder and is fsynced, the folder is
fsynced and renamed to ``ckpt-...``, then ``latest`` is replaced by ``os.replace`` of an fsynced
temporary file (the commit point), and only then are older checkpoints deleted. A process killed
at any moment (SIGKILL included) leaves ``latest`` naming a complete checkpoint.

Loading checks everything before it changes anything: each JSON file's own sha256, the size and
sha256 of every file, the JSON schema, the tensor names, shapes and dtypes against the model, the
optimizer's parameter groups and per-parameter state shapes, the scheduler's keys and the RNG
states. A bad checkpoint raises ``CheckpointError`` naming the file and what is wrong, and
nothing is loaded half: if applying one part still fails, the parts already applied are rolled
back.

``save_model`` writes ``model.safetensors`` and ``model.json`` (the same two files as in a
checkpoint) for a model built by ``training.families.build_model``: its ``model.source``
(family, config, data) is what ``load_model`` rebuilds it from. Models from elsewhere are
refused for now (their source does not say how to rebuild them).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import re
import shutil
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import nn

from .config import ConfigError, TrainConfig
from .families import FAMILIES, build_model

__all__ = [
    "CheckpointError",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model",
    "save_checkpoint",
    "save_model",
]

VERSION = 1
CHECKPOINT_FORMAT = "splitformer.checkpoint"
MODEL_FORMAT = "splitformer.model"
POINTER = "latest"
_TMP_PREFIX = ".tmp-ckpt-"
_NAME = re.compile(r"ckpt(-[0-9]{9})?(\.[0-9]+)?")
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


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _model_files(model: nn.Module, source: Any, note: str | None) -> tuple[bytes, bytes]:
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
    return weights, _sealed(doc)


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


# -- optimizer, scheduler, RNG --------------------------------------------------------------
_PER_PARAMETER = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg",
                  "acc_delta", "sum", "grad_avg", "prev", "ax", "mu_product")


def _check_optimizer(optimizer: torch.optim.Optimizer, saved: dict[str, Any], path: Path,
                     tensor_path: Path) -> dict[str, Any]:
    cls = saved.get("class")
    if cls != _qualname(optimizer):
        raise CheckpointError(f"{path}: the optimizer state is {cls!r}, the optimizer given is "
                              f"{_qualname(optimizer)!r}")
    sd = saved.get("state_dict")
    if not (isinstance(sd, dict) and isinstance(sd.get("state"), dict)
            and isinstance(sd.get("param_groups"), list)):
        raise CheckpointError(f"{path}: optimizer state_dict must have 'state' (a dict) and "
                              f"'param_groups' (a list)")
    groups = optimizer.param_groups
    if len(sd["param_groups"]) != len(groups):
        raise CheckpointError(f"{path}: the optimizer state has {len(sd['param_groups'])} "
                              f"parameter group(s), the optimizer given has {len(groups)}")
    params: dict[Any, torch.Tensor] = {}
    for i, (g, live) in enumerate(zip(sd["param_groups"], groups, strict=True)):
        ids = g.get("params") if isinstance(g, dict) else None
        if not isinstance(ids, list):
            raise CheckpointError(f"{path}: parameter group {i} has no 'params' list")
        if len(ids) != len(live["params"]):
            raise CheckpointError(f"{path}: parameter group {i} holds {len(ids)} parameters "
                                  f"in the checkpoint, {len(live['params'])} in the optimizer "
                                  f"given")
        params.update(zip(ids, live["params"], strict=True))
    for pid, entry in sd["state"].items():
        if pid not in params:
            raise CheckpointError(f"{path}: optimizer state for parameter {pid!r}, which no "
                                  f"parameter group lists")
        if not isinstance(entry, dict):
            raise CheckpointError(f"{path}: optimizer state of parameter {pid!r} must be a "
                                  f"dict")
        p = params[pid]
        for key, value in entry.items():
            if key in _PER_PARAMETER and isinstance(value, torch.Tensor) \
                    and _shape(value) != _shape(p):
                raise CheckpointError(f"{tensor_path}: optimizer state {key!r} of parameter "
                                      f"{pid} has shape {_shape(value)}, the parameter "
                                      f"{_shape(p)}")
    return sd


def _check_scheduler(scheduler: Any, saved: dict[str, Any], path: Path) -> dict[str, Any]:
    cls = saved.get("class")
    if cls != _qualname(scheduler):
        raise CheckpointError(f"{path}: the scheduler state is {cls!r}, the scheduler given "
                              f"is {_qualname(scheduler)!r}")
    sd, live = saved.get("state_dict"), scheduler.state_dict()
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path}: scheduler state_dict must be an object")
    if set(sd) != set(live):
        raise CheckpointError(f"{path}: scheduler state keys differ from the scheduler given's:"
                              f" missing {_listing(set(live) - set(sd))}, unexpected "
                              f"{_listing(set(sd) - set(live))}")
    for key, value in sd.items():
        if isinstance(value, list) and isinstance(live[key], list) \
                and len(value) != len(live[key]):
            raise CheckpointError(f"{path}: scheduler state {key!r} has {len(value)} entries, "
                                  f"the scheduler given {len(live[key])} (one per parameter "
                                  f"group)")
    return sd


def _rng_capture() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    for i, s in enumerate(cuda):
        tensors[f"cuda/{i}"] = s.cpu()
    version, internal, gauss = random.getstate()
    tensors["python"] = torch.tensor(internal, dtype=torch.int64)
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    tensors["numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    meta = {"cuda_devices": len(cuda),
            "python": {"version": version, "gauss_next": _encode(gauss, "gauss_next", [], None)},
            "numpy": {"bit_generator": name, "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached_gaussian": _encode(float(cached), "cached", [], None)}}
    return tensors, meta


def _rng_apply(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    n = meta["cuda_devices"]
    if n and torch.cuda.is_available() and torch.cuda.device_count() == n:
        torch.cuda.set_rng_state_all([tensors[f"cuda/{i}"] for i in range(n)])
    elif n:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        warnings.warn(f"the checkpoint holds {n} CUDA generator state(s), this machine has "
                      f"{have} CUDA device(s): the CUDA generators were not restored",
                      RuntimeWarning, stacklevel=3)
    py = meta["python"]
    random.setstate((py["version"], tuple(int(v) for v in tensors["python"].tolist()),
                     py["gauss_next"]))
    npm = meta["numpy"]
    np.random.set_state((npm["bit_generator"], tensors["numpy"].numpy().astype(np.uint32),
                         npm["pos"], npm["has_gauss"], npm["cached_gaussian"]))


def _check_rng(tensors: dict[str, torch.Tensor], meta: Any, path: Path, tensor_path: Path
               ) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: 'rng' must be an object")
    n = meta.get("cuda_devices")
    py, npm = meta.get("python"), meta.get("numpy")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(py, dict) \
            or not isinstance(npm, dict):
        raise CheckpointError(f"{path}: 'rng' must have cuda_devices (int >= 0), python and "
                              f"numpy (objects)")
    expected = {"torch_cpu", "python", "numpy"} | {f"cuda/{i}" for i in range(n)}
    if set(tensors) != expected:
        raise CheckpointError(f"{tensor_path}: expected the tensors {_listing(expected)}, got "
                              f"{_listing(tensors)}")

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{tensor_path}: {what}")

    cpu = tensors["torch_cpu"]
    if cpu.dtype != torch.uint8 or _shape(cpu) != _shape(torch.get_rng_state()):
        raise bad(f"'torch_cpu' must be uint8 of shape {_shape(torch.get_rng_state())}, got "
                  f"{cpu.dtype} {_shape(cpu)}")
    for i in range(n):
        c = tensors[f"cuda/{i}"]
        if c.dtype != torch.uint8 or c.dim() != 1:
            raise bad(f"'cuda/{i}' must be a 1-D uint8 tensor, got {c.dtype} {_shape(c)}")
    for key, length in (("python", 625), ("numpy", 624)):
        t = tensors[key]
        if t.dtype != torch.int64 or _shape(t) != (length,) or bool((t < 0).any()) \
                or bool((t >= 2**32).any()):
            raise bad(f"{key!r} must be {length} int64 values in [0, 2**32), got {t.dtype} "
                      f"{_shape(t)}")
    if py.get("version") != random.getstate()[0] or int(tensors["python"][-1]) > 624:
        raise CheckpointError(f"{path}: python random state version/position is not valid")
    gauss = py.get("gauss_next")
    if gauss is not None and not isinstance(gauss, float):
        raise CheckpointError(f"{path}: python gauss_next must be a float or null")
    ok = (npm.get("bit_generator") == "MT19937" and isinstance(npm.get("pos"), int)
          and 0 <= npm["pos"] <= 624 and npm.get("has_gauss") in (0, 1)
          and isinstance(npm.get("cached_gaussian"), float))
    if not ok:
        raise CheckpointError(f"{path}: numpy RNG state must be MT19937 with pos in [0, 624], "
                              f"has_gauss 0 or 1 and a float cached_gaussian; got {npm!r:.120}")
    return meta


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


def _clean_leftovers(directory: Path) -> None:
    """Remove what killed saves left: temporary checkpoint folders and pointer files."""
    for p in directory.iterdir():
        if p.name.startswith(_TMP_PREFIX) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(POINTER + ".tmp-") and p.is_file():
            p.unlink(missing_ok=True)


def _checkpoints(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir()
            if p.is_dir() and not p.is_symlink() and _NAME.fullmatch(p.name)]


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
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got "
                        f"{type(optimizer).__name__}")
    if scheduler is not None and not (callable(getattr(scheduler, "state_dict", None))
                                      and callable(getattr(scheduler, "load_state_dict", None))):
        raise TypeError(f"scheduler must be a learning-rate scheduler (with state_dict and "
                        f"load_state_dict) or None, got {type(scheduler).__name__}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}")
    encoded_state = _check_state(state)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"directory {str(folder)!r} exists and is not a directory")

    # everything in memory first: a bad argument fails before anything is written
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

    folder.mkdir(parents=True, exist_ok=True)
    _clean_leftovers(folder)
    tmp = folder / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    for name, data in files.items():
        _write(tmp / name, data)
    _fsync_dir(tmp)
    step = _step_of(state)
    base = f"ckpt-{step:09d}" if step is not None else "ckpt"
    name, i = base, 0
    while (folder / name).exists():
        i += 1
        name = f"{base}.{i}"
    final = folder / name
    os.rename(tmp, final)
    _fsync_dir(folder)
    pointer_tmp = folder / f"{POINTER}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _write(pointer_tmp, (name + "\n").encode())
    os.replace(pointer_tmp, folder / POINTER)  # the commit point
    _fsync_dir(folder)
    older = sorted((p for p in _checkpoints(folder) if p.name != name),
                   key=lambda p: (p.stat().st_mtime_ns, p.name))
    for p in older[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final


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
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got "
                        f"{type(optimizer).__name__}")
    if scheduler is not None and not (callable(getattr(scheduler, "state_dict", None))
                                      and callable(getattr(scheduler, "load_state_dict", None))):
        raise TypeError(f"scheduler must be a learning-rate scheduler (with state_dict and "
                        f"load_state_dict) or None, got {type(scheduler).__name__}")
    if not isinstance(restore_rng, bool):
        raise TypeError(f"restore_rng must be a bool, got {restore_rng!r}")
    folder = _resolve_checkpoint(directory)

    # 1. checkpoint.json, then every file it lists (size and sha256)
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
    _, model_tensors, weights_path = _read_model(folder, raw)

    # 2. decode the parts and check them against the objects given
    opath = folder / "optimizer.safetensors"
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
    state = _decode(doc["state"], {}, set(), cpath, None)
    if model is not None:
        _check_fits_model(model, model_tensors, weights_path)
    opt_sd = sched_sd = None
    if optimizer is not None:
        if parts["optimizer"] is None:
            raise CheckpointError(f"{cpath}: holds no optimizer state (saved without "
                                  f"optimizer=); pass optimizer=None")
        opt_sd = _check_optimizer(optimizer, parts["optimizer"], cpath, opath)
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

    # 3. apply, rolling back what was applied if a later part fails
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
    return state


# -- models on their own: splitformer.save / splitformer.load -------------------------------
_MODEL_FILES = {"model.json", "model.safetensors"}


def save_model(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Save a model built by ``training.build_model`` (or ``splitformer train``) into
    ``directory``: ``model.safetensors`` and ``model.json`` (its source: family, config, data).
    ``directory`` must not exist, be empty, or hold an earlier ``save``; it is written into a
    temporary sibling and renamed into place. ``load`` rebuilds the model."""
    model = _unwrap(model)
    folder = Path(os.path.abspath(_path(directory)))
    source, note = _training_source(model)
    if source is None:
        raise ValueError(f"splitformer.save saves models built by splitformer.training "
                         f"(build_model, splitformer train), whose model.source records the "
                         f"family, config and data that load rebuilds them from; this "
                         f"{type(model).__name__} cannot be saved: {note}. Other models are not "
                         f"supported yet (use to_torch / to_hf and their own save).")
    if folder.exists():
        if not folder.is_dir():
            raise ValueError(f"directory {str(folder)!r} exists and is not a directory")
        present = {p.name for p in folder.iterdir()}
        if present and present != _MODEL_FILES:
            raise ValueError(f"directory {str(folder)!r} holds other files "
                             f"({_listing(present - _MODEL_FILES or present)}); save writes "
                             f"into a new or empty folder or over an earlier save")
    weights, meta = _model_files(model, source, None)
    parent = folder.parent
    parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = parent / f".{folder.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        _write(tmp / "model.safetensors", weights)
        _write(tmp / "model.json", meta)
        _fsync_dir(tmp)
        if folder.exists() and any(folder.iterdir()):
            old = parent / f".{folder.name}.old-{tag}"
            os.rename(folder, old)
            os.rename(tmp, folder)
            _fsync_dir(parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, folder)  # over an empty folder, or a new name
            _fsync_dir(parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
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
