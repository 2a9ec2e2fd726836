"""The encoder-decoder: a coupled pair of fields. The encoder field e(x_s, y, s) on the source grid
evolves first (the encoder's own scheme, ``splitformer.models.encoder``) and gives the memory

    M(x_s, y) = P_enc(e(x_s, y, T_e))                    (after the encoder's final norm),

a field that is fixed while the decoder field u(x, y, t) on the target grid evolves:

    u_t = A_c[u] + C[u; M] + G[u] - dI_S1 ...                           (three fields, three norms)
    C[u; M](x, .) = sum_h W_O,h int g_h(x, x_s) V_M,h(x_s, .) dx_s,
    g_h(x, x_s)   = softmax_{x_s}(<Q_u,h(x), K_M,h(x_s)> / sqrt(d_h) + m_cross(x, x_s)),

the cross-attention kernel (``operators.CrossAttention``) whose keys and values are feature
integrals of M. One nn.TransformerDecoderLayer is one step of the Lie scheme on the layout
(attention, norm1), (cross_attention, norm2), (ffn, norm3):

    post-LN:  u <- P1(u + tau A(u));  u <- P2(u + tau C(u; M));  u <- P3(u + tau G(u))
    pre-LN:   u <- u + tau A(P1 u);   u <- u + tau C(P2 u; M);   u <- u + tau G(P3 u)

and the decoder's final norm is the read-out. The coupling is one-way (M does not depend on u):
the pair is a triangular system, solved field after field.

Schemes. For the decoder with memory, a named scheme is built on the decoder's three-field
layout ("prenorm" moves the projections inside the fields); every decoder scheme must contain
the ``cross_attention`` stage (a check, since dropping it would silently decouple the pair).
``EncoderDecoderModel.with_scheme(name)`` applies a named scheme to both fields (each on its own
layout); a Scheme value or string applies to the decoder only, and ``encoder_scheme=`` sets the
encoder's. ``refine(k)`` refines both time grids (tau -> tau / k for the encoder and the
decoder; ``encoder_k`` sets the encoder's factor separately).

Nothing here imports ``transformers`` or wraps torch.nn: the weight map is in
``splitformer.interop.torch_transformer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..operators import Context, CrossAttention, FeedForward, LayerNormProjection, NonlocalAttention
from ..operators.tape import KVTape
from ..time import Controls, Evolution, Scheme, TimeGrid, Trajectory
from ..time.schemes import SCHEMES
from ..time.schemes.families import DECODER_POST_LN, DECODER_PRE_LN, decoder_lie, decoder_prenorm
from .base import EvolutionModel, TorchLayoutReadOut, shared_copy
from .blocks import block_controls
from .encoder import Encoder, network_encoder
from .masks import (
    attention_support,
    causal_support,
    check_src,
    check_token_grid,
    merge_supports,
)

__all__ = [
    "DECODER_POST_LN",
    "DECODER_PRE_LN",
    "CrossDecoder",
    "EncoderDecoderModel",
    "decoder_controls",
    "decoder_lie",
    "decoder_prenorm",
    "encoder_decoder",
    "network_decoder",
]


def decoder_controls(
    d_model: int,
    nhead: int,
    dim_feedforward: int,
    num_layers: int,
    *,
    activation: str = "relu",
    layer_norm_eps: float = 1e-5,
    bias: bool = True,
    dropout: float = 0.0,
    device=None,
    dtype=None,
) -> Controls:
    """theta^n of a decoder step: attention, norm1, cross_attention, norm2, ffn, norm3."""
    kw = {"device": device, "dtype": dtype}
    drop = {"attn_dropout": dropout, "out_dropout": dropout}
    return block_controls(
        num_layers,
        attention=lambda n: NonlocalAttention(d_model, nhead, bias=bias, **drop, **kw),
        cross_attention=lambda n: CrossAttention(d_model, nhead, bias=bias, **drop, **kw),
        ffn=lambda n: FeedForward([d_model, dim_feedforward, d_model], activation=activation,
                                  bias=bias, dropout=dropout, out_dropout=dropout, **kw),
        norm=lambda n: LayerNormProjection(d_model, eps=layer_norm_eps, bias=bias, **kw),
    )


def _is_decoder_scheme(scheme: Scheme) -> bool:
    return "cross_attention" in scheme.operators()


class CrossDecoder(TorchLayoutReadOut, EvolutionModel):
    """The decoder field coupled to a memory M: forward(tgt, memory, tgt_mask, memory_mask,
    tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal, memory_is_causal), the
    arguments of nn.TransformerDecoder (and nn.TransformerDecoderLayer), same tensor back.

    u(0) = tgt, u(T) by the decoder scheme with the context {self-attention support, memory M,
    cross-attention support}, read-out ``final_norm`` (identity when None). A tgt_mask is the
    self-attention support as given; without one, ``tgt_is_causal=True`` gives the causal support
    x' <= x (torch.nn would require the mask). ``memory_is_causal=True`` without a memory_mask
    gives the top-left causal support x_s <= x.

    Token grids (keywords, each (N,) or (B, N), batch first; None = uniform / the index): the
    target field's ``tgt_token_weights`` / ``tgt_token_coords`` (self-attention integrates
    against them, its causal support is x_k <= x_q on the coordinates, not folded into a mask)
    and the memory's ``memory_token_weights`` / ``memory_token_coords`` (cross-attention
    integrates over the memory against them; ``context.memory_weights`` /
    ``context.memory_coords``). With coordinates, ``memory_is_causal`` compares x_s <= x on them.
    """

    def __init__(
        self,
        evolution: Evolution,
        *,
        final_norm: nn.Module | None = None,
        batch_first: bool = True,
        source: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not _is_decoder_scheme(evolution.scheme):
            raise ValueError(f"a decoder scheme must contain the cross_attention stage, got "
                             f"{evolution.scheme.name!r} [{evolution.scheme}]")
        self.evolution = evolution
        self.final_norm = final_norm
        self.batch_first = bool(batch_first)
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)
        attn = evolution.controls[0]["attention"]
        self.d_model = attn.dim
        self.nhead = attn.num_heads

    # -- schemes -----------------------------------------------------------------------------
    def with_scheme(self, scheme: str | Scheme, **options):
        """The same decoder (shared parameters) under another scheme.

        A name is built on the decoder's three-field layout ("prenorm" moves the projections
        inside the fields); the result must contain cross_attention.
        """
        new = super().with_scheme(scheme, **options)
        if not _is_decoder_scheme(new.evolution.scheme):
            raise ValueError(f"scheme {new.evolution.scheme.name!r} [{new.evolution.scheme}] has "
                             "no cross_attention stage: it would decouple the decoder from its "
                             "memory")
        return new

    # -- the context -------------------------------------------------------------------------
    def _param(self) -> torch.Tensor:
        return self.evolution.controls[0]["attention"].qkv_weight

    def _batch_first(self, x: torch.Tensor, name: str, unbatched: bool) -> torch.Tensor:
        p = self._param()
        check_src(x, dim=self.d_model, dtype=p.dtype, device=p.device, name=name)
        if x.dim() != (2 if unbatched else 3):
            raise ValueError(f"{name} must be batched like tgt: shape (batch, seq, "
                             f"{self.d_model}) or (seq, {self.d_model}), got {tuple(x.shape)}")
        if unbatched:
            return x.unsqueeze(0)
        return x if self.batch_first else x.transpose(0, 1)

    def initial_condition(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        tgt_token_weights: torch.Tensor | None = None,
        tgt_token_coords: torch.Tensor | None = None,
        memory_token_weights: torch.Tensor | None = None,
        memory_token_coords: torch.Tensor | None = None,
        tape: KVTape | None = None,
    ) -> tuple[torch.Tensor, Context]:
        """u(0) = tgt (batch first) and the context: the supports, the memory field M, the
        two token grids (u's: ``token_weights`` / ``token_coords``; M's:
        ``memory_weights`` / ``memory_coords``, checked against N) and, for the read-out,
        ``readout["unbatched"]``. With a KV ``tape`` tgt holds the new target nodes only: the
        self-attention is the causal Volterra operator on the tape (docs/generation.md),
        its padding ``tgt_key_padding_mask`` of the new nodes; the cross-attention reads M."""
        for name, flag in (("tgt_is_causal", tgt_is_causal), ("memory_is_causal",
                                                                memory_is_causal)):
            if flag is not None and not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool or None, got {flag!r}")
        unbatched = isinstance(tgt, torch.Tensor) and tgt.dim() == 2
        u0 = self._batch_first(tgt, "tgt", unbatched)
        m = self._batch_first(memory, "memory", unbatched)
        if u0.shape[0] != m.shape[0]:
            raise ValueError(f"tgt and memory must have the same batch size, got {u0.shape[0]} "
                             f"and {m.shape[0]}")
        grids = self._check_grids((tgt_token_weights, tgt_token_coords, memory_token_weights,
                                   memory_token_coords), u0.shape[0], u0.shape[1], m.shape[1],
                                  u0.dtype)
        tgt_token_weights, tgt_token_coords, memory_token_weights, memory_token_coords = grids

        def batched(kpm):
            if unbatched and isinstance(kpm, torch.Tensor) and kpm.dim() == 1:
                return kpm.unsqueeze(0)
            return kpm

        cross = self._cross_support(memory_mask, batched(memory_key_padding_mask),
                                    memory_is_causal, u0.shape, m.shape[1], grids)
        if tape is not None:
            self._open_tape(tape, u0, batched(tgt_key_padding_mask), tgt_token_weights,
                            tgt_token_coords, tgt_mask, tgt_is_causal, memory_is_causal)
            self_support, causal = None, True
        else:
            self_support, causal = self._self_support(tgt_mask, batched(tgt_key_padding_mask),
                                                      tgt_is_causal, u0.shape,
                                                      any(t is not None for t in grids[:2]))
        ctx = Context(attn_mask=self_support, is_causal=causal, memory=m, memory_mask=cross,
                      memory_weights=memory_token_weights, memory_coords=memory_token_coords,
                      readout={"unbatched": unbatched}, tape=tape,
                      token_weights=tgt_token_weights, token_coords=tgt_token_coords)
        return u0, ctx

    def _open_tape(self, tape: Any, u0: torch.Tensor, kpm, weights, coords, tgt_mask,
                   tgt_is_causal, memory_is_causal) -> None:
        """Begin a forward of the new target nodes on the tape (their key padding, their
        grid); the tape builds the self-attention's support."""
        self._check_tape(tape, tgt_mask, tgt_is_causal, memory_is_causal)
        keep = None if kpm is None else attention_support(
            None, kpm, q_len=u0.shape[1], k_len=u0.shape[1],
            kpm_name="tgt_key_padding_mask", **self._masks(u0.shape[0]))
        if keep is not None and keep.dtype != torch.bool:
            raise TypeError("tgt_key_padding_mask on a KV tape must be a bool tensor (True = "
                            "padding)")
        tape.begin(u0.shape[1], u0.shape[0], keep=None if keep is None else keep[:, 0, 0],
                   weights=weights, coords=coords, dtype=u0.dtype, device=u0.device,
                   signature=self.evolution.signature())

    @staticmethod
    def _check_tape(tape: Any, tgt_mask, tgt_is_causal, memory_is_causal) -> None:
        """A tape needs the causal self-attention (tgt_is_causal, no tgt_mask: the tape builds
        the support) and a memory support that does not move with the target's index."""
        if not isinstance(tape, KVTape):
            raise TypeError(f"tape must be a splitformer KVTape, got {type(tape).__name__}")
        if tgt_mask is not None or tgt_is_causal is False:
            raise ValueError("a KV tape needs the causal self-attention: pass tgt_is_causal=True "
                             "and no tgt_mask (the tape builds the support of the new nodes)")
        if memory_is_causal:
            raise ValueError("memory_is_causal with a KV tape: the causal memory support reads "
                             "the target's index, which restarts at each forward on the tape; "
                             "pass a memory_mask for the new nodes instead")

    _GRID_NAMES = ("tgt_token_weights", "tgt_token_coords", "memory_token_weights",
                   "memory_token_coords")

    def _check_grids(self, grids: tuple, b: int, n: int, s: int,
                     dtype: torch.dtype | None = None) -> tuple:
        """The target grid against tgt's N, the memory's against the memory's (naming them);
        the four tensors back, an integer one cast to ``dtype``."""
        owner, names = type(self).__name__, self._GRID_NAMES
        return (*check_token_grid(grids[0], grids[1], batch=b, seq=n, owner=owner,
                                  names=names[:2], dtype=dtype),
                *check_token_grid(grids[2], grids[3], batch=b, seq=s, owner=owner,
                                  names=names[2:], dtype=dtype))

    def _masks(self, b: int) -> dict[str, Any]:
        p = self._param()
        return {"batch": b, "num_heads": self.nhead, "dtype": p.dtype, "device": p.device}

    def _self_support(self, tgt_mask, tgt_kpm, tgt_is_causal, shape, on_grid: bool
                      ) -> tuple[torch.Tensor | None, bool]:
        """(the self-attention support, is_causal): a tgt_mask as given; without one,
        tgt_is_causal is the causal support, folded into the padding mask on the index grid
        and left to the kernel (x_k <= x_q on the coordinates) on a token grid."""
        b, n, _ = shape
        kw = self._masks(b)
        self_support = attention_support(
            tgt_mask, tgt_kpm, q_len=n, k_len=n, mask_name="tgt_mask",
            kpm_name="tgt_key_padding_mask", **kw)
        causal = bool(tgt_is_causal) and tgt_mask is None
        if causal and self_support is not None and not on_grid:  # folded once, not per layer
            self_support = merge_supports(causal_support(n, n, kw["device"]), self_support,
                                          kw["dtype"])
            causal = False
        return self_support, causal

    def _cross_support(self, memory_mask, memory_kpm, memory_is_causal: bool, shape, s: int,
                       grids: tuple) -> torch.Tensor | None:
        """The cross-attention support; memory_is_causal without a memory_mask adds the
        top-left causal support x_s <= x, on the coordinates of the two grids when either is
        given (the index otherwise)."""
        b, n, _ = shape
        kw = self._masks(b)
        cross = attention_support(
            memory_mask, memory_kpm, q_len=n, k_len=s, mask_name="memory_mask",
            kpm_name="memory_key_padding_mask", **kw)
        if not memory_is_causal or memory_mask is not None:
            return cross
        if grids[1] is None and grids[3] is None:
            return merge_supports(causal_support(n, s, kw["device"]), cross, kw["dtype"])
        xq, xk = (torch.arange(k, dtype=torch.float64, device=kw["device"]) if c is None else
                  c.to(device=kw["device"], dtype=torch.float64) for k, c in ((n, grids[1]),
                                                                               (s, grids[3])))
        xq = xq if xq.dim() == 2 else xq.unsqueeze(0)
        xk = xk if xk.dim() == 2 else xk.unsqueeze(0)
        return merge_supports((xk[:, None, :] <= xq[:, :, None]).unsqueeze(1), cross,
                              kw["dtype"])

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        tgt_token_weights: torch.Tensor | None = None,
        tgt_token_coords: torch.Tensor | None = None,
        memory_token_weights: torch.Tensor | None = None,
        memory_token_coords: torch.Tensor | None = None,
        tape: KVTape | None = None,
    ) -> torch.Tensor:
        return self.solve(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                          memory_key_padding_mask, tgt_is_causal, memory_is_causal,
                          tgt_token_weights=tgt_token_weights,
                          tgt_token_coords=tgt_token_coords,
                          memory_token_weights=memory_token_weights,
                          memory_token_coords=memory_token_coords, tape=tape)


class EncoderDecoderModel(EvolutionModel):
    """The pair: encoder field -> memory M = P_enc(e(T_e)) -> decoder field -> read-out.

    forward(src, tgt, src_mask, tgt_mask, memory_mask, src_key_padding_mask,
    tgt_key_padding_mask, memory_key_padding_mask, src_is_causal, tgt_is_causal,
    memory_is_causal) takes the arguments of nn.Transformer and returns the same tensor; the
    keywords ``src_token_weights`` / ``src_token_coords`` put the encoder field on a token grid
    (and with it the memory: cross-attention integrates against the source grid) and
    ``tgt_token_weights`` / ``tgt_token_coords`` the decoder field (docs/math.md 3.12).
    ``.evolution`` is the decoder's evolution, ``.encoder_evolution`` the encoder's;
    ``encoder`` (an Encoder, with its final norm) and ``decoder`` (a CrossDecoder) are the two
    halves. See the module docstring for what with_scheme / refine do to each.
    """

    def __init__(
        self,
        encoder: Encoder,
        decoder: CrossDecoder,
        *,
        source: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(encoder, Encoder):
            raise TypeError(f"encoder must be a splitformer Encoder, got {type(encoder).__name__}")
        if not isinstance(decoder, CrossDecoder):
            raise TypeError(f"decoder must be a CrossDecoder, got {type(decoder).__name__}")
        if encoder.d_model != decoder.d_model:
            raise ValueError(f"encoder d_model={encoder.d_model} != decoder d_model="
                             f"{decoder.d_model}")
        if encoder.batch_first != decoder.batch_first:
            raise ValueError("encoder and decoder must share batch_first")
        self.encoder = encoder
        self.decoder = decoder
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)

    @property
    def evolution(self) -> Evolution:  # type: ignore[override]
        """The decoder's evolution (the field the output is read from)."""
        return self.decoder.evolution

    @property
    def encoder_evolution(self) -> Evolution:
        return self.encoder.evolution

    @property
    def batch_first(self) -> bool:
        return self.decoder.batch_first

    def evolution_owners(self) -> list[EvolutionModel]:
        return [self.encoder, self.decoder]

    def with_scheme(self, scheme: str | Scheme, *, encoder_scheme: str | Scheme | None = None,
                    **options) -> EncoderDecoderModel:
        """Another scheme, same parameters: a name applies to both fields (each on its own
        layout), a Scheme value or string to the decoder only; ``encoder_scheme`` sets the
        encoder's explicitly."""
        new = shared_copy(self)
        new.decoder = new.decoder.with_scheme(scheme, **options)
        if encoder_scheme is not None:
            new.encoder = new.encoder.with_scheme(encoder_scheme)
        elif isinstance(scheme, str) and scheme.strip() in SCHEMES:
            new.encoder = new.encoder.with_scheme(scheme, **options)
        return new

    def refine(self, k: int, *, encoder_k: int | None = None) -> EncoderDecoderModel:
        """tau -> tau / k for the decoder and tau -> tau / encoder_k (default k) for the encoder."""
        ks = (k if encoder_k is None else encoder_k, k)  # evolution_owners: encoder, decoder
        return self._map_evolutions(lambda e, i: e.refine(ks[i]))

    def memory(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        src_is_causal: bool | None = None,
        *,
        src_token_weights: torch.Tensor | None = None,
        src_token_coords: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """M = P_enc(e(T_e)): the encoder evolution and its final norm (layout of src), on the
        source grid when given."""
        self._check_source_grid(src, src_token_weights, src_token_coords)
        return self.encoder(src, src_mask, src_key_padding_mask, src_is_causal,
                            token_weights=src_token_weights, token_coords=src_token_coords)

    def _check_source_grid(self, src: torch.Tensor, weights, coords) -> None:
        """src_token_weights / src_token_coords against src's N (named as the forward's)."""
        if weights is None and coords is None:
            return
        if not isinstance(src, torch.Tensor) or src.dim() not in (2, 3):
            return  # the encoder refuses src itself
        b, n = (1, src.shape[0]) if src.dim() == 2 else \
            tuple(src.shape[:2]) if self.encoder.batch_first else (src.shape[1], src.shape[0])
        check_token_grid(weights, coords, batch=b, seq=n, owner=type(self).__name__,
                         names=("src_token_weights", "src_token_coords"))

    def initial_condition(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        src_token_weights: torch.Tensor | None = None,
        src_token_coords: torch.Tensor | None = None,
        tgt_token_weights: torch.Tensor | None = None,
        tgt_token_coords: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Context]:
        """The decoder field's u(0) = tgt and its context, whose memory M is the encoder
        field's read-out (the encoder evolution runs here: the coupling is one-way) on the
        source grid (the memory's grid is the source's)."""
        if not isinstance(src, torch.Tensor) or not isinstance(tgt, torch.Tensor):
            raise TypeError("src and tgt must be torch.Tensor")
        if src.dim() != tgt.dim():
            raise ValueError(f"src and tgt must both be batched or both unbatched, got shapes "
                             f"{tuple(src.shape)} and {tuple(tgt.shape)}")
        m = self.memory(src, src_mask, src_key_padding_mask, src_is_causal,
                        src_token_weights=src_token_weights, src_token_coords=src_token_coords)
        return self.decoder.initial_condition(
            tgt, m, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
            tgt_is_causal, memory_is_causal, tgt_token_weights=tgt_token_weights,
            tgt_token_coords=tgt_token_coords, memory_token_weights=src_token_weights,
            memory_token_coords=src_token_coords)

    def read_out(self, u: torch.Tensor, context: Context) -> torch.Tensor:
        return self.decoder.read_out(u, context)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        src_token_weights: torch.Tensor | None = None,
        src_token_coords: torch.Tensor | None = None,
        tgt_token_weights: torch.Tensor | None = None,
        tgt_token_coords: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.solve(src, tgt, src_mask, tgt_mask, memory_mask, src_key_padding_mask,
                          tgt_key_padding_mask, memory_key_padding_mask, src_is_causal,
                          tgt_is_causal, memory_is_causal, src_token_weights=src_token_weights,
                          src_token_coords=src_token_coords,
                          tgt_token_weights=tgt_token_weights,
                          tgt_token_coords=tgt_token_coords)

    def encoder_trajectory(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        src_is_causal: bool | None = None,
        *,
        src_token_weights: torch.Tensor | None = None,
        src_token_coords: torch.Tensor | None = None,
    ) -> Trajectory:
        """The encoder field e(t_i) (batch first, before the encoder's final norm)."""
        self._check_source_grid(src, src_token_weights, src_token_coords)
        return self.encoder.trajectory(src, src_mask, src_key_padding_mask, src_is_causal,
                                       token_weights=src_token_weights,
                                       token_coords=src_token_coords)


def network_decoder(
    d_model: int,
    nhead: int,
    dim_feedforward: int,
    num_layers: int,
    *,
    norm_first: bool = False,
    final_norm: bool = True,
    batch_first: bool = True,
    activation: str = "relu",
    layer_norm_eps: float = 1e-5,
    bias: bool = True,
    dropout: float = 0.0,
    device=None,
    dtype=None,
) -> CrossDecoder:
    """A decoder field with random weights (post-LN or pre-LN), tau = 1."""
    controls = decoder_controls(d_model, nhead, dim_feedforward, num_layers,
                                activation=activation, layer_norm_eps=layer_norm_eps, bias=bias,
                                dropout=dropout, device=device, dtype=dtype)
    scheme = decoder_prenorm() if norm_first else decoder_lie()
    norm = (LayerNormProjection(d_model, eps=layer_norm_eps, bias=bias, device=device,
                                dtype=dtype) if final_norm else None)
    return CrossDecoder(Evolution(controls, scheme, TimeGrid(num_layers, num_layers)),
                        final_norm=norm, batch_first=batch_first, source={"kind": "decoder"})


def encoder_decoder(
    d_model: int = 512,
    nhead: int = 8,
    num_encoder_layers: int = 6,
    num_decoder_layers: int = 6,
    dim_feedforward: int = 2048,
    *,
    norm_first: bool = False,
    batch_first: bool = True,
    activation: str = "relu",
    layer_norm_eps: float = 1e-5,
    bias: bool = True,
    dropout: float = 0.0,
    device=None,
    dtype=None,
) -> EncoderDecoderModel:
    """The pair with random weights, laid out like nn.Transformer (final norms on both)."""
    kw = {"activation": activation, "layer_norm_eps": layer_norm_eps, "bias": bias,
          "dropout": dropout, "device": device, "dtype": dtype}
    enc = network_encoder(d_model, nhead, dim_feedforward, num_encoder_layers,
                          norm_first=norm_first, final_norm=True, **kw)
    if enc.final_norm is not None and not bias:
        enc.final_norm = LayerNormProjection(d_model, eps=layer_norm_eps, bias=False,
                                             device=device, dtype=dtype)
    enc.batch_first = batch_first
    dec = network_decoder(d_model, nhead, dim_feedforward, num_decoder_layers,
                          norm_first=norm_first, batch_first=batch_first, **kw)
    return EncoderDecoderModel(enc, dec, source={"kind": "transformer"})
