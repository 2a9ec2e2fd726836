"""Subcommands of the `splitformer` command line (one module each).

A subcommand reports a bad input by raising ``UsageError("argument --flag: what was expected")``
before any long computation; ``splitformer.cli.main`` turns it into the parser's one-line error
on stderr and exit status 2, like the errors argparse finds itself."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """A bad command-line input: the message names the flag and what was expected."""
