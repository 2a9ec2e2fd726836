"""Hugging Face GPT-2 <-> splitformer: an exact weight map, both ways.

``GPT2Model`` is the causal (decoder-only) evolution of ``splitformer.models.decoder``: the
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

Options. ``activation_function``: the functions of ``GPT2_ACTIVATIONS`` ("gelu_new" is the
tanh-approximate GELU); others are rejected. The score scale of step n is
1/sqrt(d_h) (``scale_attn_weights``, else 1) divided by n + 1 when
``scale_attn_by_inverse_layer_idx``: both are mapped exactly into the softmax kernel's scale.
``reorder_and_upcast_attn`` only changes transformers' eager path (scores computed in float32);
it is accepted with the sdpa path, where it has no effect, and rejected with eager.
``add_cross_attention`` (GPT-2 as the decoder of a pair) is rejected; the pair of this library is
``EncoderDecoderModel``. Attention implementations "eager" (additive finfo.min mask) and "sdpa"
(boolean mask) are reproduced, masks included. ``transformers`` is imported only by
``to_hf_model``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..models.decoder import GPT2_ACTIVATIONS, CausalDecoderModel, CausalLM, causal_decoder
from ..time.schemes import prenorm
from .hf import attn_implementation, hf_config
from .weights import check_softmax, network_scheme
from .weights import copy_weight as _copy

__all__ = ["GPT2_WEIGHT_MAP", "attention_scales", "check_config", "from_hf_model",
           "to_hf_model", "weight_map"]

HF_CLASSES = ("GPT2Model", "GPT2LMHeadModel")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")

# (transformers name, splitformer name, transpose) for one layer
_LAYER_MAP: tuple[tuple[str, str, bool], ...] = (
    ("ln_1.weight", "norm1.weight", False),
    ("ln_1.bias", "norm1.bias", False),
    ("attn.c_attn.weight", "attention.qkv_weight", True),
    ("attn.c_attn.bias", "attention.qkv_bias", False),
    ("attn.c_proj.weight", "attention.out_weight", True),
    ("attn.c_proj.bias", "attention.out_bias", False),
    ("ln_2.weight", "norm2.weight", False),
    ("ln_2.bias", "norm2.bias", False),
    ("mlp.c_fc.weight", "ffn.stages.0.weight", True),
    ("mlp.c_fc.bias", "ffn.stages.0.bias", False),
    ("mlp.c_proj.weight", "ffn.stages.1.weight", True),
    ("mlp.c_proj.bias", "ffn.stages.1.bias", False),
)
_EMBEDDING_MAP: tuple[tuple[str, str, bool], ...] = (
    ("wte.weight", "embedding.word.weight", False),
    ("wpe.weight", "embedding.position.weight", False),
)
_FINAL_MAP: tuple[tuple[str, str, bool], ...] = (
    ("ln_f.weight", "final_norm.weight", False),
    ("ln_f.bias", "final_norm.bias", False),
)
_HEAD_MAP: tuple[tuple[str, str, bool], ...] = (("lm_head.weight", "lm_head.weight", False),)

# the whole table, with n for the layer index (docs and tests read it); "^T" marks a transpose
GPT2_WEIGHT_MAP: tuple[tuple[str, str], ...] = (
    *((h, s) for h, s, _ in _EMBEDDING_MAP),
    *((f"h.n.{h}" + ("^T" if t else ""), f"evolution.controls.sets.n.{s}")
      for h, s, t in _LAYER_MAP),
    *((h, s) for h, s, _ in _FINAL_MAP),
    *((h, s) for h, s, _ in _HEAD_MAP),
)


def weight_map(num_layers: int, *, lm_head: bool) -> list[tuple[str, str, bool]]:
    """Every (transformers name, splitformer name, transpose) of one model."""
    prefix = "transformer." if lm_head else ""
    out = [(prefix + h, s, t) for h, s, t in _EMBEDDING_MAP]
    for n in range(num_layers):
        out += [(f"{prefix}h.{n}.{h}", f"evolution.controls.sets.{n}.{s}", t)
                for h, s, t in _LAYER_MAP]
    out += [(prefix + h, s, t) for h, s, t in _FINAL_MAP]
    if lm_head:
        out += list(_HEAD_MAP)
    return out


def _attn_impl(config: Any) -> str:
    return attn_implementation(config)


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
    impl = _attn_impl(config)
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




def from_hf_model(model: nn.Module, **kwargs: Any) -> CausalDecoderModel:
    """The splitformer model with the same outputs as a transformers GPT2Model /
    GPT2LMHeadModel (a pure weight map; the source module is never called)."""
    if kwargs:
        raise TypeError(f"from_hf for GPT-2 takes no options, got {sorted(kwargs)}")
    cls = type(model).__name__
    if cls not in HF_CLASSES:
        raise TypeError(f"expected one of {HF_CLASSES}, got {cls}")
    lm = cls == "GPT2LMHeadModel"
    gpt = model.transformer if lm else model
    config = model.config
    check_config(config)
    impl = _attn_impl(config)
    tied = bool(lm and model.lm_head.weight is gpt.wte.weight)
    p = next(model.parameters())
    source = {"hf_class": cls, "config": config.to_dict(), "attn_implementation": impl,
              "tie_word_embeddings": tied}
    scales = attention_scales(config)
    for n, block in enumerate(gpt.h):  # transformers' own value, where it keeps one
        theirs = getattr(block.attn, "scaling", None)
        ours = scales[n] if scales[n] is not None else (config.n_embd // config.n_head) ** -0.5
        if theirs is not None and float(theirs) != ours:  # pragma: no cover - version drift
            raise ValueError(f"layer {n}: attention scaling {theirs} differs from the config's "
                             f"{ours}")
    first = gpt.h[0] if len(gpt.h) else None
    ours = causal_decoder(
        vocab_size=gpt.wte.num_embeddings,
        max_positions=gpt.wpe.num_embeddings,
        dim=config.n_embd,
        num_heads=config.n_head,
        num_layers=len(gpt.h),
        ffn_dim=first.mlp.c_fc.nf if first is not None else None,
        activation=GPT2_ACTIVATIONS[config.activation_function],
        layer_norm_eps=float(config.layer_norm_epsilon),
        embd_dropout=float(gpt.drop.p),
        attention_scales=scales,
        lm_head=lm,
        tie_word_embeddings=tied,
        additive_mask=impl == "eager",
        use_cache=bool(getattr(config, "use_cache", True)),
        source=source,
        device=p.device,
        dtype=p.dtype,
    )
    # dropout probabilities and eps as the modules hold them (they may differ from the config)
    for theta, block in zip(ours.evolution.controls, gpt.h, strict=True):
        theta["attention"].attn_dropout = float(block.attn.attn_dropout.p)
        theta["attention"].out_dropout.p = float(block.attn.resid_dropout.p)
        theta["ffn"].out_dropout.p = float(block.mlp.dropout.p)
        theta["norm1"].eps = float(block.ln_1.eps)
        theta["norm2"].eps = float(block.ln_2.eps)
    ours.final_norm.eps = float(gpt.ln_f.eps)

    state = model.state_dict()
    table = weight_map(len(gpt.h), lm_head=lm)
    mapped = {h for h, _, _ in table}
    extra = [k for k in state if k not in mapped]
    if extra:
        raise ValueError(f"the model has weights the GPT-2 map does not know: {extra[:5]}")
    params = dict(ours.named_parameters(remove_duplicate=False))
    for hf_name, our_name, transpose in table:
        src = state[hf_name]
        _copy(params[our_name], src.t() if transpose else src, hf_name)
    covered = {s for _, s, _ in table}
    missing = [k for k in params if k not in covered]
    if missing:  # pragma: no cover - a bug in the table
        raise RuntimeError(f"parameters left unmapped: {missing}")
    ours.train(model.training)
    return ours


def _hf_config(source: dict[str, Any]):
    config = hf_config("GPT2Config", source)
    config.tie_word_embeddings = bool(source.get("tie_word_embeddings", True))
    return config


def to_hf_model(model: CausalDecoderModel) -> nn.Module:
    """The transformers model with the same weights: the inverse of ``from_hf_model``."""
    import transformers

    if not isinstance(model, CausalDecoderModel):
        raise TypeError(f"to_hf for GPT-2 expects a CausalDecoderModel, got "
                        f"{type(model).__name__}")
    source = model.source
    cls = source.get("hf_class")
    if cls not in HF_CLASSES:
        raise ValueError(f"model.source['hf_class'] must be one of {HF_CLASSES}, got {cls!r}")
    lm = cls == "GPT2LMHeadModel"
    if lm != isinstance(model, CausalLM):
        raise ValueError(f"model.source['hf_class']={cls!r} does not match {type(model).__name__}")
    evo = model.evolution
    network_scheme(evo, {"prenorm": prenorm()}, "to_hf")
    config = _hf_config(source)
    if lm and model.tied != config.tie_word_embeddings:
        raise ValueError("lm_head tying differs from source['tie_word_embeddings']")
    check_softmax(evo, "to_hf", scales=attention_scales(config))
    p = next(model.parameters())
    out = transformers.GPT2LMHeadModel(config) if lm else transformers.GPT2Model(config)
    out = out.to(device=p.device, dtype=p.dtype)
    gpt = out.transformer if lm else out
    state = out.state_dict()
    params = dict(model.named_parameters(remove_duplicate=False))
    for hf_name, our_name, transpose in weight_map(len(evo.controls), lm_head=lm):
        src = params[our_name]
        _copy(state[hf_name], src.t() if transpose else src, our_name)
    gpt.drop.p = model.embedding.dropout.p
    gpt.ln_f.eps = model.final_norm.eps
    for theta, block in zip(evo.controls, gpt.h, strict=True):
        block.attn.attn_dropout.p = theta["attention"].attn_dropout
        block.attn.resid_dropout.p = theta["attention"].out_dropout.p
        block.mlp.dropout.p = theta["ffn"].out_dropout.p
        block.ln_1.eps = theta["norm1"].eps
        block.ln_2.eps = theta["norm2"].eps
    out.train(model.training)
    return out
