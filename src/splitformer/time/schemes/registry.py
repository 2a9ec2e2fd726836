"""The registry of scheme names and ``resolve``, the one way from a name, a string or stages to a
``Scheme``.

``SCHEMES`` maps every name to a builder ``(layout, **options) -> Scheme`` (the named schemes of
``time.schemes.named`` and the reversible scheme of ``time.schemes.reversible``), written out
here: importing this module is all it takes to know every name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from .layouts import POST_LN, Layout
from .named import _paper, lie, parallel, prenorm, strang, unsplit
from .reversible import reversible
from .stages import Scheme, Stage, scheme_from_string

__all__ = ["SCHEMES", "resolve", "scheme_names"]

# name -> builder(layout, **options); every entry is a value users and the CLI can name
SCHEMES: dict[str, Callable[..., Scheme]] = {
    "lie": lie,
    "prenorm": prenorm,
    "strang": strang,
    "parallel": parallel,
    "unsplit": unsplit,
    "paper": _paper,
    "reversible": reversible,
}


_BARE = re.compile(r"^[A-Za-z_]\w*$")  # a name alone: no stage syntax around it


def scheme_names() -> list[str]:
    """Every name ``resolve`` accepts (the registry the CLI and the tests read)."""
    return sorted(SCHEMES)


def _options_of(builder: Callable[..., Scheme]) -> tuple[str, ...]:
    code = builder.__code__
    return code.co_varnames[1:code.co_argcount]


def resolve(
    scheme: str | Scheme | Iterable[Stage],
    layout: Layout | None = None,
    **options,
) -> Scheme:
    """A Scheme from a Scheme, a name (built on ``layout``, default post-LN; options:
    integrator, form), a string form or a list of stages."""
    if isinstance(scheme, str):
        text = scheme.strip()
        if text in SCHEMES:
            builder = SCHEMES[text]
            bad = sorted(set(options) - set(_options_of(builder)))
            if bad:
                raise ValueError(f"scheme {text!r} takes the options "
                                 f"{list(_options_of(builder))}, got {bad}")
            return builder(layout if layout is not None else POST_LN, **options)
        if options:
            raise ValueError(f"options {sorted(options)} apply to named schemes only "
                             f"({scheme_names()}); {scheme!r} is not one of them")
        if not any(c in text for c in " ,:>(~|*@<+") and not (
                layout is not None and text in {f.operator for f in layout}):
            raise ValueError(f"unknown scheme {scheme!r}; named schemes: {scheme_names()} (or "
                             "a scheme string such as 'attention norm1:project ffn "
                             "norm2:project')")
        tokens = [t.strip() for t in text.split(",")]
        if len(tokens) > 1 and all(_BARE.match(t) for t in tokens) and any(
                t in SCHEMES for t in tokens):
            unknown = [t for t in tokens if t not in SCHEMES]
            raise ValueError(
                f"scheme {scheme!r} is a list of names, not one scheme"
                + (f" (unknown: {unknown}; named schemes: {scheme_names()})" if unknown
                   else " (several schemes are an axis of `splitformer experiment`)"))
        return scheme_from_string(text)
    if options:
        raise ValueError(f"options {sorted(options)} apply to named schemes only "
                         f"({scheme_names()}), not to a {type(scheme).__name__}")
    if isinstance(scheme, Scheme):
        return scheme
    if scheme is None or isinstance(scheme, (bytes, Stage)) or not isinstance(scheme, Iterable):
        raise TypeError(f"scheme must be a name ({scheme_names()}), a scheme string, a Scheme "
                        f"or a list of Stage values, got {scheme!r}")
    return Scheme(tuple(scheme))
