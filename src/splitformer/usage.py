"""Reading a command line, for the ``splitformer`` command and the experiments' own
``python -m`` commands: ``Parser``, argparse with an error that is one line on stderr
(``PROG: error: MESSAGE (see 'PROG --help')``) and exit status 2, and the argparse types whose
errors say what was expected (``positive_int``, ``int_list``, ``duration``, ...;
``argument_type`` makes one of a function that raises ValueError or TypeError). Imports
nothing from splitformer."""

from __future__ import annotations

import argparse
from collections.abc import Callable


class Parser(argparse.ArgumentParser):
    """argparse, with errors on one line (the usage is one ``--help`` away)."""

    def error(self, message: str):  # type: ignore[override]
        line = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {line} (see '{self.prog} --help')\n")


def argument_type(parse_text: Callable[[str], object]) -> Callable[[str], object]:
    """``parse_text`` (text -> value, ValueError or TypeError naming what was expected) as an
    argparse type: its message becomes the one-line usage error."""
    def parse(text: str):
        try:
            return parse_text(text)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def stripped(text: str) -> str:
    """argparse type of a choice flag: the name without surrounding whitespace (argparse then
    checks it against the choices)."""
    return text.strip()


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (one line error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def int_list(minimum: int = 1, maximum: int | None = None, why: str = "", *,
             repeats: bool = True) -> Callable[[str], tuple[int, ...]]:
    """argparse type: integers in [minimum, maximum] separated by commas, each kept once in
    the order given (``repeats=False``: a repeated value is refused, where a repeat would
    mean something else); ``why`` (e.g. "(tokens)") follows the bounds in the error."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            given = [int(t) for t in text.split(",")]  # an empty item ('3,') is no integer
        except ValueError:
            given = []
        values = tuple(dict.fromkeys(given))
        if not repeats and len(values) != len(given):
            twice = sorted({v for v in given if given.count(v) > 1})
            raise argparse.ArgumentTypeError(f"expected each value once, got {twice} more than "
                                             f"once in {text!r}")
        if not values or min(values) < minimum or (maximum is not None
                                                   and max(values) > maximum):
            bounds = f"in [{minimum}, {maximum}]" if maximum is not None else \
                f">= {minimum}"
            note = f" {why}" if why else ""
            raise argparse.ArgumentTypeError(f"expected integers {bounds}{note} separated by "
                                             f"commas, got {text!r}")
        return values

    parse.__name__ = "int_list"
    return parse


def bounded_int(maximum: int, why: str = "", *, minimum: int = 1) -> Callable[[str], int]:
    """argparse type: an integer in [minimum, maximum] (minimum 1 by default); ``why`` (e.g.
    "(torch threads)") follows the bound in the error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            note = f" {why}" if why else ""
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise argparse.ArgumentTypeError(
                f"expected {what} at most {maximum}{note}, got {text!r}")
        return value

    parse.__name__ = "bounded_int"
    return parse


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _finite(text: str, strict: bool) -> float:
    """A finite number > 0 (``strict``) or >= 0, or the argparse error stating that bound."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value < float("inf") and (value > 0 if strict else value >= 0)):
        raise argparse.ArgumentTypeError(
            f"expected a finite number {'>' if strict else '>='} 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _finite(text, strict=False)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _finite(text, strict=True)


def fraction(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return value


def duration(text: str) -> float:
    """argparse type: seconds >= 0, as '600', '1e3', '600s', '10m' or '1.5h' (a number as
    Python writes a float, without a sign; finite)."""
    import math
    import re

    m = re.fullmatch(r"\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([smh]?)\s*",
                     text)
    value = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)] if m else None
    if value is None or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected seconds (600, 1e3) or a duration like 90s, "
                                         f"10m, 1h, got {text!r}")
    return value
