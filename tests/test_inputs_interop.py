"""Bad input to the interop maps is refused with a message naming what was expected; to_hf
refuses a per-layer value that the rebuilt model's config cannot represent (every HF family)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitformer

D = torch.float64


# -- 11. to_hf: one policy (check) for every HF family -----------------------------------------
def _bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=31, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=24,
                                  max_position_embeddings=12)
    return splitformer.from_hf(transformers.BertModel(cfg).to(D).eval())


def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=31, n_embd=16, n_layer=2, n_head=2, n_positions=12)
    return splitformer.from_hf(transformers.GPT2Model(cfg).to(D).eval())


def _vit():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=24, image_size=8, patch_size=4)
    return splitformer.from_hf(transformers.ViTModel(cfg).to(D).eval())


FAMILIES = {  # builder, eps option, a dropout row (our path in theta^n, option)
    "bert": (_bert, "layer_norm_eps", ("ffn", "hidden_dropout_prob")),
    "gpt2": (_gpt2, "layer_norm_epsilon", ("ffn", "resid_pdrop")),
    "vit": (_vit, "layer_norm_eps", ("attention", "hidden_dropout_prob")),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_to_hf_refuses_a_per_layer_eps_the_config_cannot_hold(family):
    build, option, _ = FAMILIES[family]
    model = build()
    splitformer.to_hf(model)  # the network as converted goes back
    norm = model.evolution.controls[1]["norm1"]
    norm.eps = 1e-3
    with pytest.raises(ValueError, match=rf"layer 1: .*sets.1.norm1.eps=0.001 differs from "
                                         rf"config option {option}"):
        splitformer.to_hf(model)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_to_hf_refuses_a_per_layer_dropout_the_config_cannot_hold(family):
    build, _, (op, option) = FAMILIES[family]
    model = build()
    model.evolution.controls[0][op].out_dropout.p = 0.375
    with pytest.raises(ValueError, match=rf"layer 0: .*out_dropout.p=0.375 differs from config "
                                         rf"option {option}"):
        splitformer.to_hf(model)


def test_to_hf_returns_a_model_its_config_describes():
    """What the check guarantees: the returned model equals its own config's model."""
    transformers = pytest.importorskip("transformers")
    model = _bert()
    hf = splitformer.to_hf(model)
    again = transformers.BertModel(hf.config)
    for (name, a), (_, b) in zip(hf.named_modules(), again.named_modules(), strict=True):
        for attr in ("eps", "p"):
            assert getattr(a, attr, None) == getattr(b, attr, None), (name, attr)


# -- 12. from_torch / to_torch / to_hf input checks ---------------------------------------------
def _layer(**kw):
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, **kw)


@pytest.mark.parametrize("method", ["forward", "_sa_block", "_ff_block"])
def test_from_torch_refuses_instance_patched_methods(method):
    layer = _layer()
    setattr(layer, method, lambda *a, **k: None)
    with pytest.raises(ValueError, match=rf"{method} is replaced on the instance"):
        splitformer.from_torch(layer)
    enc = nn.TransformerEncoder(_layer(), 2, enable_nested_tensor=False)
    setattr(enc.layers[1], method, lambda *a, **k: None)
    with pytest.raises(ValueError, match=rf"layers.1 .*{method} is replaced on the instance"):
        splitformer.from_torch(enc)


def test_from_torch_refuses_patched_submodules_and_decoders():
    layer = _layer()
    layer.linear1.forward = lambda x: x
    with pytest.raises(ValueError, match="linear1 .*forward is replaced"):
        splitformer.from_torch(layer)
    dec = nn.TransformerDecoderLayer(8, 2, 16, batch_first=True)
    dec._mha_block = lambda *a, **k: None
    with pytest.raises(ValueError, match="_mha_block is replaced on the instance"):
        splitformer.from_torch(dec)


def test_from_torch_refuses_mixed_parameter_dtypes():
    layer = _layer()
    layer.linear2.double()
    with pytest.raises(ValueError, match=r"mixed parameter dtypes: linear2.weight has dtype "
                                         r"torch.float64 while the rest has torch.float32"):
        splitformer.from_torch(layer)
    pair = nn.Transformer(8, 2, 1, 1, 16, batch_first=True)
    pair.decoder.layers[0].norm3.double()
    with pytest.raises(ValueError, match="decoder.layers.0.norm3.weight has dtype"):
        splitformer.from_torch(pair)


ALL_TORCH = (r"nn.Transformer, nn.TransformerDecoder, nn.TransformerDecoderLayer, "
             r"nn.TransformerEncoder or nn.TransformerEncoderLayer")


@pytest.mark.parametrize("bad", [None, nn.Linear(2, 2), "encoder"])
def test_from_torch_lists_every_accepted_type(bad):
    with pytest.raises(TypeError, match=rf"from_torch\(module\) expects {ALL_TORCH}, got"):
        splitformer.from_torch(bad)


@pytest.mark.parametrize("bad", [None, nn.Linear(2, 2)])
def test_to_torch_lists_every_accepted_type(bad):
    with pytest.raises(TypeError, match=r"to_torch\(model\) expects a splitformer Encoder, "
                                        r"CrossDecoder or EncoderDecoderModel"):
        splitformer.to_torch(bad)


@pytest.mark.parametrize("bad", [None, nn.Linear(2, 2), "bert"])
def test_to_hf_of_something_else_is_a_type_error(bad):
    with pytest.raises(TypeError, match=r"to_hf\(model\) expects a splitformer model made by "
                                        rf"from_hf .*got {type(bad).__name__}"):
        splitformer.to_hf(bad)
    with pytest.raises(ValueError, match="needs a model made by from_hf"):
        splitformer.to_hf(splitformer.network_encoder(8, 2, 16, 1))


@pytest.mark.parametrize("name", ["dropout", "dropout1", "dropout2"])
def test_a_dropout_that_is_not_nn_dropout_is_named(name):
    layer = _layer()
    setattr(layer, name, nn.Identity())
    with pytest.raises(ValueError, match=rf"^{name} must be nn.Dropout .*got Identity"):
        splitformer.from_torch(layer)
    enc = nn.TransformerEncoder(_layer(), 2, enable_nested_tensor=False)
    setattr(enc.layers[1], name, nn.Identity())
    with pytest.raises(ValueError, match=rf"^layers.1.{name} must be nn.Dropout .*got Identity"):
        splitformer.from_torch(enc)


def test_a_decoder_dropout_that_is_not_nn_dropout_is_named():
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), 2)
    dec.layers[0].dropout3 = nn.Identity()
    with pytest.raises(ValueError, match=r"^layers.0.dropout3 must be nn.Dropout .*Identity"):
        splitformer.from_torch(dec)


def test_a_missing_rate_in_a_table_names_the_module():
    """The weight table's own message, for a map without a structural check first."""
    from splitformer.interop.weights import Row, copy_table

    theirs = nn.Module()
    theirs.drop = nn.Identity()
    ours = nn.Module()
    ours.drop = nn.Dropout(0.1)
    with pytest.raises(ValueError, match=r"^drop must be nn.Dropout .*got Identity"):
        copy_table([Row("drop.p", "drop.p", attr=True)], theirs=theirs, ours=ours, into="ours")


def test_plain_modules_still_convert():
    enc = nn.TransformerEncoder(_layer(), 2, enable_nested_tensor=False).double()
    model = splitformer.from_torch(enc)
    x = torch.randn(2, 3, 8, dtype=D)
    assert (model(x) - enc(x)).abs().max() < 1e-10
    back = splitformer.to_torch(model)
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in enc.state_dict().items())
