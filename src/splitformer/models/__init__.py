"""Models: initial condition + evolution + read-out (``base.EvolutionModel``), one module per
family."""

from .base import EvolutionModel, shared_copy
from .blocks import block_controls
from .causal import CausalDecoderModel, CausalLM, causal_decoder
from .embeddings import TokenEmbedding
from .encoder import Encoder, network_encoder, paper_encoder
from .kernels import set_kernel
from .seq2seq import CrossDecoder, EncoderDecoderModel, encoder_decoder
from .vit import TimmViT, ViT, ViTOutput, build_vit

__all__ = [
    "CausalDecoderModel",
    "CausalLM",
    "CrossDecoder",
    "EncoderDecoderModel",
    "Encoder",
    "EvolutionModel",
    "TimmViT",
    "TokenEmbedding",
    "ViT",
    "ViTOutput",
    "block_controls",
    "build_vit",
    "causal_decoder",
    "encoder_decoder",
    "network_encoder",
    "paper_encoder",
    "set_kernel",
    "shared_copy",
]
