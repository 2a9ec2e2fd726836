"""The `splitformer` command. Each subcommand is a module in ``splitformer.commands`` exposing
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; adding one is adding a module and a
line to ``COMMANDS``.

Every usage error, found by argparse or raised by a subcommand as ``commands.UsageError``, is
one line on stderr, ``splitformer SUBCOMMAND: error: argument --flag: ...``, and exit status 2;
so is a missing command (``splitformer: error: a command is required ...``). A subcommand may
document exit status 1 for a run that fails after its inputs were accepted (``EPILOG``, shown
under its ``--help``), also one line on stderr. Ctrl-C is one line too (``<prog>: interrupted``
and what was kept, a subcommand's ``_interrupted`` default), exit status 130; SIGTERM (what
``timeout``, schedulers and ``docker stop`` send) is read as Ctrl-C, so a command keeps what
Ctrl-C keeps. While the commands are imported (the first seconds), both are held and answered
once the imports are done: ``splitformer: interrupted``, exit status 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

from . import __version__
from .commands import UsageError
from .usage import Parser

COMMANDS: dict[str, str] = {
    "verify": "splitformer.commands.verify",
    "convergence": "splitformer.commands.convergence",
    "train": "splitformer.commands.train",
    "experiment": "splitformer.commands.experiment",
    "analyze": "splitformer.commands.analyze",
    "report": "splitformer.commands.report",
    "bench": "splitformer.commands.bench",
    "compress": "splitformer.commands.compress",
    "theory": "splitformer.commands.theory",
    "generate": "splitformer.commands.generate",
    "cache": "splitformer.commands.cache",
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="splitformer",
        description="Transformers as operator-splitting discretisations of an "
        "integro-differential equation.",
    )
    parser.add_argument("--version", action="version", version=f"splitformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP,
                           epilog=mod.EPILOG)
        p.set_defaults(_interrupted="")  # a command's add_arguments may say what Ctrl-C keeps
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Python installs signal handlers from the main thread only (cli.main called elsewhere
    # keeps the process's handlers as they are)
    main_thread = threading.current_thread() is threading.main_thread()
    before = _handlers() if main_thread else {}
    held: list[int] = []
    args = None  # the command's, once parsed: Ctrl-C names it and what it keeps by then
    try:
        try:  # the start: the commands import torch, for seconds
            _hold(before, held)
            parser = build_parser()
        finally:  # SIGTERM now read as Ctrl-C, unless it was ignored; Ctrl-C as it was
            _install(before, {signal.SIGTERM: _terminated})
        for signum in held:  # answered now, by the handlers the process had
            signal.raise_signal(signum)
        args, extra = parser.parse_known_args(argv)
        if extra:  # the subcommand's own one-line error, naming its --help
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
            return 2
        if not args.command:
            parser.error(f"a command is required ({', '.join(COMMANDS)})")  # exits with 2
            return 2
        return int(args._run(args) or 0)
    except UsageError as e:
        args._parser.error(str(e))  # exits with status 2
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        # _interrupted as the command left it (compress says where its checkpoint is)
        said = (args._parser.prog, args._interrupted) if args and args.command else \
            ("splitformer", "")
        sys.stderr.write(f"{said[0]}: interrupted{said[1]}\n")
        return 130
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    finally:
        _install(before, {})


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _handlers() -> dict[int, object]:
    """The process's handlers of Ctrl-C and SIGTERM that main may replace for a while: not an
    ignored signal (a background job's Ctrl-C stays ignored), nor one whose handler was set
    outside Python (it could not be put back)."""
    handlers = {n: signal.getsignal(n) for n in _SIGNALS}
    return {n: h for n, h in handlers.items() if h is not signal.SIG_IGN and h is not None}


def _hold(before: dict[int, object], held: list[int]) -> None:
    """The signals of ``before`` recorded in ``held`` instead of acted on, while the command
    modules are imported: a KeyboardInterrupt raised inside a third-party import (numpy's,
    torch's) can leave it half done and be swallowed or turned into another error."""
    for n in before:
        signal.signal(n, lambda signum, frame: held.append(signum))


def _install(before: dict[int, object], instead: dict[int, object]) -> None:
    """Each signal of ``before`` back to its handler there, or to ``instead``'s where given."""
    for n, handler in before.items():
        signal.signal(n, instead.get(n, handler))


def _terminated(signum, frame) -> None:
    """SIGTERM as Ctrl-C: the command's interrupt handling keeps what it keeps."""
    raise KeyboardInterrupt


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
