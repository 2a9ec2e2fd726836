"""torch.nn <-> splitformer: the front. ``from_torch`` / ``to_torch`` dispatch by class to the
weight maps (each a pure map: no torch.nn module is wrapped or called):

    nn.TransformerEncoder(Layer)  <-> Encoder               interop.torch_encoder
    nn.TransformerDecoder(Layer)  <-> CrossDecoder          interop.torch_decoder
    nn.Transformer                <-> EncoderDecoderModel   interop.torch_transformer (the pair)

The encoder and decoder maps share ``interop.torch_layers`` (``TorchConfig``, the common rows,
the checks) and never import each other; the pair composes them. A model's ``source`` (a
``TorchConfig`` or ``TorchTransformerConfig``) says which torch.nn class ``to_torch`` restores.
The encoder map's names, importable from here before the front existed, still are.
"""

from __future__ import annotations

from torch import nn

from ..models.base import EvolutionModel
from ..models.encoder import Encoder
from ..models.seq2seq import CrossDecoder, EncoderDecoderModel
from .torch_decoder import from_torch_decoder, to_torch_decoder
from .torch_encoder import (
    ENCODER_LAYER_MAP,
    FORMS,
    PAPER_LAYER_MAP,
    build_encoder,
    build_torch,
    from_torch_encoder,
    to_torch_encoder,
    torch_config,
    torch_target,
    weight_map,
)
from .torch_layers import (  # noqa: F401 - the rest were defined here before the front: kept
    ATTENTION_ROWS,
    NORM_ROWS,
    TorchConfig,
    activation_name,
    build_torch_stack,
    check_attention,
    check_dropouts,
    check_final_norm,
    check_norms,
    check_plain,
    check_two_stages,
    check_uniform,
    final_norm,
    layer_fields,
    num_ffn_stages,
    shared_fields,
    torch_activation,
)
from .torch_transformer import from_torch_transformer, to_torch_transformer

__all__ = ["ACCEPTED", "ENCODER_LAYER_MAP", "PAPER_LAYER_MAP", "TorchConfig", "build_encoder",
           "build_torch", "build_torch_stack", "check_dropouts", "check_plain", "check_uniform",
           "from_torch", "to_torch", "torch_config", "torch_target", "weight_map"]

# every torch.nn class from_torch converts (to_torch returns the same classes)
ACCEPTED = (nn.Transformer, nn.TransformerDecoder, nn.TransformerDecoderLayer,
            nn.TransformerEncoder, nn.TransformerEncoderLayer)
_ACCEPTED_NAMES = ", ".join(f"nn.{c.__name__}" for c in ACCEPTED[:-1]) + \
    f" or nn.{ACCEPTED[-1].__name__}"


def from_torch(module: nn.Module, *, form: str = "network"
               ) -> Encoder | CrossDecoder | EncoderDecoderModel:
    """The splitformer model of a torch.nn Transformer module (same forward arguments, same
    output): nn.TransformerEncoder(Layer) -> Encoder, nn.TransformerDecoder(Layer) ->
    CrossDecoder, nn.Transformer -> EncoderDecoderModel.

    form="network": post-LN -> the Lie scheme with the FFN as a vector field; pre-LN -> the
    pre-norm scheme. form="paper" (encoders only): the paper's literal scheme (post-LN, ReLU,
    scalar LayerNorm gains and biases, eps = 0; weights become the W_j of the (I + W_j) form).
    """
    if form not in FORMS:
        raise ValueError(f"form must be 'network' or 'paper', got {form!r}")
    if not isinstance(module, ACCEPTED):
        raise TypeError(f"from_torch(module) expects {_ACCEPTED_NAMES}, got "
                        f"{type(module).__name__}")
    if isinstance(module, (nn.TransformerEncoder, nn.TransformerEncoderLayer)):
        return from_torch_encoder(module, form=form)
    if form != "network":
        raise ValueError(f"form={form!r} is for encoders: {type(module).__name__} has only "
                         "the network form")
    if isinstance(module, nn.Transformer):
        return from_torch_transformer(module)
    return from_torch_decoder(module)


def to_torch(model: Encoder | CrossDecoder | EncoderDecoderModel) -> nn.Module:
    """The torch.nn module with the same weights (the inverse of ``from_torch``): Encoder ->
    nn.TransformerEncoder (or Layer, as its source records), CrossDecoder ->
    nn.TransformerDecoder (or Layer), EncoderDecoderModel -> nn.Transformer."""
    if isinstance(model, EvolutionModel):
        model.refuse_merging_export("to_torch(model)")
        model = model.as_network()  # a coarsened or smooth-in-t model: its steps as layers
    if isinstance(model, EncoderDecoderModel):
        return to_torch_transformer(model)
    if isinstance(model, CrossDecoder):
        return to_torch_decoder(model)
    if isinstance(model, Encoder):
        return to_torch_encoder(model)
    raise TypeError(f"to_torch(model) expects a splitformer Encoder, CrossDecoder or "
                    f"EncoderDecoderModel (as from_torch makes them from {_ACCEPTED_NAMES}), "
                    f"got {type(model).__name__}")
