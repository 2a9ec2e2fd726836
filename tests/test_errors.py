"""Bad input: a clear error naming the argument, raised before any work is done."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitformer
from splitformer.operators import FeedForward, NonlocalAttention


@pytest.fixture
def model():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return splitformer.from_torch(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))


def test_src_shape(model):
    with pytest.raises(ValueError, match=r"src .*shape"):
        model(torch.randn(2, 3, 4, 8))
    with pytest.raises(ValueError, match="d_model=8"):
        model(torch.randn(2, 3, 7))
    with pytest.raises(TypeError, match="src must be a torch.Tensor"):
        model([[0.0] * 8])


def test_src_dtype(model):
    with pytest.raises(TypeError, match=r"src has dtype torch.float64 .* torch.float32"):
        model(torch.randn(2, 3, 8, dtype=torch.float64))


def test_src_device(model, monkeypatch):
    x = torch.randn(2, 3, 8, device="meta")
    with pytest.raises(ValueError, match="src is on meta"):
        model(x)


def test_mask_shape_and_dtype(model):
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match=r"mask must have shape \(3, 3\)"):
        model(x, mask=torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor or a float tensor"):
        model(x, mask=torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="mask must be a bool tensor or a float tensor"):
        model(x, mask=torch.zeros(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"src_key_padding_mask must have shape"):
        model(x, src_key_padding_mask=torch.zeros(3, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="src_key_padding_mask must be a bool tensor"):
        model(x, src_key_padding_mask=torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="not both"):
        model(x, mask=torch.zeros(3, 3), src_mask=torch.zeros(3, 3))


def test_head_count():
    with pytest.raises(ValueError, match="num_heads=3 must divide dim=8"):
        NonlocalAttention(8, 3)
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        NonlocalAttention(8, 0)
    with pytest.raises(ValueError, match="widths"):
        FeedForward([8])


def test_unsupported_module_options():
    with pytest.raises(TypeError, match="nn.TransformerEncoder or nn.TransformerEncoderLayer"):
        splitformer.from_torch(nn.Linear(3, 3))
    layer = nn.TransformerEncoderLayer(8, 2, 16, activation=nn.SiLU())
    with pytest.raises(ValueError, match="activation=SiLU"):
        splitformer.from_torch(layer)
    layer = nn.TransformerEncoderLayer(8, 2, 16, activation=lambda x: x * 2)
    with pytest.raises(ValueError, match="activation="):
        splitformer.from_torch(layer)
    with pytest.raises(ValueError, match="form must be"):
        splitformer.from_torch(nn.TransformerEncoderLayer(8, 2, 16), form="other")
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2, norm=nn.Identity())
    with pytest.raises(ValueError, match="norm="):
        splitformer.from_torch(enc)


def test_to_torch_refuses_what_torch_cannot_express(model):
    with pytest.raises(ValueError, match="not one explicit Euler substep"):
        splitformer.to_torch(model.with_scheme("strang").refine(2))
    with pytest.raises(TypeError, match="Encoder"):
        splitformer.to_torch(nn.Linear(2, 2))


def test_nothing_is_computed_before_the_error(model):
    """Validation happens before the evolution runs: no operator is called."""
    calls = []
    h = model.evolution.controls[0]["attention"].register_forward_hook(
        lambda *a: calls.append(1))
    with pytest.raises(ValueError):
        model(torch.randn(2, 3, 8), src_key_padding_mask=torch.zeros(5, 5, dtype=torch.bool))
    h.remove()
    assert calls == []


def test_layer_options_name_the_argument():
    layer = nn.TransformerEncoderLayer(8, 2, 16)
    layer.norm2 = nn.Identity()
    with pytest.raises(ValueError, match="norm2=Identity"):
        splitformer.from_torch(layer)
    layer = nn.TransformerEncoderLayer(8, 2, 16)
    layer.linear1 = nn.Linear(8, 16, bias=False)
    with pytest.raises(ValueError, match=r"missing: \['linear1.bias'\]"):
        splitformer.from_torch(layer)
    layer = nn.TransformerEncoderLayer(8, 2, 16, layer_norm_eps=0.0)
    with torch.no_grad():
        layer.norm1.weight.fill_(-1.0)
    with pytest.raises(ValueError, match="s2"):
        splitformer.from_torch(layer, form="paper")


def test_scheme_values_are_checked():
    from splitformer.time import Stage, resolve

    with pytest.raises(ValueError, match="fraction must be a number > 0"):
        Stage("attention", fraction=-1)
    with pytest.raises(ValueError, match="fraction must be a number > 0"):
        Stage("attention", fraction="a")
    with pytest.raises(ValueError, match="fraction must be a number > 0"):
        resolve("attention*-1 norm1:project")
    with pytest.raises(ValueError, match="weight must be in"):
        Stage("U", "relax", weight=2.0)
    assert str(resolve("ffn|relu")) == "ffn|relu"


def test_is_causal_must_be_a_bool(model):
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        model(torch.randn(2, 3, 8), is_causal="yes")
