"""CvT (Convolutional vision Transformer) as a multigrid of evolutions (docs/math.md 3.7).

The model has S stages. Stage s lives on its own token grid Omega_x^s (H_s x W_s points, each
coarser than the last) and feature domain of width C_s, and runs its own evolution in depth:

    f_s      = R_s(u_{s-1}(T_{s-1}))            (u_0(T_0) := the image, C_0 = channels)
    u_s(0)   = [c_s ; f_s]                       (class token c_s prepended where the stage has one)
    u_s(T_s) = Evolution_s(u_s(0))               (T_s = depth_s, tau = 1: the network)

R_s, the convolutional token embedding, is the restriction between grids:

    R_s[u](x, z) = LN( sum_{c, d} k_s(d, c, z) u(sigma_s x + d - p_s, c) + b_s(z) )

a full convolution in x with stride sigma_s (the coarse grid sigma_s Z^2) that also lifts the
feature domain from C_{s-1} to C_s, followed by a LayerNorm over z (``ConvolutionalEmbedding``).
The class token (CvT has one in the last stage only) is a point outside the grid; it is split
off at the end of its stage and is not restricted to the next grid.

Each stage's evolution is pre-LN (docs/math.md 3.2), explicit Euler for

    u_t = D(A(P1 u)) + G(P2 u)      (split in two, ``prenorm``: x + A(LN x); x + G(LN x))

with A the convolutional attention (``operators.convolution.ConvolutionalAttention``: depthwise
convolution in x, BatchNorm, feature integral; K, V on the coarser grid of stride 2) and G the
GELU feed-forward field. D is stochastic depth (``StochasticDepth``, the identity in eval mode).
Hugging Face's CvtLayer applies its drop_path a second time to the whole state after the FFN
residual (not to the FFN branch); where drop_path > 0 the scheme reproduces that as a map stage:

    "norm1>attention<drop_path norm2>ffn drop_path:map"

and where drop_path = 0 (Hugging Face uses nn.Identity there) the scheme is ``prenorm``.

``ConvolutionalVisionTransformer.evolution`` is the evolution of the LAST stage (the one the
read-out sees, with the class token); every stage's evolution is ``model.stages[s].evolution``,
and ``with_scheme`` / ``refine`` / ``validating`` act on every stage. Times are local to each
stage (stage s runs over [0, T_s]); the global depth of stage s's t is ``stage_offsets[s] + t``.

Read-out (classification): LN on the class token (or on all grid tokens when the last stage
has no class token), the mean over tokens, and a linear classifier.

Token grid (docs/math.md 3.12): the convolutional projections and embeddings need the regular
2-D token grid, where the quadrature weights are constant and cancel. ``forward`` takes
``token_weights`` / ``token_coords`` like every family: weights constant along each row are
accepted (they cancel in every kernel and in the mean: nothing is passed on), other weights and
any coordinates are refused by name (``ConvolutionalVisionTransformer.check_token_grid``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..operators import Context, FeatureIntegral, FeedForward, LayerNormProjection, Operator
from ..operators.convolution import ConvolutionalAttention, pair
from ..operators.token_grid import check_grid_tensor
from ..time import Controls, Evolution, SaveAt, Scheme, Stage, TimeGrid, Trajectory
from ..time.schemes.families import STOCHASTIC_DEPTH_LAYOUT as STOCHASTIC_DEPTH_LAYOUT
from ..time.schemes.families import cvt_scheme
from . import masks
from .base import EvolutionModel
from .blocks import block_controls
from .outputs import ModelOutput

__all__ = [
    "ConvolutionalEmbedding",
    "ConvolutionalVisionTransformer",
    "CvtOutput",
    "CvtStage",
    "CvtStageSpec",
    "StochasticDepth",
    "build_cvt",
    "cvt_scheme",
]


class StochasticDepth(Operator):
    """D(v) = v * xi / (1 - p), xi ~ Bernoulli(1 - p) per sample (train mode); D = I in eval.

    A random per-sample control: with probability p the whole term it multiplies is dropped for
    that sample. Implemented as Hugging Face's CvtDropPath (floor(rand + keep) mask, drawn with
    ``torch.rand`` of shape (B, 1, ..., 1) in v's dtype), so equal seeds give equal masks.
    """

    kind = "map"
    is_linear = True  # u * xi / (1 - p): a per-sample factor

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop_path probability must be in [0, 1), got {p!r}")
        self.p = float(p)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, v: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return v
        keep = 1.0 - self.p
        shape = (v.shape[0],) + (1,) * (v.ndim - 1)
        mask = torch.floor(torch.rand(shape, dtype=v.dtype, device=v.device) + keep)
        return v.div(keep) * mask


class ConvolutionalEmbedding(nn.Module):
    """R[u](x, z) = LN( sum_{c,d} k(d, c, z) u(sigma x + d - p, c) + b(z) ): restriction to the
    coarser grid sigma Z^2 and lift of the feature domain C_in -> C (CvT's token embedding).

    ``weight`` (C, C_in, k_h, k_w), ``bias`` (C), ``norm`` (LayerNormProjection over z),
    ``dropout`` on the result. Grid in, grid out: (B, C_in, H, W) -> (B, C, H', W').
    """

    def __init__(
        self,
        in_channels: int,
        dim: int,
        patch_size: int | tuple[int, int],
        *,
        stride: int | tuple[int, int],
        padding: int | tuple[int, int],
        eps: float = 1e-5,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.in_channels, self.dim = in_channels, dim
        self.patch_size = pair(patch_size, "patch_size")
        self.stride = pair(stride, "stride")
        self.padding = pair(padding, "padding")
        self.weight = nn.Parameter(torch.empty(dim, in_channels, *self.patch_size, **kw))
        self.bias = nn.Parameter(torch.empty(dim, **kw))
        self.norm = LayerNormProjection(dim, eps=eps, **kw)
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Conv2d's initialisation."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1.0 / math.sqrt(self.weight[0].numel())
        nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, dim={self.dim}, patch_size={self.patch_size}, "
                f"stride={self.stride}, padding={self.padding}")

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        g = F.conv2d(grid, self.weight, self.bias, self.stride, self.padding)
        b, c, h, w = g.shape
        tokens = self.norm(g.flatten(2).transpose(1, 2))
        return self.dropout(tokens.transpose(1, 2).reshape(b, c, h, w))


@dataclass
class CvtStageSpec:
    """Everything that fixes one stage's operators (one entry of each list of a CvT config)."""

    in_channels: int
    dim: int
    num_heads: int
    depth: int
    patch_size: int | tuple[int, int] = 3
    patch_stride: int | tuple[int, int] = 2
    patch_padding: int | tuple[int, int] = 1
    mlp_ratio: float = 4.0
    kernel_size: int = 3
    stride_q: int = 1
    padding_q: int = 1
    stride_kv: int = 2
    padding_kv: int = 1
    qkv_bias: bool = True
    cls_token: bool = False
    drop_rate: float = 0.0
    attention_drop_rate: float = 0.0
    drop_path: list[float] | float = 0.0  # one rate per layer, or one for all
    layer_norm_eps: float = 1e-5
    embed_norm_eps: float = 1e-5
    batch_norm_eps: float = 1e-5
    batch_norm_momentum: float | None = 0.1
    activation: str = "gelu"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hidden_dim(self) -> int:
        return int(self.dim * self.mlp_ratio)

    def drop_paths(self) -> list[float]:
        dp = self.drop_path
        rates = [float(dp)] * self.depth if isinstance(dp, (int, float)) else [float(r) for r in dp]
        if len(rates) != self.depth:
            raise ValueError(f"drop_path lists {len(rates)} rates for depth={self.depth}")
        return rates


def _stage_controls(spec: CvtStageSpec, *, device=None, dtype=None) -> Controls:
    kw = {"device": device, "dtype": dtype}
    prefix = 1 if spec.cls_token else 0
    rates = spec.drop_paths()
    return block_controls(
        spec.depth,
        attention=lambda n: ConvolutionalAttention(
            spec.dim, spec.num_heads, kernel_size=spec.kernel_size,
            stride_q=spec.stride_q, padding_q=spec.padding_q,
            stride_kv=spec.stride_kv, padding_kv=spec.padding_kv,
            qkv_bias=spec.qkv_bias, num_prefix_tokens=prefix,
            attn_dropout=spec.attention_drop_rate, out_dropout=spec.drop_rate,
            norm_eps=spec.batch_norm_eps, norm_momentum=spec.batch_norm_momentum, **kw,
        ),
        norm=lambda n: LayerNormProjection(spec.dim, eps=spec.layer_norm_eps, **kw),
        ffn=lambda n: FeedForward([spec.dim, spec.hidden_dim, spec.dim],
                                  activation=spec.activation, out_dropout=spec.drop_rate, **kw),
        extra=lambda n: {"drop_path": StochasticDepth(rates[n])},
    )


class CvtStage(EvolutionModel):
    """One grid level: u_s(0) = [c_s ; R_s(grid)], u_s(T_s) = Evolution_s(u_s(0)).

    forward(grid (B, C_in, H, W)) -> (grid (B, C, H', W'), class token (B, 1, C) or None).
    """

    def __init__(
        self,
        embedding: ConvolutionalEmbedding,
        evolution: Evolution,
        cls_token: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.evolution = evolution
        self.cls_token = nn.Parameter(cls_token) if cls_token is not None else None

    @property
    def dim(self) -> int:
        return self.embedding.dim

    @property
    def num_prefix_tokens(self) -> int:
        return 0 if self.cls_token is None else 1

    def initial_condition(self, grid: torch.Tensor) -> tuple[torch.Tensor, Context]:
        """u_s(0) as tokens (B, P + H' W', C) and the context carrying the grid (H', W')."""
        f = self.embedding(grid)
        b, c, h, w = f.shape
        u0 = f.flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            u0 = torch.cat((self.cls_token.expand(b, -1, -1), u0), dim=1)
        return u0, Context(grid_shape=(h, w))

    def read_out(self, u: torch.Tensor, context: Context
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens -> (grid (B, C, H', W'), class token or None)."""
        h, w = context.grid_shape
        p = self.num_prefix_tokens
        cls = u[:, :p] if p else None
        tokens = u[:, p:]
        b, _, c = tokens.shape
        return tokens.transpose(1, 2).reshape(b, c, h, w), cls

    def forward(self, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.solve(grid)


@dataclass
class CvtOutput(ModelOutput):
    """last_hidden_state (B, C, H, W) grid; cls_token_value (B, 1, C) or None; hidden_states
    (every stage's output grid) when asked for; logits (B, num_labels) for a classifier."""

    logits: torch.Tensor | None = None  # first: a classifier's out[0], as in transformers
    last_hidden_state: torch.Tensor | None = None
    cls_token_value: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


def _per_stage(scheme, n: int) -> list:
    if isinstance(scheme, (list, tuple)) and not all(isinstance(s, Stage) for s in scheme):
        if len(scheme) != n:
            raise ValueError(f"give one scheme, or one per stage ({n}), got {len(scheme)}")
        return list(scheme)
    return [scheme] * n


class ConvolutionalVisionTransformer(EvolutionModel):
    """CvT: S stages (grid levels), each an initial condition by restriction + an evolution.

    forward(pixel_values) -> CvtOutput. With a head (``with_head=True``) the read-out is
    ``final_norm`` (LN) on the class token (or on the grid tokens without one), the mean over
    tokens, then ``classifier`` (None: the identity, Hugging Face's num_labels = 0).

    ``evolution`` is the last stage's evolution; ``stages[s].evolution`` are all of them.
    """

    def __init__(
        self,
        stages: Sequence[CvtStage],
        *,
        final_norm: LayerNormProjection | None = None,
        classifier: FeatureIntegral | None = None,
        with_head: bool = False,
        source: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not stages:
            raise ValueError("a CvT needs at least one stage")
        self.stages = nn.ModuleList(stages)
        self.with_head = bool(with_head)
        if self.with_head and final_norm is None:
            raise ValueError("a classification head needs final_norm")
        self.final_norm = final_norm
        self.classifier = classifier
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)

    # -- the contract ------------------------------------------------------------------------
    @property
    def evolution(self) -> Evolution:  # type: ignore[override]
        """The last stage's evolution (the one with the class token, seen by the read-out)."""
        return self.stages[-1].evolution

    @property
    def evolutions(self) -> list[Evolution]:
        return [s.evolution for s in self.stages]

    @property
    def stage_offsets(self) -> list[float]:
        """Global depth at which each stage starts: T_1 + ... + T_{s-1}."""
        out, t = [], 0.0
        for s in self.stages:
            out.append(t)
            t += s.evolution.T
        return out

    def evolution_owners(self) -> list[EvolutionModel]:
        return list(self.stages)

    def with_scheme(self, scheme: str | Scheme | Sequence, **options):
        """Same parameters under another scheme: one for every stage, or a list, one per stage.
        Names are built on each stage's layout; options: integrator, form."""
        schemes = _per_stage(scheme, len(self.stages))
        return self._map_evolutions(lambda e, i: e.with_scheme(schemes[i], **options))

    # -- running -----------------------------------------------------------------------------
    def _check_pixels(self, pixel_values: torch.Tensor) -> None:
        if not isinstance(pixel_values, torch.Tensor):
            raise TypeError(f"pixel_values must be a torch.Tensor, got {type(pixel_values)}")
        emb = self.stages[0].embedding
        if pixel_values.dim() != 4 or pixel_values.shape[1] != emb.in_channels:
            raise ValueError(
                f"pixel_values must have shape (batch, {emb.in_channels}, height, width), got "
                f"{tuple(pixel_values.shape)}"
            )
        if pixel_values.dtype != emb.weight.dtype:
            raise TypeError(f"pixel_values has dtype {pixel_values.dtype} but the model's "
                            f"parameters are {emb.weight.dtype}")

    def classify(self, grid: torch.Tensor, cls: torch.Tensor | None) -> torch.Tensor:
        """logits = classifier(mean_x LN(u)) on the class token, or on the grid tokens."""
        if cls is not None:
            tokens = cls
        else:
            tokens = grid.flatten(2).transpose(1, 2)
        pooled = self.final_norm(tokens).mean(dim=1)
        return pooled if self.classifier is None else self.classifier(pooled)

    def check_token_grid(self, token_weights: torch.Tensor | None,
                         token_coords: torch.Tensor | None) -> None:
        """The token grid CvT can take: none, or weights constant along each row (they cancel
        on the regular grid), sized to the last stage's field (its N with the class token;
        checked in ``initial_condition``: the earlier stages run as the restriction chain on
        the regular grid and take no weights). ValueError naming the argument for other weights
        and for any coordinates (the convolutions in x need the regular 2-D grid)."""
        why = ("its convolutional token embeddings and Q/K/V projections need the regular 2-D "
               "token grid (docs/math.md 3.7, 3.12)")
        if token_coords is not None:
            raise ValueError(f"ConvolutionalVisionTransformer (CvT): token_coords are refused: "
                             f"{why}")
        if token_weights is None:
            return
        token_weights = check_grid_tensor(
            token_weights, "ConvolutionalVisionTransformer (CvT): token_weights", weights=True)
        rows = token_weights if token_weights.dim() == 2 else token_weights.unsqueeze(0)
        if not rows.is_meta and not bool((rows == rows[:, :1]).all()):
            raise ValueError(f"ConvolutionalVisionTransformer (CvT): token_weights other than "
                             f"constant (along each row) are refused: {why}")

    def initial_condition(self, pixel_values: torch.Tensor, output_hidden_states: bool = False,
                          *, token_weights: torch.Tensor | None = None,
                          token_coords: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, Context]:
        """u(0) of the last stage: the stages before it run as the restriction chain (each
        stage's output grid is the next one's input), then the last stage's initial condition.
        The earlier stages' output grids ride in the context for the hidden states. A token
        grid is checked (``check_token_grid``: constant weights only, which cancel, of the
        last stage's N) and not passed on."""
        self.check_token_grid(token_weights, token_coords)
        self._check_pixels(pixel_values)
        grid, hidden = pixel_values, []
        for stage in self.stages[:-1]:
            grid, _ = stage(grid)
            hidden.append(grid)
        u0, ctx = self.stages[-1].initial_condition(grid)
        last = len(self.stages)
        masks.check_token_grid(token_weights, None, batch=u0.shape[0], seq=u0.shape[1],
                               owner=f"ConvolutionalVisionTransformer (CvT): token_weights "
                                     f"are on the last stage's token grid (stage {last} of "
                                     f"{last}: {u0.shape[1]} nodes"
                                     + (", its class token first" if
                                        self.stages[-1].cls_token is not None else "")
                                     + "; the earlier stages take none)")
        ctx.readout.update(hidden=hidden if output_hidden_states else None)
        return u0, ctx

    def read_out(self, u: torch.Tensor, context: Context) -> CvtOutput:
        """The last stage's grid and class token, the logits with a head, and every stage's
        output grid when asked for."""
        grid, cls = self.stages[-1].read_out(u, context)
        logits = self.classify(grid, cls) if self.with_head else None
        hidden = context.readout.get("hidden")
        return CvtOutput(logits=logits, last_hidden_state=grid, cls_token_value=cls,
                         hidden_states=(*hidden, grid) if hidden is not None else None)

    def forward(self, pixel_values: torch.Tensor, output_hidden_states: bool = False, *,
                token_weights: torch.Tensor | None = None,
                token_coords: torch.Tensor | None = None) -> CvtOutput:
        return self.solve(pixel_values, output_hidden_states, token_weights=token_weights,
                          token_coords=token_coords)

    def trajectory(self, pixel_values: torch.Tensor, stage: int = -1, *,
                   saveat: SaveAt | None = None) -> Trajectory:
        """The Trajectory of one stage's evolution (default: the last, i.e. ``.evolution``);
        the stages before it are run as in forward. ``saveat`` as in every model."""
        if stage in (-1, len(self.stages) - 1):
            return super().trajectory(pixel_values, saveat=saveat)
        self._check_pixels(pixel_values)
        idx = range(len(self.stages))[stage]
        grid = pixel_values
        for s in self.stages[:idx]:
            grid, _ = s(grid)
        return self.stages[idx].trajectory(grid, saveat=saveat)

    def trajectories(self, pixel_values: torch.Tensor) -> list[Trajectory]:
        """One Trajectory per stage (local times; add ``stage_offsets[s]`` for global depth)."""
        self._check_pixels(pixel_values)
        grid, out = pixel_values, []
        for s in self.stages:
            u0, ctx = s.initial_condition(grid)
            traj = s.evolution(u0, ctx, SaveAt(steps=True))
            out.append(traj)
            grid, _ = s.read_out(traj.final, ctx)
        return out


def build_cvt(
    specs: Sequence[CvtStageSpec],
    *,
    num_labels: int | None = None,
    head_norm_eps: float = 1e-5,
    source: dict[str, Any] | None = None,
    device=None,
    dtype=None,
) -> ConvolutionalVisionTransformer:
    """A CvT with random weights. ``num_labels``: None = no head; 0 = head without classifier."""
    kw = {"device": device, "dtype": dtype}
    stages = []
    for spec in specs:
        emb = ConvolutionalEmbedding(
            spec.in_channels, spec.dim, spec.patch_size, stride=spec.patch_stride,
            padding=spec.patch_padding, eps=spec.embed_norm_eps, dropout=spec.drop_rate, **kw,
        )
        controls = _stage_controls(spec, **kw)
        drop = any(r > 0 for r in spec.drop_paths())
        evo = Evolution(controls, cvt_scheme(drop), TimeGrid(spec.depth, spec.depth))
        cls = None
        if spec.cls_token:
            cls = torch.randn(1, 1, spec.dim, **kw) * 0.02
        stages.append(CvtStage(emb, evo, cls))
    final_norm = classifier = None
    if num_labels is not None:
        dim = specs[-1].dim
        final_norm = LayerNormProjection(dim, eps=head_norm_eps, **kw)
        if num_labels > 0:
            classifier = FeatureIntegral(dim, num_labels, **kw)
    return ConvolutionalVisionTransformer(
        stages, final_norm=final_norm, classifier=classifier, with_head=num_labels is not None,
        source=source,
    )
