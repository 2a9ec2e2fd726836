"""`splitformer analyze`: diagnostics of a model's evolution on real inputs, as an HTML report.

MODEL is one of

* a built-in model (``BUILTINS``: small random-weight models built in code, seeded with 0);
* a folder written by ``splitformer.save`` (``model.json`` + ``model.safetensors``);
* a ``splitformer train`` run folder (``config.json`` and a checkpoint: ``latest`` /
  ``ckpt-*``): its newest complete checkpoint, rebuilt from the recorded source;
* a local Hugging Face folder (``config.json`` with ``model_type`` bert, vit, cvt or gpt2, as
  ``save_pretrained`` writes it): ``splitformer.from_hf``; nothing is downloaded, ever.

The input is one of ``--text T`` (the checkpoint's own tokenizer for a Hugging Face text model,
characters of the model's vocabulary for the others), ``--image FILE`` (PNG or JPEG, resized
and normalised as the checkpoint's ``preprocessor_config.json`` says, or to the model's input
shape) and ``--sample N`` (the first N test examples of the model's data set, or of
``--data NAME``); without one, a model that knows its data set takes ``--sample 1``.

Writes DIR/index.html (the report: figures inlined, no external asset), DIR/diagnostics.json
(what ``--json`` prints) and the figures (PNG and SVG); DIR defaults to
``analysis/<model name>``. Prints the summary and the report's path; ``--json`` prints
``diagnostics.as_dict()`` with ``"report"`` (the path of index.html) as one JSON object.
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

HELP = ("diagnose a model's evolution (norms, velocities, Lipschitz bounds, ranks, attention) "
        "on real inputs into a self-contained HTML report")

HF_TYPES = ("bert", "vit", "cvt", "gpt2")
_NOUN = {"text": "text", "image": "images", "series": "series"}
MAX_SAMPLES = 256

# characters of the built-in text models: newline and printable ASCII, then the unknown mark
_CHARS = ("\n", *string.printable[:95])


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
    p.add_argument("--lipschitz-iterations", default=10, metavar="K",
                   type=bounded_int(1000, "(power iterations)"),
                   help="power iterations of each Lipschitz estimate (default 10)")
    p.add_argument("--json", action="store_true",
                   help="print the diagnostics (and the report's path) as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


# -- what a model takes -------------------------------------------------------------------------
@dataclass
class ImageSpec:
    channels: int
    height: int
    width: int
    mean: tuple[float, ...] | None = None  # None: pixels stay in [0, 1]
    std: tuple[float, ...] | None = None
    shortest_edge: int | None = None  # resize the short side, then crop height x width
    crop_pct: float | None = None


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
    encode: Callable[[list[str]], Any] | None = None  # text -> model inputs
    series_shape: tuple[int, ...] | None = None
    max_len: int | None = None
    label: str = ""  # for messages (default: what)

    def __post_init__(self) -> None:
        self.label = self.label or self.what


def _char_encoder(vocab: list[str], max_len: int, wrap: Callable[[Any], dict],
                  flag: str = "--text") -> Callable[[list[str]], Any]:
    import torch

    index = {c: i for i, c in enumerate(vocab)}
    unk = index.get(_unknown())

    def encode(texts: list[str]) -> Any:
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
        return out

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

        def encode(texts: list[str]) -> dict:
            tok = _tokenizer(folder)
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token or tok.unk_token
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
            return out

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
    if cls.startswith("Cvt"):
        mean_d, std_d = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    else:
        mean_d, std_d = (0.5,) * 3, (0.5,) * 3
    normalize = pre.get("do_normalize", True)
    mean = tuple(pre.get("image_mean", mean_d)) if normalize else None
    std = tuple(pre.get("image_std", std_d)) if normalize else None
    spec = ImageSpec(channels, h, w, mean, std, shortest_edge=shortest,
                     crop_pct=pre.get("crop_pct") if shortest else None)
    return Subject(model, name, what, "image", image=spec, label=label)


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
        if spec == "bert-tiny":
            vocab = [*_CHARS, _unknown()]
            sub = Subject(model, spec, desc, "text", max_len=128, label=f"model {spec!r}")
            sub.encode = _char_encoder(vocab, 128, lambda ids: {"input_ids": ids})
            return sub
        sub = _training_subject(model, spec, desc)
        sub.label = f"model {spec!r}"
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
        kind = ("checkpoint folder" if "checkpoint.json" in files else "saved model folder"
                if "model.json" in files else "training run folder")
        try:
            model = load_model(folder)
        except CheckpointError as e:
            raise UsageError(f"argument MODEL: {kind} {spec!r} does not load: "
                             f"{' '.join(str(e).split())[:240]}") from None
        sub = _training_subject(model.eval(), name, f"{kind} {str(folder)!r}")
        sub.label = f"{kind} {spec!r}"
        return sub
    if config is not None and "model_type" in config:
        mtype = config["model_type"]
        if mtype not in HF_TYPES:
            raise UsageError(f"argument MODEL: folder {spec!r} has config.json with model_type "
                             f"{mtype!r}, expected one of {', '.join(HF_TYPES)}")
        model = _load_hf(folder, config)
        return _hf_subject(model, folder, name, f"Hugging Face {mtype} folder {str(folder)!r}",
                           f"Hugging Face {mtype} folder {spec!r}")
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
def _fit_image(x: Any, spec: ImageSpec) -> Any:
    """Images (N, C, H, W) in [0, 1] -> the model's channels, size and normalisation."""
    import torch
    import torch.nn.functional as F

    c = x.shape[1]
    if c != spec.channels:
        if c == 1:
            x = x.expand(-1, spec.channels, -1, -1)
        elif spec.channels == 1:
            w = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype)[:c] if c == 3 else None
            x = (x * w.view(1, 3, 1, 1)).sum(1, keepdim=True) if w is not None else x.mean(
                1, keepdim=True)
        else:
            x = x[:, :1].expand(-1, spec.channels, -1, -1)
    if spec.shortest_edge is not None:
        pct = spec.crop_pct if spec.crop_pct else 1.0
        short = int(spec.shortest_edge / pct) if spec.shortest_edge < 384 else spec.shortest_edge
        h, w = x.shape[-2:]
        scale = short / min(h, w)
        size = (max(short, round(h * scale)), max(short, round(w * scale)))
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
        top, left = (size[0] - spec.height) // 2, (size[1] - spec.width) // 2
        x = x[..., top:top + spec.height, left:left + spec.width]
    elif tuple(x.shape[-2:]) != (spec.height, spec.width):
        x = F.interpolate(x, size=(spec.height, spec.width), mode="bilinear",
                          align_corners=False, antialias=True)
    x = x.clamp(0, 1).contiguous()
    if spec.mean is not None and spec.std is not None:
        mean = torch.tensor(spec.mean, dtype=x.dtype)[: x.shape[1]].view(1, -1, 1, 1)
        std = torch.tensor(spec.std, dtype=x.dtype)[: x.shape[1]].view(1, -1, 1, 1)
        x = (x - mean) / std
    return x


def _read_image(path: str) -> Any:
    import numpy as np
    import torch

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
            arr = np.asarray(rgb, dtype=np.float32) / 255.0
    except UsageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise UsageError(f"argument --image: {path!r} is not a readable PNG or JPEG image "
                         f"({type(e).__name__})") from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).unsqueeze(0)


def _dataset(name: str, flag: str) -> Any:
    from ..training import DatasetError, load_dataset
    from ..training.data import DATASETS

    if name not in DATASETS:
        raise UsageError(f"argument --data: expected one of {sorted(DATASETS)}, got {name!r}")
    try:
        return load_dataset(name)
    except DatasetError as e:
        raise UsageError(f"argument {flag}: {' '.join(str(e).split())}") from None


def _sample(sub: Subject, n: int, name: str, data_flag: str) -> tuple[Any, str]:
    """The first n test examples of data set ``name`` as the model's inputs."""
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
    if kind == "text":
        length = min(sub.max_len or 64, 64)
        ids = ds.test.x[: n * length]
        if len(ids) < n * length:
            raise UsageError(f"argument --sample: data {name!r} has too little test text for "
                             f"{n} samples of {length} characters")
        vocab = ds.vocab
        texts = ["".join(vocab[int(i)] for i in ids[k * length:(k + 1) * length])
                 for k in range(n)]
        return sub.encode(texts), f"{n} test samples of data {name!r} ({length} characters each)"
    if len(ds.test.x) < n:
        raise UsageError(f"argument --sample: data {name!r} has only {len(ds.test.x)} test "
                         f"examples, asked for {n}")
    x = ds.test.x[:n].float()
    if kind == "image":
        x = _fit_image(x, sub.image)
        desc = f"{n} test images of data {name!r} as {tuple(x.shape[1:])}"
    else:
        if sub.series_shape is not None and tuple(x.shape[1:]) != tuple(sub.series_shape):
            raise UsageError(f"argument {data_flag}: data {name!r} has series of shape "
                             f"{tuple(x.shape[1:])}, the model takes {tuple(sub.series_shape)}")
        desc = f"{n} test series of data {name!r}"
    return sub.inputs(x), desc


def model_inputs(sub: Subject, args: argparse.Namespace) -> tuple[Any, str]:
    """(inputs for analyze, a one-line description) from --text / --image / --sample."""
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
        inputs = sub.encode([args.text])
        ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs[0]
        return inputs, f"--text ({len(args.text)} characters, {ids.shape[-1]} tokens)"
    if args.image is not None:
        if sub.takes != "image":
            raise UsageError(f"argument --image: {sub.label} takes {_NOUN[sub.takes]}; use "
                             f"{'--text T or ' if sub.takes == 'text' else ''}--sample N")
        x = _fit_image(_read_image(args.image), sub.image)
        return sub.inputs(x), f"--image {args.image} as {tuple(x.shape[1:])}"
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
    """The patch grid of a ViT-family image model (rows, columns), when known."""
    model = sub.model
    src = getattr(model, "source", None)
    if sub.takes != "image":
        return None
    if isinstance(src, dict) and src.get("family") == "vit" and sub.image is not None:
        p = src["config"].get("patch") or max(1, min(sub.image.height, sub.image.width) // 4)
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


def _sections(sub: Subject, desc: str, diag: Any, figs: list[Any], data: dict[str, Any]):
    from ..analysis.report import Section

    summary = f"model: {sub.what}\ninput: {desc}\n\n{diag.summary().rstrip()}\n"
    sections = [Section("Summary", summary, pre=True,
                        data="model" if "model" in data else None)]
    if isinstance(data.get("activation"), dict):
        sections.append(Section("Activation", data="activation"))
    if figs:
        sections.append(Section("Figures", figures=figs))
    if "evolutions" in data:
        sections.append(Section("Evolutions", "Per step of each evolution: the state's norm, "
                                "its velocity, the Lipschitz estimate of the step map, the "
                                "mean cosine similarity between its tokens, its effective rank "
                                "and the entropy of each attention head; then each substep's "
                                "increment, share, constraint residuals and FFN active "
                                "fraction (Definitions below).", data="evolutions"))
    if data.get("notes"):
        sections.append(Section("Notes", "Why a quantity is missing (None) where it is.",
                                data="notes"))
    if isinstance(data.get("definitions"), dict):
        sections.append(Section("Definitions", "What each quantity of the tables is.",
                                data="definitions"))
    return sections


def run(args: argparse.Namespace) -> int:
    if args.image is not None and not Path(args.image).exists():  # before loading anything
        raise UsageError(f"argument --image: {args.image!r} does not exist")
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"argument --out: {args.out!r} is a file, expected a folder")
    progress = Progress(total=4, enabled=not args.json and not args.no_progress)
    progress(f"loading {args.model}")
    sub = load_subject(args.model)
    out = _check_out(args, sub.name)
    inputs, desc = model_inputs(sub, args)

    from ..analysis.checks import ArgumentError
    from ..analysis.diagnostics import analyze
    from ..analysis.figures import draw
    from ..analysis.report import write_report

    try:
        progress("analysing the evolution")
        try:
            diag = analyze(sub.model, inputs, lipschitz_iterations=args.lipschitz_iterations,
                           seed=0)
        except ArgumentError as e:
            if e.argument != "inputs":
                raise
            flag = ("--text" if args.text is not None else "--image" if args.image is not None
                    else "--sample")
            progress.close()
            raise UsageError(f"argument {flag}: the model refuses this input: "
                             f"{' '.join(e.detail.split())[:240]}") from None
        out.mkdir(parents=True, exist_ok=True)
        progress("drawing figures")
        figs = draw(diag, out, image_grid=_image_grid(sub))
        data = dict(diag.as_dict())
        progress("writing the report")
        report = (out / "index.html").resolve()
        data["report"] = str(report)
        write_report(out, f"splitformer analyze {args.model}",
                     _sections(sub, desc, diag, figs, data), data)
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
        print(f"model: {sub.what}\ninput: {desc}")
        print(diag.summary().rstrip())
        print(f"report: {report}")
    return 0

