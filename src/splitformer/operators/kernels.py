"""Attention kernels: how the score a(x,x') becomes the integral kernel g(x,x').

A kernel maps per-head Q, K, V (B, H, N_x, d_h) to int g(x,x') V(x',.) dx' (B, H, N_x, d_h).
The softmax kernel

    g(x,x') = exp(a(x,x')) / int exp(a(x,eta)) deta,   a = <Q(x), K(x')> s + m(x,x')

(s = 1/sqrt(d_h) unless the operator says otherwise) is the standard one and runs through
``scaled_dot_product_attention`` (the fused path). The others are values of the same type:
Sinkhorn (doubly stochastic normalisation), Gaussian (RBF) scores, linear (feature-map) kernels,
and relative-position kernels k(x - x') (ALiBi, rotary).

A causal support x' <= x (``is_causal``, or a mask whose support lies in {x' <= x}) makes every
kernel a Volterra operator: the output at x is the kernel of the problem restricted to the past,

    A_c[u](x) = A[u restricted to {x' <= x}](x),

which for the row-normalised kernels (softmax, Gaussian, linear, ALiBi, rotary) is simply the
kernel with the support x' <= x, and for Sinkhorn is row x of the Sinkhorn plan of the past
(its column normalisation never sees a future query; see ``SinkhornKernel``). With N_q != N_k
queries the causal support is bottom-right aligned in every kernel: query x sits at key position
x + N_k - N_q (sdpa's own ``is_causal`` is top-left; it is used only where the two agree).

The token grid (docs/math.md 3.12, ``operators.token_grid``): a kernel that declares
``grid_aware = True`` takes ``grid``, a ``KernelGrid`` (quadrature weights w_j of the keys,
coordinates of queries and keys), and integrates against it: the softmax kernel is
softmax_x'(a + log w) (through sdpa's additive mask), Sinkhorn normalises to the marginals w,
the linear kernel is sum_j w_j phi(k_j) v_j / sum_j w_j phi(q).phi(k_j), ALiBi and rotary read
the coordinates, and a causal support is x_k <= x_q on the coordinates (two nodes at one
coordinate see each other). ``grid=None`` is the uniform index grid: exactly today's kernels.
Every built-in kernel is grid-aware; an operator refuses a non-uniform grid for a kernel that
is not (a user-written one), naming it.

``KERNELS`` is the one registry of names (``KERNEL_NAMES``); ``Kernel.for_operator`` builds a
kernel for a given attention operator (heads, head size). What a kernel may ask of that operator
is declared here, ``KernelSite`` (``operators.attention.AttentionOperator`` is one), so this
module never imports the attention module. ``AttentionOperator.set_kernel`` puts a kernel into
one operator; the walk over a whole model is ``models.kernels.set_kernel``.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch
import torch.nn.functional as F

from .kernel import (
    Kernel,
    KernelSite,
    _additive_support,
    _grid_additive,
    _grid_sdpa_support,
    _off_support,
    _support_is_causal_on,
    check_scale,
    support_is_causal,
)
from .positional import ALiBiKernel, RotaryKernel, alibi_slopes
from .sdpa import sdpa
from .token_grid import KernelGrid

__all__ = [
    "ALiBiKernel",
    "GaussianKernel",
    "KERNELS",
    "KERNEL_NAMES",
    "Kernel",
    "KernelSite",
    "LinearKernel",
    "RotaryKernel",
    "SinkhornKernel",
    "SoftcapKernel",
    "SoftmaxKernel",
    "alibi_slopes",
    "check_scale",
    "probe_causality",
    "warn_about_instance",
]


class SoftmaxKernel(Kernel):
    """g = softmax_x'(<Q(x),K(x')> * scale + m(x,x') + log w(x')); scale defaults to
    1/sqrt(d_h), w = 1 (the uniform grid) unless a ``grid`` gives the quadrature weights."""

    name = "softmax"
    takes_scale = True
    grid_aware = True
    grouped_heads = True  # sdpa's enable_gqa: no copy of K and V per query head
    caches = "keys_values"

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = check_scale(scale, "SoftmaxKernel")

    def extra_repr(self) -> str:
        return f"scale={self.scale}"

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0, grid=None):
        attn_mask, is_causal = _grid_sdpa_support(attn_mask, is_causal, q, k, grid)
        if k.shape[-3] != q.shape[-3]:
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=self.scale, enable_gqa=True)
        return sdpa(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=self.scale,
        )


def _scores(q, k, scale, attn_mask, is_causal):
    s = scale if scale is not None else q.shape[-1] ** -0.5
    a = torch.matmul(q, k.transpose(-2, -1)) * s
    m = _additive_support(attn_mask, is_causal, q.shape[-2], k.shape[-2], a.dtype, a.device)
    return a if m is None else a + m


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """A log-normaliser with -inf (empty support) replaced by 0, so the empty row stays -inf."""
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _dropout(p: torch.Tensor, dropout_p: float) -> torch.Tensor:
    return F.dropout(p, dropout_p) if dropout_p > 0 else p


def _sinkhorn(logp: torch.Tensor, iterations: int, log_wq: torch.Tensor | None = None,
              log_wk: torch.Tensor | None = None) -> torch.Tensor:
    """log P_k of the Sinkhorn iteration on the last two axes (rows x, columns x'):

        P_1 = rownorm(exp a),   P_{j+1} = rownorm(colnorm(P_j)),

    rownorm(P)(x,x') = P(x,x') / sum_eta w(eta) P(x,eta),
    colnorm(P)(x,x') = P(x,x') / sum_xi w(xi) P(xi,x'), with the quadrature weights of the
    keys (``log_wk``, (..., 1, N_k)) and of the queries (``log_wq``, (..., N_q, 1)); None = 1.
    A row or column with empty support (all -inf) is left alone (it stays 0)."""
    def rows(lp):
        return lp if log_wk is None else lp + log_wk

    def cols(lp):
        return lp if log_wq is None else lp + log_wq

    logp = logp - _finite(torch.logsumexp(rows(logp), dim=-1, keepdim=True))
    for _ in range(iterations - 1):
        logp = logp - _finite(torch.logsumexp(cols(logp), dim=-2, keepdim=True))
        logp = logp - _finite(torch.logsumexp(rows(logp), dim=-1, keepdim=True))
    return logp


class SinkhornKernel(Kernel):
    """Sinkhorn normalisation of exp(a): alternately normalise over x' (rows) and x (columns),
    ending on rows, ``iterations`` row normalisations in all:

        P_1 = softmax_x'(a)  (one iteration = the softmax kernel, exactly)
        P_{k+1} = row-normalise(column-normalise(P_k))   -> doubly stochastic as k -> infinity

    computed in the log domain; rows and columns with no support are left alone (they stay 0).

    Causal support (``is_causal``, or a mask whose support lies in {x' <= x}): the column
    normalisation of the plain iteration sums over every query x, the future ones included, so
    it would not be a Volterra operator. The causal kernel is the Sinkhorn plan of the past:

        g_c(x, .) = row x of P_k[a restricted to {0..x} x {0..x}],

    i.e. the output at x is what the plain kernel gives at the last token of the prefix u(0..x)
    (every normalisation, row or column, runs over rows and columns <= x only). It equals the
    plain plan's last row at x = N - 1, and softmax with the causal support for k = 1. Cost:
    O(k N^3) per head instead of O(k N^2) (one plan per prefix, computed in batches).

    On a token grid with weights w (``grid``) the plan has the marginals w: rows normalise to
    sum_x' w(x') g(x,x') = 1, columns to sum_x w(x) g(x,x') = 1, and the output is
    sum_x' w(x') g(x,x') V(x'); the causal prefixes are {x_j <= x_i} on the coordinates.
    """

    name = "sinkhorn"
    takes_scale = True
    grid_aware = True

    def __init__(self, iterations: int = 3, scale: float | None = None) -> None:
        super().__init__()
        if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
            raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
        self.iterations = iterations
        self.scale = check_scale(scale, "SinkhornKernel")

    def extra_repr(self) -> str:
        return f"iterations={self.iterations}, scale={self.scale}"

    @property
    def caches(self) -> str | None:  # type: ignore[override]
        """One iteration is the softmax kernel (keys and values); more are not cacheable."""
        return "keys_values" if self.iterations == 1 else None

    cache_refusal = ("causal Sinkhorn's column sums run over the past queries, so the kernel "
                     "row of a past node changes when a node is appended (not a Volterra "
                     "operator with final past keys); use iterations=1 (softmax) or "
                     "generate without the cache (use_cache=False)")

    # elements of one batch of prefix plans (B H x prefixes x N_q x N_k), to bound the memory
    _PREFIX_BATCH = 1 << 22

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0, grid=None):
        if grid is not None:
            return self._on_grid(q, k, v, attn_mask, is_causal, dropout_p, grid)
        logp = _scores(q, k, self.scale, attn_mask, is_causal)
        n_q, n_k = logp.shape[-2], logp.shape[-1]
        if self.iterations > 1 and support_is_causal(attn_mask, is_causal, n_q, n_k):
            return self._causal(logp, v, dropout_p)
        logp = _sinkhorn(logp, self.iterations)
        return torch.matmul(_dropout(logp.exp(), dropout_p), v)

    def _on_grid(self, q, k, v, attn_mask, is_causal, dropout_p, grid: KernelGrid):
        """The plan with the marginals of ``grid`` (class doc); the causal support and its
        prefixes read the grid's coordinates (one plan per query: O(k N^3) per head)."""
        s = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        a = torch.matmul(q, k.transpose(-2, -1)) * s
        n_q, n_k, dtype, device = a.shape[-2], a.shape[-1], a.dtype, a.device
        m = _additive_support(attn_mask, False, n_q, n_k, dtype, device)
        a = a if m is None else a + m
        lwk = grid.log_weights(dtype, device)  # (B|1, 1, 1, N_k)
        lwq = grid.log_query_weights(dtype, device)  # (B|1, 1, N_q, 1)
        causal = is_causal or (attn_mask is not None and _support_is_causal_on(
            grid, attn_mask, n_q, n_k))
        if causal:
            a = a.masked_fill(~grid.causal(n_q, n_k, device), float("-inf"))
        if not causal or self.iterations == 1:
            logp = _sinkhorn(a, self.iterations, lwq, lwk)
            w = logp if lwk is None else logp + lwk
            return torch.matmul(_dropout(w.exp(), dropout_p), v)
        xq, xk = grid.positions(n_q, n_k, torch.float64, device)
        outs = []
        for i in range(n_q):  # row i of the plan of the prefix {x_q <= x_i} x {x_k <= x_i}
            rows = (xq <= xq[:, i:i + 1])[:, None, :, None]  # (B|1, 1, N_q, 1)
            cols = (xk <= xq[:, i:i + 1])[:, None, None, :]  # (B|1, 1, 1, N_k)
            sub = a.masked_fill(~(rows & cols), float("-inf"))
            logp = _sinkhorn(sub, self.iterations, lwq, lwk)[..., i:i + 1, :]
            w = logp if lwk is None else logp + lwk
            outs.append(torch.matmul(_dropout(w.exp(), dropout_p), v))
        return torch.cat(outs, dim=-2)

    def _causal(self, a: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
        """Row x of the Sinkhorn plan of {0..x} x {0..x + N_k - N_q}, for every x."""
        n_q, n_k = a.shape[-2], a.shape[-1]
        off = n_k - n_q  # query x sits at key position x + off (bottom-right alignment)
        per_prefix = max(1, a[..., 0, 0].numel() * n_q * n_k)
        step = max(1, self._PREFIX_BATCH // per_prefix)
        outs = []
        for x0 in range(0, n_q, step):
            x1 = min(n_q, x0 + step)
            cols = min(n_k, max(0, x1 + off))  # the keys any prefix of this batch can see
            sub = a[..., :x1, :cols]  # (..., x1, cols)
            ends = torch.arange(x0, x1, device=a.device)
            rows = torch.arange(x1, device=a.device)
            keys = torch.arange(cols, device=a.device)
            past = (rows.view(1, -1, 1) <= ends.view(-1, 1, 1)) & \
                (keys.view(1, 1, -1) <= ends.view(-1, 1, 1) + off)  # (P, x1, cols)
            lead = sub.dim() - 2
            past = past.view(past.shape[0], *([1] * lead), x1, cols)
            plans = _sinkhorn(sub.unsqueeze(0).masked_fill(~past, float("-inf")),
                              self.iterations)  # (P, ..., x1, cols)
            last = plans[torch.arange(x1 - x0, device=a.device), ..., ends, :]  # (P, ..., cols)
            g = last.movedim(0, -2)  # (..., P, cols)
            outs.append(torch.matmul(_dropout(g.exp(), dropout_p), v[..., :cols, :]))
        return torch.cat(outs, dim=-2)


class GaussianKernel(Kernel):
    """Gaussian (RBF) scores: a(x,x') = -|Q(x) - K(x')|^2 * scale / 2, normalised over x'.

    Since -|q - k|^2/2 = <q,k> - |q|^2/2 - |k|^2/2 and the |q|^2 term cancels in the
    normalisation, this is the softmax kernel with the key bias -|K(x')|^2 scale / 2: equal to it
    when all keys have the same norm. On a token grid the key bias gains log w(x') (``grid``).
    """

    name = "gaussian"
    takes_scale = True
    grid_aware = True
    caches = "keys_values"

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = check_scale(scale, "GaussianKernel")

    def extra_repr(self) -> str:
        return f"scale={self.scale}"

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0, grid=None):
        s = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        bias = (-0.5 * s) * k.pow(2).sum(-1).unsqueeze(-2)  # (B, H, 1, N_k)
        m = _grid_additive(attn_mask, is_causal, q, k, grid)
        bias = bias if m is None else bias + m
        return sdpa(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=s)


class LinearKernel(Kernel):
    """Feature-map (linear) attention:

        g(x,x') = phi(Q(x)).phi(K(x')) / sum_eta phi(Q(x)).phi(K(eta))

    with phi = elu + 1 (positive). Without a mask it costs O(N d^2): A = phi(Q) (phi(K)^T V) /
    (phi(Q) sum phi(K)); with a support (causal or a mask) it forms the N x N kernel. It has no
    score scale (``takes_scale`` False): ``set_kernel`` refuses to put it by name where the
    softmax scale is not 1/sqrt(d_h). Masks give the support: boolean masks, or float masks that
    are 0 on the support and -inf / finfo.min off it; any other float mask (a score bias) has no
    meaning here and is refused. On a token grid (``grid``) every sum over x' carries the
    weight w(x'): g(x,x') w(x') = w(x') phi(Q(x)).phi(K(x')) / sum_eta w(eta) phi(Q(x)).phi(K(eta)),
    and a causal support reads the coordinates.
    """

    name = "linear"
    grid_aware = True
    caches = "running_sums"

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (
                math.isfinite(float(eps)) and eps > 0):
            raise ValueError(f"LinearKernel: eps must be a finite number > 0 (the floor of the "
                             f"normaliser), got {eps!r}")
        self.eps = float(eps)

    @staticmethod
    def feature_map(x: torch.Tensor) -> torch.Tensor:
        return F.elu(x) + 1.0

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0, grid=None):
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            off = _off_support(attn_mask)
            if not bool((off | (attn_mask == 0)).all()):
                raise ValueError("LinearKernel takes masks that are a support only: boolean, or "
                                 "float with 0 on the support and -inf / finfo.min off it")
            attn_mask = ~off
        fq, fk = self.feature_map(q), self.feature_map(k)
        wk = None if grid is None else grid.weights(fk.dtype, fk.device)
        if wk is not None:
            fk = fk * wk.transpose(-2, -1)  # w(x') phi(K(x')): (B|1, 1, N_k, 1)
        if attn_mask is None and not is_causal and dropout_p == 0.0:
            kv = torch.matmul(fk.transpose(-2, -1), v)  # (B, H, d, d_v)
            z = torch.matmul(fq, fk.sum(-2, keepdim=True).transpose(-2, -1))  # (B, H, N, 1)
            return torch.matmul(fq, kv) / z.clamp_min(self.eps)
        w = torch.matmul(fq, fk.transpose(-2, -1))
        if attn_mask is not None:
            w = w * attn_mask
        if is_causal:
            n_q, n_k = q.shape[-2], k.shape[-2]
            w = w * (grid.causal(n_q, n_k, w.device) if grid is not None and grid.has_coords
                     else torch.ones(n_q, n_k, dtype=torch.bool, device=w.device
                                     ).tril(n_k - n_q))
        w = w / w.sum(-1, keepdim=True).clamp_min(self.eps)
        return torch.matmul(_dropout(w, dropout_p), v)

    def recurrent(self, q, k, v, sums, *, keep=None, weights=None, coords=None):
        """The causal kernel over past and new nodes from the running sums of the past,

            S = sum_{j past} w_j phi(K_j) V_j^T,   z = sum_{j past} w_j phi(K_j),
            out_i = (phi(Q_i) S + sum_{j new, x_j <= x_i} w_j phi(Q_i).phi(K_j) V_j)
                    / (phi(Q_i).z + sum_{j new, x_j <= x_i} w_j phi(Q_i).phi(K_j)),

        returning (out, (S', z')) with the new nodes added: constant memory per token (the
        recurrent form of linear attention). ``keep`` (B, n) bool and ``weights`` (B, n) are
        the new nodes' padding flags and weights; ``coords`` (B, past + n) the coordinates of
        every node (None: the index; the past must then lie before the new nodes, x_j <= x_i,
        which is checked)."""
        fq, fk = self.feature_map(q), self.feature_map(k)
        n = q.shape[-2]
        w = None
        if weights is not None:
            w = weights.to(fk.dtype)
        if keep is not None:
            kw = keep.to(fk.dtype)
            w = kw if w is None else w * kw
        if w is not None:
            fk = fk * w[:, None, :, None]
        a = torch.matmul(fq, fk.transpose(-2, -1))  # (B, H, n, n)
        if coords is not None:
            new = coords[:, -n:]
            if sums is not None and coords.shape[1] > n and bool(
                    (coords[:, :-n].amax(-1, keepdim=True) > new.amin(-1, keepdim=True)).any()):
                raise ValueError("LinearKernel.recurrent: a past node lies after a new one "
                                 "(x_j > x_i): the running sums hold the whole past")
            a = a * (new[:, None, :] <= new[:, :, None]).unsqueeze(1)
        else:
            a = a.tril()
        num = torch.matmul(a, v)
        den = a.sum(-1, keepdim=True)
        kv = torch.matmul(fk.transpose(-2, -1), v)  # (B, H, d, d_v)
        ks = fk.sum(-2, keepdim=True)  # (B, H, 1, d)
        if sums is not None:
            s, z = sums
            num = num + torch.matmul(fq, s)
            den = den + torch.matmul(fq, z.transpose(-2, -1))
            kv, ks = kv + s, ks + z
        return num / den.clamp_min(self.eps), (kv, ks)


class SoftcapKernel(Kernel):
    """g = softmax_x'( c tanh(<Q(x),K(x')> s / c) + m(x,x') + log w(x') ): soft-capped scores.

    Gemma2's attention: the score a is squashed into (-c, c) before the softmax (c =
    attn_logit_softcapping), which bounds every kernel value below by exp(-2c) / N: the kernel
    cannot concentrate on one node more than that allows. The softmax is computed in the
    scores' dtype (half precision: float32); ``upcast=True`` computes it in float32 whatever
    the dtype, float64 included, as transformers' eager path does (the Gemma2 map sets it:
    exactness against transformers needs it, at float32's precision). K and V with fewer
    heads are repeated to the query heads.
    """

    name = "softcap"
    takes_scale = True
    grid_aware = True
    caches = "keys_values"

    def __init__(self, cap: float = 50.0, scale: float | None = None,
                 upcast: bool = False) -> None:
        super().__init__()
        if not isinstance(upcast, bool):
            raise TypeError(f"SoftcapKernel: upcast must be a bool, got {type(upcast).__name__}")
        self.upcast = upcast
        if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or not (
                math.isfinite(float(cap)) and cap > 0):
            raise ValueError(f"SoftcapKernel: cap must be a finite number > 0, got {cap!r}")
        self.cap = float(cap)
        self.scale = check_scale(scale, "SoftcapKernel")

    @classmethod
    def for_operator(cls, op: KernelSite, **options) -> SoftcapKernel:
        """A soft-capped kernel for ``op``: the cap and the precision of the operator's own
        soft-capped kernel where it has one (as the score scale is inherited), else 50 and the
        scores' dtype; ``options`` override."""
        own = op.kernel
        if isinstance(own, SoftcapKernel):
            options = {"cap": own.cap, "upcast": own.upcast, **options}
        return cls(**options)

    def extra_repr(self) -> str:
        return f"cap={self.cap}, scale={self.scale}, upcast={self.upcast}"

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0, grid=None):
        s = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        a = torch.matmul(q, k.transpose(-2, -1)) * s
        a = torch.tanh(a / self.cap) * self.cap
        m = _grid_additive(attn_mask, is_causal, q, k, grid)
        if m is not None:
            a = a + m
        wide = torch.float32 if self.upcast or q.dtype in (torch.float16, torch.bfloat16) \
            else q.dtype
        p = torch.softmax(a, dim=-1, dtype=wide)
        # a query with an empty support (every score -inf: also finfo(float64).min cast to
        # float32, where transformers' eager path turns NaN) integrates over nothing: 0, as
        # sdpa gives; every other row is unchanged
        p = torch.where(torch.isnan(p), torch.zeros((), dtype=p.dtype), p).to(q.dtype)
        return torch.matmul(_dropout(p, dropout_p), v)


KERNELS: dict[str, type[Kernel]] = {
    cls.name: cls
    for cls in (SoftmaxKernel, SinkhornKernel, GaussianKernel, LinearKernel, ALiBiKernel,
                RotaryKernel, SoftcapKernel)
}
"""The registry of kernel names: name -> class (``Kernel.for_operator`` builds one for an
operator). The one source of the names that ``set_kernel`` accepts."""

KERNEL_NAMES: frozenset[str] = frozenset(KERNELS)


def kernel_class(name: str) -> type[Kernel]:
    """The registered kernel class of ``name`` (surrounding whitespace ignored, as for scheme
    names); ValueError listing the names otherwise."""
    if not isinstance(name, str) or name.strip() not in KERNELS:
        raise ValueError(f"kernel must be a Kernel or one of {sorted(KERNEL_NAMES)}, "
                         f"got {name!r}")
    return KERNELS[name.strip()]


_PROBE_TOKENS, _PROBE_PAST = 6, 3  # the probe's sequence length and the tokens it keeps


def probe_causality(kernel: Kernel, num_heads: int = 2, head_dim: int = 4) -> float | None:
    """How much ``kernel`` lets the future leak into the past under ``is_causal=True``.

    Runs the kernel (eval mode, no dropout, no gradient) on random Q, K, V of shape
    (1, num_heads, 6, head_dim) in float64 on the CPU (or, if that fails, in the dtype and on
    the device of the kernel's own parameters), then again with Q, K, V changed at the tokens
    x >= 3 only, and returns max |out(x) - out'(x)| over the past tokens x < 3, relative to
    max |out|: 0 for a Volterra (causal) kernel. None if the kernel cannot run on such input.
    The random draws use a private generator: the global RNG is untouched.
    """
    candidates = [(torch.float64, torch.device("cpu"))]
    for t in (*kernel.parameters(), *kernel.buffers()):
        if t.is_floating_point() and (t.dtype, t.device) not in candidates:
            candidates.append((t.dtype, t.device))
            break
    was_training = kernel.training
    kernel.eval()
    try:
        for dtype, device in candidates:
            gen = torch.Generator().manual_seed(0)
            shape = (1, num_heads, _PROBE_TOKENS, head_dim)
            qkv = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3)]
            new = [t.clone() for t in qkv]
            for t in new:
                t[..., _PROBE_PAST:, :] = 3.0 * torch.randn(
                    t[..., _PROBE_PAST:, :].shape, generator=gen, dtype=torch.float64) + 1.0
            try:
                with torch.no_grad():
                    a, b = (kernel(*(t.to(dtype=dtype, device=device) for t in x),
                                   attn_mask=None, is_causal=True, dropout_p=0.0)
                            for x in (qkv, new))
            except Exception:  # noqa: BLE001 - any failure: try the kernel's own dtype
                continue
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                    and a.shape == b.shape and a.dim() >= 2
                    and a.shape[-2] == _PROBE_TOKENS):
                return None
            a, b = a.double().cpu(), b.double().cpu()
            past = (a[..., :_PROBE_PAST, :] - b[..., :_PROBE_PAST, :]).abs().max()
            return float(past / a.abs().max().clamp_min(1e-300))
        return None
    finally:
        kernel.train(was_training)


def _is_builtin(kernel: Kernel) -> bool:
    return type(kernel) in KERNELS.values()


def warn_about_instance(kernel: Kernel, targets: list[tuple[str, KernelSite]],
                        caller: str) -> None:
    """The warnings for a ``Kernel`` instance installed as given into the operators ``targets``
    (path, operator), before it is installed:

    * a kernel whose class is not a built-in one (``KERNELS``) is probed once
      (``probe_causality``): if its past output moves when only the future changes
      (relative change > 1e-6, or float32-level 1e-4 for a kernel run in a lower precision), it
      ignores ``is_causal`` and would break the causality of a causal model;
    * a kernel with a score scale whose scale differs from an operator's own non-default scale
      (GPT-2's scale by layer, CvT's dim^-1/2) changes that operator's output: each such
      operator is named with both scales.
    """
    name = type(kernel).__qualname__
    if targets and not _is_builtin(kernel):
        op = targets[0][1]
        leak = probe_causality(kernel, op.num_heads, op.head_dim)
        if leak is None:
            warnings.warn(f"{caller}: could not probe {name} for causality (it does not run on "
                          f"random (1, {op.num_heads}, {_PROBE_TOKENS}, {op.head_dim}) Q, K, V "
                          "with is_causal=True); whether it keeps a causal support is unchecked",
                          UserWarning, stacklevel=3)
        elif leak > 1e-6:
            warnings.warn(f"{caller}: {name} ignores is_causal: with is_causal=True its output "
                          f"at the past tokens changed (relative {leak:.3g}) when only the "
                          "future tokens changed, so in a causal model (GPT-2, a decoder) token "
                          "x would see x' > x; make its forward honour is_causal",
                          UserWarning, stacklevel=3)
    if not kernel.takes_scale:
        return
    changed = []
    for path, op in targets:
        if op.has_default_scale():
            continue
        d = op.head_dim ** -0.5
        old = op.score_scale()
        old = d if old is None else old
        new = d if kernel.scale is None else kernel.scale
        if not math.isclose(old, new, rel_tol=1e-12):
            changed.append(f"{path}: {old!r} -> {new!r}")
    if changed:
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        given = "None (1/sqrt(d_h))" if kernel.scale is None else repr(kernel.scale)
        warnings.warn(f"{caller}: the {name} instance has score scale {given}, which "
                      f"replaces the operators' own scales ({'; '.join(changed[:5])}{more}): "
                      "the output changes; pass the kernel by name to keep each operator's "
                      "scale", UserWarning, stacklevel=3)
