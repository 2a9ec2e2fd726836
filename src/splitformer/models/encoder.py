"""The encoder: initial condition u(0) = src, the evolution to t = T, and a read-out.

    u(0) = f = src (already embedded),  u(T) = Evolution(f),  output = R(u(T))

R is the identity or a final LayerNorm (pre-LN networks end with one). Building blocks:

* ``EvolutionModel``: the contract every model keeps (``.evolution``, ``.with_scheme``,
  ``.refine``, ``.trajectory``).
* ``Encoder``: takes the arguments of ``torch.nn.TransformerEncoder`` (src, mask,
  src_key_padding_mask, is_causal) and returns the same tensor.
* ``encoder_controls`` / ``paper_controls``: the control sets theta^n of the network's and of the
  paper's literal form.
"""

from __future__ import annotations

import copy
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
from ..operators.kernels import SoftmaxKernel
from ..time import Controls, Evolution, Scheme, TimeGrid, Trajectory
from ..time.schemes import lie, paper_lie, prenorm
from .masks import build_context, check_src

__all__ = ["Encoder", "EvolutionModel", "encoder_controls", "paper_controls", "paper_encoder"]


def _keep_source(source: Any) -> Any:
    """What a model records of where it came from: a typed config (kept as is), a dict (copied)
    or nothing (an empty dict)."""
    if source is None:
        return {}
    return dict(source) if isinstance(source, dict) else source


class EvolutionModel(nn.Module):
    """Base of every splitformer model: it owns an ``evolution``."""

    evolution: Evolution

    def _with_evolution(self, evolution: Evolution):
        new = copy.copy(self)
        new._modules = dict(self._modules)
        new.evolution = evolution
        return new

    def with_scheme(self, scheme: str | Scheme, **options):
        """The same model (shared parameters) under another splitting scheme; a name is built
        on the current layout (see Evolution.with_scheme), options: integrator, form."""
        return self._with_evolution(self.evolution.with_scheme(scheme, **options))

    def refine(self, k: int):
        """The same model (shared parameters) with tau -> tau / k and N_t -> k N_t."""
        return self._with_evolution(self.evolution.refine(k))

    def with_controls_in_time(self, interpolation: str):
        """"constant" (the network) or "linear" (smooth in t) controls, shared parameters."""
        return self._with_evolution(self.evolution.with_controls_in_time(interpolation))

    def validating(self, on: bool = True):
        """Opt-in validation mode: raise at the first substep that produces a NaN or inf."""
        self.evolution.validate = on
        return self


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
    sets = []
    for scale in scales:
        sets.append(
            {
                "attention": NonlocalAttention(
                    d_model, nhead, bias=bias, kernel=SoftmaxKernel(scale=scale),
                    attn_dropout=p_attn, out_dropout=p_out, **kw
                ),
                "norm1": LayerNormProjection(d_model, eps=layer_norm_eps, bias=bias, **kw),
                "ffn": FeedForward(
                    widths, activation=activation, bias=bias, dropout=p_ffn,
                    out_dropout=p_out, **kw
                ),
                "norm2": LayerNormProjection(d_model, eps=layer_norm_eps, bias=bias, **kw),
            }
        )
    return Controls(sets)


def paper_controls(
    d_model: int, nhead: int, widths: list[int], num_layers: int, *, device=None, dtype=None
) -> Controls:
    """theta^n of the paper's literal form: attention, norm1, ffn1..ffnJ, relu, norm2.

    ``widths`` = [N_y, N_1, ..., N_y]; the ffn_j weights are the W_j of the (I + W_j) form.
    """
    kw = {"device": device, "dtype": dtype}
    sets = []
    for _ in range(num_layers):
        theta: dict[str, nn.Module] = {
            "attention": NonlocalAttention(d_model, nhead, **kw),
            "norm1": SphereProjection(d_model, **kw),
            "relu": ProjectionS2(),
            "norm2": SphereProjection(d_model, **kw),
        }
        for j, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True), start=1):
            theta[f"ffn{j}"] = FeatureIntegral(a, b, **kw)
        sets.append(theta)
    return Controls(sets)


class Encoder(EvolutionModel):
    """An encoder as an evolution: forward(src, mask, src_key_padding_mask, is_causal).

    ``source`` records the torch.nn layout this model came from (``"encoder"`` or ``"layer"``,
    batch_first, ...), which ``to_torch`` uses to go back. Without a final norm the read-out is
    the identity.

    Padding: tokens flagged in ``src_key_padding_mask`` are outside the kernel's support as keys;
    their own rows of the output are computed like any other (torch.nn's fused eval path returns
    0 there instead: compare on unpadded tokens).
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
        self.source = _keep_source(source)
        attn = evolution.controls[0]["attention"]
        self.d_model = attn.dim
        self.nhead = attn.num_heads

    def _reference_param(self) -> torch.Tensor:
        return next(iter(self.evolution.controls[0]["attention"].parameters()))

    def _prepare(self, src, mask, src_key_padding_mask, is_causal, src_mask):
        if src_mask is not None:
            if mask is not None:
                raise ValueError("pass the attention mask as mask or as src_mask, not both")
            mask = src_mask
        p = self._reference_param()
        check_src(src, dim=self.d_model, dtype=p.dtype, device=p.device)
        unbatched = src.dim() == 2
        u0 = src.unsqueeze(0) if unbatched else (src if self.batch_first else src.transpose(0, 1))
        kpm = src_key_padding_mask
        if unbatched and kpm is not None and isinstance(kpm, torch.Tensor) and kpm.dim() == 1:
            kpm = kpm.unsqueeze(0)
        b, n, _ = u0.shape
        ctx = build_context(
            mask, kpm, is_causal, batch=b, seq=n, num_heads=self.nhead, dtype=p.dtype,
            device=p.device,
        )
        return u0, ctx, unbatched

    def _restore(self, u: torch.Tensor, unbatched: bool) -> torch.Tensor:
        if unbatched:
            return u.squeeze(0)
        return u if self.batch_first else u.transpose(0, 1)

    def forward(
        self,
        src: torch.Tensor,
        mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        is_causal: bool | None = None,
        *,
        src_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        u0, ctx, unbatched = self._prepare(src, mask, src_key_padding_mask, is_causal, src_mask)
        u = self.evolution(u0, ctx)
        if self.final_norm is not None:
            u = self.final_norm(u)
        return self._restore(u, unbatched)

    def trajectory(
        self,
        src: torch.Tensor,
        mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        is_causal: bool | None = None,
    ) -> Trajectory:
        """u(t_i) at every grid point (batch first; before the read-out)."""
        u0, ctx, _ = self._prepare(src, mask, src_key_padding_mask, is_causal, None)
        return self.evolution(u0, ctx, return_trajectory=True)


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
    if num_ffn_stages < 1:
        raise ValueError(f"num_ffn_stages must be >= 1, got {num_ffn_stages!r}")
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
    """A network-form encoder with random weights (post-LN Lie scheme or pre-LN)."""
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
