"""MODEL resolved to a ``Subject`` (``subjects.subject``): ``load_subject(spec)``.

MODEL is one of

* a built-in model (``BUILTINS``: small random-weight models built in code, seeded with 0);
* a folder written by ``splitformer.save`` (``model.json`` + ``model.safetensors``): a model
  of the training families, or one made by ``from_hf`` (images as its family's processor
  prepares them; text through DIR/tokenizer, which ``save`` writes for a GGUF's model, or
  tokenizer files put beside);
* a ``splitformer train`` run folder (``config.json`` and a checkpoint: ``latest`` /
  ``ckpt-*``): its newest complete checkpoint, rebuilt from the recorded source;
* a local Hugging Face folder (``config.json`` with ``model_type`` in ``HF_TYPES``, as
  ``save_pretrained`` writes it): ``subjects.hf``; nothing is downloaded, ever;
* a ``splitformer compress`` result folder (``compress.json``): its default healed grid
  (``compression.store.load_compressed``), text through the tokenizer it keeps;
* a GGUF network (``interop.gguf``): a packaged one by its name (``"smollm2"``: the
  SmolLM2-135M-Instruct that ``make data`` installs; the name wins over a folder of that name,
  as a built-in's does) or a ``.gguf`` path, read by transformers and mapped by ``from_hf``;
  text through the file's own tokenizer (and its chat template: ``Subject.chat``).

Anything else is an ``InputError`` naming MODEL and what the folder holds. The subject's
``source`` records what MODEL was (the data's ``"source"``): its kind, the name or the path as
given, and a description.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..interop.families import model_types
from ..interop.gguf import PACKAGED
from .hf import hf_subject, hf_text_subject, load_hf, quiet_transformers
from .subject import (
    CHARS,
    InputError,
    Subject,
    char_encoder,
    read_json,
    source_facts,
    training_subject,
    unknown_mark,
)

__all__ = ["BUILTINS", "HF_TYPES", "load_subject"]

# the model_types of a Hugging Face folder MODEL may be: a live view of the family records
HF_TYPES = model_types()


def _train_family(family: str, data: dict[str, Any], **sizes: Any):
    from ..training import TrainConfig
    from ..training.families import build_model

    cfg = TrainConfig(family=family, data=data["name"], **sizes)
    return build_model(cfg, data)


def _vit_digits():
    return _train_family("vit", {"name": "digits", "task": "classify", "num_classes": 10,
                                 "input_shape": [1, 8, 8], "vocab_size": None, "vocab": None},
                         width=32, heads=4, depth=4, patch=2)


def _encoder_series():
    return _train_family("encoder", {"name": "series", "task": "classify", "num_classes": 2,
                                     "input_shape": [24], "vocab_size": None, "vocab": None},
                         width=32, heads=4, depth=4)


def _gpt2_tiny():
    vocab = [*CHARS, unknown_mark()]
    return _train_family("lm", {"name": "text", "task": "lm", "num_classes": None,
                                "input_shape": None, "vocab_size": len(vocab), "vocab": vocab},
                         width=32, heads=4, depth=4, seq_len=64)


def _bert_tiny():
    from ..models.bert import bert_model

    return bert_model(vocab_size=len(CHARS) + 1, hidden_size=32, num_hidden_layers=4,
                      num_attention_heads=4, intermediate_size=64, max_position_embeddings=128,
                      pad_token_id=None)


# name -> (what it is, builder); every builder runs under torch.manual_seed(0)
BUILTINS: dict[str, tuple[str, Callable[[], Any]]] = {
    "vit-digits": ("ViT evolution on 8x8 digits (width 32, 4 steps, 4 heads, patch 2)",
                   _vit_digits),
    "encoder": ("pre-LN encoder sequence classifier on ItalyPowerDemand series (data 'series'; "
                "width 32, 4 steps)", _encoder_series),
    "gpt2-tiny": ("GPT-2-shaped causal LM over characters (data 'text'; width 32, 4 steps, "
                  "64 characters)", _gpt2_tiny),
    "bert-tiny": ("BERT encoder over characters (width 32, 4 steps, 4 heads; --text or --sample "
                  "with --data text)", _bert_tiny),
}


def _folder_name(folder: Path) -> str:
    folder = folder.resolve()
    if folder.name in ("model", "models", "checkpoint") and folder.parent.name:
        return f"{folder.parent.name}"
    return folder.name or "model"


def load_subject(spec: str) -> Subject:
    """MODEL -> the loaded model and how inputs reach it (module docstring; one-line
    InputError otherwise)."""
    if spec in BUILTINS:
        return _builtin_subject(spec)
    if spec in PACKAGED or spec.lower().endswith(".gguf"):
        return _gguf_subject(spec)
    folder = Path(spec)
    if not folder.exists():
        raise InputError(f"argument MODEL: {spec!r} is neither a built-in model "
                         f"({', '.join(BUILTINS)}), a packaged GGUF ({', '.join(PACKAGED)}) "
                         "nor an existing folder")
    if not folder.is_dir():
        raise InputError(f"argument MODEL: {spec!r} is a file; expected a built-in model name, "
                         "a model folder or a .gguf file")
    files = {p.name for p in folder.iterdir()}
    if "compress.json" in files:
        return _compressed_subject(spec, folder)
    config = read_json(folder / "config.json")
    checkpointed = "latest" in files or any(f.startswith("ckpt") for f in files)
    if "model.json" in files or (checkpointed and config is not None
                                 and "model_type" not in config):
        return _saved_subject(spec, folder, files)
    if config is not None and "model_type" in config:
        return _hf_folder_subject(spec, folder, config)
    raise InputError(_not_a_model(spec, files, config, checkpointed))


def _builtin_subject(spec: str) -> Subject:
    import torch

    what, build = BUILTINS[spec]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build().eval()
    desc = f"built-in model {spec!r}: {what}"
    source = {"kind": "builtin", "name": spec, "description": desc}
    if spec == "bert-tiny":
        vocab = [*CHARS, unknown_mark()]
        sub = Subject(model, spec, desc, "text", max_len=128, label=f"model {spec!r}",
                      source=source)
        sub.encode = char_encoder(vocab, 128, lambda ids: {"input_ids": ids})
        return sub
    sub = training_subject(model, spec, desc)
    sub.label = f"model {spec!r}"
    sub.source = source
    return sub


def _saved_subject(spec: str, folder: Path, files: set[str]) -> Subject:
    """A splitformer.save folder, a checkpoint folder or a training run's newest checkpoint."""
    from ..training.checkpoints import CheckpointError, load_model

    kind, key = (("checkpoint folder", "checkpoint") if "checkpoint.json" in files else
                 ("saved model folder", "saved") if "model.json" in files else
                 ("training run folder", "run"))
    try:
        model = load_model(folder)
    except CheckpointError as e:
        raise InputError(f"argument MODEL: {kind} {spec!r} does not load: "
                         f"{' '.join(str(e).split())[:240]}") from None
    what = f"{kind} {str(folder)!r}"
    facts = source_facts(model)
    words = vars(model).get("tokenizer")  # saved beside (DIR/tokenizer: a GGUF's)
    if facts.hf_class and words is not None:
        sub = hf_text_subject(model.eval(), folder, _folder_name(folder), what,
                              f"{kind} {spec!r}", facts.config, tokenizer=words)
    elif facts.hf_class:  # a model made by from_hf (training.model_record)
        sub = hf_subject(model.eval(), folder, _folder_name(folder), what, f"{kind} {spec!r}")
    else:
        sub = training_subject(model.eval(), _folder_name(folder), what)
    sub.label = f"{kind} {spec!r}"
    sub.source = {"kind": key, "path": str(folder), "description": sub.what}
    return sub


def _compressed_subject(spec: str, folder: Path) -> Subject:
    """A ``splitformer compress`` result folder: its default healed grid, text encoded by the
    tokenizer it keeps (DIR/tokenizer, or DIR/hf)."""
    from ..compression.store import load_compressed, tokenizer_folder

    try:
        model = load_compressed(folder)
    except (ValueError, OSError, KeyError, TypeError) as e:
        raise InputError(f"argument MODEL: compression folder {spec!r} does not load: "
                         f"{' '.join(str(e).split())[:240]}") from None
    tokenizer = tokenizer_folder(folder)
    if tokenizer is None:
        raise InputError(f"argument MODEL: compression folder {spec!r} keeps no tokenizer "
                         "(DIR/tokenizer or DIR/hf), which its text needs")
    what = f"compression folder {str(folder)!r} ({model.evolution.num_steps} steps)"
    sub = hf_text_subject(model, tokenizer, _folder_name(folder), what,
                          f"compression folder {spec!r}", source_facts(model).config)
    sub.source = {"kind": "compressed", "path": str(folder), "description": what}
    return sub


def locate_gguf(spec: str) -> Path:
    """The file of MODEL ``spec``, a packaged name or a ``.gguf`` path (``gguf_location``),
    without reading it; InputError naming MODEL otherwise."""
    from ..interop.gguf import gguf_location

    try:
        folder, file = gguf_location(spec)
    except (ValueError, FileNotFoundError) as e:
        detail = str(e).replace(f"path_or_name={spec!r}", "").lstrip(": ")
        raise InputError(f"argument MODEL: {spec!r}: {detail}") from None
    return folder / file


def _gguf_subject(spec: str) -> Subject:
    """A GGUF network (a packaged name or a ``.gguf`` path) through ``from_hf``: transformers
    reads it, the family registry maps it; the file's tokenizer encodes and decodes."""
    from ..interop.hf import from_hf

    path = locate_gguf(spec)
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise InputError("argument MODEL: a GGUF file needs transformers (pip install "
                         "'splitformer[hf]')") from None
    try:
        with quiet_transformers(stderr=True):
            model = from_hf(spec).eval()
    except Exception as e:
        raise InputError(f"argument MODEL: the GGUF {str(path)!r} does not load "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    facts = source_facts(model)
    packaged = f"; packaged model {spec!r} of {PACKAGED[spec][0]}" if spec in PACKAGED else ""
    what = f"GGUF {path.name} ({facts.hf_class}{packaged})"
    sub = hf_text_subject(model, path, spec if spec in PACKAGED else path.stem, what,
                          f"GGUF {spec!r}", facts.config, tokenizer=model.tokenizer)
    sub.source = {"kind": "gguf", "path": str(path), "name": spec if packaged else None,
                  "class": facts.hf_class, "description": what}
    return sub


def _hf_folder_subject(spec: str, folder: Path, config: dict[str, Any]) -> Subject:
    mtype = config["model_type"]
    if mtype not in HF_TYPES:
        raise InputError(f"argument MODEL: folder {spec!r} has config.json with model_type "
                         f"{mtype!r}, expected one of {', '.join(HF_TYPES)}")
    model = load_hf(folder, config)
    sub = hf_subject(model, folder, _folder_name(folder),
                     f"Hugging Face {mtype} folder {str(folder)!r}",
                     f"Hugging Face {mtype} folder {spec!r}")
    sub.source = {"kind": "hf", "path": str(folder), "model_type": mtype,
                  "class": source_facts(model).hf_class, "description": sub.what}
    return sub


def _not_a_model(spec: str, files: set[str], config: dict[str, Any] | None,
                 checkpointed: bool) -> str:
    """Why a folder is not a model analyze reads."""
    if config is not None and "family" in config:
        return (f"argument MODEL: folder {spec!r} has the config.json of a training run but no "
                "complete checkpoint (latest, ckpt-*)")
    if config is not None:
        return (f"argument MODEL: folder {spec!r} has a config.json without model_type (a "
                f"Hugging Face folder's names one of {', '.join(HF_TYPES)}) or family (a "
                "training run's)")
    if checkpointed:
        return (f"argument MODEL: folder {spec!r} holds a checkpoint (latest, ckpt-*) without "
                "config.json (a training run folder has both)")
    if "model.safetensors" in files:
        return (f"argument MODEL: folder {spec!r} holds model.safetensors without model.json (a "
                "splitformer.save folder has both) or config.json (a Hugging Face folder has "
                "both)")
    found = f" (it holds {', '.join(sorted(files)[:6])})" if files else " (it is empty)"
    return (f"argument MODEL: folder {spec!r} holds no config.json, model.safetensors or "
            f"checkpoint{found}")

