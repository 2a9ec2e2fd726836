"""The `splitformer` command. Each subcommand is a module in ``splitformer.commands`` exposing
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; adding one is adding a module and a
line to ``COMMANDS``."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

COMMANDS: dict[str, str] = {
    "verify": "splitformer.commands.verify",
    "convergence": "splitformer.commands.convergence",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splitformer",
        description="Transformers as operator-splitting discretisations of an "
        "integro-differential equation.",
    )
    parser.add_argument("--version", action="version", version=f"splitformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
