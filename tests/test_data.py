"""The data sets of splitformer.training.data, each on its real files (installed by `make data`;
a test skips, saying so, where they are absent), and the loaders' errors on small files made
here (bad idx files, a hand-made SWORD module, .ts files)."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from _optional_data import needs

from splitformer.training import data as D
from splitformer.training.data import DATASETS, Dataset, DatasetError, Split, load_dataset

need_fashion = needs("fashion-mnist")
need_kjv = needs("text")
need_series = needs("series")


def test_registry_names():
    assert set(DATASETS) == {"digits", "fashion-mnist", "text", "series", "basic-motions"}


@pytest.mark.parametrize("name", ["mnist", "", None, 3, "Digits"])
def test_bad_name(name):
    with pytest.raises(DatasetError, match="data must be one of"):
        load_dataset(name)


# --- digits -------------------------------------------------------------------------------


def test_digits_still_works():
    d = load_dataset(" digits ")
    assert (d.task, d.num_classes, d.input_shape) == ("classify", 10, (1, 8, 8))
    assert d.train.x.shape == (1433, 1, 8, 8) and d.test.x.shape == (364, 1, 8, 8)
    assert d.train.x.dtype == torch.float32 and d.train.y.dtype == torch.int64
    assert 0 <= d.train.x.min() and d.train.x.max() <= 1
    assert len(d.train) + len(d.test) == 1797
    assert torch.equal(d.train.x, load_dataset("digits").train.x)


def test_digits_refuses_data_dir(tmp_path):
    with pytest.raises(DatasetError, match="data_dir"):
        load_dataset("digits", str(tmp_path))


# --- data_dir and missing packages --------------------------------------------------------


@pytest.mark.parametrize("name", ["fashion-mnist", "text", "series", "basic-motions"])
@pytest.mark.parametrize("bad", [3, "", "   ", ["x"]])
def test_bad_data_dir_type(name, bad):
    with pytest.raises(DatasetError, match="data_dir must be a folder path"):
        load_dataset(name, bad)


@pytest.mark.parametrize("name", ["fashion-mnist", "text", "series", "basic-motions"])
def test_data_dir_not_a_folder(name, tmp_path):
    with pytest.raises(DatasetError, match=r"data_dir '.*nowhere' is not a folder"):
        load_dataset(name, str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetError, match="is not a folder"):
        load_dataset(name, str(tmp_path / "file"))


@pytest.mark.parametrize("name, expect", [
    ("fashion-mnist", r"train-images-idx3-ubyte\.gz \(or train-images-idx3-ubyte\) not found"),
    ("text", r"no SWORD zText module"),
    ("series", r"ItalyPowerDemand_TRAIN\.ts not found"),
    ("basic-motions", r"BasicMotions_TRAIN\.ts not found"),
])
def test_data_dir_without_the_files(name, expect, tmp_path):
    with pytest.raises(DatasetError, match=expect):
        load_dataset(name, tmp_path)  # a Path is accepted as well as a str


@pytest.mark.parametrize("name, attr, package", [
    ("fashion-mnist", "FASHION_MNIST_DIR", "dataset-fashion-mnist"),
    ("text", "KJV_DIR", "sword-text-kjv"),
])
def test_missing_debian_package_names_it_and_make_data(name, attr, package, tmp_path,
                                                        monkeypatch):
    monkeypatch.setattr(D, attr, tmp_path / "not-installed")
    with pytest.raises(DatasetError) as e:
        load_dataset(name)
    msg = str(e.value)
    assert package in msg and "make data" in msg and f"apt-get install -y {package}" in msg
    assert "data_dir" in msg


@pytest.mark.parametrize("name", ["series", "basic-motions"])
def test_missing_pypi_package_names_it_and_make_data(name, monkeypatch):
    monkeypatch.setattr(D, "_ts_package_dir", lambda problem: None)
    with pytest.raises(DatasetError) as e:
        load_dataset(name)
    msg = str(e.value)
    assert "aeon" in msg and "make data" in msg and "pip install --no-deps aeon" in msg


# --- Fashion-MNIST ------------------------------------------------------------------------


@need_fashion
def test_fashion_mnist_real_files():
    d = load_dataset("fashion-mnist")
    assert (d.name, d.task, d.num_classes, d.input_shape) == ("fashion-mnist", "classify", 10,
                                                             (1, 28, 28))
    assert d.train.x.shape == (60000, 1, 28, 28) and d.test.x.shape == (10000, 1, 28, 28)
    assert d.train.x.dtype == torch.float32 and d.train.y.dtype == torch.int64
    assert d.train.x.min() == 0 and d.train.x.max() == 1 and d.test.x.max() == 1
    assert torch.equal(torch.bincount(d.train.y), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(d.test.y), torch.full((10,), 1000))
    # the published first labels and pixel mean (0.2860) of Fashion-MNIST
    assert d.train.y[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert d.test.y[:10].tolist() == [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]
    assert abs(d.train.x.mean().item() - 0.2860) < 1e-4
    pixels = d.train.x * 255
    assert torch.equal(pixels, pixels.round())  # exact bytes / 255
    assert d.classes[9] == "Ankle boot" and len(d.classes) == 10
    assert "dataset-fashion-mnist" in d.source


@need_fashion
def test_fashion_mnist_deterministic_and_fresh_tensors():
    a = load_dataset("fashion-mnist")
    a.train.x[0].fill_(7.0)  # a caller may change its tensors: the cache is not touched
    b, c = load_dataset("fashion-mnist"), load_dataset("fashion-mnist")
    assert b.train.x[0].max() <= 1
    assert torch.equal(b.train.x, c.train.x) and torch.equal(b.test.y, c.test.y)


def _idx_bytes(a: np.ndarray) -> bytes:
    return bytes([0, 0, 8, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes()


def _write_fashion(folder: Path, n: int = 5, *, gz: bool = True) -> None:
    rng = np.random.default_rng(0)
    for part in ("train", "t10k"):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        for stem, a in ((f"{part}-images-idx3-ubyte", images),
                        (f"{part}-labels-idx1-ubyte", labels)):
            raw = _idx_bytes(a)
            if gz:
                (folder / (stem + ".gz")).write_bytes(gzip.compress(raw))
            else:
                (folder / stem).write_bytes(raw)


@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_data_dir(tmp_path, gz):
    _write_fashion(tmp_path, gz=gz)
    d = load_dataset("fashion-mnist", str(tmp_path))
    assert d.train.x.shape == (5, 1, 28, 28) and d.test.y.tolist() == [0, 1, 2, 3, 4]
    assert d.train.x.dtype == torch.float32 and 0 <= d.train.x.min() and d.train.x.max() <= 1


@pytest.mark.parametrize("damage, expect", [
    (lambda raw: b"\x00\x00\x09\x03" + raw[4:], "bad magic number"),
    (lambda raw: raw[:-5], "holds 3915 bytes of data"),
    (lambda raw: raw[:6], "truncated"),
])
def test_fashion_mnist_bad_idx_files(tmp_path, damage, expect):
    _write_fashion(tmp_path, gz=False)
    f = tmp_path / "train-images-idx3-ubyte"
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(DatasetError, match=expect):
        load_dataset("fashion-mnist", str(tmp_path))


def test_fashion_mnist_bad_labels_and_gzip(tmp_path):
    _write_fashion(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx_bytes(np.full(5, 12, np.uint8)))
    with pytest.raises(DatasetError, match="labels outside 0..9"):
        load_dataset("fashion-mnist", str(tmp_path))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(DatasetError, match="are not N images and N labels"):
        load_dataset("fashion-mnist", str(tmp_path))
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(DatasetError, match="cannot read idx file"):
        load_dataset("fashion-mnist", str(tmp_path))


# --- text ---------------------------------------------------------------------------------


@need_kjv
def test_text_real_files():
    d = load_dataset("text")
    assert (d.name, d.task, d.num_classes, d.input_shape) == ("text", "lm", None, None)
    assert d.train.y is None and d.test.y is None
    assert d.train.x.dtype == torch.int64 and d.train.x.dim() == 1
    assert (len(d.train.x), len(d.test.x)) == (3_737_973, 415_331)
    assert len(d.train.x) == int(0.9 * (len(d.train.x) + len(d.test.x)))
    assert d.vocab_size == 90 and d.vocab[-1] == D.UNKNOWN
    assert list(d.vocab[:-1]) == sorted(d.vocab[:-1]) and len(set(d.vocab)) == 90
    assert int(d.train.x.min()) == 0 and int(d.train.x.max()) == 88  # UNKNOWN never in train
    assert torch.equal(torch.unique(d.train.x), torch.arange(89))
    assert int((d.test.x == 89).sum()) == 2  # "[" and "]" of 1 John 2:23
    start = ("The First Book of Moses, called Genesis\n"
             "In the beginning God created the heaven and the earth.\n")
    assert "".join(d.vocab[i] for i in d.train.x[:len(start)].tolist()) == start
    end = "".join(d.vocab[i] for i in d.test.x[-58:].tolist())
    assert end == "The grace of our Lord Jesus Christ be with you all. Amen.\n"
    whole = "".join(d.vocab[i] for i in torch.cat([d.train.x, d.test.x]).tolist())
    assert whole.count("\n") == 31_169 and "<" not in whole and "\\" not in whole
    assert "  " not in whole and "Heb." not in whole  # footnotes removed, spaces collapsed
    assert "sword-text-kjv" in d.source


@need_kjv
def test_text_unigram_baseline_and_determinism():
    a, b = load_dataset("text"), load_dataset("text")
    assert a.vocab == b.vocab and torch.equal(a.train.x, b.train.x)
    assert torch.equal(a.test.x, b.test.x)
    bpc = D.unigram_bpc(a)
    assert abs(bpc - 4.374) < 5e-4, bpc


def _ztext(folder: Path, part: str, verses: list[str], per_block: int = 2) -> None:
    """A SWORD zText testament: verses in zlib blocks of ``per_block`` with both indexes."""
    bzs, bzv, bzz = b"", b"", b""
    for start in range(0, len(verses), per_block):
        block, entries = b"", []
        for v in verses[start:start + per_block]:
            raw = v.encode("utf-8")
            entries.append((len(bzs) // 12, len(block), len(raw)))
            block += raw
        packed = zlib.compress(block)
        bzs += struct.pack("<III", len(bzz), len(packed), len(block))
        bzz += packed
        bzv += b"".join(struct.pack("<IIH", *e) for e in entries)
    bzv = struct.pack("<IIH", 0, 0, 0) + bzv  # an empty entry, as the real index has
    for ext, data in (("bzs", bzs), ("bzv", bzv), ("bzz", bzz)):
        (folder / f"{part}.{ext}").write_bytes(data)


def test_text_from_a_sword_module(tmp_path):
    _ztext(tmp_path, "ot", [
        '<title type="main">Book &amp; One</title>',
        'In the <w lemma="strong:H1">be</w>ginning.<note placement="foot">'
        '<reference>1.1</reference>Heb. a note</note> ',
        '<chapter n="2"/> ',
        "\\nd ABC  abc\n",
    ])
    _ztext(tmp_path, "nt", ["xyz [q]", "cab ~"])
    d = load_dataset("text", str(tmp_path))
    lines = "Book & One\nIn the beginning.\nABC abc\nxyz [q]\ncab ~\n"
    n = int(0.9 * len(lines))
    assert len(d.train.x) == n and len(d.test.x) == len(lines) - n
    assert d.vocab == (*sorted(set(lines[:n])), D.UNKNOWN)
    test = "".join(d.vocab[i] for i in d.test.x.tolist())
    expect = "".join(c if c in lines[:n] else D.UNKNOWN for c in lines[n:])
    assert test == expect and D.UNKNOWN in test
    # the baseline's formula: add-one counts of the train part over the vocabulary
    counts = torch.bincount(d.train.x, minlength=d.vocab_size).double() + 1
    p = counts / counts.sum()
    assert D.unigram_bpc(d) == pytest.approx(float(-torch.log2(p[d.test.x]).mean()), rel=1e-12)


def test_text_module_errors(tmp_path):
    _ztext(tmp_path, "nt", ["one verse", "two verses"])
    (tmp_path / "nt.bzv").unlink()
    with pytest.raises(DatasetError, match=r"nt\.bzv not found"):
        load_dataset("text", str(tmp_path))
    _ztext(tmp_path, "nt", ["one verse", "two verses"])
    (tmp_path / "nt.bzs").write_bytes(b"12345")
    with pytest.raises(DatasetError, match="truncated"):
        load_dataset("text", str(tmp_path))
    _ztext(tmp_path, "nt", ["one verse", "two verses"])
    (tmp_path / "nt.bzz").write_bytes(b"\x00" * 40)
    with pytest.raises(DatasetError, match="corrupt"):
        load_dataset("text", str(tmp_path))
    _ztext(tmp_path, "nt", ["<note>only a note</note>", "<w/>"])
    with pytest.raises(DatasetError, match="holds no text"):
        load_dataset("text", str(tmp_path))


def test_unigram_bpc_needs_an_lm_dataset():
    with pytest.raises(DatasetError, match="dataset must be a Dataset with task 'lm'"):
        D.unigram_bpc(load_dataset("digits"))
    with pytest.raises(DatasetError, match="dataset must be"):
        D.unigram_bpc("text")
    empty = Dataset("t", "lm", Split(torch.tensor([0, 1]), None),
                    Split(torch.zeros(0, dtype=torch.int64), None), vocab=("a", "b"))
    with pytest.raises(DatasetError, match="empty test part"):
        D.unigram_bpc(empty)


# --- series -------------------------------------------------------------------------------


@need_series
def test_series_italy_power_demand_real_files():
    d = load_dataset("series")
    assert (d.task, d.num_classes, d.input_shape, d.classes) == ("classify", 2, (24,),
                                                                 ("1", "2"))
    assert d.train.x.shape == (67, 24) and d.test.x.shape == (1029, 24)
    assert d.train.x.dtype == torch.float32 and d.train.y.dtype == torch.int64
    assert torch.bincount(d.train.y).tolist() == [34, 33]
    assert torch.bincount(d.test.y).tolist() == [513, 516]
    assert abs(d.train.x.mean().item()) < 1e-5 and abs(d.train.x.std().item() - 1) < 1e-3
    assert torch.isfinite(d.test.x).all() and d.test.x.abs().max() < 10
    assert "ItalyPowerDemand" in d.source
    again = load_dataset("series")
    assert torch.equal(d.train.x, again.train.x) and torch.equal(d.test.y, again.test.y)


@need_series
def test_series_basic_motions_real_files():
    d = load_dataset("basic-motions")
    assert (d.num_classes, d.input_shape) == (4, (100, 6))
    assert d.classes == ("Standing", "Running", "Walking", "Badminton")
    assert d.train.x.shape == (40, 100, 6) and d.test.x.shape == (40, 100, 6)
    assert torch.bincount(d.train.y).tolist() == [10] * 4
    assert torch.bincount(d.test.y).tolist() == [10] * 4
    mean, std = d.train.x.mean(dim=(0, 1)), d.train.x.std(dim=(0, 1), correction=0)
    assert torch.allclose(mean, torch.zeros(6), atol=1e-5)
    assert torch.allclose(std, torch.ones(6), atol=1e-4)


TS_HEAD = """# a comment
@problemName Toy
@timeStamps false
@missing false
@univariate {uni}
@equalLength true
@classLabel true b a
@data
"""


def test_series_from_ts_files(tmp_path):
    train = TS_HEAD.format(uni="false") + "1,2,3:0,0,0:a\n3,4,5:0,0,0:b\n"
    test = TS_HEAD.format(uni="false") + "2,2,2:1,1,1:b\n"
    (tmp_path / "BasicMotions_TRAIN.ts").write_text(train)
    (tmp_path / "BasicMotions_TEST.ts").write_text(test)
    d = load_dataset("basic-motions", str(tmp_path))
    assert d.classes == ("b", "a") and d.num_classes == 2 and d.input_shape == (3, 2)
    assert d.train.y.tolist() == [1, 0] and d.test.y.tolist() == [0]
    # channel 0: train values 1 2 3 3 4 5, mean 3, std sqrt(10/6); channel 1 constant: std 1
    s = (10 / 6) ** 0.5
    expect = torch.tensor([[[-2 / s, 0], [-1 / s, 0], [0, 0]], [[0, 0], [1 / s, 0], [2 / s, 0]]])
    assert torch.allclose(d.train.x, expect.float())
    assert torch.allclose(d.test.x, torch.tensor([[[-1 / s, 1]] * 3]).float())


@pytest.mark.parametrize("body, expect", [
    ("1,2,3:c\n", "label 'c' is not one of"),
    ("1,2,3:a\n1,2:b\n", "length differ"),
    ("1,?,3:a\n", "could not convert"),
    ("1,nan,3:a\n", "non-finite"),
    ("1,2,3\n", "expected 'values:...:label'"),
])
def test_series_bad_ts_files(tmp_path, body, expect):
    (tmp_path / "ItalyPowerDemand_TRAIN.ts").write_text(TS_HEAD.format(uni="true") + body)
    (tmp_path / "ItalyPowerDemand_TEST.ts").write_text(TS_HEAD.format(uni="true") + "1,2,3:a\n")
    with pytest.raises(DatasetError, match=expect):
        load_dataset("series", str(tmp_path))


def test_series_unequal_length_and_mismatch(tmp_path):
    head = TS_HEAD.format(uni="true")
    (tmp_path / "ItalyPowerDemand_TRAIN.ts").write_text(
        head.replace("@equalLength true", "@equalLength false") + "1,2:a\n")
    (tmp_path / "ItalyPowerDemand_TEST.ts").write_text(head + "1,2,3:a\n")
    with pytest.raises(DatasetError, match="unequal length"):
        load_dataset("series", str(tmp_path))
    (tmp_path / "ItalyPowerDemand_TRAIN.ts").write_text(head + "1,2:a\n2,1:b\n")
    with pytest.raises(DatasetError, match="differ in classes or shape"):
        load_dataset("series", str(tmp_path))
    (tmp_path / "ItalyPowerDemand_TRAIN.ts").write_text("@data\n1,2:a\n")
    with pytest.raises(DatasetError, match="after @classLabel"):
        load_dataset("series", str(tmp_path))


# --- the families take them ---------------------------------------------------------------


@pytest.mark.parametrize("family, name", [
    pytest.param(family, name, marks=needs(name)) for family, name in (
        ("encoder", "series"), ("encoder", "basic-motions"), ("lm", "text"),
        ("vit", "fashion-mnist"))])
def test_family_accepts_the_real_set(family, name):
    from splitformer.training.config import TrainConfig
    from splitformer.training.families import FAMILIES, build_model

    cfg = TrainConfig(family=family, data=name, width=16, heads=2, depth=1, seq_len=16)
    d = load_dataset(name)
    torch.manual_seed(0)
    model = build_model(cfg, d)
    x = d.train.x[:2] if d.task == "classify" else d.train.x[:32].view(2, 16)
    out = FAMILIES[family].logits(model, x)
    width = d.num_classes if d.task == "classify" else d.vocab_size
    assert out.shape[0] == 2 and out.shape[-1] == width and torch.isfinite(out).all()
