"""Model outputs: attribute access, ``out["name"]`` and ``out[i]`` like transformers' outputs.

Integer indexing runs over the fields that are set, in field order; each output class orders its
fields as the transformers class it mirrors (classifier outputs put ``loss``/``logits`` first),
so that ``out[0]`` is what transformers' ``out[0]`` is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from typing import Any

__all__ = ["ModelOutput"]


class ModelOutput:
    """Mixin for output dataclasses."""

    def to_tuple(self) -> tuple[Any, ...]:
        values = (getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]
        return tuple(v for v in values if v is not None)

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            if key not in {f.name for f in fields(self)}:  # type: ignore[arg-type]
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.to_tuple())

    def keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]  # type: ignore[arg-type]
