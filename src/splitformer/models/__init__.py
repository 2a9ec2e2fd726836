"""Models: initial condition + evolution + read-out."""

from .decoder import (
    CausalDecoderModel,
    CausalLM,
    CrossDecoder,
    EncoderDecoderModel,
    causal_decoder,
    encoder_decoder,
)
from .encoder import Encoder, EvolutionModel, network_encoder, paper_encoder
from .vit import ViT, ViTOutput, build_vit

__all__ = [
    "CausalDecoderModel",
    "CausalLM",
    "CrossDecoder",
    "EncoderDecoderModel",
    "causal_decoder",
    "encoder_decoder",
    "Encoder",
    "EvolutionModel",
    "ViT",
    "ViTOutput",
    "build_vit",
    "network_encoder",
    "paper_encoder",
]
