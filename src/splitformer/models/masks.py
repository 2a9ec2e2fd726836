"""Attention masks in the semantics of torch.nn.TransformerEncoder, turned into a kernel support.

torch.nn's conventions: a boolean ``mask`` / ``src_key_padding_mask`` is True where attention is
NOT allowed; a float one is added to the scores. ``mask`` is (N, N) or (B * H, N, N);
``src_key_padding_mask`` is (B, N). The kernel support handed to the attention operator uses the
convention of ``scaled_dot_product_attention`` (boolean True = allowed; float = additive).
"""

from __future__ import annotations

import torch

from ..operators.base import Context

__all__ = ["build_context", "check_src"]


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


def _check_mask_dtype(m: torch.Tensor, name: str, dtype: torch.dtype) -> None:
    if m.dtype != torch.bool and m.dtype != dtype:
        raise TypeError(f"{name} must be a bool tensor or a float tensor of dtype {dtype}, "
                        f"got {m.dtype}")


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
) -> Context:
    """Check the masks (shape, dtype, device) and merge them into the kernel's support."""
    support = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"{mask_name} must be a torch.Tensor, got {type(mask).__name__}")
        _check_mask_dtype(mask, mask_name, dtype)
        if mask.device != device:
            raise ValueError(f"{mask_name} is on {mask.device} but the model is on {device}")
        if mask.dim() == 2 and mask.shape == (seq, seq):
            support = mask
        elif mask.dim() == 3 and mask.shape == (batch * num_heads, seq, seq):
            support = mask.view(batch, num_heads, seq, seq)
        else:
            raise ValueError(
                f"{mask_name} must have shape ({seq}, {seq}) or ({batch * num_heads}, {seq}, "
                f"{seq}) (batch * num_heads, seq, seq), got {tuple(mask.shape)}"
            )
        support = ~support if support.dtype == torch.bool else support
    if key_padding_mask is not None:
        kpm = key_padding_mask
        if not isinstance(kpm, torch.Tensor):
            raise TypeError(f"{kpm_name} must be a torch.Tensor, got {type(kpm).__name__}")
        _check_mask_dtype(kpm, kpm_name, dtype)
        if kpm.device != device:
            raise ValueError(f"{kpm_name} is on {kpm.device} but the model is on {device}")
        if kpm.shape != (batch, seq):
            raise ValueError(
                f"{kpm_name} must have shape (batch, seq) = ({batch}, {seq}), got "
                f"{tuple(kpm.shape)}"
            )
        kpm = (~kpm if kpm.dtype == torch.bool else kpm).view(batch, 1, 1, seq)
        support = kpm if support is None else _merge(support, kpm, dtype)
    if is_causal is not None and not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool or None, got {is_causal!r}")
    causal = bool(is_causal) if is_causal is not None else False
    return Context(attn_mask=support, is_causal=causal)


def _merge(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return a & b
    return _additive(a, dtype) + _additive(b, dtype)


def _additive(m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if m.dtype != torch.bool:
        return m
    out = torch.zeros(m.shape, dtype=dtype, device=m.device)
    return out.masked_fill_(~m, float("-inf"))
