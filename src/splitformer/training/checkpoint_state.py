"""The optimizer's, scheduler's and random generators' part of a checkpoint: checks and capture.

``_check_optimizer`` / ``_check_scheduler`` check a decoded state_dict against the object given
(class, parameter groups, per-parameter state shapes, keys); ``_rng_capture`` / ``_rng_apply``
take and restore the torch CPU (and CUDA) generators, python random's and numpy's Mersenne
Twister, and ``_check_rng`` checks a stored state before it is applied.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint_format import CheckpointError, _encode, _listing, _qualname, _shape

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
