"""Nonlocal attention: the integral operator A[u] in the token variable x.

Continuous form (docs/math.md section 1), with a head coordinate h:

    Q(x,y,h) = int W_Q(xi,y,h) u(x,xi) dxi + b_Q(y,h)      (K, V likewise)
    g_h(x,x') = exp(a_h(x,x')) / int exp(a_h(x,eta)) deta,
    a_h(x,x') = |Omega_y,h|^(-1/2) <Q(x,.,h), K(x',.,h)>_y + m(x,x')
    A[u](x,z) = sum_h int W_O(y,h,z) int g_h(x,x') V(x',y,h) dx' dy + b_O(z)

m(x,x') is the mask: 0 on the support of the kernel, -inf off it (a causal support x' <= x
makes A a Volterra operator). On a token grid with quadrature weights w_j and coordinates x_j
(``Context.token_weights`` / ``token_coords``, docs/math.md 3.12) every integral in x' is
sum_j w_j (.)(x_j): the kernel gets a ``KernelGrid`` (``kernel_grid``) and integrates against
it. Discretised on uniform grids (w = 1, which cancels) this is

    A(U) = sum_h softmax(Q_h K_h^T / sqrt(d_h) + M) V_h W_O,h + b_O  =  Concat_h(...) W_O + b_O,

computed through ``torch.nn.functional.scaled_dot_product_attention`` for the softmax kernel.
Weights are stored packed as in ``torch.nn.MultiheadAttention``: ``qkv_weight`` is the
(3 N_y, N_y) matrix whose rows are W_Q, W_K, W_V, each of them (H, d_h) rows for the head
coordinate; ``out_weight`` is W_O (N_y, N_y), its columns grouped by head.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from .base import Context, Operator, apply_dropout
from .feature import StackedProduct, _compose_linear_, stack_rows_
from .kernel import expand_heads, window_support
from .kernels import Kernel, SoftmaxKernel, kernel_class, warn_about_instance
from .rope import rotate_half
from .token_grid import KernelGrid, TokenGrid

__all__ = ["AttentionOperator", "CrossAttention", "GroupedQueryAttention", "NonlocalAttention"]


class AttentionOperator(Operator):
    """What every attention operator shares: the head coordinate, the kernel and W_O.

    A subclass says how Q, K, V are made (``qkv``) and, if not from ``context.attn_mask`` /
    ``context.is_causal``, where the kernel's support comes from (``support``); then

        A[u] = Concat_h( kernel(Q_h, K_h, V_h) ) W_O^T + b_O.

    ``scale`` is the score scale s of a(x,x') = <Q(x),K(x')> s (None = 1/sqrt(d_h)) the
    operator was given: a kernel built by name (``set_kernel``) inherits it, and the operator
    keeps it while it holds a kernel without a scale (linear), so that putting softmax back
    restores the network. ``score_scale()`` is the scale in force.

    It is the ``kernels.KernelSite`` its kernel acts in (``num_heads``, ``head_dim``,
    ``relative_positions``, ``score_scale()``, ``has_default_scale()``): what a kernel may ask of
    an operator is declared on the kernels' side, so that module never imports this one.
    """

    kind = "field"
    # a self-attention reads and extends the context's KV tape (queries and keys on one
    # growing grid); cross-attention's keys are the memory's, never the tape's
    reads_tape: ClassVar[bool] = True

    def __init__(self, dim: int, num_heads: int, *, kernel: Kernel | None,
                 attn_dropout: float, head_dim: int | None = None) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if head_dim is None and dim % num_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must divide dim={dim} (the head coordinate splits the "
                "feature grid into equal parts; or give head_dim)"
            )
        if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int)
                                     or head_dim <= 0):
            raise ValueError(f"head_dim must be a positive int (or None: dim / num_heads), got "
                             f"{head_dim!r}")
        self.dim = dim
        self.num_heads = num_heads
        # the head size is its own grid (docs/math.md 3.17): d_h = dim / H unless given
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        self.inner_dim = self.num_heads * self.head_dim
        self.kernel: Kernel = kernel if kernel is not None else SoftmaxKernel()
        self.scale: float | None = self.kernel.scale
        if isinstance(attn_dropout, bool) or not isinstance(attn_dropout, numbers.Real) or not (
                0.0 <= attn_dropout < 1.0):
            raise ValueError(f"attn_dropout must be a number in [0, 1) (the dropout rate of the "
                             f"kernel g), got {attn_dropout!r}")
        self.attn_dropout = float(attn_dropout)

    # -- the kernel ------------------------------------------------------------------------
    def score_scale(self) -> float | None:
        """The score scale in force: the kernel's own when it has one, else ``scale``."""
        k = self.kernel
        return k.scale if k.takes_scale else self.scale

    def has_default_scale(self) -> bool:
        """Whether the score scale is 1/sqrt(d_h) (None, or that value)."""
        s = self.score_scale()
        return s is None or math.isclose(s, self.head_dim ** -0.5, rel_tol=1e-12)

    @property
    def relative_positions(self) -> bool:
        """Whether the token offset x - x' is defined: queries and keys on one token grid
        (what ALiBi and rotary kernels need)."""
        return True

    def relative_positions_reason(self) -> str:
        """Why ``relative_positions`` is False (for error messages)."""
        return ""

    def kernel_for(self, kernel: Kernel | str, **options: Any) -> Kernel:
        """The kernel ``set_kernel`` would install here (nothing is changed): a name builds a
        new one (``Kernel.for_operator``) that inherits ``score_scale()`` unless ``options``
        give ``scale``; an instance is returned as given. ValueError if it cannot act here."""
        if isinstance(kernel, Kernel):
            if options:
                raise ValueError(f"options {sorted(options)} are for a kernel built from a "
                                 "name; an instance is used as given")
            new = kernel
        else:
            cls = kernel_class(kernel)
            options = dict(options)
            if cls.takes_scale:
                options.setdefault("scale", self.score_scale())
            elif not self.has_default_scale():
                raise ValueError(
                    f"the {cls.name!r} kernel has no score scale and this operator's is "
                    f"{self.score_scale()!r}, not 1/sqrt(d_h) = {self.head_dim ** -0.5!r}: "
                    f"refused rather than silently dropped (pass a {cls.__name__}() instance "
                    "to drop it on purpose)"
                )
            try:
                new = cls.for_operator(self, **options)
            except TypeError as e:
                raise ValueError(f"the {cls.name!r} kernel does not take these options: {e}"
                                 ) from e
        new.check_operator(self)
        return new

    def install_kernel(self, kernel: Kernel) -> None:
        """Put ``kernel`` in (unchecked; see ``kernel_for``); a kernel with a score scale sets
        ``scale``."""
        self.kernel = kernel
        if kernel.takes_scale:
            self.scale = kernel.scale

    def set_kernel(self, kernel: Kernel | str, **options: Any) -> Kernel:
        """Check and install ``kernel`` (a name with ``options``, or an instance used as given;
        see ``kernel_for``); returns the kernel installed. An instance warns as
        ``kernels.warn_about_instance`` says (causality probe, a replaced non-default scale)."""
        new = self.kernel_for(kernel, **options)
        if isinstance(kernel, Kernel):
            warn_about_instance(kernel, [(type(self).__name__, self)],
                                f"{type(self).__name__}.set_kernel")
        self.install_kernel(new)
        return new

    def _add_output(self, bias: bool, dropout: float, **kw) -> None:
        """W_O (dim, dim), b_O and the output dropout (initialised by the subclass)."""
        self.out_weight = nn.Parameter(torch.empty(self.dim, self.inner_dim, **kw))
        self.out_bias = nn.Parameter(torch.empty(self.dim, **kw)) if bias else None
        self.out_dropout = nn.Dropout(dropout)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, N, H d_h) -> (B, H, N, d_h)."""
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def qkv(self, u: torch.Tensor, context: Context | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def support(self, context: Context | None) -> tuple[torch.Tensor | None, bool]:
        """The kernel's support: (mask in sdpa's convention or None, causal)."""
        ctx = context if context is not None else _EMPTY
        return ctx.attn_mask, ctx.is_causal

    def kernel_grid(self, context: Context | None, n_q: int, n_k: int, batch: int
                    ) -> KernelGrid | None:
        """The quadrature the kernel integrates against: the token grid of ``context`` for the
        queries and the keys (one field: self-attention); None on the uniform index grid.
        ValueError if the weights or coordinates do not have N nodes."""
        if context is None or (context.token_weights is None and context.token_coords is None):
            return None
        grid = context.token_grid
        grid.check(n_q, batch, type(self).__name__)
        return KernelGrid(key_weights=grid.weights, query_weights=grid.weights,
                          query_coords=grid.coords, key_coords=grid.coords)

    def head_outputs(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        """int g_h(x,x') V(x',.,h) dx' for every head: (B, H, N_x, d_h); on a token grid,
        sum_j w_j g_h(x, x_j) V(x_j, ., h) (``kernel_grid``)."""
        q, k, v = self.qkv(u, context)
        mask, causal = self.support(context)
        p = self.attn_dropout if self.training else 0.0
        if self.reads_tape and context is not None and context.tape is not None:
            return self._on_tape(context, q, k, v, mask, causal, p)
        grid = self.kernel_grid(context, q.shape[-2], k.shape[-2], q.shape[0])
        if grid is None:
            return self.kernel(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=p)
        if not self.kernel.grid_aware:
            raise ValueError(
                f"{type(self).__name__}: the kernel {type(self.kernel).__qualname__} does not "
                "integrate against a token grid (its class does not declare grid_aware = True "
                "and its forward takes no grid), and the context has token_weights or "
                "token_coords: refused rather than silently ignored")
        return self.kernel(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=p, grid=grid)

    def _on_tape(self, context: Context, q, k, v, mask, causal: bool, p: float
                 ) -> torch.Tensor:
        """The new nodes' queries over the past (from the KV tape) and the new keys: the
        Volterra structure of the causal support (``operators.tape``)."""
        if mask is not None or not causal:
            raise ValueError(f"{type(self).__name__}: a KV tape needs the causal support "
                             "x' <= x alone in the context (is_causal=True, no attn_mask; the "
                             "tape holds the padding): without it the past is not final")
        if p > 0.0:
            raise ValueError(f"{type(self).__name__}: a KV tape with attention dropout "
                             f"({p}): call model.eval() before decoding on a tape")
        return context.tape.attend(self.kernel, q, k, v)

    returns_new = True  # W_O (.) + b_O, a new tensor (operators.base.returns_new)

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        b, n, _ = u.shape
        heads = self.head_outputs(u, context)
        out = heads.transpose(1, 2).reshape(b, n, self.inner_dim)
        return apply_dropout(self.out_dropout, F.linear(out, self.out_weight, self.out_bias))

    @torch.no_grad()
    def scale_(self, c: float) -> None:
        """A <- c A: W_O and b_O times c (the output is W_O (sum_h g_h V_h) + b_O)."""
        self.out_weight.mul_(c)
        if self.out_bias is not None:
            self.out_bias.mul_(c)

    @torch.no_grad()
    def compose_(self, m: torch.Tensor) -> None:
        """A <- M A: W_O <- M W_O, b_O <- M b_O (``Operator.compose_``)."""
        _compose_linear_(self.out_weight, self.out_bias, m)

    def head_sum(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        """A(U) written as the head integral sum_h (g_h V_h) W_O,h + b_O (slow; for checks)."""
        heads = self.head_outputs(u, context)
        w_o = self.out_weight.reshape(self.dim, self.num_heads, self.head_dim)
        out = torch.einsum("bhnd,zhd->bnz", heads, w_o)
        return out + self.out_bias if self.out_bias is not None else out


class NonlocalAttention(AttentionOperator):
    """A[u]: multi-head nonlocal attention (a vector field; the residual is the integrator's)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        bias: bool = True,
        out_bias: bool | None = None,
        kernel: Kernel | None = None,
        attn_dropout: float = 0.0,
        out_dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(dim, num_heads, kernel=kernel, attn_dropout=attn_dropout)
        kw = {"device": device, "dtype": dtype}
        self.qkv_weight = nn.Parameter(torch.empty(3 * dim, dim, **kw))
        self.qkv_bias = nn.Parameter(torch.empty(3 * dim, **kw)) if bias else None
        self._add_output(bias if out_bias is None else out_bias, out_dropout, **kw)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.qkv_weight)
        nn.init.xavier_uniform_(self.out_weight, gain=1.0 / math.sqrt(2.0))
        if self.qkv_bias is not None:
            nn.init.zeros_(self.qkv_bias)
        if self.out_bias is not None:
            nn.init.zeros_(self.out_bias)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, kernel={self.kernel.name}, "
            f"bias={self.qkv_bias is not None}"
        )

    def qkv(self, u: torch.Tensor, context: Context | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V as (B, H, N_x, d_h): the feature integrals with the head coordinate."""
        b, n, _ = u.shape
        qkv = F.linear(u, self.qkv_weight, self.qkv_bias)
        qkv = qkv.view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return q, k, v


_EMPTY = Context()


class CrossAttention(NonlocalAttention):
    """A[u; m]: attention whose keys and values come from a second field m(x', y).

        A[u; m](x, z) = sum_h int W_O(y,h,z) int g_h(x,x') V_m(x',y,h) dx' dy + b_O(z),
        g_h(x,x') = softmax_x'(<Q_u(x,.,h), K_m(x',.,h)> / sqrt(d_h) + m_cross(x,x'))

    Q is a feature integral of u, K and V of the memory m (the encoder's u(T) in an
    encoder-decoder pair). The memory is read from ``context.memory`` and its kernel support
    from ``context.memory_mask`` (scaled_dot_product_attention convention). The integral over
    x' runs on the memory's grid: ``context.memory_weights`` / ``context.memory_coords``
    (None = uniform, the index); the queries sit on u's grid. Where one of the two grids has
    coordinates, the other's are its own index 0 .. N-1.
    Weights are packed like NonlocalAttention (rows W_Q, W_K, W_V).
    """

    reads_tape = False

    def kernel_grid(self, context: Context | None, n_q: int, n_k: int, batch: int
                    ) -> KernelGrid | None:
        """The memory's grid for the keys, u's for the queries; None when both are uniform."""
        ctx = context if context is not None else _EMPTY
        mem = TokenGrid(ctx.memory_weights, ctx.memory_coords)
        own = ctx.token_grid
        if mem.is_default and own.is_default:
            return None
        mem.check(n_k, batch, "CrossAttention (memory)")
        own.check(n_q, batch, "CrossAttention")
        qc, kc = own.coords, mem.coords
        if (qc is None) != (kc is None):
            # one grid has coordinates: the other's are its own index 0 .. N-1 (TokenGrid's
            # default), not the index aligned to the other grid's length, which would move
            # the queries whenever the memory is refined
            given = qc if qc is not None else kc
            qc = own.coordinates(n_q, given.dtype, given.device) if qc is None else qc
            kc = mem.coordinates(n_k, given.dtype, given.device) if kc is None else kc
        return KernelGrid(key_weights=mem.weights, query_weights=own.weights,
                          query_coords=qc, key_coords=kc)

    def qkv(self, u: torch.Tensor, context: Context | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if context is None or context.memory is None:
            raise ValueError("CrossAttention needs context.memory (the second field)")
        m = context.memory
        d, w, bias = self.dim, self.qkv_weight, self.qkv_bias
        q = F.linear(u, w[:d], None if bias is None else bias[:d])
        kv = F.linear(m, w[d:], None if bias is None else bias[d:])
        k, v = kv.view(m.shape[0], m.shape[1], 2, self.num_heads, self.head_dim
                       ).permute(2, 0, 3, 1, 4).unbind(0)
        return self.split_heads(q), k, v

    def support(self, context: Context | None) -> tuple[torch.Tensor | None, bool]:
        return context.memory_mask, False

    @property
    def relative_positions(self) -> bool:
        return False

    def relative_positions_reason(self) -> str:
        return ("its queries are tokens of u and its keys tokens of the memory m, two different "
                "sequences (CrossAttention): put a relative-position kernel into the "
                "self-attention operators one by one (op.set_kernel(name))")


class GroupedQueryAttention(AttentionOperator):
    """A[u] with H query heads and H_kv key/value heads: grouped-query attention.

    Continuous form (docs/math.md 3.17), heads h = (g, j), g = h H_kv / H:

        A[u](x) = sum_h W_O,h int_{S(x)} g_h(x, x') V_g(x') dx',
        g_h(x, x') = softmax_x'( s <R_x N_Q Q_h(x), R_x' N_K K_g(x')> )

    K and V are sampled on a coarser grid in the head coordinate than Q (each key/value head
    serves H / H_kv query heads; MQA is H_kv = 1, MHA H_kv = H); the head size d_h is its own
    grid (``head_dim``, not necessarily dim / H: Gemma, Qwen3). Options:

    * ``q_norm`` / ``k_norm``: projections of each head's Q and K onto a sphere (QK-norm of
      Qwen3 and Gemma3: ``RMSNormProjection(head_dim)``), N_Q and N_K above;
    * ``rope``: the name of the rotary positions R_x in ``Context.rotary`` (computed once per
      forward by the model: the kernel on coordinates of docs/math.md 3.18); None: no rotation;
    * ``window``: the support S(x) = {x' : x - x' < W} within the causal support (a sliding
      window, Mistral, Gemma2/3), on the token coordinates.

    Weights as transformers stores them: ``q_weight`` (H d_h, dim), ``k_weight`` and
    ``v_weight`` (H_kv d_h, dim), optional biases (Qwen2), ``out_weight`` W_O (dim, H d_h).
    On a KV tape the H_kv heads are stored (rotated, as transformers' cache holds them), and
    the tape is told the rotary positions that rotated them (a cache policy that merges keys
    un-rotates and re-rotates them at the merged coordinate).
    W_Q, W_K and W_V (and their biases) lie one after the other in memory
    (``feature.stack_rows_``): without autograd the three lifts can be one matrix product
    [W_Q; W_K; W_V] u, Q and K then rotated in one call (``feature.StackedProduct``: where it
    gives the bits of the three products; fewer calls).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = False,
        out_bias: bool = False,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        rope: str | None = None,
        window: int | None = None,
        kernel: Kernel | None = None,
        attn_dropout: float = 0.0,
        out_dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(dim, num_heads, kernel=kernel, attn_dropout=attn_dropout,
                         head_dim=head_dim)
        kv = num_heads if num_kv_heads is None else num_kv_heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv <= 0 or num_heads % kv:
            raise ValueError(f"num_kv_heads must be a positive int dividing num_heads="
                             f"{num_heads} (each key/value head serves a group of query "
                             f"heads), got {num_kv_heads!r}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window < 1):
            raise ValueError(f"window must be None or an int >= 1 (the support x - x' < W), "
                             f"got {window!r}")
        if rope is not None and not isinstance(rope, str):
            raise TypeError(f"rope must be None or the name of the rotary angles in "
                            f"Context.rotary, got {type(rope).__name__}")
        self.num_kv_heads = kv
        self.rope = rope
        self.window = window
        kw = {"device": device, "dtype": dtype}
        d_kv = kv * self.head_dim
        self.q_weight = nn.Parameter(torch.empty(self.inner_dim, dim, **kw))
        self.k_weight = nn.Parameter(torch.empty(d_kv, dim, **kw))
        self.v_weight = nn.Parameter(torch.empty(d_kv, dim, **kw))
        self.q_bias = nn.Parameter(torch.zeros(self.inner_dim, **kw)) if bias else None
        self.k_bias = nn.Parameter(torch.zeros(d_kv, **kw)) if bias else None
        self.v_bias = nn.Parameter(torch.zeros(d_kv, **kw)) if bias else None
        self.q_norm = q_norm
        self.k_norm = k_norm
        self._add_output(out_bias, out_dropout, **kw)
        self.q_weight, self.k_weight, self.v_weight = stack_rows_(
            (self.q_weight, self.k_weight, self.v_weight))
        if bias:
            self.q_bias, self.k_bias, self.v_bias = stack_rows_(
                (self.q_bias, self.k_bias, self.v_bias))
        self._stack = StackedProduct()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.q_weight, self.k_weight, self.v_weight):
            nn.init.xavier_uniform_(w)
        nn.init.xavier_uniform_(self.out_weight, gain=1.0 / math.sqrt(2.0))
        for b in (self.q_bias, self.k_bias, self.v_bias, self.out_bias):
            if b is not None:
                nn.init.zeros_(b)

    @property
    def groups(self) -> int:
        """H / H_kv: the query heads each key/value head serves."""
        return self.num_heads // self.num_kv_heads

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in (("rope", self.rope), ("window", self.window))
                        if v is not None)
        return (f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, kernel={self.kernel.name}, "
                f"bias={self.q_bias is not None}, qk_norm={self.q_norm is not None}{extra}")

    def qkv(self, u: torch.Tensor, context: Context | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q (B, H, N, d_h), K and V (B, H_kv, N, d_h): the feature integrals, the QK-norm
        projections, the rotation at the nodes' coordinates."""
        b, n, _ = u.shape
        d, h, g = self.head_dim, self.num_heads, self.num_kv_heads
        lifted = self._stack(u, (self.q_weight, self.k_weight, self.v_weight),
                             (self.q_bias, self.k_bias, self.v_bias))
        if lifted is None:
            q = F.linear(u, self.q_weight, self.q_bias).view(b, n, h, d)
            k = F.linear(u, self.k_weight, self.k_bias).view(b, n, g, d)
            v = F.linear(u, self.v_weight, self.v_bias).view(b, n, g, d)
        elif self.rope is not None and self.q_norm is None and self.k_norm is None:
            # Q's and K's heads rotated in one call, in the (B, N, heads, d_h) layout (the
            # angles (B|1, 1, N, d_r) read with the token axis second): the same products
            cos, sin = self._angles(context, n, lifted.dtype)
            qk, v = lifted.view(b, n, h + 2 * g, d).split_with_sizes((h + g, g), dim=2)
            q, k = rotate_half(qk, cos.transpose(1, 2), sin.transpose(1, 2)
                               ).split_with_sizes((h, g), dim=2)
            q = self._tempered(q.transpose(1, 2), context)
            return q, k.transpose(1, 2), v.transpose(1, 2)
        else:
            q, k, v = lifted.view(b, n, h + 2 * g, d).split_with_sizes((h, g, g), dim=2)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.rope is not None:
            cos, sin = self._angles(context, n, q.dtype)
            q, k = self._tempered(rotate_half(q, cos, sin), context), rotate_half(k, cos, sin)
        return q, k, v

    def _tempered(self, q: torch.Tensor, context: Context | None) -> torch.Tensor:
        """q (B, H, N, d_h) times the rotary kernel's query temperature where it has one
        (``RotaryAngles.temperature``: the bandwidth rule's log n factor), else q."""
        assert context is not None and context.rotary is not None and self.rope is not None
        factor = context.rotary.temperature(self.rope, context.token_coords, q.dtype)
        return q if factor is None else q * factor

    def _angles(self, context: Context | None, n: int, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (B|1, 1, N, d_r) of the rotary positions ``rope`` at the context's
        nodes (``Context.rotary``); ValueError when the context lacks them or they are at
        another number of nodes than ``n``."""
        if context is None or context.rotary is None or \
                self.rope not in context.rotary.positions:
            raise ValueError(f"{type(self).__name__}: rope={self.rope!r} needs the rotary "
                             f"positions {self.rope!r} in Context.rotary (the model puts "
                             "them there; the angles are computed once per forward)")
        cos, sin = context.rotary.angles(self.rope, context.token_coords, dtype)
        if cos.shape[-2] != n:
            raise ValueError(f"{type(self).__name__}: the rotary angles are at "
                             f"{cos.shape[-2]} nodes but the field has {n}")
        return cos, sin

    def _apply(self, fn, recurse: bool = True):
        self._stack.clear()  # the parameters move: the stacked view would hold the old memory
        return super()._apply(fn, recurse)

    def head_outputs(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        """int_{S(x)} g_h(x,x') V_g(x') dx' for every query head: (B, H, N_x, d_h)."""
        q, k, v = self.qkv(u, context)
        mask, causal = self.support(context)
        p = self.attn_dropout if self.training else 0.0
        if context is not None and context.tape is not None:
            if mask is not None or not causal:
                return self._on_tape(context, q, k, v, mask, causal, p)  # refuses, naming why
            if p > 0.0:
                return self._on_tape(context, q, k, v, mask, causal, p)
            # the rotary positions that rotated K: a cache policy that merges keys un-rotates
            # and re-rotates them at the merged coordinate (operators.cache_policy)
            rotary = None if self.rope is None or context.rotary is None else \
                context.rotary.positions.get(self.rope)
            return context.tape.attend(self.kernel, q, k, v, window=self.window, rotary=rotary)
        grid = self.kernel_grid(context, q.shape[-2], k.shape[-2], q.shape[0])
        k, v = expand_heads(self.kernel, q, k, v)
        if self.window is not None:
            mask, causal = window_support(mask, causal, q.shape[-2], k.shape[-2], grid,
                                          self.window, q.dtype, q.device)
        if grid is None:
            return self.kernel(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=p)
        if not self.kernel.grid_aware:
            raise ValueError(
                f"{type(self).__name__}: the kernel {type(self.kernel).__qualname__} does not "
                "integrate against a token grid, and the context has token_weights or "
                "token_coords: refused rather than silently ignored")
        return self.kernel(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=p, grid=grid)
