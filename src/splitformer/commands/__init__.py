"""Subcommands of the `splitformer` command line (one module each).

A subcommand reports a bad input by raising ``UsageError("argument --flag: what was expected")``
before any long computation; ``splitformer.cli.main`` turns it into the parser's one-line error
on stderr and exit status 2, like the errors argparse finds itself.

Names given to a choice flag (``--family``, ``--integrator``, ...) are read without surrounding
whitespace (``stripped``), as a scheme name is."""

from __future__ import annotations

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
           "duration", "fraction", "int_list", "nonnegative_float", "nonnegative_int",
           "positive_float", "positive_int", "stripped"]


class UsageError(Exception):
    """A bad command-line input: the message names the flag and what was expected."""


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
