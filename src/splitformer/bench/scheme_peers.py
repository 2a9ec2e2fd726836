"""Splitformer's splitting schemes against the published networks that use the same splitting.

Each function takes a ``Size`` and returns ``Contender`` values built in float32, each network
from ``torch.manual_seed(seed)``, all with one input drawn from ``seed`` (a sequence
``x = randn(batch, seq, dim)``, or images for the ViT pair):

``strang_macaron``  splitformer's Strang scheme on a pre-norm encoder with a half-width FFN,
    u += G(P2 u)/2; u += A(P1 u); u += G(P2 u)/2 (integrator "euler"), against x-transformers'
    ``Encoder(macaron=True)``, u += FF1(LN u)/2; u += Attn(LN u); u += FF2(LN u)/2 with hidden
    width ff/2, plus splitformer's Lie scheme on the full-width post-LN network ("lie") so that a
    suite can report Strang / Lie. Fair in FLOPs, not in parameters: all three evaluate
    attention once and FFN width ff once per layer (two half-width evaluations for the first
    two), but splitformer's Strang evaluates *one* half-width FFN twice (the same operator over
    two half steps), where Macaron has two FFNs of half width each; x-transformers' LayerNorms
    and attention projections have no bias, and each half-FFN has its own norm.
``heun_rk2``  splitformer's pre-norm scheme with Heun (RK2) substeps, each field advanced by
    u += h (F(u) + F(u + h F(u))) / 2, against the ODE Transformer's RK2 block (Li et al., ACL
    2022), Heun on the whole residual-free layer map (``ODETransformerRK2``), plus "lie". Fair in
    both: the same ``nn.TransformerEncoderLayer`` parameters (equal counts) and two attention and
    two FFN evaluations per layer for both Heun networks; they differ in *what* Heun integrates
    (each field in turn, vs the composite block A then G).
``parallel_block``  splitformer's "parallel" scheme on a timm ViT (pre-norm layout: the average
    of the branches u + 2 A(P1 u) and u + 2 G(P2 u) is u + A(P1 u) + G(P2 u)), against timm's
    ``VisionTransformer(block_fn=ParallelScalingBlock)``, u + Attn(LN u) + Mlp(LN u). The same
    FLOPs per layer; timm's block shares one LayerNorm between the branches and fuses Q/K/V with
    the MLP's first layer in one matmul, so it has 2 dim fewer parameters per layer.

The reference libraries are imported when a function is called; ``PeerUnavailable`` says in
one line why one cannot be.
"""

from __future__ import annotations

import torch
from torch import nn

from ..interop import from_timm, from_torch
from .peers import (
    PATCH,
    PeerUnavailable,
    lie_contender,
    noted,
    patch_grid,
    reason,
    sequence_input,
    torch_layers,
    width_ratio,
)
from .sizes import Size
from .timing import Contender

__all__ = ["ODETransformerRK2", "PeerUnavailable", "heun_rk2", "parallel_block",
           "strang_macaron"]

# -- Strang vs Macaron -----------------------------------------------------------------------
def strang_macaron(size: Size, *, seed: int = 0) -> list[Contender]:
    """Strang at Macaron's cost: [splitformer strang (ff/2), x-transformers macaron, lie].

    splitformer: ``from_torch(nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, heads,
    ff // 2, dropout=0, norm_first=True), layers)).with_scheme("strang", integrator="euler")``:
    on the pre-norm layout ``strang`` builds "norm2>ffn*0.5 norm1>attention norm2>ffn*0.5",
    explicit Euler per substep, so one step is u += G(P2 u)/2; u += A(P1 u); u += G(P2 u)/2
    (ReLU, the torch.nn default).

    x-transformers: ``Encoder(dim=dim, depth=layers, heads=heads, macaron=True,
    ff_mult=(ff // 2) / dim, attn_dim_head=dim // heads, attn_flash=True,
    ff_custom_activation=nn.ReLU(), pre_norm_has_final_norm=False, norm_add_unit_offset=False)``:
    layer types ("f", "a", "f") per block, each FF wrapped in Scale(0.5), pre-norm LayerNorm
    (not RMSNorm; x-transformers' LayerNorm has a gain and no bias), softmax attention through
    scaled_dot_product_attention (``attn_flash``), no dropout (the defaults), no final norm (as
    torch's encoder without ``norm``), no positional embedding (``Encoder`` is the bare
    attention stack). Its FFNs have biases, its Q/K/V/O projections none.
    """
    try:
        from x_transformers import Encoder
    except Exception as e:
        raise PeerUnavailable(f"x-transformers does not import here: {reason(e)}") from e
    half = size.ff // 2
    if half < 1:
        raise ValueError(f"strang_macaron needs ff >= 2 (a half-width FFN), got ff={size.ff}")
    x = sequence_input(size, seed)
    ours = from_torch(torch_layers(size, half, True, seed)).with_scheme(
        "strang", integrator="euler")
    torch.manual_seed(seed)
    peer = Encoder(dim=size.dim, depth=size.layers, heads=size.heads, macaron=True,
                   ff_mult=width_ratio(half, size.dim), attn_dim_head=size.dim // size.heads,
                   attn_flash=True, ff_custom_activation=nn.ReLU(),
                   pre_norm_has_final_norm=False, norm_add_unit_offset=False).float()
    return [
        noted(Contender("strang", ours, (x,)),
               f"splitformer Strang (euler), pre-LN, one FFN of width {half} evaluated over two "
               "half steps: G/2 A G/2"),
        noted(Contender("x-transformers macaron", peer, (x,)),
               f"x-transformers Encoder(macaron=True), two FFNs of width {half} (x 0.5) per "
               "layer, bias-free LayerNorm and Q/K/V/O"),
        lie_contender(size, x, seed),
    ]


# -- Heun (per field) vs the ODE Transformer's RK2 block ---------------------------------------
class ODETransformerRK2(nn.Module):
    """The ODE Transformer's RK2 block network (Li et al., "ODE Transformer: An Ordinary
    Differential Equation-Inspired Model for Sequence Generation", ACL 2022), written out:

        F_n(y) = layer_n(y) - y            (the residual-free pre-norm block:
                                            A(P1 y) + G(P2(y + A(P1 y))))
        y <- y + (F_n(y) + F_n(y + F_n(y))) / 2,   n = 0, ..., L - 1

    Heun's method on the whole layer map, with ``layer_n`` an ``nn.TransformerEncoderLayer``
    (``norm_first=True``): the parameters of one layer per block, two evaluations of it."""

    def __init__(self, layers: list[nn.TransformerEncoderLayer] | nn.ModuleList) -> None:
        super().__init__()
        for layer in layers:
            if not getattr(layer, "norm_first", False):
                raise ValueError("ODETransformerRK2 needs pre-norm layers (norm_first=True): "
                                 "F(y) = layer(y) - y is then residual-free")
        self.layers = nn.ModuleList(layers)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            f1 = layer(y) - y
            z = y + f1
            f2 = layer(z) - z
            y = y + 0.5 * (f1 + f2)
        return y


def heun_rk2(size: Size, *, seed: int = 0) -> list[Contender]:
    """Heun/RK2 in both readings: [splitformer heun, ode-transformer rk2, lie].

    splitformer: ``from_torch(<norm_first=True encoder, ff>).with_scheme("prenorm",
    integrator="heun")``: "norm1>attention:heun norm2>ffn:heun", Heun on each field in turn.
    ODE Transformer: ``ODETransformerRK2`` on the layers of the same torch.nn encoder (built
    from the same seed, so the same initial weights), Heun on the composite block."""
    x = sequence_input(size, seed)
    ours = from_torch(torch_layers(size, size.ff, True, seed)).with_scheme(
        "prenorm", integrator="heun")
    peer = ODETransformerRK2(list(torch_layers(size, size.ff, True, seed).layers))
    return [
        noted(Contender("heun", ours, (x,)),
               f"splitformer pre-norm scheme, Heun substeps per field, ff {size.ff} "
               "(2 A + 2 G per layer)"),
        noted(Contender("ode-transformer rk2", peer, (x,)),
               "ODE Transformer RK2 block (Li et al. 2022): y + (F(y) + F(y + F(y)))/2, F = "
               "pre-LN nn.TransformerEncoderLayer - identity (2 A + 2 G per layer)"),
        lie_contender(size, x, seed),
    ]


# -- parallel vs timm's parallel block ---------------------------------------------------------
def parallel_block(size: Size, *, seed: int = 0) -> list[Contender]:
    """Parallel splitting: [splitformer parallel, timm ParallelScalingBlock].

    Both are timm ``VisionTransformer(img_size=(rows * 16, cols * 16), patch_size=16,
    in_chans=3, num_classes=0, global_pool="", class_token=False, embed_dim=dim, depth=layers,
    num_heads=heads, mlp_ratio=ff / dim)`` (rows * cols == seq patches, so seq tokens; learned
    position embedding, GELU, qkv_bias, final LayerNorm, dropout and drop path 0 by default);
    the output is the (batch, seq, dim) token field. splitformer's is ``from_timm`` of the
    standard one (``block_fn=Block``), run with ``.with_scheme("parallel")``: u + A(P1 u) +
    G(P2 u) per layer (the mean of the branches u + 2 tau F_i, tau = 1). The peer is
    ``block_fn=ParallelScalingBlock`` (Dehghani et al., ViT-22B): u + Attn(LN u) + Mlp(LN u),
    the same sum in one residual step, with one shared LayerNorm and Q/K/V fused with the MLP's
    first layer. Picked over ``ParallelThingsBlock``, whose block is u += sum_i Attn_i(LN_i u)
    then u += sum_i Mlp_i(LN_i u): attention and MLP still in sequence (Lie), with num_parallel
    copies of each, so neither the scheme nor the parameter count is ours."""
    try:
        from timm.models.vision_transformer import ParallelScalingBlock, VisionTransformer
    except Exception as e:
        raise PeerUnavailable(f"timm does not import here: {reason(e)}") from e
    rows, cols = patch_grid(size.seq)
    kwargs = dict(img_size=(rows * PATCH, cols * PATCH), patch_size=PATCH, in_chans=3,
                  num_classes=0, global_pool="", class_token=False, embed_dim=size.dim,
                  depth=size.layers, num_heads=size.heads, mlp_ratio=width_ratio(size.ff, size.dim),
                  drop_rate=0.0, pos_drop_rate=0.0, proj_drop_rate=0.0, attn_drop_rate=0.0,
                  drop_path_rate=0.0)
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(size.batch, 3, rows * PATCH, cols * PATCH, generator=g,
                         dtype=torch.float32)
    torch.manual_seed(seed)
    ours = from_timm(VisionTransformer(**kwargs).float()).with_scheme("parallel")
    torch.manual_seed(seed)
    peer = VisionTransformer(**kwargs, block_fn=ParallelScalingBlock).float()
    grid = f"{rows}x{cols} patches of {PATCH}"
    return [
        noted(Contender("parallel", ours, (images,)),
               f"splitformer parallel scheme on a timm ViT (two LayerNorms per layer), {grid}"),
        noted(Contender("timm parallel-scaling", peer, (images,)),
               f"timm VisionTransformer(block_fn=ParallelScalingBlock), one shared LayerNorm "
               f"per layer, {grid}"),
    ]
