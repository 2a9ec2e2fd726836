"""Timing and memory of a set of networks measured side by side, in one process.

A ``Contender`` is a network with its inputs: ``model(*inputs)`` runs it, ``output`` picks the
tensor a training step takes its loss from (a model output object, a tuple). ``measure`` times
every contender on one *path* with the repeats interleaved (A B C A B C ...), so that the
machine's noise falls on all of them alike, and returns the median of each:

    "train"    train mode: zero_grad, forward, loss = mean(out^2), backward
    "eval"     eval mode, forward with autograd on (what a user gets without no_grad)
    "no_grad"  eval mode, forward under torch.no_grad()
    "inference"  eval mode, forward under torch.inference_mode()

``matmul_peak`` is this machine's float32 matmul rate (a square ``torch.mm``, measured in the
same process). ``peak_memory`` is the peak of the bytes that live tensors hold during one call,
above what was held before it, as the CPU allocator reports them to the profiler (on a CUDA
device: ``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["PATHS", "Contender", "matmul_peak", "measure", "ms", "peak_memory",
           "quiet_stderr", "step_fn"]

PATHS = ("train", "eval", "no_grad", "inference")


def ms(seconds: float) -> str:
    """Seconds as milliseconds for a table: one decimal below 10 s, none above."""
    return f"{seconds * 1e3:,.1f}" if seconds < 10 else f"{seconds * 1e3:,.0f}"


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for key in ("last_hidden_state", "logits"):
        v = getattr(out, key, None)
        if isinstance(v, torch.Tensor):
            return v
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"cannot find the output tensor in a {type(out).__name__}; give the "
                    "Contender an `output` function")


@dataclass
class Contender:
    """A network to time: ``model(*inputs, **kwargs)``; ``output(result)`` is the tensor a
    training step's loss is taken from (default: the result, its ``last_hidden_state`` or
    ``logits``, or its first element). ``note`` says what it is (shown in tables)."""

    name: str
    model: nn.Module
    inputs: tuple
    kwargs: dict = field(default_factory=dict)
    output: Callable[[Any], torch.Tensor] = _first_tensor
    note: str = ""

    @property
    def parameters(self) -> int:
        seen: set[int] = set()
        n = 0
        for p in self.model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n


def step_fn(c: Contender, path: str) -> Callable[[], None]:
    """One call of ``c`` on ``path`` (sets the model's mode first)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    model, inputs, kwargs, output = c.model, c.inputs, c.kwargs, c.output
    model.train(path == "train")
    if path == "train":
        params = [p for p in model.parameters() if p.requires_grad]

        def run() -> None:
            for p in params:
                p.grad = None
            output(model(*inputs, **kwargs)).float().square().mean().backward()
    elif path == "eval":
        def run() -> None:
            with torch.enable_grad():
                model(*inputs, **kwargs)
    elif path == "no_grad":
        def run() -> None:
            with torch.no_grad():
                model(*inputs, **kwargs)
    else:
        def run() -> None:
            with torch.inference_mode():
                model(*inputs, **kwargs)
    return run


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _device(c: Contender) -> torch.device | None:
    for p in c.model.parameters():
        return p.device
    return None


def measure(contenders: Sequence[Contender], path: str, *, repeats: int = 5,
            warmup: int = 1, on_repeat: Callable[[], None] | None = None
            ) -> dict[str, dict[str, float]]:
    """Median seconds (and min, max, the repeats) of each contender on ``path``, the repeats
    interleaved. ``repeats`` >= 1 (the issue's tables use >= 5)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    runs = [(c, step_fn(c, path), _device(c)) for c in contenders]
    for _c, run, dev in runs:
        for _ in range(warmup):
            run()
        _sync(dev)
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    for _ in range(repeats):
        for c, run, dev in runs:
            _sync(dev)
            t0 = time.perf_counter()
            run()
            _sync(dev)
            times[c.name].append(time.perf_counter() - t0)
        if on_repeat is not None:
            on_repeat()
    for c in contenders:
        c.model.zero_grad(set_to_none=True)
    return {name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                   "times_s": ts} for name, ts in times.items()}


def matmul_peak(n: int = 2048, repeats: int = 5, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of an n x n by n x n ``torch.mm`` (2 n^3 FLOPs), the median of ``repeats``."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    dev = torch.device(device)
    a @ b
    ts = []
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        a @ b
        _sync(dev)
        ts.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / statistics.median(ts)


@contextlib.contextmanager
def quiet_stderr():
    """File descriptor 2 to /dev/null for a while (the profiler's C++ start/stop lines)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def peak_memory(fn: Callable[[], None], device: torch.device | str = "cpu") -> int:
    """Peak bytes held by tensors during ``fn()`` above what was held when it started.

    CPU: the allocator's own allocation and free records (``torch.profiler`` with
    ``profile_memory``), summed in time order. CUDA: ``torch.cuda.max_memory_allocated``."""
    dev = torch.device(device)
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - base)
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    live = peak = 0
    for _, nbytes in sorted(events):
        live += nbytes
        peak = max(peak, live)
    return int(peak)
