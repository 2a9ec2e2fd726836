"""Real data sets, offline: what a training run learns from.

A ``Dataset`` holds a train and a test ``Split`` of tensors and says what they are:

* task "classify": x is an image batch (N, C, H, W) in [0, 1] or a series (N, L) / (N, L, C),
  y the class labels (N,) as int64; ``num_classes`` and ``input_shape`` (x's shape without N);
* task "lm": x is one long 1-D int64 tensor of character ids (y is None); ``vocab`` lists the
  characters, id i is ``vocab[i]``.

``load_dataset(name, data_dir=None)`` is the one way in; ``DATASETS`` maps names to loaders.
Nothing is downloaded: every set ships inside an installed package (scikit-learn's digits) or a
Debian package (see each loader), and a missing one is an error that names the package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["DATASETS", "Dataset", "DatasetError", "Split", "load_dataset"]


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

    @property
    def vocab_size(self) -> int | None:
        return len(self.vocab) if self.vocab is not None else None


def _digits(data_dir: str | None = None) -> Dataset:
    """scikit-learn's bundled 8 x 8 digits (1797 images, 10 classes): a fixed stratified split,
    the last 20% of each class's images (in file order) is the test set; pixels / 16."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - installed by the project's dev/data extras
        raise DatasetError("data 'digits' needs scikit-learn (pip install scikit-learn)") from e
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    test = torch.zeros(len(y), dtype=torch.bool)
    for c in range(10):
        idx = (y == c).nonzero().flatten()
        test[idx[int(0.8 * len(idx)):]] = True
    return Dataset("digits", "classify", Split(x[~test], y[~test]), Split(x[test], y[test]),
                   num_classes=10, input_shape=(1, 8, 8), source="sklearn.datasets.load_digits")


DATASETS: dict[str, Callable[[str | None], Dataset]] = {"digits": _digits}


def load_dataset(name: str, data_dir: str | None = None) -> Dataset:
    """The data set ``name`` (one of ``DATASETS``), read from its installed files or
    ``data_dir``."""
    if not isinstance(name, str) or name.strip() not in DATASETS:
        raise DatasetError(f"data must be one of {sorted(DATASETS)}, got {name!r}")
    return DATASETS[name.strip()](data_dir)
