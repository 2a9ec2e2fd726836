"""`splitformer bench` with timm importable: what `make bench` and docs/performance.md run.

    python benchmarks/bench.py [the arguments of splitformer bench]

timm imports torchvision, whose PyPI build does not import beside the CPU torch; the library
never imports timm itself except as a benchmark peer, so the workaround lives in the test
set-up (tests/_stubs/standin.py), and this script borrows it before running the command. With a
torchvision that imports, it changes nothing.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "_stubs"))
from standin import import_timm  # noqa: E402

sys.path.pop(0)
import_timm()

from splitformer.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
