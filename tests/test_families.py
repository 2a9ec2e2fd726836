"""One record per model family (``splitformer.interop.families``): every registry that used to
keep its own list is a view of it; a family registered later appears in every one of them and
leaves with it; every record's example is read exactly by ``from_hf`` and back."""

from __future__ import annotations

import json

import pytest
import torch

import splitformer
from splitformer import verification
from splitformer.interop import families as fam
from splitformer.interop import hf, hf_bert, hf_cvt, hf_gpt2, hf_vit
from splitformer.models.base import Source
from splitformer.subjects import resolve

transformers = pytest.importorskip("transformers")

MAPS = {"hf_bert": hf_bert.HF_CLASSES, "hf_vit": hf_vit.HF_CLASSES,
        "hf_cvt": hf_cvt._CLASSES, "hf_gpt2": hf_gpt2.HF_CLASSES}


def _main(out) -> torch.Tensor:
    for name in ("logits", "last_hidden_state"):
        t = getattr(out, name, None)
        if t is not None:
            return t
    return out


def _views() -> dict[str, object]:
    """What every reader sees now, as plain values."""
    import argparse

    from splitformer.commands.verify import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    group_choices = next(a.choices for a in parser._actions if a.dest == "group")
    return {"hf classes": dict(hf.HF_CLASSES),
            "maps": {m: tuple(hf_bert.classes_of(m)) for m in MAPS},
            "groups": dict(verification.GROUPS), "group choices": list(group_choices),
            "hf types": tuple(resolve.HF_TYPES),
            "stored": [f.name for f in fam.stored()],
            "compressible": [f.name for f in fam.compressible()]}


def _registry() -> dict[str, object]:
    """The same, computed from the records alone."""
    records = list(fam.FAMILIES.values())
    hf_records = [f for f in records if f.library == "transformers"]
    groups = {"core": "splitformer.verification.core",
              **{f.name: f.verification for f in records if f.verification},
              "transformer": "splitformer.verification.torch_transformer"}
    return {"hf classes": {c: f.map for f in hf_records for c in f.classes},
            "maps": {m: tuple(c for f in hf_records if f.map == m for c in f.classes)
                     for m in MAPS},
            "groups": groups, "group choices": list(groups),
            "hf types": tuple(t for f in hf_records for t in f.model_types),
            "stored": [f.name for f in records if f.store],
            "compressible": [f.name for f in records if f.compress]}


def test_every_reader_is_a_view_of_the_registry():
    assert _views() == _registry()
    assert hf.FAMILIES is hf.HF_CLASSES
    for name, classes in MAPS.items():  # each map's own tuple is the live view of its records
        assert tuple(classes) == _registry()["maps"][name] and classes == tuple(classes)
    # the families of this version, in table order (verify lists their groups so)
    assert list(fam.FAMILIES) == ["bert", "vit", "cvt", "timm", "gpt2", "llama", "mistral",
                                  "qwen2", "qwen3", "gemma2", "gemma3"]
    assert resolve.HF_TYPES == ("bert", "vit", "cvt", "gpt2", "llama", "mistral", "qwen2", "qwen3",
                                "gemma2", "gemma3_text")
    assert repr(hf_bert.HF_CLASSES) == "('BertModel', 'BertForSequenceClassification')"


@pytest.mark.parametrize("name", list(fam.FAMILIES))
def test_every_record_names_what_exists(name):
    """What a record declares is there: the library's classes and config, the typed source in
    its map, the map's functions, the verification module."""
    import importlib

    record = fam.family(name)
    module = record.map_module()
    assert issubclass(record.source_type(), Source)
    assert callable(module.build)
    if record.verification is not None:
        importlib.import_module(record.verification)
    if record.library == "transformers":
        assert callable(module.from_hf_model) and callable(module.to_hf_model)
        for cls in record.classes:
            assert isinstance(getattr(transformers, cls), type)
        assert getattr(transformers, record.config) is not None
        assert record.model_types and all(
            getattr(transformers, record.config).model_type in record.model_types for _ in [0])
    assert (record.processor is not None) == (record.modality == "image"
                                              and record.library == "transformers")


@pytest.mark.parametrize("name,cls", [(f.name, c) for f in fam.families("transformers")
                                      for c in f.classes])
def test_every_record_example_is_read_exactly_and_back(name, cls):
    """float64: from_hf of the record's example equals transformers' model <= 1e-10, and to_hf
    of it is the same network."""
    record = fam.family(name)
    ref = record.reference(cls, dtype=torch.float64)
    x = record.example_inputs()
    ours = splitformer.from_hf(ref).eval()
    assert ours.source.hf_class == cls and fam.family_of_class(cls) is record
    with torch.no_grad():
        want = _main(ref(**x))
        assert (_main(ours(**x)) - want).abs().max() <= 1e-10
        assert torch.equal(_main(splitformer.to_hf(ours).eval()(**x)), want)


def _toy() -> fam.ModelFamily:
    """A family derived from BERT's record: its own class, model_type, group and store kind,
    the same map (hf_bert)."""
    return fam.family("bert").derive(
        name="toybert", label="ToyBERT", classes=("ToyBertModel",), model_types=("toybert",),
        store="hf-toybert", traits={"toy": True})


@pytest.fixture
def toy():
    record = fam.register(_toy())
    try:
        yield record
    finally:
        fam.unregister(record.name)


def test_a_registered_family_appears_in_every_reader(toy, tmp_path):
    assert _views() == _registry()
    views = _views()
    assert views["hf classes"]["ToyBertModel"] == "hf_bert"
    assert views["maps"]["hf_bert"] == ("BertModel", "BertForSequenceClassification",
                                        "ToyBertModel")
    assert "ToyBertModel" in hf_bert.HF_CLASSES  # the map reads the derived family's class
    assert views["groups"]["toybert"] == "splitformer.verification.hf_bert"
    assert "toybert" in views["group choices"] and "toybert" in resolve.HF_TYPES
    assert "toybert" in views["stored"] and "toybert" in views["compressible"]
    # from_hf reads a model of the new class through the shared map, exactly; to_hf goes back
    # to a transformers model of its config class (the record's "BertConfig")
    toy_cls = type("ToyBertModel", (transformers.BertModel,), {})
    ref = toy_cls(transformers.BertConfig(**toy.example)).to(torch.float64).eval()
    x = toy.example_inputs()
    ours = splitformer.from_hf(ref).eval()
    with torch.no_grad():
        want = ref(**x).last_hidden_state
        assert (ours(**x).last_hidden_state - want).abs().max() <= 1e-10
        assert torch.equal(splitformer.to_hf(ours).eval()(**x).last_hidden_state, want)
    # a compression folder stores and rebuilds it by the record's store kind
    from splitformer.compression.store import _base_record, _rebuild

    record = _base_record(ours)
    assert record["kind"] == "hf-bert"  # its source is a HFBertConfig: BERT's record first
    assert type(_rebuild({**record, "kind": "hf-toybert"})) is type(ours)
    # compress accepts its model_type; subjects read it as text
    from splitformer.commands.compress_checks import model_folder
    from splitformer.subjects.hf import _family

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "toybert"}))
    assert model_folder(str(tmp_path)) == tmp_path
    assert _family("ToyBertModel").modality == "text"


def test_an_unregistered_family_leaves_every_reader(tmp_path):
    before = _views()
    record = fam.register(_toy())
    assert _views() != before
    fam.unregister(record.name)
    assert _views() == before == _registry()
    assert "ToyBertModel" not in hf.HF_CLASSES and "toybert" not in resolve.HF_TYPES
    from splitformer.commands import UsageError
    from splitformer.commands.compress_checks import model_folder
    from splitformer.compression.store import _rebuild

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "toybert"}))
    with pytest.raises(UsageError, match=r"compress heals BERT text encoders \(model_type "
                                         r"'bert'\), got model_type 'toybert'"):
        model_folder(str(tmp_path))
    with pytest.raises(ValueError, match=r"unknown base kind 'hf-toybert' \(expected 'hf-bert' or "
                                         r"'hf-vit' or 'hf-cvt' or 'hf-gpt2' or 'hf-llama' or "
                                         r"'hf-mistral' or 'hf-qwen2' or 'hf-qwen3' or "
                                         r"'hf-gemma2' or 'hf-gemma3'\)"):
        _rebuild({"kind": "hf-toybert", "source": {}})
    with pytest.raises(TypeError, match="from_hf supports"):
        splitformer.from_hf(type("ToyBertModel", (transformers.BertModel,), {})(
            transformers.BertConfig(**record.example)))


def test_derive_merges_the_deltas_and_register_refuses_a_clash():
    bert = fam.family("bert")
    toy = _toy()
    assert toy.map == bert.map and toy.source == bert.source and toy.config == bert.config
    assert dict(toy.traits) == {"toy": True} and dict(toy.example) == dict(bert.example)
    wider = toy.derive(name="toy2", classes=("Toy2Model",), model_types=("toy2",),
                       store="hf-toy2", example={"hidden_size": 32}, traits={"gate": "silu"})
    assert dict(wider.traits) == {"toy": True, "gate": "silu"}
    assert wider.example["hidden_size"] == 32 and wider.example["vocab_size"] == 31
    with pytest.raises(ValueError, match="its own name"):
        bert.derive(label="x")
    with pytest.raises(ValueError, match="class BertModel already belong to family 'bert'"):
        fam.register(bert.derive(name="bert2", model_types=("bert2",), store=None,
                                 compress=None))
    with pytest.raises(ValueError, match="model_type bert already belong"):
        fam.register(toy.derive(name="toy3", classes=("Toy3Model",), model_types=("bert",)))
    with pytest.raises(ValueError, match="already registered"):
        fam.register(bert)
    with pytest.raises(ValueError, match="modality must be one of"):
        bert.derive(name="x", modality="audio")
    with pytest.raises(ValueError, match="compress must be None, 'encoder' or 'causal-lm'"):
        bert.derive(name="x", compress=True)
    with pytest.raises(TypeError):
        toy.traits["toy"] = False  # a record is frozen, its deltas too
    assert list(fam.FAMILIES) == ["bert", "vit", "cvt", "timm", "gpt2", "llama", "mistral",
                                  "qwen2", "qwen3", "gemma2", "gemma3"]


def test_registry_tests_build_every_family():
    """tests/test_registry.FAMILIES (every scheme, kernel, copy, pickle test) has a builder for
    every model family of the registry: its own, else one from the record's example."""
    from test_registry import FAMILIES, _record_builder

    assert {f.name for f in fam.families("transformers")} <= set(FAMILIES)
    model, inputs = _record_builder(fam.family("gpt2"))()
    with torch.no_grad():
        assert torch.isfinite(_main(model(*inputs))).all()
