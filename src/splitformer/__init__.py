"""splitformer: Transformers as operator-splitting discretisations of an integro-differential
equation in token index x, feature index y and depth t (Tai, Liu, Li, Chan 2026)."""

from .compression.store import load
from .interop import from_hf, from_timm, from_torch, to_hf, to_timm, to_torch
from .models import (
    CausalDecoderModel,
    CausalLM,
    CrossDecoder,
    Encoder,
    EncoderDecoderModel,
    ViT,
    network_encoder,
    paper_encoder,
)
from .operators import Context
from .time import Controls, Evolution, Scheme, Stage, TimeGrid, Trajectory
from .training.checkpoints import save_model as save

__version__ = "0.1.0"

__all__ = [
    "CausalDecoderModel",
    "CausalLM",
    "CrossDecoder",
    "EncoderDecoderModel",
    "ViT",
    "Context",
    "Controls",
    "Encoder",
    "Evolution",
    "Scheme",
    "Stage",
    "TimeGrid",
    "Trajectory",
    "from_hf",
    "from_timm",
    "from_torch",
    "load",
    "network_encoder",
    "paper_encoder",
    "save",
    "to_hf",
    "to_timm",
    "to_torch",
]
