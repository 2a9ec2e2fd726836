"""Models: initial condition + evolution + read-out."""

from .encoder import Encoder, EvolutionModel, network_encoder, paper_encoder

__all__ = ["Encoder", "EvolutionModel", "network_encoder", "paper_encoder"]
