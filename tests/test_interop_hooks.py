"""Hooks on a Hugging Face or timm model would be dropped by a weight map (splitformer never
calls the source module): from_hf and from_timm refuse them, naming the hook and the module."""

from __future__ import annotations

import pytest
import torch

import splitformer

transformers = pytest.importorskip("transformers")  # conftest hides the torchvision stand-in


def _bert():
    config = transformers.BertConfig(vocab_size=31, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=24,
                                     max_position_embeddings=12)
    return transformers.BertModel(config).eval()


@pytest.mark.parametrize("kind", ["forward", "forward_pre"])
def test_from_hf_refuses_hooks(kind):
    m = _bert()
    splitformer.from_hf(m)  # converts without hooks
    layer = m.encoder.layer[1].output
    if kind == "forward":
        handle = layer.register_forward_hook(lambda mod, i, o: o * 2)
    else:
        handle = layer.register_forward_pre_hook(lambda mod, i: None)
    label = {"forward": "forward hooks", "forward_pre": "forward pre-hooks"}[kind]
    with pytest.raises(ValueError, match=f"from_hf cannot carry the {label} registered on "
                       r"encoder\.layer\.1\.output"):
        splitformer.from_hf(m)
    handle.remove()
    splitformer.from_hf(m)


def test_from_timm_refuses_hooks():
    timm = pytest.importorskip("timm")
    m = timm.models.vision_transformer.VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3).eval()
    splitformer.from_timm(m)
    m.blocks[0].attn.register_forward_hook(lambda mod, i, o: o + 1)
    with pytest.raises(ValueError, match="from_timm cannot carry the forward hook.*blocks.0.attn"):
        splitformer.from_timm(m)
    x = torch.randn(1, 3, 8, 8)
    assert m(x).shape == (1, 3)  # the timm model itself is untouched


def test_global_hooks_are_refused():
    from torch import nn
    from torch.nn.modules.module import register_module_forward_hook

    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    handle = register_module_forward_hook(lambda mod, i, o: o)
    try:
        with pytest.raises(ValueError, match="from_torch cannot carry global forward hooks"):
            splitformer.from_torch(layer)
    finally:
        handle.remove()
    splitformer.from_torch(layer)


@pytest.mark.parametrize("source", ["hf_vit", "timm"])
def test_weights_the_map_does_not_know_are_refused(source):
    """A parameter added to the source model would be dropped: refused, naming it."""
    if source == "hf_vit":
        config = transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=16,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=24)
        m = transformers.ViTModel(config).eval()
        convert, block = splitformer.from_hf, m.layers[0]
    else:
        timm = pytest.importorskip("timm")
        m = timm.models.vision_transformer.VisionTransformer(
            img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3).eval()
        convert, block = splitformer.from_timm, m.blocks[0]
    convert(m)
    block.extra = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match=r"does not know: \[.*extra"):
        convert(m)
