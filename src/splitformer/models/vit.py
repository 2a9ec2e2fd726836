"""The Vision Transformer as an evolution on the 2-D patch grid.

Space. The image (C channels, H x W pixels) is cut into patches of p_h x p_w pixels. The token
variable x runs over the patch grid Omega_x = {0..H/p_h - 1} x {0..W/p_w - 1} (a 2-D domain,
flattened row-major, x = i * (W/p_w) + j) plus P "prefix" points: the class token and R register
tokens are extra points of Omega_x whose initial value is a learned constant instead of an
image patch. y in Omega_y = {1..N_y} is the feature variable.

Initial condition. For a patch point x,

    f(x, y) = int_{patch(x)} sum_c K(y, c, s) image(c, s) ds + b(y) + e(x, y)

the patch embedding is a feature integral over the pixels of one patch (a Conv2d whose stride
equals its kernel, ``PatchEmbedding``) and e(x, .) is the learned position embedding. For a
prefix point, f(x, .) = token + e(x, .) (timm's ``no_embed_class`` drops e on the prefix
points). Optional: dropout on f, and a LayerNorm of f (timm's ``pre_norm``, CLIP style) which
makes f lie on the LayerNorm manifold.

Evolution. Pre-LN blocks are explicit Euler for the projected vector field (docs/math.md 3.2)

    u_t = A(P1 u) + G(P2 u),     one step:  u <- u + tau A(P1 u);  u <- u + tau G(P2 u)

i.e. the scheme ``prenorm``: Stage("attention", pre=("norm1",)), Stage("ffn", pre=("norm2",)).
With LayerScale the fields are followed by diagonal operators D_1, D_2 (``post=("ls1",)``,
``("ls2",)``): u <- u + tau gamma_1(y) A(P1 u), a per-feature step tau(y) = tau gamma(y)
(``operators.scaling``).

Read-out R (choices, not special cases):

* ``final_norm``: a LayerNorm of u(T) (HF's ``layernorm``, timm's ``norm``); HF's
  ``last_hidden_state`` and timm's ``forward_features`` are u(T) after it;
* ``pool``: None (no pooled read-out), "" (identity, timm ``global_pool=''``), "token" (value at
  the class-token point), "avg" / "max" / "avgmax" (mean / max over the patch points, the
  prefix points excluded unless ``pool_include_prefix``);
* ``fc_norm``: a LayerNorm after pooling (timm's ``fc_norm``, default with avg pooling);
* ``pooler``: s(W v + b) of the pooled vector (HF's ViTPooler: dense + tanh);
* ``head``: the classifier, a feature integral (or the identity when it has 0 classes).

Space as a grid (docs/math.md 3.12). The patch grid is a uniform quadrature rule on the image
domain (nodes at the patch centres, spacing p). The forward pass takes the token grid as data:
``token_weights`` w_j (the quadrature weights, (N,) or (B, N) over all N tokens, the prefix
points first; None = uniform) and ``token_coords`` x_j (None = the index), handed to the
kernels in the ``Context``; the mean-pooling read-out is the quadrature mean
sum_j w_j u_j / sum_j w_j over the patch points (``operators.token_grid.weighted_mean``), the
max over the nodes of positive weight. ``with_patch_size(p)`` / ``with_image_size(s)``
evaluate the model on another patch grid: the position table read as samples of a function
p(x) and resampled, the patch kernel PI-resized (``models.resample``); both computed from the
one set of parameters in the forward pass.

Two read-outs, two classes: ``ViT`` returns a ``ViTOutput`` (attributes ``last_hidden_state``,
``pooler_output``, ``logits``: Hugging Face's ViTModel / ViTForImageClassification), and
``TimmViT`` returns exactly the tensor of timm's ``model(x)`` (logits, or pooled features when
num_classes = 0). Both have ``outputs(...)``, ``forward_features(...)``, ``forward_head(...)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..operators import (
    Activation,
    Context,
    FeatureIntegral,
    FeedForward,
    LayerNormProjection,
    NonlocalAttention,
)
from ..operators.convolution import pair
from ..operators.scaling import DiagonalScaling
from ..operators.token_grid import weighted_mean
from ..time import Controls, Evolution, TimeGrid
from ..time.schemes.families import LAYERSCALE_LAYOUT as LAYERSCALE_LAYOUT
from ..time.schemes.families import prenorm_layerscale, vit_scheme
from .base import EvolutionModel, shared_copy
from .blocks import block_controls
from .masks import with_token_grid
from .outputs import ModelOutput
from .resample import PatchEmbedding, Resampling, grid_pair, resample_grid

__all__ = [
    "FAMILY_RESAMPLING",
    "ImageEmbedding",
    "PatchEmbedding",
    "Pooler",
    "TimmViT",
    "ViT",
    "ViTOutput",
    "build_vit",
    "prenorm_layerscale",
    "vit_controls",
]

POOLS = (None, "", "token", "avg", "max", "avgmax")
READ_OUTS = ("hf", "timm")
# how each read-out's family resamples its grid functions (models.resample.Resampling)
FAMILY_RESAMPLING = {"hf": Resampling("bicubic", antialias=False),
                     "timm": Resampling("bicubic", antialias=True)}


@dataclass
class ViTOutput(ModelOutput):
    """What a ViT returns in the "hf" format (attribute access like transformers' outputs).

    logits: the classifier head's output, or None when the model has no head (first, so that
    ``out[0]`` is the logits of a classifier and u(T) otherwise, as in transformers);
    last_hidden_state: u(T) after the final norm, (B, N_x, N_y);
    pooler_output: the pooled read-out (HF's pooler when present), or None.
    """

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None


class ImageEmbedding(nn.Module):
    """The initial condition f on Omega_x = prefix points + patch grid (see the module doc).

    f = [class token, register tokens, patches] + e, with e the position embedding on all
    points (``position_prefix=True``: HF, timm default) or on the patch points only
    (``position_prefix=False``: timm's ``no_embed_class``); then dropout, then the optional
    LayerNorm ``pre_norm``.

    The grid it evaluates on (``image_size``, ``patch.patch_size``, ``grid_size``) may differ
    from the grid of its parameters (``position_grid``, ``patch.base_patch_size``): the patch
    part of e is then the table resampled from ``position_grid`` (``position_on``), the kernel
    PI-resized (``regrid``; ``ViT.with_patch_size`` / ``with_image_size``).
    """

    def __init__(
        self,
        image_size: int | Sequence[int],
        patch_size: int | Sequence[int],
        in_chans: int,
        dim: int,
        *,
        patch_bias: bool = True,
        class_token: bool = True,
        reg_tokens: int = 0,
        position: bool = True,
        position_prefix: bool = True,
        dropout: float = 0.0,
        pre_norm: LayerNormProjection | None = None,
        resampling: Resampling | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.image_size = pair(image_size, "image_size")
        self.base_image_size = self.image_size
        self.patch = PatchEmbedding(in_chans, dim, patch_size, bias=patch_bias, **kw)
        if resampling is not None:
            if not isinstance(resampling, Resampling):
                raise TypeError(f"resampling must be a models.resample.Resampling, got "
                                f"{type(resampling).__name__}")
            self.patch.resampling = resampling
        ph, pw = self.patch.patch_size
        self.grid_size = (self.image_size[0] // ph, self.image_size[1] // pw)
        if self.image_size[0] % ph or self.image_size[1] % pw:
            warnings.warn(f"image_size={self.image_size} is not a multiple of patch_size="
                          f"{(ph, pw)}: the last {self.image_size[0] % ph} rows and "
                          f"{self.image_size[1] % pw} columns of pixels are outside every patch "
                          "(as in transformers and timm)", stacklevel=2)
        self.position_grid = self.grid_size  # the grid the table's patch rows sample
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.dim = dim
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim, **kw)) if class_token else None
        self.register_tokens = (nn.Parameter(torch.zeros(1, reg_tokens, dim, **kw))
                                if reg_tokens else None)
        self.num_reg_tokens = int(reg_tokens)
        self.num_prefix_tokens = int(class_token) + self.num_reg_tokens
        self.position_prefix = bool(position_prefix)
        n_pos = self.num_patches + (self.num_prefix_tokens if position_prefix else 0)
        self.position = nn.Parameter(torch.zeros(1, n_pos, dim, **kw)) if position else None
        if self.position is not None:
            nn.init.trunc_normal_(self.position, std=0.02)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    @property
    def num_tokens(self) -> int:
        """N_x: prefix points plus patch points."""
        return self.num_prefix_tokens + self.num_patches

    @property
    def resampling(self) -> Resampling:
        """The interpolation rule of the position table and of PI-resize."""
        return self.patch.resampling

    @property
    def on_base_grid(self) -> bool:
        """Whether the model evaluates on the grid of its parameters (not derived by
        ``with_patch_size`` / ``with_image_size``)."""
        return (self.patch.patch_size == self.patch.base_patch_size
                and self.image_size == self.base_image_size)

    def extra_repr(self) -> str:
        base = "" if self.grid_size == self.position_grid else \
            f", position resampled from {self.position_grid}"
        return (f"image_size={self.image_size}, grid={self.grid_size}, "
                f"prefix={self.num_prefix_tokens}, position_prefix={self.position_prefix}{base}")

    def regrid(self, image_size: tuple[int, int], patch_size: tuple[int, int],
               resampling: Resampling, where: str) -> None:
        """Evaluate on the patch grid of ``image_size`` / ``patch_size`` (in place: call it on
        a copy). ValueError naming ``where`` when the patch does not tile the image."""
        if image_size[0] % patch_size[0] or image_size[1] % patch_size[1]:
            raise ValueError(f"{where}: patch_size={patch_size} must divide the image size "
                             f"{image_size} (every pixel in one patch: the patch grid is a "
                             "quadrature rule on the whole image)")
        self.image_size, self.patch.patch_size = image_size, patch_size
        self.patch.resampling = resampling
        self.grid_size = (image_size[0] // patch_size[0], image_size[1] // patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]

    def check(self, pixel_values: torch.Tensor, *, any_size: bool = False) -> None:
        if not isinstance(pixel_values, torch.Tensor):
            raise TypeError("pixel_values must be a torch.Tensor, got "
                            f"{type(pixel_values).__name__}")
        if pixel_values.dim() != 4:
            raise ValueError("pixel_values must have shape (batch, channels, height, width), got "
                             f"{tuple(pixel_values.shape)}")
        c = self.patch.in_chans
        if pixel_values.shape[1] != c:
            raise ValueError(f"pixel_values has {pixel_values.shape[1]} channels, the model "
                             f"expects {c}")
        h, w = pixel_values.shape[-2:]
        if not any_size and (h, w) != self.image_size:
            raise ValueError(f"input image size ({h}*{w}) doesn't match the model "
                             f"({self.image_size[0]}*{self.image_size[1]}); pass "
                             "interpolate_pos_encoding=True to resample the position embedding, "
                             f"or evaluate model.with_image_size(({h}, {w}))")
        p = self.patch.weight
        if pixel_values.device != p.device:
            raise ValueError(f"pixel_values is on {pixel_values.device} but the model is on "
                             f"{p.device}")

    def prefix(self, batch: int) -> list[torch.Tensor]:
        out = []
        if self.class_token is not None:
            out.append(self.class_token.expand(batch, -1, -1))
        if self.register_tokens is not None:
            out.append(self.register_tokens.expand(batch, -1, -1))
        return out

    def position_on(self, grid: tuple[int, int]) -> torch.Tensor:
        """e on the patch grid ``grid``: the table itself on ``position_grid``, else its patch
        part resampled (``models.resample.resample_grid``, this embedding's ``resampling``);
        the prefix part is kept."""
        assert self.position is not None
        if grid == self.position_grid:
            return self.position
        npre = self.num_prefix_tokens if self.position_prefix else 0
        pre, patch = self.position[:, :npre], self.position[:, npre:]
        patch = resample_grid(patch, self.position_grid, grid, self.resampling)
        return torch.cat((pre, patch), dim=1)

    def interpolated_position(self, height: int, width: int) -> torch.Tensor:
        """e resampled onto the patch grid of a height x width image (``position_on``), as
        Hugging Face's ``interpolate_pos_encoding`` does: no change when the number of patches
        is the table's and the image is square."""
        assert self.position is not None
        ph, pw = self.patch.patch_size
        gh, gw = height // ph, width // pw
        g0, g1 = self.position_grid
        if gh * gw == g0 * g1 and height == width:
            return self.position
        return self.position_on((gh, gw))

    def forward(self, pixel_values: torch.Tensor,
                interpolate_pos_encoding: bool = False) -> torch.Tensor:
        self.check(pixel_values, any_size=interpolate_pos_encoding)
        b = pixel_values.shape[0]
        f = self.patch(pixel_values)
        prefix = self.prefix(b)
        if self.position is None:
            # timm: without a position embedding there is no position dropout either
            f = torch.cat([*prefix, f], dim=1) if prefix else f
        else:
            pos = (self.interpolated_position(*pixel_values.shape[-2:])
                   if interpolate_pos_encoding else self.position_on(self.grid_size))
            if self.position_prefix:
                f = torch.cat([*prefix, f], dim=1) if prefix else f
                f = f + pos
            else:
                f = f + pos
                f = torch.cat([*prefix, f], dim=1) if prefix else f
            f = self.dropout(f)
        if self.pre_norm is not None:
            f = self.pre_norm(f)
        return f


class Pooler(nn.Module):
    """p = s(W v + b): a dense feature integral and a pointwise map of the pooled vector v.

    Hugging Face's ViTPooler (s = tanh) applied to the class-token value v = u(T)(x_cls, .).
    """

    def __init__(self, dim: int, out_dim: int, activation: str = "tanh", *, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.dense = FeatureIntegral(dim, out_dim, device=device, dtype=dtype)
        self.activation = Activation(activation)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(v))


def vit_controls(
    dim: int,
    num_heads: int,
    hidden_dim: int,
    depth: int,
    *,
    qkv_bias: bool = True,
    proj_bias: bool = True,
    activation: str = "gelu",
    norm_eps: float = 1e-6,
    layer_scale: float | None = None,
    attn_dropout: float = 0.0,
    out_dropout: float = 0.0,
    ffn_dropout: float = 0.0,
    device=None,
    dtype=None,
) -> Controls:
    """theta^1..theta^L of a pre-LN ViT: attention, norm1, ffn, norm2 (and ls1, ls2).

    ``qkv_bias`` is the bias of the Q/K/V feature integrals, ``proj_bias`` that of W_O and of
    the feed-forward stages (timm's naming); ``out_dropout`` acts on A's output and on G's
    output, ``ffn_dropout`` on G's hidden field.
    """
    kw = {"device": device, "dtype": dtype}

    def layer_scales(n: int) -> dict[str, nn.Module]:
        if layer_scale is None:
            return {}
        return {"ls1": DiagonalScaling(dim, layer_scale, **kw),
                "ls2": DiagonalScaling(dim, layer_scale, **kw)}

    return block_controls(
        depth,
        attention=lambda n: NonlocalAttention(dim, num_heads, bias=qkv_bias, out_bias=proj_bias,
                                              attn_dropout=attn_dropout,
                                              out_dropout=out_dropout, **kw),
        norm=lambda n: LayerNormProjection(dim, eps=norm_eps, **kw),
        ffn=lambda n: FeedForward([dim, hidden_dim, dim], activation=activation,
                                  bias=proj_bias, dropout=ffn_dropout, out_dropout=out_dropout,
                                  **kw),
        extra=layer_scales,
    )


class ViT(EvolutionModel):
    """A Vision Transformer: initial condition f (``embedding``), ``evolution``, read-out.

    forward(pixel_values, attention_mask=None, *, is_causal=False,
    interpolate_pos_encoding=None, token_weights=None, token_coords=None) returns a
    ``ViTOutput`` (Hugging Face's read-out). ``attention_mask``: a (B, N_x) padding mask over
    the tokens (1 / True = attend) or a prepared 4-D mask (``attn_mask`` is accepted as an
    alias). ``token_weights`` / ``token_coords``: the token grid (quadrature weights w_j > 0,
    0 = padding; node coordinates), (N_x,) or (B, N_x) over all tokens, prefix points first
    (module docstring). Pixel values of another float dtype are converted, as transformers
    does.

    ``with_patch_size(p)`` / ``with_image_size(s)``: the model on another patch grid (shared
    parameters; see there).
    """

    def __init__(
        self,
        embedding: ImageEmbedding,
        evolution: Evolution,
        *,
        final_norm: nn.Module | None = None,
        pool: str | None = "token",
        pool_include_prefix: bool = False,
        fc_norm: nn.Module | None = None,
        pooler: Pooler | None = None,
        head_dropout: float = 0.0,
        head: nn.Module | None = None,
        source: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        if pool == "token" and embedding.class_token is None:
            raise ValueError("pool='token' needs a class token")
        self.embedding = embedding
        self.evolution = evolution
        self.final_norm = final_norm
        self.pool = pool
        self.pool_include_prefix = bool(pool_include_prefix)
        self.fc_norm = fc_norm
        self.pooler = pooler
        self.head_dropout = nn.Dropout(head_dropout)
        self.head = head
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)
        attn = evolution.controls[0]["attention"]
        self.dim = attn.dim
        self.num_heads = attn.num_heads

    @property
    def num_prefix_tokens(self) -> int:
        return self.embedding.num_prefix_tokens

    # -- initial condition and kernel support ----------------------------------------------
    def _pixels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Pixel values in the parameters' dtype (converted, as transformers' ViTModel does)."""
        dt = self.embedding.patch.weight.dtype
        if isinstance(pixel_values, torch.Tensor) and pixel_values.dtype != dt:
            return pixel_values.to(dt)
        return pixel_values

    def context(self, attention_mask: torch.Tensor | None, is_causal: bool, u0: torch.Tensor
                ) -> Context:
        """The kernel support from the mask (see the class docstring for the conventions)."""
        if attention_mask is None:
            return Context(is_causal=bool(is_causal))
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"attention_mask must be a torch.Tensor, got "
                            f"{type(attention_mask).__name__}")
        if is_causal:
            raise ValueError("pass an attention mask or is_causal=True, not both")
        b, n, _ = u0.shape
        m = attention_mask.to(u0.device)
        if m.dim() == 2:  # a padding mask over the tokens (1 / True = attend)
            if tuple(m.shape) != (b, n):
                raise ValueError(f"attention_mask must have shape (batch, tokens) = ({b}, {n}) "
                                 f"(tokens include the class token), got {tuple(m.shape)}")
            return Context(attn_mask=m.bool().view(b, 1, 1, n))
        return self._prepared_mask(m, u0)

    @staticmethod
    def _prepared_mask(m: torch.Tensor, u0: torch.Tensor) -> Context:
        """A mask in scaled_dot_product_attention's convention, used as given."""
        if m.dtype != torch.bool and m.dtype != u0.dtype:
            raise TypeError(f"attention_mask must be bool or {u0.dtype}, got {m.dtype}")
        return Context(attn_mask=m)

    def initial_condition(
        self,
        pixel_values: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        interpolate_pos_encoding: bool | None = None,
        bool_masked_pos: torch.Tensor | None = None,
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Context]:
        """f = u(0) on the token points (B, N_x, N_y), and the kernel's support and grid."""
        if bool_masked_pos is not None:
            raise ValueError("bool_masked_pos is not supported (use_mask_token: the masked-image-"
                             "modeling mask token is not part of this model)")
        if attn_mask is not None:
            if attention_mask is not None:
                raise ValueError("pass the mask as attention_mask or attn_mask, not both")
            attention_mask = attn_mask
        u0 = self.embedding(self._pixels(pixel_values), bool(interpolate_pos_encoding))
        return u0, _with_grid(self.context(attention_mask, is_causal, u0), u0, token_weights,
                              token_coords)

    # -- evolution and read-out ------------------------------------------------------------
    def forward_features(self, pixel_values: torch.Tensor,
                         attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """u(T) after the final norm (HF's last_hidden_state, timm's forward_features)."""
        u0, ctx = self.initial_condition(pixel_values, attention_mask, **kwargs)
        return self.features(self._unmerged(self.evolution(u0, ctx), ctx))

    def features(self, u: torch.Tensor) -> torch.Tensor:
        """The final norm of u(T) (identity when None)."""
        return self.final_norm(u) if self.final_norm is not None else u

    def pool_tokens(self, u: torch.Tensor, token_weights: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """The pooling read-out of u(T) (timm's ``pool``): "avg" is the quadrature mean
        sum_j w_j u_j / sum_j w_j over the patch points (``token_weights`` over all N_x
        tokens; None: the plain mean, bit for bit), "max" the max over the points of positive
        weight; "token" the class-token value."""
        if self.pool is None or self.pool == "":
            return u
        if self.pool == "token":
            return u[:, 0]
        start = 0 if self.pool_include_prefix else self.num_prefix_tokens
        x = u[:, start:]
        w = None if token_weights is None else token_weights[..., start:]
        if self.pool == "avg":
            return weighted_mean(x, w)
        if w is None:
            top = x.amax(dim=1)
        else:  # the max over the nodes, padding (weight 0) excluded
            padding = torch.broadcast_to(w.to(x.device) == 0, x.shape[:2]).unsqueeze(-1)
            top = x.masked_fill(padding, float("-inf")).amax(dim=1)
        return top if self.pool == "max" else 0.5 * (top + weighted_mean(x, w))

    def pre_logits(self, u: torch.Tensor, token_weights: torch.Tensor | None = None
                   ) -> torch.Tensor:
        """fc_norm(pool(u)): the vector the classifier reads."""
        v = self.pool_tokens(u, token_weights)
        return self.fc_norm(v) if self.fc_norm is not None else v

    def forward_head(self, u: torch.Tensor, pre_logits: bool = False, *,
                     token_weights: torch.Tensor | None = None) -> torch.Tensor:
        """timm's forward_head: pool, fc_norm, dropout, classifier."""
        v = self.head_dropout(self.pre_logits(u, token_weights))
        if pre_logits or self.head is None:
            return v
        return self.head(v)

    def hf_outputs(self, u: torch.Tensor, token_weights: torch.Tensor | None = None
                   ) -> ViTOutput:
        """Every read-out of u(T) as a ``ViTOutput``."""
        u = self.features(u)
        pooled = logits = None
        if self.pool is not None:
            v = self.pre_logits(u, token_weights)
            pooled = self.pooler(v) if self.pooler is not None else v
            if self.head is not None:
                logits = self.head(self.head_dropout(v))
        return ViTOutput(last_hidden_state=u, pooler_output=pooled, logits=logits)

    def outputs(self, pixel_values: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs) -> ViTOutput:
        """All read-outs as a ``ViTOutput`` whatever the model's own read-out."""
        u0, ctx = self.initial_condition(pixel_values, attention_mask, **kwargs)
        u = self._unmerged(self.evolution(u0, ctx), ctx)  # the input grid back (merging)
        return self.hf_outputs(u, ctx.token_weights)

    def read_out(self, u: torch.Tensor, context: Context) -> ViTOutput:
        return self.hf_outputs(u, context.token_weights)

    def forward(
        self,
        pixel_values: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        interpolate_pos_encoding: bool | None = None,
        bool_masked_pos: torch.Tensor | None = None,
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
    ) -> ViTOutput | torch.Tensor:
        return self.solve(pixel_values, attention_mask, attn_mask=attn_mask, is_causal=is_causal,
                          interpolate_pos_encoding=interpolate_pos_encoding,
                          bool_masked_pos=bool_masked_pos, token_weights=token_weights,
                          token_coords=token_coords)

    # -- the model on another grid (shared parameters) ---------------------------------------
    def with_patch_size(self, patch_size: int | Sequence[int], *,
                        interpolation: str | None = None, antialias: bool | None = None
                        ) -> ViT:
        """The same model (shared parameters) on the grid of patch ``patch_size`` over the
        same image size: N_x = prefix + (H / p_h)(W / p_w) tokens.

        Shared: every parameter (the patch kernel and the position table at the sizes they
        were made at, the tokens, the controls, the read-out). Derived in every forward pass
        from the shared ones (so that training the new model trains them): the patch kernel
        K_p = pi_resize(K) and the patch rows of the position table, resampled to the new grid
        (``models.resample``; ``interpolation`` / ``antialias`` default to the model's
        ``embedding.resampling``: bicubic, anti-aliased for timm, not for Hugging Face). At the
        parameters' own patch size the model computes what this one does, bit for bit.
        ValueError naming ``patch_size`` when it does not divide the image size."""
        return self._on_grid(self.embedding.image_size, grid_pair(patch_size, "patch_size"),
                             interpolation, antialias, "with_patch_size")

    def with_image_size(self, image_size: int | Sequence[int], *,
                        interpolation: str | None = None, antialias: bool | None = None
                        ) -> ViT:
        """The same model (shared parameters) on images of ``image_size`` pixels at its patch
        size: the position table resampled to the new grid (as ``with_patch_size``; what HF's
        ``interpolate_pos_encoding=True`` does, for an HF model). ValueError naming the size
        when the patch does not divide it."""
        return self._on_grid(grid_pair(image_size, "image_size"), self.embedding.patch.patch_size,
                             interpolation, antialias, "with_image_size")

    def _on_grid(self, image_size: tuple[int, int], patch_size: tuple[int, int],
                 interpolation: str | None, antialias: bool | None, where: str) -> ViT:
        rule = self.embedding.resampling.but(interpolation, antialias)
        new = shared_copy(self)
        new.embedding.regrid(image_size, patch_size, rule, where)
        return new


class TimmViT(ViT):
    """A ViT with timm's read-out: forward returns exactly the tensor of timm's ``model(x)``
    (``forward_head(forward_features(x))``: logits, or pooled features without a classifier).

    ``attention_mask`` (or ``attn_mask``) is handed to scaled_dot_product_attention as is, and
    pixel values must have the parameters' dtype (timm does not convert).
    """

    def _pixels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Pixel values must have the parameters' dtype (timm does not convert)."""
        dt = self.embedding.patch.weight.dtype
        if isinstance(pixel_values, torch.Tensor) and pixel_values.dtype != dt:
            raise TypeError(f"pixel_values has dtype {pixel_values.dtype} but the model's "
                            f"parameters are {dt}; convert one of them")
        return pixel_values

    def context(self, attention_mask: torch.Tensor | None, is_causal: bool, u0: torch.Tensor
                ) -> Context:
        """timm hands any mask to scaled_dot_product_attention as is."""
        if attention_mask is None or is_causal or not isinstance(attention_mask, torch.Tensor):
            return super().context(attention_mask, is_causal, u0)
        return self._prepared_mask(attention_mask.to(u0.device), u0)

    def read_out(self, u: torch.Tensor, context: Context) -> torch.Tensor:
        return self.forward_head(self.features(u), token_weights=context.token_weights)


def _with_grid(context: Context, u0: torch.Tensor, token_weights: torch.Tensor | None,
               token_coords: torch.Tensor | None) -> Context:
    """``context`` with the token grid of the forward pass (checked: (N_x,) or (B, N_x) over
    all tokens, prefix points first; errors name the argument)."""
    b, n = u0.shape[:2]
    return with_token_grid(context, token_weights, token_coords, batch=b, seq=n,
                           owner="ViT (the N_x tokens are the class and register tokens, "
                                 "then the patches)", dtype=u0.dtype)


def build_vit(
    *,
    image_size: int | Sequence[int],
    patch_size: int | Sequence[int],
    in_chans: int = 3,
    dim: int,
    depth: int,
    num_heads: int,
    hidden_dim: int,
    qkv_bias: bool = True,
    proj_bias: bool = True,
    patch_bias: bool = True,
    activation: str = "gelu",
    norm_eps: float = 1e-6,
    layer_scale: float | None = None,
    class_token: bool = True,
    reg_tokens: int = 0,
    position: bool = True,
    position_prefix: bool = True,
    pre_norm: bool = False,
    final_norm: bool = True,
    pool: str | None = "token",
    pool_include_prefix: bool = False,
    fc_norm: bool = False,
    pooler: tuple[int, str] | None = None,
    num_classes: int | None = None,
    embed_dropout: float = 0.0,
    attn_dropout: float = 0.0,
    out_dropout: float = 0.0,
    ffn_dropout: float = 0.0,
    head_dropout: float = 0.0,
    read_out: str = "hf",
    source: dict[str, Any] | None = None,
    device=None,
    dtype=None,
) -> ViT:
    """A ViT with random weights (T = depth, tau = 1).

    ``read_out``: "hf" (a ``ViT``, transformers' outputs; resampled as HF does on another grid,
    ``FAMILY_RESAMPLING``) or "timm" (a ``TimmViT``, timm's tensor; as timm does).
    ``pooler=(out_dim, activation)`` adds HF's pooler; ``num_classes=None`` means no
    classifier, 0 an identity classifier, k > 0 a k-class feature integral."""
    _check_num_classes(num_classes)
    kw = {"device": device, "dtype": dtype}
    embedding = ImageEmbedding(
        image_size, patch_size, in_chans, dim, patch_bias=patch_bias, class_token=class_token,
        reg_tokens=reg_tokens, position=position, position_prefix=position_prefix,
        dropout=embed_dropout,
        pre_norm=LayerNormProjection(dim, eps=norm_eps, **kw) if pre_norm else None, **kw,
    )
    evolution = _vit_evolution(
        dim, num_heads, hidden_dim, depth, qkv_bias=qkv_bias, proj_bias=proj_bias,
        activation=activation, norm_eps=norm_eps, layer_scale=layer_scale,
        attn_dropout=attn_dropout, out_dropout=out_dropout, ffn_dropout=ffn_dropout, **kw,
    )
    return _vit_model(
        read_out, embedding, evolution, dim=dim, norm_eps=norm_eps, final_norm=final_norm,
        pool=pool, pool_include_prefix=pool_include_prefix, fc_norm=fc_norm, pooler=pooler,
        num_classes=num_classes, head_dropout=head_dropout, source=source, kw=kw,
    )


def _vit_evolution(dim: int, num_heads: int, hidden_dim: int, depth: int, *,
                   layer_scale: float | None, **options: Any) -> Evolution:
    """``vit_controls`` under ``vit_scheme`` on T = depth, tau = 1 (one block per step)."""
    controls = vit_controls(dim, num_heads, hidden_dim, depth, layer_scale=layer_scale, **options)
    return Evolution(controls, vit_scheme(layer_scale is not None), TimeGrid(depth, depth))


def _check_num_classes(num_classes: int | None) -> None:
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(
            num_classes, int) or num_classes < 0):
        raise ValueError(f"num_classes must be None (no head), 0 (identity head) or an int > 0, "
                         f"got {num_classes!r}")


def _vit_model(read_out: str, embedding: ImageEmbedding, evolution: Evolution, *, dim: int,
               norm_eps: float, final_norm: bool, pool: str | None, pool_include_prefix: bool,
               fc_norm: bool, pooler: tuple[int, str] | None, num_classes: int | None,
               head_dropout: float, source: dict[str, Any] | None, kw: dict) -> ViT:
    """The read-out of ``build_vit`` around its embedding and evolution: the classifier head
    (made first), then the final norm, fc_norm and pooler, in the ``read_out`` format."""
    head: nn.Module | None = None
    if num_classes is not None:
        head = FeatureIntegral(dim, num_classes, **kw) if num_classes > 0 else nn.Identity()
    if read_out not in READ_OUTS:
        raise ValueError(f"read_out must be one of {READ_OUTS}, got {read_out!r}")
    embedding.patch.resampling = FAMILY_RESAMPLING[read_out]
    return (ViT if read_out == "hf" else TimmViT)(
        embedding,
        evolution,
        final_norm=LayerNormProjection(dim, eps=norm_eps, **kw) if final_norm else None,
        pool=pool,
        pool_include_prefix=pool_include_prefix,
        fc_norm=LayerNormProjection(dim, eps=norm_eps, **kw) if fc_norm else None,
        pooler=Pooler(dim, pooler[0], pooler[1], **kw) if pooler is not None else None,
        head_dropout=head_dropout,
        head=head,
        source=source,
    )
