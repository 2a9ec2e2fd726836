"""What ``splitformer analyze`` analyses: a *subject*, a loaded model and how inputs reach it.

A ``Subject`` is the seam between resolving MODEL (``subjects.resolve``: a built-in name, a
``splitformer.save`` or training-run folder, a local Hugging Face folder through
``subjects.hf``) and preparing its inputs (``subjects.inputs``, with the images of
``subjects.images``); the diagnostics (``analysis.diagnostics.analyze(subject.model,
inputs)``) see only the model and the prepared inputs.

A MODEL or an input that cannot be analysed raises ``InputError``, one line naming the argument
as the command line spells it (``argument MODEL: ...``, ``argument --text: ...``); the command
turns it into its usage error (exit status 2). What preparing an input changes or assumes goes
to a ``Notes`` (the data's ``"notes"``), each line also passed to its ``say`` as it comes.

The model's recorded source (``models.base.Source``) is read in one place, ``source_facts``:
the record of a model built by ``training.families``, or the ``hf_class`` / ``config`` /
``patch_size`` / ``image_size`` of the typed config ``from_hf`` attaches.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.diagnostics import plural
from ..models.base import EvolutionModel

__all__ = ["CHARS", "Encoded", "ImageSpec", "InputError", "Notes", "SourceFacts", "Subject",
           "char_encoder", "image_grid", "plural", "read_json", "source_facts",
           "training_subject", "unknown_mark"]


class InputError(ValueError):
    """A MODEL or an input that cannot be analysed: the message is one line naming the
    argument as the command line spells it and what was expected."""


@dataclass
class Notes:
    """What preparing the input changed or assumed: ``lines`` (the data's ``"notes"``); each
    note, and each warning (not kept), is also passed to ``say(kind, line)`` as it comes
    (kind "note" or "warning")."""

    lines: list[str] = field(default_factory=list)
    say: Callable[[str, str], None] = lambda kind, line: None

    def note(self, line: str) -> None:
        self.lines.append(line)
        self.say("note", line)

    def warn(self, line: str) -> None:
        self.say("warning", line)


# characters of the built-in text models: newline and printable ASCII, then the unknown mark
CHARS = ("\n", *string.printable[:95])


def unknown_mark() -> str:
    from ..training.data import UNKNOWN

    return UNKNOWN


@dataclass
class ImageSpec:
    channels: int
    height: int
    width: int
    mean: tuple[float, ...] | None = None  # None: no normalisation
    std: tuple[float, ...] | None = None
    shortest_edge: int | None = None  # resize the short side, then crop height x width
    crop_pct: float | None = None
    do_resize: bool = True
    resample: int = 2  # Pillow's filter number (RESAMPLE)
    do_rescale: bool = True  # pixel values (0 .. 255) times rescale_factor
    rescale_factor: float = 1 / 255
    config: str | None = None  # the preprocessor_config.json read (a Hugging Face folder)
    defaults: dict[str, Any] | None = None  # the settings its processor's defaults gave
    defaults_note: str | None = None  # the note saying so


@dataclass
class Subject:
    """A loaded model and how inputs reach it."""

    model: Any
    name: str  # the default report folder is analysis/<name>
    what: str  # for the report: what MODEL was
    takes: str  # "image", "text" or "series"
    data: str | None = None  # the data set the model knows
    inputs: Callable[[Any], tuple | dict] = lambda x: (x,)
    image: ImageSpec | None = None
    # (texts, the flag they came from) -> Encoded
    encode: Callable[[list[str], str], Encoded] | None = None
    series_shape: tuple[int, ...] | None = None
    max_len: int | None = None
    label: str = ""  # for messages (default: what)
    source: dict[str, Any] | None = None  # what MODEL was, for the data (``"source"``)
    # ids -> text (text models: the tokenizer's decode, or the characters of the vocabulary)
    decode: Callable[[list[int]], str] | None = None
    # the ids that end a text (the tokenizer's eos), for generation
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.label = self.label or self.what


@dataclass
class Encoded:
    """Texts as model inputs: ``inputs``, the longest text's token count before truncation
    (``full``) and what was mapped to the unknown mark (``unknown``: how many characters or
    tokens, ``unknown_kind``: "characters" or "tokens", ``unknown_what``: which)."""

    inputs: Any
    full: int
    unknown: int = 0
    unknown_kind: str = "characters"
    unknown_what: str = ""


def char_encoder(vocab: list[str], max_len: int, wrap: Callable[[Any], dict]
                  ) -> Callable[[list[str], str], Encoded]:
    import torch

    index = {c: i for i, c in enumerate(vocab)}
    unk = index.get(unknown_mark())

    def encode(texts: list[str], flag: str) -> Encoded:
        rows = []
        missing: dict[str, int] = {}
        for t in texts:
            ids = []
            for c in t[:max_len]:
                if c in index:
                    ids.append(index[c])
                elif unk is not None:
                    ids.append(unk)
                    missing[c] = missing.get(c, 0) + 1
                else:
                    raise InputError(f"argument {flag}: character {c!r} is not in the model's "
                                     "vocabulary (which has no unknown mark)")
            rows.append(ids)
        n = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), n, dtype=torch.long)
        mask = torch.zeros(len(rows), n, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
        out = wrap(ids)
        if not bool(mask.all()):
            out["attention_mask"] = mask
        shown = ", ".join(repr(c) for c in list(missing)[:8])
        return Encoded(out, max(len(t) for t in texts), sum(missing.values()), "characters",
                       shown + (", ..." if len(missing) > 8 else ""))

    return encode


def char_decoder(vocab: list[str]) -> Callable[[list[int]], str]:
    """ids -> the characters of ``vocab`` they index."""
    def decode(ids: list[int]) -> str:
        return "".join(vocab[i] if 0 <= i < len(vocab) else unknown_mark() for i in ids)

    return decode


def training_subject(model: Any, name: str, what: str) -> Subject:
    """A model built by training.families.build_model: its source says family and data."""
    from ..training.families import FAMILIES

    source = source_facts(model).record
    family, sig, cfg = source["family"], source["data"], source["config"]
    fam = FAMILIES[family]
    shape = tuple(sig.get("input_shape") or ())
    base = Subject(model, name, what, "series", data=sig.get("name"), inputs=fam.inputs)
    if sig.get("task") == "lm":
        base.takes = "text"
        base.max_len = int(cfg.get("seq_len") or 64)
        base.encode = char_encoder(list(sig["vocab"]), base.max_len, fam.inputs)
        base.decode = char_decoder(list(sig["vocab"]))
    elif len(shape) == 3:
        base.takes = "image"
        base.image = ImageSpec(*shape)
    else:
        base.series_shape = shape
    return base


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, None when there is no such file (InputError naming MODEL
    when it is not a JSON object)."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"argument MODEL: {str(path)!r} is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise InputError(f"argument MODEL: {str(path)!r} holds a {type(doc).__name__}, "
                         "expected a JSON object")
    return doc


@dataclass(frozen=True)
class SourceFacts:
    """What analyze reads of ``model.source``: the ``record`` itself (a dict for a model of
    the training families, an ``interop.hf.HFSource`` for one made by ``from_hf``, or None),
    and for ``from_hf`` its transformers class, config and (ViT) image and patch sizes."""

    record: Any = None
    hf_class: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    image_size: tuple[int, int] | None = None
    patch_size: tuple[int, int] | None = None


def source_facts(model: Any) -> SourceFacts:
    """``model.source`` read once (module docstring): declared on every ``EvolutionModel``
    (``models.base.Source``); a module of another library has none."""
    from ..interop.hf import HFSource
    from ..interop.hf_vit import HFViTConfig

    src = model.source if isinstance(model, EvolutionModel) else None
    if not isinstance(src, HFSource):
        return SourceFacts(src)
    vit = isinstance(src, HFViTConfig)
    return SourceFacts(src, str(src.hf_class or ""), dict(src.config or {}),
                       tuple(src.image_size) if vit else None,
                       tuple(src.patch_size) if vit else None)


def image_grid(sub: Subject) -> tuple[int, int] | None:
    """The patch grid of a ViT-family image model (rows, columns), when known: for a model of
    the training families, the patch size ``training.families`` gave it (``_patch`` of its
    recorded config); for a ViT made by ``from_hf``, image size over patch size."""
    if sub.takes != "image":
        return None
    facts = source_facts(sub.model)
    src = facts.record
    if isinstance(src, dict) and src.get("family") == "vit" and sub.image is not None:
        from ..training import TrainConfig
        from ..training.config import ConfigError
        from ..training.families import _patch

        try:
            p = _patch(TrainConfig.from_dict(dict(src["config"])),
                       min(sub.image.height, sub.image.width))
        except (ConfigError, TypeError, ValueError):
            return None
        return sub.image.height // p, sub.image.width // p
    patch, size = facts.patch_size, facts.image_size
    if patch is not None and size is not None:
        return size[0] // patch[0], size[1] // patch[1]
    return None
