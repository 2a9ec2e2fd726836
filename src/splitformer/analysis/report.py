"""A self-contained HTML report: prose, figures and the tables of one JSON-friendly dict.

    html_report(title, sections, data) -> str
    write_report(folder, title, sections, data) -> Path          (folder/index.html)

``sections`` is a list of ``Section(title, text, figures, data, pre, columns)``: a heading,
some text (blank lines separate paragraphs; ``pre=True`` keeps it as typed), figures
(``FigureLike``: ``name``, ``title``, ``caption`` and the ``svg`` and ``png`` paths, such as
``analysis.figures.Figure`` or a ``FigureFile``), the top-level key of ``data`` whose tables
the section shows and, for a dict there holding parallel lists (a convergence result's
``taus`` and ``errors``), ``columns``: (column title, key) pairs whose lists are shown side by
side as one table, a row per index (a list shorter than the longest is aligned to its end: the
order between two taus stands in the row of the second), after the table of the dict's other
values. Keys of ``data`` that no section claims are shown at the end, under "Data".

Every number in the tables comes from ``data`` through one function (``_tables``) that walks it:
a dict's plain values become a two-column table, a list of records a table with a column per
key, a record's own list of records a further table whose rows carry the parent's first column
(e.g. the step of a substep), and a list of records that hold lists of records in turn one
subsection per record. Each value is a ``<span>`` with ``data-path`` (its place in ``data``,
keys and list indices joined by ".") and, for a number, its exact value as ``title``; the text
is the value to 4 significant digits. ``data`` itself is embedded as
``<script type="application/json" id="data">`` (non-finite numbers as null), so the page and
``--json`` can be compared.

Self-contained: figures are inlined, an SVG as markup (ids prefixed per figure so that two
figures never share one) or, when the SVG is over ``SVG_LIMIT`` bytes or absent, the PNG as a
base64 data URI. Figures are numbered over the whole page, and each ``<figure>`` element's id
carries that number (``fig<k>-<name>``), so that a page with two analyses (two figures named
``heatmaps``) has no id twice. No script runs, and nothing is fetched: no external fonts,
styles, scripts or images (the icon is ``data:,``, so a browser asks for no favicon either).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..files import write_atomic

__all__ = ["SVG_LIMIT", "FigureFile", "FigureLike", "Section", "html_report", "number_text",
           "write_report"]

SVG_LIMIT = 2_000_000  # bytes; a larger SVG is replaced by its PNG

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1100px;padding:1rem 1.5rem 3rem;color:#222;line-height:1.45}
h1{font-size:1.6rem;border-bottom:2px solid #ddd;padding-bottom:.3rem}
h2{font-size:1.3rem;margin-top:2rem;border-bottom:1px solid #eee}
h3,h4,h5,h6{font-size:1.05rem;margin:1.2rem 0 .4rem}
nav ul{padding-left:1.2rem;margin:.2rem 0}
pre{background:#f6f8fa;padding:.6rem .8rem;overflow-x:auto;font-size:.85rem}
table{border-collapse:collapse;margin:.4rem 0 1rem;font-size:.85rem}
th,td{border:1px solid #ddd;padding:.2rem .5rem;vertical-align:top;text-align:left}
thead th{background:#f3f3f3;position:sticky;top:0}
tbody th{background:#fafafa;font-weight:600}
td .n{font-variant-numeric:tabular-nums}
td .k{color:#666}
.scroll{overflow-x:auto;max-height:36rem;overflow-y:auto}
figure{margin:1rem 0 1.5rem}
figure svg,figure img{max-width:100%;height:auto;display:block}
figcaption{font-size:.9rem;color:#444;margin-top:.3rem}
footer{margin-top:3rem;font-size:.8rem;color:#777}
"""


class FigureLike(Protocol):
    """What the page reads of a figure: its name (the file stem), title, caption and files
    (either may be None)."""

    @property
    def name(self) -> str: ...

    @property
    def title(self) -> str: ...

    @property
    def caption(self) -> str: ...

    @property
    def png(self) -> Path | None: ...

    @property
    def svg(self) -> Path | None: ...


@dataclass(frozen=True)
class FigureFile:
    """A figure on disk (the shape of ``analysis.figures.Figure``)."""

    name: str
    title: str
    caption: str
    png: Path | None
    svg: Path | None


@dataclass(frozen=True)
class Section:
    """A part of the report: heading, text, figures and the key of ``data`` it tabulates."""

    title: str
    text: str = ""
    figures: Sequence[FigureLike] = field(default_factory=tuple)
    data: str | None = None
    pre: bool = False
    columns: Sequence[tuple[str, str]] = ()


# -- values ---------------------------------------------------------------------------------
def number_text(value: float | int) -> str:
    """How a number is shown: an int as is, a float to 4 significant digits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _is_record_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def _depth(v: Any) -> int:
    """How deep lists of records nest in ``v`` (0: none)."""
    if isinstance(v, Mapping):
        return max((_depth(x) for x in v.values()), default=0)
    if _is_record_list(v):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, list):
        return max((_depth(x) for x in v), default=0)
    return 0


def _inline(v: Any) -> bool:
    """Fits in one table cell: a scalar, or lists and dicts of such without records."""
    return _depth(v) == 0 and _nesting(v) <= 2


def _nesting(v: Any) -> int:
    if isinstance(v, Mapping):
        return 1 + max((_nesting(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_nesting(x) for x in v), default=0)
    return 0


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _cell(v: Any, path: str) -> str:
    """One value as HTML; every scalar a span naming its path."""
    p = html.escape(path, quote=True)
    if v is None:
        return f'<span class="z" data-path="{p}">–</span>'
    if isinstance(v, bool):
        return f'<span class="b" data-path="{p}">{"true" if v else "false"}</span>'
    if isinstance(v, (int, float)):
        return (f'<span class="n" data-path="{p}" title="{html.escape(repr(v))}">'
                f"{number_text(v)}</span>")
    if isinstance(v, str):
        return f'<span class="s" data-path="{p}">{html.escape(v)}</span>'
    if isinstance(v, Mapping):
        parts = [f'<span class="k">{html.escape(str(k))}:</span> {_cell(x, _join(path, k))}'
                 for k, x in v.items()]
        return "; ".join(parts) if parts else "{}"
    if isinstance(v, (list, tuple)):
        parts = [_cell(x, _join(path, i)) for i, x in enumerate(v)]
        return "[" + ", ".join(parts) + "]"
    return f'<span class="s" data-path="{p}">{html.escape(str(v))}</span>'


def _label(key: Any) -> str:
    return html.escape(str(key).replace("_", " "))


def _heading(level: int, text: str) -> str:
    level = min(level, 6)
    return f"<h{level}>{text}</h{level}>" if text else ""


def _sub(title: str, name: str) -> str:
    return f"{title} › {name}" if title else name


def _kv_table(items: list[tuple[Any, Any]], path: str) -> str:
    rows = "".join(f"<tr><th>{_label(k)}</th><td>{_cell(v, _join(path, k))}</td></tr>"
                   for k, v in items)
    return f'<div class="scroll"><table class="kv"><tbody>{rows}</tbody></table></div>'


def _columns(records: Iterable[Mapping[str, Any]], skip: set[str]) -> list[str]:
    cols: list[str] = []
    for r in records:
        for k, v in r.items():
            if k not in cols and k not in skip and _inline(v):
                cols.append(k)
    return cols


def _record_table(records: list[Mapping[str, Any]], path: str, title: str, level: int,
                  parents: list[tuple[str, list[tuple[str, Any]]]] | None = None) -> str:
    """A table with a column per key; each key holding records in some row becomes a further
    table after it, whose rows start with the parent row's first column.

    ``parents``: for a child table, (path of each row, [(column, value) ...] of the parent)."""
    nested = [k for r in records for k, v in r.items() if _is_record_list(v)]
    nested = list(dict.fromkeys(nested))
    cols = _columns(records, set(nested))
    lead = [name for name, _ in (parents[0][1] if parents else [])]
    head = "".join(f"<th>{_label(c)}</th>" for c in [*lead, *cols])
    body = []
    row_paths = [p for p, _ in parents] if parents else [_join(path, i)
                                                          for i in range(len(records))]
    for i, r in enumerate(records):
        rp = row_paths[i]
        cells = []
        if parents:
            for _, (pv, ppath) in parents[i][1]:
                cells.append(f"<td>{_cell(pv, ppath)}</td>")
        for c in cols:
            cells.append(f"<td>{_cell(r[c], _join(rp, c))}</td>" if c in r else "<td></td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    out = [_heading(level, title),
           f'<div class="scroll"><table data-path="{html.escape(path, quote=True)}"><thead>'
           f"<tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"]
    for key in nested:  # child tables: the parent's lead columns and its first own column
        rows: list[Mapping[str, Any]] = []
        child_parents: list[tuple[str, list[tuple[str, Any]]]] = []
        for i, r in enumerate(records):
            kids = r.get(key)
            if not _is_record_list(kids):
                continue
            rp = row_paths[i]
            carry = list(parents[i][1]) if parents else []
            if cols and cols[0] in r:
                carry.append((cols[0], (r[cols[0]], _join(rp, cols[0]))))
            for j, kid in enumerate(kids):
                rows.append(kid)
                child_parents.append((_join(_join(rp, key), j), carry))
        if rows:
            out.append(_record_table(rows, _join(path, key), _sub(title, _label(key)),
                                     level + 1, child_parents))
    return "".join(out)


def _tables(value: Any, path: str, title: str, level: int) -> str:
    """The one function that turns ``data`` (or a part of it) into headings and tables."""
    if _is_record_list(value):
        if _depth(value) >= 3 and len(value) <= 50:  # records of records of records
            out = [_heading(level, title)]
            for i, item in enumerate(value):
                name = item.get("name", item.get("label", f"#{i}"))
                out.append(_tables(dict(item), _join(path, i),
                                   _sub(title, html.escape(str(name))), level + 1))
            return "".join(out)
        return _record_table(list(value), path, title, level)
    if isinstance(value, Mapping):
        plain = [(k, v) for k, v in value.items() if _inline(v)]
        rest = [(k, v) for k, v in value.items() if not _inline(v)]
        out = [_heading(level, title)] if title else []
        if plain:
            out.append(_kv_table(plain, path))
        for k, v in rest:
            out.append(_tables(v, _join(path, k), _label(k), level + 1))
        return "".join(out)
    if isinstance(value, list):  # a list of lists (or of mixed things): one row per item
        rows = [(i, v) for i, v in enumerate(value)]
        return _heading(level, title) + _kv_table(rows, path)
    return _heading(level, title) + _kv_table([("value", value)], path) if path else ""


def _column_table(value: Mapping[str, Any], path: str, columns: Sequence[tuple[str, str]]
                  ) -> str:
    """The lists ``value[key]`` of ``columns`` side by side: a row per index, a shorter list
    aligned to the end."""
    lists = [(title, key, value[key]) for title, key in columns
             if isinstance(value.get(key), list)]
    rows = max((len(v) for _, _, v in lists), default=0)
    head = "".join(f"<th>{html.escape(title)}</th>" for title, _, _ in lists)
    body = []
    for i in range(rows):
        cells = []
        for _, key, v in lists:
            j = i - (rows - len(v))
            cells.append(f"<td>{_cell(v[j], _join(_join(path, key), j))}</td>" if j >= 0
                         else "<td></td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table data-path="{html.escape(path, quote=True)}"><thead>'
            f"<tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def _section_tables(value: Any, path: str, columns: Sequence[tuple[str, str]]) -> str:
    if not columns or not isinstance(value, Mapping):
        return _tables(value, path, "", 3)
    keys = {key for _, key in columns if isinstance(value.get(key), list)}
    rest = {k: v for k, v in value.items() if k not in keys}
    return _tables(rest, path, "", 3) + _column_table(value, path, columns)


# -- figures --------------------------------------------------------------------------------
_SVG_PROLOGUE = re.compile(r"^\s*(<\?xml[^>]*\?>\s*)?(<!DOCTYPE[^>]*>\s*)?", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_SCRIPT = re.compile(r"<script\b.*?</script\s*>", re.S | re.I)
_METADATA = re.compile(r"<metadata\b.*?</metadata\s*>", re.S | re.I)
_ID = re.compile(r'\bid="([^"]+)"')


def _inline_svg(text: str, prefix: str) -> str:
    """An SVG file's markup for inlining: no prologue, comments, scripts or metadata (RDF); every
    id (and each reference to it) prefixed, so that figures on one page never share an id."""
    text = _SVG_PROLOGUE.sub("", text, count=1)
    for pattern in (_COMMENT, _SCRIPT, _METADATA):
        text = pattern.sub("", text)
    ids = set(_ID.findall(text))
    if ids:
        text = _ID.sub(lambda m: f'id="{prefix}{m.group(1)}"', text)

        def ref(m: re.Match) -> str:
            name = m.group(2)
            return f"{m.group(1)}#{prefix}{name}" if name in ids else m.group(0)

        text = re.sub(r'(url\(|href=")#([^)"]+)', ref, text)
    # the figure scales with the page; its viewBox keeps the aspect ratio
    text = re.sub(r"<svg\b", '<svg role="img" class="figure"', text, count=1)
    return text


def _figure_html(fig: FigureLike, index: int) -> str:
    title = str(fig.title or fig.name or f"figure {index}")
    caption = str(fig.caption or "")
    svg, png = fig.svg, fig.png
    body = None
    if svg is not None and Path(svg).is_file() and (
            Path(svg).stat().st_size <= SVG_LIMIT or png is None or not Path(png).is_file()):
        body = _inline_svg(Path(svg).read_text(encoding="utf-8"), f"f{index}-")
    elif png is not None and Path(png).is_file():
        data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
        body = (f'<img alt="{html.escape(title, quote=True)}" '
                f'src="data:image/png;base64,{data}">')
    if body is None:
        return (f"<figure><p><em>figure {html.escape(title)}: no file</em></p>"
                f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", str(fig.name or "figure"))
    return (f'<figure id="fig{index}-{name}">{body}<figcaption><strong>{html.escape(title)}.'
            f"</strong> {html.escape(caption)}</figcaption></figure>")


# -- the page -------------------------------------------------------------------------------
def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _text_html(text: str, pre: bool) -> str:
    if not text:
        return ""
    if pre:
        return f"<pre>{html.escape(text.rstrip())}</pre>"
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "".join(f"<p>{html.escape(' '.join(p.split()))}</p>" for p in paras)


def _anchor(title: str, i: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return f"s{i}-{slug}"[:60]


def html_report(title: str, sections: Sequence[Section], data: Mapping[str, Any]) -> str:
    """The report as one HTML document (module docstring)."""
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a dict, got {type(data).__name__}")
    claimed = {s.data for s in sections if s.data is not None}
    missing = sorted(k for k in claimed if k not in data)
    if missing:
        raise KeyError(f"sections show keys that data lacks: {missing}")
    rest = [k for k in data if k not in claimed]
    parts: list[tuple[str, str]] = []  # (anchor, html)
    nfig = 0
    for i, s in enumerate(sections):
        a = _anchor(s.title, i)
        body = [f'<h2 id="{a}">{html.escape(s.title)}</h2>', _text_html(s.text, s.pre)]
        for fig in s.figures:
            nfig += 1
            body.append(_figure_html(fig, nfig))
        if s.data is not None:
            body.append(_section_tables(data[s.data], s.data, s.columns))
        parts.append((a, s.title, "".join(body)))
    if rest:
        a = _anchor("data", len(sections))
        body = [f'<h2 id="{a}">Data</h2>']
        # plain values in one table; each dict or list of records under its own heading
        plain = [(k, data[k]) for k in rest
                 if _inline(data[k]) and not (isinstance(data[k], Mapping) and data[k])]
        if plain:
            body.append(_kv_table(plain, ""))
        for k in rest:
            if (k, data[k]) not in plain:
                body.append(_tables(data[k], str(k), _label(k), 3))
        parts.append((a, "Data", "".join(body)))
    toc = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t, _ in parts)
    blob = json.dumps(_finite(data), indent=1, allow_nan=False).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{html.escape(title)}</title><link rel=\"icon\" href=\"data:,\">"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><nav><ul>{toc}</ul></nav>"
        + "".join(h for _, _, h in parts)
        + "<footer>Written by splitformer. The tables show the data below to four "
        "significant digits (hover a number for its exact value); the same data is embedded in "
        "this page as JSON (script#data).</footer>"
        f'<script type="application/json" id="data">{blob}</script>'
        "</body></html>\n"
    )


def write_report(folder: str | os.PathLike, title: str, sections: Sequence[Section],
                 data: Mapping[str, Any]) -> Path:
    """Write ``html_report(...)`` to ``folder/index.html`` at once (``files.write_atomic``;
    the folder is made) and return that path."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    return write_atomic(out / "index.html", html_report(title, sections, data))
