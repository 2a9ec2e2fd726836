"""Test set-up: the torchvision workaround for timm (here, never in the library), offline
Hugging Face, one torch thread per worker, the dtype fixture. Helpers that tests share live in
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
