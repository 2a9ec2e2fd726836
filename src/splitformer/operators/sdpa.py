"""The fused path of the attention kernels: torch's ``scaled_dot_product_attention`` with one
choice of the substrate made here (``sdpa``), so that every kernel of ``operators.kernels``
gets it and no caller chooses (docs/performance.md, "Half precision on the CPU")."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["sdpa"]

_HALF = (torch.bfloat16, torch.float16)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention(q, k, v, **options)``, the fused
    path of every kernel here, with one choice of the substrate: on the CPU a bfloat16 or
    float16 call that will be differentiated (grad enabled, an input or the mask requiring
    it) runs in float32 and is cast back. torch's CPU backward of the half-precision call is
    1.2-4x slower than the float32 one at a transformer's shapes, most at short sequences, and
    forward + backward through float32 is the faster at every shape measured
    (``python benchmarks/sdpa_cpu.py``; docs/performance.md): a bfloat16 healing step of
    all-MiniLM-L6-v2 takes 0.173 s with it against 0.227 s without (docs/depth.md). The
    float32 call is the same integral in more precision, returned in the dtype torch's call
    would return: the inputs' half dtype, or under CPU autocast autocast's (it casts float32
    and half inputs of sdpa to its dtype and leaves float64 alone); a floating additive mask
    is cast with them. Inference, other devices, float32 / float64 arithmetic and inputs of
    mixed dtypes torch would refuse go straight to torch."""
    mask = options.get("attn_mask")
    floating = [t for t in (q, k, v, mask) if t is not None and t.is_floating_point()]
    if q.device.type != "cpu" or not torch.is_grad_enabled() or not any(
            t.requires_grad for t in floating) or len(floating) < 3:
        return F.scaled_dot_product_attention(q, k, v, **options)
    dtypes = {t.dtype for t in floating}
    if torch.is_autocast_enabled("cpu") and dtypes <= {torch.float32, *_HALF}:
        dtype = torch.get_autocast_dtype("cpu")  # what autocast casts every input to
    else:
        dtype = q.dtype if len(dtypes) == 1 else None
    if dtype not in _HALF:
        return F.scaled_dot_product_attention(q, k, v, **options)
    if mask is not None and mask.is_floating_point():
        options["attn_mask"] = mask.float()
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **options)
    return out.to(dtype)
