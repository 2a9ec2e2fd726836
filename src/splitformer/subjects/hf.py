"""A local Hugging Face folder as a ``Subject`` (``subjects.subject``): the model through
``splitformer.from_hf`` (nothing is downloaded, ever) and how inputs reach it.

Its family's record (``interop.families``: ``modality``) says which it is. A text model (BERT,
GPT-2) encodes with the folder's own tokenizer (``hf_text_subject``); an image model (ViT, CvT)
is fed as the folder's ``preprocessor_config.json`` says
(``hf_image_spec``: ``size`` or ``crop_size``, ``resample``, ``crop_pct``, ``do_rescale`` with
``rescale_factor``, ``do_normalize`` with ``image_mean`` and ``image_std``), each setting it
does not give taken from the defaults of the processor of its class (the record's
``processor``: ViTImageProcessor, ConvNextImageProcessor for CvT) and said in a note.

A text subject whose tokenizer has a chat template also carries ``chat(text, flag)``: the
conversation ``[{"role": "user", "content": text}]`` through ``apply_chat_template`` (with the
generation prompt) as ids, and the tokenizer's eos ids that end the answer; without a template
it is an InputError naming ``flag``. A GGUF's tokenizer comes from the file
(``hf_text_subject(..., tokenizer=model.tokenizer)``), a folder's from its tokenizer files.
"""

from __future__ import annotations

import contextlib
import inspect
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .images import RESAMPLE
from .subject import Encoded, ImageSpec, InputError, Subject, read_json, source_facts

__all__ = ["TOKENIZER_FILES", "hf_image_spec", "hf_subject", "hf_text_subject", "load_hf",
           "quiet_transformers"]

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")


def hf_subject(model: Any, folder: Path, name: str, what: str, label: str) -> Subject:
    """The subject of a model ``from_hf`` made of ``folder``: text or images, as its family's
    record says (``ModelFamily.modality``)."""
    facts = source_facts(model)
    if _family(facts.hf_class).modality == "text":
        return hf_text_subject(model, folder, name, what, label, facts.config)
    spec = hf_image_spec(folder, facts.config, facts.hf_class)
    return Subject(model, name, what, "image", image=spec, label=label)


def hf_text_subject(model: Any, folder: Path, name: str, what: str, label: str,
                    config: dict[str, Any], tokenizer: Any = None) -> Subject:
    """A text subject: texts encoded by the folder's tokenizer (loaded when first needed, once),
    or by ``tokenizer`` when given (a GGUF's: ``folder`` is then the file, for messages),
    padded, truncated to the model's positions; the unknown tokens it made are counted."""
    max_len = int(config.get("max_position_embeddings") or config.get("n_positions") or 512)
    sub = Subject(model, name, what, "text", max_len=max_len, label=label)
    params = set(inspect.signature(model.forward).parameters)
    vocab_size = config.get("vocab_size")
    loaded: list[Any] = [] if tokenizer is None else [tokenizer]

    def tokenizer_for(flag: str) -> Any:
        if not loaded:
            loaded.append(_tokenizer(folder, flag))
        return loaded[0]

    def encode(texts: list[str], flag: str) -> Encoded:
        tok = tokenizer_for(flag)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token or tok.unk_token
        full = max(len(ids) for ids in _quiet(tok, texts)["input_ids"])
        enc = tok(texts, return_tensors="pt", padding=True, truncation=True,
                  max_length=max_len)
        out = {k: v for k, v in enc.items() if k in params}
        _check_ids(out["input_ids"], folder, flag, vocab_size)
        unknown = _unknown_tokens(out["input_ids"], enc.get("attention_mask"), tok)
        if "attention_mask" in out and bool(out["attention_mask"].all()):
            del out["attention_mask"]
        return Encoded(out, full, unknown, "tokens", str(tok.unk_token))

    sub.encode = encode

    def decode(ids: list[int]) -> str:  # runs once per new token: the tokenizer loaded once
        return tokenizer_for("MODEL").decode(ids, skip_special_tokens=True)

    sub.decode = decode

    def chat(text: str, flag: str) -> tuple[Encoded, tuple[int, ...]]:
        """The user's ``text`` as a conversation's ids (the chat template, with the generation
        prompt) and the tokenizer's eos ids (where the answer ends)."""
        import torch

        tok = tokenizer_for(flag)
        if not getattr(tok, "chat_template", None):
            raise InputError(f"argument {flag}: the tokenizer of {str(folder)!r} has no chat "
                             "template (a chat model's tokenizer has one); without --chat the "
                             "prompt is continued as text")
        made = tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True, tokenize=True)
        ids = made["input_ids"] if isinstance(made, Mapping) else made
        ids = torch.tensor([list(ids)], dtype=torch.long)
        _check_ids(ids, folder, flag, vocab_size)
        eos = tok.eos_token_id
        ends = tuple(eos) if isinstance(eos, (list, tuple)) else () if eos is None else (eos,)
        return Encoded({"input_ids": ids}, ids.shape[1], 0, "tokens", str(tok.unk_token)), ends

    sub.chat = chat  # type: ignore[attr-defined]  # a text subject's conversation (docstring)
    eos = config.get("eos_token_id")
    sub.eos_token_ids = tuple(eos) if isinstance(eos, list) else (eos,) if isinstance(
        eos, int) else ()
    return sub


def _check_ids(ids: Any, folder: Path, flag: str, vocab_size: Any) -> None:
    if ids.numel() == 0 or ids.shape[-1] == 0:
        raise InputError(f"argument {flag}: the tokenizer of {str(folder)!r} makes no "
                         "token of the text")
    if vocab_size is not None and int(ids.max()) >= int(vocab_size):
        raise InputError(f"argument MODEL: the tokenizer of {str(folder)!r} gives "
                         f"token id {int(ids.max())}, but the model's vocabulary has "
                         f"{vocab_size} ids")


def _unknown_tokens(ids: Any, mask: Any, tok: Any) -> int:
    """How many of the (unpadded) tokens are the tokenizer's unknown token."""
    if tok.unk_token_id is None:
        return 0
    real = ids == tok.unk_token_id
    if mask is not None:
        real = real & mask.bool()
    return int(real.sum())


def _image_size(pre: dict[str, Any], config: dict[str, Any]
                ) -> tuple[Any, int, int, int | None]:
    """(the size setting, height, width, shortest_edge or None) of a preprocessor config
    (``size``, else ``crop_size``, else the model config's ``image_size``, else 224)."""
    size = pre.get("size", pre.get("crop_size", config.get("image_size", 224)))
    shortest = None
    if isinstance(size, dict):
        if "shortest_edge" in size:
            shortest = int(size["shortest_edge"])
            h = w = shortest
        else:
            h, w = int(size.get("height", 224)), int(size.get("width", 224))
    elif isinstance(size, (list, tuple)):
        h, w = int(size[0]), int(size[-1])
    else:
        h = w = int(size)
    return size, h, w, shortest


def hf_image_spec(folder: Path, config: dict[str, Any], cls: str) -> ImageSpec:
    """How images are prepared for the image model of class ``cls`` in ``folder`` (module
    docstring); a bad ``resample`` or ``rescale_factor`` is an InputError naming MODEL."""
    pre_path = folder / "preprocessor_config.json"
    read = read_json(pre_path)
    pre = read or {}
    size, h, w, shortest = _image_size(pre, config)
    # the defaults of the family's image processor for a missing key (ViTImageProcessor,
    # ConvNextImageProcessor for CvT: its record's ``processor``)
    defaults_of = _family(cls).processor
    if defaults_of is None:
        raise InputError(f"argument MODEL: splitformer reads no image processor for {cls}")
    resample_d, crop_d = defaults_of.resample, defaults_of.crop_pct
    mean_d = std_d = (0.5,) * 3
    normalize = pre.get("do_normalize", True)
    mean = tuple(pre.get("image_mean", mean_d)) if normalize else None
    std = tuple(pre.get("image_std", std_d)) if normalize else None
    resample = pre.get("resample", resample_d)
    defaults: dict[str, Any] = {}
    if "size" not in pre and "crop_size" not in pre:
        defaults["size"] = size
    if "resample" not in pre and pre.get("do_resize", True):
        defaults["resample"] = RESAMPLE[resample_d]
    if normalize:
        defaults.update({k: list(v) for k, v in (("image_mean", mean_d), ("image_std", std_d))
                         if k not in pre})
    if pre.get("do_rescale", True) and "rescale_factor" not in pre:
        defaults["rescale_factor"] = 1 / 255
    if shortest is not None and shortest < 384 and "crop_pct" not in pre:
        defaults["crop_pct"] = crop_d
    factor = _checked_processor(pre, folder, resample)
    processor = defaults_of.name
    return ImageSpec(int(config.get("num_channels") or 3), h, w, mean, std,
                     shortest_edge=shortest,
                     crop_pct=pre.get("crop_pct", crop_d) if shortest else None,
                     do_resize=bool(pre.get("do_resize", True)), resample=int(resample),
                     do_rescale=bool(pre.get("do_rescale", True)),
                     rescale_factor=float(factor),
                     config=str(pre_path) if read is not None else None,
                     defaults=defaults or None,
                     defaults_note=_defaults_note(folder, read is not None, processor,
                                                  defaults))


def _checked_processor(pre: dict[str, Any], folder: Path, resample: Any) -> Any:
    """The rescale factor, after checking it and ``resample`` (InputError naming MODEL)."""
    if resample not in RESAMPLE:
        raise InputError(f"argument MODEL: {str(folder / 'preprocessor_config.json')!r} has "
                         f"resample {resample!r}, expected one of {sorted(RESAMPLE)} (Pillow's "
                         "filters)")
    factor = pre.get("rescale_factor", 1 / 255)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise InputError(f"argument MODEL: {str(folder / 'preprocessor_config.json')!r} has "
                         f"rescale_factor {factor!r}, expected a number > 0")
    return factor


def _defaults_note(folder: Path, has_config: bool, processor: str,
                   defaults: dict[str, Any]) -> str | None:
    """The note on the processor defaults used (None when the config gave every setting)."""
    settings = "; ".join(f"{k} {_setting_text(v)}" for k, v in defaults.items())
    if not has_config:
        return (f"{str(folder)!r} has no preprocessor_config.json: images are prepared with "
                f"the defaults of {processor}: {settings}")
    if defaults:
        return (f"{str(folder / 'preprocessor_config.json')!r} does not give every setting; "
                f"the defaults of {processor} are used: {settings}")
    return None


def _setting_text(value: Any) -> str:
    if isinstance(value, float):
        return "1/255" if value == 1 / 255 else f"{value:g}"
    if isinstance(value, list):
        return ", ".join(_setting_text(v) for v in value)
    if isinstance(value, dict):
        return " x ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def _quiet(tok: Any, texts: list[str]) -> Any:
    """``tok(texts)`` untruncated, without transformers' warning about a long sequence."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return tok(texts, truncation=False)
    finally:
        transformers.logging.set_verbosity(verbosity)


def _tokenizer(folder: Path, flag: str) -> Any:
    """The folder's tokenizer; the folder (MODEL) is named when it has none, ``flag`` as what
    needs it."""
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise InputError(f"argument MODEL: {str(folder)!r} holds no tokenizer (none of "
                         f"{', '.join(TOKENIZER_FILES)}), which {flag} needs; save_pretrained "
                         "the tokenizer there")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise InputError(f"argument MODEL: the tokenizer of {str(folder)!r} does not load "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None


def _family(cls: str) -> Any:
    """The family record (``interop.families``) of the transformers class ``cls``."""
    from ..interop.families import family_of_class

    record = family_of_class(cls)
    if record is None:
        raise InputError(f"argument MODEL: splitformer reads no model of class {cls!r}")
    return record


def _family_of_type(model_type: str) -> Any:
    from ..interop.families import family_of_type

    record = family_of_type(model_type)
    if record is None:
        raise InputError(f"argument MODEL: splitformer reads no model of model_type "
                         f"{model_type!r}")
    return record


def load_hf(folder: Path, config: dict[str, Any]) -> Any:
    """The model of a local Hugging Face folder through ``from_hf`` (the first architecture
    of its config that splitformer reads, else the base model of its model_type), quietly."""
    from ..interop.hf import HF_CLASSES, from_hf

    try:
        import transformers
    except ImportError:
        raise InputError("argument MODEL: a Hugging Face folder needs transformers (pip install "
                         "'splitformer[hf]')") from None
    archs = [a for a in (config.get("architectures") or []) if a in HF_CLASSES]
    # else the base model of its model_type: the first class of the family's record
    cls_name = archs[0] if archs else _family_of_type(config["model_type"]).classes[0]
    try:
        with quiet_transformers():
            hf = getattr(transformers, cls_name).from_pretrained(str(folder),
                                                                 local_files_only=True)
            return from_hf(hf.eval()).eval()
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"argument MODEL: the {cls_name} in {str(folder)!r} does not load "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


@contextlib.contextmanager
def quiet_transformers(stderr: bool = False) -> Iterator[None]:
    """transformers' warnings and progress bars off (errors still raise); with ``stderr`` the
    standard error too (the GGUF reader's own tqdm bar, which transformers' switch misses)."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()) if stderr else contextlib.nullcontext():
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()
