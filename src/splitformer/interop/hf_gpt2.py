"""Hugging Face GPT-2 <-> splitformer: an exact weight map, both ways.

``GPT2Model`` is the causal (decoder-only) evolution of ``splitformer.models.causal``: the
initial condition f = E_w + E_p, L explicit Euler steps (tau = 1) of the pre-LN scheme with the
causal (Volterra) kernel, the read-out ``ln_f``; ``GPT2LMHeadModel`` adds the LM read-out
against the tied token embedding. Weight map, layer n -> theta^n (``GPT2_WEIGHT_MAP``; the
prefix ``transformer.`` is added for the LM model). GPT-2 stores its feature integrals as
``Conv1D`` with weight (in, out), i.e. W^T: the map transposes them.

    wte / wpe                  -> embedding.word / embedding.position       (initial condition)
    h.n.ln_1                   -> norm1                                     (P1, inside A's field)
    h.n.attn.c_attn.weight^T   -> attention.qkv_weight   (rows W_Q, W_K, W_V, each (H, d_h))
    h.n.attn.c_attn.bias       -> attention.qkv_bias
    h.n.attn.c_proj.weight^T   -> attention.out_weight                      (W_O)
    h.n.attn.c_proj.bias       -> attention.out_bias
    h.n.ln_2                   -> norm2                                     (P2, inside G's field)
    h.n.mlp.c_fc.weight^T/bias -> ffn.stages.0                              (W_1, lifted grid)
    h.n.mlp.c_proj.weight^T/b  -> ffn.stages.1                              (W_2)
    ln_f                       -> final_norm                                (read-out)
    lm_head.weight             -> lm_head.weight          (the same parameter as wte when tied)

plus the attribute rows (every LayerNorm's eps, every dropout rate, as the modules hold them;
``to_hf`` checks them against the source config, which holds one value each, and refuses a
layer that differs, naming the option).

Options. ``activation_function``: the functions of ``GPT2_ACTIVATIONS`` ("gelu_new" is the
tanh-approximate GELU); others are rejected. The score scale of step n is
1/sqrt(d_h) (``scale_attn_weights``, else 1) divided by n + 1 when
``scale_attn_by_inverse_layer_idx``: both are mapped exactly into the softmax kernel's scale.
``reorder_and_upcast_attn`` only changes transformers' eager path (scores computed in float32);
it is accepted with the sdpa path, where it has no effect, and rejected with eager.
``add_cross_attention`` (GPT-2 as the decoder of a pair) is rejected; the pair of this library is
``EncoderDecoderModel``. Attention implementations "eager" (additive finfo.min mask) and "sdpa"
(boolean mask) are reproduced, masks included. ``from_hf_model`` is check -> config
(``gpt2_config``: a ``HFGPT2Config``, kept as the model's ``source``) -> build -> copy.
``transformers`` is imported only by ``to_hf_model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..models.causal import CausalDecoderModel, CausalLM, causal_decoder
from ..time.schemes import prenorm
from .activations import GPT2_ACTIVATIONS
from .families import classes_of
from .hf import HFSource, attn_implementation, hf_config, hf_source, no_options
from .weights import (
    Row,
    check_covered,
    check_softmax,
    copy_table,
    lookup,
    network_scheme,
    prefixed,
)

__all__ = ["GPT2_WEIGHT_MAP", "HFGPT2Config", "attention_scales", "build", "check_config",
           "from_hf_model", "gpt2_config", "to_hf_model", "weight_map"]

HF_CLASSES = classes_of("hf_gpt2")  # the classes of its family record(s): a live view
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")

_LAYER_ROWS: tuple[Row, ...] = (
    Row("ln_1.weight", "norm1.weight"),
    Row("ln_1.bias", "norm1.bias"),
    Row("attn.c_attn.weight", "attention.qkv_weight", transform="transpose"),
    Row("attn.c_attn.bias", "attention.qkv_bias"),
    Row("attn.c_proj.weight", "attention.out_weight", transform="transpose"),
    Row("attn.c_proj.bias", "attention.out_bias"),
    Row("ln_2.weight", "norm2.weight"),
    Row("ln_2.bias", "norm2.bias"),
    Row("mlp.c_fc.weight", "ffn.stages.0.weight", transform="transpose"),
    Row("mlp.c_fc.bias", "ffn.stages.0.bias"),
    Row("mlp.c_proj.weight", "ffn.stages.1.weight", transform="transpose"),
    Row("mlp.c_proj.bias", "ffn.stages.1.bias"),
    Row("ln_1.eps", "norm1.eps", attr=True, option="layer_norm_epsilon"),
    Row("ln_2.eps", "norm2.eps", attr=True, option="layer_norm_epsilon"),
    Row("attn.attn_dropout.p", "attention.attn_dropout", attr=True, option="attn_pdrop"),
    Row("attn.resid_dropout.p", "attention.out_dropout.p", attr=True, option="resid_pdrop"),
    Row("mlp.dropout.p", "ffn.out_dropout.p", attr=True, option="resid_pdrop"),
)
_EMBEDDING_ROWS: tuple[Row, ...] = (
    Row("wte.weight", "embedding.word.weight"),
    Row("wpe.weight", "embedding.position.weight"),
    Row("drop.p", "embedding.dropout.p", attr=True, option="embd_pdrop"),
)
_FINAL_ROWS: tuple[Row, ...] = (
    Row("ln_f.weight", "final_norm.weight"),
    Row("ln_f.bias", "final_norm.bias"),
    Row("ln_f.eps", "final_norm.eps", attr=True, option="layer_norm_epsilon"),
)
_HEAD_ROWS: tuple[Row, ...] = (Row("lm_head.weight", "lm_head.weight"),)

# the whole table, with n for the layer index (docs and tests read it)
GPT2_WEIGHT_MAP: tuple[Row, ...] = (
    *_EMBEDDING_ROWS,
    *prefixed(_LAYER_ROWS, "h.n.", "evolution.controls.sets.n."),
    *_FINAL_ROWS,
    *_HEAD_ROWS,
)


@dataclass(frozen=True, kw_only=True)
class HFGPT2Config(HFSource):
    """A transformers GPT-2 as splitformer reads it: sizes (from the modules), the activation
    (splitformer's name), eps, the score scale of every step, the LM head and its tying."""

    vocab_size: int
    max_positions: int
    n_embd: int
    n_head: int
    n_layer: int
    ffn_dim: int | None
    activation: str
    layer_norm_epsilon: float
    attention_scales: tuple[float | None, ...]
    lm_head: bool
    tie_word_embeddings: bool
    use_cache: bool = True


def weight_map(num_layers: int, *, lm_head: bool) -> list[Row]:
    """Every row (tensors and attributes) of one model, transformers' names from its root."""
    prefix = "transformer." if lm_head else ""
    rows = prefixed(_EMBEDDING_ROWS, prefix, "")
    for n in range(num_layers):
        rows += prefixed(_LAYER_ROWS, f"{prefix}h.{n}.", f"evolution.controls.sets.{n}.")
    rows += prefixed(_FINAL_ROWS, prefix, "")
    if lm_head:
        rows += list(_HEAD_ROWS)
    return rows


def check_config(config: Any) -> None:
    """Raise ValueError naming the first option of a GPT2Config that the map does not support."""
    if getattr(config, "add_cross_attention", False):
        raise ValueError("add_cross_attention=True is not supported (GPT-2 as the decoder of an "
                         "encoder-decoder pair; use splitformer's EncoderDecoderModel)")
    if not getattr(config, "is_causal", True):
        raise ValueError("is_causal=False is not supported (the GPT-2 map is the causal, "
                         "Volterra-kernel evolution)")
    act = config.activation_function
    if not isinstance(act, str) or act not in GPT2_ACTIVATIONS:
        raise ValueError(f"activation_function={act!r} is not supported; supported: "
                         f"{sorted(GPT2_ACTIVATIONS)} ('gelu_new' is the tanh-approximate GELU)")
    impl = attn_implementation(config)
    if impl not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={impl!r} is not supported; supported: "
                         f"{ATTN_IMPLEMENTATIONS}")
    if getattr(config, "reorder_and_upcast_attn", False) and impl == "eager":
        raise ValueError("reorder_and_upcast_attn=True with the eager attention path is not "
                         "supported (transformers then computes the scores in float32 whatever "
                         "the dtype); use attn_implementation='sdpa', where it has no effect")
    if config.n_embd % config.n_head != 0:
        raise ValueError(f"n_head={config.n_head} must divide n_embd={config.n_embd}")


def attention_scales(config: Any) -> list[float | None]:
    """The softmax kernel's score scale of every step, as transformers' GPT2Attention computes
    it (None = the standard 1/sqrt(d_h))."""
    head_dim = config.n_embd // config.n_head
    by_layer = bool(getattr(config, "scale_attn_by_inverse_layer_idx", False))
    weights = bool(getattr(config, "scale_attn_weights", True))
    scales: list[float | None] = []
    for n in range(config.n_layer):
        if weights and not by_layer:
            scales.append(None)
            continue
        s = head_dim ** -0.5 if weights else 1.0
        if by_layer:
            s /= float(n + 1)
        scales.append(s)
    return scales


def _check_scales(gpt: nn.Module, scales: list[float | None], head_dim: int) -> None:
    for n, block in enumerate(gpt.h):  # transformers' own value, where it keeps one
        theirs = getattr(block.attn, "scaling", None)
        ours = scales[n] if scales[n] is not None else head_dim ** -0.5
        if theirs is not None and float(theirs) != ours:  # pragma: no cover - version drift
            raise ValueError(f"layer {n}: attention scaling {theirs} differs from the config's "
                             f"{ours}")


def gpt2_config(model: nn.Module) -> HFGPT2Config:
    """Check a transformers GPT2Model / GPT2LMHeadModel (ValueError naming the first
    unsupported option or weight) and read its typed config."""
    cls = type(model).__name__
    if cls not in HF_CLASSES:
        raise TypeError(f"expected one of {HF_CLASSES}, got {cls}")
    lm = cls == "GPT2LMHeadModel"
    gpt = model.transformer if lm else model
    config = model.config
    check_config(config)
    scales = attention_scales(config)
    _check_scales(gpt, scales, config.n_embd // config.n_head)
    check_covered(model.state_dict(), weight_map(len(gpt.h), lm_head=lm), "GPT-2")
    return HFGPT2Config(
        hf_class=cls,
        config=config.to_dict(),
        attn_implementation=attn_implementation(config),
        vocab_size=gpt.wte.num_embeddings,
        max_positions=gpt.wpe.num_embeddings,
        n_embd=config.n_embd,
        n_head=config.n_head,
        n_layer=len(gpt.h),
        ffn_dim=gpt.h[0].mlp.c_fc.nf if len(gpt.h) else None,
        activation=GPT2_ACTIVATIONS[config.activation_function],
        layer_norm_epsilon=float(config.layer_norm_epsilon),
        attention_scales=tuple(scales),
        lm_head=lm,
        tie_word_embeddings=bool(lm and model.lm_head.weight is gpt.wte.weight),
        use_cache=bool(getattr(config, "use_cache", True)),
    )


def build(config: HFGPT2Config, *, device=None, dtype=None) -> CausalDecoderModel:
    """The splitformer causal evolution of ``config`` with random weights; ``source`` =
    ``config``. Dropout rates and eps come with the weight table; the weights the table
    transposes keep the source's memory layout (``source_layout_``)."""
    model = causal_decoder(
        vocab_size=config.vocab_size,
        max_positions=config.max_positions,
        dim=config.n_embd,
        num_heads=config.n_head,
        num_layers=config.n_layer,
        ffn_dim=config.ffn_dim,
        activation=config.activation,
        layer_norm_eps=config.layer_norm_epsilon,
        attention_scales=list(config.attention_scales),
        # the config's dropout rates (the weight table copies the modules' own; a rebuild from
        # the source alone, as splitformer.load does, gets them from here)
        attn_dropout=float(config.config.get("attn_pdrop") or 0.0),
        resid_dropout=float(config.config.get("resid_pdrop") or 0.0),
        embd_dropout=float(config.config.get("embd_pdrop") or 0.0),
        lm_head=config.lm_head,
        tie_word_embeddings=config.tie_word_embeddings,
        additive_mask=config.attn_implementation == "eager",
        use_cache=config.use_cache,
        source=config,
        device=device,
        dtype=dtype,
    )
    source_layout_(model, weight_map(config.n_layer, lm_head=config.lm_head))
    return model


def source_layout_(model: nn.Module, rows: tuple[Row, ...] | list[Row]) -> None:
    """Every weight a row transposes (Conv1D's W^T, (in, out) in memory) is stored as
    transformers stores it: our (out, in) parameter W is a transposed view of (in, out)
    storage. The values and the shapes are the same; ``F.linear(x, W)`` then runs the
    matrix-vector kernel transformers' ``addmm(b, x, W^T)`` runs. Decoding reads every weight
    once per token from memory, and there the (out, in) layout's up-projections are the
    slower ones (docs/performance.md, "Generation", with the command that measures it)."""
    with torch.no_grad():
        for row in rows:
            if row.transform == "transpose":
                p = lookup(model, row.ours)
                p.data = p.data.t().contiguous().t()


def from_hf_model(model: nn.Module, **kwargs: Any) -> CausalDecoderModel:
    """The splitformer model with the same outputs as a transformers GPT2Model /
    GPT2LMHeadModel (a pure weight map; the source module is never called)."""
    no_options(kwargs, "GPT-2")
    config = gpt2_config(model)
    p = next(model.parameters())
    ours = build(config, device=p.device, dtype=p.dtype)
    copy_table(weight_map(config.n_layer, lm_head=config.lm_head), theirs=model, ours=ours,
               into="ours")
    ours.train(model.training)
    return ours


def to_hf_model(model: CausalDecoderModel) -> nn.Module:
    """The transformers model with the same weights: the inverse of ``from_hf_model``.

    Built from the source config, which fixes every eps and dropout rate: each layer's must
    equal it (ValueError naming the layer and the option)."""
    import transformers

    if not isinstance(model, CausalDecoderModel):
        raise TypeError(f"to_hf for GPT-2 expects a CausalDecoderModel, got "
                        f"{type(model).__name__}")
    source = hf_source(model, HF_CLASSES, HFGPT2Config)
    if source.lm_head != isinstance(model, CausalLM):
        raise ValueError(f"model.source.hf_class={source.hf_class!r} does not match "
                         f"{type(model).__name__}")
    evo = model.evolution
    network_scheme(evo, {"prenorm": prenorm()}, "to_hf")
    config = hf_config(source)
    config.n_layer = len(evo.controls)  # one layer per step (coarsened: fewer)
    config.tie_word_embeddings = source.tie_word_embeddings
    if source.lm_head and model.tied != config.tie_word_embeddings:
        raise ValueError("lm_head tying differs from source.tie_word_embeddings")
    check_softmax(evo, "to_hf", scales=attention_scales(config))
    p = next(model.parameters())
    out = transformers.GPT2LMHeadModel(config) if source.lm_head else transformers.GPT2Model(config)
    out = out.to(device=p.device, dtype=p.dtype)
    copy_table(weight_map(len(evo.controls), lm_head=source.lm_head), theirs=out, ours=model,
               into="theirs", attributes="check")
    out.train(model.training)
    return out
