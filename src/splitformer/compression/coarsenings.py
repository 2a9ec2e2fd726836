"""Coarse time grids of a trained network (docs/math.md 3.13, docs/depth.md "Methods").

A network of L steps (T = L, tau = 1) is one discretisation of an evolution; a coarse network
of N < L steps is another. Each method below chooses one and returns it as a ``Coarsening``
value: the derivation (a tuple of operations on the model, each a (name, argument) pair, all
of them copies sharing the parameters: ``drop_steps``, ``refine``, ``coarsen``,
``with_controls_in_time``, ``with_token_merging``) and, for every coarse grid point, the fine
grid point whose state it approximates (the targets of multiple shooting; None where a coarse
point falls between fine ones). For a dropped grid, coarse point j is the input of the j-th kept
step k_j and approximates the fine u(k_j): the kept steps keep their trained inputs, and the
kept step before a dropped stretch is asked to do its work (keep (0, 4, 5) of 6: targets
u_0, u_4, u_5, u_6).

    keep-first     the first N steps (the last L - N dropped)
    every-other    steps 0, k, 2k, ... at tau = 1 (k = L / N)
    drop           ShortGPT (Men et al. 2024): the L - N steps of least block influence
                   BI_n = 1 - mean_x cos(u_n(x), u_{n+1}(x)) on the probe text, dropped
    angular        Gromov et al. 2024: the L - N consecutive steps n .. n + L - N - 1 whose
                   angular distance between u_n and u_{n+L-N} is least, dropped
    coarsen        tau -> (L / N) tau on [0, T] (``refine(N / g).coarsen(L / g)``, g = gcd):
                   each coarse step reads the constant controls at its midpoint
    coarsen-linear the same with piecewise-linear controls: two unit steps merge into one of
                   tau = 2 with the average controls (theta^n + theta^(n+1)) / 2
    parallel       "Transformer layers as painters" (Sun et al. 2024): the L - N + 1 middle
                   steps a .. a + L - N (a = (N - 1) // 2) run as one step of superposed
                   fields, u + sum_k F_k(u) (``parallel_steps``: the state frozen at the
                   stretch's start, the field's time integral exact; not exportable as a layer)
    sleb           SLEB (Song et al. 2024), causal LMs: the L - N steps removed one at a time,
                   each time the one whose removal gives the least next-token loss on the
                   probe text (``rankings.sleb_order``)
    pairs          L - N disjoint pairs of neighbouring steps (n, n + 1), chosen to minimise
                   the sum of their merge errors e_n (``rankings.merge_errors``: the splitting
                   error of one step of tau = 2 at the average controls, from u(t) alone);
                   the grid keeps step n of each pair and drops n + 1, so step n absorbs
                   [n, n + 2]: with ``fitting``'s absorb "average" it is the merged step
                   (coarsen-linear's, for the chosen pairs only)

keep-first is the LLM literature's "reverse order" (drop the last L - N layers).

The block influence and angular distance are ``analysis.geometry``'s, on the fine model's
trajectory over the probe inputs (``probe``: the keyword inputs of the model's forward, e.g.
``{"input_ids": ids}``; healing text, never the evaluation documents).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..analysis.geometry import angular_distance, block_influence

__all__ = ["DATA_DRIVEN", "METHODS", "Coarsening", "Probe", "method_names", "plan"]

OPS = ("drop_steps", "parallel_steps", "refine", "coarsen", "with_controls_in_time",
       "with_token_merging")


@dataclass(frozen=True)
class Coarsening:
    """A coarse grid of a fine network of ``fine_steps`` steps (module doc).

    method: the method's name; ops: ((operation, argument), ...) applied in order;
    fine_points: for coarse grid points 0 .. N, the fine grid point each approximates (its
    first is 0, its last the fine N_t) or None; note: what the method measured (e.g. the block
    influences), JSON values.
    """

    method: str
    fine_steps: int
    ops: tuple[tuple[str, Any], ...]
    fine_points: tuple[int | None, ...]
    note: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for op in self.ops:
            if not (isinstance(op, tuple) and len(op) == 2 and op[0] in OPS):
                raise ValueError(f"Coarsening.ops: each operation is (name, argument) with a "
                                 f"name of {OPS}, got {op!r}")

    @property
    def steps(self) -> int:
        """N_t of the coarse network."""
        return len(self.fine_points) - 1

    def apply(self, model):
        """The coarse model: the operations on ``model`` (copies sharing its parameters)."""
        for name, arg in self.ops:
            model = _APPLY[name](model, arg)
        return model

    def with_merging(self, r: int, **options: Any) -> Coarsening:
        """The same grid with token merging (r nodes per unit of time; ``options`` those of
        ``with_token_merging``) added last; r = 0 is the grid itself."""
        if not r:
            return self
        return Coarsening(self.method, self.fine_steps,
                          (*self.ops, ("with_token_merging", {"r": r, **options})),
                          self.fine_points, self.note)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "fine_steps": self.fine_steps,
                "ops": [[name, _jsonable(arg)] for name, arg in self.ops],
                "fine_points": list(self.fine_points), "note": dict(self.note or {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Coarsening:
        try:
            ops = tuple((str(name), _op_argument(str(name), arg)) for name, arg in data["ops"])
            return cls(str(data["method"]), int(data["fine_steps"]), ops,
                       tuple(None if p is None else int(p) for p in data["fine_points"]),
                       data.get("note") or None)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a Coarsening record ({type(e).__name__}: {e}): "
                             f"{data!r:.200}") from None

    def __str__(self) -> str:
        ops = ", ".join(f"{name}({_jsonable(arg)})" for name, arg in self.ops)
        return f"{self.method}: {self.fine_steps} -> {self.steps} steps [{ops}]"


_APPLY: dict[str, Callable[[Any, Any], Any]] = {
    "drop_steps": lambda m, arg: m.drop_steps(list(arg)),
    "parallel_steps": lambda m, groups: m.parallel_steps([list(g) for g in groups]),
    "refine": lambda m, k: m.refine(k),
    "coarsen": lambda m, k: m.coarsen(k),
    "with_controls_in_time": lambda m, reading: m.with_controls_in_time(reading),
    "with_token_merging": lambda m, options: m.with_token_merging(**dict(options)),
}


def _op_argument(name: str, arg: Any) -> Any:
    """An operation's argument read back from JSON (lists to the tuples ``ops`` holds)."""
    if name == "drop_steps":
        return tuple(arg)
    if name == "parallel_steps":
        return tuple(tuple(g) for g in arg)
    return arg


def _jsonable(arg: Any) -> Any:
    if isinstance(arg, tuple):
        return [_jsonable(a) for a in arg]
    if isinstance(arg, Mapping):
        return dict(arg)
    return arg


class Probe:
    """The probe text of the data-driven methods: ``inputs`` (the keyword inputs of the
    model's forward) and, when called, the fine model's states u_0 .. u_L on them (computed
    once)."""

    def __init__(self, model, inputs: Mapping[str, Any] | None, method: str) -> None:
        self.model, self.inputs, self.method = model, inputs, method
        self._states: list[torch.Tensor] | None = None

    def ids(self) -> torch.Tensor:
        if self.inputs is None or "input_ids" not in self.inputs:
            raise ValueError(f"{self.method}: needs probe input_ids (the fine model's "
                             "next-token loss on healing text chooses the steps)")
        return self.inputs["input_ids"]

    def __call__(self) -> list[torch.Tensor]:
        if self.inputs is None:
            raise ValueError(f"{self.method}: needs probe inputs (the fine model's states on "
                             "healing text choose the steps)")
        if self._states is None:
            with torch.no_grad():
                self._states = list(self.model.trajectory(**dict(self.inputs)).state_list)
        return self._states


def _dropped(method: str, model, drop: list[int], note: dict | None = None) -> Coarsening:
    L = model.evolution.num_steps
    keep = [i for i in range(L) if i not in drop]
    # coarse point j (the input of the j-th kept step) <- fine point keep[j]: each kept step
    # keeps its trained input, and the step before it absorbs the dropped ones
    points = (0, *keep[1:], L)
    return Coarsening(method, L, (("drop_steps", tuple(sorted(drop))),), points, note)


def keep_first(model, steps: int, probe: Probe) -> Coarsening:
    L = model.evolution.num_steps
    return _dropped("keep-first", model, list(range(steps, L)))


def every_other(model, steps: int, probe: Probe) -> Coarsening:
    L = model.evolution.num_steps
    if L % steps:
        raise ValueError(f"every-other: steps={steps} must divide the network's {L} steps")
    k = L // steps
    return _dropped("every-other", model, [i for i in range(L) if i % k])


def shortgpt(model, steps: int, probe: Probe) -> Coarsening:
    L = model.evolution.num_steps
    bi = block_influence(probe()).tolist()
    order = sorted(range(L), key=lambda n: bi[n])
    return _dropped("drop", model, sorted(order[:L - steps]),
                    {"block_influence": [round(b, 6) for b in bi]})


def angular(model, steps: int, probe: Probe) -> Coarsening:
    L = model.evolution.num_steps
    states, m = probe(), L - steps
    dist = [float(angular_distance(states[n], states[n + m])) for n in range(L - m + 1)]
    n = min(range(len(dist)), key=lambda i: dist[i])
    return _dropped("angular", model, list(range(n, n + m)),
                    {"angular_distance": [round(d, 6) for d in dist]})


def _coarse_grid(method: str, model, steps: int, controls: str) -> Coarsening:
    L = model.evolution.num_steps
    if model.evolution.tau != 1.0:
        raise ValueError(f"{method}: needs the network (tau = 1), got tau="
                         f"{model.evolution.tau:g}")
    g = math.gcd(L, steps)
    ops: list[tuple[str, Any]] = []
    if controls != model.evolution.controls.interpolation:
        ops.append(("with_controls_in_time", controls))
    if steps // g > 1:
        ops.append(("refine", steps // g))
    if L // g > 1:
        ops.append(("coarsen", L // g))
    points = tuple(i * L // steps if (i * L) % steps == 0 else None for i in range(steps + 1))
    return Coarsening(method, L, tuple(ops), points)


def coarsen(model, steps: int, probe: Probe) -> Coarsening:
    return _coarse_grid("coarsen", model, steps, "constant")


def coarsen_linear(model, steps: int, probe: Probe) -> Coarsening:
    return _coarse_grid("coarsen-linear", model, steps, "linear")


def parallel(model, steps: int, probe: Probe) -> Coarsening:
    L = model.evolution.num_steps
    m = L - steps + 1
    if steps < 2:
        raise ValueError(f"parallel: steps={steps} would superpose all {L} steps into one; "
                         "the middle steps are superposed, so ask for at least 2")
    if m < 2:
        raise ValueError(f"parallel: steps={steps} leaves no two steps to superpose (at most "
                         f"{L - 1} of the network's {L})")
    a = (steps - 1) // 2
    group = tuple(range(a, a + m))
    # coarse point j: the start of coarse step j on the fine grid (the group starts at a)
    points = (*range(a + 1), *range(a + m, L + 1))
    return Coarsening("parallel", L, (("parallel_steps", (group,)),), points)


def _causal_lm(model, method: str) -> None:
    from ..models.causal import CausalLM

    if not isinstance(model, CausalLM):
        raise ValueError(f"{method}: reads the next-token loss of a causal LM; "
                         f"{type(model).__name__} is not one")


def sleb(model, steps: int, probe: Probe) -> Coarsening:
    from .rankings import sleb_order

    _causal_lm(model, "sleb")
    L = model.evolution.num_steps
    found = sleb_order(model, probe.ids(), L - steps)
    return _dropped("sleb", model, sorted(found["order"]),
                    {"order": found["order"],
                     "losses": [round(x, 6) for x in [found["loss"], *found["losses"]]]})


def pairs(model, steps: int, probe: Probe) -> Coarsening:
    from .rankings import merge_errors

    L = model.evolution.num_steps
    k = L - steps
    if 2 * k > L:
        raise ValueError(f"pairs: {k} disjoint pairs do not fit in {L} steps; steps must be "
                         f"at least {(L + 1) // 2}")
    e = merge_errors(model, probe.ids(), probe())
    chosen = _least_pairs(e, k)
    return _dropped("pairs", model, [n + 1 for n in chosen],
                    {"merge_error": [round(x, 6) for x in e], "pairs": chosen})


def _least_pairs(e: list[float], k: int) -> list[int]:
    """The first indices n of k disjoint pairs (n, n + 1) minimising sum e_n (dynamic
    programming over the steps)."""
    L = len(e) + 1
    inf = float("inf")
    # best[i][j]: least sum using steps i .. L - 1 with j pairs; choice[i][j]: pair at i?
    best = [[inf] * (k + 1) for _ in range(L + 2)]
    take = [[False] * (k + 1) for _ in range(L + 2)]
    for i in range(L + 1, -1, -1):
        best[i][0] = 0.0
    for i in range(L - 1, -1, -1):
        for j in range(1, k + 1):
            skip = best[i + 1][j]
            pair = e[i] + best[i + 2][j - 1] if i + 1 < L else inf
            best[i][j], take[i][j] = (pair, True) if pair < skip else (skip, False)
    out, i, j = [], 0, k
    while j:
        if take[i][j]:
            out.append(i)
            i, j = i + 2, j - 1
        else:
            i += 1
    return out


METHODS: dict[str, Callable[[Any, int, Probe], Coarsening]] = {
    "keep-first": keep_first,
    "every-other": every_other,
    "drop": shortgpt,
    "angular": angular,
    "coarsen": coarsen,
    "coarsen-linear": coarsen_linear,
    "parallel": parallel,
    "sleb": sleb,
    "pairs": pairs,
}

DATA_DRIVEN = ("drop", "angular", "sleb", "pairs")
"""The methods that read the fine model on probe text."""


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def plan(method: str, model, steps: int, probe: Mapping[str, Any] | None = None
         ) -> Coarsening:
    """The coarse grid ``method`` chooses for ``model`` (a network, tau = 1, one evolution)
    with ``steps`` steps; ``probe``: the keyword inputs the data-driven methods (drop,
    angular) run the fine model on. ValueError naming the argument otherwise."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    owners = model.evolution_owners()
    if len(owners) != 1:
        raise ValueError(f"{method}: the model runs {len(owners)} evolutions; compression "
                         "coarsens one")
    L = model.evolution.num_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= L:
        raise ValueError(f"steps must be an int in [1, {L}] (at most the network's {L} "
                         f"steps), got {steps!r}")
    if model.evolution.tau != 1.0:
        raise ValueError(f"{method}: needs the network (tau = 1), got tau="
                         f"{model.evolution.tau:g}")

    if steps == L:  # the network itself (a depth of random-tau healing)
        return Coarsening(method, L, (), tuple(range(L + 1)))
    return METHODS[method](model, steps, Probe(model, probe, method))
