"""timm VisionTransformer <-> splitformer (weight map; timm is never imported here)."""

from __future__ import annotations

from torch import nn

__all__ = ["from_timm", "to_timm"]


def from_timm(model, **kwargs):
    """A splitformer model with the same outputs as a timm VisionTransformer."""
    from .timm_vit import from_timm_model
    from .weights import check_no_hooks

    if isinstance(model, nn.Module):  # anything else: from_timm_model refuses it by type
        check_no_hooks(model, "from_timm")
    return from_timm_model(model, **kwargs)


def to_timm(model):
    """The timm VisionTransformer with the same weights (needs timm installed)."""
    from ..models.base import EvolutionModel
    from .timm_vit import to_timm_model

    if isinstance(model, EvolutionModel):
        model.refuse_merging_export("to_timm(model)")
        model = model.as_network()  # a smooth-in-t model: its steps as layers
    return to_timm_model(model)
