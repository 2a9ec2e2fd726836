"""The checks of the convergence study's inputs, shared by the Python API
(``analysis.convergence``, ``configuration``) and the command line (``splitformer convergence``,
whose argparse types call them): both refuse the same things with the same words.

Every check raises ``ArgumentError`` (a ``ValueError``) naming the argument as the Python API
spells it (``ks``, ``ref_k``, ``u0``, ...) and saying what was expected; the command line puts
its flag in front instead (``argument --ks: ...``).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterable

import torch

from ..operators.base import Operator
from ..time import Evolution
from ..time.schemes import layout_of

__all__ = [
    "MAX_REF_K",
    "SEED_RANGE",
    "ArgumentError",
    "check_k",
    "check_ks",
    "check_model",
    "check_ref_k",
    "check_reference",
    "check_scheme_uses_fields",
    "check_seed",
    "check_u0",
    "check_u_ref",
    "projected_ode_mismatch",
    "with_scheme_checked",
]

# the finest reference: tau = 2^-16, T 2^16 steps (about a minute on the configurations; each
# k more doubles it). ks are below ref_k, so this bounds them too.
MAX_REF_K = 16
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed / Generator.manual_seed accept
SEED_RANGE_TEXT = "[-2^63, 2^64 - 1] (torch.manual_seed's range)"


class ArgumentError(ValueError):
    """A bad argument: ``argument`` is its name in the Python API, ``detail`` what was expected
    and what came. ``str(e)`` is ``"argument: detail"``."""

    def __init__(self, argument: str, detail: str) -> None:
        super().__init__(f"{argument}: {detail}")
        self.argument = argument
        self.detail = detail


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_seed(seed, argument: str = "seed") -> int:
    """An integer torch.manual_seed accepts."""
    lo, hi = SEED_RANGE
    if not _is_int(seed) or not lo <= seed <= hi:
        raise ArgumentError(argument, f"expected an integer in {SEED_RANGE_TEXT}, got {seed!r}")
    return int(seed)


def check_ref_k(ref_k, argument: str = "ref_k") -> int:
    """The reference's k (tau = 2^-ref_k): an integer in [1, MAX_REF_K]."""
    if not _is_int(ref_k) or not 1 <= ref_k <= MAX_REF_K:
        raise ArgumentError(argument, f"expected an integer in [1, {MAX_REF_K}] (the reference "
                                      f"runs T 2^ref_k steps; each k more doubles the time), "
                                      f"got {ref_k!r}")
    return int(ref_k)


def check_k(k, argument: str = "ks") -> int:
    """One k of ``ks`` (tau = 2^-k): an integer in [0, MAX_REF_K - 1]."""
    if not _is_int(k) or not 0 <= k < MAX_REF_K:
        raise ArgumentError(argument, f"expected integers k in [0, {MAX_REF_K - 1}] (tau = 2^-k, "
                                      f"below the finest reference 2^-{MAX_REF_K}), got {k!r}")
    return int(k)


def check_ks(ks, ref_k: int | None = None, *, argument: str = "ks",
             ref_argument: str = "ref_k") -> tuple[int, ...]:
    """At least two k values (an order is a slope), each an integer in [0, MAX_REF_K - 1],
    increasing without repeats (tau halves from one to the next), all below ``ref_k`` when
    given. Returns them as a tuple."""
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Iterable):
        raise ArgumentError(argument, f"expected a sequence of integers k >= 0 (tau = 2^-k), "
                                      f"got {ks!r}")
    ks = tuple(ks)
    for k in ks:
        check_k(k, argument)
    ks = tuple(int(k) for k in ks)
    if len(ks) < 2:
        raise ArgumentError(argument, f"expected at least two k values to fit an order, got "
                                      f"{ks!r}")
    if any(b <= a for a, b in zip(ks, ks[1:], strict=False)):
        raise ArgumentError(argument, f"expected k values that increase without repeats (tau "
                                      f"halves from one to the next), got {ks!r}")
    if ref_k is not None and ks[-1] >= ref_k:
        raise ArgumentError(argument, f"every k must be below {ref_argument} {ref_k} (the "
                                      f"reference is at tau = 2^-{ref_k}), got k = {ks[-1]}")
    return ks


def _params(evo: Evolution) -> list[tuple[str, torch.Tensor]]:
    return list(evo.controls.named_parameters())


def check_model(model, evo: Evolution, argument: str = "model") -> None:
    """Finite parameters (a NaN weight gives NaN errors and a NaN order)."""
    bad = [name for name, p in _params(evo) if not torch.isfinite(p.detach()).all()]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ArgumentError(argument, f"expected finite parameters, got NaN or inf values in "
                                      f"{', '.join(bad[:3])}{more}")


def _input_width(model, evo: Evolution) -> int | None:
    width = getattr(model, "d_model", None)
    if _is_int(width):
        return int(width)
    theta = evo.controls[0]
    for name in evo.scheme.operators():  # the first operator the scheme applies
        op = theta[name] if name in theta else None
        if _is_int(getattr(op, "dim", None)):
            return int(op.dim)
        widths = getattr(op, "widths", None)
        if widths:
            return int(widths[0])
    return None


def _non_finite(t: torch.Tensor) -> str:
    nan = int(torch.isnan(t).sum())
    inf = int(torch.isinf(t).sum())
    return f"{nan} NaN and {inf} inf entries"


def check_u0(u0, model, evo: Evolution, argument: str = "u0") -> None:
    """A finite tensor of shape (batch, tokens, d_model), of the model's dtype and device."""
    width = _input_width(model, evo)
    shape = f"(batch, tokens, {width if width is not None else 'd_model'})"
    if not isinstance(u0, torch.Tensor):
        raise ArgumentError(argument, f"expected a torch.Tensor of shape {shape}, got "
                                      f"{type(u0).__name__}")
    if u0.dim() != 3 or (width is not None and u0.shape[-1] != width):
        raise ArgumentError(argument, f"expected shape {shape}, got {tuple(u0.shape)}")
    params = _params(evo)
    if params:
        p = params[0][1]
        if u0.dtype != p.dtype:
            raise ArgumentError(argument, f"expected dtype {p.dtype} (the model's parameters), "
                                          f"got {u0.dtype}: convert one of them "
                                          f"(u0.to({p.dtype}) or model.to({u0.dtype}))")
        if u0.device != p.device:
            raise ArgumentError(argument, f"expected a tensor on {p.device} (the model's "
                                          f"device), got one on {u0.device}")
    if not torch.isfinite(u0).all():
        raise ArgumentError(argument, f"expected finite values, got {_non_finite(u0)}")


def check_u_ref(u_ref, u0: torch.Tensor, evo: Evolution, argument: str = "u_ref") -> None:
    """A finite u(T) for u0: u0's shape (leading dimensions only when a field changes the
    width), dtype and device."""
    if not isinstance(u_ref, torch.Tensor):
        raise ArgumentError(argument, f"expected a torch.Tensor, u(T) for u0 (e.g. from "
                                      f"reference_solution), got {type(u_ref).__name__}")
    widening = any(isinstance(op, Operator) and op.changes_width
                   for op in evo.controls[0].values())
    same = (u_ref.shape[:-1] == u0.shape[:-1] and u_ref.dim() == u0.dim()) if widening \
        else u_ref.shape == u0.shape
    if not same:
        raise ArgumentError(argument, f"expected u(T) for u0, of shape {tuple(u0.shape)}, got "
                                      f"{tuple(u_ref.shape)}")
    if u_ref.dtype != u0.dtype or u_ref.device != u0.device:
        raise ArgumentError(argument, f"expected u0's dtype and device ({u0.dtype}, "
                                      f"{u0.device}), got {u_ref.dtype}, {u_ref.device}")
    if not torch.isfinite(u_ref).all():
        raise ArgumentError(argument, f"expected finite values, got {_non_finite(u_ref)}")


def _field_operators(evo: Evolution) -> list[str]:
    """The operators of kind "field" of the controls, and the layout's fields."""
    out = [f.operator for f in evo.layout or ()]
    for theta in evo.controls:
        for name, op in theta.items():
            if isinstance(op, Operator) and op.kind == "field" and name not in out:
                out.append(name)
    return out


def check_scheme_uses_fields(base: Evolution, evo: Evolution, scheme,
                             argument: str = "scheme") -> None:
    """``evo`` (``base`` under ``scheme``) advances every field operator of the model (a scheme
    that drops the FFN measures another equation, not the model's)."""
    used = set(evo.scheme.operators())
    fields = _field_operators(base)
    unused = [f for f in fields if f not in used]
    if unused:
        text = scheme if isinstance(scheme, str) else str(evo.scheme)
        raise ArgumentError(argument, f"{text!r} does not use the model's field operator"
                                      f"{'s' if len(unused) > 1 else ''} {', '.join(unused)}: "
                                      f"expected a scheme that advances every field of the "
                                      f"model ({', '.join(fields)})")


def with_scheme_checked(base: Evolution, scheme, argument: str = "scheme",
                        **options) -> Evolution:
    """``base.with_scheme(scheme, **options)``, refused by ``check_scheme_uses_fields``; the
    evolution's own warning about unused fields is then dropped for the error (other warnings
    are shown as usual)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evo = base.with_scheme(scheme, **options)
    check_scheme_uses_fields(base, evo, scheme, argument)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return evo


def projected_ode_mismatch(evo: Evolution) -> str | None:
    """Why the projected ODE u_t = Pi_T(u) (A + G)(u) is not the limit of ``evo``'s scheme, or
    None when it is: every field is followed, raw, by a projection onto one and the same set
    in every control set."""
    try:
        layout = layout_of(evo.scheme)
    except ValueError:
        return f"scheme {evo.scheme.name!r} [{evo.scheme}] has no plain field layout"
    around = [f.operator for f in layout if f.pre or f.post]
    if around:
        return (f"its fields {', '.join(around)} have operators composed inside them "
                f"(pre-norm or LayerScale: [{evo.scheme}])")
    bare = [f.operator for f in layout if f.projection is None]
    if bare:
        return f"its fields {', '.join(bare)} have no projection after them"
    projs = list(dict.fromkeys(f.projection for f in layout))
    for theta in evo.controls:
        mods = [theta[p] for p in projs]
        ref = [t.detach() for t in mods[0].parameters()]
        for m in mods[1:]:
            params = list(m.parameters())
            if type(m) is not type(mods[0]) or len(params) != len(ref) or any(
                    a.shape != b.shape or not torch.equal(a, b.detach())
                    for a, b in zip(ref, params, strict=True)):
                return (f"its projections {', '.join(projs)} are not one and the same "
                        "constraint set (different types or parameters)")
    return None


def check_reference(evo: Evolution, reference: str, argument: str = "reference") -> None:
    """reference 'projected-ode' only where it is the scheme's limit."""
    if reference != "projected-ode":
        return
    why = projected_ode_mismatch(evo)
    if why:
        raise ArgumentError(argument, f"'projected-ode' is the limit only of schemes whose every "
                                      f"field is followed by a projection onto one common set; "
                                      f"the scheme is not one: {why}. Expected 'same-scheme' "
                                      f"or 'auto'")


def refuse_merging(evolutions: list, what: str) -> None:
    """ArgumentError("model") when one of ``evolutions`` merges tokens (``Evolution.merging``):
    ``what`` compares or reads states along the path, whose token grids then differ from step
    to step and from one step size to another (docs/space.md, "Coarsening in x")."""
    if any(e.merging is not None for e in evolutions):
        raise ArgumentError("model", f"{what} is not defined for a model that merges tokens "
                                     "(with_token_merging): the token grid changes along the "
                                     "path; run it on the model without merging "
                                     "(with_token_merging(None))")
