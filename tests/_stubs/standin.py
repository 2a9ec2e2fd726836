"""timm importable beside the CPU torch: the test set-up's workaround, never the library's.

PyPI's torchvision does not import beside the CPU build of torch, and timm imports torchvision
at import time (for a few transforms and ops it does not need here). ``import_timm`` imports
timm with the stand-in package ``tests/_stubs/torchvision`` on the path, then takes the
stand-in away again, so that nothing else (transformers checks for torchvision) sees a
torchvision that is not there. Used by tests/conftest.py and benchmarks/bench.py.
"""

from __future__ import annotations

import os
import sys


def _forget_torchvision() -> None:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


def import_timm() -> None:
    """Import timm (with the torchvision stand-in when the real one does not import)."""
    try:
        import torchvision  # noqa: F401
        return
    except Exception:  # missing, or PyPI's build that does not import beside the CPU torch
        _forget_torchvision()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        import timm  # noqa: F401
    except Exception:  # timm not installed: its tests skip
        pass
    finally:
        sys.path.remove(here)
        _forget_torchvision()
