"""Test set-up: the torchvision workaround for timm (here, never in the library), offline
Hugging Face, one torch thread per worker, the dtype fixture, and the optional data: the mark
``needs_data`` (``_optional_data.needs``) skips a test whose data is missing, before its
fixtures are set up, and ``SPLITFORMER_TEST_NO_DATA=1`` hides the data first
(``_optional_data.hide``). Helpers that tests share live in
``splitformer.verification.references`` (maxdiff, assert_same_state, TOL, perturb_)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_stubs"))
from standin import import_timm  # noqa: E402

sys.path.pop(0)
import_timm()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `make test` runs two xdist workers on two cores: one torch thread each (small tensors; more
# threads only contend)
torch.set_num_threads(1)

import _optional_data  # noqa: E402  (tests/ is on sys.path: pytest's rootdir conftest)

if _optional_data.hidden():
    _optional_data.hide()  # before any test module asks what is installed


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_data(*names): needs optional data (tests/_optional_data.py): skipped "
        "without it; `make data` installs it, `make test-data` runs these tests")


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = tuple(n for mark in item.iter_markers("needs_data") for n in mark.args)
        lacking = _optional_data.missing(names) if names else None
        if lacking is not None:
            item.add_marker(pytest.mark.skip(reason=_optional_data.reason(lacking)))

@pytest.fixture(params=[torch.float64, torch.float32], ids=["f64", "f32"])
def dtype(request):
    return request.param


@pytest.fixture
def cut_fit(monkeypatch):
    """``cut_fit(cfg, steps, **fit_kwargs)``: ``fit`` stopped by a KeyboardInterrupt after
    ``steps`` optimiser steps, as a kill would stop it (its last checkpoint stays); the real
    step is back afterwards."""
    from splitformer.training import loop as fit_module

    def run(cfg, steps, **kwargs):
        real = fit_module._step_on
        calls = {"n": 0}

        def interrupted(*args, **kw):
            calls["n"] += 1
            if calls["n"] > steps:
                raise KeyboardInterrupt
            return real(*args, **kw)

        monkeypatch.setattr(fit_module, "_step_on", interrupted)
        try:
            with pytest.raises(KeyboardInterrupt):
                fit_module.fit(cfg, **kwargs)
        finally:
            monkeypatch.setattr(fit_module, "_step_on", real)

    return run
