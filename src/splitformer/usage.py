"""Usage errors on one line: ``Parser``, argparse with an error that is one line on stderr
(``PROG: error: MESSAGE (see 'PROG --help')``) and exit status 2, for the ``splitformer``
command and the experiments' own ``python -m`` commands. Imports nothing from splitformer."""

from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse, with errors on one line (the usage is one ``--help`` away)."""

    def error(self, message: str):  # type: ignore[override]
        line = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {line} (see '{self.prog} --help')\n")
