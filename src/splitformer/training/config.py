"""What a training run is: one ``TrainConfig``, from defaults, a TOML file and flags.

    TrainConfig()                          the built-in default: a small ViT evolution on digits
    TrainConfig.from_toml("run.toml")      a config file ([train] table or top-level keys)
    cfg.replace(lr=1e-3, epochs=5)         flags override the file

Every field is checked by name and type when the config is built: an unknown key or a value of
the wrong type is refused naming the key (``ConfigError``). The config is what a checkpoint
records, so a run can be resumed and its model rebuilt (``families.build_model``).

Time: a family has ``depth`` control sets (L layers, T = L). ``steps`` is N_t, the number of
time steps over [0, T] (a multiple of L: ``refine(steps / depth)``), so tau = T / N_t; ``tau``
may be given instead of ``steps``. At steps = depth (tau = 1) the evolution is the network.

``tau_choices`` (None: off) trains with a random time step per batch, T fixed: at every optimiser
step one tau is drawn from the choices and the batch runs on the model refined to it (the same
parameters). Each choice is the config's tau divided by an integer k >= 1 (``refinements()``
gives the k's); evaluation stays at the config's tau. The choices are a set: they are kept
sorted from the largest tau down, so "1,0.5" and "0.5,1" are the same config.

``patch_choices`` (None: off; the vit family) is the same in x: at every optimiser step one
patch size is drawn and the batch runs on ``model.with_patch_size(p)`` (the same parameters:
the patch kernel PI-resized and the position table resampled from the model's own, which is
built at ``patch``). Evaluation stays at ``patch``. Kept sorted from the coarsest grid (the
largest patch) down; each must divide the image size (checked when the model is built).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from fractions import Fraction
from pathlib import Path
from typing import Any

__all__ = ["MAX_STEPS", "ConfigError", "Setting", "TrainConfig", "patch_list", "read_toml",
           "refinement", "settings", "tau_list"]


class ConfigError(ValueError):
    """A bad configuration value: the message names the key and what was expected."""


# at most this many time steps N_t in one forward pass (the config's, and each tau_choices
# variant's N_t * k): a tau of 1e-300 would otherwise be accepted and the run never take a step
MAX_STEPS = 10_000


@dataclass(frozen=True)
class Setting:
    """How a ``TrainConfig`` key is given on the command line: its ``flag``, ``parse`` (the
    argparse type that reads the flag's text into the key's value) and ``help`` (a string, or a
    function giving it, for a help that lists a registry: the registries import the config);
    ``is_list``: the value is itself a list written with commas (``--tau-choices 1,0.5``), so a
    sweep makes an axis of it only by repeating the flag."""

    flag: str
    help: str | Callable[[], str]
    parse: Callable[[str], Any] = str
    is_list: bool = False

    def text(self, **registries: Any) -> str:
        """The help; ``{name}`` in it lists a registry the caller gives as ``name=`` (sorted,
        comma-separated): ``{families}``, the model families, which import this module."""
        if callable(self.help):
            return self.help()
        listed = {k: ", ".join(sorted(v)) for k, v in registries.items()}
        return self.help.format(**listed) if "{" in self.help else self.help


def _setting(default: Any, flag: str, help: str | Callable[[], str],
             parse: Callable[[str], Any] = str, *, is_list: bool = False) -> Any:
    """A dataclass field with its default and its ``Setting`` (in the field's metadata)."""
    return dataclasses.field(default=default,
                             metadata={"setting": Setting(flag, help, parse, is_list)})


def settings() -> dict[str, Setting]:
    """Every ``TrainConfig`` key and its ``Setting``, in the order of the fields (the order of
    ``splitformer train --help``)."""
    return {f.name: f.metadata["setting"] for f in fields(TrainConfig)}


def _name(text: str) -> str:
    """argparse type of a name (a choice): the text without surrounding whitespace."""
    return text.strip()


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


def patch_list(text: str) -> tuple[int, ...]:
    """argparse type of --patch-choices: comma-separated patch sizes ("4,7,14") as a tuple of
    ints; anything else is a one-line usage error. (Whether each divides the image size is
    checked when the model is built.)"""
    try:
        return tuple(int(part.strip()) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated patch sizes such as '4,7,14', got {text!r}") from None


# the registries a help lists (imported when a help is shown)
def _data_sets() -> str:
    from .data import DATASETS

    return ", ".join(sorted(DATASETS))


def _scheme_names() -> list[str]:
    from ..time.schemes import scheme_names

    return scheme_names()


def _integrators() -> Any:
    from ..time.integrators import INTEGRATORS

    return INTEGRATORS


def _kernel_names() -> Any:
    from ..operators.kernels import KERNEL_NAMES

    return KERNEL_NAMES


def _adjoint_names() -> list[str]:
    from ..control import adjoint_names

    return adjoint_names()


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run (see the module docstring; docs/training.md)."""

    # Each field carries its Setting (flag, argparse type, help): the one table that
    # `splitformer train`, `splitformer experiment` and the TOML reader take the keys from.
    # the model: a family and its data, the three choices (scheme, kernel, time grid), its size
    family: str = _setting("vit", "--family", "model family: {families}", _name)
    data: str = _setting("digits", "--data", lambda: "data set: " + _data_sets(), _name)
    data_dir: str | None = _setting(None, "--data-dir",
                                    "folder of the data set's files (default: the package's)")
    scheme: str = _setting("network", "--scheme", lambda: (  # a name of SCHEMES, or a string
        "'network' (the family's own), a name (" + ", ".join(_scheme_names())
        + ") or a scheme string"))
    integrator: str | None = _setting(None, "--integrator", lambda: (  # None: the scheme's own
        f"substep integrator: {', '.join(_integrators())} (default: the scheme's own)"), _name)
    kernel: str = _setting("softmax", "--kernel", lambda: (
        f"attention kernel: {', '.join(sorted(_kernel_names()))}"), _name)
    # token merging (ToMe as a quadrature coarsening): r nodes merged per layer; 0: off
    merge: int = _setting(0, "--merge", "token merging: nodes merged per layer (ToMe's r, "
                          "bipartite soft matching on the keys, proportional weights; 0: off)",
                          int)
    tau: float | None = _setting(None, "--tau", "time step (T = depth; tau must divide T)",
                                 float)
    # random time step per batch: each optimiser step draws one of these (each = tau / k, k >= 1)
    tau_choices: tuple[float, ...] | None = _setting(
        None, "--tau-choices", "train with a random time step per batch, drawn from these "
        "(comma-separated, e.g. '1,0.5,0.25'; each = tau / k)", lambda text: tau_list(text),
        is_list=True)
    # random patch size per batch (vit): each optimiser step draws one (the x-analogue)
    patch_choices: tuple[int, ...] | None = _setting(
        None, "--patch-choices", "train on a random patch size per batch, drawn from these "
        "(vit; comma-separated, e.g. '4,7,14'; each divides the image size; one set of "
        "parameters, evaluated at --patch)", lambda text: patch_list(text), is_list=True)
    # N_t; None: = depth (tau = 1), or T / tau when tau is given
    steps: int | None = _setting(None, "--steps",
                                 "N_t, the number of time steps (a multiple of depth)", int)
    depth: int = _setting(4, "--depth", "L, the number of control sets (T = L)", int)
    width: int = _setting(64, "--width", "feature width N_y", int)
    heads: int = _setting(4, "--heads", "attention heads", int)
    ffn_ratio: float = _setting(2.0, "--ffn-ratio", "hidden width of the FFN / width", float)
    # ViT/CvT patch size; None: about 4 x 4 patches
    patch: int | None = _setting(None, "--patch", "patch size (vit, cvt)", int)
    dropout: float = _setting(0.1, "--dropout", "dropout rate", float)
    seq_len: int = _setting(64, "--seq-len", "characters per example (lm)", int)
    # the control problem
    adjoint: str = _setting("backprop", "--adjoint", lambda: (
        f"gradient: {', '.join(_adjoint_names())}"), _name)
    # weight of the kinetic energy sum_n tau |(u^{n+1} - u^n) / tau|^2
    kinetic: float = _setting(0.0, "--kinetic", "weight of the kinetic energy of the path",
                              float)
    # weight of sum_n |theta^{n+1} - theta^n|^2 / tau
    control_reg: float = _setting(0.0, "--control-reg", "weight of the control regularity",
                                  float)
    # the optimiser
    epochs: int = _setting(50, "--epochs", "epochs", int)
    batch_size: int = _setting(64, "--batch-size", "examples per optimiser step", int)
    lr: float = _setting(2e-3, "--lr", "peak learning rate", float)
    weight_decay: float = _setting(0.05, "--weight-decay", "weight decay (matrices only)", float)
    optimizer: str = _setting("adamw", "--optimizer", "adamw or sgd", _name)
    momentum: float = _setting(0.9, "--momentum", "SGD momentum", float)
    schedule: str = _setting("cosine", "--schedule", "cosine or constant (after the warm-up)",
                             _name)
    # fraction of all optimiser steps with a linear warm-up
    warmup: float = _setting(0.05, "--warmup", "fraction of the steps with a linear warm-up",
                             float)
    grad_clip: float | None = _setting(1.0, "--grad-clip", "gradient norm clip", float)
    seed: int = _setting(0, "--seed", "seed (runs are deterministic for a seed)", int)
    # the run
    out: str | None = _setting(None, "--out",  # None: a fresh folder under runs/
                               "run folder (default: a fresh folder under runs/)")
    checkpoint_every: int = _setting(0, "--checkpoint-every",  # 0: every epoch
                                     "optimiser steps between checkpoints (0: every epoch)", int)
    log_every: int = _setting(10, "--log-every", "optimiser steps between metrics lines", int)
    threads: int | None = _setting(None, "--threads", "torch threads", int)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), hints[f.name])
        if self.tau_choices is not None:  # a list from TOML or JSON: a tuple of floats
            try:
                # a set: kept from the largest tau down, whatever the order given
                choices = tuple(sorted((float(v) for v in self.tau_choices), reverse=True))
            except OverflowError:
                raise ConfigError(f"tau_choices must hold finite numbers > 0, got "
                                  f"{list(self.tau_choices)!r}") from None
            object.__setattr__(self, "tau_choices", choices)
        if self.patch_choices is not None:  # a set: from the coarsest grid (largest patch) down
            object.__setattr__(self, "patch_choices", _patch_choices(self.patch_choices))
        self._check_values()

    def _check_values(self) -> None:
        positive = ("width", "heads", "depth", "epochs", "batch_size", "seq_len", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("lr", "ffn_ratio"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")
        for name in ("weight_decay", "kinetic", "control_reg", "momentum"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.patch is not None and self.patch < 1:
            raise ConfigError(f"patch must be None or >= 1, got {self.patch!r}")
        if self.merge < 0:
            raise ConfigError(f"merge must be >= 0 (nodes merged per layer), got {self.merge!r}")
        if self.merge and self.adjoint in ("checkpoint", "reversible"):
            raise ConfigError(f"merge={self.merge} needs adjoint 'backprop': adjoint "
                              f"{self.adjoint!r} recomputes or inverts each step from its "
                              "start, where the token grid was finer than the merge leaves it")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"warmup must be a fraction in [0, 1), got {self.warmup!r}")
        if self.width % self.heads:
            raise ConfigError(f"heads={self.heads} must divide width={self.width}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ConfigError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.schedule not in ("cosine", "constant"):
            raise ConfigError(f"schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0, got {self.checkpoint_every!r}")
        if self.grad_clip is not None and not (math.isfinite(self.grad_clip)
                                               and self.grad_clip > 0):
            raise ConfigError(f"grad_clip must be None or a finite number > 0, got "
                              f"{self.grad_clip!r}")
        from ..control import adjoint_names

        if self.adjoint not in adjoint_names():
            raise ConfigError(f"adjoint must be one of {adjoint_names()}, got {self.adjoint!r}")
        if self.adjoint == "reversible" and self.scheme.strip() != "reversible":
            raise ConfigError("adjoint 'reversible' needs scheme 'reversible' (the steps it "
                              f"inverts), got scheme {self.scheme!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads!r}")
        self.num_steps()  # steps / tau consistency
        self.refinements()  # tau_choices: each divides the config's tau
        if self.patch_choices is not None and self.family != "vit":
            raise ConfigError(f"patch_choices needs family 'vit' (a patch grid whose kernel is "
                              f"PI-resized and position table resampled), got family "
                              f"{self.family!r}" + (" (CvT's convolutional embedding and Q/K/V "
                                                    "are fixed-stride convolutions on a regular "
                                                    "grid)" if self.family == "cvt" else ""))

    def num_steps(self) -> int:
        """N_t: ``steps``, or T / tau, or depth (tau = 1); a multiple of depth."""
        T = self.depth
        if self.tau is not None:
            if not (math.isfinite(self.tau) and self.tau > 0):
                raise ConfigError(f"tau must be a finite number > 0, got {self.tau!r}")
            if not T / self.tau <= MAX_STEPS + 0.5:
                raise ConfigError(f"tau must give at most {MAX_STEPS} time steps per forward "
                                  f"pass (MAX_STEPS), got tau={self.tau:g}: N_t = T / tau = "
                                  f"{T / self.tau:g}")
            n = round(T / self.tau)
            if abs(n * self.tau - T) > 1e-9 * T:
                raise ConfigError(f"tau={self.tau:g} must divide T = depth = {T}")
            if self.steps is not None and self.steps != n:
                raise ConfigError(f"steps={self.steps} and tau={self.tau:g} disagree: T / tau = "
                                  f"{n} (give one of them)")
        else:
            n = self.steps if self.steps is not None else T
        if n < 1 or n % T:
            raise ConfigError(f"steps must be a positive multiple of depth={T} (one control set "
                              f"per unit of time), got {n}")
        if n > MAX_STEPS:
            raise ConfigError(f"steps must be at most {MAX_STEPS} time steps per forward pass "
                              f"(MAX_STEPS), got {n}")
        return n

    def refinements(self) -> tuple[int, ...] | None:
        """For each of ``tau_choices``, k = (config tau) / choice, an integer >= 1 (the variant
        a choice selects is ``model.refine(k)`` of the model at the config's tau, T / N_t);
        None without ``tau_choices``. A choice that does not divide the config's tau, is not a
        finite number > 0, or gives the k of another choice is refused naming ``tau_choices``."""
        if self.tau_choices is None:
            return None
        if not self.tau_choices:
            raise ConfigError("tau_choices must hold at least one time step (or be unset), got "
                              "an empty list")
        tau = self.depth / self.num_steps()
        ks: list[int] = []
        for c in self.tau_choices:
            if not (math.isfinite(c) and c > 0):
                raise ConfigError(f"tau_choices must hold finite numbers > 0, got {c!r}")
            if not self.depth / c <= MAX_STEPS + 0.5:
                raise ConfigError(f"tau_choices must give at most {MAX_STEPS} time steps per "
                                  f"forward pass (MAX_STEPS), got {c:g}: N_t = T / tau = "
                                  f"{self.depth / c:g}")
            k = refinement(tau, c, "tau_choices")
            if k in ks:
                raise ConfigError(f"tau_choices must not repeat a time step, got {c:g} twice "
                                  f"(in {[float(v) for v in self.tau_choices]})")
            ks.append(k)
        return tuple(ks)

    # -- building -------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> TrainConfig:
        """A new config with ``changes`` (None values are ignored: an unset flag)."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; known: {sorted(self.keys())}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; known: {sorted(cls.keys())}")
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path) -> TrainConfig:
        """Keys at the top level of the file, or in a ``[train]`` table; a bad key or value is
        refused naming the file and the key."""
        values = cls.toml_values(path)
        try:
            return cls.from_dict(values)
        except ConfigError as e:
            raise ConfigError(f"config file {str(path)!r}: {e}") from None

    @classmethod
    def toml_values(cls, path: str | Path) -> dict[str, Any]:
        """The keys of a config file (top level or ``[train]``), each known and of its field's
        type (``ConfigError`` naming the file and the key); the values' ranges and how they
        fit together are checked when a config is built from them."""
        p = Path(path)
        values = read_toml(p)
        if "train" in values:
            if set(values) != {"train"} or not isinstance(values["train"], dict):
                raise ConfigError(f"config file {str(p)!r}: put every key in [train] or none")
            values = values["train"]
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise ConfigError(f"config file {str(p)!r}: unknown keys {unknown}; known: "
                              f"{sorted(cls.keys())}")
        hints = typing.get_type_hints(cls)
        for key, value in values.items():
            try:
                _check_type(key, value, hints[key])
            except ConfigError as e:
                raise ConfigError(f"config file {str(p)!r}: {e}") from None
        return values

    def to_dict(self) -> dict[str, Any]:
        """Every key and its value, JSON-friendly (``tau_choices`` as a list of floats,
        ``patch_choices`` of ints), so that
        ``from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg``."""
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def read_toml(path: str | Path, error: type[ValueError] = ConfigError,
              what: str = "config file") -> dict[str, Any]:
    """The tables of a TOML file; a missing or invalid file raises ``error`` naming it (one
    line)."""
    p = Path(path)
    if p.is_dir():
        raise error(f"{what} {str(p)!r} is a folder, expected a TOML file")
    if not p.is_file():
        raise error(f"{what} {str(p)!r} does not exist")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise error(f"{what} {str(p)!r} is not valid TOML: {' '.join(str(e).split())}") from None


def _patch_choices(values: Any) -> tuple[int, ...]:
    """``patch_choices`` as a tuple of distinct ints >= 1, largest first (ConfigError naming
    the key otherwise)."""
    given = list(values)
    if not given:
        raise ConfigError("patch_choices must hold at least one patch size (or be unset), got "
                          "an empty list")
    for v in given:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"patch_choices must hold integers >= 1 (patch sizes in pixels), "
                              f"got {v!r} in {given!r}")
    if len(set(given)) != len(given):
        raise ConfigError(f"patch_choices must not repeat a patch size, got {given!r}")
    return tuple(sorted(given, reverse=True))


def refinement(tau: float, finer: float, key: str) -> int:
    """k = tau / finer, an integer >= 1 (to a relative 1e-9): the ``refine(k)`` that takes a
    model at time step ``tau`` to ``finer``; otherwise a ConfigError naming ``key``."""
    k = round(tau / finer) if finer > 0 else 0
    if k < 1 or abs(k * finer - tau) > 1e-9 * tau:
        raise ConfigError(f"{key} must hold time steps tau / k (k = 1, 2, ...) of the config's "
                          f"tau = T / N_t = {tau:g}; {finer:g} is not one")
    return k


def _check_type(name: str, value: Any, hint: Any) -> None:
    """value matches the field's annotation (int, float, str, bool, tuple[float, ...],
    X | None); an int is a float, a bool is not an int; a tuple[float, ...] is a list or tuple
    of numbers (no bools)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for t in options:
        if typing.get_origin(t) is tuple:
            if isinstance(value, (list, tuple)) and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                return
            continue
        if t is type(None) and value is None:
            return
        if t is bool and isinstance(value, bool):
            return
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if t is str and isinstance(value, str):
            return
    wanted = " or ".join("None" if t is type(None)
                         else "a list of numbers" if typing.get_origin(t) is tuple
                         else t.__name__ for t in options)
    raise ConfigError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")
