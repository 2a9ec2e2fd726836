"""The correspondence table: each claim of the paper (or of an interop map), measured.

A check is a function ``fn(dtype) -> float`` that builds random-weight reference modules, runs
the splitformer counterpart and returns the max abs difference. ``register`` adds one to the
registry under a family; ``run_checks`` measures them in float64 and float32 against the
tolerances (1e-10 and 1e-5). A check whose reference library is missing raises ``SkipCheck``.
Family modules are imported lazily so that the core has no optional dependency.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Check", "SkipCheck", "TOLERANCES", "families", "register", "run_checks"]

TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5}

# family name -> module that registers its checks on import
FAMILY_MODULES = {
    "core": "splitformer.verification.core",
    "bert": "splitformer.verification.hf_bert",
    "vit": "splitformer.verification.hf_vit",
    "cvt": "splitformer.verification.hf_cvt",
    "timm": "splitformer.verification.timm_vit",
    "gpt2": "splitformer.verification.hf_gpt2",
    "transformer": "splitformer.verification.torch_transformer",
}


class SkipCheck(Exception):
    """The reference library for a check is not installed."""


@dataclass(frozen=True)
class Check:
    family: str
    name: str  # the mathematical side
    reference: str  # the network side
    fn: Callable[[torch.dtype], float]


_REGISTRY: list[Check] = []


def register(family: str, name: str, reference: str):
    """Decorator: add ``fn(dtype) -> max abs difference`` to the table."""

    def deco(fn):
        _REGISTRY.append(Check(family, name, reference, fn))
        return fn

    return deco


def families() -> list[str]:
    return list(FAMILY_MODULES)


def _load(family: str) -> str | None:
    try:
        importlib.import_module(FAMILY_MODULES[family])
    except ModuleNotFoundError as e:  # the family module itself is not written yet
        if e.name == FAMILY_MODULES[family]:
            return "not available in this version"
        raise
    return None


def run_checks(
    family_filter: list[str] | None = None, progress: Callable[[str], None] | None = None
):
    """Measure every registered check; yields result dicts (one per check)."""
    wanted = family_filter or families()
    for fam in wanted:
        if fam not in FAMILY_MODULES:
            raise ValueError(f"family must be one of {families()}, got {fam!r}")
    missing = {fam: _load(fam) for fam in wanted}
    for fam in wanted:
        if missing[fam]:
            yield {"family": fam, "name": fam, "reference": "-", "status": "SKIP",
                   "reason": missing[fam], "errors": {}}
            continue
        for chk in [c for c in _REGISTRY if c.family == fam]:
            if progress:
                progress(f"{fam}: {chk.name}")
            row = {"family": fam, "name": chk.name, "reference": chk.reference, "errors": {}}
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
