"""Causal models: the decoder-only evolution (GPT) and the encoder-decoder pair of fields.

(a) Decoder-only (causal) evolution. On the token grid x = 0..N-1 and the feature grid y:

    u(x, y, 0) = f(x, y) = E_w(id_x, y) + E_p(pos_x, y)                   (+ dropout)
    u_t = A_c[P1 u] + G[P2 u]                                             on (0, T], T = L
    A_c[v](x, .) = sum_h W_O,h int_{x' <= x} g_h(x, x') V_h(x', .) dx'    (causal kernel)
    R(u) = P_f(u(T)),   logits = R(u) E_w^T                               (read-outs)

The causal support x' <= x makes A_c a Volterra operator in x: u(x, ., t) depends only on
f(x', .) for x' <= x, at every t (the evolution never looks ahead). P1, P2, P_f are LayerNorms
read as projections with a ghost point and an affine map (docs/math.md 3.1). The projections
enter the vector field (pre-LN, docs/math.md 3.2); one GPT-2 block is one explicit Euler step
(tau = 1) of the ``prenorm`` scheme, Stage("attention", pre=("norm1",)),
Stage("ffn", pre=("norm2",)):

    u <- u + tau A_c(P1 u);     u <- u + tau G(P2 u),     G(v) = W_2 s(W_1 v + b_1) + b_2

with s the tanh-approximate GELU for GPT-2's "gelu_new". A padding mask m(x') (1 = token,
0 = padding) restricts the support further to {x' <= x, m(x') = 1}. The LM read-out is the
feature integral against the (tied) token embedding: logits(x, v) = <R(u)(x, .), E_w(v, .)>.

(b) Encoder-decoder: a coupled pair of fields. The encoder field e(x_s, y, s) on the source grid
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

Schemes. ``CausalDecoderModel.with_scheme`` / ``refine`` act on its single evolution (any named
scheme is rebuilt on the pre-LN layout). For the decoder with memory, a named scheme is built on
the decoder's three-field layout ("prenorm" switches to the pre-LN decoder layout); every
decoder scheme must contain the ``cross_attention`` stage (a check, since dropping it would
silently decouple the pair). ``EncoderDecoderModel.with_scheme(name)`` applies a named scheme to
both fields (each on its own layout); a Scheme value or string applies to the decoder only, and
``encoder_scheme=`` sets the encoder's. ``refine(k)`` refines both time grids (tau -> tau / k
for the encoder and the decoder; ``encoder_k`` sets the encoder's factor separately).

Nothing here imports ``transformers``: the weight maps are in ``splitformer.interop.hf_gpt2`` and
``splitformer.interop.torch_transformer``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..operators import (
    Context,
    CrossAttention,
    FeedForward,
    LayerNormProjection,
    NonlocalAttention,
)
from ..time import Controls, Evolution, Scheme, TimeGrid, Trajectory
from ..time.schemes import Field, lie, prenorm
from .encoder import Encoder, EvolutionModel, _keep_source, encoder_controls, network_encoder
from .masks import (
    attention_support,
    causal_support,
    check_src,
    finfo_additive,
    merge_supports,
    padding_support,
)
from .outputs import ModelOutput

__all__ = [
    "DECODER_POST_LN",
    "DECODER_PRE_LN",
    "GPT2_ACTIVATIONS",
    "CausalDecoderModel",
    "CausalDecoderOutput",
    "CausalLM",
    "CrossDecoder",
    "EncoderDecoderModel",
    "TokenPositionEmbedding",
    "attention_support",
    "causal_context",
    "causal_decoder",
    "decoder_controls",
    "decoder_lie",
    "decoder_prenorm",
    "encoder_decoder",
    "network_decoder",
]

# transformers' activation_function -> splitformer Activation name; only the maps that are the
# same function (to round-off): gelu_new / gelu_pytorch_tanh / gelu_python_tanh are all
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), "gelu" and "gelu_python" the exact erf form.
GPT2_ACTIVATIONS: dict[str, str] = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
    "leaky_relu": "leaky_relu",
    "linear": "identity",
}


# ------------------------------------------------------------------------------------------
# outputs
# ------------------------------------------------------------------------------------------
@dataclass
class CausalDecoderOutput(ModelOutput):
    """u(T) after the final norm, the LM read-out (and its loss) and, when asked, the states.

    ``hidden_states`` follows transformers: (u(t_0), ..., u(t_{N_t - 1}), P_f(u(T))), i.e. the
    trajectory with its last point replaced by the read-out. Integer indexing runs over the
    fields that are set, in transformers' order (loss, logits, last_hidden_state, ...), so that
    ``out[0]`` is what transformers' ``out[0]`` is.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


# ------------------------------------------------------------------------------------------
# (a) the decoder-only evolution
# ------------------------------------------------------------------------------------------
class TokenPositionEmbedding(nn.Module):
    """The initial condition f = E_w[ids] + E_p[positions] (+ E_w[type ids]), then dropout.

    Two learned dictionaries (token and position), summed in GPT-2's order; token type ids, when
    given, are looked up in the token dictionary (as GPT-2 does).
    """

    def __init__(self, vocab_size: int, max_positions: int, dim: int, *, dropout: float = 0.0,
                 device=None, dtype=None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.dim = dim
        self.max_positions = max_positions
        self.word = nn.Embedding(vocab_size, dim, **kw)
        self.position = nn.Embedding(max_positions, dim, **kw)
        self.dropout = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return (f"vocab={self.word.num_embeddings}, positions={self.max_positions}, "
                f"dim={self.dim}")

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
                raise ValueError("input_ids must be a tensor of shape (batch, seq), got "
                                 f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
            n = input_ids.shape[1]
            e = self.word(input_ids)
        else:
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.dim:
                raise ValueError(f"inputs_embeds must have shape (batch, seq, {self.dim}), got "
                                 f"{tuple(inputs_embeds.shape)}")
            if inputs_embeds.dtype != self.word.weight.dtype:
                raise TypeError(f"inputs_embeds has dtype {inputs_embeds.dtype} but the model's "
                                f"parameters are {self.word.weight.dtype}")
            n = inputs_embeds.shape[1]
            e = inputs_embeds
        if position_ids is None:
            if n > self.max_positions:
                raise ValueError(f"sequence length {n} exceeds the {self.max_positions} learned "
                                 "positions (n_positions)")
            position_ids = torch.arange(n, device=e.device).unsqueeze(0)
        e = e + self.position(position_ids)
        if token_type_ids is not None:
            e = e + self.word(token_type_ids.view(-1, n))
        return self.dropout(e)


def _packed_sequences(position_ids: torch.Tensor, batch: int) -> torch.Tensor | None:
    """Sequence labels of packed inputs (positions restarting inside a row), else None.

    A new sequence starts wherever position_ids does not increase by exactly 1 (transformers'
    ``find_packed_sequence_indices``).
    """
    pos = position_ids if position_ids.shape[0] == batch else position_ids.expand(batch, -1)
    diff = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
    labels = (diff != 1).cumsum(-1)
    if bool((labels[:, -1] == 0).all()):
        return None
    return labels


def causal_context(
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    *,
    batch: int,
    seq: int,
    dtype: torch.dtype,
    device: torch.device,
    additive: bool = False,
    packed: bool = True,
) -> Context:
    """The kernel support of the causal evolution, built as transformers 5 builds GPT-2's mask.

    * no padding (mask None or all ones): the causal support x' <= x (``is_causal``);
    * a 2-D padding mask m (B, N): {x' <= x and m(x') != 0}, a boolean (B, 1, N, N) support, or
      additive with ``torch.finfo(dtype).min`` off the support when ``additive`` (transformers'
      eager path; a query whose whole causal past is padding then averages over every key,
      as in transformers);
    * position_ids restarting inside a row, no mask and ``packed`` (packed sequences):
      {x' <= x, same sequence} (transformers does this only when it runs without a cache,
      ``use_cache=False``);
    * a 4-D mask is used as given (the caller's support, without the causal part), as
      transformers does.

    Whenever a mask is built it already holds the causal support (``is_causal`` is then False:
    the kernel uses the mask as given).
    """
    if attention_mask is not None:
        allowed, prepared = padding_support(attention_mask, batch, seq, device)
        if prepared:
            return Context(attn_mask=allowed, is_causal=False)
        if allowed is None:
            return Context(is_causal=True)
    elif position_ids is not None and packed:
        labels = _packed_sequences(position_ids.to(device), batch)
        if labels is None:
            return Context(is_causal=True)
        allowed = (labels[:, :, None] == labels[:, None, :])[:, None]
    else:
        return Context(is_causal=True)
    causal = causal_support(seq, seq, device)
    support = causal & allowed
    if additive:
        support = finfo_additive(support, dtype)
    # the support already holds x' <= x; is_causal=False keeps transformers' treatment of
    # queries whose whole causal past is padding (finfo.min everywhere: an average over all keys)
    return Context(attn_mask=support, is_causal=False)


class CausalDecoderModel(EvolutionModel):
    """A decoder-only (causal) evolution: u(0) = f (``embedding``), u(T), read-out ``final_norm``.

    forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds) takes the
    inputs of transformers' ``GPT2Model`` and returns ``last_hidden_state`` = P_f(u(T));
    ``output_hidden_states=True`` adds transformers' hidden states (see CausalDecoderOutput).
    ``additive_mask`` picks how a padding mask becomes the kernel's support (see
    ``causal_context``): additive ``finfo.min`` (transformers' eager path) or boolean (sdpa).
    ``use_cache`` only mirrors transformers' switch of the same name (there is no cache here):
    when False, position_ids that restart inside a row mark packed sequences, each with its own
    causal support (transformers detects packing only when it runs without a cache).
    """

    def __init__(
        self,
        embedding: TokenPositionEmbedding,
        evolution: Evolution,
        *,
        final_norm: nn.Module | None = None,
        additive_mask: bool = False,
        use_cache: bool = True,
        source: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.evolution = evolution
        self.final_norm = final_norm
        self.additive_mask = bool(additive_mask)
        self.use_cache = bool(use_cache)
        self.source = _keep_source(source)

    def initial_condition(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
    ) -> tuple[torch.Tensor, Context]:
        """u(0) = f and the causal context (the support of the Volterra kernel)."""
        u0 = self.embedding(input_ids, position_ids, inputs_embeds, token_type_ids)
        b, n, _ = u0.shape
        cache = self.use_cache if use_cache is None else bool(use_cache)
        ctx = causal_context(attention_mask, position_ids, batch=b, seq=n, dtype=u0.dtype,
                             device=u0.device, additive=self.additive_mask, packed=not cache)
        return u0, ctx

    def _run(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
             use_cache, output_hidden_states: bool):
        u0, ctx = self.initial_condition(input_ids, attention_mask, token_type_ids, position_ids,
                                         inputs_embeds, use_cache)
        u, states = self.evolution.run(u0, ctx, keep_states=output_hidden_states)
        out = self.final_norm(u) if self.final_norm is not None else u
        hidden = (*states[:-1], out) if states is not None else None
        return out, hidden

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        *,
        output_hidden_states: bool = False,
    ) -> CausalDecoderOutput:
        out, hidden = self._run(input_ids, attention_mask, token_type_ids, position_ids,
                                inputs_embeds, use_cache, output_hidden_states)
        return CausalDecoderOutput(last_hidden_state=out, hidden_states=hidden)

    def trajectory(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
    ) -> Trajectory:
        """u(t_i) at every grid point, (N_t + 1, B, N, d), before the read-out."""
        u0, ctx = self.initial_condition(input_ids, attention_mask, token_type_ids, position_ids,
                                         inputs_embeds, use_cache)
        return self.evolution(u0, ctx, return_trajectory=True)


class CausalLM(CausalDecoderModel):
    """The causal evolution with the LM read-out logits(x, v) = <P_f u(x, ., T), W(v, .)>.

    W is the token embedding E_w when tied (``lm_head.weight`` is then the same parameter as
    ``embedding.word.weight``). With ``labels`` the next-token cross entropy is computed as
    transformers does (labels shifted by one, -100 ignored, mean over the kept tokens); half
    precision logits are upcast to float32, float64 ones kept (transformers downcasts those).
    """

    def __init__(
        self,
        embedding: TokenPositionEmbedding,
        evolution: Evolution,
        *,
        final_norm: nn.Module | None = None,
        tie_word_embeddings: bool = True,
        additive_mask: bool = False,
        use_cache: bool = True,
        source: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(embedding, evolution, final_norm=final_norm,
                         additive_mask=additive_mask, use_cache=use_cache, source=source)
        w = embedding.word.weight
        # tied: the head's own weight is never used, so none is allocated (meta device)
        self.lm_head = nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype,
                                 device="meta" if tie_word_embeddings else w.device)
        if tie_word_embeddings:
            self.lm_head.weight = w

    @property
    def tied(self) -> bool:
        return self.lm_head.weight is self.embedding.word.weight

    @staticmethod
    def lm_loss(logits: torch.Tensor, labels: torch.Tensor,
                ignore_index: int = -100) -> torch.Tensor:
        """mean_x CE(logits(x), labels(x + 1)) over the labels that are not ignore_index."""
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        shifted = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].to(logits.device)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), shifted.reshape(-1),
                               ignore_index=ignore_index)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        *,
        logits_to_keep: int | torch.Tensor = 0,
        output_hidden_states: bool = False,
    ) -> CausalDecoderOutput:
        out, hidden = self._run(input_ids, attention_mask, token_type_ids, position_ids,
                                inputs_embeds, use_cache, output_hidden_states)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(out[:, keep, :])
        loss = self.lm_loss(logits, labels) if labels is not None else None
        return CausalDecoderOutput(last_hidden_state=out, logits=logits, loss=loss,
                                   hidden_states=hidden)


def causal_decoder(
    vocab_size: int,
    max_positions: int,
    dim: int,
    num_heads: int,
    num_layers: int,
    *,
    ffn_dim: int | None = None,
    activation: str = "gelu_tanh",
    layer_norm_eps: float = 1e-5,
    embd_dropout: float = 0.0,
    attn_dropout: float = 0.0,
    resid_dropout: float = 0.0,
    attention_scales: Sequence[float | None] | None = None,
    lm_head: bool = False,
    tie_word_embeddings: bool = True,
    additive_mask: bool = False,
    use_cache: bool = True,
    source: Mapping[str, Any] | None = None,
    device=None,
    dtype=None,
) -> CausalDecoderModel:
    """A GPT-2-shaped causal evolution with random weights (pre-LN scheme, tau = 1).

    ``attention_scales[n]`` is the score scale of step n (None: 1/sqrt(d_h)); GPT-2's
    ``scale_attn_weights`` / ``scale_attn_by_inverse_layer_idx`` give 1 or 1/(sqrt(d_h)(n+1)).
    """
    kw = {"device": device, "dtype": dtype}
    ff = ffn_dim if ffn_dim is not None else 4 * dim
    controls = encoder_controls(
        dim, num_heads, ff, num_layers, activation=activation, layer_norm_eps=layer_norm_eps,
        attn_dropout=float(attn_dropout), out_dropout=float(resid_dropout), ffn_dropout=0.0,
        attention_scales=attention_scales, **kw)
    embedding = TokenPositionEmbedding(vocab_size, max_positions, dim, dropout=embd_dropout, **kw)
    evolution = Evolution(controls, prenorm(), TimeGrid(num_layers, num_layers))
    final_norm = LayerNormProjection(dim, eps=layer_norm_eps, **kw)
    if lm_head:
        return CausalLM(embedding, evolution, final_norm=final_norm,
                        tie_word_embeddings=tie_word_embeddings, additive_mask=additive_mask,
                        use_cache=use_cache, source=source)
    return CausalDecoderModel(embedding, evolution, final_norm=final_norm,
                              additive_mask=additive_mask, use_cache=use_cache, source=source)


# ------------------------------------------------------------------------------------------
# (b) the decoder field coupled to a memory, and the encoder-decoder pair
# ------------------------------------------------------------------------------------------
DECODER_POST_LN: tuple[Field, ...] = (
    Field("attention", projection="norm1"),
    Field("cross_attention", projection="norm2"),
    Field("ffn", projection="norm3"),
)
DECODER_PRE_LN: tuple[Field, ...] = (
    Field("attention", pre=("norm1",)),
    Field("cross_attention", pre=("norm2",)),
    Field("ffn", pre=("norm3",)),
)


def decoder_lie(integrator: str = "euler", form: str = "raw") -> Scheme:
    """Post-LN decoder step: u <- P1(u + tau A u); P2(u + tau C(u; M)); P3(u + tau G u)."""
    return lie(DECODER_POST_LN, integrator, form)


def decoder_prenorm(integrator: str = "euler") -> Scheme:
    """Pre-LN decoder step: u += tau A(P1 u); u += tau C(P2 u; M); u += tau G(P3 u)."""
    s = lie(DECODER_PRE_LN, integrator)
    return Scheme(s.stages, name="prenorm",
                  description="Lie splitting of u_t = A(P1 u) + C(P2 u; M) + G(P3 u): "
                  "projections inside the fields", order=1, meta=s.meta)


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

    def norm() -> LayerNormProjection:
        return LayerNormProjection(d_model, eps=layer_norm_eps, bias=bias, **kw)

    sets = []
    for _ in range(num_layers):
        sets.append({
            "attention": NonlocalAttention(d_model, nhead, bias=bias, attn_dropout=dropout,
                                           out_dropout=dropout, **kw),
            "norm1": norm(),
            "cross_attention": CrossAttention(d_model, nhead, bias=bias, attn_dropout=dropout,
                                              out_dropout=dropout, **kw),
            "norm2": norm(),
            "ffn": FeedForward([d_model, dim_feedforward, d_model], activation=activation,
                               bias=bias, dropout=dropout, out_dropout=dropout, **kw),
            "norm3": norm(),
        })
    return Controls(sets)


def _is_decoder_scheme(scheme: Scheme) -> bool:
    return "cross_attention" in scheme.operators()


class CrossDecoder(EvolutionModel):
    """The decoder field coupled to a memory M: forward(tgt, memory, tgt_mask, memory_mask,
    tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal, memory_is_causal), the
    arguments of nn.TransformerDecoder (and nn.TransformerDecoderLayer), same tensor back.

    u(0) = tgt, u(T) by the decoder scheme with the context {self-attention support, memory M,
    cross-attention support}, read-out ``final_norm`` (identity when None). A tgt_mask is the
    self-attention support as given; without one, ``tgt_is_causal=True`` gives the causal support
    x' <= x (torch.nn would require the mask). ``memory_is_causal=True`` without a memory_mask
    gives the top-left causal support x_s <= x.
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
        self.source = _keep_source(source)
        attn = evolution.controls[0]["attention"]
        self.d_model = attn.dim
        self.nhead = attn.num_heads

    # -- schemes -----------------------------------------------------------------------------
    def with_scheme(self, scheme: str | Scheme, **options):
        """The same decoder (shared parameters) under another scheme.

        A name is built on the decoder's three-field layout ("prenorm": the pre-LN decoder
        layout, "lie" keeps the current layout); the result must contain cross_attention.
        """
        if scheme == "prenorm":
            evo = Evolution(self.evolution.controls, decoder_prenorm(**options),
                            self.evolution.grid, validate=self.evolution.validate)
        else:
            evo = self.evolution.with_scheme(scheme, **options)
        if not _is_decoder_scheme(evo.scheme):
            raise ValueError(f"scheme {evo.scheme.name!r} [{evo.scheme}] has no cross_attention "
                             "stage: it would decouple the decoder from its memory")
        return self._with_evolution(evo)

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

    def decoder_context(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> tuple[torch.Tensor, Context, bool]:
        """u(0) (batch first), the context (supports and memory) and whether tgt is unbatched."""
        unbatched = isinstance(tgt, torch.Tensor) and tgt.dim() == 2
        u0 = self._batch_first(tgt, "tgt", unbatched)
        m = self._batch_first(memory, "memory", unbatched)
        if u0.shape[0] != m.shape[0]:
            raise ValueError(f"tgt and memory must have the same batch size, got {u0.shape[0]} "
                             f"and {m.shape[0]}")
        b, n, _ = u0.shape
        s = m.shape[1]
        p = self._param()
        kw = {"batch": b, "num_heads": self.nhead, "dtype": p.dtype, "device": p.device}

        def batched(kpm):
            if unbatched and isinstance(kpm, torch.Tensor) and kpm.dim() == 1:
                return kpm.unsqueeze(0)
            return kpm

        self_support = attention_support(
            tgt_mask, batched(tgt_key_padding_mask), q_len=n, k_len=n, mask_name="tgt_mask",
            kpm_name="tgt_key_padding_mask", **kw)
        causal = bool(tgt_is_causal) and tgt_mask is None
        if causal and self_support is not None:  # folded once here, not in every layer
            self_support = merge_supports(causal_support(n, n, p.device), self_support, p.dtype)
            causal = False
        cross = attention_support(
            memory_mask, batched(memory_key_padding_mask), q_len=n, k_len=s,
            mask_name="memory_mask", kpm_name="memory_key_padding_mask", **kw)
        if memory_is_causal and memory_mask is None:
            cross = merge_supports(causal_support(n, s, p.device), cross, p.dtype)
        ctx = Context(attn_mask=self_support, is_causal=causal,
                      extra={"memory": m, "memory_mask": cross})
        return u0, ctx, unbatched

    def _restore(self, u: torch.Tensor, unbatched: bool) -> torch.Tensor:
        if unbatched:
            return u.squeeze(0)
        return u if self.batch_first else u.transpose(0, 1)

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
    ) -> torch.Tensor:
        u0, ctx, unbatched = self.decoder_context(
            tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
            tgt_is_causal, memory_is_causal)
        u = self.evolution(u0, ctx)
        if self.final_norm is not None:
            u = self.final_norm(u)
        return self._restore(u, unbatched)

    def trajectory(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> Trajectory:
        """u(t_i) of the decoder field at every grid point (batch first; before the read-out)."""
        u0, ctx, _ = self.decoder_context(
            tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
            tgt_is_causal, memory_is_causal)
        return self.evolution(u0, ctx, return_trajectory=True)


class EncoderDecoderModel(EvolutionModel):
    """The pair: encoder field -> memory M = P_enc(e(T_e)) -> decoder field -> read-out.

    forward(src, tgt, src_mask, tgt_mask, memory_mask, src_key_padding_mask,
    tgt_key_padding_mask, memory_key_padding_mask, src_is_causal, tgt_is_causal,
    memory_is_causal) takes the arguments of nn.Transformer and returns the same tensor.
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
        self.source = _keep_source(source)

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

    def _with(self, encoder: Encoder, decoder: CrossDecoder) -> EncoderDecoderModel:
        new = copy.copy(self)
        new._modules = dict(self._modules)
        new.encoder = encoder
        new.decoder = decoder
        return new

    def with_scheme(self, scheme: str | Scheme, *, encoder_scheme: str | Scheme | None = None,
                    **options) -> EncoderDecoderModel:
        """Another scheme, same parameters: a name applies to both fields (each on its own
        layout), a Scheme value or string to the decoder only; ``encoder_scheme`` sets the
        encoder's explicitly."""
        decoder = self.decoder.with_scheme(scheme, **options)
        if encoder_scheme is not None:
            encoder = self.encoder.with_scheme(encoder_scheme)
        elif isinstance(scheme, str) and scheme in _named_schemes():
            encoder = self.encoder.with_scheme(scheme, **options)
        else:
            encoder = self.encoder
        return self._with(encoder, decoder)

    def refine(self, k: int, *, encoder_k: int | None = None) -> EncoderDecoderModel:
        """tau -> tau / k for the decoder and tau -> tau / encoder_k (default k) for the encoder."""
        return self._with(self.encoder.refine(k if encoder_k is None else encoder_k),
                          self.decoder.refine(k))

    def validating(self, on: bool = True):
        self.encoder.validating(on)
        self.decoder.validating(on)
        return self

    def memory(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        src_is_causal: bool | None = None,
    ) -> torch.Tensor:
        """M = P_enc(e(T_e)): the encoder evolution and its final norm (layout of src)."""
        return self.encoder(src, src_mask, src_key_padding_mask, src_is_causal)

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
    ) -> torch.Tensor:
        if not isinstance(src, torch.Tensor) or not isinstance(tgt, torch.Tensor):
            raise TypeError("src and tgt must be torch.Tensor")
        if src.dim() != tgt.dim():
            raise ValueError(f"src and tgt must both be batched or both unbatched, got shapes "
                             f"{tuple(src.shape)} and {tuple(tgt.shape)}")
        m = self.memory(src, src_mask, src_key_padding_mask, src_is_causal)
        return self.decoder(tgt, m, tgt_mask, memory_mask, tgt_key_padding_mask,
                            memory_key_padding_mask, tgt_is_causal, memory_is_causal)

    def trajectory(
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
    ) -> Trajectory:
        """The decoder field u(t_i) (batch first, before the read-out); the memory is computed
        first. ``encoder_trajectory`` gives the encoder field's."""
        m = self.memory(src, src_mask, src_key_padding_mask, src_is_causal)
        return self.decoder.trajectory(tgt, m, tgt_mask, memory_mask, tgt_key_padding_mask,
                                       memory_key_padding_mask, tgt_is_causal, memory_is_causal)

    def encoder_trajectory(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        src_is_causal: bool | None = None,
    ) -> Trajectory:
        """The encoder field e(t_i) (batch first, before the encoder's final norm)."""
        return self.encoder.trajectory(src, src_mask, src_key_padding_mask, src_is_causal)


def _named_schemes() -> tuple[str, ...]:
    from ..time.schemes import NAMED

    return (*NAMED, "prenorm")


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
