"""model.source is a declared ``models.base.Source`` (``kind``, ``field``) on every model: the
interop configs, the models' own records (dicts, JSON as they stand) and the training families'
records; the maps read it through the protocol and refuse a wrong one in one line naming it."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
from test_registry import FAMILIES
from torch import nn

import splitformer
from splitformer.interop import torch_nn
from splitformer.interop.families import families
from splitformer.interop.hf import HFSource
from splitformer.interop.timm_vit import TimmViTConfig
from splitformer.interop.torch_transformer import TorchTransformerConfig
from splitformer.interop.weights import source_field
from splitformer.models import build_vit
from splitformer.models.base import RecordSource, Source, keep_source
from splitformer.models.bert import bert_model
from splitformer.models.seq2seq import network_decoder
from splitformer.training import TrainConfig
from splitformer.training.families import FAMILIES as TRAINING_FAMILIES
from splitformer.training.families import build_model

pytestmark = [pytest.mark.filterwarnings("ignore:.*nested.*:UserWarning")]

# what each builder of tests/test_registry.py records: from_torch's configs, the models' own
# builders' dicts (kind "decoder" and "transformer"), nothing ("") for the rest
REGISTRY_KINDS = {"encoder_post_ln": "encoder", "encoder_pre_ln": "encoder", "bert": "",
                  "vit": "", "timm_vit": "", "cvt": "", "gpt2": "", "transformer": "transformer"}
# a family that only its record builds (tests/test_registry._record_builder) is from_hf's
REGISTRY_KINDS.update({f.name: "hf" for f in families("transformers")
                       if f.name not in REGISTRY_KINDS})


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_model_has_a_source_with_a_kind(name):
    assert set(REGISTRY_KINDS) == set(FAMILIES)  # a new family: say what it records
    model, _ = FAMILIES[name]()
    assert isinstance(model.source, Source) and model.source.kind == REGISTRY_KINDS[name]
    for copy_ in (model.refine(2), model.with_scheme(model.evolution.scheme), copy.deepcopy(model),
                  pickle.loads(pickle.dumps(model))):
        assert isinstance(copy_.source, Source) and copy_.source.kind == model.source.kind
        assert copy_.source == model.source


def _signature(family: str) -> dict:
    if family == "lm":
        return {"name": "text", "task": "lm", "num_classes": None, "input_shape": None,
                "vocab_size": 7, "vocab": list("abcdefg")}
    shape = {"vit": [1, 8, 8], "cvt": [1, 8, 8], "encoder": [6, 4]}[family]
    return {"name": "toy", "task": "classify", "num_classes": 3, "input_shape": shape,
            "vocab_size": None, "vocab": None}


@pytest.mark.parametrize("family", sorted(TRAINING_FAMILIES))
def test_training_family_models_record_a_training_source(family):
    cfg = TrainConfig(family=family, width=16, heads=2, depth=2, seq_len=8)
    model = build_model(cfg, _signature(family))
    src = model.source
    assert isinstance(src, RecordSource) and src.kind == "training"
    assert src.field("family") == family and src["config"] == cfg.to_dict()
    # the record is the JSON of the checkpoint format: exactly these keys, no "kind" entry
    as_json = json.loads(json.dumps(src))
    assert set(as_json) == {"family", "config", "data"}
    assert keep_source(as_json).kind == "training"  # read back from JSON, the kind holds


def test_a_model_built_without_interop_has_one():
    vit = build_vit(image_size=8, patch_size=4, in_chans=3, dim=16, depth=1, num_heads=2,
                    hidden_dim=24, num_classes=3)
    assert isinstance(vit.source, RecordSource) and vit.source.kind == "" and vit.source == {}
    assert vit.source.field("hf_class") is None and vit.source.field("x", 3) == 3
    enc = splitformer.paper_encoder(8, 2, 16, 1)
    assert enc.source.kind == "encoder" and enc.source.field("form") == "paper"


def test_assignment_goes_through_keep_source():
    model = splitformer.network_encoder(8, 2, 16, 1)
    record = {"kind": "decoder"}
    model.source = record
    assert isinstance(model.source, RecordSource) and model.source.kind == "decoder"
    record["kind"] = "changed"  # a copy is kept
    assert model.source.kind == "decoder"
    model.source = None
    assert model.source == {} and model.source.kind == ""
    with pytest.raises(TypeError, match="source must be a splitformer Source .* got str"):
        model.source = "bert"


def test_a_pickle_from_before_the_declared_attribute_still_reads():
    """A model pickled when ``source`` was a plain instance attribute (a dict in __dict__)
    reads it as a RecordSource."""
    model = splitformer.network_encoder(8, 2, 16, 1)
    model.__dict__["source"] = {"kind": "layer"}  # what an old pickle restores
    assert isinstance(model.source, RecordSource) and model.source.kind == "layer"


def test_typed_configs_are_sources():
    ref = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    config = splitformer.from_torch(ref).source
    assert isinstance(config, torch_nn.TorchConfig) and isinstance(config, Source)
    assert config.kind == "layer" and config.field("d_model") == 8
    assert config.field("no_such_field", "d") == "d"
    pair = splitformer.from_torch(nn.Transformer(8, 2, 1, 1, 16, batch_first=True)).source
    assert isinstance(pair, TorchTransformerConfig) and pair.kind == "transformer"
    assert pair.field("encoder").kind == "encoder" and pair.field("decoder").kind == "decoder"
    assert issubclass(HFSource, Source) and HFSource.kind == "hf"
    assert issubclass(TimmViTConfig, Source) and TimmViTConfig.kind == "timm"
    # the deprecated reader reads through the protocol
    assert source_field(config, "nhead") == 2 and source_field({"kind": "x"}, "kind") == "x"
    assert source_field(None, "kind", "none") == "none"


def _one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_to_torch_refuses_a_wrong_source_in_one_line():
    decoder = network_decoder(8, 2, 16, 1)
    decoder.source = {}
    with pytest.raises(ValueError) as e:
        splitformer.to_torch(decoder)
    assert "model.source kind must be 'decoder' or 'decoder_layer', got ''" in _one_line(e)
    encoder = splitformer.network_encoder(8, 2, 16, 1)
    encoder.source = {"kind": "decoder"}
    with pytest.raises(ValueError) as e:
        splitformer.to_torch(encoder)
    assert "model.source has kind 'decoder'" in _one_line(e)
    encoder.source = {"kind": "encoder"}
    assert isinstance(splitformer.to_torch(encoder), nn.TransformerEncoder)


def test_to_hf_refuses_a_wrong_source_in_one_line():
    bert = bert_model(vocab_size=31, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=24, max_position_embeddings=12)
    for model in (bert, splitformer.network_encoder(8, 2, 16, 1)):  # nothing from from_hf
        with pytest.raises(ValueError) as e:
            splitformer.to_hf(model)
        assert "needs a model made by from_hf (its source has hf_class=None)" in _one_line(e)
    bert.source = {"hf_class": "BertModel"}  # the right class name, not an HFBertConfig
    with pytest.raises(ValueError) as e:
        splitformer.to_hf(bert)
    assert ("model.source must be a HFBertConfig with hf_class one of ['BertModel', "
            "'BertForSequenceClassification'], got RecordSource") in _one_line(e)


def test_to_timm_refuses_a_model_not_made_by_from_timm():
    vit = build_vit(image_size=8, patch_size=4, in_chans=3, dim=16, depth=1, num_heads=2,
                    hidden_dim=24, num_classes=3, read_out="timm", dtype=torch.float32)
    pytest.importorskip("timm.models.vision_transformer")
    with pytest.raises(ValueError, match="needs a model made by from_timm .*RecordSource"):
        splitformer.to_timm(vit)
