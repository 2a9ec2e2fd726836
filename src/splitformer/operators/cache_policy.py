"""Cache policies: coarsenings of the past part of the token grid (docs/math.md 3.12, 3.19).

At an attention evaluation e the KV tape holds the past nodes x_j < x_new with their keys K_j,
values V_j and quadrature weights w_j, and the kernel integrates against them,

    A_e[u](x) = sum_{x_j <= x} softmax_j(a(x, x_j) + log w_j) V_j.

A cache policy replaces that past grid by a coarser one of at most ``budget`` nodes per
evaluation and per key/value head (``CachePolicy.capacity``), after every forward (chunked
prefill and each decoding step alike):

* eviction: node j gets weight 0, i.e. it is removed from the buffers (the memory shrinks);
* merging (``QuadratureMerging``): nodes j, k become one node of weight w_j + w_k at the
  mass-weighted coordinate x_m = (w_j x_j + w_k x_k) / (w_j + w_k) with the mass-weighted mean
  unrotated key and value, rotated at x_m; splitting a node into two of half the weight at its
  coordinate changes nothing (``split_entry``), which is the consistency of the quadrature;
* value-only merging (``ValueMerging``, the rule of NVIDIA kvpress's MergingPress): evicted
  values are blended into the most similar kept ones, keys and weights untouched.

Policies are values (frozen dataclasses) with a declared protocol: ``name``, ``observes``
(which attention probabilities the tape must hand over: None, ``"all"`` queries of the forward
(H2O), the ``"last"`` query (TOVA), the last ``"window"`` queries (SnapKV)), ``capacity(seen)``
and ``compress(grid, keep, rotation)``. They act per attention evaluation (the tape is indexed
by evaluation in time, never by layer) and per key/value head: with grouped-query attention a
key/value head g serves H / H_kv query heads, and the attention a node receives is the mean
over those query heads (kvpress's convention). Each head keeps the same number of nodes, so
the buffers stay tensors (B, H_kv, n, d).

``budget``: a float in (0, 1] is the fraction of the tokens seen so far (ceil(b N) nodes after
N tokens), an int >= 1 a count of nodes per evaluation and head.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
import torch.nn.functional as F

from .rope import RotaryPositions, rotate_half

__all__ = [
    "POLICIES", "AdaptiveQuadrature", "CachePolicy", "CachedGrid", "FullCache", "HeavyHitters",
    "HeavyQuadrature",
    "QuadratureMerging", "Rotation", "SnapKV", "StreamingLLM", "TOVA", "ValueMerging",
    "budget_list", "cache_policy", "check_budget", "policy_list", "policy_spec", "split_entry",
]

# dtype of the stored quadrature weights, coordinates and attention scores (counts and
# positions are exact in float32 up to 2^24; the rotary angles are float32 anyway)
GRID_DTYPE = torch.float32


def check_budget(budget: object, name: str = "budget") -> float | int:
    """A budget, checked: a float in (0, 1] (fraction of the tokens seen) or an int >= 1
    (nodes per evaluation and key/value head). ValueError / TypeError naming ``name``."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"{name} must be a fraction in (0, 1] of the tokens seen or a count "
                        f"(int >= 1) of cache entries, got {type(budget).__name__} {budget!r}")
    if isinstance(budget, numbers.Integral):
        if budget < 1:
            raise ValueError(f"{name} must be a fraction in (0, 1] or a count >= 1 of cache "
                             f"entries, got {budget!r}")
        return int(budget)
    b = float(budget)
    if not math.isfinite(b) or not 0.0 < b <= 1.0:
        raise ValueError(f"{name} must be a fraction in (0, 1] of the tokens seen (or a count "
                         f"int >= 1 of cache entries), got {budget!r}")
    return b


@dataclass
class CachedGrid:
    """The past of one attention evaluation as a token grid per key/value head.

    ``keys`` and ``values`` (B, H_kv, n, d) as the operator hands them to the tape (rotated at
    the coordinates for the Llama family); ``weights`` w_j and ``coords`` x_j (B, H_kv, n);
    ``scores``: the attention each node received (what the policy observes; None if nothing).
    Nodes are in increasing coordinate order."""

    keys: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor
    coords: torch.Tensor
    scores: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.keys.shape[-2]

    def nbytes(self) -> int:
        """Bytes held: keys, values, weights, coordinates (and scores)."""
        ts = [self.keys, self.values, self.weights, self.coords]
        if self.scores is not None:
            ts.append(self.scores)
        return sum(t.numel() * t.element_size() for t in ts)

    def take(self, index: torch.Tensor) -> CachedGrid:
        """The nodes ``index`` (B, H_kv, m), in that order (a new grid; the buffers shrink)."""
        d_k, d_v = self.keys.shape[-1], self.values.shape[-1]
        return CachedGrid(
            keys=self.keys.gather(2, index[..., None].expand(*index.shape, d_k)),
            values=self.values.gather(2, index[..., None].expand(*index.shape, d_v)),
            weights=self.weights.gather(2, index), coords=self.coords.gather(2, index),
            scores=None if self.scores is None else self.scores.gather(2, index))

    def cat(self, other: CachedGrid) -> CachedGrid:
        """This grid followed by ``other`` along the node axis."""
        scores = None
        if self.scores is not None or other.scores is not None:
            a = self.scores if self.scores is not None else self.weights.new_zeros(
                self.weights.shape)
            b = other.scores if other.scores is not None else other.weights.new_zeros(
                other.weights.shape)
            scores = torch.cat([a, b], dim=2)
        return CachedGrid(torch.cat([self.keys, other.keys], 2),
                          torch.cat([self.values, other.values], 2),
                          torch.cat([self.weights, other.weights], 2),
                          torch.cat([self.coords, other.coords], 2), scores)


def split_entry(grid: CachedGrid, j: int) -> CachedGrid:
    """Node j of every head split into two nodes at x_j with weight w_j / 2 each (the copies at
    j and j + 1): the refinement under which the kernel's output is unchanged (3.12)."""
    n = len(grid)
    if not (isinstance(j, int) and not isinstance(j, bool) and 0 <= j < n):
        raise ValueError(f"split_entry: j must be an entry index in [0, {n}), got {j!r}")
    idx = torch.cat([torch.arange(j + 1), torch.tensor([j]), torch.arange(j + 1, n)]).to(
        grid.keys.device)
    b, h = grid.keys.shape[:2]
    out = grid.take(idx.expand(b, h, n + 1).contiguous())
    w = out.weights.clone()
    w[..., j:j + 2] = w[..., j:j + 2] / 2
    out.weights = w
    return out


class Rotation:
    """The pure rotations R_x of the rotary positions ``positions`` (without transformers'
    attention scaling, which a stored key keeps): ``rotate(k, x)`` = R_x k and
    ``unrotate(k, x)`` = R_{-x} k at per-head coordinates x (B, H_kv, n). Frequencies as
    ``RotaryPositions.angles`` at those coordinates (float32 angles)."""

    def __init__(self, positions: RotaryPositions) -> None:
        self.positions = positions

    def _angles(self, x: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, n = x.shape
        cos, sin = self.positions.angles(x.reshape(b * h, n), torch.float32)
        s = self.positions.attention_scaling()
        d = cos.shape[-1]
        return ((cos / s).reshape(b, h, n, d).to(dtype), (sin / s).reshape(b, h, n, d).to(dtype))

    def rotate(self, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self._angles(x, k.dtype)
        return rotate_half(k, cos, sin)

    def unrotate(self, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self._angles(x, k.dtype)
        return rotate_half(k, cos, -sin)


def _check_option(policy: str, name: str, value: object, ok: bool, what: str) -> None:
    if isinstance(value, bool) or not ok:
        raise ValueError(f"{policy}: {name} must be {what}, got {value!r}")


def _at(a: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx`` (B, H, m) of ``a`` (B, H, n, d) along the node axis."""
    return a.gather(2, idx[..., None].expand(*idx.shape, a.shape[-1]))


def _blend(wi: torch.Tensor, wj: torch.Tensor, ai: torch.Tensor, aj: torch.Tensor
           ) -> torch.Tensor:
    """The mass-weighted mean (w_i a_i + w_j a_j) / (w_i + w_j) of rows (B, H, m, d)."""
    return (wi[..., None] * ai + wj[..., None] * aj) / (wi + wj)[..., None]


def _ordered(index: torch.Tensor) -> torch.Tensor:
    """Kept indices sorted (the grid stays in coordinate order)."""
    return index.sort(dim=-1).values


def _recent_and_top(grid: CachedGrid, keep: int, recent: int, scores: torch.Tensor
                    ) -> CachedGrid:
    """The last ``recent`` nodes and the ``keep - recent`` others of the highest ``scores``."""
    n = len(grid)
    recent = max(0, min(recent, keep))
    b, h = grid.keys.shape[:2]
    dev = grid.keys.device
    tail = torch.arange(n - recent, n, device=dev).expand(b, h, recent)
    top = keep - recent
    if top <= 0:
        return grid.take(tail.contiguous())
    head = scores[..., :n - recent].topk(top, dim=-1).indices
    return grid.take(_ordered(torch.cat([head, tail], dim=-1)))


@dataclass(frozen=True)
class CachePolicy:
    """A coarsening of the past token grid, applied by the KV tape after every forward (module
    docstring). Subclasses set ``name``, ``observes`` and ``compress``."""

    budget: float | int = 1.0
    # entries per evaluation and head allowed above the budget before the policy compresses
    # back to it (0: after every forward). The policy's rule is the same; in decoding it runs
    # once per slack + 1 new tokens with a count budget (about slack / (1 - b) + 1 with a
    # fraction b) instead of after each, at a peak of budget + slack entries plus one
    # forward's new nodes (docs/cache.md, "Amortised compression")
    slack: int = field(default=0, kw_only=True)

    name: ClassVar[str] = "policy"
    # which attention probabilities the tape hands over: None, "all", "last" or "window"
    observes: ClassVar[str | None] = None
    # whether the policy moves coordinates or keys (needs the rotary positions of the keys)
    merges_keys: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", check_budget(self.budget))
        if not (isinstance(self.slack, numbers.Integral) and not isinstance(self.slack, bool)
                and self.slack >= 0):
            raise ValueError(f"slack must be an int >= 0 (entries above the budget before "
                             f"compressing), got {self.slack!r}")
        object.__setattr__(self, "slack", int(self.slack))

    def due(self, entries: int, seen: int) -> bool:
        """Whether a past of ``entries`` nodes per head after ``seen`` tokens is compressed
        now: it exceeds the capacity by more than ``slack``."""
        return entries > self.capacity(seen) + self.slack

    def capacity(self, seen: int) -> int:
        """Nodes kept per evaluation and key/value head after ``seen`` tokens."""
        b = self.budget
        return min(seen, b) if isinstance(b, int) else min(seen, math.ceil(b * seen))

    @property
    def compresses(self) -> bool:
        """Whether the policy can drop or merge anything (False: the plain tape)."""
        return not (isinstance(self.budget, float) and self.budget >= 1.0)

    def observed_queries(self, n: int) -> int:
        """How many of the last queries of a forward over ``n`` new nodes the policy observes:
        all of them ("all"), the last one ("last"); SnapKV its window."""
        return 1 if self.observes == "last" else n

    def observe(self, grid: CachedGrid, received: torch.Tensor) -> None:
        """Fold the attention ``received`` (B, H_kv, n) by the nodes of ``grid`` from the
        observed queries of this forward (summed over them, mean over the group's query heads)
        into ``grid.scores`` (default: replace)."""
        grid.scores = received.to(GRID_DTYPE)

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        """``grid`` with ``keep`` nodes per head (called when it has more)."""
        raise NotImplementedError

    def describe(self) -> str:
        slack = f", slack={self.slack}" if self.slack else ""
        return f"{self.name}(budget={self.budget}{slack})"


@dataclass(frozen=True)
class FullCache(CachePolicy):
    """Every node kept: the plain tape (A_e as in the module docstring, w_j = 1)."""

    name: ClassVar[str] = "full"

    def capacity(self, seen: int) -> int:
        return seen

    @property
    def compresses(self) -> bool:
        return False

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        return grid


@dataclass(frozen=True)
class StreamingLLM(CachePolicy):
    """StreamingLLM (Xiao et al. 2023): the support of the kernel is the ``sinks`` first nodes
    (the attention sink, a point mass of the measure, 3.19) and the most recent window,

        A_e[u](x) = sum_{j in S} softmax_j(a(x, x_j)) V_j,
        S = {the first sinks nodes} u {the last keep - sinks nodes},

    every other node evicted (weight 0), positions kept (the rotary angles of the kept keys are
    their original coordinates)."""

    sinks: int = 4
    name: ClassVar[str] = "streaming"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_option(self.name, "sinks", self.sinks,
                      isinstance(self.sinks, int) and self.sinks >= 0, "an int >= 0")

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        n = len(grid)
        s = min(self.sinks, keep)
        b, h = grid.keys.shape[:2]
        idx = torch.cat([torch.arange(s), torch.arange(n - (keep - s), n)]).to(grid.keys.device)
        return grid.take(idx.expand(b, h, keep).contiguous())


@dataclass(frozen=True)
class HeavyHitters(CachePolicy):
    """H2O (Zhang et al. 2023): the nodes of the largest accumulated attention
    sum_{queries x so far} g(x, x_j) (mean over the query heads of the group) and a recent
    window of ``recent`` times the budget; the others evicted."""

    recent: float = 0.5
    name: ClassVar[str] = "h2o"
    observes: ClassVar[str | None] = "all"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_option(self.name, "recent", self.recent, isinstance(self.recent, float | int)
                      and 0 <= self.recent <= 1, "a fraction in [0, 1] of the budget")

    def observe(self, grid: CachedGrid, received: torch.Tensor) -> None:
        r = received.to(GRID_DTYPE)
        if grid.scores is None:
            grid.scores = r
        else:
            grid.scores = grid.scores + r

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        assert grid.scores is not None
        return _recent_and_top(grid, keep, int(self.recent * keep), grid.scores)


@dataclass(frozen=True)
class TOVA(CachePolicy):
    """TOVA (Oren et al. 2024): the nodes the last query attends to most, g(x_last, x_j)
    (mean over the query heads of the group); the others evicted."""

    name: ClassVar[str] = "tova"
    observes: ClassVar[str | None] = "last"

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        assert grid.scores is not None
        return _recent_and_top(grid, keep, 0, grid.scores)


@dataclass(frozen=True)
class SnapKV(CachePolicy):
    """SnapKV (Li et al. 2024): the attention of the last ``window`` queries of the forward (the
    observation window at the prompt's end; in streaming, every forward's end), summed over
    those queries, averaged over the group's heads and pooled along the nodes (average pooling
    of width ``kernel``); the window's own nodes and the best pooled others kept."""

    window: int = 64
    kernel: int = 5
    name: ClassVar[str] = "snapkv"
    observes: ClassVar[str | None] = "window"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_window(self.name, self.window, self.kernel)

    def observed_queries(self, n: int) -> int:
        return min(self.window, n)

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        assert grid.scores is not None
        return _recent_and_top(grid, keep, min(self.window, keep // 2),
                               _pooled(grid.scores, self.kernel))


def _check_window(policy: str, window: object, kernel: object) -> None:
    """An observation window (an int >= 1 of last queries) and a pooling width (odd int)."""
    _check_option(policy, "window", window, isinstance(window, int) and window >= 1,
                  "an int >= 1")
    _check_option(policy, "kernel", kernel, isinstance(kernel, int) and kernel >= 1
                  and kernel % 2 == 1, "an odd int >= 1")


def _pooled(scores: torch.Tensor, kernel: int) -> torch.Tensor:
    """The observed attention (B, H, n) average-pooled along the nodes, width ``kernel``."""
    b, h, n = scores.shape
    return F.avg_pool1d(scores.reshape(b * h, 1, n), kernel, stride=1,
                        padding=kernel // 2).reshape(b, h, n)


@dataclass(frozen=True)
class ValueMerging(CachePolicy):
    """Value-only merging, the rule of kvpress's MergingPress: the kept nodes are StreamingLLM's
    (``sinks`` and the recent window); each evicted node e is folded into the kept node t of
    most similar key (cosine), with w_e = max(cos, 0) |V_e| / (|V_e| + |V_t|):

        V_t <- (V_t + sum_e w_e V_e) / (1 + sum_e w_e),

    keys untouched ("to keep RoPE intact") and no weight in the logits."""

    sinks: int = 4
    name: ClassVar[str] = "merge-values"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_option(self.name, "sinks", self.sinks,
                      isinstance(self.sinks, int) and self.sinks >= 0, "an int >= 0")

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        n = len(grid)
        s = min(self.sinks, keep)
        dev = grid.keys.device
        b, h = grid.keys.shape[:2]
        kept_idx = torch.cat([torch.arange(s), torch.arange(n - (keep - s), n)]).to(dev)
        out_idx = torch.arange(s, n - (keep - s), device=dev)
        kept = grid.take(kept_idx.expand(b, h, keep).contiguous())
        if out_idx.numel() == 0:
            return kept
        gone = grid.take(out_idx.expand(b, h, out_idx.numel()).contiguous())
        eps = 1e-6
        ke = F.normalize(gone.keys.float(), dim=-1, eps=eps)
        kk = F.normalize(kept.keys.float(), dim=-1, eps=eps)
        sim, target = (ke @ kk.transpose(-1, -2)).max(dim=-1)  # (B, H, n_out)
        ve, vt = gone.values.float(), kept.values.float()
        ne = ve.norm(dim=-1)
        nt = vt.gather(2, target[..., None].expand(*target.shape, vt.shape[-1])).norm(dim=-1)
        w = sim.clamp(min=0) * ne / (ne + nt + eps)
        acc_v = torch.zeros_like(vt).scatter_add_(2, target[..., None].expand_as(ve),
                                                  w[..., None] * ve)
        acc_w = torch.zeros(vt.shape[:-1], dtype=vt.dtype, device=dev).scatter_add_(2, target, w)
        kept.values = ((vt + acc_v) / (1 + acc_w)[..., None]).to(grid.values.dtype)
        return kept


@dataclass(frozen=True)
class QuadratureMerging(CachePolicy):
    """Quadrature merging (ours, docs/math.md 3.12, 3.19): the ``sinks`` first nodes and a recent
    window of ``recent`` times the rest of the budget (0.75: the best of 0.5, 0.75, 0.9 on 512
    KJV tokens of SmolLM2, docs/cache.md) are never merged; the nodes between are
    coarsened by merging neighbours (in coordinate order) j, k into one node

        w_m = w_j + w_k,   x_m = (w_j x_j + w_k x_k) / w_m,
        K_m = R_{x_m} (w_j R_{-x_j} K_j + w_k R_{-x_k} K_k) / w_m,
        V_m = (w_j V_j + w_k V_k) / w_m,

    (keys merged unrotated and rotated at the merged coordinate, so the rotary kernel and the
    causal support read x_m), and the kernel integrates against the weights,
    softmax(a + log w). Partners: the neighbour pairs of least Ward cost
    w_j w_k / (w_j + w_k) |K~_j - K~_k|^2 (K~ unrotated): the second-order error of replacing
    w_j e^{<q, K_j>} + w_k e^{<q, K_k>} by w_m e^{<q, K_m>}, small for similar keys and light
    nodes. Disjoint pairs are merged in rounds (local minima of the cost along the grid).
    With a budget below sinks + 2 nodes (a fraction budget early on) the sinks and the window
    give way, so that the merged grid always carries the mass of every token seen."""

    sinks: int = 4
    recent: float = 0.75
    name: ClassVar[str] = "quadrature"
    merges_keys: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_option(self.name, "sinks", self.sinks,
                      isinstance(self.sinks, int) and self.sinks >= 0, "an int >= 0")
        _check_option(self.name, "recent", self.recent, isinstance(self.recent, float | int)
                      and 0 <= self.recent <= 1, "a fraction in [0, 1] of the budget")

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        n = len(grid)
        if keep < 2:  # no room to merge into: the streaming support
            return StreamingLLM(keep, sinks=self.sinks).compress(grid, keep, rotation)
        s = min(self.sinks, keep - 1)  # at least one node to merge into: the mass is kept
        r = min(int(self.recent * (keep - s)), keep - s - 1)
        mid_keep = keep - s - r
        dev = grid.keys.device
        b, h = grid.keys.shape[:2]
        middle = grid.take(torch.arange(s, n - r, device=dev).expand(b, h, n - r - s)
                           .contiguous())
        middle = self._coarsen_middle(middle, mid_keep, rotation)
        head = grid.take(torch.arange(s, device=dev).expand(b, h, s).contiguous())
        tail = grid.take(torch.arange(n - r, n, device=dev).expand(b, h, r).contiguous())
        head.scores = middle.scores = tail.scores = None
        return head.cat(middle).cat(tail)

    def _coarsen_middle(self, middle: CachedGrid, keep: int, rotation: Rotation | None
                        ) -> CachedGrid:
        """The nodes between the sinks and the window merged down to ``keep``."""
        return _merge_neighbours(middle, keep, rotation)


def _merge_neighbours(grid: CachedGrid, keep: int, rotation: Rotation | None,
                      observed: bool = False) -> CachedGrid:
    """``grid`` (in coordinate order) coarsened to ``keep`` nodes per head by merging disjoint
    neighbour pairs of least Ward cost in rounds (``QuadratureMerging``). ``observed``: the
    cost is weighted by the attention the pair received per unit weight,
    (s_j / w_j + s_k / w_k) / 2 (``grid.scores``), the factor e^{<q, K>} of the second-order
    error averaged over the queries seen."""
    k, v = grid.keys, grid.values
    w = grid.weights.double()
    x = grid.coords.double()
    ku = k if rotation is None else rotation.unrotate(k, x)
    work_k, work_v = ku.double(), v.double()
    # the attention received is additive: a merged node has received its parts' sum
    s = None if grid.scores is None else grid.scores.double()
    changed = torch.zeros(w.shape, dtype=torch.bool, device=k.device)
    while work_k.shape[2] > keep:
        m = work_k.shape[2]
        wj, wk = w[..., :-1], w[..., 1:]
        cost = wj * wk / (wj + wk) * (work_k[..., 1:, :] - work_k[..., :-1, :]).square().sum(-1)
        if observed and s is not None:
            d = s / w
            cost = cost * (d[..., :-1] + d[..., 1:]) / 2
        inf = torch.full_like(cost[..., :1], math.inf)
        left = torch.cat([inf, cost[..., :-1]], dim=-1)
        right = torch.cat([cost[..., 1:], inf], dim=-1)
        minimum = (cost < left) & (cost <= right)
        t = min(m - keep, int(minimum.sum(-1).min()))
        pick = torch.where(minimum, cost, inf).topk(t, dim=-1, largest=False).indices
        i, j = pick, pick + 1
        wi, wj2 = w.gather(2, i), w.gather(2, j)
        wm = wi + wj2
        new_k = _blend(wi, wj2, _at(work_k, i), _at(work_k, j))
        new_v = _blend(wi, wj2, _at(work_v, i), _at(work_v, j))
        new_x = (wi * x.gather(2, i) + wj2 * x.gather(2, j)) / wm
        work_k = work_k.scatter(2, i[..., None].expand_as(new_k), new_k)
        work_v = work_v.scatter(2, i[..., None].expand_as(new_v), new_v)
        x, w = x.scatter(2, i, new_x), w.scatter(2, i, wm)
        if s is not None:
            s = s.scatter(2, i, s.gather(2, i) + s.gather(2, j))
        changed = changed.scatter(2, i, True)
        drop = torch.zeros_like(changed).scatter(2, j, True)
        order = torch.argsort(drop.to(torch.int8), dim=-1, stable=True)[..., :m - t]
        work_k, work_v, k = _at(work_k, order), _at(work_v, order), _at(k, order)
        x, w, changed = x.gather(2, order), w.gather(2, order), changed.gather(2, order)
        if s is not None:
            s = s.gather(2, order)
    merged_k = work_k.to(grid.keys.dtype)
    if rotation is not None:
        merged_k = rotation.rotate(merged_k, x)
    return CachedGrid(torch.where(changed[..., None], merged_k, k),
                      work_v.to(grid.values.dtype), w.to(GRID_DTYPE), x.to(GRID_DTYPE),
                      None if s is None else s.to(GRID_DTYPE))


def _keep_and_merge(grid: CachedGrid, whole: torch.Tensor, merged: int,
                    rotation: Rotation | None, observed: bool = False) -> CachedGrid:
    """The nodes ``whole`` (B, H_kv, k indices) of ``grid`` kept as they are, the others merged
    among themselves into ``merged`` nodes (``_merge_neighbours``), all in coordinate order."""
    b, h, n = grid.weights.shape
    mask = torch.zeros(b, h, n, dtype=torch.bool, device=whole.device).scatter(2, whole, True)
    rest = torch.argsort(mask.to(torch.int8), dim=-1, stable=True)[..., :n - whole.shape[-1]]
    coarse = _merge_neighbours(grid.take(rest.contiguous()), merged, rotation, observed)
    both = grid.take(_ordered(whole)).cat(coarse)
    return both.take(torch.argsort(both.coords, dim=-1, stable=True))


@dataclass(frozen=True)
class AdaptiveQuadrature(QuadratureMerging):
    """Adaptive quadrature (ours): ``QuadratureMerging`` where the integrand is large stays
    fine. The attention of the forward's last ``window`` queries (SnapKV's observation window;
    mean over the group's query heads, average-pooled along the nodes with width ``kernel``)
    marks the ``protect`` fraction of the merged stretch's budget that receives the most; those
    nodes are kept whole, and the others are merged with their neighbours among themselves
    (least Ward cost, as ``QuadratureMerging``), so that the mass of every token stays on the
    grid. An adaptive rule refines where the integrand is largest; here the integrand is the
    kernel row of the queries just seen."""

    protect: float = 0.5
    window: int = 64
    kernel: int = 5
    name: ClassVar[str] = "adaptive"
    observes: ClassVar[str | None] = "window"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_option(self.name, "protect", self.protect, isinstance(self.protect, float | int)
                      and 0 <= self.protect < 1, "a fraction in [0, 1) of the merged budget")
        _check_window(self.name, self.window, self.kernel)

    def observed_queries(self, n: int) -> int:
        return min(self.window, n)

    def _coarsen_middle(self, middle: CachedGrid, keep: int, rotation: Rotation | None
                        ) -> CachedGrid:
        p = min(int(self.protect * keep), keep - 1)
        if p <= 0 or middle.scores is None:
            return _merge_neighbours(middle, keep, rotation)
        top = _pooled(middle.scores, self.kernel).topk(p, dim=-1).indices
        return _keep_and_merge(middle, top, keep - p, rotation)


@dataclass(frozen=True)
class HeavyQuadrature(HeavyHitters):
    """Heavy-hitter quadrature (ours): H2O's support, with the evicted nodes merged instead of
    dropped. A recent window of ``recent`` times the budget and the tokens of largest
    accumulated attention sum_{queries x so far} g(x, x_j) are kept whole (merged nodes never
    count as heavy hitters); the others (the tokens H2O evicts, and the merged nodes of earlier
    forwards) are merged among themselves into ceil(``merged`` times the budget) nodes, at
    least one (neighbours in coordinate order of least Ward cost, as
    ``QuadratureMerging``: w_m = w_j + w_k at the mass-weighted coordinate, unrotated keys
    averaged and rotated at x_m, softmax(a + log w)), their accumulated attention summed. The
    evicted mass stays on the grid: the kernel still integrates over every token seen, coarsely
    where the observed integrand is small, finely where it is large."""

    merged: float = 1 / 128  # of 1/128 .. 1/16 on 1024 KJV tokens (docs/cache.md)
    # partners by the Ward cost weighted by the attention received per unit weight (the
    # observed integrand; measured, not better: docs/cache.md)
    observed: bool = False
    name: ClassVar[str] = "heavy-quadrature"
    merges_keys: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_option(self.name, "merged", self.merged, isinstance(self.merged, float | int)
                      and 0 <= self.merged < 1, "a fraction in [0, 1) of the budget")
        if not isinstance(self.observed, bool):
            raise ValueError(f"{self.name}: observed must be True or False, got "
                             f"{self.observed!r}")
        if self.recent + self.merged > 1:
            raise ValueError(f"{self.name}: recent + merged must be at most 1 (fractions of the "
                             f"budget), got recent={self.recent!r}, merged={self.merged!r}")

    def compress(self, grid: CachedGrid, keep: int, rotation: Rotation | None) -> CachedGrid:
        assert grid.scores is not None
        n = len(grid)
        # at least one merged node whenever merged > 0 (and room for one kept whole; a budget
        # of one node is that merged node: the mass of every token stays on the grid)
        m = 0 if self.merged == 0 else max(1, min(math.ceil(self.merged * keep), keep - 1))
        if m <= 0:
            return _recent_and_top(grid, keep, int(self.recent * keep), grid.scores)
        r = min(int(self.recent * keep), keep - m)
        b, h = grid.keys.shape[:2]
        tail = torch.arange(n - r, n, device=grid.keys.device).expand(b, h, r)
        # the heavy hitters are tokens: a merged node's summed attention would outrank them on
        # its mass alone, and the merged nodes would take their slots stream after stream
        ranked = grid.scores[..., :n - r].masked_fill(grid.weights[..., :n - r] > 1, -math.inf)
        top = ranked.topk(keep - m - r, dim=-1).indices
        return _keep_and_merge(grid, torch.cat([top, tail], dim=-1), m, rotation, self.observed)


POLICIES: dict[str, type[CachePolicy]] = {
    cls.name: cls for cls in (FullCache, StreamingLLM, HeavyHitters, TOVA, SnapKV, ValueMerging,
                              QuadratureMerging, AdaptiveQuadrature, HeavyQuadrature)
}


# the fields a policy spec cannot set: given apart (cache_policy's arguments, the commands'
# own options)
_SET_ELSEWHERE = ("budget", "slack")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def policy_spec(text: str) -> tuple[str, dict[str, int | float | bool]]:
    """A policy written as the command lines write it, ``name`` or ``name:key=value:...``
    (``snapkv:window=10``, ``adaptive:window=10:recent=0.25:protect=0.9``): its name and its
    options, each value an int, a float or a bool (``true``/``false``). ValueError naming the
    spec for a malformed one; the values themselves are checked by the policy
    (``cache_policy``)."""
    if not isinstance(text, str):
        raise TypeError(f"policy must be a str (name or name:key=value:...), got {text!r}")
    name, *pairs = (t.strip() for t in text.split(":"))
    options: dict[str, int | float | bool] = {}
    for pair in pairs:
        key, eq, value = (t.strip() for t in pair.partition("="))
        if not eq or not key.isidentifier() or not value:
            raise ValueError(f"policy {text!r}: expected name:key=value:..., got the part "
                             f"{pair!r}")
        if key in _SET_ELSEWHERE:
            raise ValueError(f"policy {text!r}: {key} is not an option of a spec: the budget "
                             "and the slack are given apart (a command's --budget/--budgets "
                             "and --slack; cache_policy's arguments)")
        if key in options:
            raise ValueError(f"policy {text!r}: {key} given twice")
        options[key] = _literal(value, text)
    return name, options


def _literal(value: str, spec: str) -> int | float | bool:
    """``true``/``false`` (any case), an int (ASCII digits), or a finite float."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if _NUMBER.fullmatch(value) and len(value) <= 32:
        out = int(value) if re.fullmatch(r"[+-]?[0-9]+", value) else float(value)
        if math.isfinite(out):
            return out
    raise ValueError(f"policy {spec!r}: expected a finite number (ASCII digits, at most 32 "
                     f"characters) or true/false, got {value!r}")


def budget_list(text: str) -> tuple[float, ...]:
    """Budgets as fractions in (0, 1] of the tokens seen, separated by commas, duplicates
    merged; ValueError otherwise."""
    out = []
    for t in text.split(","):
        try:
            b = float(t)
        except ValueError:
            b = math.nan
        if not (math.isfinite(b) and 0 < b <= 1):
            raise ValueError(f"expected fractions in (0, 1] of the cache separated by commas, "
                             f"got {text!r}")
        out.append(b)
    return tuple(dict.fromkeys(out))


def policy_list(text: str) -> tuple[str, ...]:
    """Policies separated by commas, each a name or ``name:key=value:...``, checked by
    building each (ValueError or TypeError naming the bad one); spaces around the separators
    dropped (`` snapkv : window = 10`` is ``snapkv:window=10``), duplicates merged."""
    specs = tuple(dict.fromkeys(
        ":".join("=".join(x.strip() for x in part.split("=", 1)) for part in t.split(":"))
        for t in text.split(",")))
    if not specs or "" in specs:
        raise ValueError(f"expected policies among {', '.join(POLICIES)} (name or "
                         f"name:key=value:...) separated by commas, got {text!r}")
    for spec in specs:
        cache_policy(spec, 1.0)
    return specs


def cache_policy(name: str, budget: float | int = 1.0, **options: object) -> CachePolicy:
    """The policy called ``name`` (``POLICIES``; or a spec ``name:key=value:...``, see
    ``policy_spec``) with ``budget`` and its own ``options``. ValueError naming ``policy`` for
    an unknown name or option, ``budget`` for a bad budget, the option for a bad value."""
    spec = None
    if isinstance(name, str) and ":" in name:
        spec = name
        name, given = policy_spec(name)
        clash = sorted(set(given) & set(options))
        if clash:
            raise ValueError(f"policy {spec!r}: {', '.join(clash)} given in the spec and as "
                             "an argument")
        options = {**given, **options}
    if not isinstance(name, str) or name not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {name!r}")
    cls = POLICIES[name]
    takes = [f.name for f in fields(cls) if f.init and f.name not in _SET_ELSEWHERE]
    unknown = sorted(set(options) - set(takes) - set(_SET_ELSEWHERE))
    if unknown:
        raise ValueError(f"policy {spec or name!r} does not take {', '.join(unknown)}: "
                         + (f"its options are {', '.join(takes)}" if takes else
                            "it has no options"))
    try:
        return cls(budget, **options)  # type: ignore[arg-type]
    except ValueError as e:
        if spec is None:
            raise
        raise ValueError(f"policy {spec!r}: {e}") from None

