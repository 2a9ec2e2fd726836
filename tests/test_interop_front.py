"""The torch.nn front: from_torch / to_torch dispatch by class to the encoder, decoder and pair
maps; the encoder and decoder maps never import each other; every name importable from
interop.torch_nn / interop.torch_transformer before the front existed still is; the renamed
registries keep their old names as aliases."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import splitformer
from splitformer.interop import torch_decoder, torch_encoder, torch_nn, torch_transformer
from splitformer.models.seq2seq import CrossDecoder, EncoderDecoderModel
from splitformer.verification.references import TOL

D, H, FF = 16, 4, 24
INTEROP = Path(torch_nn.__file__).parent
pytestmark = [pytest.mark.filterwarnings("ignore:.*nested.*:UserWarning")]


def _modules(kind: str) -> nn.Module:
    torch.manual_seed(0)
    kw = {"dropout": 0.0, "batch_first": True, "dtype": torch.float64}
    if kind == "encoder_layer":
        return nn.TransformerEncoderLayer(D, H, FF, **kw)
    if kind == "encoder":
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, **kw), 2,
                                     norm=nn.LayerNorm(D, dtype=torch.float64),
                                     enable_nested_tensor=False)
    if kind == "decoder_layer":
        return nn.TransformerDecoderLayer(D, H, FF, **kw)
    if kind == "decoder":
        return nn.TransformerDecoder(nn.TransformerDecoderLayer(D, H, FF, **kw), 2)
    return nn.Transformer(D, H, 2, 2, FF, **kw)


def _run(module: nn.Module, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randn(2, 5, D, generator=g, dtype=torch.float64)
    tgt = torch.randn(2, 4, D, generator=g, dtype=torch.float64)
    with torch.no_grad():
        if kind.startswith("encoder"):
            return module(src)
        if kind.startswith("decoder"):
            return module(tgt, src)
        return module(src, tgt)


EXPECTED = {"encoder_layer": (splitformer.Encoder, "layer"),
            "encoder": (splitformer.Encoder, "encoder"),
            "decoder_layer": (CrossDecoder, "decoder_layer"),
            "decoder": (CrossDecoder, "decoder"),
            "transformer": (EncoderDecoderModel, "transformer")}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_the_front_dispatches_both_ways(kind):
    """from_torch picks the map by class; to_torch returns the same class with the same state
    dict; the model's source records which one (its kind)."""
    ref = _modules(kind).eval()
    ours = splitformer.from_torch(ref).eval()
    cls, source_kind = EXPECTED[kind]
    assert type(ours) is cls and ours.source.kind == source_kind
    assert (_run(ours, kind) - _run(ref, kind)).abs().max() <= TOL[torch.float64]
    back = splitformer.to_torch(ours)
    assert type(back) is type(ref)
    theirs = ref.state_dict()
    assert back.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in back.state_dict().items())
    # what the state dict does not hold (norm_first, activation, batch_first, eps) came back
    # too: the rebuilt torch module computes what the original does
    assert torch.equal(_run(back.eval(), kind), _run(ref, kind))


def test_the_old_entry_points_still_dispatch():
    """interop.torch_nn.from_torch / to_torch are the front (as before, they take decoders and
    nn.Transformer too); torch_transformer's entry points still take a decoder alone."""
    assert torch_nn.from_torch is splitformer.from_torch
    assert torch_nn.to_torch is splitformer.to_torch
    pair = _modules("transformer").eval()
    assert isinstance(torch_nn.from_torch(pair), EncoderDecoderModel)
    dec = _modules("decoder").eval()
    ours = torch_transformer.from_torch_transformer(dec)
    assert isinstance(ours, CrossDecoder)
    assert isinstance(torch_transformer.to_torch_transformer(ours), nn.TransformerDecoder)
    assert {r.theirs for r in torch_transformer.weight_map(ours)} >= {
        "layers.0.multihead_attn.in_proj_weight", "layers.1.norm3.eps"}


def _imports(path: Path) -> set[str]:
    """The interop modules ``path`` imports (relative imports at any depth of its code)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module)
            else:
                out.update(a.name for a in node.names)
    return out


def test_the_encoder_and_decoder_maps_do_not_import_each_other():
    enc, dec = _imports(INTEROP / "torch_encoder.py"), _imports(INTEROP / "torch_decoder.py")
    assert "torch_layers" in enc and "torch_layers" in dec
    assert not enc & {"torch_decoder", "torch_transformer", "torch_nn"}, enc
    assert not dec & {"torch_encoder", "torch_transformer", "torch_nn"}, dec
    # the pair composes the two maps and never reaches the front
    pair = _imports(INTEROP / "torch_transformer.py")
    assert {"torch_encoder", "torch_decoder"} <= pair and "torch_nn" not in pair
    assert "torch_nn" not in _imports(INTEROP / "torch_layers.py")


def test_no_import_circle_in_interop():
    graph = {p.stem: _imports(p) for p in INTEROP.glob("*.py") if p.stem != "__init__"}
    circles = {tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())}
    assert not circles, circles


# every name the two modules listed in __all__ before the front existed
OLD_TORCH_NN = ["ACCEPTED", "ENCODER_LAYER_MAP", "PAPER_LAYER_MAP", "TorchConfig",
                "build_encoder", "build_torch", "build_torch_stack", "check_dropouts",
                "check_plain", "check_uniform", "from_torch", "to_torch", "torch_config",
                "torch_target", "weight_map"]
OLD_TORCH_TRANSFORMER = ["DECODER_LAYER_MAP", "ENCODER_LAYER_MAP", "TorchTransformerConfig",
                         "build_decoder", "decoder_config", "from_torch_transformer",
                         "to_torch_transformer", "transformer_config", "weight_map"]


def test_old_names_stay_importable():
    for name in OLD_TORCH_NN:
        assert name in torch_nn.__all__ and name in vars(torch_nn), name
    for name in OLD_TORCH_TRANSFORMER:
        assert name in torch_transformer.__all__ and name in vars(torch_transformer), name
    assert torch_nn.weight_map is torch_encoder.weight_map
    assert torch_transformer.decoder_config is torch_decoder.decoder_config
    config = torch_nn.torch_config(_modules("encoder"))
    assert isinstance(config, torch_nn.TorchConfig) and config.kind == "encoder"
    assert len(torch_nn.weight_map(config)) == 2 * len(torch_nn.ENCODER_LAYER_MAP) + 3


def test_registry_aliases():
    from splitformer import verification
    from splitformer.interop import hf

    assert hf.FAMILIES is hf.HF_CLASSES and hf.HF_CLASSES["BertModel"] == "hf_bert"
    assert verification.FAMILY_MODULES is verification.GROUPS
    assert verification.families() == verification.group_names() == [
        "core", "bert", "vit", "cvt", "timm", "gpt2", "llama", "mistral", "qwen2", "qwen3",
        "gemma2", "gemma3", "transformer"]
    with pytest.raises(ValueError, match=r"group must be one of \['core'.*got 'nope'"):
        verification.register("nope", "a claim", "a reference")
    with pytest.raises(ValueError, match=r"group must be one of .*got 'nope'"):
        list(verification.run_checks(["nope"]))


def test_check_rows_carry_the_group_and_the_old_key():
    from splitformer.verification import _REGISTRY, run_checks

    rows = list(run_checks(["core"]))
    assert rows and all(r["group"] == r["family"] == "core" for r in rows)
    assert all(r["status"] == "PASS" for r in rows)
    core = [c for c in _REGISTRY if c.group == "core"]
    assert core and all(c.family == "core" for c in core)
