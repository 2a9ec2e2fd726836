"""Feature-integral operators L_j and the J-stage feed-forward field.

A feature-integral operator is local in x and integral in y:

    L[u](x,z) = int W(xi,z) u(x,xi) dxi + b(z)          (discrete: U W^T + b)

Its output feature domain may differ from the input one: the hidden stage of a feed-forward
block lives on a lifted feature grid of width N_h. The identity between the two grids
(``embed``) is the rectangular identity E: zero padding when lifting, truncation when
restricting; it is what the paper's (I + W_j) form means when widths differ.

The feed-forward vector field with J stages (docs/math.md section 3.4) is

    G(u) = L_J( s( ... s(L_1 u) ... ) )

with s an activation applied pointwise on the lifted domain (ReLU = projection onto S2 of
the hidden field). J = 2 is the standard FFN: G(u) = W_2 s(W_1 u + b_1) + b_2.

The gated field (SwiGLU, GeGLU; docs/math.md 3.16) is a product of two feature integrals,

    G(u)(x) = W_d ( s(W_g u(x) + b_g) * (W_u u(x) + b_u) ) + b_d,

pointwise in x: a reaction term of degree two in the lifted features, not a projection and not
globally Lipschitz (``GatedFeedForward``, with its Lipschitz bound on a ball).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .base import Context, Operator, apply_dropout, has_hooks, tree_has_hooks
from .projections import Activation

__all__ = ["ACTIVATION_BOUNDS", "FeatureIntegral", "FeedForward", "GatedFeedForward"]


class FeatureIntegral(Operator):
    """L[u] = U W^T + b: an integral transform in the feature variable y."""

    kind = "field"

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        for name, val in (("in_dim", in_dim), ("out_dim", out_dim)):
            if not isinstance(val, int) or val <= 0:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        self.in_dim, self.out_dim = in_dim, out_dim
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_dim, device=device, dtype=dtype)) if bias else None
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_dim)
            nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return f"in_dim={self.in_dim}, out_dim={self.out_dim}, bias={self.bias is not None}"

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        return apply_dropout(self.dropout, F.linear(u, self.weight, self.bias))

    @torch.no_grad()
    def scale_(self, c: float) -> None:
        """L <- c L: W and b times c."""
        self.weight.mul_(c)
        if self.bias is not None:
            self.bias.mul_(c)

    @torch.no_grad()
    def compose_(self, m: torch.Tensor) -> None:
        """L <- M L: W <- M W, b <- M b (``Operator.compose_``)."""
        _compose_linear_(self.weight, self.bias, m)

    @property
    def changes_width(self) -> bool:
        return self.in_dim != self.out_dim

    def embed(self, u: torch.Tensor) -> torch.Tensor:
        """E u: the identity between the input and output feature grids (pad or truncate)."""
        if self.in_dim == self.out_dim:
            return u
        if self.out_dim > self.in_dim:
            return F.pad(u, (0, self.out_dim - self.in_dim))
        return u[..., : self.out_dim]

    def identity_matrix(self) -> torch.Tensor:
        """E as an (out_dim, in_dim) matrix: ones on the diagonal."""
        return torch.eye(self.out_dim, self.in_dim, dtype=self.weight.dtype,
                         device=self.weight.device)


class FeedForward(Operator):
    """G(u) = L_J(s(... s(L_1 u))): the feed-forward vector field with J >= 1 stages.

    ``widths`` lists the feature grids [N_y, N_1, ..., N_{J-1}, N_y]; the activation s acts
    on every hidden grid. Dropout, when set, acts on each hidden field (``dropout``) and on
    the output (``out_dropout``), as in torch.nn.TransformerEncoderLayer.

    The field acts on each token alone: ``forward`` flattens u to a (tokens, N_y) matrix, so
    its ``FeatureIntegral`` stages and activation see 2-D tensors (hooks on them too), and each
    W_j h + b_j is a new matrix that ReLU overwrites in place (``Activation.apply_``; not where
    a hook on the stage may hold it).
    """

    kind = "field"

    def __init__(
        self,
        widths: Sequence[int],
        *,
        activation: str | Activation = "relu",
        bias: bool = True,
        dropout: float = 0.0,
        out_dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        widths = list(widths)
        if len(widths) < 2:
            raise ValueError(f"widths must list at least [in, out] (J >= 1), got {widths!r}")
        self.widths = widths
        self.stages = nn.ModuleList(
            FeatureIntegral(a, b, bias=bias, device=device, dtype=dtype)
            for a, b in zip(widths[:-1], widths[1:], strict=True)
        )
        self.activation = activation if isinstance(activation, Activation) else Activation(
            activation)
        self.dropout = nn.Dropout(dropout)
        self.out_dropout = nn.Dropout(out_dropout)

    @property
    def num_stages(self) -> int:
        """J, the number of feature-integral operators."""
        return len(self.stages)

    def extra_repr(self) -> str:
        return f"widths={self.widths}, J={self.num_stages}"

    returns_new = True  # W_J h + b_J, a new tensor (operators.base.returns_new)

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        lead = u.shape[:-1]
        h = u.reshape(-1, u.shape[-1])  # tokens x features: each W_j h + b_j is a new matrix,
        last = len(self.stages) - 1      # not a view, which the activation may overwrite
        for j, stage in enumerate(self.stages):
            h = stage(h)
            if j < last:  # in place only where no hook of the stage may hold W_j h + b_j
                s = self.activation.apply_(h) if not tree_has_hooks(stage) else \
                    self.activation(h)
                h = apply_dropout(self.dropout, s)
        return apply_dropout(self.out_dropout, h.view(*lead, h.shape[-1]))

    @torch.no_grad()
    def scale_(self, c: float) -> None:
        """G <- c G: the last stage's W_J and b_J times c (G(u) = W_J h + b_J)."""
        last = self.stages[-1]
        last.weight.mul_(c)
        if last.bias is not None:
            last.bias.mul_(c)

    @torch.no_grad()
    def compose_(self, m: torch.Tensor) -> None:
        """G <- M G: the last stage's W_J <- M W_J, b_J <- M b_J."""
        last = self.stages[-1]
        _compose_linear_(last.weight, last.bias, m)


# sup |s'| and the growth bound c with |s(z)| <= c |z| of each activation a gated field takes
# (SiLU: max s' = 1.0998 at z = 2.3994; GELU: max s' = 1.1289 at z = sqrt(2); tanh-GELU within
# 1e-3 of it, bounded by 1.13; ReLU and identity 1)
ACTIVATION_BOUNDS: dict[str, tuple[float, float]] = {
    "silu": (1.0999, 1.0),
    "gelu": (1.1290, 1.0),
    "gelu_tanh": (1.1300, 1.0),
    "relu": (1.0, 1.0),
    "identity": (1.0, 1.0),
}


def _compose_linear_(weight: torch.Tensor, bias: torch.Tensor | None, m: torch.Tensor) -> None:
    """W <- M W and b <- M b in place (M: (out, out), computed in the higher of the two
    dtypes and float32, written back in W's dtype)."""
    if not (isinstance(m, torch.Tensor) and m.dim() == 2
            and m.shape == (weight.shape[0], weight.shape[0])):
        raise ValueError(f"compose_(m): m must be a ({weight.shape[0]}, {weight.shape[0]}) "
                         f"matrix on the output features, got "
                         f"{tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__}")
    dtype = torch.promote_types(torch.promote_types(m.dtype, weight.dtype), torch.float32)
    m = m.to(device=weight.device, dtype=dtype)
    weight.copy_(m @ weight.to(dtype))
    if bias is not None:
        bias.copy_(m @ bias.to(dtype))


def stacked_rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tensors as one, the rows of each after those of the one before, when they lie so in
    memory (each contiguous, one after the other in one storage, one dtype and row shape): a
    view of that memory, no copy; None otherwise."""
    first = tensors[0]
    if first.device.type == "meta":
        return None
    storage = first.untyped_storage().data_ptr()
    tail, stride = first.shape[1:], first.stride()
    ptr, rows = first.data_ptr(), 0
    for t in tensors:
        if t.data_ptr() != ptr or t.dtype != first.dtype or t.shape[1:] != tail \
                or not t.is_contiguous() or t.untyped_storage().data_ptr() != storage:
            return None
        ptr += t.numel() * t.element_size()
        rows += t.shape[0]
    return first.detach().as_strided((rows, *tail), stride)


def stack_rows_(params: Sequence[nn.Parameter]) -> list[nn.Parameter]:
    """New parameters with the values of ``params``, stored one after the other in one block
    of memory (``stacked_rows`` reads them as one); the values, shapes and the random numbers
    drawn to initialise them are those of ``params``."""
    with torch.no_grad():
        block = torch.cat([p.detach() for p in params])
    out, start = [], 0
    for p in params:
        out.append(nn.Parameter(block[start:start + p.shape[0]], requires_grad=p.requires_grad))
        start += p.shape[0]
    return out


# (input and weight configuration) -> whether the stacked product gives the separate products'
# bits there (``StackedProduct``); bounded: cleared when it holds _PROBED_MAX configurations
_SAME_BITS: dict[tuple, bool] = {}
_PROBED_MAX = 4096


class StackedProduct:
    """[W_1; ...; W_k] u + [b_1; ...; b_k]: the lifts of one input u by weights stored one
    after the other (``stack_rows_``) as one matrix product, one call instead of k (a decode
    step of a small network is mostly calls; a product with more rows also runs closer to the
    matmul peak).

    The product is used only where it gives the bits of the k products: whether it does depends
    on the BLAS kernel the shapes select (how the output rows are tiled), so it is checked once
    per configuration (the rows of each W_i, the input's rows, dtype, layout and alignment, the
    thread count) on a random probe, and the k products are kept where the bits differ (float64
    at small widths on this machine's BLAS, for one). Never while autograd records, under
    torch.compile or under torch.func's transforms. The stacked view is kept while the
    parameters keep their memory (``clear`` drops it; ``Module.to`` moves parameters to new
    memory, and they are then taken one by one)."""

    def __init__(self) -> None:
        self.clear()

    def __repr__(self) -> str:  # a cache: every one is the same (saved models compare reprs)
        return "StackedProduct()"

    def clear(self) -> None:
        self._ptrs: tuple | None = None
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def _stacked(self, weights, biases) -> bool:
        ptrs = tuple(t.data_ptr() for t in weights) + tuple(
            0 if b is None else b.data_ptr() for b in biases)
        if ptrs != self._ptrs:
            self._ptrs, self._weight, self._bias = ptrs, stacked_rows(weights), None
            if self._weight is not None and any(b is not None for b in biases):
                self._bias = None if any(b is None for b in biases) else stacked_rows(biases)
                if self._bias is None:
                    self._weight = None
        return self._weight is not None

    def __call__(self, u: torch.Tensor, weights: Sequence[torch.Tensor],
                 biases: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
        """The stacked product (..., sum_i rows_i), or None (then the caller takes the k
        products)."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling() \
                or torch._C._are_functorch_transforms_active() \
                or not self._stacked(weights, biases):
            return None  # (torch.func's jvp / vmap: wrapped tensors have no data pointer)
        w, b = self._weight, self._bias
        key = (u.numel() // u.shape[-1], u.shape[-1], tuple(t.shape[0] for t in weights),
               b is not None, u.dtype, w.dtype, u.device, u.is_contiguous(),
               u.data_ptr() % 64, torch.get_num_threads())
        same = _SAME_BITS.get(key)
        if same is None:
            if len(_SAME_BITS) >= _PROBED_MAX:
                _SAME_BITS.clear()
            same = _SAME_BITS[key] = _same_bits(u, weights, biases, w, b)
        return F.linear(u, w, b) if same else None


def _same_bits(u: torch.Tensor, weights, biases, w: torch.Tensor, b: torch.Tensor | None
               ) -> bool:
    """Whether F.linear(x, w, b) equals the k products F.linear(x, W_i, b_i), concatenated,
    bit for bit, on a random x laid out as ``u`` (its own generator: the global one is not
    drawn from)."""
    if u.is_contiguous():  # at the input's alignment
        shift = (u.data_ptr() % 64) // u.element_size()
        x = torch.empty(shift + u.numel(), dtype=u.dtype, device=u.device)[shift:].view(u.shape)
    else:
        x = torch.empty_like(u)
    x.normal_(generator=torch.Generator(device=u.device).manual_seed(0))
    apart = [F.linear(x, wi, bi) for wi, bi in zip(weights, biases, strict=True)]
    return torch.equal(F.linear(x, w, b), torch.cat(apart, dim=-1))


def _identity_dropout(d: nn.Module) -> bool:
    """Whether ``apply_dropout(d, .)`` is the identity (an nn.Dropout of rate 0 or in eval
    mode, without hooks)."""
    return type(d) is nn.Dropout and (d.p == 0.0 or not d.training) and not has_hooks(d)


class GatedFeedForward(Operator):
    """G(u) = W_d (s(W_g u + b_g) * (W_u u + b_u)) + b_d: the gated feature field.

    SwiGLU (s = SiLU; Llama, Qwen, Mistral) and GeGLU (s = tanh-GELU; Gemma). Two lifts of u
    onto the hidden grid of width N_h (``gate`` W_g, ``up`` W_u), multiplied pointwise, and one
    feature integral back (``down`` W_d): pointwise in x. W_g and W_u (and their biases) are
    stored one after the other (``stack_rows_``), so that without autograd the two lifts can
    be one matrix product [W_g; W_u] u (``StackedProduct``: where it gives the same bits).

    It is bilinear in the two lifts (a reaction term), not a projection, and its Lipschitz
    constant grows with |u|: on the ball |v| <= R, which a pre-norm's sphere lies in
    (``RMSNormProjection.radius``),

        Lip(G) <= |W_d|_2 ( L_s |W_g|_2 (r_u R + |b_u|_inf) + c_s |W_u|_2 (r_g R + |b_g|_inf) ),

    r_g, r_u the largest row norms of W_g, W_u, L_s = sup |s'|, |s(z)| <= c_s |z|
    (``lipschitz_bound``): from DG(v) w = W_d (s'(a) (W_g w) b + s(a) (W_u w)), a = W_g v + b_g,
    b = W_u v + b_u, with |a_i| <= r_g R + |b_g|_inf. The paper's FFN analysis (ReLU, a
    projection of the lifted field) does not cover it.
    """

    kind = "field"
    returns_new = True

    def __init__(self, dim: int, hidden: int, *, activation: str = "silu", bias: bool = False,
                 out_dropout: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate = FeatureIntegral(dim, hidden, **kw)
        self.up = FeatureIntegral(dim, hidden, **kw)
        self.down = FeatureIntegral(hidden, dim, **kw)
        self.gate.weight, self.up.weight = stack_rows_((self.gate.weight, self.up.weight))
        if bias:
            self.gate.bias, self.up.bias = stack_rows_((self.gate.bias, self.up.bias))
        self._stack = StackedProduct()
        self.activation = Activation(activation)
        self.out_dropout = nn.Dropout(out_dropout)
        self.dim, self.hidden = dim, hidden

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, activation={self.activation.name}"

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        lifted = self._lifts(u)
        if lifted is None:
            lifted = self.activation(self.gate(u)) * self.up(u)
        return apply_dropout(self.out_dropout, self.down(lifted))

    def _lifts(self, u: torch.Tensor) -> torch.Tensor | None:
        """s(W_g u + b_g) * (W_u u + b_u) from one product [W_g; W_u] u (``StackedProduct``)
        where ``gate`` and ``up`` are plain lifts (FeatureIntegral, no hook, dropout the
        identity); None otherwise (then each lift is called)."""
        gate, up = self.gate, self.up
        if type(gate) is not FeatureIntegral or type(up) is not FeatureIntegral \
                or has_hooks(gate) or has_hooks(up) or not (
                    _identity_dropout(gate.dropout) and _identity_dropout(up.dropout)):
            return None
        both = self._stack(u, (gate.weight, up.weight), (gate.bias, up.bias))
        if both is None:
            return None
        a, c = both.split_with_sizes((gate.out_dim, up.out_dim), dim=-1)
        return self.activation(a) * c

    def _apply(self, fn, recurse: bool = True):
        self._stack.clear()  # the parameters move: the stacked view would hold the old memory
        return super()._apply(fn, recurse)

    @torch.no_grad()
    def scale_(self, c: float) -> None:
        """G <- c G: W_d and b_d times c."""
        self.down.scale_(c)

    @torch.no_grad()
    def compose_(self, m: torch.Tensor) -> None:
        """G <- M G: W_d <- M W_d, b_d <- M b_d."""
        self.down.compose_(m)

    @torch.no_grad()
    def lipschitz_bound(self, radius: float) -> float:
        """An upper bound of the Lipschitz constant of G on the ball |v| <= ``radius`` (class
        docstring); ValueError for an activation without known constants."""
        if self.activation.name not in ACTIVATION_BOUNDS:
            raise ValueError(f"no Lipschitz constants for the activation "
                             f"{self.activation.name!r}; known: {sorted(ACTIVATION_BOUNDS)}")
        slope, growth = ACTIVATION_BOUNDS[self.activation.name]
        wg, wu, wd = (m.weight.double() for m in (self.gate, self.up, self.down))

        def reach(stage: FeatureIntegral, w: torch.Tensor) -> float:
            r = float(w.norm(dim=1).max()) * radius
            return r + (float(stage.bias.abs().max()) if stage.bias is not None else 0.0)

        def norm(w):
            return (float(torch.linalg.matrix_norm(w, ord=2)))
        return norm(wd) * (slope * norm(wg) * reach(self.up, wu)
                           + growth * norm(wu) * reach(self.gate, wg))
