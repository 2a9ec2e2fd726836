"""Models: initial condition + evolution + read-out."""

from .encoder import Encoder, EvolutionModel, network_encoder, paper_encoder
from .vit import ViT, ViTOutput, build_vit

__all__ = [
    "Encoder",
    "EvolutionModel",
    "ViT",
    "ViTOutput",
    "build_vit",
    "network_encoder",
    "paper_encoder",
]
