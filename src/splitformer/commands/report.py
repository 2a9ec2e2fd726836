"""`splitformer report`: the JSON outputs of other commands gathered into one HTML page.

Each FILE is the ``--json`` output of ``splitformer verify``, ``convergence``, ``experiment`` or
``analyze`` (told apart by their keys), an experiment's ``table.json``, an analysis'
``diagnostics.json``, or a folder holding one of the last two (an experiment's results folder,
an analysis folder). Figures are inlined too: an analysis' those its JSON lists under
``"figures"`` (with their titles and captions; a file of the folder it does not list, such as
a figure left by an earlier analysis, is not shown), found in the folder of the JSON (or of its
``"report"``); an experiment's those its JSON names; for a results folder without such a list,
every figure of the folder. Writes DIR/index.html (``analysis.report``: self-contained, every
table number from the data, which is embedded as JSON) and prints its path (``--json``: one
JSON object with ``report`` and the ``inputs``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import UsageError

HELP = ("gather the JSON outputs of verify, convergence, experiment and analyze into one "
        "self-contained HTML page")

KINDS = {
    "verify": "splitformer verify --json: the correspondence table",
    "convergence": "splitformer convergence --json: the observed order in tau",
    "experiment": "splitformer experiment: the sweep's table",
    "analyze": "splitformer analyze --json: diagnostics of an evolution",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="JSON outputs of verify / convergence / experiment / analyze --json, a "
                        "table.json or diagnostics.json, or a results or analysis folder")
    p.add_argument("--out", default="report", metavar="DIR",
                   help="folder of the page (index.html; default: report)")
    p.add_argument("--title", default="splitformer report", metavar="T",
                   help="the page's title")
    p.add_argument("--json", action="store_true",
                   help="print the report's path and what was read as one JSON object")


def kind_of(doc: Any) -> str | None:
    """Which command wrote ``doc`` (a parsed JSON value), or None."""
    if isinstance(doc, list):
        if doc and all(isinstance(r, dict) and {"label", "metric"} <= set(r) for r in doc):
            return "experiment"  # table.json
        return None
    if not isinstance(doc, dict):
        return None
    keys = set(doc)
    if {"model", "evolutions"} <= keys:
        return "analyze"
    if {"tolerances", "rows"} <= keys:
        return "verify"
    if {"order", "taus", "errors"} <= keys:
        return "convergence"
    if "rows" in keys and isinstance(doc["rows"], list) and kind_of(doc["rows"]) == "experiment":
        return "experiment"
    return None


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"argument FILE: {str(path)!r} cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"argument FILE: {str(path)!r} is not valid JSON ({e})") from None


def _figures_in(folder: Path, stems: list[str] | None = None) -> list[Any]:
    """The figures of a folder: each SVG (with the PNG of the same name), in name order."""
    from ..analysis.report import FigureFile

    figs = []
    for svg in sorted(folder.glob("*.svg")):
        if stems is not None and svg.stem not in stems:
            continue
        png = svg.with_suffix(".png")
        figs.append(FigureFile(svg.stem, svg.stem.replace("-", " ").replace("_", " "), "",
                               png if png.is_file() else None, svg))
    for png in sorted(folder.glob("*.png")):  # PNGs without an SVG
        if (stems is None or png.stem in stems) and not png.with_suffix(".svg").is_file():
            figs.append(FigureFile(png.stem, png.stem.replace("-", " "), "", png, None))
    return figs


def _listed_figures(doc: dict[str, Any], folders: list[Path]) -> list[Any] | None:
    """The figures an analysis' JSON lists (``"figures"``: records with name, title, caption,
    png, svg), from the first of ``folders`` that holds them; None if it lists none."""
    from ..analysis.report import FigureFile

    listed = doc.get("figures")
    if not isinstance(listed, list):
        return None
    figs = []
    for rec in listed:
        if isinstance(rec, str):
            rec = {"name": rec, "png": f"{rec}.png", "svg": f"{rec}.svg"}
        if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
            continue
        files = {}
        for key in ("png", "svg"):
            f = rec.get(key)
            if isinstance(f, str) and Path(f).name == f:
                files[key] = next((d / f for d in folders if (d / f).is_file()), None)
        if files.get("png") is None and files.get("svg") is None:
            continue
        figs.append(FigureFile(rec["name"], str(rec.get("title") or rec["name"]),
                               str(rec.get("caption") or ""), files.get("png"),
                               files.get("svg")))
    return figs


def read_input(name: str) -> tuple[str, Any, Path, list[Any]]:
    """(kind, data, the file read, figures) of one FILE argument."""
    path = Path(name)
    if not path.exists():
        raise UsageError(f"argument FILE: {name!r} does not exist")
    figures: list[Any] = []
    folder = None
    if path.is_dir():
        for inner in ("table.json", "diagnostics.json"):
            if (path / inner).is_file():
                folder, path = path, path / inner
                break
        else:
            raise UsageError(f"argument FILE: folder {name!r} holds no table.json (an "
                             "experiment's results) or diagnostics.json (an analysis)")
    doc = _load(path)
    kind = kind_of(doc)
    if kind is None:
        what = (f"keys {sorted(doc)[:12]}" if isinstance(doc, dict) else
                f"a JSON {type(doc).__name__}")
        raise UsageError(f"argument FILE: {str(path)!r} is not a JSON output of splitformer "
                         f"verify, convergence, experiment or analyze (it has {what})")
    if kind == "experiment" and isinstance(doc, list):
        doc = {"rows": doc}
    if kind == "analyze":
        folders = [path.parent]
        if isinstance(doc.get("report"), str) and Path(doc["report"]).parent.is_dir():
            folders.append(Path(doc["report"]).parent)
        listed = _listed_figures(doc, folders)
        if listed is not None:
            figures = listed
        elif folder is not None:  # an analysis from before the list: the folder's figures
            figures = _figures_in(folder)
        elif isinstance(doc.get("report"), str) and Path(doc["report"]).parent.is_dir():
            figures = _figures_in(Path(doc["report"]).parent)
    elif kind == "experiment":
        if isinstance(doc.get("figures"), list):
            files = [Path(f) for f in doc["figures"] if isinstance(f, str)]
            folders = {f.parent for f in files if f.exists()}
            for fdir in sorted(folders):
                figures += _figures_in(fdir, [f.stem for f in files if f.parent == fdir])
        elif folder is not None:
            figures = _figures_in(folder)
    return kind, doc, path, figures


def run(args: argparse.Namespace) -> int:
    from ..analysis.report import Section, write_report

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"argument --out: {args.out!r} is a file, expected a folder")
    read = [read_input(name) for name in args.files]  # every input checked first
    data: dict[str, Any] = {}
    inputs = []
    sections = []
    count: dict[str, int] = {}
    for kind, doc, path, figures in read:
        count[kind] = count.get(kind, 0) + 1
        key = kind if count[kind] == 1 else f"{kind}-{count[kind]}"
        data[key] = doc
        inputs.append({"file": str(path), "kind": kind, "key": key})
        sections.append(Section(f"{key}: {path.name}",
                                f"{KINDS[kind]}, read from {path}.", figures=figures, data=key))
    data = {"inputs": inputs, **data}
    sections.insert(0, Section("Inputs", "What this page gathers, one section each.",
                               data="inputs"))
    report = write_report(out, args.title, sections, data).resolve()
    if args.json:
        print(json.dumps({"report": str(report), "inputs": inputs}))
    else:
        print(f"report: {report} ({len(read)} inputs: "
              f"{', '.join(i['key'] for i in inputs)})")
    return 0
