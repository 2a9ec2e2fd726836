"""Hugging Face transformers <-> splitformer: dispatch by model class to the family maps.

``from_hf(model_or_local_dir)`` accepts a loaded ``transformers`` model or a local folder written
by ``save_pretrained`` (loaded with ``local_files_only=True``: no network), or a GGUF file (a
``.gguf`` path, a folder and ``gguf_file=``, or a packaged name such as ``"smollm2"``: read by
transformers' own reader, ``interop.gguf``, then mapped as any transformers model; the model
keeps the file's tokenizer as ``model.tokenizer``). The family maps live in
``hf_bert``, ``hf_vit``, ``hf_cvt`` and ``hf_gpt2``; ``HF_CLASSES`` maps each transformers class
name to the module that handles it, a view of the family records (``interop.families``:
one record per family, read by every registry; ``FAMILIES``, the old name of ``HF_CLASSES``,
is kept as an alias). Every
family's ``from_hf_model`` is check -> config -> build -> copy: it reads a typed config (a
subclass of ``HFSource``, a ``Source`` of kind "hf") from the model, builds the splitformer model
from it, copies the weight table, and the model keeps the config as its ``source``; ``to_hf``
rebuilds the transformers model from that source.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..models.base import EvolutionModel, Source
from .families import families, family_of_class, hf_classes
from .gguf import SUFFIX, is_gguf, read_gguf
from .weights import check_no_hooks

__all__ = ["HF_CLASSES", "HFSource", "attn_implementation", "from_hf", "hf_config", "to_hf"]

# transformers class name -> module (relative to this package) with from_hf_model / to_hf_model:
# a live view of the family records (interop.families), not a list of its own
HF_CLASSES: Mapping[str, str] = hf_classes()
FAMILIES = HF_CLASSES  # the old name (deprecated): "family" is the model family


@dataclass(frozen=True, kw_only=True)
class HFSource(Source):
    """What every converted transformers model records: the class (``hf_class``), the config
    as ``config.to_dict()`` gives it, and the attention implementation (None: unset)."""

    kind: ClassVar[str] = "hf"
    hf_class: str
    config: dict[str, Any]
    attn_implementation: str | None = None


def _map_module(module_name: str):
    return importlib.import_module(f"{__package__}.{module_name}")


def _load_local(path: str | os.PathLike) -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("from_hf(path) needs `transformers` (pip install splitformer[hf])") from e
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model_or_local_dir={str(path)!r} is not a local folder "
                                "(splitformer never downloads: save_pretrained it first)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        found = sorted(f for f in os.listdir(path) if f.lower().endswith(SUFFIX))
        if found:
            raise ValueError(f"model_or_local_dir={str(path)!r} holds no config.json but GGUF "
                             f"files ({', '.join(found[:6])}): name one with gguf_file=...")
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    archs = getattr(config, "architectures", None) or []
    for arch in archs:
        if arch in HF_CLASSES:
            cls = getattr(transformers, arch)
            return cls.from_pretrained(path, local_files_only=True)
    raise ValueError(f"the checkpoint in {str(path)!r} has architectures={archs}; supported: "
                     f"{sorted(HF_CLASSES)}")


def from_hf(model_or_local_dir: Any, *, gguf_file: str | os.PathLike | None = None, **kwargs):
    """A splitformer model with the same outputs as a transformers model (weight map).

    ``model_or_local_dir``: a transformers model, a ``save_pretrained`` folder, a ``.gguf`` file,
    a folder with ``gguf_file=`` (the file's name in it) or a packaged GGUF's name
    (``interop.gguf.PACKAGED``: "smollm2"). A GGUF is read by transformers (float32, eval mode)
    and its tokenizer kept as the result's ``tokenizer``."""
    model = model_or_local_dir
    tokenizer = None
    if gguf_file is not None and not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"gguf_file names a file in a folder: model_or_local_dir must then be "
                        f"that folder, got a {type(model).__name__}")
    if is_gguf(model, gguf_file):
        try:
            model, tokenizer = read_gguf(model, gguf_file)
        except (TypeError, ValueError, OSError) as e:
            raise type(e)(str(e).replace("path_or_name=", "model_or_local_dir=")) from None
    elif isinstance(model, (str, os.PathLike)):
        model = _load_local(model)
    name = type(model).__name__
    if name not in HF_CLASSES:
        raise TypeError(f"from_hf supports {sorted(HF_CLASSES)}, got {name}")
    check_no_hooks(model, "from_hf")
    out = _map_module(HF_CLASSES[name]).from_hf_model(model, **kwargs)
    if tokenizer is not None:
        out.tokenizer = tokenizer  # what the GGUF's text needs (the CLI's encode / decode)
    return out


def to_hf(model):
    """The transformers model with the same weights (the inverse map). TypeError when
    ``model`` is not a splitformer model, ValueError when it was not made by ``from_hf``."""
    if not isinstance(model, EvolutionModel):
        known = families("transformers")
        labels = [f.label for f in known]
        made = ", ".join(dict.fromkeys(f.model for f in known))
        raise TypeError(f"to_hf(model) expects a splitformer model made by from_hf "
                        f"({_either(labels)}: {made}), got {type(model).__name__}")
    cls = model.source.field("hf_class")
    if cls not in HF_CLASSES:
        raise ValueError("to_hf(model) needs a model made by from_hf (its source has "
                         f"hf_class={cls!r})")
    try:
        model.refuse_merging_export("to_hf(model)")
        model = model.as_network()  # a coarsened or smooth-in-t model: its steps as layers
        return _map_module(HF_CLASSES[cls]).to_hf_model(model)
    except ValueError as e:
        family = family_of_class(cls)
        if family is None or family.store is None:
            raise
        raise ValueError(f"{e}. splitformer.save(model, DIR) saves such a model as it is "
                         "(scheme, grid, kernels and token merging recorded; "
                         "splitformer.load(DIR) reads it back)") from e


def _either(names: list[str]) -> str:
    """"a, b or c" ("a" alone)."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def hf_source(model: EvolutionModel, classes: tuple[str, ...], expected: type) -> HFSource:
    """``model.source`` as the family's typed config, after checking that it is one and that
    its class is one of ``classes`` (ValueError naming hf_class otherwise)."""
    source = model.source
    cls = source.field("hf_class")
    if not isinstance(source, expected) or cls not in classes:
        raise ValueError(f"to_hf needs a model made by from_hf: model.source must be a "
                         f"{expected.__name__} with hf_class one of {list(classes)}, got "
                         f"{type(source).__name__} with hf_class={cls!r}")
    return source


def no_options(kwargs: dict[str, Any], family: str) -> None:
    """from_hf_model takes no options: TypeError naming the ones given."""
    if kwargs:
        raise TypeError(f"from_hf for {family} takes no options, got {sorted(kwargs)}")


def attn_implementation(config: Any) -> str:
    """The attention implementation a transformers config asks for ("eager" when unset)."""
    return getattr(config, "_attn_implementation", None) or "eager"


def hf_config(source: HFSource) -> Any:
    """The transformers config recorded in ``source``, of the class its family's record
    declares (``ModelFamily.config``, e.g. "BertConfig"), with the attention implementation
    the source model used ("sdpa" when it recorded none)."""
    import transformers

    record = family_of_class(source.hf_class)
    if record is None or record.config is None:
        raise ValueError(f"to_hf: no model family reads hf_class={source.hf_class!r}")
    config = getattr(transformers, record.config).from_dict(dict(source.config))
    config._attn_implementation = source.attn_implementation or "sdpa"
    return config
