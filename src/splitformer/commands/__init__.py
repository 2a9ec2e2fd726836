"""Subcommands of the `splitformer` command line (one module each).

A subcommand reports a bad input by raising ``UsageError("argument --flag: what was expected")``
before any long computation; ``splitformer.cli.main`` turns it into the parser's one-line error
on stderr and exit status 2, like the errors argparse finds itself."""

from __future__ import annotations

import argparse

__all__ = ["UsageError", "positive_int"]


class UsageError(Exception):
    """A bad command-line input: the message names the flag and what was expected."""


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (one line error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
