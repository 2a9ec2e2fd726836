"""The correspondence table: each claim of the paper (or of an interop map), measured.

A check is a function ``fn(dtype) -> float`` that builds random-weight reference modules, runs
the splitformer counterpart and returns the max abs difference. ``register`` adds one to the
registry under a group: the checks measured against one reference (core: the paper's claims
against torch.nn; bert, vit, cvt, gpt2: transformers; timm; transformer: nn.Transformer; a
model family's group is declared by its record, ``interop.families``).
``run_checks`` measures them in float64 and float32 against the tolerances (1e-10 and 1e-5). A
check whose reference library is missing raises ``SkipCheck``. Group modules (``GROUPS``) are
imported lazily so that the core has no optional dependency.

"Family" is the model family (``training.families``); the names that used it here for a group
are kept as deprecated aliases: ``FAMILY_MODULES`` = ``GROUPS``, ``families()`` =
``group_names()``, ``Check.family`` = ``Check.group``, and each result row carries ``"family"``
next to ``"group"``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..interop.families import LiveTable, verification_groups

__all__ = ["GROUPS", "Check", "SkipCheck", "TOLERANCES", "families", "group_names", "register",
           "run_checks"]

TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5}

# group name -> module that registers its checks on import: "core" (the paper's claims against
# torch.nn), each model family's group as its record declares it (interop.families, in registry
# order), "transformer" (nn.Transformer); a live view: a family registered later is here
GROUPS: Mapping[str, str] = LiveTable(lambda: {
    "core": "splitformer.verification.core",
    **verification_groups(),
    "transformer": "splitformer.verification.torch_transformer",
})
FAMILY_MODULES = GROUPS  # the old name (deprecated)


class SkipCheck(Exception):
    """The reference library for a check is not installed."""


@dataclass(frozen=True)
class Check:
    """One row of the table: its group, the mathematical side (``name``), the network side
    (``reference``) and ``fn(dtype) -> max abs difference``."""

    group: str
    name: str  # the mathematical side
    reference: str  # the network side
    fn: Callable[[torch.dtype], float]

    @property
    def family(self) -> str:
        """The old name of ``group`` (deprecated)."""
        return self.group


_REGISTRY: list[Check] = []


def register(group: str, name: str, reference: str):
    """Decorator: add ``fn(dtype) -> max abs difference`` to the table, in ``group``."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {group_names()}, got {group!r}")

    def deco(fn):
        _REGISTRY.append(Check(group, name, reference, fn))
        return fn

    return deco


def group_names() -> list[str]:
    """The group names, in table order."""
    return list(GROUPS)


families = group_names  # the old name (deprecated)


def _load(group: str) -> str | None:
    try:
        importlib.import_module(GROUPS[group])
    except ModuleNotFoundError as e:  # the group module itself is not written yet
        if e.name == GROUPS[group]:
            return "not available in this version"
        raise
    return None


def run_checks(
    group_filter: list[str] | None = None, progress: Callable[[str], None] | None = None
):
    """Measure every registered check of the groups ``group_filter`` (default: all); yields
    result dicts (one per check: group, name, reference, status, errors; "family" is the
    group's old key)."""
    wanted = group_filter or group_names()
    for group in wanted:
        if group not in GROUPS:
            raise ValueError(f"group must be one of {group_names()}, got {group!r}")
    missing = {group: _load(group) for group in wanted}
    for group in wanted:
        if missing[group]:
            yield {"group": group, "family": group, "name": group, "reference": "-",
                   "status": "SKIP", "reason": missing[group], "errors": {}}
            continue
        for chk in [c for c in _REGISTRY if c.group == group]:
            if progress:
                progress(f"{group}: {chk.name}")
            row = {"group": group, "family": group, "name": chk.name,
                   "reference": chk.reference, "errors": {}}
            try:
                ok = True
                for dtype, tol in TOLERANCES.items():
                    err = float(chk.fn(dtype))
                    row["errors"][str(dtype).replace("torch.", "")] = err
                    ok = ok and err <= tol
                row["status"] = "PASS" if ok else "FAIL"
            except SkipCheck as e:
                row["status"], row["reason"] = "SKIP", str(e)
            yield row
