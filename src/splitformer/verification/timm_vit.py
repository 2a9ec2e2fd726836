"""Checks of the timm family: timm's VisionTransformer against the splitformer weight map.

timm needs torchvision at import time; where it cannot be imported (missing, or a torchvision
build that does not load beside this torch) the checks are skipped. The library itself never
imports timm to convert from it.

Each check builds a small random-weight VisionTransformer (seeded; every parameter perturbed),
converts it with ``from_timm`` and returns the max abs difference of ``model(x)`` (and of
``forward_features(x)``).
"""

from __future__ import annotations

import torch

from . import SkipCheck, register
from .references import maxdiff, perturb_


def _vision_transformer():
    try:
        import timm  # noqa: F401
        from timm.models.vision_transformer import VisionTransformer
    except Exception as e:  # missing, or broken beside this torch (torchvision)
        raise SkipCheck(f"timm cannot be imported ({type(e).__name__}: {e})") from e
    return VisionTransformer


def _pair(dtype: torch.dtype, **overrides):
    from ..interop.timm_vit import from_timm_model

    vt = _vision_transformer()
    torch.manual_seed(0)
    kw = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 3, "num_heads": 4,
          "num_classes": 5, **overrides}
    ref = vt(**kw).to(dtype).eval()
    perturb_(ref, seed=2)
    ours = from_timm_model(ref)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=dtype)
    return ref, ours, x


def _both(dtype: torch.dtype, **overrides) -> float:
    ref, ours, x = _pair(dtype, **overrides)
    with torch.no_grad():
        return max(maxdiff(ref(x), ours(x)),
                   maxdiff(ref.forward_features(x), ours.forward_features(x)))


@register("timm", "pre-LN ViT (class token, token pooling) = prenorm scheme",
          "timm VisionTransformer model(x), forward_features(x)")
def check_timm_token(dtype: torch.dtype) -> float:
    return _both(dtype)


@register("timm", "LayerScale = per-feature step tau(y) = tau gamma(y)",
          "timm VisionTransformer init_values, qkv_bias=False")
def check_timm_layerscale(dtype: torch.dtype) -> float:
    return _both(dtype, init_values=0.3, qkv_bias=False)


@register("timm", "register tokens as extra points of Omega_x, avg pooling, fc_norm, pre_norm",
          "timm VisionTransformer reg_tokens=2, no_embed_class, global_pool='avg'")
def check_timm_registers(dtype: torch.dtype) -> float:
    return _both(dtype, reg_tokens=2, no_embed_class=True, global_pool="avg", pre_norm=True)
