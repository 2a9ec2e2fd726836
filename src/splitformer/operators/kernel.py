"""What every attention kernel shares: the ``Kernel`` protocol, the ``KernelSite`` it acts in,
the score scale's check, and the kernel's support (a mask, the causal support x' <= x, the
token grid's weights) as sdpa takes it.

A kernel maps per-head Q, K, V (B, H, N_x, d_h) to int g(x,x') V(x',.) dx' (B, H, N_x, d_h);
the kernels themselves and their registry are ``operators.kernels`` (and
``operators.positional`` for the kernels on coordinates), which import this module; nothing
here imports them.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from .token_grid import KernelGrid

__all__ = ["Kernel", "KernelSite", "check_scale", "expand_heads", "support_is_causal",
           "window_support"]


def expand_heads(kernel: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V as ``kernel`` takes them: as given when it declares ``grouped_heads`` or the
    head counts agree, else each of the H_kv key/value heads repeated H / H_kv times (the
    coarse quadrature in the head coordinate read on the fine one, transformers' repeat_kv)."""
    h, h_kv = q.shape[-3], k.shape[-3]
    if h == h_kv or kernel.grouped_heads:
        return k, v
    return k.repeat_interleave(h // h_kv, dim=-3), v.repeat_interleave(h // h_kv, dim=-3)


def check_scale(scale: Any, owner: str) -> float | None:
    """A score scale s: None (1/sqrt(d_h)) or a finite real number > 0, returned as a float.

    s <= 0 or NaN turns the softmax of <Q, K> s into a constant or NaN (torch's sdpa returns NaN
    for s <= 0 with a causal support on CPU): refused, naming ``owner``."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{owner}: scale must be None (1/sqrt(d_h)) or a finite number > 0, got "
                        f"{type(scale).__name__} {scale!r}")
    if not (math.isfinite(float(scale)) and scale > 0):
        raise ValueError(f"{owner}: scale must be None (1/sqrt(d_h)) or a finite number > 0, got "
                         f"{scale!r}")
    return float(scale)


class KernelSite(Protocol):
    """What a kernel may ask of the attention operator it acts in (``for_operator``,
    ``check_operator``, ``warn_about_instance``): the head coordinate, whether the token offset
    x - x' is defined there, and the operator's score scale. ``AttentionOperator`` declares it."""

    num_heads: int
    head_dim: int
    kernel: Kernel  # the kernel in force (a kernel built by name may inherit its settings)

    @property
    def relative_positions(self) -> bool:
        """Whether queries and keys lie on one token grid (x - x' is defined)."""

    def relative_positions_reason(self) -> str:
        """Why ``relative_positions`` is False (for error messages)."""

    def score_scale(self) -> float | None:
        """The score scale in force (None = 1/sqrt(d_h))."""

    def has_default_scale(self) -> bool:
        """Whether the score scale is 1/sqrt(d_h)."""


class Kernel(nn.Module):
    """Base class of attention kernels (a value plugged into an ``AttentionOperator``).

    Class attributes: ``name`` (the registry name), ``takes_scale`` (the kernel has a score scale
    s, attribute ``scale``, None = 1/sqrt(d_h), that a kernel built by name inherits from the
    operator), ``relative`` (the kernel is a function of the token offset x - x', so it needs
    queries and keys on one token grid), ``grid_aware`` (``forward`` takes ``grid``, a
    ``KernelGrid``, and integrates against its weights and coordinates; a kernel without it is
    refused on a non-uniform token grid). ``scale`` is None on a kernel without a score scale
    (``takes_scale`` False); a kernel with one sets it in its constructor.
    """

    name: ClassVar[str] = "kernel"
    takes_scale: ClassVar[bool] = False
    relative: ClassVar[bool] = False
    grid_aware: ClassVar[bool] = False
    # forward takes K and V with fewer heads than Q (grouped-query attention, docs/math.md
    # 3.17): H_kv divides H and key/value head g serves the query heads g H/H_kv .. (g+1)
    # H/H_kv - 1; a kernel without it gets K and V repeated to H heads (``expand_heads``)
    grouped_heads: ClassVar[bool] = False

    @property
    def causal_support(self) -> bool:
        """Whether the kernel is supported on x' <= x whatever ``is_causal`` says (a causal
        ALiBi kernel); False for the others."""
        return False

    scale: float | None = None

    # what a KV tape stores for a past node at one attention evaluation (operators.tape):
    # "keys_values" (K and V; the tape calls forward with the past and new keys), "running_sums"
    # (the recurrent form: the tape calls ``recurrent``), None (not cacheable exactly: refused,
    # with ``cache_refusal`` as the reason). A user kernel declares nothing and is refused.
    caches: str | None = None
    cache_refusal: str = ("it declares no cache (Kernel.caches): set caches = 'keys_values' if "
                          "its output at x depends on the past keys and values only")

    def recurrent(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  sums: tuple[torch.Tensor, torch.Tensor] | None, *,
                  keep: torch.Tensor | None = None, weights: torch.Tensor | None = None,
                  coords: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The recurrent form of a ``caches = "running_sums"`` kernel (see LinearKernel)."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent form")

    @classmethod
    def for_operator(cls, op: KernelSite, **options: Any) -> Kernel:
        """A kernel of this class for the attention operator ``op`` (heads, head size);
        ``options`` are the constructor's."""
        return cls(**options)

    def check_operator(self, op: KernelSite) -> None:
        """Raise ValueError (with the reason) if this kernel cannot act in ``op``."""
        if self.relative and not op.relative_positions:
            raise ValueError(
                f"the {self.name} kernel is a function of the token offset x - x', which is not "
                f"defined in {type(op).__name__}: {op.relative_positions_reason()}"
            )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        grid: KernelGrid | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError


def _grid_sdpa_support(attn_mask, is_causal, q, k, grid: KernelGrid | None):
    """(mask, is_causal) for sdpa on the token grid: ``_sdpa_support`` on the uniform index grid
    (grid None: the fused causal flag kept where it can be); otherwise the support and log w
    folded into one additive mask (``_grid_additive``)."""
    if grid is None:
        return _sdpa_support(attn_mask, is_causal, q, k)
    return _grid_additive(attn_mask, is_causal, q, k, grid), False


def _grid_additive(attn_mask, is_causal, q, k, grid: KernelGrid | None):
    """The kernel's support and the quadrature weights as one additive term of the scores:
    0 / -inf for the mask and the causal support (x_k <= x_q on the grid's coordinates, the
    bottom-right aligned index without them), plus log w_k; None when there is none."""
    n_q, n_k, dtype, device = q.shape[-2], k.shape[-2], q.dtype, q.device
    by_coords = grid is not None and grid.has_coords
    m = _additive_support(attn_mask, is_causal and not by_coords, n_q, n_k, dtype, device)
    if grid is None:
        return m
    if is_causal and by_coords:
        c = torch.zeros((), dtype=dtype, device=device).masked_fill(
            ~grid.causal(n_q, n_k, device), float("-inf"))
        m = c if m is None else m + c
    lw = grid.log_weights(dtype, device)
    if lw is not None:
        m = lw if m is None else m + lw
    return m


def _sdpa_support(attn_mask, is_causal, q, k):
    """(mask, is_causal) for scaled_dot_product_attention with this module's causal support.

    sdpa takes a mask or ``is_causal``, not both, and its ``is_causal`` is top-left aligned
    (tril(0)), while the causal support here is bottom-right aligned (query x at key position
    x + N_k - N_q, as every kernel of this module reads it): the fused flag is kept only when
    there is no mask and N_q = N_k (the two alignments agree); otherwise the support is folded
    into the mask."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if is_causal and (attn_mask is not None or n_q != n_k):
        return _additive_support(attn_mask, True, n_q, n_k, q.dtype, q.device), False
    return attn_mask, is_causal


def _additive_support(attn_mask, is_causal, n_q, n_k, dtype, device):
    """The kernel support as an additive mask (0 on the support, -inf off it), or None."""
    m = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            m = torch.zeros(attn_mask.shape, dtype=dtype, device=device)
            m = m.masked_fill(~attn_mask, float("-inf"))
        else:
            m = attn_mask
    if is_causal:
        c = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)
        c = torch.zeros(n_q, n_k, dtype=dtype, device=device).masked_fill(~c, float("-inf"))
        m = c if m is None else m + c
    return m


def _off_support(attn_mask: torch.Tensor) -> torch.Tensor:
    """Where a mask (sdpa's convention) excludes x' from the support of the kernel at x: False
    entries of a boolean mask; -inf or finfo.min (transformers' eager masks) of a float one."""
    if attn_mask.dtype == torch.bool:
        return ~attn_mask
    return attn_mask <= torch.finfo(attn_mask.dtype).min


def support_is_causal(attn_mask: torch.Tensor | None, is_causal: bool, n_q: int, n_k: int
                      ) -> bool:
    """Whether the support lies in {x' <= x} (bottom-right aligned, as in this module):
    ``is_causal``, or a mask excluding every x' > x (checked on the values: one sync)."""
    if is_causal:
        return True
    if attn_mask is None:
        return False
    off = _off_support(attn_mask)
    while off.dim() < 2:
        off = off.unsqueeze(0)
    off = torch.broadcast_to(off, (*off.shape[:-2], n_q, n_k))
    future = ~torch.ones(n_q, n_k, dtype=torch.bool, device=off.device).tril(n_k - n_q)
    return bool(off[..., future].all())


def _support_is_causal_on(grid: KernelGrid, attn_mask: torch.Tensor, n_q: int, n_k: int
                          ) -> bool:
    """``support_is_causal`` on a token grid: whether the mask excludes every pair with
    x_k > x_q on the grid's coordinates (the bottom-right aligned index without them, where
    it is ``support_is_causal``). A mask whose support is causal on the coordinates stays so
    when a node is split (its copies, at one coordinate, see each other). One sync."""
    future = ~grid.causal(n_q, n_k, attn_mask.device)  # (B|1, 1, N_q, N_k)
    return bool((_off_support(attn_mask) | ~future).all())


def window_support(attn_mask: torch.Tensor | None, is_causal: bool, n_q: int, n_k: int,
                   grid: KernelGrid | None, window: int, dtype: torch.dtype,
                   device: torch.device) -> tuple[torch.Tensor, bool]:
    """The support intersected with the sliding window {x_q - x_k < W} (docs/math.md 3.17), as
    (mask, False): the causal part x_k <= x_q folded in when ``is_causal``. The offsets are the
    grid's coordinates, else the index with the queries bottom-right aligned. A boolean mask
    stays boolean; a floating (additive) one gets finfo.min off the window, as transformers'
    eager masks."""
    if grid is not None and grid.has_coords:
        xq, xk = grid.positions(n_q, n_k, torch.float64, device)
    else:
        xq = (torch.arange(n_q, dtype=torch.float64, device=device) + (n_k - n_q)).unsqueeze(0)
        xk = torch.arange(n_k, dtype=torch.float64, device=device).unsqueeze(0)
    off = xq[:, :, None] - xk[:, None, :]
    band = off < window
    if is_causal:
        band = band & (off >= 0)
    band = band.unsqueeze(1)  # (B|1, 1, N_q, N_k)
    if attn_mask is None:
        return band, False
    if attn_mask.dtype == torch.bool:
        return attn_mask & band, False
    low = torch.tensor(torch.finfo(attn_mask.dtype).min, dtype=attn_mask.dtype, device=device)
    return torch.where(band, attn_mask, low), False
