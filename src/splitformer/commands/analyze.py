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
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import UsageError, bounded_int, stripped
from .progress import Progress

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
    # texts -> (model inputs, the longest text's token count before truncation)
    encode: Callable[[list[str]], tuple[Any, int]] | None = None
    series_shape: tuple[int, ...] | None = None
    max_len: int | None = None
    label: str = ""  # for messages (default: what)
    source: dict[str, Any] | None = None  # what MODEL was, for the data (``"source"``)

    def __post_init__(self) -> None:
        self.label = self.label or self.what


def _char_encoder(vocab: list[str], max_len: int, wrap: Callable[[Any], dict],
                  flag: str = "--text") -> Callable[[list[str]], Any]:
    import torch

    index = {c: i for i, c in enumerate(vocab)}
    unk = index.get(_unknown())

    def encode(texts: list[str]) -> tuple[Any, int]:
        rows = []
        for t in texts:
            ids = []
            for c in t[:max_len]:
                if c in index:
                    ids.append(index[c])
                elif unk is not None:
                    ids.append(unk)
                else:
                    raise UsageError(f"argument {flag}: character {c!r} is not in the model's "
                                     "vocabulary")
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
        return out, max(len(t) for t in texts)

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

        def encode(texts: list[str]) -> tuple[dict, int]:
            tok = _tokenizer(folder)
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token or tok.unk_token
            full = max(len(ids) for ids in _quiet(tok, texts)["input_ids"])
            enc = tok(texts, return_tensors="pt", padding=True, truncation=True,
                      max_length=max_len)
            out = {k: v for k, v in enc.items() if k in params}
            ids = out["input_ids"]
            if ids.numel() == 0 or ids.shape[-1] == 0:
                raise UsageError(f"argument --text: the tokenizer of {str(folder)!r} makes no "
                                 "token of the text")
            if vocab_size is not None and int(ids.max()) >= int(vocab_size):
                raise UsageError(f"argument --text: the tokenizer of {str(folder)!r} gives "
                                 f"token id {int(ids.max())}, but the model's vocabulary has "
                                 f"{vocab_size} ids")
            if "attention_mask" in out and bool(out["attention_mask"].all()):
                del out["attention_mask"]
            return out, full

        sub.encode = encode
        return sub
    pre = _read_json(folder / "preprocessor_config.json") or {}
    channels = int(config.get("num_channels") or 3)
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
    # the defaults of ConvNextImageProcessor (CvT's) and ViTImageProcessor for a missing key
    resample_d, crop_d = (3, 224 / 256) if cls.startswith("Cvt") else (2, None)
    mean_d = std_d = (0.5,) * 3
    normalize = pre.get("do_normalize", True)
    mean = tuple(pre.get("image_mean", mean_d)) if normalize else None
    std = tuple(pre.get("image_std", std_d)) if normalize else None
    resample = pre.get("resample", resample_d)
    if resample not in RESAMPLE:
        raise UsageError(f"argument MODEL: {str(folder / 'preprocessor_config.json')!r} has "
                         f"resample {resample!r}, expected one of {sorted(RESAMPLE)} (Pillow's "
                         "filters)")
    factor = pre.get("rescale_factor", 1 / 255)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise UsageError(f"argument MODEL: {str(folder / 'preprocessor_config.json')!r} has "
                         f"rescale_factor {factor!r}, expected a number > 0")
    spec = ImageSpec(channels, h, w, mean, std, shortest_edge=shortest,
                     crop_pct=pre.get("crop_pct", crop_d) if shortest else None,
                     do_resize=bool(pre.get("do_resize", True)), resample=int(resample),
                     do_rescale=bool(pre.get("do_rescale", True)),
                     rescale_factor=float(factor))
    return Subject(model, name, what, "image", image=spec, label=label)


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


def _tokenizer(folder: Path) -> Any:
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise UsageError(f"argument --text: {str(folder)!r} holds no tokenizer (none of "
                         f"{', '.join(TOKENIZER_FILES)}); save_pretrained the tokenizer there")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise UsageError(f"argument --text: the tokenizer of {str(folder)!r} does not load "
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


def _read_image(path: str) -> Any:
    """The file as a Pillow RGB image (loaded)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"argument --image: {path!r} does not exist")
    if not p.is_file():
        raise UsageError(f"argument --image: {path!r} is not a file")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise UsageError("argument --image: reading images needs Pillow (pip install "
                         "'splitformer[data]')") from None
    try:
        with Image.open(p) as img:
            if img.format not in ("PNG", "JPEG"):
                raise UsageError(f"argument --image: {path!r} is a {img.format} image; expected "
                                 "PNG or JPEG")
            rgb = img.convert("RGB")
            rgb.load()
    except UsageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise UsageError(f"argument --image: {path!r} is not a readable PNG or JPEG image "
                         f"({type(e).__name__})") from None
    return rgb


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
    return {"resample": RESAMPLE[spec.resample] if spec.do_resize else None,
            "rescale_factor": spec.rescale_factor if spec.do_rescale else None,
            "normalized": spec.mean is not None and spec.std is not None}


def _shape_text(shape: list[int]) -> str:
    return " x ".join(str(v) for v in shape)


def _warn_truncated(flag: str, full: int, max_len: int) -> None:
    print(f"splitformer analyze: warning: argument {flag}: the text has {full} tokens and the "
          f"model takes at most {max_len}: the first {max_len} are analysed", file=sys.stderr)


def _sample(sub: Subject, n: int, name: str, data_flag: str) -> tuple[Any, dict[str, Any]]:
    """The first n test examples of data set ``name`` as the model's inputs, and the input
    record."""
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
    record: dict[str, Any] = {"kind": "sample", "description": "", "data": name, "samples": n}
    if kind == "text":
        length = min(sub.max_len or 64, 64)
        ids = ds.test.x[: n * length]
        if len(ids) < n * length:
            raise UsageError(f"argument --sample: data {name!r} has too little test text for "
                             f"{n} samples of {length} characters")
        vocab = ds.vocab
        texts = ["".join(vocab[int(i)] for i in ids[k * length:(k + 1) * length])
                 for k in range(n)]
        inputs, full = sub.encode(texts)
        tokens = int((inputs["input_ids"] if isinstance(inputs, dict) else inputs[0]).shape[-1])
        record.update(characters=length, tokens=tokens, truncated=full > tokens)
        if full > tokens:
            record["tokens_before_truncation"] = full
            _warn_truncated("--sample", full, tokens)
        record["description"] = (f"--sample {n}: the first {n} test samples of data {name!r}, "
                                 f"{length} characters and {tokens} tokens each")
        return inputs, record
    if len(ds.test.x) < n:
        raise UsageError(f"argument --sample: data {name!r} has only {len(ds.test.x)} test "
                         f"examples, asked for {n}")
    x = ds.test.x[:n].float()
    if kind == "image":
        x = _fit_image(x, sub.image)
        fed = [int(v) for v in x.shape[1:]]
        record.update(shape=fed, **_preparation(sub.image))
        record["description"] = (f"--sample {n}: the first {n} test images of data {name!r}, "
                                 f"fed as {_shape_text(fed)} (channels x height x width)")
    else:
        if sub.series_shape is not None and tuple(x.shape[1:]) != tuple(sub.series_shape):
            raise UsageError(f"argument {data_flag}: data {name!r} has series of shape "
                             f"{tuple(x.shape[1:])}, the model takes {tuple(sub.series_shape)}")
        fed = [int(v) for v in x.shape[1:]]
        record["shape"] = fed
        record["description"] = (f"--sample {n}: the first {n} test series of data {name!r}, "
                                 f"each {_shape_text(fed)}")
    return sub.inputs(x), record


def model_inputs(sub: Subject, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """(inputs for analyze, the input record: kind, description and numbers) from --text /
    --image / --sample."""
    if args.data is not None and args.text is None and args.image is None:
        sample = args.sample or 1
    else:
        sample = args.sample
    if args.data is not None and (args.text is not None or args.image is not None):
        flag = "--text" if args.text is not None else "--image"
        raise UsageError(f"argument --data: only with --sample (not with {flag})")
    if args.text is not None:
        if sub.takes != "text":
            raise UsageError(f"argument --text: {sub.label} takes {_NOUN[sub.takes]}; use "
                             f"{'--image FILE or ' if sub.takes == 'image' else ''}--sample N")
        if not args.text.strip():
            raise UsageError("argument --text: the text is empty")
        inputs, full = sub.encode([args.text])
        ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs[0]
        tokens = int(ids.shape[-1])
        record = {"kind": "text", "description": "", "characters": len(args.text),
                  "tokens": tokens, "max_tokens": sub.max_len, "truncated": full > tokens}
        text = f"--text, {len(args.text)} characters, {tokens} tokens"
        if full > tokens:
            record["tokens_before_truncation"] = full
            text += f" (truncated from {full} tokens)"
            _warn_truncated("--text", full, tokens)
        record["description"] = text
        return inputs, record
    if args.image is not None:
        if sub.takes != "image":
            raise UsageError(f"argument --image: {sub.label} takes {_NOUN[sub.takes]}; use "
                             f"{'--text T or ' if sub.takes == 'text' else ''}--sample N")
        img = _read_image(args.image)
        x = _fit_file_image(img, sub.image)
        fed = [int(v) for v in x.shape[1:]]
        record = {"kind": "image", "description": "", "file": str(args.image),
                  "width": int(img.width), "height": int(img.height), "shape": fed,
                  **_preparation(sub.image)}
        record["description"] = (f"--image {args.image}, {img.width} x {img.height} pixels, "
                                 f"fed as {_shape_text(fed)} (channels x height x width)")
        return sub.inputs(x), record
    if sample is None:
        if sub.data is None:
            first = {"text": "--text T", "image": "--image FILE"}.get(sub.takes)
            flag = "--" + {"text": "text", "image": "image"}.get(sub.takes, "sample")
            options = f"{first}, or --sample N --data NAME" if first else "--sample N --data NAME"
            raise UsageError(f"argument {flag}: {sub.label} does not know its data set; give "
                             f"an input: {options}")
        sample = 1
    name = args.data if args.data is not None else sub.data
    if name is None:
        raise UsageError(f"argument --sample: {sub.label} does not know its data set; add "
                         "--data NAME")
    return _sample(sub, sample, name, "--data" if args.data is not None else "--sample")


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


def _check_out(args: argparse.Namespace, name: str) -> Path:
    out = Path(args.out) if args.out else Path("analysis") / name
    if out.exists() and not out.is_dir():
        raise UsageError(f"argument --out: {str(out)!r} is a file, expected a folder")
    return out


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
        sections.append(Section("Notes", "Why a quantity is missing (None) where it is, and "
                                 "which estimates did not converge.", data="notes"))
    if isinstance(data.get("definitions"), dict):
        sections.append(Section("Definitions", "What each quantity of the tables is.",
                                data="definitions"))
    return sections


def _figure_records(figs: list[Any]) -> list[dict[str, Any]]:
    return [{"name": f.name, "title": f.title, "caption": f.caption, "png": f.png.name,
             "svg": f.svg.name} for f in figs]


def _remove_stale(out: Path, figs: list[Any]) -> None:
    """Remove the figure files an earlier analysis in ``out`` listed that this one did not
    write (files of other names are left alone)."""
    old = out / "diagnostics.json"
    try:
        doc = json.loads(old.read_text(encoding="utf-8")) if old.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return
    listed = doc.get("figures") if isinstance(doc, dict) else None
    if not isinstance(listed, list):
        return
    keep = {p.name for f in figs for p in (f.png, f.svg)}
    for rec in listed:
        if not isinstance(rec, dict):
            continue
        for key in ("png", "svg"):
            name = rec.get(key)
            if isinstance(name, str) and name not in keep and Path(name).name == name \
                    and name.endswith((".png", ".svg")):
                (out / name).unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    progress = Progress(total=4, enabled=not args.json and not args.no_progress)
    try:
        return _run(args, progress)
    except UsageError:
        progress.close()  # a usage error starts at the beginning of a clean line
        raise


def _run(args: argparse.Namespace, progress: Progress) -> int:
    if args.image is not None and not Path(args.image).exists():  # before loading anything
        raise UsageError(f"argument --image: {args.image!r} does not exist")
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"argument --out: {args.out!r} is a file, expected a folder")
    progress(f"loading {args.model}")
    sub = load_subject(args.model)
    out = _check_out(args, sub.name)
    inputs, record = model_inputs(sub, args)

    from ..analysis.checks import ArgumentError
    from ..analysis.diagnostics import analyze
    from ..analysis.figures import draw
    from ..analysis.report import write_report

    try:
        progress("analysing the evolution")
        try:
            diag = analyze(sub.model, inputs, lipschitz_iterations=args.lipschitz_iterations,
                           lipschitz_tol=args.lipschitz_tol, seed=0)
        except ArgumentError as e:
            if e.argument != "inputs":
                raise
            flag = ("--text" if args.text is not None else "--image" if args.image is not None
                    else "--sample")
            raise UsageError(f"argument {flag}: the model refuses this input: "
                             f"{' '.join(e.detail.split())[:240]}") from None
        out.mkdir(parents=True, exist_ok=True)
        progress("drawing figures")
        figs = draw(diag, out, image_grid=_image_grid(sub))
        _remove_stale(out, figs)
        data = {"source": sub.source, "input": record, **diag.as_dict(),
                "figures": _figure_records(figs)}
        progress("writing the report")
        report = (out / "index.html").resolve()
        data["report"] = str(report)
        write_report(out, f"splitformer analyze {args.model}", _sections(data, figs), data)
        (out / "diagnostics.json").write_text(json.dumps(data, indent=1) + "\n")
    except UsageError:
        raise
    except Exception as e:
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
