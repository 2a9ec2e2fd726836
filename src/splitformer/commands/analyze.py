"""`splitformer analyze`: diagnostics of a model's evolution on real inputs, as an HTML report.

MODEL is one of

* a built-in model (``BUILTINS``: small random-weight models built in code, seeded with 0);
* a folder written by ``splitformer.save`` (``model.json`` + ``model.safetensors``);
* a ``splitformer train`` run folder (``config.json`` and a checkpoint: ``latest`` /
  ``ckpt-*``): its newest complete checkpoint, rebuilt from the recorded source;
* a local Hugging Face folder (``config.json`` with ``model_type`` bert, vit, cvt or gpt2, as
  ``save_pretrained`` writes it): ``splitformer.from_hf``; nothing is downloaded, ever.

The input is one of ``--text T`` (the checkpoint's own tokenizer for a Hugging Face text model,
characters of the model's vocabulary for the others; a text longer than the model takes is
truncated, with a one-line warning on stderr), ``--image FILE`` (PNG or JPEG, prepared as the
checkpoint's ``preprocessor_config.json`` says: ``do_resize`` with ``size`` and ``resample``
(the Pillow filter of that number: 0 nearest, 1 Lanczos, 2 bilinear, 3 bicubic, 4 box, 5
Hamming), ``crop_pct``, ``do_rescale`` with ``rescale_factor``, ``do_normalize`` with
``image_mean`` and ``image_std``; without one, resized bilinearly to the model's input shape)
and ``--sample N`` (the first N test examples of the model's data set, or of ``--data NAME``);
without one, a model that knows its data set takes ``--sample 1``.

Nothing is changed or assumed silently: each of the following is a note, one line on stderr
(``splitformer analyze: note: ...``) and a line of the data's ``"notes"``, with its facts in
``"input"``: characters outside a character model's vocabulary (analysed as its unknown mark;
``unknown_characters``) or unknown tokens a tokenizer made (``unknown_tokens``); a ``--text``
that is also the name of a file (the text is analysed as given); a 16-bit image (scaled to 8
bits, ``bits``); transparency (composited onto white, ``transparency``); a resize that changes
the aspect ratio or a centre crop (``aspect_ratio_changed``, ``cropped``); a colour image fed
to a one-channel model (luminance); the image-processor defaults used for settings a Hugging
Face folder's preprocessor_config.json does not give, or for all of them when it has none
(``processor_defaults``). Refused (exit 2, one line): a ``--text`` that is not valid UTF-8, an
image over Pillow's decompression-bomb limit, a model with non-finite weights, non-finite
inputs, a data set that does not fit the model (checked before the sample count).

``--out`` is checked before anything is loaded (a folder that exists or can be created, and is
writable). The report is written into a temporary folder (next to a fresh DIR, inside an
existing one) and moved into place at the end: the figures, then diagnostics.json, then
index.html, each replaced at once; Ctrl-C or a failure leaves DIR as it was.

Writes DIR/index.html (the report: figures inlined, no external asset), DIR/diagnostics.json
(what ``--json`` prints) and the figures (PNG and SVG); DIR defaults to
``analysis/<model name>``. Prints the summary and the report's path; ``--json`` prints one JSON
object: ``diagnostics.as_dict()`` with ``"source"`` (what MODEL was), ``"input"`` (what was
analysed, with its numbers), ``"figures"`` (name, title, caption and files of each figure
written) and ``"report"`` (the path of index.html). Every number of the report, the summary
included, is a number of that object. Figures that an earlier analysis listed in
DIR/diagnostics.json and this one does not draw are removed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import UsageError, bounded_int, stripped
from .progress import Progress
from .report import Staging, check_out, plural

HELP = ("diagnose a model's evolution (norms, velocities, Lipschitz estimates, ranks, "
        "attention) on real inputs into a self-contained HTML report")

HF_TYPES = ("bert", "vit", "cvt", "gpt2")
_NOUN = {"text": "text", "image": "images", "series": "series"}
MAX_SAMPLES = 256

# characters of the built-in text models: newline and printable ASCII, then the unknown mark
_CHARS = ("\n", *string.printable[:95])
LIPSCHITZ_ITERATIONS = 100  # as analysis.diagnostics (not imported here: torch loads late)
LIPSCHITZ_TOL = 1e-4
# Pillow's filters by the number preprocessor_config.json gives (HF's PILImageResampling)
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _tolerance(text: str) -> float:
    """argparse type of --lipschitz-tol: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1) (a relative change), "
                                         f"got {text!r}")
    return value


def _unknown() -> str:
    from ..training.data import UNKNOWN

    return UNKNOWN


# -- built-in models ----------------------------------------------------------------------------
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
    vocab = [*_CHARS, _unknown()]
    return _train_family("lm", {"name": "text", "task": "lm", "num_classes": None,
                                "input_shape": None, "vocab_size": len(vocab), "vocab": vocab},
                         width=32, heads=4, depth=4, seq_len=64)


def _bert_tiny():
    from ..models.bert import bert_model

    return bert_model(vocab_size=len(_CHARS) + 1, hidden_size=32, num_hidden_layers=4,
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

EPILOG = ("built-in models: " + "; ".join(f"{k}: {v[0]}" for k, v in BUILTINS.items())
          + ". exit status: 0 done; 1 the analysis failed after its inputs were accepted; "
          "2 a bad input")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help=f"a built-in model ({', '.join(BUILTINS)}), a folder saved by "
                        "splitformer.save, a 'splitformer train' run folder, or a local "
                        f"Hugging Face folder (model_type {', '.join(HF_TYPES)})")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, metavar="T",
                     help="a text input (the checkpoint's tokenizer, or the model's characters)")
    src.add_argument("--image", default=None, metavar="FILE",
                     help="a PNG or JPEG input, resized and normalised for the model")
    src.add_argument("--sample", default=None, metavar="N",
                     type=bounded_int(MAX_SAMPLES, "(samples)"),
                     help="the first N test examples of the model's data set (or --data); the "
                          "default for a model that knows its data is --sample 1")
    from ..training.data import DATASETS

    p.add_argument("--data", default=None, type=stripped, metavar="NAME",
                   help=f"data set of --sample: {', '.join(DATASETS)} (default: the model's)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder of the report (default: analysis/<model name>)")
    p.add_argument("--lipschitz-iterations", default=LIPSCHITZ_ITERATIONS, metavar="K",
                   type=bounded_int(1000, "(iterations)"),
                   help="the most iterations (one jvp and one vjp each) of each step's "
                        f"Lipschitz estimate (default {LIPSCHITZ_ITERATIONS}); a note says when "
                        "a step reaches it")
    p.add_argument("--lipschitz-tol", default=LIPSCHITZ_TOL, metavar="TOL", type=_tolerance,
                   help="stop a step's Lipschitz iteration when the estimate changes by less "
                        f"than TOL (relative; default {LIPSCHITZ_TOL:g})")
    p.add_argument("--json", action="store_true",
                   help="print the diagnostics (and the report's path) as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.set_defaults(_interrupted="; --out is left as it was")


# -- what a model takes -------------------------------------------------------------------------
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


def _char_encoder(vocab: list[str], max_len: int, wrap: Callable[[Any], dict]
                  ) -> Callable[[list[str], str], Encoded]:
    import torch

    index = {c: i for i, c in enumerate(vocab)}
    unk = index.get(_unknown())

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
                    raise UsageError(f"argument {flag}: character {c!r} is not in the model's "
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


def _training_subject(model: Any, name: str, what: str) -> Subject:
    """A model built by training.families.build_model: its source says family and data."""
    from ..training.families import FAMILIES

    source = model.source
    family, sig, cfg = source["family"], source["data"], source["config"]
    fam = FAMILIES[family]
    shape = tuple(sig.get("input_shape") or ())
    base = Subject(model, name, what, "series", data=sig.get("name"), inputs=fam.inputs)
    if sig.get("task") == "lm":
        base.takes = "text"
        base.max_len = int(cfg.get("seq_len") or 64)
        base.encode = _char_encoder(list(sig["vocab"]), base.max_len, fam.inputs)
    elif len(shape) == 3:
        base.takes = "image"
        base.image = ImageSpec(*shape)
    else:
        base.series_shape = shape
    return base


def _hf_subject(model: Any, folder: Path, name: str, what: str, label: str) -> Subject:
    source = model.source
    config = dict(getattr(source, "config", {}) or {})
    cls = str(getattr(source, "hf_class", ""))
    if cls.startswith(("Bert", "GPT2")):
        max_len = int(config.get("max_position_embeddings") or config.get("n_positions") or 512)
        sub = Subject(model, name, what, "text", max_len=max_len, label=label)
        params = set(inspect.signature(model.forward).parameters)
        vocab_size = config.get("vocab_size")

        def encode(texts: list[str], flag: str) -> Encoded:
            tok = _tokenizer(folder, flag)
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token or tok.unk_token
            full = max(len(ids) for ids in _quiet(tok, texts)["input_ids"])
            enc = tok(texts, return_tensors="pt", padding=True, truncation=True,
                      max_length=max_len)
            out = {k: v for k, v in enc.items() if k in params}
            ids = out["input_ids"]
            if ids.numel() == 0 or ids.shape[-1] == 0:
                raise UsageError(f"argument {flag}: the tokenizer of {str(folder)!r} makes no "
                                 "token of the text")
            if vocab_size is not None and int(ids.max()) >= int(vocab_size):
                raise UsageError(f"argument MODEL: the tokenizer of {str(folder)!r} gives "
                                 f"token id {int(ids.max())}, but the model's vocabulary has "
                                 f"{vocab_size} ids")
            mask = enc.get("attention_mask")
            unknown = 0
            if tok.unk_token_id is not None:
                real = ids == tok.unk_token_id
                if mask is not None:
                    real = real & mask.bool()
                unknown = int(real.sum())
            if "attention_mask" in out and bool(out["attention_mask"].all()):
                del out["attention_mask"]
            return Encoded(out, full, unknown, "tokens", str(tok.unk_token))

        sub.encode = encode
        return sub
    pre_path = folder / "preprocessor_config.json"
    read = _read_json(pre_path)
    pre = read or {}
    channels = int(config.get("num_channels") or 3)
    size = pre.get("size", pre.get("crop_size", config.get("image_size", 224)))
    defaults: dict[str, Any] = {}
    if "size" not in pre and "crop_size" not in pre:
        defaults["size"] = size
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
    # the defaults of ConvNextImageProcessor (CvT's) and ViTImageProcessor for a missing key
    resample_d, crop_d = (3, 224 / 256) if cls.startswith("Cvt") else (2, None)
    mean_d = std_d = (0.5,) * 3
    normalize = pre.get("do_normalize", True)
    mean = tuple(pre.get("image_mean", mean_d)) if normalize else None
    std = tuple(pre.get("image_std", std_d)) if normalize else None
    resample = pre.get("resample", resample_d)
    if "resample" not in pre and pre.get("do_resize", True):
        defaults["resample"] = RESAMPLE[resample_d]
    if normalize:
        defaults.update({k: list(v) for k, v in (("image_mean", mean_d), ("image_std", std_d))
                         if k not in pre})
    if pre.get("do_rescale", True) and "rescale_factor" not in pre:
        defaults["rescale_factor"] = 1 / 255
    if shortest is not None and shortest < 384 and "crop_pct" not in pre:
        defaults["crop_pct"] = crop_d
    if resample not in RESAMPLE:
        raise UsageError(f"argument MODEL: {str(folder / 'preprocessor_config.json')!r} has "
                         f"resample {resample!r}, expected one of {sorted(RESAMPLE)} (Pillow's "
                         "filters)")
    factor = pre.get("rescale_factor", 1 / 255)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise UsageError(f"argument MODEL: {str(folder / 'preprocessor_config.json')!r} has "
                         f"rescale_factor {factor!r}, expected a number > 0")
    processor = "ConvNextImageProcessor" if cls.startswith("Cvt") else "ViTImageProcessor"
    settings = "; ".join(f"{k} {_setting_text(v)}" for k, v in defaults.items())
    if read is None:
        note = (f"{str(folder)!r} has no preprocessor_config.json: images are prepared with "
                f"the defaults of {processor}: {settings}")
    elif defaults:
        note = (f"{str(pre_path)!r} does not give every setting; the defaults of {processor} "
                f"are used: {settings}")
    else:
        note = None
    spec = ImageSpec(channels, h, w, mean, std, shortest_edge=shortest,
                     crop_pct=pre.get("crop_pct", crop_d) if shortest else None,
                     do_resize=bool(pre.get("do_resize", True)), resample=int(resample),
                     do_rescale=bool(pre.get("do_rescale", True)),
                     rescale_factor=float(factor),
                     config=str(pre_path) if read is not None else None,
                     defaults=defaults or None, defaults_note=note)
    return Subject(model, name, what, "image", image=spec, label=label)


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


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")


def _tokenizer(folder: Path, flag: str) -> Any:
    """The folder's tokenizer; the folder (MODEL) is named when it has none, ``flag`` as what
    needs it."""
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise UsageError(f"argument MODEL: {str(folder)!r} holds no tokenizer (none of "
                         f"{', '.join(TOKENIZER_FILES)}), which {flag} needs; save_pretrained "
                         "the tokenizer there")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise UsageError(f"argument MODEL: the tokenizer of {str(folder)!r} does not load "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"argument MODEL: {str(path)!r} is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"argument MODEL: {str(path)!r} holds a {type(doc).__name__}, "
                         "expected a JSON object")
    return doc


def _folder_name(folder: Path) -> str:
    folder = folder.resolve()
    if folder.name in ("model", "models", "checkpoint") and folder.parent.name:
        return f"{folder.parent.name}"
    return folder.name or "model"


def load_subject(spec: str) -> Subject:
    """MODEL -> the loaded model and how inputs reach it (one-line UsageError otherwise)."""
    import torch

    from ..training.checkpoints import CheckpointError, load_model

    if spec in BUILTINS:
        what, build = BUILTINS[spec]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build().eval()
        desc = f"built-in model {spec!r}: {what}"
        source = {"kind": "builtin", "name": spec, "description": desc}
        if spec == "bert-tiny":
            vocab = [*_CHARS, _unknown()]
            sub = Subject(model, spec, desc, "text", max_len=128, label=f"model {spec!r}",
                          source=source)
            sub.encode = _char_encoder(vocab, 128, lambda ids: {"input_ids": ids})
            return sub
        sub = _training_subject(model, spec, desc)
        sub.label = f"model {spec!r}"
        sub.source = source
        return sub
    folder = Path(spec)
    if not folder.exists():
        raise UsageError(f"argument MODEL: {spec!r} is neither a built-in model "
                         f"({', '.join(BUILTINS)}) nor an existing folder")
    if not folder.is_dir():
        raise UsageError(f"argument MODEL: {spec!r} is a file; expected a built-in model name "
                         "or a model folder")
    name = _folder_name(folder)
    files = {p.name for p in folder.iterdir()}
    config = _read_json(folder / "config.json")
    checkpointed = "latest" in files or any(f.startswith("ckpt") for f in files)
    if "model.json" in files or (checkpointed and config is not None
                                 and "model_type" not in config):
        kind, key = (("checkpoint folder", "checkpoint") if "checkpoint.json" in files else
                     ("saved model folder", "saved") if "model.json" in files else
                     ("training run folder", "run"))
        try:
            model = load_model(folder)
        except CheckpointError as e:
            raise UsageError(f"argument MODEL: {kind} {spec!r} does not load: "
                             f"{' '.join(str(e).split())[:240]}") from None
        sub = _training_subject(model.eval(), name, f"{kind} {str(folder)!r}")
        sub.label = f"{kind} {spec!r}"
        sub.source = {"kind": key, "path": str(folder), "description": sub.what}
        return sub
    if config is not None and "model_type" in config:
        mtype = config["model_type"]
        if mtype not in HF_TYPES:
            raise UsageError(f"argument MODEL: folder {spec!r} has config.json with model_type "
                             f"{mtype!r}, expected one of {', '.join(HF_TYPES)}")
        model = _load_hf(folder, config)
        sub = _hf_subject(model, folder, name, f"Hugging Face {mtype} folder {str(folder)!r}",
                          f"Hugging Face {mtype} folder {spec!r}")
        sub.source = {"kind": "hf", "path": str(folder), "model_type": mtype,
                      "class": str(getattr(model.source, "hf_class", "")),
                      "description": sub.what}
        return sub
    if config is not None and "family" in config:
        raise UsageError(f"argument MODEL: folder {spec!r} has the config.json of a training "
                         "run but no complete checkpoint (latest, ckpt-*)")
    if config is not None:
        raise UsageError(f"argument MODEL: folder {spec!r} has a config.json without "
                         f"model_type (a Hugging Face folder's names one of "
                         f"{', '.join(HF_TYPES)}) or family (a training run's)")
    if checkpointed:
        raise UsageError(f"argument MODEL: folder {spec!r} holds a checkpoint (latest, ckpt-*) "
                         "without config.json (a training run folder has both)")
    if "model.safetensors" in files:
        raise UsageError(f"argument MODEL: folder {spec!r} holds model.safetensors without "
                         "model.json (a splitformer.save folder has both) or config.json (a "
                         "Hugging Face folder has both)")
    found = f" (it holds {', '.join(sorted(files)[:6])})" if files else " (it is empty)"
    raise UsageError(f"argument MODEL: folder {spec!r} holds no config.json, model.safetensors "
                     f"or checkpoint{found}")


def _load_hf(folder: Path, config: dict[str, Any]) -> Any:
    from ..interop.hf import FAMILIES, from_hf

    try:
        import transformers
    except ImportError:
        raise UsageError("argument MODEL: a Hugging Face folder needs transformers (pip install "
                         "'splitformer[hf]')") from None
    base = {"bert": "BertModel", "vit": "ViTModel", "cvt": "CvtModel", "gpt2": "GPT2Model"}
    archs = [a for a in (config.get("architectures") or []) if a in FAMILIES]
    cls_name = archs[0] if archs else base[config["model_type"]]
    verbosity = transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        hf = getattr(transformers, cls_name).from_pretrained(str(folder), local_files_only=True)
        return from_hf(hf.eval()).eval()
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"argument MODEL: the {cls_name} in {str(folder)!r} does not load "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()


# -- inputs -------------------------------------------------------------------------------------
def _resized_size(h: int, w: int, spec: ImageSpec) -> tuple[tuple[int, int], tuple[int, int]]:
    """((height, width) to resize to, (top, left) of the crop of spec's size), as the Hugging
    Face processors compute them: ``size`` (height, width) as is; ``shortest_edge`` s < 384:
    the short side to int(s / crop_pct), the long side to int(that * long / short), then the
    centre s x s crop; s >= 384: s x s, no crop."""
    if spec.shortest_edge is None:
        return (spec.height, spec.width), (0, 0)
    s = spec.shortest_edge
    if s >= 384:
        return (s, s), (0, 0)
    short_target = int(s / (spec.crop_pct if spec.crop_pct else 1.0))
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = short_target, int(short_target * long / short)
    size = (new_long, new_short) if w <= h else (new_short, new_long)
    return size, ((size[0] - spec.height) // 2, (size[1] - spec.width) // 2)


def _channels(x: Any, channels: int) -> Any:
    import torch

    c = x.shape[1]
    if c == channels:
        return x
    if c == 1:
        return x.expand(-1, channels, -1, -1)
    if channels == 1:
        if c == 3:
            w = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype)
            return (x * w.view(1, 3, 1, 1)).sum(1, keepdim=True)
        return x.mean(1, keepdim=True)
    return x[:, :1].expand(-1, channels, -1, -1)


def _resize_tensor(x: Any, size: tuple[int, int], resample: int) -> Any:
    """Images (N, C, H, W) in [0, 1] resized by Pillow's filter ``resample`` (each channel a
    32-bit float image), clipped to [0, 1] as an 8-bit image would be."""
    import numpy as np
    import torch
    from PIL import Image

    if tuple(x.shape[-2:]) == tuple(size):
        return x
    out = np.empty((*x.shape[:2], *size), dtype=np.float32)
    arr = x.detach().float().cpu().numpy()
    for i in range(arr.shape[0]):
        for c in range(arr.shape[1]):
            img = Image.fromarray(np.ascontiguousarray(arr[i, c]), mode="F")
            out[i, c] = np.asarray(img.resize((size[1], size[0]), resample=resample))
    return torch.from_numpy(out).clamp(0, 1).to(x.dtype)


def _prepare(x: Any, spec: ImageSpec, resized: bool) -> Any:
    """Images (N, C, H, W), pixel values / 255, not yet resized unless ``resized`` -> the
    model's channels and size, rescaled and normalised as ``spec`` says."""
    import torch

    x = _channels(x, spec.channels)
    if spec.do_resize and not resized:
        size, (top, left) = _resized_size(x.shape[-2], x.shape[-1], spec)
        x = _resize_tensor(x, size, spec.resample)
        x = x[..., top:top + spec.height, left:left + spec.width]
    factor = spec.rescale_factor * 255.0 if spec.do_rescale else 255.0
    if factor != 1.0:  # pixel values (0 .. 255) times rescale_factor
        x = x * factor
    x = x.contiguous()
    if spec.mean is not None and spec.std is not None:
        mean = torch.tensor(spec.mean, dtype=x.dtype)[: x.shape[1]].view(1, -1, 1, 1)
        std = torch.tensor(spec.std, dtype=x.dtype)[: x.shape[1]].view(1, -1, 1, 1)
        x = (x - mean) / std
    return x


def _fit_image(x: Any, spec: ImageSpec) -> Any:
    """Images (N, C, H, W) in [0, 1] (a data set's) -> the model's input, as ``spec`` says."""
    return _prepare(x, spec, resized=False)


def _fit_file_image(img: Any, spec: ImageSpec) -> Any:
    """A Pillow RGB image -> the model's input (1, C, H, W): resized and cropped on its 8-bit
    pixels by Pillow with spec's filter (as the Hugging Face processors do), then rescaled and
    normalised."""
    import numpy as np
    import torch

    if spec.do_resize:
        size, (top, left) = _resized_size(img.height, img.width, spec)
        if (img.height, img.width) != size:
            img = img.resize((size[1], size[0]), resample=spec.resample)
        img = img.crop((left, top, left + spec.width, top + spec.height))
    arr = np.asarray(img, dtype=np.float32) / 255.0
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1).unsqueeze(0)
    return _prepare(x, spec, resized=True)


_SIXTEEN = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # how Pillow opens a 16-bit grey PNG


def _read_image(path: str, notes: list[str]) -> tuple[Any, dict[str, Any]]:
    """The file as a Pillow RGB image (loaded) and what reading it did (for the input record);
    a note in ``notes`` for each change beyond decoding: a 16-bit image scaled to 8 bits, a
    transparent one composited onto white. An image larger than Pillow's decompression-bomb
    limit (``Image.MAX_IMAGE_PIXELS``) is refused."""
    import warnings

    p = Path(path)
    if not p.exists():
        raise UsageError(f"argument --image: {path!r} does not exist")
    if not p.is_file():
        raise UsageError(f"argument --image: {path!r} is not a file")
    try:
        import numpy as np
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise UsageError("argument --image: reading images needs Pillow (pip install "
                         "'splitformer[data]')") from None
    bomb = (Image.DecompressionBombWarning, Image.DecompressionBombError)
    info: dict[str, Any] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(p) as img:
                if img.format not in ("PNG", "JPEG"):
                    raise UsageError(f"argument --image: {path!r} is a {img.format} image; "
                                     "expected PNG or JPEG")
                info["mode"] = img.mode
                rawmode = img.tile[0][3] if img.tile and len(img.tile[0]) > 3 else None
                img.load()
                rgb = _to_rgb(img, info, rawmode, path, notes, np, Image)
    except UsageError:
        raise
    except bomb as e:
        limit = Image.MAX_IMAGE_PIXELS
        found = re.search(r"\((\d+) pixels\)", str(e))
        size = f"{int(found.group(1))} pixels, " if found else ""
        raise UsageError(f"argument --image: {path!r} is too large to read safely ({size}over "
                         f"Pillow's decompression-bomb limit of {limit} pixels); expected a "
                         "smaller image") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise UsageError(f"argument --image: {path!r} is not a readable PNG or JPEG image "
                         f"({type(e).__name__})") from None
    return rgb, info


def _to_rgb(img: Any, info: dict[str, Any], rawmode: Any, path: str, notes: list[str], np: Any,
            Image: Any) -> Any:
    """A loaded image as 8-bit RGB: 16-bit grey scaled (value / 257, rounded), transparency
    composited onto white; ``info`` gets bits and transparency, ``notes`` a line for each."""
    bits = 16 if img.mode in _SIXTEEN or (isinstance(rawmode, str) and ";16" in rawmode) else 8
    info["bits"] = bits
    transparent = None
    if img.mode in _SIXTEEN:
        arr = np.asarray(img, dtype=np.float64)
        if "transparency" in img.info and isinstance(img.info["transparency"], int):
            transparent = arr == img.info["transparency"]
        grey = np.clip(np.rint(arr / 257.0), 0, 255).astype(np.uint8)
        img = Image.fromarray(grey, "L")
        notes.append(f"argument --image: {path!r} has 16 bits per pixel (grey): scaled to 8 "
                     "bits (value / 257, rounded), as the model's input is prepared from "
                     "8-bit pixels")
    elif bits == 16:
        notes.append(f"argument --image: {path!r} has 16 bits per channel: read as 8 bits "
                     "(Pillow keeps the high byte), as the model's input is prepared from "
                     "8-bit pixels")
    if transparent is None and (img.mode in ("RGBA", "LA", "PA", "RGBa", "La")
                                or "transparency" in img.info):
        rgba = img.convert("RGBA")
        alpha = np.asarray(rgba.getchannel("A"))
        transparent = alpha < 255
        if transparent.any():
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            img = Image.alpha_composite(white, rgba)
        else:
            img = rgba
    elif transparent is not None and transparent.any():
        arr = np.asarray(img).copy()
        arr[transparent] = 255
        img = Image.fromarray(arr, "L")
    composited = transparent is not None and bool(transparent.any())
    info["transparency"] = "composited onto white" if composited else None
    if composited:
        share = float(transparent.mean())
        notes.append(f"argument --image: {path!r} is transparent in places "
                     f"({share:.1%} of its pixels not opaque): composited onto a white "
                     "background")
    return img.convert("RGB")


def _size_notes(width: int, height: int, spec: ImageSpec, flag: str) -> tuple[dict[str, Any],
                                                                                  list[str]]:
    """What resizing (and cropping) an image of width x height for ``spec`` does: record fields
    and notes (the aspect ratio changed; a part cropped away)."""
    if not spec.do_resize:
        return {"resized": False, "aspect_ratio_changed": False, "cropped": False}, []
    (h, w), _ = _resized_size(height, width, spec)
    changed = w * height != h * width
    cropped = (h, w) != (spec.height, spec.width)
    notes = []
    if changed:
        notes.append(f"argument {flag}: resized from {width}x{height} to {w}x{h} (aspect ratio "
                     "changed)")
    if cropped:
        notes.append(f"argument {flag}: resized to {w}x{h}, then the centre {spec.width}x"
                     f"{spec.height} cropped (as the model's image processor does)")
    return {"resized": (h, w) != (height, width), "aspect_ratio_changed": changed,
            "cropped": cropped}, notes



def _dataset(name: str, flag: str) -> Any:
    from ..training import DatasetError, load_dataset
    from ..training.data import DATASETS

    if name not in DATASETS:
        raise UsageError(f"argument --data: expected one of {sorted(DATASETS)}, got {name!r}")
    try:
        return load_dataset(name)
    except DatasetError as e:
        raise UsageError(f"argument {flag}: {' '.join(str(e).split())}") from None


def _preparation(spec: ImageSpec) -> dict[str, Any]:
    """How images were prepared, for the input record."""
    out = {"resample": RESAMPLE[spec.resample] if spec.do_resize else None,
           "rescale_factor": spec.rescale_factor if spec.do_rescale else None,
           "normalized": spec.mean is not None and spec.std is not None}
    if spec.config is not None or spec.defaults:  # a Hugging Face folder's processor
        out.update(preprocessor_config=spec.config, processor_defaults=spec.defaults)
    return out


def _shape_text(shape: list[int]) -> str:
    return " x ".join(str(v) for v in shape)


def _warn_truncated(flag: str, full: int, max_len: int) -> None:
    print(f"splitformer analyze: warning: argument {flag}: the text has {full} tokens and the "
          f"model takes at most {max_len}: the first {max_len} are analysed", file=sys.stderr)


def _channel_note(x: Any, channels: int, flag: str) -> list[str]:
    """A note when fitting the channels of images ``x`` (N, C, H, W) to the model's loses
    something: colour to one channel (luminance), or a first channel repeated."""
    c = int(x.shape[1])
    if c == channels or c == 1:
        return []
    colour = not all(bool((x[:, k] == x[:, 0]).all()) for k in range(1, c))
    if not colour:
        return []
    if channels == 1:
        how = ("luminance 0.299 R + 0.587 G + 0.114 B" if c == 3 else
               f"the mean of its {c} channels")
        return [f"argument {flag}: the colour image{'s are' if x.shape[0] > 1 else ' is'} "
                f"converted to the model's one channel ({how})"]
    return [f"argument {flag}: the first of the image's {c} channels is repeated to the "
            f"model's {channels} channels"]


def _note(notes: list[str], line: str) -> None:
    """A note: kept for the data's "notes" and printed as one line on stderr."""
    notes.append(line)
    print(f"splitformer analyze: note: {line}", file=sys.stderr)


def _image_prepared(sub: Subject, flag: str) -> list[str]:
    """The notes on how images are prepared for ``sub`` that do not depend on the image: the
    processor defaults a Hugging Face folder's preprocessor_config.json did not give."""
    spec = sub.image
    return [f"argument {flag}: {spec.defaults_note}"] if spec and spec.defaults_note else []


def _sample(sub: Subject, n: int, name: str, data_flag: str, notes: list[str]
            ) -> tuple[Any, dict[str, Any]]:
    """The first n test examples of data set ``name`` as the model's inputs, and the input
    record. That the data fits the model is checked before the count."""
    ds = _dataset(name, data_flag)
    shape = tuple(ds.input_shape or ())
    if ds.task == "lm":
        kind = "text"
    elif len(shape) == 3:
        kind = "image"
    else:
        kind = "series"
    if kind != sub.takes:
        raise UsageError(f"argument {data_flag}: data {name!r} holds {_NOUN[kind]}, but "
                         f"{sub.label} takes {_NOUN[sub.takes]}")
    if kind == "series" and sub.series_shape is not None and ds.test.x is not None and tuple(
            ds.test.x.shape[1:]) != tuple(sub.series_shape):
        raise UsageError(f"argument {data_flag}: data {name!r} has series of shape "
                         f"{tuple(ds.test.x.shape[1:])}, the model takes "
                         f"{tuple(sub.series_shape)}")
    record: dict[str, Any] = {"kind": "sample", "description": "", "data": name, "samples": n}
    if kind == "text":
        length = min(sub.max_len or 64, 64)
        ids = ds.test.x[: n * length]
        if len(ids) < n * length:
            raise UsageError(f"argument --sample: data {name!r} has too little test text for "
                             f"{plural(n, 'sample')} of {length} characters")
        vocab = ds.vocab
        texts = ["".join(vocab[int(i)] for i in ids[k * length:(k + 1) * length])
                 for k in range(n)]
        enc = sub.encode(texts, "--sample")
        inputs, full = enc.inputs, enc.full
        tokens = int((inputs["input_ids"] if isinstance(inputs, dict) else inputs[0]).shape[-1])
        record.update(characters=length, tokens=tokens, truncated=full > tokens)
        if full > tokens:
            record["tokens_before_truncation"] = full
            _warn_truncated("--sample", full, tokens)
        _unknown_record(record, enc, "--sample", notes)
        record["description"] = (f"--sample {n}: {_first(n, 'test sample')} of data "
                                 f"{name!r}, {plural(length, 'character')} and "
                                 f"{plural(tokens, 'token')} each")
        return inputs, record
    if len(ds.test.x) < n:
        raise UsageError(f"argument --sample: data {name!r} has only "
                         f"{plural(len(ds.test.x), 'test example')}, asked for {n}")
    x = ds.test.x[:n].float()
    if kind == "image":
        for line in _image_prepared(sub, "--sample"):
            _note(notes, line)
        for line in _channel_note(x, sub.image.channels, "--sample"):
            _note(notes, line)
        sized, lines = _size_notes(int(x.shape[-1]), int(x.shape[-2]), sub.image, "--sample")
        for line in lines:
            _note(notes, line)
        x = _fit_image(x, sub.image)
        fed = [int(v) for v in x.shape[1:]]
        record.update(shape=fed, **_preparation(sub.image), **sized)
        record["description"] = (f"--sample {n}: {_first(n, 'test image')} of data "
                                 f"{name!r}, fed as {_shape_text(fed)} (channels x height x "
                                 "width)")
    else:
        fed = [int(v) for v in x.shape[1:]]
        record["shape"] = fed
        series = _first(n, "test series", "test series")
        record["description"] = (f"--sample {n}: {series} of data {name!r}, each "
                                 f"{_shape_text(fed)}")
    return sub.inputs(x), record


def _first(n: int, noun: str, many: str | None = None) -> str:
    """ "the first test image", "the first 2 test images"."""
    return f"the first {noun}" if n == 1 else f"the first {plural(n, noun, many)}"


def _unknown_record(record: dict[str, Any], enc: Encoded, flag: str, notes: list[str]) -> None:
    """The count of what became the unknown mark, in the record and (when not 0) a note."""
    record[f"unknown_{enc.unknown_kind}"] = enc.unknown
    if not enc.unknown:
        return
    if enc.unknown_kind == "characters":
        _note(notes, f"argument {flag}: {plural(enc.unknown, 'character')} not in the model's "
                     f"vocabulary ({enc.unknown_what}) "
                     f"{'is' if enc.unknown == 1 else 'are'} analysed as its unknown mark")
    else:
        _note(notes, f"argument {flag}: the tokenizer made "
                     f"{plural(enc.unknown, 'unknown token')} ({enc.unknown_what}) of the text")


def _check_utf8(text: str, flag: str) -> None:
    """Text from the command line that was not valid UTF-8 holds surrogate escapes
    (U+DC80 .. U+DCFF, one per undecodable byte): refused."""
    for i, c in enumerate(text):
        if 0xD800 <= ord(c) <= 0xDFFF:
            byte = f" (byte 0x{ord(c) - 0xDC00:02x})" if 0xDC80 <= ord(c) <= 0xDCFF else ""
            raise UsageError(f"argument {flag}: not valid UTF-8: character {i + 1} is not "
                             f"text{byte}; expected UTF-8 text")


def _names_a_file(text: str) -> bool:
    if "\n" in text or "\0" in text or len(text) > 4096:
        return False
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def model_inputs(sub: Subject, args: argparse.Namespace, notes: list[str] | None = None
                 ) -> tuple[Any, dict[str, Any]]:
    """(inputs for analyze, the input record: kind, description and numbers) from --text /
    --image / --sample; each note on what was changed or assumed (a character outside the
    vocabulary, a resized aspect ratio, ...) goes to ``notes`` and to stderr."""
    notes = [] if notes is None else notes
    if args.data is not None and args.text is None and args.image is None:
        sample = args.sample or 1
    else:
        sample = args.sample
    if args.data is not None and (args.text is not None or args.image is not None):
        flag = "--text" if args.text is not None else "--image"
        raise UsageError(f"argument --data: only with --sample (not with {flag})")
    if args.text is not None:
        _check_utf8(args.text, "--text")
        if sub.takes != "text":
            raise UsageError(f"argument --text: {sub.label} takes {_NOUN[sub.takes]}; use "
                             f"{'--image FILE or ' if sub.takes == 'image' else ''}--sample N")
        if not args.text.strip():
            raise UsageError("argument --text: the text is empty")
        enc = sub.encode([args.text], "--text")
        inputs, full = enc.inputs, enc.full
        if _names_a_file(args.text):
            _note(notes, f"argument --text: {args.text!r} is also the name of a file; --text is "
                         "the text itself; to analyse a file's content use --text "
                         "\"$(cat FILE)\"")
        ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs[0]
        tokens = int(ids.shape[-1])
        record = {"kind": "text", "description": "", "characters": len(args.text),
                  "tokens": tokens, "max_tokens": sub.max_len, "truncated": full > tokens}
        text = (f"--text, {plural(len(args.text), 'character')}, "
                f"{plural(tokens, 'token')}")
        if full > tokens:
            record["tokens_before_truncation"] = full
            text += f" (truncated from {plural(full, 'token')})"
            _warn_truncated("--text", full, tokens)
        _unknown_record(record, enc, "--text", notes)
        record["description"] = text
        return inputs, record
    if args.image is not None:
        if sub.takes != "image":
            raise UsageError(f"argument --image: {sub.label} takes {_NOUN[sub.takes]}; use "
                             f"{'--text T or ' if sub.takes == 'text' else ''}--sample N")
        read_notes: list[str] = []
        img, info = _read_image(args.image, read_notes)
        for line in [*read_notes, *_image_prepared(sub, "--image")]:
            _note(notes, line)
        sized, lines = _size_notes(img.width, img.height, sub.image, "--image")
        x = _fit_file_image(img, sub.image)
        import numpy as np
        import torch

        rgb = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).unsqueeze(0)
        for line in [*_channel_note(rgb, sub.image.channels, "--image"), *lines]:
            _note(notes, line)
        fed = [int(v) for v in x.shape[1:]]
        record = {"kind": "image", "description": "", "file": str(args.image),
                  "width": int(img.width), "height": int(img.height), **info, "shape": fed,
                  **_preparation(sub.image), **sized}
        record["description"] = (f"--image {args.image}, {img.width} x {img.height} pixels, "
                                 f"fed as {_shape_text(fed)} (channels x height x width)")
        return sub.inputs(x), record
    if sample is None:
        if sub.data is None:
            first = {"text": "--text T", "image": "--image FILE"}.get(sub.takes)
            options = f"{first} or --sample N with --data NAME" if first else (
                "--sample N with --data NAME")
            raise UsageError(f"MODEL {args.model!r} needs an input: {options} (it knows no "
                             "data set of its own)")
        sample = 1
    name = args.data if args.data is not None else sub.data
    if name is None:
        raise UsageError(f"argument --sample: {sub.label} does not know its data set; add "
                         "--data NAME")
    return _sample(sub, sample, name, "--data" if args.data is not None else "--sample", notes)


# -- the run ------------------------------------------------------------------------------------
def _image_grid(sub: Subject) -> tuple[int, int] | None:
    """The patch grid of a ViT-family image model (rows, columns), when known: for a model of
    the training families, the patch size ``training.families`` gave it (``_patch`` of its
    recorded config)."""
    model = sub.model
    src = getattr(model, "source", None)
    if sub.takes != "image":
        return None
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
    patch = getattr(src, "patch_size", None)
    size = getattr(src, "image_size", None)
    if patch is not None and size is not None:
        return size[0] // patch[0], size[1] // patch[1]
    return None



def summary(data: dict[str, Any]) -> str:
    """The summary the command prints and the report shows, from the data alone (what
    ``--json`` prints): what MODEL was, the input, then ``analysis.diagnostics.summary_text``."""
    from ..analysis.diagnostics import summary_text

    return (f"model: {data['source']['description']}\ninput: {data['input']['description']}\n"
            f"{summary_text(data).rstrip()}")


def _sections(data: dict[str, Any], figs: list[Any]):
    from ..analysis.report import Section

    sections = [Section("Summary", summary(data) + "\n", pre=True, data="model"),
                Section("Model source", "What MODEL was.", data="source"),
                Section("Input", "What was analysed, with its numbers.", data="input")]
    if isinstance(data.get("activation"), dict):
        sections.append(Section("Activation", data="activation"))
    if figs:
        sections.append(Section("Figures", "Each figure's name, title, caption and files are "
                                "listed after the figures.", figures=figs, data="figures"))
    if "evolutions" in data:
        sections.append(Section("Evolutions", "Per step of each evolution: the state's norm, "
                                "its velocity, the Lipschitz estimate of the step map (with the "
                                "iterations it used and whether it converged), the mean cosine "
                                "similarity between its tokens and its effective rank; then "
                                "each attention substep's per-head entropy, and each substep's "
                                "increment, share, constraint residuals and FFN reading "
                                "(Definitions below).", data="evolutions"))
    if isinstance(data.get("lipschitz_settings"), dict):
        sections.append(Section("Lipschitz estimates", "How each step's Lipschitz estimate was "
                                "computed. The product of the estimates over the steps "
                                "estimates a bound on the norm of the Jacobian of u(0) -> u(T) "
                                "at this input only (chain rule); each factor estimates its "
                                "largest singular value from below, so the product is an "
                                "estimate, not a guaranteed bound.",
                                data="lipschitz_settings"))
    if data.get("notes"):
        sections.append(Section("Notes", "What preparing the input changed or assumed, why a "
                                 "quantity is missing (None) where it is, and which estimates "
                                 "did not converge.", data="notes"))
    if isinstance(data.get("definitions"), dict):
        sections.append(Section("Definitions", "What each quantity of the tables is.",
                                data="definitions"))
    return sections


def _figure_records(figs: list[Any]) -> list[dict[str, Any]]:
    return [{"name": f.name, "title": f.title, "caption": f.caption, "png": f.png.name,
             "svg": f.svg.name} for f in figs]


def _stale(out: Path, figs: list[Any]) -> list[str]:
    """The figure files an earlier analysis in ``out`` listed (in its diagnostics.json) that
    this one did not write; files of other names are left alone."""
    old = out / "diagnostics.json"
    try:
        doc = json.loads(old.read_text(encoding="utf-8")) if old.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    listed = doc.get("figures") if isinstance(doc, dict) else None
    if not isinstance(listed, list):
        return []
    keep = {p.name for f in figs for p in (f.png, f.svg)}
    stale = []
    for rec in listed:
        if not isinstance(rec, dict):
            continue
        for key in ("png", "svg"):
            name = rec.get(key)
            if isinstance(name, str) and name not in keep and Path(name).name == name \
                    and name.endswith((".png", ".svg")):
                stale.append(name)
    return stale


def run(args: argparse.Namespace) -> int:
    progress = Progress(total=4, enabled=not args.json and not args.no_progress)
    try:
        return _run(args, progress)
    except (UsageError, KeyboardInterrupt):
        progress.close()  # a usage error (or Ctrl-C's line) starts at the beginning of a line
        raise


def _run(args: argparse.Namespace, progress: Progress) -> int:
    if args.image is not None and not Path(args.image).exists():  # before loading anything
        raise UsageError(f"argument --image: {args.image!r} does not exist")
    if args.text is not None:
        _check_utf8(args.text, "--text")
    if args.out is not None:
        check_out(args.out)
    progress(f"loading {args.model}")
    sub = load_subject(args.model)
    out = check_out(args.out if args.out is not None else str(Path("analysis") / sub.name))
    notes: list[str] = []
    inputs, record = model_inputs(sub, args, notes)

    from ..analysis.checks import ArgumentError
    from ..analysis.diagnostics import analyze
    from ..analysis.figures import draw
    from ..analysis.report import write_report

    stage = None
    try:
        progress("analysing the evolution")
        try:
            diag = analyze(sub.model, inputs, lipschitz_iterations=args.lipschitz_iterations,
                           lipschitz_tol=args.lipschitz_tol, seed=0)
        except ArgumentError as e:
            if e.argument == "model":
                raise UsageError(f"argument MODEL: {sub.label}: "
                                 f"{' '.join(e.detail.split())[:240]}") from None
            if e.argument != "inputs":
                raise
            flag = ("--text" if args.text is not None else "--image" if args.image is not None
                    else "--sample")
            raise UsageError(f"argument {flag}: the model refuses this input: "
                             f"{' '.join(e.detail.split())[:240]}") from None
        progress("drawing figures")
        stage = Staging(out)
        figs = draw(diag, stage.folder, image_grid=_image_grid(sub))
        stale = _stale(out, figs)
        diag_data = diag.as_dict()
        data = {"source": sub.source, "input": record,
                **{**diag_data, "notes": [*notes, *diag_data["notes"]]},
                "figures": _figure_records(figs)}
        progress("writing the report")
        report = (out / "index.html").resolve()
        data["report"] = str(report)
        write_report(stage.folder, f"splitformer analyze {args.model}", _sections(data, figs),
                     data)
        (stage.folder / "diagnostics.json").write_text(json.dumps(data, indent=1) + "\n")
        stage.commit([*(p.name for f in figs for p in (f.png, f.svg)), "diagnostics.json",
                      "index.html"])
        stage = None
        for name in stale:
            (out / name).unlink(missing_ok=True)
    except BaseException as e:
        if stage is not None:
            stage.discard()
        if isinstance(e, (UsageError, KeyboardInterrupt)) or not isinstance(e, Exception):
            raise
        progress.close()
        print(f"splitformer analyze: error: {type(e).__name__}: "
              f"{' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 1
    progress.close()
    if args.json:
        print(json.dumps(data))
    else:
        print(summary(data))
        print(f"report: {report}")
    return 0
