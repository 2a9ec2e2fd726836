"""The bench table on a narrow terminal: a missing peer's reason is folded onto more lines,
never cut short with an ellipsis (a reason is what tells the reader what to install)."""

from __future__ import annotations

import io

from rich.console import Console

from splitformer.commands import bench

REASON = ("timm does not import: RuntimeError: operator torchvision::nms does not exist "
          "(/work/main/.venv/lib/python3.11/site-packages/torchvision/_meta_registrations.py)")


def _cells(text: str, column: int) -> str:
    """The text of one column over the body rows of a rendered table, joined."""
    parts = []
    for line in text.splitlines():
        if line.startswith("│"):
            cells = line.strip("│").split("│")
            parts.append(cells[column].strip())
    return "".join(parts)


def test_a_missing_peers_reason_is_shown_whole_on_a_narrow_console(monkeypatch):
    rows = [{"suite": "vit", "size": "d256", "group": "vit", "skipped": REASON},
            {"suite": "vit", "size": "d256", "group": "vit", "path": "train",
             "name": "splitformer", "median_s": 0.01, "splitformer": True,
             "ratios": {"timm": 1.01}, "peak_bytes": 2**24}]
    for width in (70, 100):
        buffer = io.StringIO()
        console = Console(file=buffer, width=width, force_terminal=False, color_system=None)
        # the terminal's console, as print_tables makes it, is this narrow one
        monkeypatch.setattr("rich.console.Console", lambda *a, c=console, **k: c)
        bench.print_tables(rows, "vit", {})
        text = buffer.getvalue()
        assert "…" not in text, text
        shown = _cells(text.split("1.010x")[0], 5)  # the reason column, before the next row
        assert shown.replace(" ", "") == REASON.replace(" ", ""), text
