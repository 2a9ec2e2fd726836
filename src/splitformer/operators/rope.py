"""Rotary positions (RoPE) of the Llama-family decoders: a kernel on the token coordinates.

Rotary positions rotate the pairs (i, i + d/2) of the first d features of every query and key
by the angle x w_i at the token coordinate x (the "rotate half" layout of GPT-NeoX / Llama), so

    <R_x q, R_x' k> = sum_i Re[ (q_i + i q_{i+d/2}) conj(k_i + i k_{i+d/2}) e^{i w_i (x - x')} ]

and the score is a function of x - x' only: a convolution-type kernel in x whose spectrum is
the set of frequencies w_i (docs/math.md 3.12, 3.18). Every ``rope_type`` of transformers
changes that spectrum, or the coordinates, or the kernel's temperature, to read a trained kernel
on a longer interval than the one it was trained on (n0 tokens):

- default: w_i = b^(-2i/d), i = 0 .. d/2 - 1 (b = rope_theta).
- linear (Position Interpolation): the coordinates x -> x / s, i.e. w_i -> w_i / s: a grid s
  times finer on the trained interval, the kernel unchanged as a function of x / s.
- dynamic (NTK-aware): a change of the base, b -> b', chosen from the current length n: every
  frequency's bandwidth changes, the highest (w_0 = 1) stays and the lowest is interpolated by
  s n / n0 - (s - 1).
- yarn: per-frequency-band coordinate scaling (bands that turn many times on the trained
  interval keep x, bands that turn less than once take x / s, a linear ramp between) plus a
  temperature: cos and sin times m = 0.1 ln s + 1, so the scores times m^2 (the log n
  correction of the softmax's sharpness at longer lengths).
- llama3: band-wise smoothing between the scaled (w / s) and unscaled frequencies, by
  wavelength against the trained length.
- longrope: per-frequency factors w_i -> w_i / f_i (the short factors up to n0, the long ones
  beyond) plus a scaling of cos and sin.
- proportional (Gemma 4): default frequencies with the exponent over the whole head, on the
  first fraction p of the pairs; the other pairs have frequency 0 (their angle is 0: they pass
  unrotated) and the result is divided by s.

and one of splitformer's own (``OWN_ROPE_TYPES``; docs/context.md), derived from the kernel:

- bandwidth: each frequency band keeps the phases it was trained on. On [0, n0) the band w_i
  sweeps the phases [0, w_i n0); a band that turns at least once (w_i n0 >= 2 pi) has seen
  every phase and may keep w_i (its resolution, the kernel's local bandwidth, unchanged); a
  band that turns less than once is read at the coordinates x / s, w_i -> w_i / s, the largest
  frequency whose phases on [0, s n0) stay inside the trained ones. The bands kept are those
  that turn at least ``turns`` times in n0: 1 is the derivation's bound; the default, 32
  (yarn's beta_fast), also slows the bands in between (the phase argument is per band, the
  kernel's phases are joint) and measured better at every document and factor compared
  (docs/context.md). And the log n temperature of the softmax (3.14) at each query's own
  support: the query at x (x + 1 nodes x' <= x) is scaled by max(1, ln(x + 1) / ln n0), so
  nothing changes on the trained interval.

``RotaryPositions`` holds one such kernel and computes its angles once per forward, for all
layers (``angles``: cos and sin, (B|1, 1, N, d)); ``rotate_half`` applies them to a head's
queries or keys. Both reproduce transformers 5's ``LlamaRotaryEmbedding`` and
``apply_rotary_pos_emb`` bitwise (float32 angles, cast to the model's dtype afterwards, also
for a float64 model), without importing transformers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

__all__ = ["BANDWIDTH_TURNS", "OWN_ROPE_TYPES", "ROPE_TYPES", "RotaryAngles", "RotaryPositions",
           "check_extension", "rotate_half"]

#: the rope_type values of transformers 5.25 for 1-D token coordinates ("default" plus the keys
#: of ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``)
ROPE_TYPES: tuple[str, ...] = (
    "default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional",
)
#: splitformer's own rope types (no transformers config holds them: ``to_hf`` refuses them)
OWN_ROPE_TYPES: tuple[str, ...] = ("bandwidth",)
BANDWIDTH_TURNS = 32
"""bandwidth's default ``turns``: the bands that turn at least 32 times in n0 are kept (yarn's
beta_fast; the derivation's bound is 1, the measured best 32: docs/context.md)."""

# the parameters each rope_type's formula reads without a default (transformers indexes them)
_REQUIRED: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
    "proportional": (),
    "bandwidth": ("factor", "original_max_position_embeddings"),
}


# the parameters each rope_type reads (transformers' names; rope_theta for every type)
_READS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings",
                 "attention_factor"),
    "proportional": ("factor", "partial_rotary_factor"),
    "bandwidth": ("factor", "original_max_position_embeddings", "temperature", "turns"),
}


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# the types whose factor may be None: the factor then comes from the lengths
_FACTOR_MAY_BE_NONE = ("yarn", "longrope", "bandwidth")


def _check_factor(rope_type: str, factor: Any) -> None:
    """ValueError naming ``factor`` unless it is a finite number >= 1 (or None where the type
    reads the lengths instead)."""
    none_ok = rope_type in _FACTOR_MAY_BE_NONE
    if not ((factor is None and none_ok) or (_real(factor) and factor >= 1)):
        raise ValueError(f"factor: rope_type {rope_type!r} needs a finite factor >= 1 "
                         f"(the new length over the trained one)"
                         f"{', or None' if none_ok else ''}, got {factor!r}")


def check_extension(rope_type: str, parameters: Mapping[str, Any]) -> None:
    """The user's side of a change of rope (``with_rope``): ValueError naming the parameter
    for one the type does not read (a misspelling would be kept and ignored), a factor that is
    not a finite number >= 1 (None where the type reads the length instead: yarn, longrope,
    bandwidth), a rope_theta that is not a finite number > 0, a trained length that is not an
    int >= 1. The formulas' own checks follow in ``RotaryPositions``."""
    if not isinstance(rope_type, str) or rope_type not in _READS:
        raise ValueError(f"rope_type: unknown rope_type {rope_type!r}; one of "
                         f"{', '.join(ROPE_TYPES + OWN_ROPE_TYPES)}")
    allowed = (*_READS[rope_type], "rope_theta")
    for key in parameters:
        if key not in allowed:
            raise ValueError(f"{key}: rope_type {rope_type!r} does not read {key!r}; it reads "
                             f"{', '.join(allowed)}")
    if "factor" in parameters:
        _check_factor(rope_type, parameters["factor"])
    if "rope_theta" in parameters:
        base = parameters["rope_theta"]
        if not (_real(base) and base > 0):
            raise ValueError(f"rope_theta: the base must be a finite number > 0, got {base!r}")
    n0 = parameters.get("original_max_position_embeddings", 1)
    if isinstance(n0, bool) or not isinstance(n0, int) or n0 < 1:
        raise ValueError(f"original_max_position_embeddings: the trained length, an int >= 1, "
                         f"got {n0!r}")


class _Parameters(Mapping[str, Any]):
    """A read-only, hashable mapping (lists stored as tuples): the frozen rope_parameters."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._items = {str(k): _freeze(v) for k, v in items.items()}

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items())))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._items == {k: _freeze(v) for k, v in other.items()}

    def __repr__(self) -> str:
        return repr(self._items)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _Parameters(value)
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _yarn_mscale(scale: float, mscale: float = 1) -> float:
    """YaRN's temperature m(s) = 0.1 mscale ln s + 1 (1 for s <= 1; Peng et al. 2023, eq. 21)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _exponents(dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """2i / d for i = 0 .. d/2 - 1, float32 (the integer arange cast, as transformers has it)."""
    return torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim


@dataclass(frozen=True)
class RotaryPositions:
    """The rotary kernel of one attention: frequencies w_i on ``dim`` features of a head.

    dim: the rotated features of a head (head_dim * partial_rotary_factor, even; for
        "proportional" the whole head_dim: its unrotated pairs carry frequency 0).
    base: rope_theta, b.
    rope_type: one of ``ROPE_TYPES`` or ``OWN_ROPE_TYPES``.
    parameters: the other rope_parameters (factor, original_max_position_embeddings,
        beta_fast, short_factor, ...), named as transformers names them; stored read-only and
        hashable (lists as tuples). partial_rotary_factor is kept here for the round trip (and
        read by "proportional"); ``dim`` already holds its effect.
    max_position_embeddings: the config's max_position_embeddings (read by "dynamic", and by
        "yarn" / "longrope" when their factor is not given).
    head_dim: the head's features (for ``describe``; None = not known).

    The formula of each rope_type (s = factor, n0 = the trained length, n = the current
    length = max position + 1):

    - default: w_i = b^(-2i/d).
    - linear: w_i = b^(-2i/d) / s (coordinates x -> x / s).
    - dynamic: w_i = b'^(-2i/d), b' = b (s n' / n0 - (s - 1))^(d / (d - 2)),
      n' = max(n, n0), n0 = max_position_embeddings.
    - yarn: w_i = (1 - g_i) b^(-2i/d) + g_i b^(-2i/d) / s with the ramp
      g_i = clamp((i - lo) / (hi - lo), 0, 1) between the dimensions
      lo, hi = d ln(n0 / (2 pi beta)) / (2 ln b) at beta = beta_fast (32), beta_slow (1)
      (floor / ceil when truncate, the default; clipped to [0, d - 1]), n0 =
      original_max_position_embeddings; cos and sin times attention_factor, by default
      m(s) = 0.1 ln s + 1, or m(s, mscale) / m(s, mscale_all_dim) when both are given.
    - llama3: with the wavelength l_i = 2 pi / w_i of the default w_i and n0 =
      original_max_position_embeddings: w_i if l_i < n0 / high_freq_factor, w_i / s if
      l_i > n0 / low_freq_factor, else (1 - a_i) w_i / s + a_i w_i with
      a_i = (n0 / l_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
    - longrope: w_i = b^(-2i/d) / f_i, f = short_factor for n <= n0 and long_factor for
      n > n0 (n0 = original_max_position_embeddings); cos and sin times attention_factor, by
      default sqrt(1 + ln s / ln n0) (1 for s <= 1; s = factor, or max_position_embeddings / n0).
    - proportional: w_i = b^(-2i/D) / s for i < floor(p D / 2) and w_i = 0 up to D / 2
      (D = head_dim = dim, p = partial_rotary_factor, s = factor, default 1).
    - bandwidth (ours): w_i = b^(-2i/d) if w_i n0 >= 2 pi T, else b^(-2i/d) / s (n0 =
      original_max_position_embeddings; s = factor, or max(1, n / n0) when factor is None);
      queries at x times max(1, ln(x + 1) / ln n0)
      (``query_temperature``; parameter temperature: "log", the default, or "none"; turns T:
      the turns in n0 from which a band is kept, default ``BANDWIDTH_TURNS`` = 32).

    Dynamic differs from transformers in one way: transformers' ``dynamic_rope_update`` is
    stateful (it keeps the frequencies of the longest forward seen beyond n0 until a forward
    shorter than n0 resets them), ours are a function of the current forward's length only.
    The two agree for any sequence of forwards whose max position never decreases
    (generation), and after every forward that does not go beyond n0.
    """

    dim: int
    base: float
    rope_type: str = "default"
    parameters: Mapping[str, Any] = field(default_factory=dict)
    max_position_embeddings: int | None = None
    head_dim: int | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES + OWN_ROPE_TYPES:
            raise ValueError(f"rope_type: unknown rope_type {self.rope_type!r}; "
                             f"one of {', '.join(ROPE_TYPES + OWN_ROPE_TYPES)}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 2 \
                or self.dim % 2:
            raise ValueError(f"dim: the rotated features must be a positive even int, "
                             f"got {self.dim!r}")
        if not self.base > 0:
            raise ValueError(f"rope_theta: the base must be > 0, got {self.base!r}")
        if self.rope_type == "bandwidth" and "turns" not in self.parameters:
            # the default written out: a stored kernel keeps the turns it was read with
            params = _Parameters({**self.parameters, "turns": BANDWIDTH_TURNS})
        else:
            params = _Parameters(self.parameters)
        object.__setattr__(self, "parameters", params)
        for key in _REQUIRED[self.rope_type]:
            # yarn's factor may be None: then max_position_embeddings / original (as transformers)
            # bandwidth's: then s = max(1, n / n0) from the current length n
            if key not in params or (params[key] is None and (self.rope_type, key) not in (
                    ("yarn", "factor"), ("bandwidth", "factor"))):
                raise ValueError(f"{key}: rope_type {self.rope_type!r} needs the parameter "
                                 f"{key!r} in rope_parameters")
        needs_length = self.rope_type == "dynamic" or (
            self.rope_type in ("yarn", "longrope") and params.get("factor") is None)
        if needs_length and self.max_position_embeddings is None:
            raise ValueError(f"max_position_embeddings: rope_type {self.rope_type!r} needs "
                             "max_position_embeddings here")
        if self.rope_type == "bandwidth":
            _check_factor("bandwidth", params["factor"])
            n0 = params["original_max_position_embeddings"]
            if isinstance(n0, bool) or not isinstance(n0, int) or n0 < 2:
                raise ValueError(f"original_max_position_embeddings: rope_type 'bandwidth' "
                                 f"needs the trained length, an int >= 2, got {n0!r}")
            turns = params["turns"]
            if not (_real(turns) and turns > 0):
                raise ValueError(f"turns: rope_type 'bandwidth' keeps the bands that turn at "
                                 f"least this many times in n0, a finite number > 0, got "
                                 f"{turns!r}")
            if params.get("temperature", "log") not in ("log", "none"):
                raise ValueError(f"temperature: rope_type 'bandwidth' takes 'log' or 'none', "
                                 f"got {params['temperature']!r}")
        if self.rope_type == "longrope":
            for key in ("short_factor", "long_factor"):
                if len(params[key]) != self.dim // 2:
                    raise ValueError(f"{key}: longrope needs dim // 2 = {self.dim // 2} "
                                     f"factors, got {len(params[key])}")

    # ------------------------------------------------------------------ config
    @classmethod
    def from_config(cls, config: Any, head_dim: int | None = None, *,
                    layer_type: str | None = None) -> RotaryPositions:
        """The rotary positions of a transformers config (LlamaConfig, Qwen2Config, ...).

        Reads ``config.rope_parameters`` (transformers 5; ``layer_type`` picks one entry of a
        per-layer-type dict such as Gemma3's "sliding_attention" / "full_attention"), the head
        size (``head_dim`` if given, else config.head_dim or hidden_size //
        num_attention_heads), partial_rotary_factor (in rope_parameters, else on the config)
        and max_position_embeddings. ValueError naming the key for an unknown rope_type or a
        missing parameter.
        """
        c = config.to_dict()  # a transformers config's settings (.get: a family lacks some)
        params = c.get("rope_parameters")
        if not params:
            params = {}
        if not isinstance(params, Mapping):
            raise ValueError(f"rope_parameters: expected a dict, got {type(params).__name__}")
        labels = vars(config).get("_rope_type_labels") or c.get("layer_types") or ()
        nested = [k for k, v in params.items() if k in labels or isinstance(v, Mapping)]
        if layer_type is not None:
            if layer_type not in params or not isinstance(params[layer_type], Mapping):
                raise ValueError(f"rope_parameters: no entry for layer_type {layer_type!r} "
                                 f"(entries: {', '.join(nested) or 'none'})")
            params = params[layer_type]
        elif nested:
            raise ValueError(f"rope_parameters: one entry per layer type "
                             f"({', '.join(nested)}): pass layer_type=")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type: unknown rope_type {rope_type!r} in rope_parameters; "
                             f"one of {', '.join(ROPE_TYPES)}")
        base = params.get("rope_theta", c.get("rope_theta"))
        if base is None:
            raise ValueError("rope_theta: missing from rope_parameters and the config")
        if head_dim is None:
            head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        factor = params.get("partial_rotary_factor")
        if factor is None:
            factor = c.get("partial_rotary_factor")
        factor = 1.0 if factor is None else factor
        dim = head_dim if rope_type == "proportional" else int(head_dim * factor)
        return cls(dim=dim, base=base, rope_type=rope_type,
                   parameters={k: v for k, v in params.items()
                               if k not in ("rope_type", "rope_theta")},
                   max_position_embeddings=c.get("max_position_embeddings"),
                   head_dim=head_dim)

    def to_parameters(self) -> dict[str, Any]:
        """The rope_parameters dict: rope_type, rope_theta and ``parameters`` (lists again)."""
        out: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.base}
        out.update({k: _thaw(v) for k, v in self.parameters.items()})
        return out

    def record(self) -> dict[str, Any]:
        """The fields as JSON holds them (``parameters`` as ``to_parameters`` gives them): what
        a stored model keeps (``interop.hf_llama``, ``training.model_record``)."""
        return {"dim": self.dim, "base": self.base, "rope_type": self.rope_type,
                "parameters": self.to_parameters(),
                "max_position_embeddings": self.max_position_embeddings,
                "head_dim": self.head_dim}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RotaryPositions:
        """The inverse of ``record`` (a bandwidth kernel recorded without ``turns`` was written
        before its default became ``BANDWIDTH_TURNS``: it read turns 1)."""
        params = {k: v for k, v in record["parameters"].items()
                  if k not in ("rope_type", "rope_theta")}
        if record["rope_type"] == "bandwidth":
            params.setdefault("turns", 1)
        return cls(dim=record["dim"], base=record["base"], rope_type=record["rope_type"],
                   parameters=params, max_position_embeddings=record["max_position_embeddings"],
                   head_dim=record.get("head_dim"))

    @property
    def trained_length(self) -> int | None:
        """n0, the length the kernel was trained on, as transformers' configs record it:
        original_max_position_embeddings where the type keeps it, max_position_embeddings / s
        for linear and proportional (the config's length is the extended one), else
        max_position_embeddings."""
        p, n = self.parameters, self.max_position_embeddings
        if p.get("original_max_position_embeddings") is not None:
            return int(p["original_max_position_embeddings"])
        if n is not None and self.rope_type in ("linear", "proportional"):
            return int(n / p.get("factor", 1.0))
        return n

    def extended(self, rope_type: str, **parameters: Any) -> RotaryPositions:
        """This kernel (features, base, trained length n0 = ``trained_length``) read by
        ``rope_type`` with ``parameters`` (transformers' names; ``check_extension``):
        original_max_position_embeddings defaults to n0 for the types that read it,
        rope_theta replaces the base, and max_position_embeddings becomes the length the
        kernel is read for, s n0, as transformers' configs write it (n0 for dynamic, whose
        formula reads it as the trained length)."""
        check_extension(rope_type, parameters)
        params = dict(parameters)
        base = params.pop("rope_theta", self.base)
        n0 = self.trained_length
        if "original_max_position_embeddings" in _READS[rope_type] and \
                "original_max_position_embeddings" not in params:
            if n0 is None:
                raise ValueError(f"original_max_position_embeddings: rope_type {rope_type!r} "
                                 "needs the trained length, and this kernel does not record it")
            params["original_max_position_embeddings"] = n0
        length = params.get("original_max_position_embeddings", n0)
        factor = params.get("factor")
        if rope_type != "dynamic" and length is not None and factor is not None:
            length = int(length * factor)
        return RotaryPositions(dim=self.dim, base=base, rope_type=rope_type, parameters=params,
                               max_position_embeddings=length, head_dim=self.head_dim)

    @property
    def scales_queries(self) -> bool:
        """Whether the kernel multiplies its queries by a temperature
        (``query_temperature``: bandwidth's log n factor)."""
        return self.rope_type == "bandwidth" and \
            self.parameters.get("temperature", "log") == "log"

    # ------------------------------------------------------------------ frequencies
    def _factor(self) -> float:
        factor = self.parameters.get("factor")
        if factor is None:  # yarn, longrope: the ratio of the lengths (DeepSeek-V3, Phi-3)
            factor = (self.max_position_embeddings
                      / self.parameters["original_max_position_embeddings"])
        return factor

    def inv_freq(self, length: int | torch.Tensor | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
        """The frequencies w_i, (dim // 2,) float32, bitwise as transformers' init function
        ``ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=length)`` gives them (the
        model's ``compute_default_rope_parameters`` for "default").

        length: max position + 1 of the current forward (read by dynamic and longrope; None =
        not beyond the trained length). A 0-d tensor follows transformers' tensor arithmetic
        (dynamic's new base in the tensor's dtype, as its forward computes it); an int its
        Python-float arithmetic.
        """
        p, dim, kind = self.parameters, self.dim, self.rope_type
        if kind == "default":
            return 1.0 / (self.base ** (torch.arange(0, dim, 2, dtype=torch.float,
                                                     device=device) / dim))
        if kind in ("linear", "llama3"):
            inv = 1.0 / (self.base ** _exponents(dim, device))
            if kind == "linear":
                return inv / p["factor"]
            return _llama3(inv, p["factor"], p["low_freq_factor"], p["high_freq_factor"],
                           p["original_max_position_embeddings"])
        if kind == "dynamic":
            return self._dynamic(length, device)
        if kind == "yarn":
            return self._yarn(device)
        if kind == "bandwidth":
            return self._bandwidth(length, device)
        if kind == "longrope":
            n0 = p["original_max_position_embeddings"]
            beyond = length is not None and bool(length) and bool(length > n0)
            ext = torch.tensor(p["long_factor"] if beyond else p["short_factor"],
                               dtype=torch.float32, device=device)
            shape = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
            return 1.0 / (ext * self.base ** shape)
        # proportional: the exponent over the whole head, zeros for the unrotated pairs
        proportion = p.get("partial_rotary_factor", 1.0)
        rotated = int(proportion * dim // 2)
        inv = 1.0 / (self.base ** (torch.arange(0, 2 * rotated, 2, dtype=torch.int64)
                                   .to(device=device, dtype=torch.float) / dim))
        if dim // 2 > rotated:
            inv = torch.cat((inv, torch.zeros(dim // 2 - rotated, dtype=torch.float32,
                                              device=device)))
        return inv / p.get("factor", 1.0)

    def _dynamic(self, length: int | torch.Tensor | None,
                 device: torch.device | str | None) -> torch.Tensor:
        """NTK-aware dynamic: the base b (s n / n0 - (s - 1))^(d / (d - 2)) at n = max(length,
        n0) (``inv_freq``'s arithmetic for a tensor or an int length)."""
        n0, factor, dim = self.max_position_embeddings, self.parameters["factor"], self.dim
        assert n0 is not None
        seq: int | torch.Tensor
        if length is None:
            seq = n0
        elif isinstance(length, torch.Tensor):
            seq = torch.maximum(length, torch.tensor(n0, dtype=length.dtype,
                                                     device=length.device))
        else:
            seq = max(length, n0)
        base = self.base * ((factor * seq / n0) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** _exponents(dim, device))

    def _bandwidth(self, length: int | torch.Tensor | None,
                   device: torch.device | str | None) -> torch.Tensor:
        """Ours: w_i kept where w_i n0 >= 2 pi turns, else w_i / s (s = factor, or max(1,
        n / n0) from the current length when factor is None)."""
        p = self.parameters
        inv = 1.0 / (self.base ** _exponents(self.dim, device))
        n0, factor = p["original_max_position_embeddings"], p["factor"]
        if factor is None:
            factor = 1.0 if length is None else max(1.0, float(length) / n0)
        turned = inv * n0 / (2 * math.pi)
        return torch.where(turned >= p["turns"], inv, inv / factor)

    def _yarn(self, device: torch.device | str | None) -> torch.Tensor:
        p, dim, base = self.parameters, self.dim, self.base
        factor = self._factor()
        beta_fast = p.get("beta_fast") or 32
        beta_slow = p.get("beta_slow") or 1
        n0 = p["original_max_position_embeddings"]
        truncate = p.get("truncate", True)

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(n0 / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low),
                           0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
        extrapolation = 1.0 / pos_freqs
        interpolation = 1.0 / (factor * pos_freqs)
        keep = 1 - ramp.to(device=device, dtype=torch.float)
        return interpolation * (1 - keep) + extrapolation * keep

    def attention_scaling(self, length: int | None = None) -> float:
        """The factor transformers multiplies cos and sin by (so the scores by its square):
        YaRN's temperature, longrope's scaling, 1 for the other types. ``length`` is unused
        (no type's scaling depends on it) and kept for symmetry with ``inv_freq``."""
        p = self.parameters
        attention_factor = p.get("attention_factor")
        if self.rope_type == "yarn":
            if attention_factor is not None:
                return attention_factor
            factor = self._factor()
            mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
            if mscale and mscale_all_dim:
                return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
            return _yarn_mscale(factor)
        if self.rope_type == "longrope":
            if attention_factor is not None:
                return attention_factor
            factor = self._factor()
            if factor <= 1.0:
                return 1.0
            n0 = p["original_max_position_embeddings"]
            return math.sqrt(1 + math.log(factor) / math.log(n0))
        return 1.0

    @property
    def follows_length(self) -> bool:
        """Whether the frequencies depend on the current length n = max position + 1 (dynamic,
        longrope, bandwidth without a factor): keys rotated in an earlier, shorter forward are
        then at other frequencies than the current forward's (``KVTape(follow_length=True)``
        re-rotates them)."""
        return self.rope_type in ("dynamic", "longrope") or (
            self.rope_type == "bandwidth" and self.parameters["factor"] is None)

    @property
    def keys_follow_length(self) -> bool:
        """Whether a KV tape must re-rotate its stored keys to each forward's frequencies for
        this kernel (declared: splitformer's own types whose frequencies follow the length;
        transformers' dynamic and longrope keep transformers' cache semantics, stale keys,
        unless the tape is built with ``follow_length=True``)."""
        return self.follows_length and self.rope_type in OWN_ROPE_TYPES

    def forward_frequencies(self, length: int, device: torch.device | str | None = None
                            ) -> torch.Tensor:
        """The frequencies (dim // 2,) float32 of a forward whose last position is
        ``length`` - 1: those ``angles`` uses there."""
        return self._forward_inv_freq(torch.tensor([length - 1], device=device))

    def query_temperature(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The factor each query is multiplied by, (B|1, 1, N, 1) float32, at ``positions``
        ((B, N) or (N,)): max(1, ln(x + 1) / ln n0) for "bandwidth" (the log n correction at
        the support x' <= x of the query at x, 3.14; 1 on the trained interval); None (no
        factor) for every other type and for temperature "none"."""
        if not self.scales_queries:
            return None
        if positions.dim() == 1:
            positions = positions[None]
        n0 = self.parameters["original_max_position_embeddings"]
        support = positions.to(torch.float32) + 1
        factor = torch.log(support.clamp(min=n0)) / math.log(n0)
        return factor[:, None, :, None]

    def _forward_inv_freq(self, positions: torch.Tensor) -> torch.Tensor:
        """The frequencies transformers' rotary module uses in a forward at ``positions``: its
        init-time frequencies (computed on the CPU, then moved), or for dynamic beyond n0 and
        longrope beyond n0 the ones its ``dynamic_rope_update`` computes on the device."""
        device = positions.device
        if self.rope_type == "bandwidth" and self.parameters["factor"] is None:
            return self.inv_freq(int(torch.max(positions)) + 1, device=device)
        if self.rope_type in ("dynamic", "longrope"):
            seq_len = torch.max(positions) + 1
            if self.rope_type == "dynamic":
                assert self.max_position_embeddings is not None
                if bool(seq_len > self.max_position_embeddings):
                    return self.inv_freq(seq_len, device=device)
            elif bool(seq_len > self.parameters["original_max_position_embeddings"]):
                return self.inv_freq(self.parameters["original_max_position_embeddings"] + 1,
                                     device=device)
        return _init_inv_freq(self).to(device)

    def angles(self, positions: torch.Tensor,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the angles x w_i at the coordinates ``positions``, (B|1, 1, N, dim).

        positions: (B, N) or (1, N) (or (N,)), integer ids or real coordinates. The float32
        product x w_i, emb = cat(freqs, freqs), cos(emb) and sin(emb) times
        ``attention_scaling``, then cast to ``dtype``: transformers' LlamaRotaryEmbedding
        .forward exactly (float32 angles also for a float64 model). For dynamic and longrope
        the frequencies are those of n = max position + 1.
        """
        if positions.dim() == 1:
            positions = positions[None]
        if positions.dim() != 2:
            raise ValueError(f"positions must be (B, N) or (N,), got {tuple(positions.shape)}")
        inv = self._forward_inv_freq(positions)
        freqs = positions[..., None].float() * inv.to(device=positions.device,
                                                      dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = self.attention_scaling()
        cos = emb.cos() * scaling
        sin = emb.sin() * scaling
        return cos.to(dtype=dtype).unsqueeze(1), sin.to(dtype=dtype).unsqueeze(1)

    # ------------------------------------------------------------------ report
    def describe(self) -> str:
        """One line: the type, base and features, and what the type does to the kernel."""
        of = f" of {self.head_dim}" if self.head_dim is not None else ""
        line = f"rope {self.rope_type}, base {self.base:.3g} on {self.dim}{of} features"
        p, kind = self.parameters, self.rope_type
        if kind == "default":
            return line
        if kind == "linear":
            return f"{line}; linear: coordinates x -> x / {p['factor']:g}"
        if kind == "dynamic":
            return (f"{line}; dynamic NTK: base b -> b ({p['factor']:g} n / n0 - "
                    f"{p['factor'] - 1:g})^(d/(d-2)) for n > n0 = {self.max_position_embeddings}")
        if kind == "yarn":
            return (f"{line}; yarn: coordinates x -> x / {self._factor():g} on the bands "
                    f"turning under beta_slow = {p.get('beta_slow') or 1:g} times in n0 = "
                    f"{p['original_max_position_embeddings']}, kept over beta_fast = "
                    f"{p.get('beta_fast') or 32:g}, temperature {self.attention_scaling():.4g}")
        if kind == "llama3":
            return (f"{line}; llama3: frequencies / {p['factor']:g} for wavelengths over "
                    f"n0 / {p['low_freq_factor']:g}, kept under n0 / "
                    f"{p['high_freq_factor']:g}, smoothed between "
                    f"(n0 = {p['original_max_position_embeddings']})")
        if kind == "longrope":
            return (f"{line}; longrope: per-frequency factors, short up to n0 = "
                    f"{p['original_max_position_embeddings']}, long beyond, scaling "
                    f"{self.attention_scaling():.4g}")
        if kind == "bandwidth":
            n0 = p["original_max_position_embeddings"]
            turns = p["turns"]
            kept = int((self.inv_freq() * n0 >= 2 * math.pi * turns).sum())
            temp = ("queries times ln(x+1)/ln n0 past n0" if p.get("temperature", "log") == "log"
                    else "no temperature")
            times = "once" if turns == 1 else f"{turns:g} times"
            scale = ("s, s = max(1, n / n0) at the current length n" if p["factor"] is None
                     else f"{p['factor']:g}")
            return (f"{line}; bandwidth: {kept} of {self.dim // 2} bands turn {times} in n0 = "
                    f"{n0} and are kept, the others at x / {scale}; {temp}")
        rotated = int(p.get("partial_rotary_factor", 1.0) * self.dim // 2)
        return (f"{line}; proportional: {rotated} of {self.dim // 2} pairs rotate, "
                f"coordinates x -> x / {p.get('factor', 1.0):g}")


def _llama3(inv: torch.Tensor, factor: float, low_freq_factor: float,
            high_freq_factor: float, n0: int) -> torch.Tensor:
    """Llama 3.1's band-wise smoothing of the default frequencies ``inv`` (as transformers)."""
    low_freq_wavelen = n0 / low_freq_factor
    high_freq_wavelen = n0 / high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (n0 / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


@lru_cache(maxsize=64)
def _init_inv_freq(rope: RotaryPositions) -> torch.Tensor:
    """The init-time frequencies (length None), on the CPU as transformers computes them; cached
    per kernel (read only: callers move or copy them), as ordinary tensors even when first asked
    for under inference_mode."""
    with torch.inference_mode(False), torch.no_grad():
        return rope.inv_freq(None)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_x x = x cos + rot(x) sin on the first d = cos.shape[-1] features, rot(x) = (-x2, x1) for
    the halves x1, x2 of those features (the "rotate half" layout of Llama's
    apply_rotary_pos_emb); the other features pass unchanged (partial rotary, as GPT-NeoX).
    cos and sin (B|1, 1, N, d) broadcast against x (B, H, N, head_dim)."""
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return (x * cos) + (_rotate_half(x) * sin)
    if d > x.shape[-1]:
        raise ValueError(f"rotate_half: {d} rotary features but x has {x.shape[-1]}")
    rot, rest = x[..., :d], x[..., d:]
    return torch.cat(((rot * cos) + (_rotate_half(rot) * sin), rest), dim=-1)


class RotaryAngles:
    """The rotary angles of one forward: cos and sin of every named ``RotaryPositions`` at the
    nodes' coordinates, computed once per forward (the first attention evaluation that asks)
    and shared by every later one (``Context.rotary``).

    The coordinates are the context's ``token_coords`` when it has them, else ``positions``
    (the position ids, or 0 .. N-1), given by the model. The angles follow the coordinates:
    a context whose grid is changed (a node split, coordinates moved) gets angles at its own
    coordinates, recomputed once for that grid (the cache is keyed on the coordinates tensor).
    """

    def __init__(self, positions: Mapping[str, RotaryPositions], at: torch.Tensor) -> None:
        self.positions = dict(positions)
        self.at = at
        self._key: torch.Tensor | None = None
        self._cache: dict[tuple[str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._temperatures: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"RotaryAngles({sorted(self.positions)}, nodes={self.at.shape[-1]})"

    def angles(self, name: str, coords: torch.Tensor | None, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (B|1, 1, N, d) of the positions ``name`` at ``coords`` (None: at
        ``at``), in ``dtype``; KeyError naming the known names."""
        if name not in self.positions:
            raise KeyError(f"no rotary positions {name!r}; known: {sorted(self.positions)}")
        rows = self._rows(coords)
        if (name, dtype) not in self._cache:
            self._cache[name, dtype] = self.positions[name].angles(rows, dtype)
        return self._cache[name, dtype]

    def _rows(self, coords: torch.Tensor | None) -> torch.Tensor:
        """The coordinates (B|1, N) the angles are read at (``coords``, else ``at``); what was
        computed for other coordinates is dropped."""
        x = self.at if coords is None else coords
        if x is not self._key:
            self._key, self._cache, self._temperatures = x, {}, {}
        return x if x.dim() == 2 else x.unsqueeze(0)

    def temperature(self, name: str, coords: torch.Tensor | None, dtype: torch.dtype
                    ) -> torch.Tensor | None:
        """The queries' factor (B|1, 1, N, 1) of the positions ``name`` at ``coords`` (None: at
        ``at``) in ``dtype``, or None when that kernel has none
        (``RotaryPositions.query_temperature``)."""
        rope = self.positions[name]
        if not rope.scales_queries:
            return None
        rows = self._rows(coords)
        if (name, dtype) not in self._temperatures:
            self._temperatures[name, dtype] = rope.query_temperature(rows).to(dtype)
        return self._temperatures[name, dtype]

    def tensors(self) -> list[torch.Tensor]:
        """The tensors computed so far (for an adjoint that needs the context's tensors)."""
        return [self.at, *(t for pair in self._cache.values() for t in pair),
                *self._temperatures.values()]
