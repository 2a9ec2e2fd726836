"""The rotary decoder of the Llama family (Llama, Mistral, Qwen2/3, Gemma2/3, SmolLM) as an
evolution. On the token grid x and the feature grid y:

    u(x, y, 0) = f(x, y) = c E_w(id_x, y)                        (c = 1; Gemma: sqrt(d))
    u_t = A_c[P1 u] + G[P2 u]                                    on (0, T], T = L
    A_c[v](x) = sum_h W_O,h int_{S(x)} g_h(x, x') V_g(x') dx'    (causal, grouped heads)
    g_h(x, x') = softmax_x'( s <R_x N_Q Q_h(x), R_x' N_K K_g(x')> )
    G(v) = W_d (s(W_g v) * (W_u v))                              (SwiGLU / GeGLU)
    R(u) = P_f(u(T)),   logits = R(u) W^T                        (tied: W = E_w)

P1, P2, P_f are RMSNorms read as projections onto a sphere with a ghost point and a gain
(docs/math.md 3.15); G is the gated field (3.16); the heads of K and V are a coarser quadrature
in the head coordinate than Q's, the head size its own grid, QK-norm projections N_Q, N_K, a
sliding window S(x) = {x - W < x' <= x} (3.17); R_x are rotations by angles at the token
coordinates x, computed once per forward by the model (``Context.rotary``) for every rope type
(3.18, ``operators.rope``). One decoder layer is one explicit Euler step (tau = 1) of
``prenorm``; Gemma2/3's four norms per layer are ``prenorm_sandwich``
(u += tau Q1(A(P1 u)); u += tau Q2(G(P2 u))). The support of the kernel is the causal one
(``models.causal``), so the KV tape and ``generate`` apply as to GPT-2.

Nothing here imports ``transformers``: the weight map is ``splitformer.interop.hf_llama``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from ..operators import GatedFeedForward, GroupedQueryAttention, RMSNormProjection
from ..operators.kernels import SoftmaxKernel
from ..time import Evolution, TimeGrid
from ..time.schemes import prenorm, prenorm_sandwich
from .blocks import block_controls
from .causal import CausalDecoderModel, CausalLM
from .embeddings import WordEmbedding

__all__ = ["rotary_decoder"]


def _per_step(values: Sequence[Any] | None, n: int, name: str, default: Any) -> list[Any]:
    if values is None:
        return [default] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{name} needs one entry per step ({n}), got {len(values)}")
    return values


def rotary_decoder(
    vocab_size: int,
    dim: int,
    num_heads: int,
    num_layers: int,
    ffn_dim: int,
    *,
    rotary: Mapping[str, Any],
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    activation: str = "silu",
    norm_eps: float = 1e-6,
    norm_offset: float = 0.0,
    norm_gain_in_float32: bool = False,
    attention_bias: bool = False,
    out_bias: bool = False,
    mlp_bias: bool = False,
    qk_norm: bool = False,
    sandwich: bool = False,
    ropes: Sequence[str] | None = None,
    windows: Sequence[int | None] | None = None,
    attention_scales: Sequence[float | None] | None = None,
    attention_kernels: Sequence[nn.Module | None] | None = None,
    embed_scale: float = 1.0,
    scale_embeds: bool = True,
    attn_dropout: float = 0.0,
    lm_head: bool = True,
    tie_word_embeddings: bool = True,
    logit_softcap: float | None = None,
    additive_mask: bool = False,
    use_cache: bool = True,
    source: Mapping[str, Any] | None = None,
    device=None,
    dtype=None,
) -> CausalDecoderModel:
    """A Llama-family causal evolution with random weights (tau = 1, one step per layer).

    ``rotary``: name -> ``operators.rope.RotaryPositions``; ``ropes[n]`` the name step n's
    attention reads (default: the first name); ``windows[n]`` its sliding window (None: the
    whole causal past); ``attention_scales[n]`` its score scale (None: 1/sqrt(d_h));
    ``attention_kernels[n]`` a kernel instance for step n (None: softmax with that scale).
    ``norm_offset`` 1 and ``norm_gain_in_float32`` are Gemma's (1 + g) RMSNorm; ``sandwich``
    adds Gemma's norms after each field; ``embed_scale`` is c in f = c E_w.
    """
    for name, value in (("vocab_size", vocab_size), ("num_layers", num_layers),
                        ("ffn_dim", ffn_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not rotary:
        raise ValueError("rotary must name at least one RotaryPositions")
    kw = {"device": device, "dtype": dtype}
    first = next(iter(rotary))
    ropes = _per_step(ropes, num_layers, "ropes", first)
    for r in ropes:
        if r is not None and r not in rotary:
            raise ValueError(f"ropes names {r!r}, not one of the rotary positions "
                             f"{sorted(rotary)}")
    windows = _per_step(windows, num_layers, "windows", None)
    scales = _per_step(attention_scales, num_layers, "attention_scales", None)
    kernels = _per_step(attention_kernels, num_layers, "attention_kernels", None)
    d_h = head_dim if head_dim is not None else dim // num_heads

    def rms(width: int) -> RMSNormProjection:
        return RMSNormProjection(width, eps=norm_eps, offset=norm_offset,
                                 gain_in_float32=norm_gain_in_float32, **kw)

    def attention(n: int) -> GroupedQueryAttention:
        kernel = kernels[n] if kernels[n] is not None else SoftmaxKernel(scale=scales[n])
        return GroupedQueryAttention(
            dim, num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, bias=attention_bias,
            out_bias=out_bias, q_norm=rms(d_h) if qk_norm else None,
            k_norm=rms(d_h) if qk_norm else None, rope=ropes[n], window=windows[n],
            kernel=kernel, attn_dropout=attn_dropout, **kw)

    def extra(n: int) -> dict[str, nn.Module]:
        return {"post_norm1": rms(dim), "post_norm2": rms(dim)} if sandwich else {}

    controls = block_controls(
        num_layers, attention=attention, norm=lambda n: rms(dim),
        ffn=lambda n: GatedFeedForward(dim, ffn_dim, activation=activation, bias=mlp_bias, **kw),
        extra=extra)
    scheme = prenorm_sandwich() if sandwich else prenorm()
    evolution = Evolution(controls, scheme, TimeGrid(num_layers, num_layers))
    embedding = WordEmbedding(vocab_size, dim, scale=embed_scale, scale_embeds=scale_embeds,
                              **kw)
    common = {"final_norm": rms(dim), "additive_mask": additive_mask, "use_cache": use_cache,
              "source": source, "rotary": rotary}
    if lm_head:
        return CausalLM(embedding, evolution, tie_word_embeddings=tie_word_embeddings,
                        logit_softcap=logit_softcap, **common)
    return CausalDecoderModel(embedding, evolution, **common)
