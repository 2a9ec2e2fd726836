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

Every input is checked before anything is written: each FILE's shape (the types of the keys the
page shows; a FILE read twice is refused), ``--title`` (not empty) and ``--out`` (a folder that
exists or can be created, and is writable; not a folder given as FILE or holding a
diagnostics.json given as FILE, whose index.html it would replace). The page is written into a
temporary folder and moved into place at the end, so an interrupted run leaves DIR as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..analysis.diagnostics import plural
from ..files import atomic_folder, remove_path, write_atomic
from . import UsageError, check_out

HELP = ("gather the JSON outputs of verify, convergence, experiment and analyze into one "
        "self-contained HTML page")

EPILOG = ("exit status: 0 done; 1 the page could not be written after its inputs were "
          "accepted; 2 a bad input")

KINDS = {
    "verify": "splitformer verify --json: the correspondence table",
    "convergence": "splitformer convergence --json: the observed order in tau",
    "experiment": "splitformer experiment: the sweep's table",
    "analyze": "splitformer analyze --json: diagnostics of an evolution",
}


# -- the output folder --------------------------------------------------------------------------
class Stage:
    """The temporary folder being written (``folder``) and, once ``commit(order)`` is called,
    the names of the files to keep, in the order they are moved into ``out`` (the page
    last)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.order: list[str] | None = None

    def commit(self, order: Sequence[str]) -> None:
        self.order = list(order)


class _Discarded(Exception):
    """The stage ended without a commit: nothing is kept."""


@contextlib.contextmanager
def staging(out: Path) -> Iterator[Stage]:
    """``with staging(out) as stage:`` write into ``stage.folder``, then ``stage.commit(order)``;
    on leaving the block the files named in ``order`` (the rest of the folder is dropped)
    reach ``out``:

    * a fresh ``out`` (``files.atomic_folder``): the folder is built next to it (with the
      folders above it that are missing) and appears at ``out`` at once;
    * an existing ``out``: the folder is built inside it and its files replace those of
      ``out`` one by one (``files.write_atomic``: each file at once), in the order given.

    An error or Ctrl-C in the block (or no commit) removes the temporary folder and the
    folders made for it, so that ``out`` is left as it was."""
    if out.is_dir():
        yield from _staged_into(out)
    else:
        yield from _staged_fresh(out)


def _staged_fresh(out: Path) -> Iterator[Stage]:
    made = _make_parents(out)
    try:
        with atomic_folder(out) as folder:
            stage = Stage(folder)
            yield stage
            if stage.order is None:
                raise _Discarded
            for name in {p.name for p in folder.iterdir()} - set(stage.order):
                remove_path(folder / name)
    except _Discarded:
        _remove_made(made)
    except BaseException:
        _remove_made(made)
        raise


def _staged_into(out: Path) -> Iterator[Stage]:
    folder = Path(tempfile.mkdtemp(prefix=f".{out.absolute().name or 'out'}.tmp-", dir=out))
    try:
        stage = Stage(folder)
        yield stage
        for name in stage.order or ():
            write_atomic(out / name, (folder / name).read_bytes())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _make_parents(out: Path) -> list[Path]:
    """Make the missing folders above ``out``; the ones made, outermost first."""
    missing = []
    parent = out.absolute().parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    made = []
    for folder in reversed(missing):
        folder.mkdir()
        made.append(folder)
    return made


def _remove_made(made: list[Path]) -> None:
    for folder in reversed(made):
        try:
            folder.rmdir()  # only if empty
        except OSError:
            break


# -- a report command's end ----------------------------------------------------------------------
def finish(command: str, work: Callable[[], dict[str, Any]], progress: Any, as_json: bool,
           summary: Callable[[dict[str, Any]], str]) -> int:
    """The end of a command that writes a report (``analyze``, ``theory``): ``work()``, the part
    after the inputs were accepted, returns the data; then the progress line is closed and
    ``--json`` (``as_json``) prints it as one JSON object, otherwise ``summary(data)`` and
    ``report: <data["report"]>`` are printed: exit status 0. A usage error or Ctrl-C passes
    through; any other failure closes the progress line and prints one line
    ``splitformer COMMAND: error: Type: message`` (at most 300 characters of the message) on
    stderr: exit status 1."""
    try:
        data = work()
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - a failure after the inputs were accepted: exit 1
        progress.close()
        print(f"splitformer {command}: error: {type(e).__name__}: "
              f"{' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 1
    progress.close()
    if as_json:
        print(json.dumps(data))
    else:
        print(summary(data))
        print(f"report: {data['report']}")
    return 0


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
    p.set_defaults(_interrupted="; --out is left as it was")


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
    check_shape(kind, doc, path)
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


# -- the shape of each kind ----------------------------------------------------------------------
def _what(value: Any) -> str:
    """A JSON value, briefly, for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        if math.isnan(value):
            return "NaN"
        return f"the number {value!r}" if math.isfinite(value) else (
            "Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return f"the string {value[:30]!r}"
    return "an object" if isinstance(value, dict) else "an array"


class _Shape:
    """Checks of one FILE's data: each failure a UsageError naming the file and the key."""

    def __init__(self, kind: str, doc: Any, path: Path) -> None:
        self.kind, self.doc, self.path = kind, doc, path

    def fail(self, key: str, value: Any, expected: str) -> None:
        raise UsageError(f"argument FILE: {str(self.path)!r} is not a valid {self.kind} output: "
                         f"key {key!r} holds {_what(value)}, expected {expected}")

    def obj(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, value, "an object")
        return value

    def records(self, value: Any, key: str, nonempty: bool = False) -> list[dict[str, Any]]:
        if not isinstance(value, list) or not all(isinstance(r, dict) for r in value) or (
                nonempty and not value):
            self.fail(key, value, f"a{' non-empty' if nonempty else 'n'} array of objects")
        return value

    def number(self, value: Any, key: str, null: bool = False, low: float | None = None,
               positive: bool = False) -> None:
        if value is None and null:
            return
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value) and (low is None or value >= low)
              and (not positive or value > 0))
        if not ok:
            what = "a positive" if positive else "a non-negative" if low == 0 else "a"
            self.fail(key, value, f"{what} finite number{' or null' if null else ''}")

    def integer(self, value: Any, key: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(key, value, "an integer")

    def string(self, value: Any, key: str) -> None:
        if not isinstance(value, str):
            self.fail(key, value, "a string")

    def optional(self, doc: dict[str, Any], key: str, where: str, check) -> None:
        if key in doc:
            check(doc[key], f"{where}.{key}" if where else key)


def check_shape(kind: str, doc: Any, path: Path) -> None:
    """The keys of ``doc`` that the page shows have the types its command writes (numbers
    finite), or UsageError naming ``path`` and the first key that does not."""
    _SHAPES[kind](_Shape(kind, doc, path), doc)


def _analyze_shape(c: _Shape, doc: Any) -> None:
    model = c.obj(doc["model"], "model")
    c.optional(model, "class", "model", c.string)
    evo_info = c.records(model.get("evolutions", []), "model.evolutions")
    evos = c.records(doc["evolutions"], "evolutions", nonempty=True)
    if len(evo_info) not in (0, len(evos)):
        c.fail("model.evolutions", evo_info, f"{plural(len(evos), 'record')}, one per "
               "evolution of 'evolutions'")
    for key in ("source", "input", "activation", "lipschitz_settings", "definitions"):
        c.optional(doc, key, "", c.obj)
    c.optional(doc, "batch", "", c.integer)
    if "notes" in doc and (not isinstance(doc["notes"], list)
                           or not all(isinstance(n, str) for n in doc["notes"])):
        c.fail("notes", doc["notes"], "an array of strings")
    if "figures" in doc and (not isinstance(doc["figures"], list) or not all(
            isinstance(f, (dict, str)) for f in doc["figures"])):
        c.fail("figures", doc["figures"], "an array of figure records")
    for i, ev in enumerate(evos):
        _evolution_shape(c, ev, f"evolutions.{i}")


def _evolution_shape(c: _Shape, ev: dict[str, Any], where: str) -> None:
    for key in ("kinetic_energy", "lipschitz_product"):
        c.optional(ev, key, where, lambda v, k: c.number(v, k, null=True))
    c.optional(ev, "initial", where, c.obj)
    if "times" in ev:
        times = ev["times"]
        if not isinstance(times, list):
            c.fail(f"{where}.times", times, "an array of numbers")
        for j, t in enumerate(times):
            c.number(t, f"{where}.times.{j}")
    steps = c.records(ev.get("steps"), f"{where}.steps")
    for j, st in enumerate(steps):
        sw = f"{where}.steps.{j}"
        c.integer(st.get("step"), f"{sw}.step")
        for key in ("t", "t_end", "norm", "velocity", "lipschitz", "lipschitz_change",
                    "cosine_similarity", "effective_rank"):
            c.optional(st, key, sw, lambda v, k: c.number(v, k, null=True))
        for key in ("substeps", "attention"):
            c.optional(st, key, sw, lambda v, k: c.records(v, k))


def _convergence_shape(c: _Shape, doc: Any) -> None:
    c.number(doc["order"], "order")
    taus, errors = doc["taus"], doc["errors"]
    if not isinstance(taus, list) or len(taus) < 2:
        c.fail("taus", taus, "an array of at least two step sizes")
    for i, t in enumerate(taus):
        c.number(t, f"taus.{i}", positive=True)
    if not isinstance(errors, list) or len(errors) != len(taus):
        c.fail("errors", errors, f"an array of {len(taus)} errors, one per tau")
    for i, e in enumerate(errors):
        c.number(e, f"errors.{i}", low=0)
    if "pairwise_orders" in doc:
        po = doc["pairwise_orders"]
        if not isinstance(po, list) or len(po) != len(taus) - 1:
            c.fail("pairwise_orders", po, f"an array of {len(taus) - 1} orders, one per "
                   "pair of consecutive taus")
        for i, o in enumerate(po):
            c.number(o, f"pairwise_orders.{i}", null=True)
    for key in ("scheme", "scheme_text", "integrator", "reference"):
        c.optional(doc, key, "", c.string)


def _verify_shape(c: _Shape, doc: Any) -> None:
    tol = c.obj(doc["tolerances"], "tolerances")
    for k, v in tol.items():
        c.number(v, f"tolerances.{k}", low=0)
    for i, row in enumerate(c.records(doc["rows"], "rows")):
        c.string(row.get("name"), f"rows.{i}.name")
        c.optional(row, "status", f"rows.{i}", c.string)
        if "errors" in row:
            errs = c.obj(row["errors"], f"rows.{i}.errors")
            for k, v in errs.items():
                c.number(v, f"rows.{i}.errors.{k}", null=True, low=0)
    c.optional(doc, "failed", "", c.integer)


def _experiment_shape(c: _Shape, doc: Any) -> None:
    for i, row in enumerate(c.records(doc["rows"], "rows", nonempty=True)):
        c.string(row.get("label"), f"rows.{i}.label")
        c.string(row.get("metric"), f"rows.{i}.metric")
        stat = row.get(row["metric"])
        if stat is not None:
            c.obj(stat, f"rows.{i}.{row['metric']}")
            for key in ("mean", "std"):
                c.number(stat.get(key), f"rows.{i}.{row['metric']}.{key}")
        c.optional(row, "parameters", f"rows.{i}", c.integer)


_SHAPES = {"analyze": _analyze_shape, "convergence": _convergence_shape,
           "verify": _verify_shape, "experiment": _experiment_shape}


# -- the page -----------------------------------------------------------------------------------
def _model_name(doc: dict[str, Any]) -> str:
    """What an analysis analysed: the built-in model's name, the folder's name, or the class."""
    src = doc.get("source") if isinstance(doc.get("source"), dict) else {}
    if isinstance(src.get("name"), str) and src["name"]:
        return src["name"]
    if isinstance(src.get("path"), str) and src["path"]:
        return Path(src["path"]).name or src["path"]
    return str(doc["model"].get("class") or "a model")


def section_title(kind: str, doc: dict[str, Any], given: str) -> str:
    """The heading of one input's section: what it is and the FILE as given."""
    if kind == "analyze":
        return f"Analysis of {_model_name(doc)}: {given}"
    if kind == "convergence":
        scheme = doc.get("scheme")
        return f"Convergence{f' of {scheme}' if isinstance(scheme, str) else ''}: {given}"
    return {"verify": "Verification", "experiment": "Experiment"}[kind] + f": {given}"


def _owned_folders(name: str, path: Path) -> set[Path]:
    """Folders whose index.html a page in them would replace: a FILE given as a folder, and
    the folder of a diagnostics.json or table.json."""
    folders = set()
    if Path(name).is_dir():
        folders.add(Path(name).resolve())
    if path.name in ("diagnostics.json", "table.json"):
        folders.add(path.resolve().parent)
    return folders


def run(args: argparse.Namespace) -> int:
    from ..analysis.report import write_report

    if not args.title.strip():
        raise UsageError("argument --title: expected a title, got an empty one")
    out = check_out(args.out)
    read = _read_all(args.files, out, args.out)  # every input checked first
    data, inputs, sections = _page(read)
    try:
        with staging(out) as stage:
            write_report(stage.folder, args.title, sections, data)
            stage.commit(["index.html"])
    except OSError as e:
        print(f"splitformer report: error: {type(e).__name__}: "
              f"{' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 1
    report = (out / "index.html").resolve()
    if args.json:
        print(json.dumps({"report": str(report), "inputs": inputs}))
    else:
        print(f"report: {report} ({plural(len(read), 'input')}: "
              f"{', '.join(i['key'] for i in inputs)})")
    return 0


def _read_all(files: list[str], out: Path, given_out: str) -> list[tuple]:
    """(name, kind, data, path, figures) of each FILE, each read and checked; a file given
    twice, or an --out that is the folder of an input, is refused."""
    read = []
    seen: dict[Path, str] = {}
    for name in files:
        kind, doc, path, figures = read_input(name)
        key = path.resolve()
        if key in seen:
            same = (f"{name!r} is given twice" if name == seen[key] else
                    f"{name!r} and {seen[key]!r} are the same file ({str(path)!r})")
            raise UsageError(f"argument FILE: {same}; give each input once")
        seen[key] = name
        if out.resolve() in _owned_folders(name, path):
            raise UsageError(f"argument --out: {given_out!r} is the folder of input {name!r}; "
                             "the page would replace its index.html: choose another folder")
        read.append((name, kind, doc, path, figures))
    return read


def _page(read: list[tuple]) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """(the page's data, its "inputs" records, its sections): one section per input, keyed
    by kind (a second of a kind gets "-2"), titles made unique."""
    from ..analysis.report import Section

    data: dict[str, Any] = {}
    inputs = []
    sections = []
    count: dict[str, int] = {}
    titles: dict[str, int] = {}
    for name, kind, doc, path, figures in read:
        count[kind] = count.get(kind, 0) + 1
        key = kind if count[kind] == 1 else f"{kind}-{count[kind]}"
        title = section_title(kind, doc, name)
        titles[title] = titles.get(title, 0) + 1
        if titles[title] > 1:
            title = f"{title} ({titles[title]})"
        data[key] = doc
        inputs.append({"file": str(path), "kind": kind, "key": key, "title": title})
        columns: tuple[tuple[str, str], ...] = ()
        if kind == "convergence":
            columns = (("tau", "taus"), ("error", "errors"))
            if "pairwise_orders" in doc:
                columns += (("order from the tau before", "pairwise_orders"),)
        sections.append(Section(title, f"{KINDS[kind]}, read from {path} (data key {key}).",
                                figures=figures, data=key, columns=columns))
    data = {"inputs": inputs, **data}
    sections.insert(0, Section("Inputs", "What this page gathers, one section each.",
                               data="inputs"))
    return data, inputs, sections
