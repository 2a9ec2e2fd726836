"""The one primitive of every weight map: copy a source tensor into a control, checked."""

from __future__ import annotations

import torch

__all__ = ["copy_weight"]


def copy_weight(dst: torch.Tensor | None, src: torch.Tensor | None, what: str) -> None:
    """dst <- src (no autograd), after checking both exist (or neither) and shapes agree.

    ``what`` names the weight in the error message.
    """
    if dst is None and src is None:
        return
    if dst is None or src is None:
        raise ValueError(f"{what}: present on one side only (a bias on one side and not the "
                         "other?)")
    if dst.shape != src.shape:
        raise ValueError(f"{what}: shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src)
