"""Adjoints as values: how the gradient of a loss of u(T) is computed through an evolution.

An evolution u^{i+1} = S_tau(theta^i) u^i, i = 0 .. N_t - 1, has one discrete adjoint (the
gradient of the loss with respect to theta and u^0); the adjoints below compute that same
gradient and differ only in what they keep in memory (diffrax's ``adjoint=``):

    Backprop()     autograd through every substep (today's behaviour). Memory:
                   N_t x substeps x activations.
    Checkpoint()   only u(t_i) at step boundaries is kept; the backward pass recomputes the
                   substeps of step i from u(t_i) (``torch.utils.checkpoint``, non-reentrant,
                   RNG state preserved, so dropout masks are the same). Memory:
                   N_t x state + the activations of one step. Equals Backprop to round-off.
    Reversible()   the reversible scheme only (``ReversibleScheme``): nothing along the
                   path is kept; the backward pass rebuilds (u^i, v^i) from (u^{i+1}, v^{i+1})
                   by inverting the substeps exactly, x^i = x^{i+1} - h F(y), and recomputes
                   one substep's activations at a time. Activation memory does not grow with
                   N_t (an RNG state of a few kB is kept per substep that draws random
                   numbers, dropout in train mode, so that its masks are replayed). Equals
                   Backprop of the same scheme up to the round-off of the reconstruction.
                   States kept along the path (a SaveAt, e.g. for the kinetic energy) are
                   outputs of the run and cost N_t x state. No second derivatives (the
                   backward pass is not differentiable).

Give one by name (``ADJOINTS``: "backprop", "checkpoint", "reversible") or as a value:
``Evolution(..., adjoint="checkpoint")``, ``evolution.with_adjoint(Checkpoint())``.

In train mode a recomputation runs the operators a second time; buffers they update in place
(BatchNorm's running statistics) are restored afterwards, so every adjoint leaves the same
buffers as Backprop.

The reversible scheme itself (docs/math.md 3.9: the doubled state (u, v), its ``lift``, ``read``
and compiled step) lives with the other schemes, ``time.schemes.reversible``; ``ReversibleScheme``
and ``reversible`` are importable from here too. Its backward pass is below: each substep
x <- x + h F(y) leaves y unchanged, so it is inverted exactly by x <- x - h F(y).

This module and ``time.evolution`` import each other, the one import circle of the package, and
an honest one (diffrax has the same): an evolution holds an adjoint and asks it to run its
steps, and an adjoint runs them through the evolution's own ``advance`` and ``theta``; the
adjoints need the evolution only as a type (a TYPE_CHECKING import), never to build one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from ..operators.base import Context
from .schemes.reversible import ReversibleScheme, reversible
from .schemes.reversible import _CoupledStages as _CoupledStages  # (pickles from before)
from .schemes.stages import Scheme

if TYPE_CHECKING:
    from .evolution import Evolution

__all__ = ["ADJOINTS", "Adjoint", "Backprop", "Checkpoint", "Reversible", "ReversibleScheme",
           "adjoint_names", "resolve_adjoint", "reversible"]


# -- the adjoints ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Adjoint:
    """Base of the adjoints: ``solve`` runs the N_t steps of an evolution on the scheme's state
    and records the grid points that ``keep`` asks for."""

    name: ClassVar[str] = "adjoint"

    def check(self, scheme: Scheme) -> None:
        """Raise ValueError when this adjoint cannot run ``scheme``."""

    def solve(self, evolution: Evolution, state: torch.Tensor, context: Context | None,
              keep, subs) -> torch.Tensor:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name


def _record(evolution: Evolution, keep, i: int, state: torch.Tensor) -> None:
    if keep is not None and i in keep[0]:
        keep[1].append((i, evolution.scheme_read(state)))


@dataclass(frozen=True)
class Backprop(Adjoint):
    """Autograd through every substep: the discrete adjoint as the graph of the forward pass."""

    name: ClassVar[str] = "backprop"

    def solve(self, evolution, state, context, keep, subs):
        for i in range(evolution.num_steps):
            state = evolution.advance(i, state, context, evolution.observer(i, subs))
            _record(evolution, keep, i + 1, state)
        return state


@dataclass(frozen=True)
class Checkpoint(Adjoint):
    """Keep u(t_i) at step boundaries only; recompute one step's substeps in the backward pass
    (``torch.utils.checkpoint``, ``use_reentrant=False``, ``preserve_rng_state=True``).

    Without autograd (``torch.no_grad()``, inference) it is Backprop: nothing is recorded.
    """

    name: ClassVar[str] = "checkpoint"

    def solve(self, evolution, state, context, keep, subs):
        if not torch.is_grad_enabled():
            return Backprop().solve(evolution, state, context, keep, subs)
        for i in range(evolution.num_steps):
            step = _OneStep(evolution, i, context, evolution.observer(i, subs))
            state = checkpoint(step, state, use_reentrant=False, preserve_rng_state=True)
            _record(evolution, keep, i + 1, state)
        return state


class _OneStep:
    """Step i as a function of the state; the first call is the forward pass, later calls
    are recomputations: no observer (validation, substeps) and the buffers restored."""

    def __init__(self, evolution: Evolution, i: int, context, observe) -> None:
        self.evolution, self.i, self.context, self.observe = evolution, i, context, observe
        self.calls = 0

    def __call__(self, state: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            return self.evolution.advance(self.i, state, self.context, self.observe)
        with buffers_kept(self.evolution.controls):
            return self.evolution.advance(self.i, state, self.context, None)


@contextlib.contextmanager
def buffers_kept(module: nn.Module) -> Iterator[None]:
    """Run a recomputation: every buffer of ``module`` (BatchNorm's running statistics) is
    restored to its value before it on exit, so a recomputed forward updates nothing twice."""
    saved = [(b, b.detach().clone()) for b in module.buffers() if b is not None and b.numel()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


@dataclass(frozen=True)
class Reversible(Adjoint):
    """Rebuild the path backwards by inverting the steps of the reversible scheme: activation
    memory independent of N_t (see the module docstring). Needs ``ReversibleScheme``."""

    name: ClassVar[str] = "reversible"

    def check(self, scheme: Scheme) -> None:
        if not isinstance(scheme, ReversibleScheme):
            raise ValueError(
                f"adjoint 'reversible' needs the reversible scheme (its steps are inverted in "
                f"the backward pass), but the scheme is {scheme.name!r} [{scheme}]: use "
                "with_scheme('reversible') first, or adjoint 'checkpoint' for this scheme")

    def solve(self, evolution, state, context, keep, subs):
        self.check(evolution.scheme)
        if not torch.is_grad_enabled():
            return Backprop().solve(evolution, state, context, keep, subs)
        n = evolution.num_steps
        inner = sorted(i for i in (keep[0] if keep is not None else ()) if 0 < i < n)
        extra = _context_tensors(context)
        params = [p for p in evolution.controls.parameters() if p.requires_grad]
        run = _RevRun(evolution, context, inner, subs, len(params), extra)
        final, *kept = _ReversibleFunction.apply(run, state, *params, *extra)
        for i, s in zip(inner, kept, strict=True):
            _record(evolution, keep, i, s)
        _record(evolution, keep, n, final)
        return final


ADJOINTS: dict[str, type[Adjoint]] = {"backprop": Backprop, "checkpoint": Checkpoint,
                                      "reversible": Reversible}


def adjoint_names() -> list[str]:
    """Every adjoint name ``resolve_adjoint`` accepts."""
    return list(ADJOINTS)


def resolve_adjoint(adjoint: str | Adjoint, what: str = "adjoint") -> Adjoint:
    """An Adjoint from a name (surrounding whitespace ignored) or an Adjoint value; ``what``
    names the argument in the error."""
    if isinstance(adjoint, Adjoint):
        return adjoint
    if isinstance(adjoint, str):
        name = adjoint.strip()
        if name in ADJOINTS:
            return ADJOINTS[name]()
        raise ValueError(f"{what} must be one of {adjoint_names()} (or an Adjoint value), got "
                         f"{adjoint!r}")
    raise TypeError(f"{what} must be an adjoint name ({adjoint_names()}) or an Adjoint value, "
                    f"got {type(adjoint).__name__} {adjoint!r}")


# -- the reversible backward pass ------------------------------------------------------------
def _context_tensors(context: Context | None) -> list[torch.Tensor]:
    """Tensors of the context that need a gradient (e.g. a cross-attention memory)."""
    if context is None:
        return []
    values = [context.attn_mask, context.memory, context.memory_mask, context.memory_weights,
              context.memory_coords, context.token_weights, context.token_coords,
              *(context.rotary.tensors() if context.rotary is not None else ()),
              *context.extra.values()]
    return [t for t in values if isinstance(t, torch.Tensor) and t.requires_grad]


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _rng_moved(before, device: torch.device) -> bool:
    """Whether the global RNG state differs from ``before`` (a substep used dropout)."""
    now = _rng_state(device)
    if not torch.equal(now[0], before[0]):
        return True
    return now[1] is not None and not torch.equal(now[1], before[1])


@contextlib.contextmanager
def _replay_rng(state, device: torch.device) -> Iterator[None]:
    """Run with the global RNG set to ``state`` (None: as it is), restoring it afterwards."""
    if state is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield


@dataclass
class _RevRun:
    """What the reversible Function needs besides tensors."""

    evolution: Any
    context: Context | None
    inner: list[int]  # grid indices 0 < i < N_t whose state is an output
    subs: list | None
    num_params: int
    extra: list[torch.Tensor]
    rng: list | None = None


class _ReversibleFunction(torch.autograd.Function):
    """(state_0, params, context tensors) -> (state_N, states at ``inner``), no graph kept.

    backward: for i = N-1 .. 0 and j = m-1 .. 0, with x the component stage j updated and y
    the other one: recompute f = h F_j(y) with grad, x <- x - f (the inverse substep), and
    g_y += (d f / d y)^T g_x, g_theta += (d f / d theta)^T g_x (g_x is unchanged).
    """

    @staticmethod
    def forward(ctx, run: _RevRun, state: torch.Tensor, *tensors: torch.Tensor):
        evo = run.evolution
        scheme: ReversibleScheme = evo.scheme
        training = any(m.training for m in evo.controls.modules())
        run.rng = [] if training else None
        kept = []
        want = set(run.inner)
        tau = evo.tau
        for i in range(evo.num_steps):
            theta = evo.theta(i)
            observe = evo.observer(i, run.subs)
            parts = list(state.unbind(0))
            for j, st in enumerate(scheme.stages):
                before = _rng_state(state.device) if run.rng is not None else None
                t = scheme.target(j)
                parts[t] = torch.add(parts[t], scheme.field(j, parts[1 - t], theta, run.context),
                                     alpha=st.fraction * tau)
                if run.rng is not None:  # kept only where the substep drew random numbers
                    run.rng.append(before if _rng_moved(before, state.device) else None)
                if observe is not None:
                    observe(torch.stack(parts), j)
            state = torch.stack(parts)
            if i + 1 in want:
                kept.append(state)
        ctx.run = run
        ctx.save_for_backward(state)
        return (state, *kept)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_final, *g_kept):
        run: _RevRun = ctx.run
        evo = run.evolution
        scheme: ReversibleScheme = evo.scheme
        (state,) = ctx.saved_tensors
        params = [p for p in evo.controls.parameters() if p.requires_grad]
        inputs = [*params, *run.extra]
        grads: list[torch.Tensor | None] = [None] * len(inputs)
        parts = [x.detach() for x in state.unbind(0)]
        g = [torch.zeros_like(x) for x in parts] if g_final is None else list(g_final.unbind(0))
        kept_grads = dict(zip(run.inner, g_kept, strict=True))
        m = len(scheme.stages)
        tau = evo.tau
        device = state.device
        with buffers_kept(evo.controls):
            for i in reversed(range(evo.num_steps)):
                gk = kept_grads.get(i + 1)
                if gk is not None:
                    g = [a + b for a, b in zip(g, gk.unbind(0), strict=True)]
                for j in reversed(range(m)):
                    t = scheme.target(j)
                    h = scheme.stages[j].fraction * tau
                    rng = run.rng[i * m + j] if run.rng is not None else None
                    with torch.enable_grad(), _replay_rng(rng, device):
                        theta = evo.theta(i)  # per substep: linear controls are lerps
                        y = parts[1 - t].detach().requires_grad_(True)
                        f = scheme.field(j, y, theta, run.context)
                    parts[t] = torch.sub(parts[t], f.detach(), alpha=h)
                    out = torch.autograd.grad(f, [y, *inputs], grad_outputs=g[t] * h,
                                              allow_unused=True)
                    g[1 - t] = g[1 - t] + out[0]
                    for k, gi in enumerate(out[1:]):
                        if gi is not None:
                            grads[k] = gi if grads[k] is None else grads[k] + gi
        return (None, torch.stack(g), *grads)
