"""Subcommands of the `splitformer` command line (one module each)."""
