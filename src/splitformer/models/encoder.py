"""The encoder: initial condition u(0) = src, the evolution to t = T, and a read-out.

    u(0) = f = src (already embedded),  u(T) = Evolution(f),  output = R(u(T))

R is the identity or a final LayerNorm (pre-LN networks end with one). Building blocks:

* ``Encoder``: takes the arguments of ``torch.nn.TransformerEncoder`` (src, mask,
  src_key_padding_mask, is_causal) and returns the same tensor; the keywords ``token_weights``
  / ``token_coords`` put the field on a token grid (docs/math.md 3.12).
* ``encoder_controls`` / ``paper_controls``: the control sets theta^n of the network's and of the
  paper's literal form.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..operators import (
    FeatureIntegral,
    FeedForward,
    LayerNormProjection,
    NonlocalAttention,
    ProjectionS2,
    SphereProjection,
)
from ..operators.base import Context
from ..operators.kernels import SoftmaxKernel
from ..time import Controls, Evolution, TimeGrid
from ..time.schemes import lie, paper_lie, prenorm
from .base import EvolutionModel, TorchLayoutReadOut
from .blocks import block_controls
from .masks import build_context, check_src

__all__ = ["Encoder", "encoder_controls", "paper_controls", "paper_encoder"]


def encoder_controls(
    d_model: int,
    nhead: int,
    dim_feedforward: int,
    num_layers: int,
    *,
    activation: str = "relu",
    layer_norm_eps: float = 1e-5,
    bias: bool = True,
    dropout: float = 0.0,
    attn_dropout: float | None = None,
    out_dropout: float | None = None,
    ffn_dropout: float | None = None,
    attention_scales: list[float | None] | None = None,
    ffn_widths: list[int] | None = None,
    device=None,
    dtype=None,
) -> Controls:
    """theta^1..theta^L for the network form: attention, norm1, ffn (J stages), norm2.

    Dropout: ``attn_dropout`` on the kernel g, ``out_dropout`` on A(u) and G(u), ``ffn_dropout``
    on G's hidden field; each defaults to ``dropout`` (torch.nn's single rate).
    ``attention_scales[n]`` is the softmax kernel's scale in step n (None: 1/sqrt(d_h)).
    """
    p_attn = dropout if attn_dropout is None else attn_dropout
    p_out = dropout if out_dropout is None else out_dropout
    p_ffn = dropout if ffn_dropout is None else ffn_dropout
    scales = [None] * num_layers if attention_scales is None else list(attention_scales)
    if len(scales) != num_layers:
        raise ValueError(f"attention_scales needs {num_layers} entries, got {len(scales)}")
    widths = ffn_widths or [d_model, dim_feedforward, d_model]
    kw = {"device": device, "dtype": dtype}
    return block_controls(
        num_layers,
        attention=lambda n: NonlocalAttention(
            d_model, nhead, bias=bias, kernel=SoftmaxKernel(scale=scales[n]),
            attn_dropout=p_attn, out_dropout=p_out, **kw),
        norm=lambda n: LayerNormProjection(d_model, eps=layer_norm_eps, bias=bias, **kw),
        ffn=lambda n: FeedForward(widths, activation=activation, bias=bias, dropout=p_ffn,
                                  out_dropout=p_out, **kw),
    )


def paper_controls(
    d_model: int, nhead: int, widths: list[int], num_layers: int, *, device=None, dtype=None
) -> Controls:
    """theta^n of the paper's literal form: attention, norm1, ffn1..ffnJ, relu, norm2.

    ``widths`` = [N_y, N_1, ..., N_y]; the ffn_j weights are the W_j of the (I + W_j) form.
    """
    kw = {"device": device, "dtype": dtype}
    pairs = list(zip(widths[:-1], widths[1:], strict=True))

    def extra(n: int) -> dict[str, nn.Module]:
        ops: dict[str, nn.Module] = {f"ffn{j}": FeatureIntegral(a, b, **kw)
                                     for j, (a, b) in enumerate(pairs, start=1)}
        return {**ops, "relu": ProjectionS2(), "norm2": SphereProjection(d_model, **kw)}

    return block_controls(num_layers, attention=lambda n: NonlocalAttention(d_model, nhead, **kw),
                          norm=lambda n: SphereProjection(d_model, **kw), ffn=None, extra=extra)


class Encoder(TorchLayoutReadOut, EvolutionModel):
    """An encoder as an evolution: forward(src, mask, src_key_padding_mask, is_causal).

    ``source`` records the torch.nn layout this model came from (``"encoder"`` or ``"layer"``,
    batch_first, ...), which ``to_torch`` uses to go back. Without a final norm the read-out is
    the identity.

    Padding: tokens flagged in ``src_key_padding_mask`` are outside the kernel's support as keys;
    their own rows of the output are computed like any other (torch.nn's fused eval path returns
    0 there instead: compare on unpadded tokens).

    Token grid (keywords ``token_weights`` w_j >= 0 and ``token_coords`` x_j, (N,) or (B, N),
    batch first whatever the layout of src; None = uniform weights / the index 0 .. N-1): every
    kernel integrates against the weights (softmax(a + log w)); a weight-0 node is padding,
    with the outputs of ``src_key_padding_mask`` at the other nodes; relative kernels (ALiBi,
    rotary) read the coordinates, and ``is_causal`` is the support x_k <= x_q on them (not
    folded into a mask; a ``mask`` is a support on the node index, used as given). There is
    no position term: the encoder is equivariant under permutations of its nodes (with their
    weights and coordinates).
    """

    def __init__(
        self,
        evolution: Evolution,
        *,
        final_norm: nn.Module | None = None,
        batch_first: bool = True,
        source: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.evolution = evolution
        self.final_norm = final_norm
        self.batch_first = batch_first
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)
        attn = evolution.controls[0]["attention"]
        self.d_model = attn.dim
        self.nhead = attn.num_heads

    def initial_condition(
        self,
        src: torch.Tensor,
        mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        is_causal: bool | None = None,
        *,
        src_mask: torch.Tensor | None = None,
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Context]:
        """u(0) = src (batch first), the kernel's support and the token grid (checked against
        N); ``context.readout["unbatched"]`` remembers the layout of src for the read-out."""
        if src_mask is not None:
            if mask is not None:
                raise ValueError("pass the attention mask as mask or as src_mask, not both")
            mask = src_mask
        p = next(iter(self.evolution.controls[0]["attention"].parameters()))
        check_src(src, dim=self.d_model, dtype=p.dtype, device=p.device)
        unbatched = src.dim() == 2
        u0 = src.unsqueeze(0) if unbatched else (src if self.batch_first else src.transpose(0, 1))
        kpm = src_key_padding_mask
        if unbatched and kpm is not None and isinstance(kpm, torch.Tensor) and kpm.dim() == 1:
            kpm = kpm.unsqueeze(0)
        b, n, _ = u0.shape
        ctx = build_context(
            mask, kpm, is_causal, batch=b, seq=n, num_heads=self.nhead, dtype=p.dtype,
            device=p.device, token_weights=token_weights, token_coords=token_coords,
            owner=type(self).__name__,
        )
        ctx.readout["unbatched"] = unbatched
        return u0, ctx

    def forward(
        self,
        src: torch.Tensor,
        mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        is_causal: bool | None = None,
        *,
        src_mask: torch.Tensor | None = None,
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.solve(src, mask, src_key_padding_mask, is_causal, src_mask=src_mask,
                          token_weights=token_weights, token_coords=token_coords)


def paper_encoder(
    d_model: int,
    nhead: int,
    dim_feedforward: int,
    num_layers: int,
    *,
    num_ffn_stages: int = 2,
    device=None,
    dtype=None,
) -> Encoder:
    """The paper's literal model (docs/math.md section 2): M = 4 + J substeps per step, weights in
    the (I + W_j) form, scalar s1, s2 with eps = 0, relaxation 1/2. Random weights."""
    J = num_ffn_stages
    if isinstance(J, bool) or not isinstance(J, int) or J < 1:
        raise ValueError(f"num_ffn_stages must be an int >= 1 (J, the FFN stages), got {J!r}")
    widths = [d_model] + [dim_feedforward] * (num_ffn_stages - 1) + [d_model]
    controls = paper_controls(d_model, nhead, widths, num_layers, device=device, dtype=dtype)
    evo = Evolution(controls, paper_lie(num_ffn_stages), TimeGrid(num_layers, num_layers))
    return Encoder(evo, batch_first=True, source={"kind": "encoder", "form": "paper"})


def network_encoder(
    d_model: int,
    nhead: int,
    dim_feedforward: int,
    num_layers: int,
    *,
    norm_first: bool = False,
    final_norm: bool = False,
    **kwargs,
) -> Encoder:
    """A network-form encoder with random weights (post-LN Lie scheme or pre-LN); ``kwargs``
    are those of ``encoder_controls`` (activation, layer_norm_eps, bias, dropout rates, ...)."""
    known = set(inspect.signature(encoder_controls).parameters) - {
        "d_model", "nhead", "dim_feedforward", "num_layers"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"network_encoder got unknown arguments {unknown}; it takes "
                        f"norm_first, final_norm and {sorted(known)}")
    controls = encoder_controls(d_model, nhead, dim_feedforward, num_layers, **kwargs)
    scheme = prenorm() if norm_first else lie()
    norm = None
    if final_norm:
        norm = LayerNormProjection(
            d_model, eps=kwargs.get("layer_norm_eps", 1e-5), device=kwargs.get("device"),
            dtype=kwargs.get("dtype"),
        )
    return Encoder(Evolution(controls, scheme), final_norm=norm, batch_first=True,
                   source={"kind": "encoder"})
