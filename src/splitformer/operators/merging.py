"""Coarsening in x: token merging as a quadrature coarsening (docs/math.md 3.12).

On a token grid with nodes x_j, weights w_j and states u_j, merging node a into node b gives
one node

    w = w_a + w_b,    u = (w_a u_a + w_b u_b) / w,    x = (w_a x_a + w_b x_b) / w

(several nodes into one: the same sums). Every grid-aware kernel integrates against w
(softmax(a_ij + log w_j), ``operators.token_grid``), so a node of weight w_a + w_b with the
size-weighted mean state is the quadrature of the two: merging two nodes with equal states
leaves every other node's output unchanged, exactly. That is ToMe's merge with proportional
attention softmax(a + log s) (Bolya et al., ICLR 2023): the size s of a merged token IS its
quadrature weight. ``proportional=False`` (ToMe's ablation) keeps the states' size-weighted
means but gives the kernels weight 1 per node (the weight the kept node had).

Which nodes merge: ToMe's bipartite soft matching. The mergeable nodes of a row (not in the
protected prefix, weight > 0, kept by the key-padding mask) are split alternately into sets A
and B (in index order: the 1st, 3rd, ... mergeable node in A, the 2nd, 4th, ... in B); the
similarity is the cosine of metric vectors m_j (``metric="keys"``: the attention's keys
averaged over the heads, as ToMe; ``"state"``: the state u_j itself); every node of A points
to its most similar node of B, and the r edges of highest similarity merge (A node into B
node). ``"keys+state"``: the partners by the keys, as ToMe, and the r edges of highest
(2 cos(k_a, k_b) + cos(u_a, u_b)) / 3 over those pairs (``matching_vectors``; the second
cosine is taken for the N / 2 chosen pairs only, O(N D), so the matching costs ToMe's). r is
clipped so that at least half of every row's mergeable nodes remain. The matching is an
argmax: no gradient flows through it (as in ToMe); the means are differentiable.

Why "keys+state": after the merge the next attention integrates sum_j w_j e^{q . k_j} V u_j,
and the merged node stands in for the pair exactly when the integrand agrees at a and b: the
kernel's key (k_a = k_b: every query scores them alike) and the state (u_a = u_b: the same
value and the same pointwise FFN). The keys alone miss the second factor, the state alone the
first (close states can still differ where W_K looks). The 2 : 1 share of the keys
(``KEYS_SHARE``) is measured, not derived: on all-MiniLM-L6-v2, of the shares 0.1, 0.31, 0.5,
0.69 and 0.9 (in the similarity of every pair) the keys' 0.69 was the most faithful without
the weights, where the keys matter more, and 2 : 1 (0.67) is its round neighbour
(docs/space.md).

The grid keeps its order: after a merge the kept nodes stay in their input order (the
protected prefix stays in front, padding stays where it was), and each merge is recorded in a
``MergeTrace``: for every input node, the node it now lies in. ``MergeTrace.unmerge`` reads a
merged state back on the input grid (every input node gets the state of the node it went
into): token-level outputs keep their shape and order.

What is refused, by name: a causal support (a merged node would carry a later token's state
into an earlier one), and a mask that is not key padding (a (B, H, N, N) mask has no node-wise
reading under merging), and weights or a mask on the meta device (which nodes may merge
depends on their values). An input on which nothing can merge (fewer than 2 mergeable nodes
in a row: the protected prefix covers the grid, or padding does) runs unmerged, with a
warning naming ``protect`` and N: the output is right (the unmerged model's), and one model
meets inputs of many lengths, so it is not an error, but a merge that never happens is said.
``TokenMerging`` is the value that says how to merge; the evolution places it in its steps
(``time.evolution``), and ``models.base`` unmerges the read-out.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .attention import AttentionOperator, NonlocalAttention
from .base import Context

__all__ = ["KEYS_SHARE", "METRICS", "PLACES", "MergeTrace", "TokenMerging",
           "attention_keys", "bipartite_soft_matching", "merge_nodes", "merge_tokens",
           "matching_vectors", "mergeable_nodes", "start_trace", "take_rows", "trace_of"]

METRICS = ("keys", "state", "keys+state")
KEYS_SHARE = 2 / 3  # the keys' share of the "keys+state" similarity (module doc)
PLACES = ("attention", "step")


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class TokenMerging:
    """How to coarsen the token grid along the evolution (module doc).

    ``r``: nodes merged per unit of time (per layer of the network at tau = 1): an int, or a
    sequence of ints, one per unit interval [n, n + 1) of [0, T]. The merge of interval n runs
    in the first step of it (after ``refine(k)``, once every k steps), so the number of nodes
    at every integer time is the same whatever the time step (which nodes merge is not: the
    states, and so the matching, differ with the step). ``metric``: "keys", "state" or
    "keys+state" (what the cosine similarity is taken of; module doc). ``where``: "attention"
    (after the attention substep of the step, on that step's keys: ToMe's placement) or "step"
    (at the start of the step: the whole step runs on the coarse grid). ``proportional``: the
    merged node's weight is the sum of the weights (ToMe's proportional attention) or stays 1
    (its ablation). ``protect``: the number
    of prefix nodes never merged (class and register tokens). ``unmerge``: the model's
    read-out sees u(T) unmerged to the input's N (True) or the merged grid (False).
    """

    r: int | tuple[int, ...]
    metric: str = "keys"
    where: str = "attention"
    proportional: bool = True
    protect: int = 0
    unmerge: bool = True

    def __post_init__(self) -> None:
        r = self.r
        if isinstance(r, Sequence) and not isinstance(r, (str, bytes)):
            if not r:
                raise ValueError("TokenMerging.r: a per-interval schedule needs at least one "
                                 "entry (or give one int)")
            r = tuple(_count(v, "TokenMerging.r (each entry)") for v in r)
        else:
            r = _count(r, "TokenMerging.r (nodes merged per unit of time)")
        object.__setattr__(self, "r", r)
        if self.metric not in METRICS:
            raise ValueError(f"TokenMerging.metric must be one of {METRICS}, got "
                             f"{self.metric!r}")
        if self.where not in PLACES:
            raise ValueError(f"TokenMerging.where must be one of {PLACES} (after the attention "
                             f"substep, or at the start of each step), got {self.where!r}")
        for name in ("proportional", "unmerge"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"TokenMerging.{name} must be a bool, got "
                                f"{getattr(self, name)!r}")
        object.__setattr__(self, "protect", _count(self.protect, "TokenMerging.protect"))

    @property
    def reads_keys(self) -> bool:
        """Whether the metric reads the attention's keys ("keys", "keys+state")."""
        return self.metric in ("keys", "keys+state")

    @property
    def active(self) -> bool:
        """Whether any interval merges at least one node."""
        return any(self.r) if isinstance(self.r, tuple) else self.r > 0

    def r_at(self, n: int) -> int:
        """Nodes merged in the unit interval [n, n + 1)."""
        if isinstance(self.r, tuple):
            return self.r[n] if 0 <= n < len(self.r) else 0
        return self.r

    def check_intervals(self, T: float) -> None:
        """ValueError unless a per-interval schedule has one entry per unit interval of
        [0, T]."""
        n = math.ceil(T - 1e-9)
        if isinstance(self.r, tuple) and len(self.r) != n:
            raise ValueError(f"TokenMerging.r: a schedule needs one entry per unit interval of "
                             f"[0, T = {T:g}] ({n}), got {len(self.r)}")

    def __str__(self) -> str:
        r = self.r if isinstance(self.r, int) else "[" + ",".join(map(str, self.r)) + "]"
        text = f"merge(r={r}, metric={self.metric}"
        if not self.proportional:
            text += ", proportional=False"
        if self.protect:
            text += f", protect={self.protect}"
        if not self.unmerge:
            text += ", unmerge=False"
        return text + ")"


def take_rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t (B, N, C) at the nodes idx (B, K) of each row: (B, K, C) (a row copy per node, through
    ``index_select`` on the flattened batch; differentiable in t)."""
    b, n = t.shape[:2]
    flat = (idx + torch.arange(b, device=idx.device)[:, None] * n).reshape(-1)
    return t.reshape(b * n, *t.shape[2:]).index_select(0, flat).view(b, idx.shape[1],
                                                                      *t.shape[2:])


# -- the matching -----------------------------------------------------------------------------
def mergeable_nodes(mass: torch.Tensor, attn_mask: torch.Tensor | None, protect: int
                    ) -> torch.Tensor:
    """(B, N) bool: the nodes that may merge: not in the first ``protect`` (the prefix), of
    positive mass (weight 0 = padding) and kept by the key-padding mask (boolean True, or an
    additive 0; any other additive value leaves the node as it is)."""
    b, n = mass.shape
    ok = mass > 0
    if protect:
        ok = ok & (torch.arange(n, device=mass.device) >= protect)
    if attn_mask is not None:
        keys = attn_mask.reshape(attn_mask.shape[0] if attn_mask.dim() == 4 else 1, -1)
        keys = keys if keys.dtype == torch.bool else keys == 0
        ok = ok & keys.to(ok.device)
    return ok


@torch.no_grad()
def bipartite_soft_matching(metric: torch.Tensor, r: int, mergeable: torch.Tensor,
                            rank: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """ToMe's bipartite soft matching on metric vectors (B, N, C): (src, dst), each (B, r),
    node src[b, k] (in A) merges into dst[b, k] (in B). A and B alternate over the mergeable
    nodes of each row in index order; each node of A points to the node of B of highest cosine
    similarity, and the r edges of highest similarity are taken. With ``rank`` (B, N, C'), the
    edges are ranked by KEYS_SHARE cos(m_a, m_b) + (1 - KEYS_SHARE) cos(rank_a, rank_b) instead
    (the partners are still chosen by ``metric``: O(N C') more work, not O(N^2 C')). Each row
    needs at least 2 r mergeable nodes (the caller clips r). No gradient (an argmax)."""
    n = metric.shape[1]
    idx = torch.arange(n, device=metric.device)
    order = ((~mergeable).to(torch.int64) * n + idx).argsort(dim=1)  # mergeable first, in order
    count = mergeable.sum(1, keepdim=True)
    a_idx, b_idx = order[:, 0::2], order[:, 1::2]
    a_ok = idx[0::2][None, : a_idx.shape[1]] < count
    b_ok = idx[1::2][None, : b_idx.shape[1]] < count
    m = _unit(metric)
    ma, mb = take_rows(m, a_idx), take_rows(m, b_idx)
    scores = (ma @ mb.transpose(1, 2)).masked_fill(~b_ok[:, None, :], -math.inf)
    node_max, node_arg = scores.max(dim=-1)
    partner = b_idx.gather(1, node_arg)
    if rank is not None:
        unit = _unit(rank)
        second = (take_rows(unit, a_idx) * take_rows(unit, partner)).sum(-1)
        node_max = KEYS_SHARE * node_max + (1 - KEYS_SHARE) * second.to(node_max.dtype)
    node_max = node_max.masked_fill(~a_ok, -math.inf)
    edges = node_max.argsort(dim=-1, descending=True)[:, :r]
    return a_idx.gather(1, edges), partner.gather(1, edges)


def _unit(v: torch.Tensor) -> torch.Tensor:
    """v / |v| along the last axis (a zero vector stays zero, in every dtype)."""
    return v / v.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)


def merge_nodes(tensors: Sequence[torch.Tensor], mass: torch.Tensor, src: torch.Tensor,
                dst: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor,
                                            torch.Tensor]:
    """Merge node src[b, k] into dst[b, k] (module doc): (merged tensors, merged mass, kept
    node indices (B, N - r) in input order, map (B, N): the new index of every old node).

    Each tensor t (B, N, C) becomes the mass-weighted mean at a receiving node b,

        t_b + sum_a w_a (t_a - t_b) / (w_b + sum_a w_a)  =  (w_b t_b + sum_a w_a t_a) / w,

    (the increment written out: r rows are computed, and equal states stay exactly as they
    are), and stays as it is, bit for bit, at every other node; the mass of a receiving node
    is the sum w. Differentiable in the tensors (the indices carry no gradient)."""
    b, n = mass.shape
    r = src.shape[1]
    is_src = torch.zeros(b, n, dtype=torch.bool, device=mass.device).scatter(1, src, True)
    moved = mass.gather(1, src)
    total = mass.scatter_add(1, dst, moved)
    keep = is_src.to(torch.int8).argsort(dim=1, stable=True)[:, : n - r]
    position = (~is_src).to(torch.int64).cumsum(1) - 1
    at = position.gather(1, dst)  # where each receiving node sits on the merged grid
    share = moved / total.gather(1, dst)  # w_a / w
    out = []
    for t in tensors:
        step = (take_rows(t, src) - take_rows(t, dst)) * share[..., None].to(t.dtype)
        kept = take_rows(t, keep)
        flat = (at + torch.arange(b, device=at.device)[:, None] * (n - r)).reshape(-1)
        kept.view(-1, t.shape[-1]).index_add_(0, flat, step.reshape(-1, t.shape[-1]))
        out.append(kept)
    target = torch.arange(n, device=mass.device).expand(b, n).scatter(1, src, dst)
    return out, total.gather(1, keep), keep, position.gather(1, target)


def matching_vectors(metric: str, u: torch.Tensor, keys: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What ``bipartite_soft_matching`` compares for ``metric`` (module doc): (the vectors
    that choose each node's partner, the vectors that also rank the edges or None): (keys,
    None) for "keys", (u, None) for "state", (keys, u) for "keys+state". ValueError when the
    metric needs keys and none are given (``TokenMerging`` has checked the name)."""
    if metric == "state":
        return u, None
    if keys is None:
        raise ValueError(f"token merging: metric {metric!r} needs the attention's keys")
    return keys, (u if metric == "keys+state" else None)


def attention_keys(op: AttentionOperator, v: torch.Tensor, context: Context | None
                   ) -> torch.Tensor:
    """ToMe's metric: the keys of ``op`` at the state v (its input, after the operators before
    it), averaged over the heads, (B, N, d_h). For the packed NonlocalAttention this is one
    small product with the head-averaged W_K (the mean of a linear map is the map of the mean);
    any other operator computes its Q, K, V (``qkv``) and averages K."""
    if isinstance(op, NonlocalAttention) and type(op).qkv is NonlocalAttention.qkv:
        d, h, dh = op.dim, op.num_heads, op.head_dim
        w = op.qkv_weight[d:2 * d].view(h, dh, d).mean(0)
        bias = None if op.qkv_bias is None else op.qkv_bias[d:2 * d].view(h, dh).mean(0)
        return F.linear(v, w, bias)
    return op.qkv(v, context)[1].mean(1)


# -- a forward pass's record --------------------------------------------------------------------
class MergeTrace:
    """What one forward pass merged (kept in ``context.merge_trace``).

    ``input_weights``, ``input_coords``, ``input_mask``: the grid the evolution started on (as
    the context held it). ``mass`` (B, N_now): the sum of the input weights in each node now
    (1 per input node on the uniform grid; 0 for a weight-0 padding node; a key padded by the
    mask keeps its weight and stays a node of its own). ``steps[k]``: the time step of the k-th
    merge; ``index[k]`` (B, N_input): for every input node, the node it lies in after that
    merge; ``nodes[k]``: N after it. ``unmerge(u)`` reads u back on the input grid.
    """

    def __init__(self, u0: torch.Tensor, context: Context, merging: TokenMerging) -> None:
        b, n = u0.shape[:2]
        self.merging = merging
        self.input_weights = context.token_weights
        self.input_coords = context.token_coords
        self.input_mask = context.attn_mask
        dtype = torch.promote_types(u0.dtype, torch.float32)
        w = context.token_weights
        self.mass = (torch.ones(b, n, dtype=dtype, device=u0.device) if w is None else
                     torch.broadcast_to(w.to(device=u0.device, dtype=dtype), (b, n)).clone())
        self.steps: list[int] = []
        self.index: list[torch.Tensor] = []
        self.nodes: list[int] = []
        if w is None and context.attn_mask is None:  # every unprotected node mergeable
            self.free = self.most_free = max(0, n - merging.protect)
        else:  # the fewest mergeable nodes of a row (one sync, here only)
            self.free, self.most_free = _fewest_mergeable(w, context.attn_mask, b, n,
                                                          merging.protect, dtype)
        self._warned = False
        if merging.active and self.free < 2:
            warnings.warn(f"token merging {merging}: nothing can merge on this input: N = {n} "
                          f"nodes with protect = {merging.protect} (a prefix never merged), and "
                          f"the fewest row has {self.free} mergeable node(s) (padding and "
                          "weight-0 nodes never merge; a merge takes 2); the model runs "
                          "unmerged", stacklevel=2)

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def num_input(self) -> int:
        return self.mass.shape[1] if not self.index else self.index[0].shape[1]

    def clip(self, r: int) -> int:
        """r clipped so that at least half of every row's mergeable nodes remain (ToMe). One
        r serves every row (the grid stays rectangular): when the row with the fewest
        mergeable nodes cuts r below what another row could merge, each row's result depends
        on its batch, which is warned about once per forward."""
        cut = max(0, min(r, self.free // 2))
        if cut < r and cut < self.most_free // 2 and not self._warned:
            self._warned = True
            warnings.warn(f"token merging {self.merging}: r = {r} cut to {cut} by the row with "
                          f"the fewest mergeable nodes ({self.free}; another row has "
                          f"{self.most_free}): every row merges {cut}, so a row's output depends "
                          "on the other rows of its batch; run rows of very different lengths "
                          "in separate batches to get each row's own result", stacklevel=3)
        return cut

    def record(self, step: int, mapping: torch.Tensor, mass: torch.Tensor, r: int) -> None:
        """A merge of ``r`` nodes in step ``step``: ``mapping`` (B, N_before) -> N_after."""
        composed = mapping if not self.index else mapping.gather(1, self.index[-1])
        self.steps.append(step)
        self.index.append(composed)
        self.nodes.append(mass.shape[1])
        self.mass = mass
        self.free -= r
        self.most_free -= r

    def index_at(self, point: int | None = None) -> torch.Tensor | None:
        """(B, N_input): where every input node lies at grid point t_point (after the merges of
        steps < point; None: after all of them); None where nothing was merged yet."""
        k = len(self.steps) if point is None else sum(s < point for s in self.steps)
        return self.index[k - 1] if k else None

    def unmerge(self, u: torch.Tensor, point: int | None = None) -> torch.Tensor:
        """u on the grid of t_point (default: the last) read back on the input grid: every
        input node gets the state of the node it went into, (B, N_input, ...). ValueError
        naming ``point`` (an int >= 0 or None) or ``u`` (B, N at that point, ...) otherwise."""
        if point is not None and (isinstance(point, bool) or not isinstance(point, int)
                                  or point < 0):
            raise ValueError(f"MergeTrace.unmerge: point must be None (the last grid point) or "
                             f"a grid point index >= 0, got {point!r}")
        k = len(self.steps) if point is None else sum(s < point for s in self.steps)
        n = self.nodes[k - 1] if k else self.num_input
        batch = self.index[0].shape[0] if self.index else None
        if not isinstance(u, torch.Tensor) or u.dim() < 2 or u.shape[1] != n or (
                batch is not None and u.shape[0] != batch):
            shape = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
            raise ValueError(f"MergeTrace.unmerge: u must be a state on the grid of that point, "
                             f"shape ({batch if batch is not None else 'B'}, {n}, ...), got "
                             f"{shape}")
        idx = self.index_at(point)
        return u if idx is None else take_rows(u, idx)

    def restore(self, context: Context) -> None:
        """Put the input grid back into ``context`` (weights, coordinates, mask)."""
        context.token_weights = self.input_weights
        context.token_coords = self.input_coords
        context.attn_mask = self.input_mask


def _fewest_mergeable(w: torch.Tensor | None, mask: torch.Tensor | None, b: int, n: int,
                      protect: int, dtype: torch.dtype) -> tuple[int, int]:
    """The fewest and the most mergeable nodes of a row (``mergeable_nodes``), counted on
    the device where the weights (else the mask) hold their values, the state's device being
    free to be the meta device (a shape-only pass). ValueError naming them when they are on
    the meta device themselves: which nodes may merge depends on their values, so the merged
    grid has no shape."""
    meta = [name for name, t in (("token_weights", w), ("the key-padding mask (attention_mask, "
                                                       "src_key_padding_mask)", mask))
            if t is not None and t.is_meta]
    if meta:
        raise ValueError(f"token merging: {' and '.join(meta)} on the meta device (no values): "
                         "the nodes that may merge depend on them (padding and weight-0 nodes "
                         "never merge), so the merged grid has no shape; give token_weights on "
                         "a device with values (the model may stay on meta), run a padded "
                         "input on a model with values (model.to_empty(device=...)), or give "
                         "neither for a shape-only pass")
    device = (w if w is not None else mask).device
    mass = torch.ones(b, n, dtype=dtype, device=device) if w is None else \
        torch.broadcast_to(w.to(dtype=dtype), (b, n))
    counts = mergeable_nodes(mass, mask, protect).sum(1)
    return int(counts.min()), int(counts.max())


def trace_of(context: Context | None) -> MergeTrace | None:
    """The MergeTrace a forward pass left in ``context`` (None without merging)."""
    if context is None:
        return None
    trace = context.merge_trace
    return trace if isinstance(trace, MergeTrace) else None


def _check_support(context: Context, n: int) -> None:
    if context.is_causal:
        raise ValueError("token merging: the kernel's support is causal (x' <= x): a merged "
                         "node would carry a later token's state into an earlier one; refused "
                         "(GPT-2 and decoders cannot merge tokens)")
    mm = context.memory_mask
    if isinstance(mm, torch.Tensor) and mm.dim() >= 2 and mm.shape[-2] != 1:
        raise ValueError(f"token merging: memory_mask of shape {tuple(mm.shape)} has one row "
                         "per query node, which has no reading on the merged grid; refused "
                         "(give a key-padding memory mask, one value per memory node)")
    m = context.attn_mask
    if m is not None and (m.dim() > 4 or (m.dim() >= 2 and m.shape[-2] != 1)
                          or (m.dim() >= 3 and m.shape[-3] != 1) or m.shape[-1] != n):
        raise ValueError(f"token merging needs a key-padding mask (shape (B, 1, 1, N): one "
                         f"value per key node, N = {n}), got an attention mask of shape "
                         f"{tuple(m.shape)} (a general (B, H, N, N) support, e.g. a causal one "
                         "with padding, or BERT's packed sequences read from position_ids "
                         "given without an attention_mask, has no node-wise reading under "
                         "merging); refused")


def start_trace(u0: torch.Tensor, context: Context, merging: TokenMerging) -> MergeTrace:
    """A fresh MergeTrace in ``context`` for a forward pass from u0 (a trace left by an
    earlier pass on the same context is undone first: its input grid is put back)."""
    old = trace_of(context)
    if old is not None:
        old.restore(context)
    _check_support(context, u0.shape[1])
    context.token_grid.check(u0.shape[1], u0.shape[0], "token merging")
    trace = MergeTrace(u0, context, merging)
    context.merge_trace = trace
    return trace


def _gather_rows(t: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor | None:
    """A (N,) or (B, N) grid tensor at the kept nodes, (B, N - r)."""
    if t is None:
        return None
    return torch.broadcast_to(t.to(keep.device), (keep.shape[0], t.shape[-1])).gather(1, keep)


def _gather_mask(m: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor | None:
    """A key-padding mask at the kept nodes, (B, 1, 1, N - r)."""
    if m is None:
        return None
    b = keep.shape[0]
    rows = torch.broadcast_to(m.reshape(m.shape[0] if m.dim() == 4 else 1, -1),
                              (b, m.shape[-1]))
    return rows.gather(1, keep.to(m.device)).view(b, 1, 1, -1)


def merge_tokens(u: torch.Tensor, context: Context, r: int, keys: torch.Tensor | None,
                 step: int) -> torch.Tensor:
    """One merge of (at most) r nodes of u (B, N, D) in step ``step``: the context's grid
    (weights, coordinates, key-padding mask) becomes the merged one and the trace records it.
    ``keys`` (B, N, d_h): the attention's keys, for the metrics that read them (None for
    "state"); what is compared is ``matching_vectors`` of the trace's metric."""
    trace = trace_of(context)
    if trace is None:
        raise RuntimeError("merge_tokens: the context holds no MergeTrace (start_trace first)")
    r = trace.clip(r)
    if r == 0:
        return u
    merging = trace.merging
    mass = trace.mass
    ok = mergeable_nodes(mass, context.attn_mask, merging.protect)
    partners, rank = matching_vectors(merging.metric, u, keys)
    src, dst = bipartite_soft_matching(partners, r, ok, rank)
    coords = context.token_grid.coordinates(u.shape[1], mass.dtype, mass.device)
    coords = torch.broadcast_to(coords, mass.shape)[..., None]
    (u, coords), new_mass, keep, mapping = merge_nodes((u, coords), mass, src, dst)
    context.token_coords = coords[..., 0]
    context.token_weights = new_mass if merging.proportional else \
        _gather_rows(context.token_weights, keep)
    context.attn_mask = _gather_mask(context.attn_mask, keep)
    trace.record(step, mapping, new_mass, r)
    return u
