"""Hugging Face CvT (CvtModel, CvtForImageClassification) <-> splitformer: a pure weight map.

Stage s of the Hugging Face encoder is stage s of ``ConvolutionalVisionTransformer``: its
``embedding`` (conv + LayerNorm) is the restriction R_s that gives the initial condition, its
``cls_token`` the class token, and its layer n the control set theta^n of the stage's evolution
(T_s = depth_s, tau = 1, pre-LN scheme; see ``models.cvt``). Weight names, with
S = ``[cvt.]encoder.stages.{s}``, L = S + ``.layers.{n}``, P = L + ``.attention.attention``
and X one of query/key/value -> q/k/v:

    S.cls_token                                      stages[s].cls_token
    S.embedding.convolution_embeddings.projection    stages[s].embedding.weight / .bias
    S.embedding.convolution_embeddings.normalization stages[s].embedding.norm
    L.layernorm_before / L.layernorm_after           theta^n["norm1"] / theta^n["norm2"]
    P.convolution_projection_X.convolution_projection.convolution.weight
                                                     theta^n["attention"].X.conv.weight
    P.convolution_projection_X.convolution_projection.normalization.{weight, bias,
        running_mean, running_var, num_batches_tracked}
                                                     theta^n["attention"].X.norm.(same names)
    P.projection_X.weight / .bias                    theta^n["attention"].X.weight / .bias
    L.attention.output.dense.weight / .bias          theta^n["attention"].out_weight / out_bias
    L.intermediate.dense / L.output.dense            theta^n["ffn"].stages[0] / .stages[1]
    layernorm / classifier  (classification only)    final_norm / classifier

Dropout rates, stochastic-depth rates and the eps of every LayerNorm / BatchNorm are read from
the modules (CvT ignores ``config.layer_norm_eps``: its LayerNorms keep torch's default 1e-5).
BatchNorm keeps its running statistics as controls: in eval mode it is the per-feature affine
map they define, in train mode it uses batch statistics and updates them, as Hugging Face does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..models.cvt import ConvolutionalVisionTransformer, CvtStageSpec, build_cvt, cvt_scheme
from .weights import copy_weight, network_scheme

__all__ = ["from_hf_model", "to_hf_model", "weight_table"]

_CLASSES = ("CvtModel", "CvtForImageClassification")
_PER_STAGE = (
    "patch_sizes", "patch_stride", "patch_padding", "embed_dim", "num_heads", "depth",
    "mlp_ratio", "attention_drop_rate", "drop_rate", "drop_path_rate", "qkv_bias", "cls_token",
    "qkv_projection_method", "kernel_qkv", "padding_kv", "stride_kv", "padding_q", "stride_q",
)


def check_config(config: Any) -> None:
    """Raise ValueError naming every option of a CvtConfig that the map does not support."""
    n = len(config.depth)
    if n == 0:
        raise ValueError("CvtConfig.depth is empty: a CvT needs at least one stage")
    for name in _PER_STAGE:
        val = getattr(config, name)
        if len(val) < n:
            raise ValueError(f"CvtConfig.{name}={list(val)} has fewer entries than the "
                             f"{n} stages of depth={list(config.depth)}")
    for s in range(n):
        if config.qkv_projection_method[s] != "dw_bn":
            raise ValueError(
                f"qkv_projection_method[{s}]={config.qkv_projection_method[s]!r} is not supported "
                "(only 'dw_bn'; Hugging Face's 'avg' has no convolution_projection and fails)"
            )
        if config.stride_q[s] != 1:
            raise ValueError(f"stride_q[{s}]={config.stride_q[s]} is not supported: the query "
                             "convolution must keep the token grid (stride_q = 1)")
        if 2 * config.padding_q[s] != config.kernel_qkv[s] - 1:
            raise ValueError(
                f"padding_q[{s}]={config.padding_q[s]} with kernel_qkv[{s}]="
                f"{config.kernel_qkv[s]} is not supported: the query convolution must keep the "
                "token grid (padding_q = (kernel_qkv - 1) / 2)"
            )
        if config.cls_token[s] and config.embed_dim[s] != config.embed_dim[n - 1]:
            raise ValueError(
                f"cls_token[{s}]=True with embed_dim[{s}]={config.embed_dim[s]} != "
                f"embed_dim[-1]={config.embed_dim[n - 1]} is not supported (Hugging Face sizes "
                "every class token with the last stage's width)"
            )
        if config.embed_dim[s] % config.num_heads[s]:
            raise ValueError(f"num_heads[{s}]={config.num_heads[s]} must divide "
                             f"embed_dim[{s}]={config.embed_dim[s]}")


def _check_modules(base: nn.Module) -> None:
    for name, mod in base.named_modules():
        if isinstance(mod, nn.BatchNorm2d):
            if not mod.track_running_stats or mod.running_mean is None:
                raise ValueError(f"{name}: BatchNorm2d with track_running_stats=False is not "
                                 "supported")
            if not mod.affine:
                raise ValueError(f"{name}: BatchNorm2d with affine=False is not supported")
        elif isinstance(mod, nn.LayerNorm):
            if not mod.elementwise_affine or mod.bias is None:
                raise ValueError(f"{name}: LayerNorm without elementwise affine weight and bias "
                                 "is not supported")
        elif isinstance(mod, nn.GELU) and mod.approximate != "none":
            raise ValueError(f"{name}: GELU(approximate={mod.approximate!r}) is not supported")


def _drop_prob(mod: nn.Module) -> float:
    return float(getattr(mod, "drop_prob", 0.0))


def _specs(config: Any, base: nn.Module) -> list[CvtStageSpec]:
    specs = []
    for s, hf_stage in enumerate(base.encoder.stages):
        emb = hf_stage.embedding.convolution_embeddings
        layers = list(hf_stage.layers)
        if not layers:
            raise ValueError(f"depth[{s}]=0 is not supported (a stage needs layers)")
        l0 = layers[0]
        bn = l0.attention.attention.convolution_projection_query.convolution_projection
        specs.append(CvtStageSpec(
            in_channels=emb.projection.in_channels,
            dim=config.embed_dim[s],
            num_heads=config.num_heads[s],
            depth=len(layers),
            patch_size=tuple(emb.projection.kernel_size),
            patch_stride=tuple(emb.projection.stride),
            patch_padding=tuple(emb.projection.padding),
            mlp_ratio=config.mlp_ratio[s],
            kernel_size=config.kernel_qkv[s],
            stride_q=config.stride_q[s],
            padding_q=config.padding_q[s],
            stride_kv=config.stride_kv[s],
            padding_kv=config.padding_kv[s],
            qkv_bias=bool(config.qkv_bias[s]),
            cls_token=bool(config.cls_token[s]),
            drop_rate=float(l0.attention.output.dropout.p),
            attention_drop_rate=float(l0.attention.attention.dropout.p),
            drop_path=[_drop_prob(layer.drop_path) for layer in layers],
            layer_norm_eps=float(l0.layernorm_before.eps),
            embed_norm_eps=float(emb.normalization.eps),
            batch_norm_eps=float(bn.normalization.eps),
            batch_norm_momentum=bn.normalization.momentum,
        ))
        for n, layer in enumerate(layers):
            for mod, what in ((layer.layernorm_before, "layernorm_before"),
                              (layer.layernorm_after, "layernorm_after")):
                if mod.eps != specs[-1].layer_norm_eps:
                    raise ValueError(f"stages.{s}.layers.{n}.{what}.eps={mod.eps} differs from "
                                     "layer 0's: a stage's layers must share it")
    return specs


def weight_table(model: ConvolutionalVisionTransformer) -> list[tuple[str, torch.Tensor]]:
    """(Hugging Face state-dict key, splitformer tensor) for every weight and buffer."""
    cls_model = model.with_head
    root = "cvt.encoder" if cls_model else "encoder"
    out: list[tuple[str, torch.Tensor]] = []

    def add(key: str, t: torch.Tensor | None) -> None:
        if t is not None:
            out.append((key, t))

    for s, stage in enumerate(model.stages):
        sp = f"{root}.stages.{s}"
        add(f"{sp}.cls_token", stage.cls_token)
        e = f"{sp}.embedding.convolution_embeddings"
        add(f"{e}.projection.weight", stage.embedding.weight)
        add(f"{e}.projection.bias", stage.embedding.bias)
        add(f"{e}.normalization.weight", stage.embedding.norm.weight)
        add(f"{e}.normalization.bias", stage.embedding.norm.bias)
        for n, theta in enumerate(stage.evolution.controls):
            lp = f"{sp}.layers.{n}"
            att = theta["attention"]
            pp = f"{lp}.attention.attention"
            for hf_name, proj in (("query", att.q), ("key", att.k), ("value", att.v)):
                c = f"{pp}.convolution_projection_{hf_name}.convolution_projection"
                add(f"{c}.convolution.weight", proj.conv.weight)
                for b in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
                    add(f"{c}.normalization.{b}", getattr(proj.norm, b))
                add(f"{pp}.projection_{hf_name}.weight", proj.weight)
                add(f"{pp}.projection_{hf_name}.bias", proj.bias)
            add(f"{lp}.attention.output.dense.weight", att.out_weight)
            add(f"{lp}.attention.output.dense.bias", att.out_bias)
            ffn = theta["ffn"]
            add(f"{lp}.intermediate.dense.weight", ffn.stages[0].weight)
            add(f"{lp}.intermediate.dense.bias", ffn.stages[0].bias)
            add(f"{lp}.output.dense.weight", ffn.stages[1].weight)
            add(f"{lp}.output.dense.bias", ffn.stages[1].bias)
            for hf_name, ours in (("layernorm_before", "norm1"), ("layernorm_after", "norm2")):
                add(f"{lp}.{hf_name}.weight", theta[ours].weight)
                add(f"{lp}.{hf_name}.bias", theta[ours].bias)
    if cls_model:
        add("layernorm.weight", model.final_norm.weight)
        add("layernorm.bias", model.final_norm.bias)
        if model.classifier is not None:
            add("classifier.weight", model.classifier.weight)
            add("classifier.bias", model.classifier.bias)
    return out


def from_hf_model(model: nn.Module) -> ConvolutionalVisionTransformer:
    """The splitformer CvT with the same weights, buffers and outputs as ``model``."""
    name = type(model).__name__
    if name not in _CLASSES:
        raise TypeError(f"expected one of {_CLASSES}, got {name}")
    config = model.config
    check_config(config)
    head = name == "CvtForImageClassification"
    base = model.cvt if head else model
    _check_modules(model)
    specs = _specs(config, base)
    p = next(model.parameters())
    num_labels = None
    head_eps = 1e-5
    if head:
        num_labels = model.classifier.out_features if isinstance(model.classifier,
                                                                 nn.Linear) else 0
        head_eps = float(model.layernorm.eps)
    ours = build_cvt(
        specs, num_labels=num_labels, head_norm_eps=head_eps,
        source={"hf_class": name, "config": config.to_dict()}, device=p.device, dtype=p.dtype,
    )
    theirs = model.state_dict()
    table = weight_table(ours)
    keys = {k for k, _ in table}
    unmapped = sorted(set(theirs) - keys)
    if unmapped:
        raise ValueError(f"{name} has weights the CvT map does not know: {unmapped[:5]}")
    missing = sorted(keys - set(theirs))
    if missing:
        raise ValueError(f"{name} lacks weights its config implies: {missing[:5]}")
    for key, t in table:
        copy_weight(t, theirs[key], key)
    ours.train(model.training)
    return ours


def _check_same(ours: ConvolutionalVisionTransformer, hf: nn.Module) -> None:
    """The rebuilt Hugging Face model must compute what ``ours`` computes (eps, rates)."""
    base = hf.cvt if ours.with_head else hf
    spec_hf = _specs(hf.config, base)
    for s, (stage, spec) in enumerate(zip(ours.stages, spec_hf, strict=True)):
        theta = stage.evolution.controls[0]
        att = theta["attention"]
        mine = {
            "layer_norm_eps": theta["norm1"].eps,
            "embed_norm_eps": stage.embedding.norm.eps,
            "batch_norm_eps": att.q.norm.eps,
            "batch_norm_momentum": att.q.norm.momentum,
            "drop_rate": att.out_dropout.p,
            "attention_drop_rate": att.attn_dropout,
            "drop_path": [th["drop_path"].p for th in stage.evolution.controls],
        }
        for key, val in mine.items():
            if getattr(spec, key) != val:
                raise ValueError(
                    f"stage {s}: {key}={val!r} but model.source['config'] gives "
                    f"{getattr(spec, key)!r}; edit the source config to match before to_hf"
                )
    if ours.with_head and float(hf.layernorm.eps) != ours.final_norm.eps:
        raise ValueError(f"final_norm.eps={ours.final_norm.eps} differs from the source's "
                         f"{hf.layernorm.eps}")


def _check_network(model: ConvolutionalVisionTransformer) -> None:
    """to_hf needs every stage to be the network: tau = 1, constant controls, its own scheme."""
    for s, stage in enumerate(model.stages):
        evo = stage.evolution
        want = cvt_scheme(any(th["drop_path"].p > 0 for th in evo.controls))
        network_scheme(evo, {want.name: want}, "to_hf", where=f"stage {s}")


def to_hf_model(model: ConvolutionalVisionTransformer) -> nn.Module:
    """The transformers model with the same weights and buffers (the inverse map).

    The Hugging Face model computes the network: every stage at tau = 1 under the scheme it came
    with (``cvt_scheme``); anything else (``refine``, ``with_scheme``) is refused.
    """
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("to_hf needs `transformers` (pip install splitformer[hf])") from e
    source = getattr(model, "source", None) or {}
    name = source.get("hf_class")
    if name not in _CLASSES or "config" not in source:
        raise ValueError(f"to_hf needs a CvT made by from_hf (source['hf_class'] is {name!r})")
    _check_network(model)
    config = transformers.CvtConfig.from_dict(dict(source["config"]))
    check_config(config)
    hf = getattr(transformers, name)(config)
    p = next(model.parameters())
    hf.to(device=p.device, dtype=p.dtype)
    _check_same(model, hf)
    state = {k: t.detach().clone() for k, t in weight_table(model)}
    try:
        hf.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"the model does not fit its source config: {e}") from e
    hf.train(model.training)
    return hf
