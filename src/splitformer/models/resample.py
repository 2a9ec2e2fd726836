"""Functions on the image domain, sampled on a patch grid, resampled to another grid.

The image domain is Omega = [0, H] x [0, W] (pixels). A patch grid of patch size p = (p_h, p_w)
has its nodes at the patch centres x_ij = ((i + 1/2) p_h, (j + 1/2) p_w), 0 <= i < H / p_h,
0 <= j < W / p_w: a uniform grid of spacing p (docs/math.md 3.12). Two learned objects of a ViT
live on that grid, and both are read as discretisations of something defined on Omega, so that
the model can be evaluated on another grid (``ViT.with_patch_size``, ``ViT.with_image_size``):

* the position term: a learned table e (g_h x g_w rows) is the samples e_ij = p(x_ij) of a
  function p on Omega; on another grid it is p's interpolant evaluated at the new nodes,

      e' = I_{g -> g'} e                                    (``resample_grid``)

  with I the cell-centred interpolation of ``F.interpolate`` (align_corners=False), bicubic:
  the rule of Hugging Face's ``interpolate_pos_encoding`` (no anti-aliasing) and of timm's
  ``resample_abs_pos_embed`` (anti-aliased when the grid gets coarser);

* the patch embedding kernel K (N_y, C, p_h, p_w), f(x) = <K, image on patch(x)>. Resizing a
  patch is a linear map B (resize(z) = B z, B of shape (p'_h p'_w, p_h p_w), the same
  interpolation applied to the patch's basis, ``resize_matrix``). Asking that a resized patch
  give the same token, <z, K> = <B z, K'> for every patch z, is FlexiViT's PI-resize (Beyer et
  al., CVPR 2023):

      K' = (B^+)^T K                                        (``pi_resize``)

  <B z, K'> = <z, B^+ B K>: exact for every z when B has full column rank (p'_h >= p_h and
  p'_w >= p_w, the kernel refined: B^+ B = I), the least-squares K' (over z ~ N(0, I))
  otherwise (a coarser kernel cannot hold every detail of the finer one).

Both maps are linear and are applied to the base parameters in the forward pass, so the
gradients of a model evaluated on another grid reach the one set of parameters. At the base
grid both are the identity (the tensor itself, bit for bit).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..operators.convolution import pair

__all__ = ["INTERPOLATIONS", "PatchEmbedding", "Resampling", "grid_pair", "pi_resize",
           "resample_grid", "resize_matrix"]

INTERPOLATIONS = ("bilinear", "bicubic")


def grid_pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    """A size as (height, width) of positive ints; ValueError naming ``name`` otherwise."""
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        h, w = pair  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an int or a pair of ints (height, width), got "
                         f"{value!r}") from None
    for v in (h, w):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1 or a pair of them, got {value!r}")
    return int(h), int(w)


@dataclass(frozen=True)
class Resampling:
    """How a model moves its grid functions to another grid: the ``interpolation`` of
    ``F.interpolate`` ("bicubic" or "bilinear", align_corners=False) and whether it is
    ``antialias``-ed (a low-pass filter when the grid gets coarser; no effect when it gets
    finer). One rule for the position table and for the resize matrix B of PI-resize.

    The families' defaults: Hugging Face's ``interpolate_pos_encoding`` is ("bicubic",
    antialias=False); timm's ``resample_abs_pos_embed`` / ``resample_patch_embed`` (what
    ``checkpoint_filter_fn`` and ``dynamic_img_size`` use) are ("bicubic", antialias=True).
    """

    interpolation: str = "bicubic"
    antialias: bool = True

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got "
                             f"{self.interpolation!r}")
        if not isinstance(self.antialias, bool):
            raise TypeError(f"antialias must be a bool, got {self.antialias!r}")

    def but(self, interpolation: str | None = None, antialias: bool | None = None
            ) -> Resampling:
        """This rule with the given parts changed (None keeps them)."""
        return Resampling(self.interpolation if interpolation is None else interpolation,
                          self.antialias if antialias is None else antialias)


def _interpolate(x: torch.Tensor, size: tuple[int, int], rule: Resampling) -> torch.Tensor:
    return F.interpolate(x, size=size, mode=rule.interpolation, align_corners=False,
                         antialias=rule.antialias)


@functools.lru_cache(maxsize=64)
def _matrices(old: tuple[int, int], new: tuple[int, int], rule: Resampling
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, B^+) in float64 on the CPU: B (new_h new_w, old_h old_w), row-major pixels. Built
    outside inference mode, so that a cache filled under ``torch.inference_mode()`` serves a
    later training step (an inference tensor cannot be saved for backward)."""
    with torch.inference_mode(False), torch.no_grad():
        return _build_matrices(old, new, rule)


def _build_matrices(old: tuple[int, int], new: tuple[int, int], rule: Resampling
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    n_old = old[0] * old[1]
    basis = torch.eye(n_old, dtype=torch.float64).reshape(n_old, 1, *old)
    b = _interpolate(basis, new, rule).reshape(n_old, new[0] * new[1]).T.contiguous()
    return b, torch.linalg.pinv(b)


@functools.lru_cache(maxsize=64)
def _pinv_on(old: tuple[int, int], new: tuple[int, int], rule: Resampling, dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
    """B^+ in ``dtype`` on ``device`` (cached: not moved again at every forward pass; made
    outside inference mode, as ``_matrices``)."""
    with torch.inference_mode(False), torch.no_grad():
        return _matrices(old, new, rule)[1].to(dtype=dtype, device=device)


def resize_matrix(old: tuple[int, int], new: tuple[int, int], rule: Resampling = Resampling()
                  ) -> torch.Tensor:
    """B with resize(z) = B z for a patch z of ``old`` pixels flattened row-major: the
    columns are the resized basis patches (float64)."""
    return _matrices(grid_pair(old, "old"), grid_pair(new, "new"), rule)[0]


def pi_resize(weight: torch.Tensor, new: int | Sequence[int],
              rule: Resampling = Resampling()) -> torch.Tensor:
    """K' = (B^+)^T K: the patch kernel ``weight`` (N_y, C, p_h, p_w) resized to ``new`` pixels
    so that <z, K> = <resize(z), K'> (module docstring). ``weight`` itself when the size is
    unchanged; otherwise a differentiable function of it (B^+ is a cached constant, computed in
    float64)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        raise ValueError("pi_resize: weight must be a 4-D tensor (out, in, height, width)")
    old = (int(weight.shape[-2]), int(weight.shape[-1]))
    new = grid_pair(new, "new")
    if old == new:
        return weight
    pinv = _pinv_on(old, new, rule, weight.dtype, weight.device)
    out = weight.flatten(2) @ pinv  # (N_y, C, old) @ (old, new): K'^T = K^T B^+
    return out.reshape(*weight.shape[:2], *new)


def resample_grid(table: torch.Tensor, old: tuple[int, int], new: tuple[int, int],
                  rule: Resampling = Resampling()) -> torch.Tensor:
    """e' = I e: a table (B, g_h g_w, D) of samples on the ``old`` grid (row-major) as samples
    of its interpolant on the ``new`` grid, (B, g'_h g'_w, D). ``table`` itself when the grids
    are the same."""
    old, new = grid_pair(old, "old"), grid_pair(new, "new")
    if table.dim() != 3 or table.shape[1] != old[0] * old[1]:
        raise ValueError(f"resample_grid: table must have shape (batch, {old[0] * old[1]}, "
                         f"dim) for the grid {old}, got {tuple(table.shape)}")
    if old == new:
        return table
    b, _, d = table.shape
    grid = table.reshape(b, *old, d).permute(0, 3, 1, 2)
    return _interpolate(grid, new, rule).permute(0, 2, 3, 1).reshape(b, new[0] * new[1], d)


class PatchEmbedding(nn.Module):
    """f(x, y) = sum_c int_{patch(x)} K(y, c, s) image(c, s) ds + b(y) on the patch grid.

    A feature integral over the pixels of each patch: a Conv2d whose stride equals its kernel
    (weight K of shape (N_y, C, p_h, p_w)). Output (B, N_patches, N_y), row-major in the grid.

    ``patch_size`` is the grid's patch (the stride); the parameter ``weight`` keeps the size it
    was made at (``base_patch_size``). On another patch size the kernel is
    ``pi_resize(weight)`` (``kernel()``), computed in the forward pass, so that the gradient
    reaches ``weight``; ``resampling`` is the interpolation of PI-resize's B.
    """

    def __init__(
        self,
        in_chans: int,
        dim: int,
        patch_size: int | Sequence[int],
        *,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.in_chans, self.dim = int(in_chans), int(dim)
        self.patch_size = pair(patch_size, "patch_size")
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(dim, in_chans, *self.patch_size, **kw))
        self.bias = nn.Parameter(torch.empty(dim, **kw)) if bias else None
        self.resampling = Resampling()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight[0].numel()
            nn.init.uniform_(self.bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))

    @property
    def base_patch_size(self) -> tuple[int, int]:
        """The patch size of the parameter ``weight``."""
        return (int(self.weight.shape[-2]), int(self.weight.shape[-1]))

    def extra_repr(self) -> str:
        base = ("" if self.base_patch_size == self.patch_size
                else f", PI-resized from {self.base_patch_size}")
        return (f"in_chans={self.in_chans}, dim={self.dim}, patch_size={self.patch_size}, "
                f"bias={self.bias is not None}{base}")

    def kernel(self) -> torch.Tensor:
        """K on the grid's patch: ``weight`` itself at its own size, else its PI-resize."""
        return pi_resize(self.weight, self.patch_size, self.resampling)

    def grid(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The patch field on the 2-D grid: (B, N_y, H / p_h, W / p_w)."""
        return F.conv2d(pixel_values, self.kernel(), self.bias, stride=self.patch_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.grid(pixel_values).flatten(2).transpose(1, 2)
