"""The KV tape: the past of a causal evolution, kept per attention evaluation in time.

With the causal support x' <= x the attention is a Volterra operator in x (docs/math.md 3.19):
u(x', ., t) of a past node never changes when nodes are appended to the token grid, at any t.
So at every evaluation of an attention field, the keys and values of the past nodes are final,

    K_e(x_j) = W_K^e v_e(x_j),   V_e(x_j) = W_V^e v_e(x_j),     x_j < x_new,

where e numbers the attention evaluations of one forward in time order (step n, stage j of the
scheme, evaluation r of the integrator: a Strang step evaluates attention twice, Heun twice per
substep, RK4 four times, ``refine(k)`` k times per layer's controls) and v_e is the state the
field is evaluated at. A forward over new nodes only (generation appends one node at a time)
reads the past from the tape and integrates over past and new nodes:

    A_e[u](x_new) = sum_h W_O,h sum_{x_j <= x_new} w_j g_h(x_new, x_j) V_e,h(x_j).

The tape is indexed by e, never by layer, and is exact for every scheme, grid and integrator
whose sequence of attention evaluations is the same at every forward (it is: a scheme is data
and runs the same stages each time). It is a declared field of the ``Context``
(``Context.tape``) that the model's initial condition opens (``begin``) and the model's spine
closes (``commit``, or ``abort`` when the forward fails: nothing half-written is kept).

What one evaluation stores is the kernel's declaration (``Kernel.caches``):

* ``"keys_values"``: K and V of every past node (softmax, Gaussian, ALiBi, rotary, Sinkhorn with
  one iteration). Rotary keeps the *unrotated* K with the node coordinates and rotates at each
  evaluation: the coordinates are data a cache policy moves (a merged entry sits at its
  mass-weighted coordinate, context extension rescales them), and an unrotated key can be put
  at any coordinate while a rotated one would have to be un-rotated first. The cost is one
  rotation of the cached keys per evaluation, the same order as the attention itself.
  An operator that rotates Q and K itself with the angles its model computes once per
  forward (``Context.rotary``: the Llama family's, docs/math.md 3.18) hands the tape rotated
  keys, as transformers' cache holds them: a policy that moves coordinates un-rotates first.
* ``"running_sums"``: the linear kernel's recurrent form, S = sum_j w_j phi(K_j) V_j^T and
  z = sum_j w_j phi(K_j): constant memory per token (``LinearKernel.recurrent``).
* None: refused by name (causal Sinkhorn: its column sums run over the past queries, so a past
  row changes when a node is appended; a user kernel that declares nothing).

The token grid stays data: the tape holds the quadrature weights w_j, the coordinates x_j and
the padding flags of the cached nodes (a padding node is a node outside every support), so
that a later policy can drop (weight 0) or merge entries. Buffers are preallocated
(``capacity``) and grow by doubling, as litgpt's KV cache; a forward writes past the committed
length and only ``commit`` makes it part of the past.

A cache policy (``policy=``, ``operators.cache_policy``) coarsens that past grid after every
forward: once the budget is exceeded every evaluation's keys and values move to a compressed
entry holding its own grid per key/value head (weights w_j, coordinates x_j), the policy drops
or merges nodes, and the kernel integrates against the weights,

    A_e[u](x) = sum_{x_j <= x} softmax_j(a(x, x_j) + log w_j) V_j     (docs/math.md 3.12, 3.19),

with the causal support and a sliding window read on the coordinates. Until then (and always
for ``FullCache``) it is the plain tape, bit for bit. A policy that observes attention (H2O,
TOVA, SnapKV) gets the probabilities of the queries it asks for from every forward, so its
entries are compressed ones from the first forward. ``length`` stays the number of tokens seen
(the next node's index); ``peak_bytes`` is the largest cache held at the end of a forward,
before the policy acted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .cache_policy import GRID_DTYPE, CachedGrid, CachePolicy, FullCache, Rotation
from .kernel import expand_heads, window_support
from .kernels import SoftmaxKernel
from .rope import RotaryPositions, rotate_half
from .token_grid import KernelGrid

__all__ = ["CACHE_KINDS", "KVTape", "TapeError"]

CACHE_KINDS = ("keys_values", "running_sums")


class TapeError(ValueError):
    """A forward that does not fit the tape (another scheme, batch, dtype or kernel)."""


@dataclass
class _Support:
    """The kernel support of the forward in progress (new queries x all keys), built once per
    forward: an sdpa-convention mask or None, the causal flag, the token grid or None."""

    mask: torch.Tensor | None
    is_causal: bool
    grid: KernelGrid | None


def _grow(buf: torch.Tensor | None, need: int, cap: int, axis: int) -> torch.Tensor | None:
    """``buf`` with at least ``need`` slots along ``axis`` (new capacity ``cap``), the old
    contents copied; as it is when it is large enough."""
    if buf is None or buf.shape[axis] >= need:
        return buf
    shape = list(buf.shape)
    shape[axis] = cap
    new = buf.new_zeros(shape)
    new.narrow(axis, 0, buf.shape[axis]).copy_(buf)
    return new


class _KeysValues:
    """One evaluation's K and V, (B, H, capacity, d), written at [length, length + n)."""

    kind = "keys_values"

    def __init__(self, kernel: str = "") -> None:
        self.kernel = kernel  # the kernel that recorded it (class and settings)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.rotary: RotaryPositions | None = None  # what rotated the keys (cache policies)
        # the frequencies the stored keys are rotated with (KVTape(follow_length=True))
        self.frequencies: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor, start: int, cap: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        end = start + k.shape[-2]
        if self.k is None:
            b, h, _, d = k.shape
            self.k = k.new_empty(b, h, cap, d)
            self.v = v.new_empty(b, h, cap, v.shape[-1])
        elif self.k.shape[:2] != k.shape[:2] or self.k.dtype != k.dtype \
                or self.k.device != k.device:
            raise TapeError(f"the tape holds keys of shape (B, H) = {tuple(self.k.shape[:2])}, "
                            f"{self.k.dtype} on {self.k.device}; this forward gives "
                            f"{tuple(k.shape[:2])}, {k.dtype} on {k.device}")
        self.k = _grow(self.k, end, cap, 2)
        self.v = _grow(self.v, end, cap, 2)
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]

    def nbytes(self, length: int) -> int:
        if self.k is None:
            return 0
        return (self.k[:, :, :length].numel() * self.k.element_size()
                + self.v[:, :, :length].numel() * self.v.element_size())

    def commit(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _RunningSums:
    """One evaluation's running sums (S, z) of the linear kernel; the forward's new sums are
    pending until ``commit``."""

    kind = "running_sums"

    def __init__(self, kernel: str = "") -> None:
        self.kernel = kernel
        self.sums: tuple[torch.Tensor, torch.Tensor] | None = None
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def nbytes(self, length: int) -> int:
        if self.sums is None:
            return 0
        return sum(t.numel() * t.element_size() for t in self.sums)

    def commit(self) -> None:
        if self.pending is not None:
            self.sums, self.pending = self.pending, None

    def abort(self) -> None:
        self.pending = None


def _support_bias(grid: CachedGrid, x_new: torch.Tensor, window: int | None, groups: int,
                  dtype: torch.dtype):
    """bias(first, end): log w_j + m_ij for the new queries i = first .. end - 1 over
    ``grid`` (m_ij = 0 on the support x_j <= x_i, and x_i - x_j < ``window``, -inf off it),
    each key/value head's ``groups`` query heads folded into the query axis:
    (B, H_kv, groups (end - first), N_k)."""
    b, h_kv, n_k = grid.weights.shape
    xq = x_new[:, None, :, None]  # (B, 1, n, 1)
    xk = grid.coords[:, :, None, :]  # (B, H_kv, 1, N_k)
    log_w = grid.weights.double().log().to(dtype)[:, :, None, :]
    off = torch.full((), -math.inf, dtype=dtype, device=grid.weights.device)

    def bias(first: int, end: int) -> torch.Tensor:
        allowed = xk <= xq[:, :, first:end]
        if window is not None:
            allowed = allowed & (xq[:, :, first:end] - xk < window)
        m = torch.where(allowed, log_w, off)[:, :, None]
        return m.expand(b, h_kv, groups, end - first, n_k).reshape(b, h_kv, -1, n_k)

    return bias


class _CompressedKeysValues:
    """One evaluation's past as a ``CachedGrid`` (per key/value head: K, V, w_j, x_j) that a
    cache policy coarsens; the forward's new nodes are appended to a pending grid, which
    ``commit`` hands to the policy."""

    kind = "keys_values"

    def __init__(self, kernel: str = "", grid: CachedGrid | None = None) -> None:
        self.kernel = kernel
        self.grid = grid
        self.pending: CachedGrid | None = None
        self.rotation: Rotation | None = None  # the rotary positions of the stored keys

    def extend(self, new: CachedGrid) -> CachedGrid:
        if self.grid is not None:
            old = self.grid.keys
            k = new.keys
            if old.shape[:2] != k.shape[:2] or old.dtype != k.dtype or old.device != k.device:
                raise TapeError(f"the tape holds keys of shape (B, H) = {tuple(old.shape[:2])}, "
                                f"{old.dtype} on {old.device}; this forward gives "
                                f"{tuple(k.shape[:2])}, {k.dtype} on {k.device}")
        self.pending = new if self.grid is None else self.grid.cat(new)
        return self.pending

    def nbytes(self, length: int) -> int:
        return 0 if self.grid is None else self.grid.nbytes()

    def pending_nbytes(self) -> int:
        return self.nbytes(0) if self.pending is None else self.pending.nbytes()

    def commit(self) -> None:
        if self.pending is not None:
            self.grid, self.pending = self.pending, None

    def abort(self) -> None:
        self.pending = None


class KVTape:
    """The keys and values (or running sums) of the past nodes, one entry per attention
    evaluation of a forward in time order (module docstring), and the token grid of those
    nodes (weights, coordinates, padding flags).

    ``capacity``: nodes to preallocate (it grows by doubling when a forward needs more).
    ``policy``: a ``cache_policy.CachePolicy`` that coarsens the past after every forward
    (None or ``FullCache()``: every node kept, the plain tape).
    Build an empty one and pass it to a causal model's forward (``tape=``) again and again:
    each forward appends its nodes. ``length`` is the number of committed nodes (tokens seen),
    ``num_evaluations`` the number of attention evaluations per forward (0 before the first).
    """

    def __init__(self, capacity: int = 0, policy: CachePolicy | None = None, *,
                 follow_length: bool = False) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"KVTape: capacity must be an int >= 0 (nodes to preallocate), "
                             f"got {capacity!r}")
        if policy is not None and not isinstance(policy, CachePolicy):
            raise TypeError(f"KVTape: policy must be None or a cache_policy.CachePolicy (e.g. "
                            f"cache_policy('streaming', 0.25)), got {type(policy).__name__}")
        if not isinstance(follow_length, bool):
            raise TypeError(f"KVTape: follow_length must be a bool, got {follow_length!r}")
        if follow_length and policy is not None and policy.compresses:
            raise ValueError("KVTape: follow_length re-rotates the stored keys of the plain "
                             "tape; a cache policy that drops or merges them is not supported "
                             "with it")
        # a rotary kernel whose frequencies follow the length (RotaryPositions.follows_length):
        # re-rotate the stored keys to each forward's frequencies, so that every query and key
        # of a forward read one kernel (one forward over the whole prefix); False: keys keep
        # the frequencies they were rotated with, as transformers' cache keeps them, except
        # for a kernel that declares keys_follow_length (splitformer's own types)
        self.follow_length = follow_length
        self.policy = policy if policy is not None else FullCache()
        self.peak_bytes = 0
        self.compressions = 0  # how many times the policy has coarsened the past
        self._new_grid: tuple[torch.Tensor, torch.Tensor] | None = None
        self.capacity = capacity
        self.length = 0
        self.batch: int | None = None
        self.entries: list[_KeysValues | _RunningSums] = []
        self._keep: torch.Tensor | None = None  # (B, cap) bool; None: no padding so far
        self._weights: torch.Tensor | None = None  # (B, cap); None: uniform so far
        self._coords: torch.Tensor | None = None  # (B, cap); None: the index so far
        self._new = 0  # nodes of the forward in progress (0: none)
        self._cursor = 0
        self._recording = False  # the first forward: entries are made as it evaluates
        self._support: _Support | None = None
        self.signature: str | None = None  # what recorded it: the model's scheme and grid

    # -- what is on the tape ---------------------------------------------------------------
    @property
    def num_evaluations(self) -> int:
        return len(self.entries)

    @property
    def keep(self) -> torch.Tensor | None:
        """The committed nodes' padding flags (B, length), True = a token; None = no padding."""
        return None if self._keep is None else self._keep[:, :self.length]

    @property
    def weights(self) -> torch.Tensor | None:
        """The committed nodes' quadrature weights (B, length); None = uniform."""
        return None if self._weights is None else self._weights[:, :self.length]

    @property
    def coords(self) -> torch.Tensor | None:
        """The committed nodes' coordinates (B, length); None = the index 0 .. length-1."""
        return None if self._coords is None else self._coords[:, :self.length]

    def nbytes(self) -> int:
        """Bytes of the stored keys and values (or running sums) of the committed nodes; for
        compressed entries their weights and coordinates too."""
        return sum(e.nbytes(self.length) for e in self.entries)

    @property
    def compressed(self) -> bool:
        """Whether the entries are the policy's compressed grids (not the plain buffers)."""
        return bool(self.entries) and isinstance(self.entries[0], _CompressedKeysValues)

    @property
    def entries_per_head(self) -> int:
        """Cache entries per evaluation and key/value head (``length`` on the plain tape)."""
        if self.compressed:
            grid = self.entries[0].grid
            return 0 if grid is None else len(grid)
        return self.length

    def __repr__(self) -> str:
        kinds = sorted({e.kind for e in self.entries})
        return (f"KVTape(length={self.length}, batch={self.batch}, "
                f"evaluations={self.num_evaluations}, caches={kinds}, "
                f"bytes={self.nbytes()})")

    def reset(self) -> None:
        """Forget everything (the next forward records anew)."""
        self.__init__(self.capacity, self.policy)  # type: ignore[misc]

    # -- one forward -------------------------------------------------------------------------
    def begin(self, n: int, batch: int, *, keep: torch.Tensor | None = None,
              weights: torch.Tensor | None = None, coords: torch.Tensor | None = None,
              additive: bool = False, dtype: torch.dtype, device: torch.device,
              signature: str | None = None) -> None:
        """Open a forward over ``n`` new nodes of a batch of ``batch`` rows: their padding flags
        ``keep`` (B, n) bool (None: all tokens), quadrature weights and coordinates ((n,) or
        (B, n), checked by the caller; None: uniform / the index continued). Builds the support
        of the new queries over all keys once (``additive``: transformers' eager masks,
        finfo.min off the support). ``signature`` says what evaluates attention (the model's
        scheme, time grid and controls): a forward with another one is refused, even when it
        evaluates attention as many times."""
        if self._new:
            self.abort()
        if signature is not None and self.signature is not None and self.length \
                and signature != self.signature:
            raise TapeError(f"the tape was recorded by {self.signature}; this forward is "
                            f"{signature}: another scheme, time grid or controls evaluates "
                            "attention at other states (start a new KVTape)")
        if self.batch is not None and batch != self.batch:
            raise TapeError(f"the tape holds a batch of {self.batch} rows; this forward has "
                            f"{batch} (start a new KVTape for another batch)")
        if n < 1:
            raise TapeError("a forward on the tape needs at least one new node")
        self.batch = batch
        self._recording = self.length == 0
        if self._recording:
            self.signature = signature
        start, end = self.length, self.length + n
        if end > self.capacity:
            self.capacity = max(end, 2 * self.capacity)
        self._keep = self._append(self._keep, keep, start, end,
                                  lambda a, b: torch.ones(batch, b - a, dtype=torch.bool,
                                                          device=device))
        self._weights = self._append(self._weights, weights, start, end,
                                     lambda a, b: torch.ones(batch, b - a, dtype=dtype,
                                                             device=device))
        self._coords = self._append(self._coords, coords, start, end,
                                    lambda a, b: torch.arange(a, b, dtype=dtype, device=device
                                                              ).expand(batch, b - a))
        self._new, self._cursor = n, 0
        if self.policy.compresses:
            if keep is not None and not bool(keep.all()):
                self.abort()
                raise TapeError(f"a cache policy ({self.policy.describe()}) with padding: "
                                "compressed caches are kept per row without padding nodes "
                                "(decode rows one by one, or without a policy)")
            w = weights if weights is not None else torch.ones(n)
            x = coords if coords is not None else torch.arange(start, end)
            w = w.to(device=device, dtype=GRID_DTYPE)
            x = x.to(device=device, dtype=GRID_DTYPE)
            self._new_grid = (w.expand(batch, n) if w.dim() == 1 else w,
                              x.expand(batch, n) if x.dim() == 1 else x)
        self._support = self._build_support(n, end, additive, dtype, device)

    def _append(self, buf, new, start, end, default):
        """The grid buffer with the new nodes' values at [start, end): materialised from
        ``default(a, b)`` (the default values of nodes a .. b-1) for the past when the first
        non-default value arrives; None while every node has the default value."""
        if new is None and buf is None:
            return None
        if buf is None:
            buf = default(0, self.capacity).clone()
        elif buf.shape[1] < end:
            buf = _grow(buf, end, self.capacity, 1)
        if new is None:
            buf[:, start:end] = default(start, end)
        else:
            new = new.to(device=buf.device)
            buf[:, start:end] = new if new.dim() == 2 else new.unsqueeze(0)
        return buf

    def _build_support(self, n_q: int, n_k: int, additive: bool, dtype, device) -> _Support:
        keep = None if self._keep is None else self._keep[:, :n_k]
        if keep is not None and bool(keep.all()):
            keep = None
        weights = None if self._weights is None else self._weights[:, :n_k]
        if self._coords is not None:
            # the causal support on the coordinates (x_k <= x_q), read by the kernel
            coords = self._coords[:, :n_k]
            grid = KernelGrid(key_weights=weights,
                              query_weights=None if weights is None else weights[:, -n_q:],
                              query_coords=coords[:, -n_q:], key_coords=coords)
            mask = None if keep is None else keep[:, None, None, :]
            if mask is not None and additive:
                mask = _finfo(mask, dtype)
            return _Support(mask, True, grid)
        grid = None if weights is None else KernelGrid(key_weights=weights,
                                                       query_weights=weights[:, -n_q:])
        if keep is None:
            # a single new query sees every key: the causal support is the whole past
            return _Support(None, n_q > 1, grid)
        causal = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)
        mask = causal & keep[:, None, None, :]
        return _Support(_finfo(mask, dtype) if additive else mask, False, grid)

    def attend(self, kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
               window: int | None = None, rotary: RotaryPositions | None = None
               ) -> torch.Tensor:
        """The kernel at this evaluation: the new queries ``q`` over the past and new keys and
        values (``k``, ``v`` of the new nodes are written to the tape), (B, H, n, d_v).

        ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention): the tape
        keeps the H_kv heads (the smaller cache is the point of GQA) and the kernel gets them
        as it declares (``expand_heads``). ``window``: the support restricted to x_q - x_k < W
        (a sliding window); the plain tape still keeps every past node. ``rotary``: the rotary
        positions the keys ``k`` were rotated with (a cache policy that merges keys un-rotates
        and re-rotates with them); None: the keys are not rotated."""
        if not self._new:
            raise TapeError("the tape has no forward open (a causal model's forward opens it; "
                            "pass the tape as its tape= argument)")
        kind = kernel.caches
        if kind not in CACHE_KINDS:
            raise TapeError(f"{type(kernel).__name__} cannot be cached exactly: "
                            f"{kernel.cache_refusal}")
        entry = self._entry(kind, f"{type(kernel).__name__}({kernel.extra_repr()})")
        self._cursor += 1
        s = self._support
        start = self.length
        if isinstance(entry, _CompressedKeysValues):
            return self._attend_compressed(entry, kernel, q, k, v, window, rotary)
        if isinstance(entry, _KeysValues):
            entry.rotary = rotary
            if rotary is not None and rotary.follows_length and (
                    self.follow_length or rotary.keys_follow_length):
                self._follow_length(entry, rotary, start, k.device)
            k_all, v_all = entry.extend(k, v, start, self.capacity)
            k_all, v_all = expand_heads(kernel, q, k_all, v_all)
            mask, causal = s.mask, s.is_causal
            if window is not None:
                mask, causal = window_support(mask, causal, q.shape[-2], k_all.shape[-2],
                                              s.grid, window, q.dtype, q.device)
            if s.grid is None:
                return kernel(q, k_all, v_all, attn_mask=mask, is_causal=causal)
            return kernel(q, k_all, v_all, attn_mask=mask, is_causal=causal, grid=s.grid)
        if window is not None:
            raise TapeError(f"{type(kernel).__name__} keeps running sums over the whole past: "
                            "a sliding window (a support |x - x'| < W) has no such form; "
                            "decode without the tape (generate(..., use_cache=False))")
        k, v = expand_heads(kernel, q, k, v)
        end = start + self._new
        keep = None if self._keep is None else self._keep[:, start:end]
        weights = None if self._weights is None else self._weights[:, start:end]
        coords = None if self._coords is None else self._coords[:, :end]
        out, entry.pending = kernel.recurrent(q, k, v, entry.sums, keep=keep, weights=weights,
                                              coords=coords)
        return out

    def _attend_compressed(self, entry: _CompressedKeysValues, kernel: Any,
                           q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           window: int | None, rotary: RotaryPositions | None
                           ) -> torch.Tensor:
        """A_e[u](x_i) = sum_j softmax_j(Q_i K_j^T s + log w_j + m_ij) V_j over the compressed
        past and the new nodes, per key/value head, m_ij = 0 on the support x_j <= x_i (and
        x_i - x_j < window) and -inf off it. The group's query heads ride along the query
        axis, so the per-head weights and coordinates are one additive mask (B, H_kv, G n,
        N_k); on a causal prefill (no past, unit weights, increasing coordinates, no window:
        m is causal in the index and log w = 0) the plain causal kernel instead. Refused by
        name: another kernel than the softmax, keys whose frequencies follow the length."""
        self._check_compressible(kernel, rotary)
        if rotary is not None and entry.rotation is None:
            entry.rotation = Rotation(rotary)
        assert self._new_grid is not None
        b, h, n, d = q.shape
        h_kv = k.shape[1]
        g = h // h_kv
        w_new, x_new = self._new_grid
        new = CachedGrid(k, v, w_new[:, None, :].expand(b, h_kv, n).contiguous(),
                         x_new[:, None, :].expand(b, h_kv, n).contiguous())
        causal_prefill = (entry.grid is None and window is None and bool((w_new == 1).all())
                          and bool((x_new[:, 1:] > x_new[:, :-1]).all()))
        grid = entry.extend(new)
        bias = _support_bias(grid, x_new, window, g, q.dtype)
        qg = q.view(b, h_kv, g, n, d)
        observes_all = self.policy.observes is not None and \
            self.policy.observed_queries(n) == n
        # (B, H_kv, G n, d_v) or (B, H, n, d_v): the same heads, h = kv G + j; None for H2O,
        # whose output is p V from the probabilities it observes anyway
        out = None
        if causal_prefill and not observes_all:
            out = kernel(q, k, v, is_causal=True)
        elif not observes_all:
            out = kernel(qg.reshape(b, h_kv, g * n, d), grid.keys, grid.values,
                         attn_mask=bias(0, n), is_causal=False)
        if self.policy.observes is not None:
            out = self._observe(kernel, qg, grid, bias, out)
        return out.reshape(b, h, n, -1)

    def _check_compressible(self, kernel: Any, rotary: RotaryPositions | None) -> None:
        """Refused by name under a compressing policy: another kernel than the softmax (the
        weights enter as softmax(a + log w)), keys whose rotary frequencies follow the
        length (a compressed grid is not re-rotated)."""
        if not isinstance(kernel, SoftmaxKernel):
            raise TapeError(f"a cache policy ({self.policy.describe()}) integrates the "
                            "softmax kernel against per-head weights (softmax(a + log w)); "
                            f"{type(kernel).__name__} is not the softmax kernel")
        if rotary is not None and rotary.keys_follow_length:
            raise TapeError(f"a cache policy ({self.policy.describe()}) merges or drops "
                            f"keys rotated by a kernel whose frequencies follow the length "
                            f"({rotary.describe()}); re-rotating a compressed grid is not "
                            "supported: give the rope a factor, or decode without a policy")

    # queries per block of explicit attention probabilities (an observing policy's scores):
    # blocks bound the (B, H_kv, G block, N_k) matrices a long prefill would otherwise hold
    OBSERVED_BLOCK = 512

    def _observe(self, kernel: Any, q: torch.Tensor, grid: CachedGrid, bias: Any,
                 out: torch.Tensor | None) -> torch.Tensor:
        """Hand the policy what it observes,

            r_j = (1 / G) sum_{g' < G} sum_{i in the last m queries} p^{g'}_ij,
            p^{g'}_ij = softmax_j(Q^{g'}_i K_j^T s + log w_j + m_ij),

        m = ``observed_queries(n)``, for the queries ``q`` (B, H_kv, G, n, d) over ``grid``
        (``bias(first, end)``: log w_j + m_ij of the queries first .. end - 1, the query
        heads folded in), formed ``OBSERVED_BLOCK`` queries at a time, r accumulated in at
        least the grid's precision; return ``out``, or when it is None (every query observed:
        H2O) the output p V from the same blocks."""
        b, h_kv, g, n, d = q.shape
        n_k = len(grid)
        m = self.policy.observed_queries(n)
        scale = kernel.scale if kernel.scale is not None else d ** -0.5
        acc = torch.promote_types(q.dtype, GRID_DTYPE)
        received = torch.zeros(b, h_kv, n_k, dtype=acc, device=q.device)
        blocks = []
        for first in range(n - m, n, self.OBSERVED_BLOCK):
            end = min(first + self.OBSERVED_BLOCK, n)
            qb = q[:, :, :, first:end].reshape(b, h_kv, g * (end - first), d)
            p = torch.softmax(torch.matmul(qb, grid.keys.transpose(-1, -2)) * scale
                              + bias(first, end), -1)
            received += p.view(b, h_kv, g, end - first, n_k).sum(3, dtype=acc).mean(2)
            if out is None:
                blocks.append(torch.matmul(p, grid.values).view(b, h_kv, g, end - first, -1))
        self.policy.observe(grid, received)
        return out if out is not None else torch.cat(blocks, dim=3).reshape(b, h_kv, g * n, -1)

    def _follow_length(self, entry: _KeysValues, rotary: RotaryPositions, start: int,
                       device: torch.device) -> None:
        """Re-rotate the stored keys [0, start) of ``entry`` from the frequencies they were
        rotated with to this forward's (``rotary.forward_frequencies`` of the length after it):
        K_j <- R^new_{x_j} (R^old_{x_j})^{-1} K_j, each R with the float32 angles x w that
        ``RotaryPositions.angles`` computes (the inverse divided by cos^2 + sin^2, so that it
        is exact in the keys' dtype): the keys one forward at this length would hold, in the
        first attention evaluation; later evaluations' keys also carry the states their
        tokens had when they were read (module docstring of docs/context.md)."""
        new = rotary.forward_frequencies(start + self._new, device=device)
        old, entry.frequencies = entry.frequencies, new
        if old is None or start == 0 or entry.k is None or torch.equal(old, new):
            return
        x = (torch.arange(start, device=device)[None] if self._coords is None
             else self._coords[:, :start])
        k = entry.k[:, :, :start]

        def cos_sin(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            f = x[..., None].float() * w.float()
            emb = torch.cat((f, f), dim=-1)[:, None]  # (B|1, 1, start, d)
            return emb.cos().to(k.dtype), emb.sin().to(k.dtype)

        c, s_ = cos_sin(old)
        d = c.shape[-1]  # the rotated features (partial rotary: the others pass)
        k0 = rotate_half(k[..., :d], c, -s_) / (c * c + s_ * s_)
        c, s_ = cos_sin(new)
        entry.k[:, :, :start, :d] = rotate_half(k0, c, s_)

    def _entry(self, kind: str, name: str):
        i = self._cursor
        if i < len(self.entries):
            entry = self.entries[i]
            if entry.kind != kind or entry.kernel != name:
                raise TapeError(f"attention evaluation {i} of this forward is the kernel "
                                f"{name}, but the tape recorded {entry.kernel} there: the "
                                "kernels changed since the tape was recorded (start a new "
                                "KVTape)")
            return entry
        if not self._recording:
            raise TapeError(f"this forward evaluates attention more than the "
                            f"{len(self.entries)} times the tape recorded: the scheme, the "
                            "time grid or the integrator changed since the tape was recorded "
                            "(start a new KVTape)")
        if kind == "running_sums" and self.policy.compresses:
            raise TapeError(f"a cache policy ({self.policy.describe()}) needs keys and values "
                            "to drop or merge; this kernel keeps running sums over the whole "
                            "past (the linear kernel's recurrent form): decode it without a "
                            "policy")
        if kind == "keys_values" and self.policy.compresses and \
                self.policy.observes is not None:
            entry: Any = _CompressedKeysValues(name)
        else:
            entry = _KeysValues(name) if kind == "keys_values" else _RunningSums(name)
        self.entries.append(entry)
        return entry

    def commit(self) -> None:
        """Close the forward: its nodes become part of the past."""
        if not self._new:
            return
        if self._cursor != len(self.entries):
            n = self._cursor
            self.abort()
            raise TapeError(f"this forward evaluated attention {n} times but the tape "
                            f"recorded {len(self.entries)}: the scheme, the time grid or the "
                            "integrator changed since the tape was recorded (start a new "
                            "KVTape)")
        held = sum(e.pending_nbytes() if isinstance(e, _CompressedKeysValues)
                   else e.nbytes(self.length + self._new) for e in self.entries)
        self.peak_bytes = max(self.peak_bytes, held)
        for e in self.entries:
            e.commit()
        self.length += self._new
        self._new, self._support, self._recording = 0, None, False
        self._new_grid = None
        if self.policy.compresses:
            self._compress()

    def _compress(self) -> None:
        """The policy's coarsening of every evaluation's past, once it exceeds the budget
        (the plain buffers become compressed entries the first time)."""
        if not self.policy.due(self.entries_per_head, self.length):
            return
        keep = self.policy.capacity(self.length)
        self.compressions += 1
        if not self.compressed:
            self.entries = [self._compressed_copy(e) for e in self.entries]
        for e in self.entries:
            assert isinstance(e, _CompressedKeysValues) and e.grid is not None
            if len(e.grid) > keep:
                e.grid = self.policy.compress(e.grid, keep, e.rotation)

    def _compressed_copy(self, e: Any) -> _CompressedKeysValues:
        """A plain entry's committed nodes as a compressed entry (the tape's grid per head)."""
        if not isinstance(e, _KeysValues):
            raise TapeError("a cache policy needs keys and values at every evaluation")
        n = self.length
        k, v = e.k[:, :, :n].clone(), e.v[:, :, :n].clone()
        b, h = k.shape[:2]
        dev = k.device
        w = self.weights if self.weights is not None else torch.ones(b, n, device=dev)
        x = self.coords if self.coords is not None else torch.arange(n, device=dev).expand(b, n)
        grid = CachedGrid(k, v, w.to(GRID_DTYPE)[:, None].expand(b, h, n).contiguous(),
                          x.to(GRID_DTYPE)[:, None].expand(b, h, n).contiguous())
        out = _CompressedKeysValues(e.kernel, grid)
        out.rotation = None if e.rotary is None else Rotation(e.rotary)
        return out

    def abort(self) -> None:
        """Drop the forward in progress: the tape is as it was before ``begin``."""
        for e in self.entries:
            e.abort()
        if self._recording:
            self.entries.clear()
            if self.length == 0:
                self.batch = None
        self._new, self._support, self._recording = 0, None, False
        self._new_grid = None

    @property
    def open(self) -> bool:
        """Whether a forward is in progress on the tape."""
        return bool(self._new)

    def check_past(self, attention_mask: torch.Tensor, name: str = "attention_mask") -> None:
        """ValueError unless the first ``length`` columns of a (B, length + n) mask are the
        tape's padding flags (the past a transformers-style mask repeats)."""
        past = attention_mask[:, :self.length].to(torch.bool)
        keep = self.keep
        ok = bool(past.all()) if keep is None else bool((past == keep.to(past.device)).all())
        if not ok:
            raise ValueError(f"{name}: its first {self.length} columns (the past nodes) differ "
                             "from the padding the tape recorded for them")


def _finfo(support: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(support, torch.zeros((), device=support.device, dtype=dtype),
                       torch.finfo(dtype).min)
