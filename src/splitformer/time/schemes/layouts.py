"""Layouts: the fields of a family, each with the operators around it and the projection after.

A family declares its layout once, next to its controls (``Field`` values in order); named
schemes (``time.schemes.named``) are built on it. The two layouts of the encoder:

    POST_LN   u += tau A(u); u = P1(u); u += tau G(u); u = P2(u)     (fields, then projections)
    PRE_LN    u += tau A(P1 u); u += tau G(P2 u)                      (projections inside)

``pre_norm_layout`` is the transform between them (docs/math.md 3.2).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Field", "Layout", "POST_LN", "PRE_LN", "pre_norm_layout"]


@dataclass(frozen=True)
class Field:
    """One term of a layout: a field operator, what composes around it, the projection after."""

    operator: str
    pre: tuple[str, ...] = ()
    post: tuple[str, ...] = ()
    projection: str | None = None


Layout = tuple[Field, ...]
POST_LN: Layout = (Field("attention", projection="norm1"), Field("ffn", projection="norm2"))
PRE_LN: Layout = (Field("attention", pre=("norm1",)), Field("ffn", pre=("norm2",)))


def pre_norm_layout(layout: Layout) -> Layout:
    """The layout transform of pre-norm: each field's projection moves inside it,
    P(u + tau F(u)) -> u + tau F(P u) (docs/math.md 3.2). Idempotent."""
    return tuple(Field(f.operator, (f.projection,) if f.projection else f.pre, f.post, None)
                 for f in layout)
