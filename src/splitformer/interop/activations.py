"""Foreign activation names -> splitformer ``Activation`` names, one table per source.

Only maps between the same function computed the same way (to round-off) are listed; a name
that is not here is refused by the family's ``from_*``, naming the option.
"""

from __future__ import annotations

__all__ = ["BERT_ACTIVATIONS", "GPT2_ACTIVATIONS", "VIT_ACTIVATIONS"]

# transformers' BertConfig.hidden_act: "gelu" is the exact erf form, gelu_pytorch_tanh is
# F.gelu(approximate="tanh")
BERT_ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",
    "relu": "relu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
}

# transformers' GPT2Config.activation_function: gelu_new / gelu_pytorch_tanh / gelu_python_tanh
# are all 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), "gelu" and "gelu_python" the exact
# erf form
GPT2_ACTIVATIONS: dict[str, str] = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
    "leaky_relu": "leaky_relu",
    "linear": "identity",
}

# transformers' ViTConfig.hidden_act / pooler_act
VIT_ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",  # the same tanh formula written out; equal up to rounding
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
    "linear": "identity",
}
