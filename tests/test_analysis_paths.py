"""The analyze report names no absolute path of the machine it ran on: the report's path in
the data (and so in the page that embeds it) and on stdout is the one --out gave, relative to
the working folder by default."""

from __future__ import annotations

import json

from splitformer.cli import main


def test_the_report_and_its_data_hold_no_absolute_path_of_this_machine(tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.chdir(tmp_path)
    rc = main(["analyze", "vit-digits", "--lipschitz-iterations", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    folder = tmp_path / "analysis" / "vit-digits"
    data = json.loads((folder / "diagnostics.json").read_text())
    assert data["report"] == "analysis/vit-digits/index.html"
    assert out.rstrip().endswith("report: analysis/vit-digits/index.html")
    for name in ("diagnostics.json", "index.html"):
        assert str(tmp_path) not in (folder / name).read_text(), name
    rc = main(["analyze", "vit-digits", "--lipschitz-iterations", "1", "--json",
               "--out", "elsewhere/a"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and printed["report"] == "elsewhere/a/index.html"  # as --out gave it
