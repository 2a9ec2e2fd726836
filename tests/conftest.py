"""Test set-up. The torchvision workaround for timm lives here, never in the library."""

from __future__ import annotations

import os
import sys

import pytest
import torch


def _install_torchvision_stub() -> None:
    try:
        import torchvision  # noqa: F401
        return
    except Exception:  # missing, or PyPI's build that does not import beside the CPU torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    # Import timm with the stand-in on the path, then take the stand-in away again, so that
    # nothing else (transformers checks for torchvision) sees a torchvision that is not there.
    stubs = os.path.join(os.path.dirname(__file__), "_stubs")
    sys.path.insert(0, stubs)
    try:
        import timm  # noqa: F401
    except Exception:  # timm not installed: its tests skip
        pass
    finally:
        sys.path.remove(stubs)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]


_install_torchvision_stub()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `make test` runs two xdist workers on two cores: one torch thread each (small tensors; more
# threads only contend)
torch.set_num_threads(1)

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


@pytest.fixture(params=[torch.float64, torch.float32], ids=["f64", "f32"])
def dtype(request):
    return request.param


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| as a float."""
    return float((a - b).detach().abs().max())


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Same state-dict keys in the same order, same dtypes, bitwise equal values."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(sa[k], sb[k]), k
