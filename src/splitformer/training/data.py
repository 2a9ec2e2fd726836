"""Real data sets, offline: what a training run learns from.

A ``Dataset`` holds a train and a test ``Split`` of tensors and says what they are:

* task "classify": x is an image batch (N, C, H, W) in [0, 1] or a series (N, L) / (N, L, C),
  y the class labels (N,) as int64; ``num_classes`` and ``input_shape`` (x's shape without N);
  ``classes`` names the labels (label i is ``classes[i]``);
* task "lm": x is one long 1-D int64 tensor of character ids (y is None); ``vocab`` lists the
  characters, id i is ``vocab[i]``.

``load_dataset(name, data_dir=None)`` is the one way in; ``DATASETS`` maps names to loaders.
Nothing is downloaded, ever: every set ships inside an installed package, and a missing one is a
``DatasetError`` that names the package and ``make data`` (which installs them all: Debian's
``dataset-fashion-mnist`` and ``sword-text-kjv`` with apt-get, ``aeon`` with pip --no-deps).
``data_dir`` replaces the package's folder by one holding the same files. Decoded files are
cached per process (keyed by path, size and modification time); every call returns fresh
tensors, so a caller may change them in place.

The sets
--------

``digits``: scikit-learn's bundled 8 x 8 digits (1797 images, 10 classes). Split: stratified
random, 20% of each class's images (drawn by a generator seeded with 0) is the test set (1433
train / 364 test). x = pixels / 16, shape (N, 1, 8, 8). Takes no ``data_dir``.

``fashion-mnist``: the full Fashion-MNIST (Zalando, MIT licence), 60000 train / 10000 test
images of 28 x 28 in 10 classes (6000 / 1000 of each), the official split. Files: the four idx
files ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``, ``t10k-images-idx3-ubyte.gz``,
``t10k-labels-idx1-ubyte.gz`` (gzipped or not) in ``/usr/share/datasets/fashion-mnist``, from
Debian's package ``dataset-fashion-mnist`` (30 MB), read with numpy and gzip. x = pixels / 255
as float32, shape (N, 1, 28, 28); y in file order. Classes: ``FASHION_MNIST_CLASSES``.

``text``: the King James Bible (1769 standard text, public domain outside the UK, where the
Crown's letters patent restrict printing), for character-level language modelling. Files: the
SWORD module ``engKJV2006eb`` (zText: zlib-compressed books ``ot.bzz``/``nt.bzz``, their index
``*.bzs`` and the verse index ``*.bzv``) in ``/usr/share/sword/modules/texts/ztext/engKJV2006eb``,
from Debian's package ``sword-text-kjv`` (3 MB). Preprocessing: each entry of the verse index in
canonical order (Genesis to Revelation; the book titles and Psalm 119's section titles are
entries too, a Psalm's title opens its verse 1) has its footnotes (``<note>`` elements: the
translators' marginal notes) removed, then every other OSIS tag and the 27 stray USFM markers
(``\\nd``) dropped, XML entities decoded and runs of white space collapsed to one space; the
non-empty entries are joined with "\\n" (one verse a line) and a final "\\n": 4,153,304
characters, 31,169 lines (``¶`` paragraph marks, ``’``, ``æ`` and the Hebrew letters of Psalm
119 are kept). Split: the first 90% of the characters (``int(0.9 * len)``: 3,737,973) is
train, the rest (415,331, from Acts 22:5) test. Vocabulary: the sorted set of the train part's
characters (89), then the fallback ``UNKNOWN`` ("\\ufffd") as the last id (90 ids); a test
character that the train part lacks maps to it (here "[" and "]", once each). ``unigram_bpc``:
the train-set unigram baseline is 4.374 bits per character on the test part.

``series``: ItalyPowerDemand from the UCR archive (Keogh et al.; Italy's electricity demand,
24 hourly values a day; classes: days from October to March vs April to September), the
archive's official split of 67 train (34 / 33) and 1029 test (513 / 516) series, univariate: x
has shape (N, 24).
Files: ``ItalyPowerDemand_TRAIN.ts`` / ``_TEST.ts`` (sktime/aeon ``.ts`` format) bundled in the
PyPI package ``aeon`` (BSD-3, ``aeon/datasets/data/ItalyPowerDemand``; ``sktime``'s copy is used
when aeon is absent). aeon is installed with ``pip --no-deps`` and never imported: the loader
finds the package folder and parses the text files itself.

``basic-motions``: BasicMotions from the UEA multivariate archive (a smart watch's 3-axis
accelerometer and gyroscope while standing, running, walking, playing badminton), 4 classes
(10 train and 10 test series each), the official 40 / 40 split, 6 channels of length 100:
x has shape (N, 100, 6). Files: ``BasicMotions_TRAIN.ts`` / ``_TEST.ts`` from the same package.

Series labels: ids 0..K-1 in the order of the file's ``@classLabel`` header (``classes``).
Standardisation: per channel, x <- (x - mean) / std with the mean and std over all train
series and time points (the test split uses the train statistics; a zero std is taken as 1).
ItalyPowerDemand's series are already z-normalised one by one in the archive, so this is close
to the identity there.
"""

from __future__ import annotations

import functools
import gzip
import html
import importlib.util
import math
import os
import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["DATASETS", "FASHION_MNIST_CLASSES", "UNKNOWN", "Dataset", "DatasetError", "Split",
           "load_dataset", "unigram_bpc"]


class DatasetError(ValueError):
    """A data set that cannot be loaded here: the message says what to install or pass."""


@dataclass(frozen=True)
class Split:
    x: torch.Tensor
    y: torch.Tensor | None

    def __len__(self) -> int:
        return len(self.x) if self.y is not None else 0


@dataclass(frozen=True)
class Dataset:
    name: str
    task: str  # "classify" or "lm"
    train: Split
    test: Split
    num_classes: int | None = None
    input_shape: tuple[int, ...] | None = None
    vocab: tuple[str, ...] | None = None
    source: str = ""  # where the files came from (package, path)
    classes: tuple[str, ...] | None = None  # classify: label i is classes[i]

    @property
    def vocab_size(self) -> int | None:
        return len(self.vocab) if self.vocab is not None else None


MAKE_DATA = "`make data`"


def _missing(name: str, what: str, where: Path | None, install: str) -> DatasetError:
    found = "not installed" if where is None else f"{where} not found"
    return DatasetError(f"data {name!r} needs {what} ({found}): run {MAKE_DATA} (it runs "
                        f"{install}), or give --data-dir (data_dir in Python and TOML) a "
                        "folder with these files")


def _data_dir(name: str, data_dir: str | os.PathLike | None, files: tuple[str, ...],
              default: Path | None, missing: Callable[[Path | None], DatasetError]) -> Path:
    """The folder to read: ``data_dir`` (checked) or the package's ``default`` folder."""
    if data_dir is None:
        if default is None or not default.is_dir():
            raise missing(default)
        return default
    if not isinstance(data_dir, (str, os.PathLike)) or not str(data_dir).strip():
        raise DatasetError(f"data_dir must be a folder path (str) or None, got {data_dir!r}")
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DatasetError(f"data_dir {str(data_dir)!r} is not a folder (data {name!r} reads "
                           f"{', '.join(files)} from it)")
    return folder


def _find(folder: Path, stem: str, *, gz: bool) -> Path | None:
    for candidate in ((stem + ".gz", stem) if gz else (stem,)):
        if (folder / candidate).is_file():
            return folder / candidate
    return None


def _key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


# ------------------------------------------------------------------------------------------
# digits


def _digits(data_dir: str | None = None) -> Dataset:
    """scikit-learn's bundled 8 x 8 digits (1797 images, 10 classes): a fixed stratified random
    split, 20% of each class's images (chosen by a generator seeded with 0) is the test set;
    pixels / 16. (A split by file order puts other writers in the test set: an SVC scores 0.94
    there against 0.98 on a random split.)"""
    if data_dir is not None:
        raise DatasetError(f"data 'digits' ships inside scikit-learn and reads no data_dir "
                           f"(got data_dir={data_dir!r})")
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - installed by the project's dev/data extras
        raise DatasetError("data 'digits' needs scikit-learn (pip install scikit-learn)") from e
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    test = torch.zeros(len(y), dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    for c in range(10):
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        test[idx[int(0.8 * len(idx)):]] = True
    return Dataset("digits", "classify", Split(x[~test], y[~test]), Split(x[test], y[test]),
                   num_classes=10, input_shape=(1, 8, 8), source="sklearn.datasets.load_digits",
                   classes=tuple(str(c) for c in range(10)))


# ------------------------------------------------------------------------------------------
# Fashion-MNIST

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")
_FASHION_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                  "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


@functools.lru_cache(maxsize=8)
def _idx(key: tuple[str, int, int]) -> np.ndarray:
    """An idx file (unsigned bytes) as a read-only array of its shape."""
    path = Path(key[0])
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DatasetError(f"cannot read idx file {path}: {e}") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise DatasetError(f"{path} is not an idx file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path} is truncated (no room for its {ndim} dimensions)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    if len(raw) - header != math.prod(shape):
        raise DatasetError(f"{path} holds {len(raw) - header} bytes of data, its header "
                           f"says {shape} ({math.prod(shape)})")
    a = np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)
    a.flags.writeable = False
    return a


def _fashion_mnist(data_dir: str | None = None) -> Dataset:
    stems = [s for pair in _FASHION_FILES.values() for s in pair]
    folder = _data_dir("fashion-mnist", data_dir, tuple(s + "[.gz]" for s in stems),
                       FASHION_MNIST_DIR,
                       lambda where: _missing("fashion-mnist", "Debian's package "
                                              "dataset-fashion-mnist", where,
                                              "apt-get install -y dataset-fashion-mnist"))
    splits = {}
    for part, (images_stem, labels_stem) in _FASHION_FILES.items():
        paths = [_find(folder, s, gz=True) for s in (images_stem, labels_stem)]
        for stem, p in zip((images_stem, labels_stem), paths, strict=True):
            if p is None:
                hint = ("" if data_dir is not None else
                        f"; reinstall Debian's package dataset-fashion-mnist ({MAKE_DATA})")
                raise DatasetError(f"data 'fashion-mnist': {stem}.gz (or {stem}) not found in "
                                   f"{folder}{hint}")
        images, labels = (_idx(_key(p)) for p in paths)
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DatasetError(f"data 'fashion-mnist': {paths[0].name} {images.shape} and "
                               f"{paths[1].name} {labels.shape} are not N images and N labels")
        if len(labels) and labels.max() > 9:
            raise DatasetError(f"data 'fashion-mnist': {paths[1]} has labels outside 0..9")
        x = torch.from_numpy(images.astype(np.float32)).unsqueeze(1).div_(255.0)
        y = torch.from_numpy(labels.astype(np.int64))
        splits[part] = Split(x, y)
    shape = tuple(splits["train"].x.shape[1:])
    if tuple(splits["test"].x.shape[1:]) != shape:
        raise DatasetError(f"data 'fashion-mnist': train images {shape[1:]} and test images "
                           f"{tuple(splits['test'].x.shape[2:])} differ in size")
    return Dataset("fashion-mnist", "classify", splits["train"], splits["test"], num_classes=10,
                   input_shape=shape, source=f"dataset-fashion-mnist: {folder}",
                   classes=FASHION_MNIST_CLASSES)


# ------------------------------------------------------------------------------------------
# text: the King James Bible from the SWORD module of Debian's sword-text-kjv

KJV_DIR = Path("/usr/share/sword/modules/texts/ztext/engKJV2006eb")
UNKNOWN = "\ufffd"  # the fallback character: test characters not in the train part map to it
TEXT_TRAIN_FRACTION = 0.9
_NOTE = re.compile(r"<note\b[^>]*?(?:/>|>.*?</note\s*>)", re.S)
_TAG = re.compile(r"<[^>]*>")
_USFM = re.compile(r"\\\+?[a-z]+[0-9]*\*?")


def _ztext_testament(folder: Path, part: str) -> list[str]:
    """The raw entries (OSIS markup) of one testament of a SWORD zText module, in order."""
    paths = {ext: folder / f"{part}.{ext}" for ext in ("bzs", "bzv", "bzz")}
    try:
        bzs, bzv, bzz = (paths[e].read_bytes() for e in ("bzs", "bzv", "bzz"))
    except OSError as e:
        raise DatasetError(f"data 'text': cannot read {e.filename}: {e.strerror}") from e
    if len(bzs) % 12 or len(bzv) % 10:
        raise DatasetError(f"data 'text': {paths['bzs']} or {paths['bzv']} is truncated "
                           "(not whole index entries)")
    blocks = []
    for off, size, usize in struct.iter_unpack("<III", bzs):
        try:
            block = zlib.decompress(bzz[off:off + size]) if size else b""
        except zlib.error as e:
            raise DatasetError(f"data 'text': {paths['bzz']} is corrupt at byte {off}: "
                               f"{e}") from e
        if len(block) != usize:
            raise DatasetError(f"data 'text': a block of {paths['bzz']} decompresses to "
                               f"{len(block)} bytes, its index says {usize}")
        blocks.append(block)
    entries = []
    for block, off, size in struct.iter_unpack("<IIH", bzv):
        if size == 0:
            continue
        if block >= len(blocks) or off + size > len(blocks[block]):
            raise DatasetError(f"data 'text': {paths['bzv']} points outside {paths['bzz']}")
        try:
            entries.append(blocks[block][off:off + size].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise DatasetError(f"data 'text': {paths['bzz']} is not UTF-8: {e}") from e
    return entries


def _plain(entry: str) -> str:
    s = _USFM.sub("", html.unescape(_TAG.sub("", _NOTE.sub("", entry))))
    return " ".join(s.split())


@functools.lru_cache(maxsize=2)
def _kjv_text(keys: tuple[tuple[str, int, int], ...]) -> str:
    folder = Path(keys[0][0]).parent
    parts = sorted({Path(k[0]).stem for k in keys}, key=("ot", "nt").index)
    lines = [s for part in parts for s in map(_plain, _ztext_testament(folder, part)) if s]
    if not lines:
        raise DatasetError(f"data 'text': the SWORD module in {folder} holds no text")
    return "\n".join(lines) + "\n"


def _text(data_dir: str | None = None) -> Dataset:
    files = ("ot.bzs", "ot.bzv", "ot.bzz", "nt.bzs", "nt.bzv", "nt.bzz")
    folder = _data_dir("text", data_dir, files, KJV_DIR,
                       lambda where: _missing("text", "the King James Bible of Debian's "
                                              "package sword-text-kjv", where,
                                              "apt-get install -y sword-text-kjv"))
    parts = [p for p in ("ot", "nt") if (folder / f"{p}.bzz").is_file()]
    if not parts:
        hint = ("" if data_dir is not None else
                f"; reinstall Debian's package sword-text-kjv ({MAKE_DATA})")
        raise DatasetError(f"data 'text': no SWORD zText module (ot.bzz/nt.bzz with their .bzs "
                           f"and .bzv) in {folder}{hint}")
    keys = []
    for p in parts:
        for ext in ("bzs", "bzv", "bzz"):
            if not (folder / f"{p}.{ext}").is_file():
                raise DatasetError(f"data 'text': {folder / f'{p}.{ext}'} not found (a SWORD "
                                   f"zText module needs {p}.bzs, {p}.bzv and {p}.bzz)")
            keys.append(_key(folder / f"{p}.{ext}"))
    text = _kjv_text(tuple(keys))
    n = int(TEXT_TRAIN_FRACTION * len(text))
    if n < 1 or n >= len(text):
        raise DatasetError(f"data 'text': {len(text)} characters are too few to split")
    train, test = text[:n], text[n:]
    chars = sorted(set(train))
    vocab = tuple(chars) if UNKNOWN in chars else (*chars, UNKNOWN)
    fallback = vocab.index(UNKNOWN)
    points = np.array([ord(c) for c in chars], dtype=np.uint32)  # sorted: ids 0..len(chars)-1

    def ids(s: str) -> torch.Tensor:
        code = np.frombuffer(s.encode("utf-32-le"), dtype=np.uint32)
        i = np.minimum(np.searchsorted(points, code), len(points) - 1)
        return torch.from_numpy(np.where(points[i] == code, i, fallback).astype(np.int64))

    return Dataset("text", "lm", Split(ids(train), None), Split(ids(test), None), vocab=vocab,
                   source=f"sword-text-kjv (King James Bible): {folder}")


# ------------------------------------------------------------------------------------------
# series: UCR/UEA .ts files bundled in aeon (or sktime)


def _ts_package_dir(problem: str) -> Path | None:
    """``<aeon or sktime>/datasets/data/<problem>`` without importing the package."""
    for package in ("aeon", "sktime"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        for root in spec.submodule_search_locations:
            folder = Path(root) / "datasets" / "data" / problem
            if folder.is_dir():
                return folder
    return None


@functools.lru_cache(maxsize=8)
def _read_ts(key: tuple[str, int, int]) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    """A .ts file of equal-length series: (values (N, C, L) float64, class labels, label ids)."""
    path = Path(key[0])
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"cannot read {path}: {e}") from e
    labels: tuple[str, ...] | None = None
    rows, ys, data = [], [], False
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not data:
            words = line.split()
            tag = words[0].lower()
            if tag == "@classlabel":
                if len(words) < 3 or words[1].lower() != "true":
                    raise DatasetError(f"{path}:{number}: not a classification file "
                                       "(@classLabel must be true with the labels)")
                labels = tuple(words[2:])
            elif tag in ("@timestamps", "@missing") and words[1:2] == ["true"]:
                raise DatasetError(f"{path}:{number}: {words[0]} true is not supported")
            elif tag == "@equallength" and words[1:2] == ["false"]:
                raise DatasetError(f"{path}: series of unequal length are not supported")
            elif tag == "@data":
                data = True
            continue
        fields = line.split(":")
        if labels is None or len(fields) < 2:
            raise DatasetError(f"{path}:{number}: expected 'values:...:label' after @classLabel")
        if fields[-1] not in labels:
            raise DatasetError(f"{path}:{number}: label {fields[-1]!r} is not one of {labels}")
        try:
            row = [[float(v) for v in f.split(",")] for f in fields[:-1]]
        except ValueError as e:
            raise DatasetError(f"{path}:{number}: {e}") from e
        if rows and [len(r) for r in row] != [len(r) for r in rows[0]]:
            raise DatasetError(f"{path}:{number}: channels or length differ from the first "
                               "series (unequal lengths are not supported)")
        rows.append(row)
        ys.append(labels.index(fields[-1]))
    if not rows or labels is None:
        raise DatasetError(f"{path} holds no series (no @classLabel/@data section)")
    x = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(x).all():
        raise DatasetError(f"{path}: missing or non-finite values are not supported")
    x.flags.writeable = False
    y = np.asarray(ys, dtype=np.int64)
    y.flags.writeable = False
    return x, labels, y


def _ts_dataset(name: str, problem: str, data_dir: str | None) -> Dataset:
    files = (f"{problem}_TRAIN.ts", f"{problem}_TEST.ts")
    default = _ts_package_dir(problem)
    folder = _data_dir(name, data_dir, files, default,
                       lambda where: _missing(name, f"the .ts files of {problem} bundled in the "
                                              "PyPI package aeon (or sktime)", where,
                                              "pip install --no-deps aeon"))
    loaded = []
    for f in files:
        if not (folder / f).is_file():
            raise DatasetError(f"data {name!r}: {f} not found in {folder}")
        loaded.append(_read_ts(_key(folder / f)))
    (xtr, labels, ytr), (xte, labels_te, yte) = loaded
    if labels_te != labels or xte.shape[1:] != xtr.shape[1:]:
        raise DatasetError(f"data {name!r}: {files[0]} and {files[1]} differ in classes or "
                           f"shape ({labels} {xtr.shape[1:]} vs {labels_te} {xte.shape[1:]})")
    mean = xtr.mean(axis=(0, 2), keepdims=True)
    std = xtr.std(axis=(0, 2), keepdims=True)
    std[std == 0] = 1.0

    def tensor(x: np.ndarray) -> torch.Tensor:
        z = ((x - mean) / std).astype(np.float32).transpose(0, 2, 1)  # (N, L, C)
        t = torch.from_numpy(np.ascontiguousarray(z))
        return t.squeeze(-1) if t.shape[-1] == 1 else t

    train = Split(tensor(xtr), torch.from_numpy(ytr.copy()))
    test = Split(tensor(xte), torch.from_numpy(yte.copy()))
    return Dataset(name, "classify", train, test, num_classes=len(labels),
                   input_shape=tuple(train.x.shape[1:]), source=f"{problem}: {folder}",
                   classes=labels)


def _series(data_dir: str | None = None) -> Dataset:
    return _ts_dataset("series", "ItalyPowerDemand", data_dir)


def _basic_motions(data_dir: str | None = None) -> Dataset:
    return _ts_dataset("basic-motions", "BasicMotions", data_dir)


# ------------------------------------------------------------------------------------------

DATASETS: dict[str, Callable[[str | None], Dataset]] = {
    "digits": _digits,
    "fashion-mnist": _fashion_mnist,
    "text": _text,
    "series": _series,
    "basic-motions": _basic_motions,
}


def load_dataset(name: str, data_dir: str | None = None) -> Dataset:
    """The data set ``name`` (one of ``DATASETS``), read from its installed files or
    ``data_dir``."""
    if not isinstance(name, str) or name.strip() not in DATASETS:
        raise DatasetError(f"data must be one of {sorted(DATASETS)}, got {name!r}")
    return DATASETS[name.strip()](data_dir)


def unigram_bpc(dataset: Dataset) -> float:
    """Bits per character of the test part under the train part's unigram distribution.

    p(c) = (n_c + 1) / (N + V): the train counts n_c (N characters) with add-one smoothing over
    the V ids of the vocabulary, so that the fallback ``UNKNOWN`` (never in the train part) has
    a probability; the result is -mean over the test characters of log2 p(c). The baseline an
    LM must beat (issue 8: by at least 1 bit).
    """
    if not isinstance(dataset, Dataset) or dataset.task != "lm" or dataset.vocab is None:
        raise DatasetError("dataset must be a Dataset with task 'lm' (e.g. "
                           f"load_dataset('text')), got {getattr(dataset, 'name', dataset)!r}")
    v = len(dataset.vocab)
    train, test = dataset.train.x, dataset.test.x
    if len(test) == 0:
        raise DatasetError(f"dataset {dataset.name!r} has an empty test part")
    counts = torch.bincount(train, minlength=v).double()
    logp = torch.log2((counts + 1.0) / (len(train) + v))
    return float(-logp[test].mean())
