"""The correspondence table: each claim of the paper (or of an interop map), measured.

A check is a function ``fn(dtype) -> float`` that builds random-weight reference modules, runs
the splitformer counterpart and returns the max abs difference. ``register`` adds one to the
registry under a suite: the checks measured against one reference (core: the paper's claims
against torch.nn; bert, vit, cvt, gpt2: transformers; timm; transformer: nn.Transformer).
``run_checks`` measures them in float64 and float32 against the tolerances (1e-10 and 1e-5). A
check whose reference library is missing raises ``SkipCheck``. Suite modules (``SUITES``) are
imported lazily so that the core has no optional dependency.

"Family" is the model family (``training.families``); the names that used it here for a suite
are kept as deprecated aliases: ``FAMILY_MODULES`` = ``SUITES``, ``families()`` = ``suites()``,
``Check.family`` = ``Check.suite``, and each result row carries ``"family"`` next to ``"suite"``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["SUITES", "Check", "SkipCheck", "TOLERANCES", "families", "register", "run_checks",
           "suites"]

TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5}

# suite name -> module that registers its checks on import
SUITES: dict[str, str] = {
    "core": "splitformer.verification.core",
    "bert": "splitformer.verification.hf_bert",
    "vit": "splitformer.verification.hf_vit",
    "cvt": "splitformer.verification.hf_cvt",
    "timm": "splitformer.verification.timm_vit",
    "gpt2": "splitformer.verification.hf_gpt2",
    "transformer": "splitformer.verification.torch_transformer",
}
FAMILY_MODULES = SUITES  # the old name (deprecated)


class SkipCheck(Exception):
    """The reference library for a check is not installed."""


@dataclass(frozen=True)
class Check:
    """One row of the table: its suite, the mathematical side (``name``), the network side
    (``reference``) and ``fn(dtype) -> max abs difference``."""

    suite: str
    name: str  # the mathematical side
    reference: str  # the network side
    fn: Callable[[torch.dtype], float]

    @property
    def family(self) -> str:
        """The old name of ``suite`` (deprecated)."""
        return self.suite


_REGISTRY: list[Check] = []


def register(suite: str, name: str, reference: str):
    """Decorator: add ``fn(dtype) -> max abs difference`` to the table, in ``suite``."""
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {suites()}, got {suite!r}")

    def deco(fn):
        _REGISTRY.append(Check(suite, name, reference, fn))
        return fn

    return deco


def suites() -> list[str]:
    """The suite names, in table order."""
    return list(SUITES)


families = suites  # the old name (deprecated)


def _load(suite: str) -> str | None:
    try:
        importlib.import_module(SUITES[suite])
    except ModuleNotFoundError as e:  # the suite module itself is not written yet
        if e.name == SUITES[suite]:
            return "not available in this version"
        raise
    return None


def run_checks(
    suite_filter: list[str] | None = None, progress: Callable[[str], None] | None = None
):
    """Measure every registered check of the suites ``suite_filter`` (default: all); yields
    result dicts (one per check: suite, name, reference, status, errors; "family" is the
    suite's old key)."""
    wanted = suite_filter or suites()
    for suite in wanted:
        if suite not in SUITES:
            raise ValueError(f"suite must be one of {suites()}, got {suite!r}")
    missing = {suite: _load(suite) for suite in wanted}
    for suite in wanted:
        if missing[suite]:
            yield {"suite": suite, "family": suite, "name": suite, "reference": "-",
                   "status": "SKIP", "reason": missing[suite], "errors": {}}
            continue
        for chk in [c for c in _REGISTRY if c.suite == suite]:
            if progress:
                progress(f"{suite}: {chk.name}")
            row = {"suite": suite, "family": suite, "name": chk.name,
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
