"""The model families splitformer reads from another library: one record each, read by every
registry that used to keep its own list.

A ``ModelFamily`` says everything splitformer needs to know of one family: the library and
its classes (the base model first) with their ``model_type`` values, the modality (how a
folder's inputs reach it), the library's config class, the interop module that maps its
weights (``build``, ``from_hf_model`` / ``to_hf_model``) and the typed config that module
keeps as the model's ``source``, the verification group that measures it, how its image
processor prepares images, how it is stored (``store``: the kind under which
``splitformer.save`` and a compression folder record its source, ``stored()`` /
``rebuild()``; a family without one is not saved) and whether ``splitformer compress`` heals
it, a small example config, and the per-family deltas a shared map reads.
Nothing is probed: a reader takes what the record declares, and the modules it names are
imported only when asked for (``map_module``), so reading the registry imports neither
transformers nor any weight map.

``FAMILIES`` is the registry (name -> record, in table order); the readers are views of it,
live (a family registered later appears in each, one unregistered leaves each):

    interop.hf.HF_CLASSES        transformers class -> its map module      hf_classes()
    interop.hf_bert.HF_CLASSES   the classes one map reads (each map's)    classes_of(map)
    interop.hf.hf_config         the config class of a source              family_of_class()
    verification.GROUPS          the families' verification groups         verification_groups()
    subjects.resolve.HF_TYPES    the model_types a folder may have         model_types()
    subjects.hf                  text or image; a model_type's base class; family_of_class(),
                                 an image processor's defaults             family_of_type()
    compression.store            compress.json's base kind, its rebuild    stored(),
    training.model_record        splitformer.save's source of a from_hf    family_of_store()
                                 model, its rebuild
    commands.compress            the model_types it heals                  compressible()
    tests/test_registry.FAMILIES a builder from the example config         reference()

Adding a family is one ``register(ModelFamily(...))`` here (plus its map and verification
modules); a family that differs from a registered one by a few settings is derived from it
(``ModelFamily.derive``, transformers' "modular" idea: one map, per-family deltas)::

    LLAMA = register(ModelFamily(
        name="llama", label="Llama", classes=("LlamaModel", "LlamaForCausalLM"),
        model_types=("llama",), modality="text", config="LlamaConfig", map="hf_llama",
        source="HFLlamaConfig", model="CausalDecoderModel",
        verification="splitformer.verification.hf_llama",
        traits={"qkv_bias": False, "qk_norm": False}))
    register(LLAMA.derive(
        name="qwen2", label="Qwen2", classes=("Qwen2Model", "Qwen2ForCausalLM"),
        model_types=("qwen2",), config="Qwen2Config", traits={"qkv_bias": True}))

The derived record keeps the map (``hf_llama``, whose ``HF_CLASSES`` is then every class of
both) and merges ``traits`` and ``example`` key by key; the map reads the deltas of the model
it converts as ``family_of_class(type(model).__name__).traits``. It keeps the verification
module too, so group "qwen2" runs that module's checks registered under "qwen2" (a shared
module registers its rows once per family of its map: ``for f in families() if f.map ==
"hf_llama"``, each building ``f.reference(...)``).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["FAMILIES", "ImageProcessor", "LiveNames", "LiveTable", "ModelFamily",
           "classes_of", "compressible", "families", "family", "family_of_class",
           "family_of_store", "family_of_type", "hf_classes", "model_types", "register",
           "stored", "unregister", "verification_groups"]

MODALITIES = ("text", "image")
LIBRARIES = ("transformers", "timm")


@dataclass(frozen=True)
class ImageProcessor:
    """The defaults of the image processor of a family's class (transformers' own), used for
    a setting a folder's ``preprocessor_config.json`` does not give: its name, ``resample``
    (Pillow's filter number) and ``crop_pct`` (None: no crop)."""

    name: str
    resample: int
    crop_pct: float | None = None


@dataclass(frozen=True, kw_only=True)
class ModelFamily:
    """One model family of another library, as every splitformer registry reads it (module
    docstring). Frozen: a related family is a new record (``derive``)."""

    name: str  # the registry key and the verification group's name
    label: str  # how messages name the family ("BERT")
    classes: tuple[str, ...]  # the library's classes the map reads, the base model first
    modality: str  # "text" (a tokenizer) or "image" (an image processor)
    map: str  # the interop module: build(source), from_hf_model / to_hf_model
    source: str  # the typed config class in ``map`` (a ``models.base.Source``)
    model: str  # the splitformer model class the map makes (for messages)
    library: str = "transformers"
    model_types: tuple[str, ...] = ()  # config.json's model_type values (transformers)
    config: str | None = None  # the library's config class ("BertConfig")
    verification: str | None = None  # the module registering the group ``name``
    processor: ImageProcessor | None = None  # image families read from a folder
    store: str | None = None  # the source kind a saved or compressed model records ("hf-bert")
    # ``splitformer compress`` heals it: "encoder" (a text encoder, its sentence embeddings) or
    # "causal-lm" (its next-token distributions, docs/depth-llm.md); None: not compressed
    compress: str | None = None
    example: Mapping[str, Any] = field(default_factory=dict)  # a small config (kwargs of config)
    traits: Mapping[str, Any] = field(default_factory=dict)  # per-family deltas a shared map reads

    def __post_init__(self) -> None:
        if not self.name or not self.classes:
            raise ValueError("a model family needs a name and at least one class")
        if self.modality not in MODALITIES:
            raise ValueError(f"modality must be one of {MODALITIES}, got {self.modality!r}")
        if self.library not in LIBRARIES:
            raise ValueError(f"library must be one of {LIBRARIES}, got {self.library!r}")
        if self.compress not in (None, "encoder", "causal-lm"):
            raise ValueError(f"family {self.name!r}: compress must be None, 'encoder' or "
                             f"'causal-lm', got {self.compress!r}")
        if self.compress and self.store is None:
            raise ValueError(f"family {self.name!r}: a family compress heals needs a store kind")
        for key in ("classes", "model_types"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        for key in ("example", "traits"):
            object.__setattr__(self, key, MappingProxyType(dict(getattr(self, key))))

    def __hash__(self) -> int:
        return hash(self.name)

    def derive(self, **changes: Any) -> ModelFamily:
        """A related family: this record with ``changes`` (``dataclasses.replace``), where
        ``traits`` and ``example`` are merged into this record's key by key (module docstring).
        ``name`` must change: the registry holds one record per name."""
        if changes.get("name", self.name) == self.name:
            raise ValueError(f"derive: a derived family needs its own name (not {self.name!r})")
        for key in ("traits", "example"):
            changes[key] = {**getattr(self, key), **changes.get(key, {})}
        return dataclasses.replace(self, **changes)

    def map_module(self) -> Any:
        """The interop module that maps this family's weights (imported now)."""
        return importlib.import_module(f"{__package__}.{self.map}")

    def source_type(self) -> type:
        """The typed config (``models.base.Source``) a model of this family keeps."""
        return getattr(self.map_module(), self.source)

    def build(self, source: Any, **kwargs: Any) -> Any:
        """The splitformer model of ``source`` (a ``source_type()``) with random weights."""
        return self.map_module().build(source, **kwargs)

    def reference(self, cls: str | None = None, *, dtype: Any = None, seed: int = 0) -> Any:
        """The transformers model of class ``cls`` (default: the base model, ``classes[0]``)
        built from the ``example`` config with weights drawn under ``seed`` (eval mode,
        ``dtype`` if given): the small random reference tests and checks compare against.
        Needs transformers; ValueError for a family without an example config."""
        import torch
        import transformers

        if self.library != "transformers" or not self.example or self.config is None:
            raise ValueError(f"family {self.name!r} declares no transformers example config")
        cls = cls or self.classes[0]
        if cls not in self.classes:
            raise ValueError(f"family {self.name!r} reads {list(self.classes)}, not {cls!r}")
        config = getattr(transformers, self.config)(**self.example)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = getattr(transformers, cls)(config)
        return (model if dtype is None else model.to(dtype)).eval()

    def example_inputs(self, batch: int = 2, length: int = 6, seed: int = 0) -> dict[str, Any]:
        """Inputs for ``reference()`` by modality: ``input_ids`` (batch, length) below the
        example's vocabulary size (text), ``pixel_values`` (batch, channels, size, size) with
        the example's ``image_size`` (16 when it has none) (image); float64 pixels."""
        import torch

        g = torch.Generator().manual_seed(seed)
        if self.modality == "text":
            vocab = int(self.example.get("vocab_size", 2))
            return {"input_ids": torch.randint(0, vocab, (batch, length), generator=g)}
        size = int(self.example.get("image_size", 16))
        channels = int(self.example.get("num_channels", 3))
        return {"pixel_values": torch.randn(batch, channels, size, size, generator=g,
                                            dtype=torch.float64)}

    def stored(self, source: Any) -> dict[str, Any]:
        """The record of a model's ``source`` that ``splitformer.save`` and a compression
        folder keep (``store`` kind)."""
        if self.store is None:
            raise ValueError(f"family {self.name!r} declares no store kind")
        return {"kind": self.store, "source": dataclasses.asdict(source)}

    def rebuild(self, record: Mapping[str, Any], **kwargs: Any) -> Any:
        """The model ``stored`` recorded, with random weights (the inverse of ``stored``)."""
        return self.build(self.source_type()(**record["source"]), **kwargs)


FAMILIES: dict[str, ModelFamily] = {}


def register(record: ModelFamily) -> ModelFamily:
    """Add ``record`` to the registry and return it; ValueError when its name, one of its
    classes (of its library), model_types or store kind is another family's."""
    if record.name in FAMILIES:
        raise ValueError(f"model family {record.name!r} is already registered")
    for other in FAMILIES.values():
        clash = ({f"class {c}" for c in record.classes if other.library == record.library}
                 & {f"class {c}" for c in other.classes})
        clash |= {f"model_type {t}" for t in set(record.model_types) & set(other.model_types)}
        if record.store is not None and record.store == other.store:
            clash.add(f"store kind {record.store}")
        if clash:
            raise ValueError(f"model family {record.name!r}: {', '.join(sorted(clash))} already "
                             f"belong to family {other.name!r}")
    FAMILIES[record.name] = record
    return record


def unregister(name: str) -> ModelFamily:
    """Remove the family ``name`` from the registry and return its record."""
    if name not in FAMILIES:
        raise KeyError(f"no model family {name!r}; registered: {list(FAMILIES)}")
    return FAMILIES.pop(name)


def families(library: str | None = None) -> list[ModelFamily]:
    """The registered families (of ``library``, None: all), in registry order."""
    return [f for f in FAMILIES.values() if library is None or f.library == library]


def family(name: str) -> ModelFamily:
    """The family ``name`` (KeyError naming the registered ones)."""
    if name not in FAMILIES:
        raise KeyError(f"no model family {name!r}; registered: {list(FAMILIES)}")
    return FAMILIES[name]


def family_of_class(cls: str, library: str = "transformers") -> ModelFamily | None:
    """The family whose map reads the class named ``cls`` of ``library`` (None: none)."""
    return next((f for f in families(library) if cls in f.classes), None)


def family_of_type(model_type: str) -> ModelFamily | None:
    """The transformers family of a config's ``model_type`` (None: none reads it)."""
    return next((f for f in families("transformers") if model_type in f.model_types), None)


def family_of_store(kind: str) -> ModelFamily | None:
    """The family a compression folder's base ``kind`` names (None: none)."""
    return next((f for f in FAMILIES.values() if f.store is not None and f.store == kind), None)


class LiveNames(Sequence):
    """A live tuple of names computed from the registry (equal to a tuple or list of the
    same names, printed as a tuple)."""

    def __init__(self, compute: Callable[[], tuple[str, ...]]) -> None:
        self._compute = compute

    def __getitem__(self, i):  # type: ignore[override]
        return self._compute()[i]

    def __len__(self) -> int:
        return len(self._compute())

    def __iter__(self) -> Iterator[str]:
        return iter(self._compute())

    def __contains__(self, name: object) -> bool:
        return name in self._compute()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LiveNames, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._compute())

    def __repr__(self) -> str:
        return repr(self._compute())


class LiveTable(Mapping):
    """A live read-only mapping computed from the registry (equal to a dict of the same
    items, printed as one)."""

    def __init__(self, compute: Callable[[], dict[str, str]]) -> None:
        self._compute = compute

    def __getitem__(self, key: str) -> str:
        return self._compute()[key]

    def __len__(self) -> int:
        return len(self._compute())

    def __iter__(self) -> Iterator[str]:
        return iter(self._compute())

    def __repr__(self) -> str:
        return repr(self._compute())


def hf_classes() -> Mapping[str, str]:
    """transformers class name -> the interop module that maps it (live view)."""
    return LiveTable(lambda: {c: f.map for f in families("transformers") for c in f.classes})


def classes_of(map_name: str, library: str = "transformers") -> Sequence[str]:
    """The classes the interop module ``map_name`` reads: those of every family of
    ``library`` whose map it is (derived families share one; live view)."""
    return LiveNames(lambda: tuple(c for f in families(library) if f.map == map_name
                                for c in f.classes))


def model_types() -> Sequence[str]:
    """The ``model_type`` values of a transformers folder splitformer reads (live view)."""
    return LiveNames(lambda: tuple(t for f in families("transformers") for t in f.model_types))


def verification_groups() -> dict[str, str]:
    """Each family's verification group -> the module that registers its checks."""
    return {f.name: f.verification for f in FAMILIES.values() if f.verification is not None}


def compressible(kind: str | None = None) -> list[ModelFamily]:
    """The families ``splitformer compress`` heals (of ``kind``, "encoder" or "causal-lm",
    when given)."""
    return [f for f in FAMILIES.values() if f.compress and kind in (None, f.compress)]


def stored() -> list[ModelFamily]:
    """The families whose models ``splitformer.save`` and a compression folder can record (a
    ``store`` kind)."""
    return [f for f in FAMILIES.values() if f.store is not None]


# The families of this version, in table order (``splitformer verify`` lists their groups so).
BERT = register(ModelFamily(
    name="bert", label="BERT", classes=("BertModel", "BertForSequenceClassification"),
    model_types=("bert",), modality="text", config="BertConfig", map="hf_bert",
    source="HFBertConfig", model="BertEncoderModel",
    verification="splitformer.verification.hf_bert", store="hf-bert", compress="encoder",
    example={"vocab_size": 31, "hidden_size": 16, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 24,
             "max_position_embeddings": 12, "hidden_dropout_prob": 0.0,
             "attention_probs_dropout_prob": 0.0}))
VIT = register(ModelFamily(
    name="vit", label="ViT", classes=("ViTModel", "ViTForImageClassification"),
    model_types=("vit",), modality="image", config="ViTConfig", map="hf_vit",
    source="HFViTConfig", model="ViT", verification="splitformer.verification.hf_vit",
    processor=ImageProcessor("ViTImageProcessor", resample=2), store="hf-vit",
    example={"image_size": 8, "patch_size": 4, "num_channels": 3, "hidden_size": 16,
             "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 24,
             "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
CVT = register(ModelFamily(
    name="cvt", label="CvT", classes=("CvtModel", "CvtForImageClassification"),
    model_types=("cvt",), modality="image", config="CvtConfig", map="hf_cvt",
    source="HFCvtConfig", model="ConvolutionalVisionTransformer",
    verification="splitformer.verification.hf_cvt", store="hf-cvt",
    processor=ImageProcessor("ConvNextImageProcessor", resample=3, crop_pct=224 / 256),
    example={"num_channels": 3, "patch_sizes": [3, 3], "patch_stride": [2, 2],
             "patch_padding": [1, 1], "embed_dim": [8, 16], "num_heads": [1, 2],
             "depth": [1, 2], "mlp_ratio": [2.0, 2.0], "attention_drop_rate": [0.0, 0.0],
             "drop_rate": [0.0, 0.0], "drop_path_rate": [0.0, 0.0],
             "qkv_bias": [True, True], "cls_token": [False, True]}))
TIMM_VIT = register(ModelFamily(
    name="timm", label="timm ViT", library="timm", classes=("VisionTransformer",),
    modality="image", map="timm_vit", source="TimmViTConfig", model="ViT",
    verification="splitformer.verification.timm_vit"))
GPT2 = register(ModelFamily(
    name="gpt2", label="GPT-2", classes=("GPT2Model", "GPT2LMHeadModel"),
    model_types=("gpt2",), modality="text", config="GPT2Config", map="hf_gpt2",
    source="HFGPT2Config", model="CausalDecoderModel",
    verification="splitformer.verification.hf_gpt2", store="hf-gpt2",
    example={"vocab_size": 31, "n_positions": 12, "n_embd": 16, "n_layer": 2, "n_head": 2,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0,
             "eos_token_id": 0}))
# The Llama family: one map (hf_llama), each relative a delta of the Llama record's traits
# (read by hf_llama, never by class name). Example configs use odd sizes: head_dim != width /
# heads, grouped key/value heads, untied heads.
LLAMA = register(ModelFamily(
    name="llama", label="Llama", classes=("LlamaModel", "LlamaForCausalLM"),
    model_types=("llama",), modality="text", config="LlamaConfig", map="hf_llama",
    source="HFLlamaConfig", model="CausalDecoderModel", store="hf-llama",
    verification="splitformer.verification.hf_llama", compress="causal-lm",
    traits={"activation_key": "hidden_act", "window": None, "qk_norm": False,
            "sandwich": False, "norm_offset": 0.0, "norm_eps_attr": "variance_epsilon",
            "pre_attn_scalar": False, "softcap": False, "embed_scale": None,
            "scale_embeds": True},
    example={"vocab_size": 37, "hidden_size": 20, "intermediate_size": 28,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 6, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
             "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
             "pad_token_id": None}))
MISTRAL = register(LLAMA.derive(
    name="mistral", label="Mistral", classes=("MistralModel", "MistralForCausalLM"),
    model_types=("mistral",), config="MistralConfig", store="hf-mistral",
    traits={"window": "all"}, example={"sliding_window": 3}))
QWEN2 = register(LLAMA.derive(
    name="qwen2", label="Qwen2", classes=("Qwen2Model", "Qwen2ForCausalLM"),
    model_types=("qwen2",), config="Qwen2Config", store="hf-qwen2",
    traits={"qkv_bias": True, "o_bias": False},
    example={"hidden_size": 24, "num_attention_heads": 4, "head_dim": 6}))
QWEN3 = register(LLAMA.derive(
    name="qwen3", label="Qwen3", classes=("Qwen3Model", "Qwen3ForCausalLM"),
    model_types=("qwen3",), config="Qwen3Config", store="hf-qwen3",
    traits={"qk_norm": True}))
GEMMA2 = register(LLAMA.derive(
    name="gemma2", label="Gemma2", classes=("Gemma2Model", "Gemma2ForCausalLM"),
    model_types=("gemma2",), config="Gemma2Config", store="hf-gemma2",
    traits={"activation_key": "hidden_activation", "sandwich": True, "norm_offset": 1.0,
            "norm_eps_attr": "eps", "pre_attn_scalar": True, "softcap": True,
            "embed_scale": "float32", "scale_embeds": False},
    example={"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 5,
             "sliding_window": 3, "attn_logit_softcapping": 50.0,
             "final_logit_softcapping": 30.0, "tie_word_embeddings": True}))
GEMMA3 = register(GEMMA2.derive(
    name="gemma3", label="Gemma3", classes=("Gemma3TextModel", "Gemma3ForCausalLM"),
    model_types=("gemma3_text",), config="Gemma3TextConfig", store="hf-gemma3",
    traits={"qk_norm": True},
    example={"attn_logit_softcapping": None, "final_logit_softcapping": None,
             "sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"],
             "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                       "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                    "rope_theta": 1e6}}}))
