"""Subcommands of the `splitformer` command line (one module each).

A subcommand reports a bad input by raising ``UsageError("argument --flag: what was expected")``
before any long computation; ``splitformer.cli.main`` turns it into the parser's one-line error
on stderr and exit status 2, like the errors argparse finds itself.

Names given to a choice flag (``--family``, ``--integrator``, ...) are read without surrounding
whitespace (``stripped``), as a scheme name is."""

from __future__ import annotations

import os
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
           "check_writable",
           "duration", "fraction", "int_list", "nonnegative_float", "nonnegative_int",
           "positive_float", "positive_int", "stripped"]


class UsageError(Exception):
    """A bad command-line input: the message names the flag and what was expected."""


def check_writable(out: Path, flag: str = "--out") -> None:
    """The results folder ``out`` exists or can be made, and can be written (before any
    training or loading); nothing is made here (a refused command leaves no folder behind)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"argument {flag}: {str(out)!r} is a file, expected a folder")
    there = out
    while not there.exists():  # the nearest folder that exists: the new ones go in it
        there = there.parent
    if not there.is_dir():
        raise UsageError(f"argument {flag}: {str(there)!r} is a file, so {str(out)!r} cannot "
                         "be made")
    if not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(f"argument {flag}: cannot write into {str(there)!r} (permission "
                         "denied)")


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
