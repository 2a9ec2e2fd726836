"""The one primitive of every weight map: copy a source tensor into a control, checked."""

from __future__ import annotations

import torch

__all__ = ["check_softmax", "copy_table", "copy_weight", "network_scheme"]


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


def _get(module, name: str):
    obj = module
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def copy_table(dst_root, src_root, table, *, reverse: bool = False) -> None:
    """Copy every (foreign name, our name) pair of ``table``: foreign -> ours, or ours ->
    foreign with ``reverse``. Names are dotted attribute paths from the two roots."""
    for theirs, ours in table:
        if reverse:
            copy_weight(_get(dst_root, theirs), _get(src_root, ours), ours)
        else:
            copy_weight(_get(dst_root, ours), _get(src_root, theirs), theirs)


def network_scheme(evolution, schemes: dict, target: str, where: str = "") -> str:
    """Check that ``evolution`` is a network the target library can hold, and say which one.

    A network is tau = 1 (one step per layer), controls constant in time, and a scheme whose
    stages equal one of ``schemes`` (name -> Scheme); returns that name. ``target`` names the
    library in the error ("to_hf", ...), ``where`` the part of the model ("stage 2", ...).
    """
    at = f" in {where}" if where else ""
    if evolution.tau != 1.0:
        raise ValueError(f"{target} needs tau = 1 (one step per layer){at}, got "
                         f"tau={evolution.tau:g}: a refined evolution is not a network")
    if evolution.controls.interpolation != "constant":
        raise ValueError(f"{target} needs controls constant in time (the network){at}, got "
                         f"interpolation={evolution.controls.interpolation!r}")
    for name, scheme in schemes.items():
        if evolution.scheme.stages == scheme.stages:
            return name
    wanted = ", ".join(f"{n!r} [{s}]" for n, s in schemes.items())
    raise ValueError(f"{target} needs the scheme {wanted}{at}, got {evolution.scheme.name!r} "
                     f"[{evolution.scheme}]")


def check_softmax(evolution, target: str, names=("attention", "cross_attention"),
                  scales=None) -> None:
    """Every attention operator of ``evolution`` uses the softmax kernel with the scale the
    target computes (``scales[n]`` for step n, default None = 1/sqrt(d_h))."""
    from ..operators.kernels import SoftmaxKernel

    for n, theta in enumerate(evolution.controls):
        want = None if scales is None else scales[n]
        for name in names:
            if name not in theta:
                continue
            k = theta[name].kernel
            if type(k) is not SoftmaxKernel or k.scale != want:
                raise ValueError(f"{target} needs the softmax kernel with scale "
                                 f"{'1/sqrt(d_h)' if want is None else want} in step {n} "
                                 f"{name}, got {k!r} with scale {getattr(k, 'scale', None)}")
