"""The README's ten-line example runs as printed."""

from __future__ import annotations

import pathlib
import re


def test_readme_example_runs():
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"## Ten lines\s+```python\n(.*?)```", text, re.S)
    assert block, "README has no '## Ten lines' python block"
    exec(compile(block.group(1), "README.md", "exec"), {})
