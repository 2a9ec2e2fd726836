"""What each step of a decoder is worth: measured losses and diagnostics of the evolution
(docs/math.md 3.13, 3.20; docs/depth-llm.md "Which diagnostic predicts a step's worth").

On calibration windows ``ids`` ((M, n) token ids, no padding) of a causal LM ``model`` with
L steps (tau = 1), writing u_0 .. u_L for its states and

    loss(D) = mean over windows and positions x = 1 .. n - 1 of -log p_D(id_x | id_<x),

p_D the next-token distribution of the model with the steps D dropped:

    removal_losses     loss({n}) for every step n: the measured worth of each step (what
                       SLEB's first iteration reads)
    sleb_order         SLEB (Song et al. 2024): D grows one step at a time, each time by the
                       step whose removal gives the least loss(D + {n}); the order of removal
                       (a prefix of it is the grid for every N)
    block_influence    ShortGPT: BI_n = 1 - mean_x cos(u_n(x), u_(n+1)(x))
    angular            Gromov et al.: mean_x arccos(cos(u_n(x), u_(n+1)(x))) / pi
    merge_errors       the splitting error of merging steps n, n + 1 into one step of tau = 2
                       at the average controls, from u(t) alone:
                           e_n = mean_x |S_2tau(u_n)(x) - u_(n+2)(x)|^2 / |u_(n+2)(x)|^2
                       (each token relative to its own norm), n = 0 .. L - 2
    removal_errors     the local error of removing step n alone,
                       mean_x |u_n(x) - u_(n+1)(x)|^2 / |u_(n+1)(x)|^2: what a deleted step
                       leaves undone, in the state

Every function runs the model in eval mode and without gradients; the prefix of the path
before a removed step is computed once and reused (each candidate runs only the steps after
it), which is what makes SLEB affordable on 2 cores.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..analysis.geometry import angular_distance, block_influence
from ..time import Controls, Evolution, SaveAt, TimeGrid

__all__ = ["angular", "block_influences", "merge_errors", "removal_errors",
           "removal_losses", "sleb_order", "step_diagnostics"]

Say = Callable[[str], None] | None


class _Path:
    """The model's u_0 and contexts on ``ids`` in batches, and runs of a subset of its steps
    from a state to the next-token loss."""

    def __init__(self, model: nn.Module, ids: torch.Tensor, batch: int) -> None:
        if not (isinstance(ids, torch.Tensor) and ids.dim() == 2
                and not ids.is_floating_point() and ids.shape[1] >= 2):
            raise ValueError(f"ids must be (M, n >= 2) integer token ids, got "
                             f"{_described(ids)}")
        self.model = model
        self.L = len(model.evolution.controls)
        self.batches = [ids[s:s + batch] for s in range(0, len(ids), batch)]
        self.contexts = []
        self.u0 = []
        for b in self.batches:
            u0, ctx = model.initial_condition(input_ids=b)
            self.u0.append(u0)
            self.contexts.append(ctx)

    def steps(self, kept: Sequence[int]):
        """The evolution of the steps ``kept`` (in order; None when empty)."""
        kept = list(kept)
        if not kept:
            return None
        return self.model.evolution.drop_steps([i for i in range(self.L) if i not in kept])

    def run(self, kept: Sequence[int], starts: Sequence[torch.Tensor] | None = None,
            keep_states: bool = False):
        """Run the steps ``kept`` from ``starts`` (per batch; u_0 by default): the loss, and
        with ``keep_states`` the states before each kept step and u(T), per batch."""
        evo = self.steps(kept)
        starts = self.u0 if starts is None else starts
        total, count, paths = 0.0, 0, []
        for b, ctx, u in zip(self.batches, self.contexts, starts, strict=True):
            if evo is not None:
                if keep_states:
                    traj = evo(u, ctx, SaveAt(steps=True))
                    paths.append(list(traj.state_list))
                    u = traj.final
                else:
                    u = evo(u, ctx)
            elif keep_states:
                paths.append([u])
            logits = self.model.read_out(u, ctx).logits
            total += float(F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                           b[:, 1:].flatten(), reduction="sum"))
            count += b[:, 1:].numel()
        return total / count, paths


def _eval(model: nn.Module):
    class _Eval:
        def __enter__(self):
            self.was = model.training
            model.eval()
            self.grad = torch.is_grad_enabled()
            torch.set_grad_enabled(False)

        def __exit__(self, *exc):
            torch.set_grad_enabled(self.grad)
            model.train(self.was)
    return _Eval()


def removal_losses(model: nn.Module, ids: torch.Tensor, *, batch: int = 4,
                   say: Say = None) -> dict[str, object]:
    """{"loss": loss(empty set), "removal": [loss({n}) for n in 0 .. L - 1]} (module doc)."""
    with _eval(model):
        path = _Path(model, ids, batch)
        full, states = path.run(range(path.L), keep_states=True)
        out = []
        for n in range(path.L):
            if say is not None:
                say(f"removal losses: step {n + 1} of {path.L}")
            starts = [s[n] for s in states]
            out.append(path.run(range(n + 1, path.L), starts)[0])
        return {"loss": full, "removal": out}


def sleb_order(model: nn.Module, ids: torch.Tensor, count: int, *, batch: int = 4,
               say: Say = None) -> dict[str, object]:
    """SLEB's removal order of ``count`` steps (module doc): {"order": [n_1, n_2, ...],
    "losses": [loss({n_1}), loss({n_1, n_2}), ...], "loss": loss(empty set)}."""
    with _eval(model):
        path = _Path(model, ids, batch)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < path.L:
            raise ValueError(f"count must be an int in [0, {path.L - 1}] (steps removed), got "
                             f"{count!r}")
        kept = list(range(path.L))
        full, states = path.run(kept, keep_states=True)
        order, losses = [], []
        for it in range(count):
            best = None
            for j, n in enumerate(kept):
                loss = path.run(kept[j + 1:], [s[j] for s in states])[0]
                if best is None or loss < best[0]:
                    best = (loss, j, n)
            loss, j, n = best
            if say is not None:
                say(f"SLEB: removal {it + 1} of {count}: step {n} (loss {loss:.4f})")
            order.append(n)
            losses.append(loss)
            kept.pop(j)
            # the states before the kept steps from j on change: recompute them from s[j]
            tail = path.run(kept[j:], [s[j] for s in states], keep_states=True)[1]
            states = [s[:j] + t for s, t in zip(states, tail, strict=True)]
        return {"order": order, "losses": losses, "loss": full}


def _trajectory(model: nn.Module, ids: torch.Tensor, batch: int) -> list[torch.Tensor]:
    parts = [model.trajectory(input_ids=ids[s:s + batch], saveat=SaveAt(steps=True)).state_list
             for s in range(0, len(ids), batch)]
    return [torch.cat([p[i] for p in parts]) for i in range(len(parts[0]))]


def block_influences(states: Sequence[torch.Tensor]) -> list[float]:
    return [float(b) for b in block_influence(states)]


def angular(states: Sequence[torch.Tensor]) -> list[float]:
    return [float(angular_distance(a, b)) for a, b in zip(states[:-1], states[1:],
                                                           strict=True)]


def _rel(u: torch.Tensor, target: torch.Tensor) -> float:
    from .fitting import relative_error

    return float(relative_error(u.double(), target.double()))


def removal_errors(states: Sequence[torch.Tensor]) -> list[float]:
    return [_rel(a, b) for a, b in zip(states[:-1], states[1:], strict=True)]


def merged_step(evolution: Evolution, n: int, m: int = 2) -> Evolution:
    """One step of tau = m at the average controls of steps n .. n + m - 1 of a network
    (copies: the evolution's parameters are not touched)."""
    from .fitting import average_controls_, fields

    sets = [copy.deepcopy(evolution.controls[i]) for i in range(n, n + m)]
    target = copy.deepcopy(sets[0])
    average_controls_(target, sets, fields(evolution))
    return Evolution(Controls([target]), evolution.scheme, TimeGrid(1.0, 1),
                     layout=evolution.layout)


def merge_errors(model: nn.Module, ids: torch.Tensor, states: Sequence[torch.Tensor] | None
                 = None, *, batch: int = 4, say: Say = None) -> list[float]:
    """e_n for n = 0 .. L - 2 (module doc), on ``ids`` (``states``: the model's u_0 .. u_L on
    them, computed when not given)."""
    with _eval(model):
        states = _trajectory(model, ids, batch) if states is None else list(states)
        L = len(states) - 1
        out = []
        for n in range(L - 1):
            if say is not None:
                say(f"merge errors: steps {n}, {n + 1}")
            one = merged_step(model.evolution, n)
            total = 0.0
            for s in range(0, len(ids), batch):
                ctx = model.initial_condition(input_ids=ids[s:s + batch])[1]
                u = one(states[n][s:s + batch], ctx)
                total += _rel(u, states[n + 2][s:s + batch]) * len(u)
            out.append(total / len(ids))
        return out


def step_diagnostics(model: nn.Module, ids: torch.Tensor, *, batch: int = 4,
                     say: Say = None) -> dict[str, list[float]]:
    """Per step n: block influence, angular distance, removal error, and the merge error of
    its pair with a neighbour (the lesser of e_(n-1) and e_n), all from u(t) on ``ids``."""
    with _eval(model):
        states = _trajectory(model, ids, batch)
        e = merge_errors(model, ids, states, batch=batch, say=say)
        L = len(states) - 1
        merge = [min(e[k] for k in (n - 1, n) if 0 <= k < L - 1) for n in range(L)]
        return {"block_influence": block_influences(states), "angular": angular(states),
                "removal_error": removal_errors(states), "merge_error": merge,
                "merge_errors": e}


def _described(x) -> str:
    """A tensor's shape, or the type of anything else (for messages)."""
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
