"""Subcommands of the `splitformer` command line (one module each).

A subcommand reports a bad input by raising ``UsageError("argument --flag: what was expected")``
before any long computation; ``splitformer.cli.main`` turns it into the parser's one-line error
on stderr and exit status 2, like the errors argparse finds itself.

Names given to a choice flag (``--family``, ``--integrator``, ...) are read without surrounding
whitespace (``stripped``), as a scheme name is."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..usage import (
    argument_type,
    bounded_int,
    duration,
    fraction,
    int_list,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    stripped,
)

__all__ = ["UsageError", "argument_type", "bounded_int", "cache_budgets", "cache_policies",
           "check_out",
           "duration", "fraction", "int_list", "nonnegative_float", "nonnegative_int",
           "positive_float", "positive_int", "stripped"]


class UsageError(Exception):
    """A bad command-line input: the message names the flag and what was expected."""


def check_out(value: str | None, flag: str = "--out") -> Path:
    """The folder of ``flag``, checked before any work (one-line UsageError otherwise): a name
    that is not empty, of a folder that exists or can be created (the nearest existing folder
    above it is a folder, not a file), where a folder can be made (a probe folder is made there
    and removed again; named ``.*.tmp-*``, as a temporary file, so that a command listing the
    folder at that moment, as ``compress`` does, passes over it)."""
    if value is None or not str(value).strip():
        raise UsageError(f"argument {flag}: expected a folder, got an empty name {value!r}")
    out = Path(value)
    try:
        if out.exists():
            if not out.is_dir():
                raise UsageError(f"argument {flag}: {value!r} is a file, expected a folder")
            probe = out
        else:
            probe = out.absolute().parent
            while not probe.exists() and probe != probe.parent:
                probe = probe.parent
            if not probe.is_dir():
                raise UsageError(f"argument {flag}: {value!r} cannot be created: "
                                 f"{str(probe)!r} is a file, not a folder")
    except OSError as e:
        raise UsageError(f"argument {flag}: {value!r} is not a usable folder name "
                         f"({e.strerror or e})") from None
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".splitformer-probe.tmp-", dir=probe))
    except OSError as e:
        where = "in it" if probe == out else f"in {str(probe)!r} to create it"
        raise UsageError(f"argument {flag}: {value!r} is not writable: cannot make a folder "
                         f"{where} ({e.strerror or e})") from None
    return out


def cache_policies(text: str) -> tuple[str, ...]:
    """argparse type: cache policies separated by commas, each a name
    (``operators.cache_policy.POLICIES``) or a name with options, ``name:key=value:...``
    (``snapkv:window=10``; ``operators.cache_policy.policy_list``), checked by building each
    (``splitformer cache --policy``, ``splitformer bench --policies``)."""
    from ..operators.cache_policy import policy_list

    return argument_type(policy_list)(text)


def cache_budgets(text: str) -> tuple[float, ...]:
    """argparse type: cache budgets, fractions in (0, 1] separated by commas
    (``operators.cache_policy.budget_list``)."""
    from ..operators.cache_policy import budget_list

    return argument_type(budget_list)(text)
