"""The decoder-only (causal) evolution (GPT). On the token grid x = 0..N-1 and the feature grid y:

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

Schemes: ``with_scheme`` / ``refine`` act on the single evolution; a named scheme is rebuilt on
the pre-LN layout.

On a token grid (docs/math.md 3.12; every forward takes ``token_weights`` w_j and
``token_coords`` x_j, (N,) or (B, N), None = uniform / the index): the kernels integrate against
the weights, the causal support is x_k <= x_q on the coordinates (two nodes at one coordinate
see each other; it stays ``is_causal``, never folded into the padding mask), and the position
term is p(x_j), the learned table read as samples of p(x) (a gather at integer coordinates,
linear interpolation between rows; outside [0, n_positions - 1], or with position_ids, refused).

Nothing here imports ``transformers``: the weight map is in ``splitformer.interop.hf_gpt2``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..operators import Context, LayerNormProjection
from ..operators.rope import RotaryAngles
from ..operators.tape import KVTape
from ..time import Evolution, TimeGrid
from ..time.schemes import prenorm
from .base import EvolutionModel, keep_steps, path_states, shared_copy
from .embeddings import TokenEmbedding
from .encoder import encoder_controls
from .generation import GenerationOutput, generate
from .masks import (
    causal_support,
    check_token_grid,
    finfo_additive,
    on_token_grid,
    padding_support,
    with_token_grid,
)
from .outputs import ModelOutput

__all__ = [
    "CausalDecoderModel",
    "CausalDecoderOutput",
    "CausalLM",
    "causal_context",
    "causal_decoder",
    "tape_context",
]

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
    on_grid: bool = False,
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
    the kernel uses the mask as given), except ``on_grid`` (a token grid is given): there the
    mask holds the padding (or packing) support only and ``is_causal`` stays True, so that the
    kernel reads the causal support x_k <= x_q on the coordinates.
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
    if on_grid:
        return Context(attn_mask=finfo_additive(allowed, dtype) if additive else allowed,
                       is_causal=True)
    causal = causal_support(seq, seq, device)
    support = causal & allowed
    if additive:
        support = finfo_additive(support, dtype)
    # the support already holds x' <= x; is_causal=False keeps transformers' treatment of
    # queries whose whole causal past is padding (finfo.min everywhere: an average over all keys)
    return Context(attn_mask=support, is_causal=False)


def tape_context(tape: KVTape, attention_mask: torch.Tensor | None,
                 token_weights: torch.Tensor | None, token_coords: torch.Tensor | None, *,
                 batch: int, seq: int, dtype: torch.dtype, device: torch.device,
                 additive: bool, owner: str, signature: str | None = None) -> Context:
    """The context of a forward over ``seq`` new nodes on a KV tape: the causal support alone
    (is_causal; the tape builds the support of the new queries over past and new keys, with
    the padding it records) and the new nodes' token grid, which the tape records too.

    ``attention_mask``: (B, seq) for the new nodes, or (B, past + seq) as transformers passes
    it (its past columns must be the padding the tape recorded); 1 = token, 0 = padding. A
    prepared 4-D mask is refused (the tape builds the support)."""
    keep = None
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"attention_mask must be a torch.Tensor, got "
                            f"{type(attention_mask).__name__}")
        total = tape.length + seq
        if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or \
                attention_mask.shape[1] not in (seq, total):
            raise ValueError(f"attention_mask on a KV tape must have shape (batch, new) = "
                             f"({batch}, {seq}) or (batch, past + new) = ({batch}, {total}), "
                             f"got {tuple(attention_mask.shape)} (a 4-D mask is refused: the "
                             "tape builds the support)")
        if attention_mask.is_floating_point() and not bool(
                ((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must hold 1 (token) and 0 (padding) only")
        if attention_mask.shape[1] == total and tape.length:
            tape.check_past(attention_mask)
        keep = attention_mask[:, -seq:].to(device=device, dtype=torch.bool)
    weights, coords = check_token_grid(token_weights, token_coords, batch=batch, seq=seq,
                                       owner=owner, dtype=dtype)
    tape.begin(seq, batch, keep=keep, weights=weights, coords=coords, additive=additive,
               dtype=dtype, device=device, signature=signature)
    return Context(is_causal=True, tape=tape, token_weights=weights, token_coords=coords)


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
    ``token_weights`` / ``token_coords`` (keywords; (N,) or (B, N)) give the token grid (module
    docstring). ``causal_support``: token merging is refused by ``with_token_merging``.
    """

    causal_support = True

    def __init__(
        self,
        embedding: TokenEmbedding,
        evolution: Evolution,
        *,
        final_norm: nn.Module | None = None,
        additive_mask: bool = False,
        use_cache: bool = True,
        source: Mapping[str, Any] | None = None,
        rotary: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.evolution = evolution
        self.final_norm = final_norm
        self.additive_mask = bool(additive_mask)
        self.use_cache = bool(use_cache)
        self.source = source  # EvolutionModel.source keeps it (models.base.keep_source)
        # name -> operators.rope.RotaryPositions: the rotary angles the attention operators
        # read (Context.rotary), computed once per forward from the coordinates
        self.rotary = dict(rotary) if rotary else {}

    def initial_condition(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        labels: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        logits_to_keep: int | torch.Tensor = 0,
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
        tape: KVTape | None = None,
    ) -> tuple[torch.Tensor, Context]:
        """u(0) = f (positions p(x_j) with ``token_coords``) and the causal context (the
        support of the Volterra kernel, the token grid checked against N); for the read-out,
        the labels, the logits to keep and whether to keep the hidden states. With a ``tape``
        the inputs are the new nodes only (``tape_context``)."""
        if tape is not None:
            position_ids = self._tape_positions(tape, input_ids, inputs_embeds, position_ids,
                                                token_coords)
        u0 = self.embedding(input_ids, token_type_ids, position_ids, inputs_embeds,
                            token_coords=token_coords)
        b, n, _ = u0.shape
        if tape is not None:
            ctx = tape_context(tape, attention_mask, token_weights, token_coords, batch=b,
                               seq=n, dtype=u0.dtype, device=u0.device,
                               additive=self.additive_mask, owner=type(self).__name__,
                               signature=self.evolution.signature())
        else:
            cache = self.use_cache if use_cache is None else bool(use_cache)
            ctx = causal_context(attention_mask, position_ids, batch=b, seq=n, dtype=u0.dtype,
                                 device=u0.device, additive=self.additive_mask,
                                 packed=not cache,
                                 on_grid=on_token_grid(token_weights, token_coords))
            ctx = with_token_grid(ctx, token_weights, token_coords, batch=b, seq=n,
                                  owner=type(self).__name__, dtype=u0.dtype)
        if self.rotary:
            ctx.rotary = self.rotary_angles(position_ids, b, n, u0)
        ctx.readout.update(labels=labels, logits_to_keep=logits_to_keep)
        return u0, keep_steps(ctx, output_hidden_states)

    def rotary_angles(self, position_ids: torch.Tensor | None, b: int, n: int,
                      u0: torch.Tensor) -> RotaryAngles:
        """The rotary angles of this forward (``operators.rope.RotaryAngles``): at the
        context's coordinates when it has them, else at ``position_ids``, else at 0 .. N-1;
        each named positions' cos and sin computed once, when first asked."""
        if position_ids is not None:
            if not isinstance(position_ids, torch.Tensor):
                raise TypeError(f"position_ids must be a torch.Tensor, got "
                                f"{type(position_ids).__name__}")
            x = position_ids if position_ids.dim() == 2 else position_ids.unsqueeze(0)
            if x.dim() != 2 or x.shape[-1] != n or x.shape[0] not in (1, b):
                raise ValueError(f"position_ids must have shape (batch, seq) = ({b}, {n}), "
                                 f"(1, {n}) or ({n},), got {tuple(position_ids.shape)}")
            if x.is_floating_point() or x.dtype == torch.bool:
                raise TypeError("position_ids must be integers (real positions are "
                                "token_coords)")
            x = x.to(u0.device)
        else:
            x = torch.arange(n, device=u0.device).unsqueeze(0)
        return RotaryAngles(self.rotary, x)

    @staticmethod
    def _tape_positions(tape: KVTape, input_ids, inputs_embeds, position_ids, token_coords):
        """The new nodes' position ids on a tape: as given, else (with no coordinates) the
        committed length onwards, length .. length + n - 1 (transformers' cache_position)."""
        if not isinstance(tape, KVTape):
            raise TypeError(f"tape must be a splitformer KVTape, got {type(tape).__name__}")
        if position_ids is not None or token_coords is not None:
            return position_ids
        x = input_ids if input_ids is not None else inputs_embeds
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            return None  # the embedding names the bad input
        return torch.arange(tape.length, tape.length + x.shape[1], device=x.device)[None]

    @property
    def max_positions(self) -> int | None:
        """The number of learned positions (the longest grid of index coordinates); None for
        a rotary model (positions are angles, defined at every coordinate)."""
        return self.embedding.max_positions

    @property
    def trained_positions(self) -> int | None:
        """The context length a rotary model was trained for (its positions'
        ``trained_length``; the smallest of several), None when not recorded or not rotary:
        past it the trained kernel extrapolates."""
        known = [p.trained_length for p in self.rotary.values()
                 if p.trained_length is not None]
        return min(known) if known else None

    @property
    def context_positions(self) -> int | None:
        """The length the rotary kernel is read for: its max_position_embeddings (the trained
        length, or the extended one a context-extension rope_type records, as transformers'
        configs and ``with_rope`` write it), None when the kernel follows the current length
        (dynamic, bandwidth without a factor) or nothing is recorded; the smallest of
        several."""
        known = [p.max_position_embeddings for p in self.rotary.values()
                 if p.max_position_embeddings is not None and not p.follows_length]
        return min(known) if known else None

    def with_rope(self, rope_type: str, **parameters: Any):
        """The same model (shared parameters) reading its rotary kernel with another
        ``rope_type`` (docs/context.md): every named rotary positions becomes
        ``RotaryPositions.extended(rope_type, **parameters)`` (its features, base and trained
        length kept; transformers' parameter names; original_max_position_embeddings defaults
        to the trained length; rope_theta, when given, replaces the base: NTK-aware scaling as
        a fixed base). ``rope_type`` is one of transformers' (linear: Position Interpolation,
        dynamic, yarn, llama3, longrope, ...) or splitformer's "bandwidth"
        (``operators.rope``). Refused by name: a model without rotary positions, an unknown
        type, a parameter the type does not read (a misspelling), a factor that is not a
        finite number >= 1, a base that is not a finite number > 0
        (``operators.rope.check_extension``)."""
        if not self.rotary:
            raise ValueError(f"with_rope: {type(self).__name__} has no rotary positions "
                             "(learned or sinusoidal positions are a table, not a kernel on "
                             "the coordinates)")
        if not isinstance(rope_type, str):
            raise TypeError(f"with_rope: rope_type must be a str, got "
                            f"{type(rope_type).__name__}")
        rotary = {name: old.extended(rope_type, **parameters)
                  for name, old in self.rotary.items()}
        new = shared_copy(self)
        new.rotary = rotary
        return new

    def generation_defaults(self) -> dict[str, Any]:
        """eos_token_id and pad_token_id of the source's config (transformers' ``generate``
        reads them there when not given), where the source records them."""
        config = self.source.field("config", None) if self.source is not None else None
        if not isinstance(config, Mapping):
            return {}
        return {k: config[k] for k in ("eos_token_id", "pad_token_id")
                if config.get(k) is not None}

    def read_out(self, u: torch.Tensor, context: Context) -> CausalDecoderOutput:
        """last_hidden_state = P_f(u(T)) (the final norm; identity when None) and, when kept,
        transformers' hidden states (u(t_0), ..., u(t_{N-1}), P_f(u(T)))."""
        out = self.final_norm(u) if self.final_norm is not None else u
        states = path_states(context)
        hidden = (*states[:-1], out) if states is not None else None
        return CausalDecoderOutput(last_hidden_state=out, hidden_states=hidden)

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
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
        tape: KVTape | None = None,
    ) -> CausalDecoderOutput:
        return self.solve(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          use_cache, output_hidden_states=output_hidden_states,
                          token_weights=token_weights, token_coords=token_coords, tape=tape)


class CausalLM(CausalDecoderModel):
    """The causal evolution with the LM read-out logits(x, v) = <P_f u(x, ., T), W(v, .)>.

    W is the token embedding E_w when tied (``lm_head.weight`` is then the same parameter as
    ``embedding.word.weight``). With ``labels`` the next-token cross entropy is computed as
    transformers does (labels shifted by one, -100 ignored, mean over the kept tokens); half
    precision logits are upcast to float32, float64 ones kept (transformers downcasts those).
    """

    def __init__(
        self,
        embedding: TokenEmbedding,
        evolution: Evolution,
        *,
        final_norm: nn.Module | None = None,
        tie_word_embeddings: bool = True,
        additive_mask: bool = False,
        use_cache: bool = True,
        source: Mapping[str, Any] | None = None,
        rotary: Mapping[str, Any] | None = None,
        logit_softcap: float | None = None,
    ) -> None:
        super().__init__(embedding, evolution, final_norm=final_norm,
                         additive_mask=additive_mask, use_cache=use_cache, source=source,
                         rotary=rotary)
        # Gemma2's read-out cap * tanh(logits / cap) (None: the plain logits)
        self.logit_softcap = None if logit_softcap is None else float(logit_softcap)
        w = embedding.word.weight
        # tied: the head's own weight is never used, so none is allocated (meta device)
        self.lm_head = nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype,
                                 device="meta" if tie_word_embeddings else w.device)
        if tie_word_embeddings:
            self.lm_head.weight = w

    @property
    def tied(self) -> bool:
        return self.lm_head.weight is self.embedding.word.weight

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 20, **options: Any
                 ) -> torch.Tensor | GenerationOutput:
        """The prompt and up to ``max_new_tokens`` new ids, greedy or sampled, decoded on a KV
        tape (``models.generation.generate``: options do_sample, temperature, top_k, top_p,
        eos_token_id, pad_token_id, attention_mask, generator / seed, use_cache,
        return_logits, streamer). eos_token_id and pad_token_id default to the source
        config's, as transformers' (``generation_defaults``; pass None to decode without a
        stop)."""
        return generate(self, input_ids, max_new_tokens,
                        **{**self.generation_defaults(), **options})

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
        token_weights: torch.Tensor | None = None,
        token_coords: torch.Tensor | None = None,
        tape: KVTape | None = None,
    ) -> CausalDecoderOutput:
        return self.solve(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          use_cache, labels, output_hidden_states=output_hidden_states,
                          logits_to_keep=logits_to_keep, token_weights=token_weights,
                          token_coords=token_coords, tape=tape)

    def read_out(self, u: torch.Tensor, context: Context) -> CausalDecoderOutput:
        """logits(x, v) = <P_f u(x, ., T), W(v, .)> on the kept positions, and the next-token
        loss when labels were given."""
        out = super().read_out(u, context)
        keep = context.readout.get("logits_to_keep", 0)
        keep = slice(-keep, None) if isinstance(keep, int) else keep
        out.logits = self.lm_head(out.last_hidden_state[:, keep, :])
        if self.logit_softcap is not None:
            cap = self.logit_softcap
            out.logits = torch.tanh(out.logits / cap) * cap
        labels = context.readout.get("labels")
        if labels is not None and (context.token_weights is not None
                                   or context.token_coords is not None):
            raise ValueError("labels with token_weights / token_coords: the next-token loss is "
                             "a mean over token positions (the label of x is the token at "
                             "index x + 1), not a quadrature on the grid, so it is not defined "
                             "there; refused (compute the loss from the logits)")
        out.loss = self.lm_loss(out.logits, labels) if labels is not None else None
        return out


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
    for name, value in (("vocab_size", vocab_size), ("max_positions", max_positions)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    kw = {"device": device, "dtype": dtype}
    ff = ffn_dim if ffn_dim is not None else 4 * dim
    controls = encoder_controls(
        dim, num_heads, ff, num_layers, activation=activation, layer_norm_eps=layer_norm_eps,
        attn_dropout=float(attn_dropout), out_dropout=float(resid_dropout), ffn_dropout=0.0,
        attention_scales=attention_scales, **kw)
    embedding = TokenEmbedding(vocab_size, max_positions, dim, dropout=embd_dropout, **kw)
    evolution = Evolution(controls, prenorm(), TimeGrid(num_layers, num_layers))
    final_norm = LayerNormProjection(dim, eps=layer_norm_eps, **kw)
    if lm_head:
        return CausalLM(embedding, evolution, final_norm=final_norm,
                        tie_word_embeddings=tie_word_embeddings, additive_mask=additive_mask,
                        use_cache=use_cache, source=source)
    return CausalDecoderModel(embedding, evolution, final_norm=final_norm,
                              additive_mask=additive_mask, use_cache=use_cache, source=source)
