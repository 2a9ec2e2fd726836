"""Hugging Face Llama family <-> splitformer: one exact weight map, per-family deltas.

Llama, Mistral, Qwen2, Qwen3, Gemma2 and Gemma3 (text) are one record in
``interop.families`` (``LLAMA`` and its ``derive``d relatives): this module reads the deltas of
the model it converts from the record's ``traits``, never from the class name. Each is the
rotary decoder of ``splitformer.models.llama`` (docs/decoders.md): u(0) = c E_w, L explicit
Euler steps (tau = 1) of ``prenorm`` (Gemma: ``prenorm_sandwich``) with the causal kernel of
grouped heads and rotary angles computed once per forward, the read-out ``norm``, the LM head.

    embed_tokens                          -> embedding.word                (initial condition)
    layers.n.input_layernorm              -> norm1                         (P1, in A's field)
    layers.n.self_attn.{q,k,v}_proj       -> attention.{q,k,v}_weight (_bias: Qwen2, bias=True)
    layers.n.self_attn.o_proj             -> attention.out_weight
    layers.n.self_attn.{q,k}_norm         -> attention.{q,k}_norm          (Qwen3, Gemma3)
    layers.n.post_attention_layernorm     -> norm2 (P2, in G's field) | post_norm1 (Gemma: Q1)
    layers.n.pre_feedforward_layernorm    -> norm2                         (Gemma)
    layers.n.post_feedforward_layernorm   -> post_norm2                    (Gemma: Q2)
    layers.n.mlp.{gate,up,down}_proj      -> ffn.{gate,up,down}            (G, gated)
    norm                                  -> final_norm                    (read-out)
    lm_head                               -> lm_head    (tied: the parameter of embed_tokens)

plus the attribute rows: every RMSNorm's eps and the attention dropout rate, checked against
the config by ``to_hf``. The config's per-layer settings are mapped into each step: the sliding
window (Mistral: every layer; ``layer_types``: the "sliding_attention" ones), the rotary
positions it reads (Gemma3: a local and a global one), the score scale (Gemma:
query_pre_attn_scalar^-1/2) and Gemma2's score soft-capping (a kernel).

Refused, naming the option: an activation outside ``GATED_ACTIVATIONS``, an attention
implementation other than eager and sdpa, a ``rope_type`` splitformer does not read.
``from_hf_model`` is check -> config (``llama_config``: an ``HFLlamaConfig``, kept as the
model's ``source``) -> build -> copy; ``transformers`` is imported only by ``to_hf_model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..models.causal import CausalDecoderModel, CausalLM
from ..models.llama import rotary_decoder
from ..operators.rope import OWN_ROPE_TYPES, RotaryPositions
from ..time.schemes import prenorm, prenorm_sandwich
from .families import classes_of, family_of_class
from .hf import HFSource, attn_implementation, hf_config, hf_source, no_options
from .weights import Row, check_covered, check_softmax, copy_table, network_scheme, prefixed

__all__ = ["GATED_ACTIVATIONS", "HFLlamaConfig", "build", "from_hf_model", "llama_config",
           "to_hf_model", "weight_map"]

HF_CLASSES = classes_of("hf_llama")  # every class of every family this map reads (live)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")

# transformers' hidden_act / hidden_activation -> splitformer's activation of the gated field
GATED_ACTIVATIONS: dict[str, str] = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


@dataclass(frozen=True, kw_only=True)
class HFLlamaConfig(HFSource):
    """A transformers Llama-family model as splitformer reads it: sizes, the family's deltas
    (from its record's traits), and the per-layer settings the config implies."""

    family: str
    vocab_size: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    ffn_dim: int
    activation: str
    rms_norm_eps: float
    attention_bias: bool
    out_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sandwich: bool
    norm_offset: float
    rotary: dict[str, dict[str, Any]]  # name -> RotaryPositions fields
    ropes: tuple[str, ...]
    windows: tuple[int | None, ...]
    attention_scale: float | None
    attn_softcap: float | None
    logit_softcap: float | None
    embed_scale: float
    scale_embeds: bool
    lm_head: bool
    tie_word_embeddings: bool
    attention_dropout: float = 0.0
    use_cache: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def _traits(cls: str) -> dict[str, Any]:
    record = family_of_class(cls)
    if record is None or record.map != "hf_llama":
        raise TypeError(f"expected one of {tuple(HF_CLASSES)}, got {cls}")
    return dict(record.traits)


def _layer_rows(traits: dict[str, Any], cfg: HFLlamaConfig) -> list[Row]:
    """One decoder layer's rows, transformers' names from the layer."""
    eps = "eps" if traits.get("norm_eps_attr") == "eps" else "variance_epsilon"
    rows = [Row("input_layernorm.weight", "norm1.weight"),
            Row(f"input_layernorm.{eps}", "norm1.eps", attr=True, option="rms_norm_eps")]
    for p in ("q", "k", "v"):
        rows.append(Row(f"self_attn.{p}_proj.weight", f"attention.{p}_weight"))
        if cfg.attention_bias:
            rows.append(Row(f"self_attn.{p}_proj.bias", f"attention.{p}_bias"))
    rows.append(Row("self_attn.o_proj.weight", "attention.out_weight"))
    if cfg.out_bias:
        rows.append(Row("self_attn.o_proj.bias", "attention.out_bias"))
    rows.append(Row("self_attn.attention_dropout", "attention.attn_dropout", attr=True,
                    option="attention_dropout"))
    if cfg.qk_norm:
        for p in ("q", "k"):
            rows += [Row(f"self_attn.{p}_norm.weight", f"attention.{p}_norm.weight"),
                     Row(f"self_attn.{p}_norm.{eps}", f"attention.{p}_norm.eps", attr=True,
                         option="rms_norm_eps")]
    norms = ((("post_attention_layernorm", "post_norm1"), ("pre_feedforward_layernorm", "norm2"),
              ("post_feedforward_layernorm", "post_norm2")) if cfg.sandwich
             else (("post_attention_layernorm", "norm2"),))
    for theirs, ours in norms:
        rows += [Row(f"{theirs}.weight", f"{ours}.weight"),
                 Row(f"{theirs}.{eps}", f"{ours}.eps", attr=True, option="rms_norm_eps")]
    for p in ("gate", "up", "down"):
        rows.append(Row(f"mlp.{p}_proj.weight", f"ffn.{p}.weight"))
        if cfg.mlp_bias:
            rows.append(Row(f"mlp.{p}_proj.bias", f"ffn.{p}.bias"))
    return rows


def weight_map(cfg: HFLlamaConfig, num_layers: int | None = None) -> list[Row]:
    """Every row (tensors and attributes) of one model, transformers' names from its root."""
    traits = _traits(cfg.hf_class)
    lm = cfg.lm_head
    prefix = "model." if lm else ""
    eps = "eps" if traits.get("norm_eps_attr") == "eps" else "variance_epsilon"
    rows = [Row(f"{prefix}embed_tokens.weight", "embedding.word.weight")]
    layer = _layer_rows(traits, cfg)
    for n in range(cfg.num_layers if num_layers is None else num_layers):
        rows += prefixed(layer, f"{prefix}layers.{n}.", f"evolution.controls.sets.{n}.")
    rows += [Row(f"{prefix}norm.weight", "final_norm.weight"),
             Row(f"{prefix}norm.{eps}", "final_norm.eps", attr=True, option="rms_norm_eps")]
    if lm:
        rows.append(Row("lm_head.weight", "lm_head.weight"))
    return rows


def _windows(c: dict[str, Any], traits: dict[str, Any], n: int) -> tuple[int | None, ...]:
    """The sliding window of each layer: every layer (Mistral), the "sliding_attention" ones
    of ``layer_types``, or none (``c``: the config's settings)."""
    w = c.get("sliding_window")
    types = c.get("layer_types")
    if types is not None:
        return tuple(w if t == "sliding_attention" and w is not None else None
                     for t in list(types)[:n])
    if traits.get("window") == "all" and w is not None:
        return (int(w),) * n
    return (None,) * n


def _rotary(config: Any, head_dim: int, n: int) -> tuple[dict[str, RotaryPositions],
                                                          tuple[str, ...]]:
    """The rotary positions (one per name) and the name each layer reads."""
    c = config.to_dict()
    params = c.get("rope_parameters") or {}
    types = list(c.get("layer_types") or [])[:n]
    nested = [k for k, v in params.items() if isinstance(v, dict)]
    if nested:
        rotary = {t: RotaryPositions.from_config(config, head_dim, layer_type=t) for t in nested}
        missing = sorted(set(types) - set(rotary))
        if missing:
            raise ValueError(f"rope_parameters has no entry for the layer types {missing}")
        return rotary, tuple(types)
    return {"rope": RotaryPositions.from_config(config, head_dim)}, ("rope",) * n


def check_config(config: Any, traits: dict[str, Any]) -> None:
    """ValueError naming the first option of the config the map does not support."""
    act = config.to_dict().get(traits.get("activation_key", "hidden_act"))
    if not isinstance(act, str) or act not in GATED_ACTIVATIONS:
        raise ValueError(f"{traits.get('activation_key', 'hidden_act')}={act!r} is not "
                         f"supported; supported: {sorted(GATED_ACTIVATIONS)}")
    impl = attn_implementation(config)
    if impl not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={impl!r} is not supported; supported: "
                         f"{ATTN_IMPLEMENTATIONS}")
    c = config.to_dict()
    tp = c.get("pretraining_tp", 1)
    if tp not in (1, None):
        raise ValueError(f"pretraining_tp={tp} is not supported (1 only)")
    params = c.get("rope_parameters") or {}
    partial = [p.get("partial_rotary_factor") for p in
               ([params] if not any(isinstance(v, dict) for v in params.values())
                else [v for v in params.values() if isinstance(v, dict)])]
    partial.append(c.get("partial_rotary_factor"))
    if any(f not in (None, 1, 1.0) for f in partial):
        raise ValueError("partial_rotary_factor != 1 is not supported for this family: "
                         "transformers' Llama-family rotary module ignores it for the default "
                         "rope_type and fails for the others, so there is no one reading to "
                         "reproduce")
    w = c.get("sliding_window")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        raise ValueError(f"sliding_window={w!r} is not supported: an int >= 1 (the support "
                         "x - x' < W) or None")
    types = c.get("layer_types")
    if types is not None:
        bad = sorted({t for t in types} - {"full_attention", "sliding_attention"})
        if bad:
            raise ValueError(f"layer_types holds {bad}: each layer is 'full_attention' or "
                             "'sliding_attention'")
        if len(types) < c.get("num_hidden_layers", 0):
            raise ValueError(f"layer_types lists {len(types)} layers but num_hidden_layers="
                             f"{c['num_hidden_layers']}")


def llama_config(model: nn.Module) -> HFLlamaConfig:
    """Check a transformers model of the Llama family (ValueError naming the first
    unsupported option or weight) and read its typed config."""
    cls = type(model).__name__
    traits = _traits(cls)
    record = family_of_class(cls)
    lm = cls.endswith("ForCausalLM")
    base = model.model if lm else model
    config = model.config
    check_config(config, traits)
    c = config.to_dict()  # the settings (a family lacks some: .get, never getattr probing)
    n = len(base.layers)
    heads = config.num_attention_heads
    head_dim = c.get("head_dim") or config.hidden_size // heads
    rotary, ropes = _rotary(config, head_dim, n)
    bias = bool(traits.get("qkv_bias", c.get("attention_bias", False)))
    out_bias = bool(traits.get("o_bias", c.get("attention_bias", False)))
    scalar = c.get("query_pre_attn_scalar") if traits.get("pre_attn_scalar") else None
    embed_scale = 1.0
    if traits.get("embed_scale"):
        # Gemma2/3 multiply by a float32 buffer holding sqrt(d) (cast to the state's dtype)
        embed_scale = float(torch.tensor(config.hidden_size ** 0.5)) \
            if traits["embed_scale"] == "float32" else config.hidden_size ** 0.5
    cfg = HFLlamaConfig(
        hf_class=cls,
        config=c,
        attn_implementation=attn_implementation(config),
        family=record.name,
        vocab_size=base.embed_tokens.num_embeddings,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        num_layers=n,
        ffn_dim=config.intermediate_size,
        activation=GATED_ACTIVATIONS[c[traits.get("activation_key", "hidden_act")]],
        rms_norm_eps=float(config.rms_norm_eps),
        attention_bias=bias,
        out_bias=out_bias,
        mlp_bias=bool(c.get("mlp_bias", False)),
        qk_norm=bool(traits.get("qk_norm", False)),
        sandwich=bool(traits.get("sandwich", False)),
        norm_offset=float(traits.get("norm_offset", 0.0)),
        rotary={k: v.record() for k, v in rotary.items()},
        ropes=ropes,
        windows=_windows(c, traits, n),
        attention_scale=None if scalar is None else float(scalar) ** -0.5,
        attn_softcap=c.get("attn_logit_softcapping") if traits.get("softcap") else None,
        logit_softcap=c.get("final_logit_softcapping") if traits.get("softcap") else None,
        embed_scale=embed_scale,
        scale_embeds=bool(traits.get("scale_embeds", True)),
        lm_head=lm,
        tie_word_embeddings=bool(lm and model.lm_head.weight is base.embed_tokens.weight),
        attention_dropout=float(c.get("attention_dropout") or 0.0),
        use_cache=bool(c.get("use_cache", True)),
    )
    check_covered(model.state_dict(), weight_map(cfg), record.label)
    return cfg


def _export_rotary(model: CausalDecoderModel, cfg: HFLlamaConfig, config: Any) -> None:
    """The model's rotary kernels into ``config.rope_parameters`` where ``with_rope`` changed
    them from the source's (one entry, or one per layer type); ValueError naming the rope_type
    for splitformer's own types, which no transformers config holds."""
    source = {k: RotaryPositions.from_record(v) for k, v in cfg.rotary.items()}
    if model.rotary == source:
        return
    own = sorted({r.rope_type for r in model.rotary.values() if r.rope_type in OWN_ROPE_TYPES})
    if own:
        raise ValueError(f"to_hf: rope_type {own[0]!r} is splitformer's own (with_rope); "
                         "transformers has no such rope_type, so the exported model would read "
                         "another kernel; export the model before with_rope, or a "
                         "with_rope(...) of one of transformers' types")
    if set(model.rotary) == {"rope"}:
        config.rope_parameters = model.rotary["rope"].to_parameters()
    else:
        config.rope_parameters = {k: r.to_parameters() for k, r in model.rotary.items()}
    lengths = [r.max_position_embeddings for r in model.rotary.values()
               if r.max_position_embeddings is not None]
    if lengths:  # the length the kernel is read for, as transformers' configs write it
        config.max_position_embeddings = min(lengths)


def _kernels(cfg: HFLlamaConfig) -> list[Any] | None:
    """Step n's kernel instance where the family needs one (Gemma2's soft-capped scores)."""
    if cfg.attn_softcap is None:
        return None
    from ..operators.kernels import SoftcapKernel

    return [SoftcapKernel(cfg.attn_softcap, scale=cfg.attention_scale, upcast=True)
            for _ in range(cfg.num_layers)]


def _check_softcap(evolution, cfg: HFLlamaConfig) -> None:
    """Every step's kernel is the soft-capped one transformers computes (Gemma2)."""
    from ..operators.kernels import SoftcapKernel

    for n, theta in enumerate(evolution.controls):
        k = theta["attention"].kernel
        if type(k) is not SoftcapKernel or k.cap != cfg.attn_softcap or \
                k.scale != cfg.attention_scale:
            raise ValueError(f"to_hf needs the softcap kernel with cap {cfg.attn_softcap} and "
                             f"scale {cfg.attention_scale} in step {n} attention (the "
                             f"config's attn_logit_softcapping), got {k!r}")


def build(cfg: HFLlamaConfig, *, device=None, dtype=None) -> CausalDecoderModel:
    """The splitformer rotary decoder of ``cfg`` with random weights; ``source`` = ``cfg``."""
    return rotary_decoder(
        vocab_size=cfg.vocab_size, dim=cfg.hidden_size, num_heads=cfg.num_heads,
        num_layers=cfg.num_layers, ffn_dim=cfg.ffn_dim,
        rotary={k: RotaryPositions.from_record(v) for k, v in cfg.rotary.items()},
        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, activation=cfg.activation,
        norm_eps=cfg.rms_norm_eps, norm_offset=cfg.norm_offset,
        norm_gain_in_float32=cfg.norm_offset != 0.0, attention_bias=cfg.attention_bias,
        out_bias=cfg.out_bias, mlp_bias=cfg.mlp_bias, qk_norm=cfg.qk_norm,
        sandwich=cfg.sandwich, ropes=list(cfg.ropes), windows=list(cfg.windows),
        attention_scales=[cfg.attention_scale] * cfg.num_layers,
        attention_kernels=_kernels(cfg), embed_scale=cfg.embed_scale,
        scale_embeds=cfg.scale_embeds, attn_dropout=cfg.attention_dropout,
        lm_head=cfg.lm_head, tie_word_embeddings=cfg.tie_word_embeddings,
        logit_softcap=cfg.logit_softcap, additive_mask=cfg.attn_implementation == "eager",
        use_cache=cfg.use_cache, source=cfg, device=device, dtype=dtype)


def from_hf_model(model: nn.Module, **kwargs: Any) -> CausalDecoderModel:
    """The splitformer model with the same outputs as a transformers model of the Llama
    family (a pure weight map; the source module is never called)."""
    cfg = llama_config(model)
    no_options(kwargs, family_of_class(cfg.hf_class).label)
    p = next(model.parameters())
    ours = build(cfg, device=p.device, dtype=p.dtype)
    copy_table(weight_map(cfg), theirs=model, ours=ours, into="ours")
    ours.train(model.training)
    return ours


def to_hf_model(model: CausalDecoderModel) -> nn.Module:
    """The transformers model with the same weights: the inverse of ``from_hf_model``. Built
    from the source config (every eps and rate fixed there: each layer's must equal it)."""
    import transformers

    if not isinstance(model, CausalDecoderModel):
        raise TypeError(f"to_hf for the Llama family expects a CausalDecoderModel, got "
                        f"{type(model).__name__}")
    cfg = hf_source(model, tuple(HF_CLASSES), HFLlamaConfig)
    if cfg.lm_head != isinstance(model, CausalLM):
        raise ValueError(f"model.source.hf_class={cfg.hf_class!r} does not match "
                         f"{type(model).__name__}")
    evo = model.evolution
    network_scheme(evo, {"prenorm_sandwich": prenorm_sandwich()} if cfg.sandwich
                   else {"prenorm": prenorm()}, "to_hf")
    n = len(evo.controls)
    config = hf_config(cfg)
    config.num_hidden_layers = n
    _export_rotary(model, cfg, config)
    if cfg.config.get("layer_types") is not None:
        if n != cfg.num_layers:
            raise ValueError(f"to_hf: this model has {n} steps but its source's layer_types "
                             f"lists {cfg.num_layers} layers (sliding or full): a model with "
                             "steps refined, coarsened or dropped is not exported for a family "
                             "with layer types")
    config.tie_word_embeddings = cfg.tie_word_embeddings
    if cfg.lm_head and model.tied != cfg.tie_word_embeddings:
        raise ValueError("lm_head tying differs from source.tie_word_embeddings")
    if cfg.attn_softcap is None:
        check_softmax(evo, "to_hf", scales=[cfg.attention_scale] * n)
    else:
        _check_softcap(evo, cfg)
    p = next(model.parameters())
    out = getattr(transformers, cfg.hf_class)(config).to(device=p.device, dtype=p.dtype)
    copy_table(weight_map(cfg, n), theirs=out, ours=model, into="theirs",
               attributes="check")
    out.train(model.training)
    return out
