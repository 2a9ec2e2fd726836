"""Attention masks in the semantics of torch.nn.TransformerEncoder, turned into a kernel support,
and the token grid a family's forward hands to its operators.

torch.nn's conventions: a boolean ``mask`` / ``src_key_padding_mask`` is True where attention is
NOT allowed; a float one is added to the scores. ``mask`` is (N, N) or (B * H, N, N);
``src_key_padding_mask`` is (B, N). The kernel support handed to the attention operator uses the
convention of ``scaled_dot_product_attention`` (boolean True = allowed; float = additive).

The token grid (docs/math.md 3.12): quadrature weights w_j >= 0 and node coordinates x_j, each
(N,) or (B, N) (batch first whatever the layout of the input), None = uniform weights / the
index 0 .. N-1. ``check_token_grid`` checks them against the field's N and batch, naming the
argument; ``with_token_grid`` puts them into a ``Context``. On a token grid a causal support is
never folded into a mask here: it stays ``is_causal`` and the kernel reads it on the
coordinates (x_k <= x_q; two nodes at one coordinate see each other). A mask given by the caller
is a support on the node index, used as given.
"""

from __future__ import annotations

import torch

from ..operators.base import Context
from ..operators.token_grid import TokenGrid, check_grid_tensor

__all__ = [
    "attention_support",
    "build_context",
    "causal_support",
    "check_src",
    "check_token_grid",
    "finfo_additive",
    "merge_supports",
    "on_token_grid",
    "packed_support",
    "padding_support",
    "with_token_grid",
]


def check_src(src, *, dim: int, dtype: torch.dtype, device: torch.device, name: str = "src"):
    if not isinstance(src, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(src).__name__}")
    if src.dim() not in (2, 3):
        raise ValueError(
            f"{name} must have shape (batch, seq, {dim}) or (seq, {dim}), got {tuple(src.shape)}"
        )
    if src.shape[-1] != dim:
        raise ValueError(f"{name} last dimension must be d_model={dim}, got {tuple(src.shape)}")
    if src.dtype != dtype:
        raise TypeError(
            f"{name} has dtype {src.dtype} but the model's parameters are {dtype}; "
            f"convert one of them (model.to({dtype}) or {name}.to({dtype}))"
        )
    if src.device != device:
        raise ValueError(f"{name} is on {src.device} but the model is on {device}")


def _check_mask(m, name: str, dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(m, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(m).__name__}")
    if m.dtype != torch.bool and m.dtype != dtype:
        raise TypeError(f"{name} must be a bool tensor or a float tensor of dtype {dtype}, "
                        f"got {m.dtype}")
    if m.device != device:
        raise ValueError(f"{name} is on {m.device} but the model is on {device}")


def attention_support(
    mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    *,
    batch: int,
    num_heads: int,
    q_len: int,
    k_len: int,
    dtype: torch.dtype,
    device: torch.device,
    mask_name: str = "mask",
    kpm_name: str = "key_padding_mask",
) -> torch.Tensor | None:
    """torch.nn masks (bool True = not allowed, float = added) -> the kernel support m(x, x').

    ``mask`` is (q_len, k_len) or (batch * num_heads, q_len, k_len); ``key_padding_mask`` is
    (batch, k_len). The result is in scaled_dot_product_attention's convention (bool True =
    allowed, float = additive), broadcastable to (B, H, q_len, k_len); None = full support.
    Shapes, dtypes and devices are checked, naming the argument.
    """
    support = None
    if mask is not None:
        _check_mask(mask, mask_name, dtype, device)
        if mask.dim() == 2 and tuple(mask.shape) == (q_len, k_len):
            support = mask
        elif mask.dim() == 3 and tuple(mask.shape) == (batch * num_heads, q_len, k_len):
            support = mask.view(batch, num_heads, q_len, k_len)
        else:
            raise ValueError(f"{mask_name} must have shape ({q_len}, {k_len}) or "
                             f"({batch * num_heads}, {q_len}, {k_len}) (batch * num_heads, ...), "
                             f"got {tuple(mask.shape)}")
        support = ~support if support.dtype == torch.bool else support
    if key_padding_mask is not None:
        kpm = key_padding_mask
        _check_mask(kpm, kpm_name, dtype, device)
        if tuple(kpm.shape) != (batch, k_len):
            raise ValueError(f"{kpm_name} must have shape (batch, seq) = ({batch}, {k_len}), got "
                             f"{tuple(kpm.shape)}")
        kpm = (~kpm if kpm.dtype == torch.bool else kpm).view(batch, 1, 1, k_len)
        support = merge_supports(support, kpm, dtype)
    return support


def check_token_grid(weights: torch.Tensor | None, coords: torch.Tensor | None, *, batch: int,
                     seq: int, owner: str, names: tuple[str, str] = ("token_weights",
                                                                      "token_coords"),
                     dtype: torch.dtype | None = None
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The token grid of a field of ``seq`` nodes and batch ``batch``: ``weights`` (w_j >= 0, a
    positive sum per row; 0 = padding) and ``coords`` (x_j, finite), each None or a real
    (floating-point or integer) tensor of shape (seq,) or (batch, seq) (a leading 1
    broadcasts). TypeError / ValueError naming ``owner`` and the argument (``names``: the
    forward's keyword names). Returns (weights, coords), an integer tensor cast to ``dtype``
    (the state's; ``check_grid_tensor``)."""
    weights = check_grid_tensor(weights, f"{owner}: {names[0]}", weights=True, dtype=dtype)
    coords = check_grid_tensor(coords, f"{owner}: {names[1]}", weights=False, dtype=dtype)
    TokenGrid(weights, coords).check(seq, batch, owner, names)
    return weights, coords


def with_token_grid(context: Context, weights: torch.Tensor | None,
                    coords: torch.Tensor | None, *, batch: int, seq: int, owner: str,
                    names: tuple[str, str] = ("token_weights", "token_coords"),
                    dtype: torch.dtype | None = None) -> Context:
    """``context`` with the token grid (w_j, x_j) of its field, checked (``check_token_grid``;
    an integer tensor cast to ``dtype``, the state's); None and None leave it as it is (the
    uniform index grid: the network)."""
    if weights is None and coords is None:
        return context
    context.token_weights, context.token_coords = check_token_grid(
        weights, coords, batch=batch, seq=seq, owner=owner, names=names, dtype=dtype)
    return context


def on_token_grid(weights: torch.Tensor | None, coords: torch.Tensor | None) -> bool:
    """Whether a forward was given a token grid (then causal supports stay ``is_causal``)."""
    return weights is not None or coords is not None


def causal_support(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """{x' <= x}: the support of a Volterra kernel, as a boolean (q_len, k_len) mask."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()


def build_context(
    mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    is_causal: bool | None,
    *,
    batch: int,
    seq: int,
    num_heads: int,
    dtype: torch.dtype,
    device: torch.device,
    mask_name: str = "mask",
    kpm_name: str = "src_key_padding_mask",
    token_weights: torch.Tensor | None = None,
    token_coords: torch.Tensor | None = None,
    owner: str = "Encoder",
) -> Context:
    """Check the masks and merge them into the kernel's support, once per forward, and put the
    token grid (``token_weights``, ``token_coords``; checked, ``with_token_grid``) into the
    context.

    ``is_causal`` with no other mask is left to the kernel (sdpa's causal path); with a mask,
    the causal support is folded into it here, so no layer rebuilds it, except on a token grid,
    where it stays ``is_causal`` for the kernel to read on the coordinates.
    """
    if is_causal is not None and not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool or None, got {is_causal!r}")
    support = attention_support(mask, key_padding_mask, batch=batch, num_heads=num_heads,
                                q_len=seq, k_len=seq, dtype=dtype, device=device,
                                mask_name=mask_name, kpm_name=kpm_name)
    if on_token_grid(token_weights, token_coords):
        return with_token_grid(Context(attn_mask=support, is_causal=bool(is_causal)),
                               token_weights, token_coords, batch=batch, seq=seq, owner=owner,
                               dtype=dtype)
    if is_causal and support is not None:
        return Context(attn_mask=merge_supports(causal_support(seq, seq, device), support, dtype))
    return Context(attn_mask=support, is_causal=bool(is_causal))


def padding_support(attention_mask, batch: int, seq: int, device: torch.device
                    ) -> tuple[torch.Tensor | None, bool]:
    """A transformers-style attention_mask (B, N), 1 = keep, 0 = pad, as a kernel support.

    Returns (support, prepared): (None, False) when nothing is padded, ((B, 1, 1, N) bool,
    False) for a padding mask, and (the mask as given, True) for a prepared 4-D mask (bool or
    float; an integer 0 / 1 one is read as bool, 1 = in the support, other values refused). Any
    other shape is refused, naming the expected one: a mask with B * N entries in another
    shape (transposed, flattened) is not reshaped (transformers' BertModel fails on it).
    """
    if attention_mask is None:
        return None, False
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor, got "
                        f"{type(attention_mask).__name__}")
    if attention_mask.dim() == 4:
        if attention_mask.dtype == torch.bool or attention_mask.is_floating_point():
            return attention_mask.to(device), True
        # an integer 4-D mask: 1 = keep, 0 = off the support (the 2-D mask's convention)
        if attention_mask.is_complex() or not bool(
                ((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError(f"attention_mask: a 4-D mask must be bool (True = in the support), "
                             f"float (added to the scores) or integer 0 / 1 (1 = in the "
                             f"support), got {attention_mask.dtype} with other values")
        return attention_mask.to(device=device, dtype=torch.bool), True
    if tuple(attention_mask.shape) != (batch, seq):
        raise ValueError(f"attention_mask must have shape (batch, seq) = ({batch}, {seq}) or "
                         f"be a prepared 4-D mask, got {tuple(attention_mask.shape)}")
    keep = attention_mask.to(device=device, dtype=torch.bool)
    if bool(keep.all()):  # one sync per forward; lets the kernel take its unmasked path
        return None, False
    return keep[:, None, None, :], False


def packed_support(position_ids, batch: int, seq: int, device: torch.device
                   ) -> torch.Tensor | None:
    """Several sequences packed on one token grid, read from ``position_ids`` (B, N), (1, N)
    or (N,) integer ids, as the embedding has checked them (``TokenEmbedding``), the way
    transformers 5 reads them when no attention mask is given: a new sequence starts wherever
    the position does not step by +1, and the kernel's support is each token's own sequence,
    m(x, x') = [s(x) = s(x')] (block-diagonal). Returns that support, (B, 1, N, N) bool, or
    None when every row is one sequence (nothing to mask)."""
    if position_ids is None:
        return None
    p = position_ids.to(device).reshape(-1, seq)
    step = torch.diff(p, prepend=p[:, :1] - 1, dim=-1)
    segment = (step != 1).cumsum(-1).expand(batch, seq)
    if not bool(segment[:, -1].any()):  # one sync; every row one sequence
        return None
    return (segment[:, :, None] == segment[:, None, :])[:, None]


def finfo_additive(support: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean support as transformers' eager masks: 0 on it, finfo(dtype).min off it."""
    return torch.where(support, torch.zeros((), device=support.device, dtype=dtype),
                       torch.finfo(dtype).min)


def merge_supports(a: torch.Tensor | None, b: torch.Tensor | None,
                   dtype: torch.dtype) -> torch.Tensor | None:
    """The intersection of two supports (bool & bool, else the sum of additive forms)."""
    if a is None or b is None:
        return b if a is None else a
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return a & b
    return _additive(a, dtype) + _additive(b, dtype)


def _additive(m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if m.dtype != torch.bool:
        return m
    out = torch.zeros(m.shape, dtype=dtype, device=m.device)
    return out.masked_fill_(~m, float("-inf"))
