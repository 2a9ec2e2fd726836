"""The inputs of an analysis: ``--text``, ``--image``, ``--sample`` or ``--corpus`` made into
what the subject's model takes (``model_inputs``), with the input record (kind, description and
numbers, the data's ``"input"``).

``--corpus`` is real running text that ships offline (``default_text``: the King James text's
first ``VERSES`` verses joined, or without it gensim's Lee corpus), cut to its first ``tokens``
tokens (``DEFAULT_TOKENS`` by default; a special token the tokenizer puts last, such as BERT's
[SEP], is kept last: ``cut_tokens``). A causal language model that knows no data set of its
own (a Llama-family decoder, a GGUF) reads it when no input is given, with a note: a decoder
reads running text.

A text is encoded by the subject (its tokenizer, or the characters of its vocabulary) and
truncated to the model's length (a warning); an image file is read and prepared
(``subjects.images``); a sample is the first N test examples of a data set of
``training.data`` that fits the model (checked before the count). What is changed or assumed
is a note (``subjects.subject.Notes``); what cannot be analysed an ``InputError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .images import (
    channel_note,
    fit_file_image,
    fit_image,
    image_prepared,
    preparation,
    read_image,
    size_notes,
)
from .subject import Encoded, InputError, Notes, Subject, plural

__all__ = ["DEFAULT_TOKENS", "VERSES", "check_utf8", "cut_tokens", "default_text",
           "model_inputs"]

VERSES = 100  # King James verses joined into the default text
DEFAULT_TOKENS = 256  # tokens of --corpus

_NOUN = {"text": "text", "image": "images", "series": "series"}


def model_inputs(sub: Subject, *, text: str | None = None, image: str | None = None,
                 sample: int | None = None, data: str | None = None, model: str = "",
                 notes: Notes | None = None, corpus: bool = False,
                 tokens: int | None = None) -> tuple[Any, dict[str, Any]]:
    """(inputs for analyze, the input record) from one of ``text`` (--text), ``image`` (a
    file, --image), ``sample`` (--sample N, of data set ``data`` or the subject's own) and
    ``corpus`` (--corpus: the offline text cut to ``tokens`` tokens, module docstring);
    ``data`` alone means ``sample=1``; ``model`` is MODEL as given, for a message. Without an
    input a causal language model that knows no data set reads the corpus (a note). Each note
    on what was changed or assumed goes to ``notes``."""
    notes = Notes() if notes is None else notes
    if data is not None and (text is not None or image is not None or corpus):
        flag = "--text" if text is not None else "--image" if image is not None else "--corpus"
        raise InputError(f"argument --data: only with --sample (not with {flag})")
    if tokens is not None and not corpus and (text is not None or image is not None
                                              or sample is not None or data is not None
                                              or not _reads_corpus(sub)):
        raise InputError("argument --tokens: only with --corpus (the offline text; the "
                         "default input of a causal language model)")
    if text is not None:
        return _text_input(sub, text, notes)
    if image is not None:
        return _image_input(sub, image, notes)
    if corpus:
        return _corpus_input(sub, tokens, "--corpus", notes)
    if data is not None:
        sample = sample or 1
    if sample is None and _reads_corpus(sub):
        notes.note(f"no input given: {sub.label} is a causal language model that knows no data "
                   "set, so it reads the offline corpus (--corpus; --text T for another text)")
        return _corpus_input(sub, tokens, "--corpus", notes)
    if sample is None:
        if sub.data is None:
            first = {"text": "--text T", "image": "--image FILE"}.get(sub.takes)
            options = f"{first} or --sample N with --data NAME" if first else (
                "--sample N with --data NAME")
            raise InputError(f"MODEL {model!r} needs an input: {options} (it knows no "
                             "data set of its own)")
        sample = 1
    name = data if data is not None else sub.data
    if name is None:
        raise InputError(f"argument --sample: {sub.label} does not know its data set; add "
                         "--data NAME")
    return _sample(sub, sample, name, "--data" if data is not None else "--sample", notes)


def _text_input(sub: Subject, text: str, notes: Notes) -> tuple[Any, dict[str, Any]]:
    check_utf8(text, "--text")
    if sub.takes != "text":
        raise InputError(f"argument --text: {sub.label} takes {_NOUN[sub.takes]}; use "
                         f"{'--image FILE or ' if sub.takes == 'image' else ''}--sample N")
    if not text.strip():
        raise InputError("argument --text: the text is empty")
    enc = sub.encode([text], "--text")
    inputs, full = enc.inputs, enc.full
    if _names_a_file(text):
        notes.note(f"argument --text: {text!r} is also the name of a file; --text is the text "
                   "itself; to analyse a file's content use --text \"$(cat FILE)\"")
    ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs[0]
    tokens = int(ids.shape[-1])
    record = {"kind": "text", "description": "", "characters": len(text),
              "tokens": tokens, "max_tokens": sub.max_len, "truncated": full > tokens}
    description = f"--text, {plural(len(text), 'character')}, {plural(tokens, 'token')}"
    if full > tokens:
        record["tokens_before_truncation"] = full
        description += f" (truncated from {plural(full, 'token')})"
        _warn_truncated(notes, "--text", full, tokens)
    _unknown_record(record, enc, "--text", notes)
    record["description"] = description
    return inputs, record


def _image_input(sub: Subject, image: str, notes: Notes) -> tuple[Any, dict[str, Any]]:
    if sub.takes != "image":
        raise InputError(f"argument --image: {sub.label} takes {_NOUN[sub.takes]}; use "
                         f"{'--text T or ' if sub.takes == 'text' else ''}--sample N")
    read_notes: list[str] = []
    img, info = read_image(image, read_notes)
    for line in [*read_notes, *image_prepared(sub, "--image")]:
        notes.note(line)
    sized, lines = size_notes(img.width, img.height, sub.image, "--image")
    x = fit_file_image(img, sub.image)
    import numpy as np
    import torch

    rgb = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).unsqueeze(0)
    for line in [*channel_note(rgb, sub.image.channels, "--image"), *lines]:
        notes.note(line)
    fed = [int(v) for v in x.shape[1:]]
    record = {"kind": "image", "description": "", "file": str(image),
              "width": int(img.width), "height": int(img.height), **info, "shape": fed,
              **preparation(sub.image), **sized}
    record["description"] = (f"--image {image}, {img.width} x {img.height} pixels, "
                             f"fed as {_shape_text(fed)} (channels x height x width)")
    return sub.inputs(x), record


def _reads_corpus(sub: Subject) -> bool:
    """Whether ``sub`` reads the corpus when no input is given: a causal language model over
    text that knows no data set of its own."""
    if sub.takes != "text" or sub.data is not None:
        return False
    from ..models.causal import CausalDecoderModel

    return isinstance(sub.model, CausalDecoderModel)


def default_text() -> tuple[str, str]:
    """(text, what it is): the King James text's first ``VERSES`` verses joined, else gensim's
    Lee corpus (its 50 documents joined); InputError when neither is installed."""
    from ..experiments import text_benchmarks as tb
    from ..training.data import DatasetError

    try:
        return " ".join(tb.kjv_verses()[:VERSES]), f"the King James text (verses 1-{VERSES})"
    except DatasetError:
        pass
    try:
        return " ".join(tb.lee_documents()), "gensim's Lee corpus (50 documents)"
    except DatasetError:
        raise InputError("argument --corpus: the offline text needs the King James text or "
                         "gensim's test data (`make data`); give --text T") from None


def _ids(inputs: Any) -> Any:
    return inputs["input_ids"] if isinstance(inputs, dict) else inputs[0]


def cut_tokens(sub: Subject, inputs: Any, n: int) -> Any:
    """The encoded ``inputs`` (a dict or tuple of (B, L) tensors) cut to their first ``n``
    tokens; a special last token that the subject's encoder puts after every text (two
    one-word texts end with the same id: BERT's [SEP]) stays last."""
    import torch

    length = int(_ids(inputs).shape[-1])
    a = _ids(sub.encode(["a"], "--corpus").inputs)[0]
    b = _ids(sub.encode(["b"], "--corpus").inputs)[0]
    suffix = len(a) >= 2 and int(a[-1]) == int(b[-1])
    n = min(int(n), length)

    def one(v: Any) -> Any:
        if not isinstance(v, torch.Tensor) or v.dim() != 2 or v.shape[-1] != length:
            return v
        return torch.cat([v[:, :n - 1], v[:, -1:]], dim=1) if suffix else v[:, :n]

    if isinstance(inputs, dict):
        return {k: one(v) for k, v in inputs.items()}
    return tuple(one(v) for v in inputs)


def _corpus_input(sub: Subject, tokens: int | None, flag: str, notes: Notes
                  ) -> tuple[Any, dict[str, Any]]:
    """The offline text (``default_text``) cut to ``tokens`` tokens, and its record."""
    if sub.takes != "text":
        raise InputError(f"argument {flag}: {sub.label} takes {_NOUN[sub.takes]}; use "
                         f"{'--image FILE or ' if sub.takes == 'image' else ''}--sample N")
    text, what = default_text()
    enc = sub.encode([text], flag)
    available = int(_ids(enc.inputs).shape[-1])
    n = DEFAULT_TOKENS if tokens is None else int(tokens)
    if tokens is not None and tokens > available:
        most = (f" (the model reads at most {sub.max_len})" if available == sub.max_len
                else "")
        raise InputError(f"argument --tokens: {what} has {plural(available, 'token')}{most}, "
                         f"got {tokens}")
    n = min(n, available)
    inputs = cut_tokens(sub, enc.inputs, n)
    record = {"kind": "corpus", "description": "", "source": what, "tokens": n,
              "available_tokens": available, "max_tokens": sub.max_len}
    _unknown_record(record, enc, flag, notes)  # counted over the whole encoded text
    record["description"] = (f"--corpus: {what}, its first {plural(n, 'token')} (of "
                             f"{available})")
    return inputs, record


def _kind(ds: Any) -> str:
    """What a data set holds: "text" (a language model's), "image" (C x H x W) or "series"."""
    if ds.task == "lm":
        return "text"
    return "image" if len(tuple(ds.input_shape or ())) == 3 else "series"


def _sample(sub: Subject, n: int, name: str, data_flag: str, notes: Notes
            ) -> tuple[Any, dict[str, Any]]:
    """The first n test examples of data set ``name`` as the model's inputs, and the input
    record. That the data fits the model is checked before the count."""
    ds = _dataset(name, data_flag)
    kind = _kind(ds)
    if kind != sub.takes:
        raise InputError(f"argument {data_flag}: data {name!r} holds {_NOUN[kind]}, but "
                         f"{sub.label} takes {_NOUN[sub.takes]}")
    if kind == "series" and sub.series_shape is not None and ds.test.x is not None and tuple(
            ds.test.x.shape[1:]) != tuple(sub.series_shape):
        raise InputError(f"argument {data_flag}: data {name!r} has series of shape "
                         f"{tuple(ds.test.x.shape[1:])}, the model takes "
                         f"{tuple(sub.series_shape)}")
    record: dict[str, Any] = {"kind": "sample", "description": "", "data": name, "samples": n}
    if kind == "text":
        return _text_sample(sub, ds, n, name, record, notes)
    if len(ds.test.x) < n:
        raise InputError(f"argument --sample: data {name!r} has only "
                         f"{plural(len(ds.test.x), 'test example')}, asked for {n}")
    x = ds.test.x[:n].float()
    if kind == "image":
        x = _image_sample(sub, x, n, name, record, notes)
    else:
        fed = [int(v) for v in x.shape[1:]]
        record["shape"] = fed
        series = _first(n, "test series", "test series")
        record["description"] = (f"--sample {n}: {series} of data {name!r}, each "
                                 f"{_shape_text(fed)}")
    return sub.inputs(x), record


def _text_sample(sub: Subject, ds: Any, n: int, name: str, record: dict[str, Any],
                 notes: Notes) -> tuple[Any, dict[str, Any]]:
    """n texts of min(max_len, 64) characters, one after the other from the test text."""
    length = min(sub.max_len or 64, 64)
    ids = ds.test.x[: n * length]
    if len(ids) < n * length:
        raise InputError(f"argument --sample: data {name!r} has too little test text for "
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
        _warn_truncated(notes, "--sample", full, tokens)
    _unknown_record(record, enc, "--sample", notes)
    record["description"] = (f"--sample {n}: {_first(n, 'test sample')} of data "
                             f"{name!r}, {plural(length, 'character')} and "
                             f"{plural(tokens, 'token')} each")
    return inputs, record


def _image_sample(sub: Subject, x: Any, n: int, name: str, record: dict[str, Any],
                  notes: Notes) -> Any:
    """A data set's images (N, C, H, W) in [0, 1] fitted to the model, the record filled."""
    for line in image_prepared(sub, "--sample"):
        notes.note(line)
    for line in channel_note(x, sub.image.channels, "--sample"):
        notes.note(line)
    sized, lines = size_notes(int(x.shape[-1]), int(x.shape[-2]), sub.image, "--sample")
    for line in lines:
        notes.note(line)
    x = fit_image(x, sub.image)
    fed = [int(v) for v in x.shape[1:]]
    record.update(shape=fed, **preparation(sub.image), **sized)
    record["description"] = (f"--sample {n}: {_first(n, 'test image')} of data "
                             f"{name!r}, fed as {_shape_text(fed)} (channels x height x "
                             "width)")
    return x


def _first(n: int, noun: str, many: str | None = None) -> str:
    """ "the first test image", "the first 2 test images"."""
    return f"the first {noun}" if n == 1 else f"the first {plural(n, noun, many)}"


def _unknown_record(record: dict[str, Any], enc: Encoded, flag: str, notes: Notes) -> None:
    """The count of what became the unknown mark, in the record and (when not 0) a note."""
    record[f"unknown_{enc.unknown_kind}"] = enc.unknown
    if not enc.unknown:
        return
    if enc.unknown_kind == "characters":
        notes.note(f"argument {flag}: {plural(enc.unknown, 'character')} not in the model's "
                   f"vocabulary ({enc.unknown_what}) "
                   f"{'is' if enc.unknown == 1 else 'are'} analysed as its unknown mark")
    else:
        notes.note(f"argument {flag}: the tokenizer made "
                   f"{plural(enc.unknown, 'unknown token')} ({enc.unknown_what}) of the text")


def check_utf8(text: str, flag: str) -> None:
    """Text from the command line that was not valid UTF-8 holds surrogate escapes
    (U+DC80 .. U+DCFF, one per undecodable byte): refused."""
    for i, c in enumerate(text):
        if 0xD800 <= ord(c) <= 0xDFFF:
            byte = f" (byte 0x{ord(c) - 0xDC00:02x})" if 0xDC80 <= ord(c) <= 0xDCFF else ""
            raise InputError(f"argument {flag}: not valid UTF-8: character {i + 1} is not "
                             f"text{byte}; expected UTF-8 text")


def _names_a_file(text: str) -> bool:
    if "\n" in text or "\0" in text or len(text) > 4096:
        return False
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def _dataset(name: str, flag: str) -> Any:
    from ..training import DatasetError, load_dataset
    from ..training.data import DATASETS

    if name not in DATASETS:
        raise InputError(f"argument --data: expected one of {sorted(DATASETS)}, got {name!r}")
    try:
        return load_dataset(name)
    except DatasetError as e:
        raise InputError(f"argument {flag}: {' '.join(str(e).split())}") from None


def _shape_text(shape: list[int]) -> str:
    return " x ".join(str(v) for v in shape)


def _warn_truncated(notes: Notes, flag: str, full: int, max_len: int) -> None:
    notes.warn(f"argument {flag}: the text has {full} tokens and the model takes at most "
               f"{max_len}: the first {max_len} are analysed")

