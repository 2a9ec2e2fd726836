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

Dropout rates, stochastic-depth rates and the eps of every LayerNorm / BatchNorm (and the
BatchNorm momentum) are attribute rows of the same table, read from the modules (CvT ignores
``config.layer_norm_eps``: its LayerNorms keep torch's default 1e-5). ``to_hf`` rebuilds the
model from the source config, which fixes those values: it checks them instead of writing them.
BatchNorm keeps its running statistics as controls: in eval mode it is the per-feature affine
map they define, in train mode it uses batch statistics and updates them, as Hugging Face does.
``from_hf_model`` is check -> config (``cvt_config``: a ``HFCvtConfig``, kept as the model's
``source``) -> build -> copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..models.cvt import ConvolutionalVisionTransformer, CvtStageSpec, build_cvt, cvt_scheme
from .families import classes_of
from .hf import HFSource, hf_source
from .weights import Row, check_covered, copy_table, lookup, network_scheme

__all__ = ["HFCvtConfig", "build", "check_config", "cvt_config", "from_hf_model", "to_hf_model",
           "weight_table"]

_CLASSES = classes_of("hf_cvt")  # the classes of its family record(s): a live view
_PER_STAGE = (
    "patch_sizes", "patch_stride", "patch_padding", "embed_dim", "num_heads", "depth",
    "mlp_ratio", "attention_drop_rate", "drop_rate", "drop_path_rate", "qkv_bias", "cls_token",
    "qkv_projection_method", "kernel_qkv", "padding_kv", "stride_kv", "padding_q", "stride_q",
)
_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


@dataclass(frozen=True, kw_only=True)
class HFCvtConfig(HFSource):
    """A transformers CvT as splitformer reads it: one ``CvtStageSpec`` per stage (sizes,
    strides, rates and eps as the modules hold them), the classifier's width (None: CvtModel,
    0: no classifier) and the head LayerNorm's eps."""

    stages: tuple[CvtStageSpec, ...]
    num_labels: int | None = None
    head_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        # a record read back from JSON (``ModelFamily.rebuild``) gives each stage as a dict
        object.__setattr__(self, "stages", tuple(
            CvtStageSpec(**s) if isinstance(s, Mapping) else s for s in self.stages))


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


def _spec(config: Any, s: int, hf_stage: nn.Module) -> CvtStageSpec:
    """Stage s's spec; rates and eps from layer 0 (the table copies every layer's own)."""
    emb = hf_stage.embedding.convolution_embeddings
    layers = list(hf_stage.layers)
    if not layers:
        raise ValueError(f"depth[{s}]=0 is not supported (a stage needs layers)")
    l0 = layers[0]
    bn = l0.attention.attention.convolution_projection_query.convolution_projection
    eps = float(l0.layernorm_before.eps)
    for n, layer in enumerate(layers):
        for what in ("layernorm_before", "layernorm_after"):
            if getattr(layer, what).eps != eps:
                raise ValueError(f"stages.{s}.layers.{n}.{what}.eps={getattr(layer, what).eps} "
                                 "differs from layer 0's: a stage's layers must share it")
    return CvtStageSpec(
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
        drop_path=[float(getattr(layer.drop_path, "drop_prob", 0.0)) for layer in layers],
        layer_norm_eps=eps,
        embed_norm_eps=float(emb.normalization.eps),
        batch_norm_eps=float(bn.normalization.eps),
        batch_norm_momentum=bn.normalization.momentum,
    )


def cvt_config(model: nn.Module) -> HFCvtConfig:
    """Check a transformers CvtModel / CvtForImageClassification (ValueError naming the first
    unsupported option or module) and read its typed config."""
    name = type(model).__name__
    if name not in _CLASSES:
        raise TypeError(f"expected one of {_CLASSES}, got {name}")
    config = model.config
    check_config(config)
    head = name == "CvtForImageClassification"
    base = model.cvt if head else model
    _check_modules(model)
    num_labels = head_eps = None
    if head:
        num_labels = (model.classifier.out_features
                      if isinstance(model.classifier, nn.Linear) else 0)
        head_eps = float(model.layernorm.eps)
    return HFCvtConfig(
        hf_class=name,
        config=config.to_dict(),
        stages=tuple(_spec(config, s, st) for s, st in enumerate(base.encoder.stages)),
        num_labels=num_labels,
        head_norm_eps=1e-5 if head_eps is None else head_eps,
    )


def _layer_rows(lp: str, ours: str, theta: nn.ModuleDict) -> list[Row]:
    """The rows of one layer: Hugging Face prefix ``lp``, ours ``ours`` (theta^n)."""
    att, pp = theta["attention"], f"{lp}.attention.attention"
    rows = []
    for hf_name, x in (("query", "q"), ("key", "k"), ("value", "v")):
        c = f"{pp}.convolution_projection_{hf_name}.convolution_projection"
        o = f"{ours}.attention.{x}"
        rows += [Row(f"{c}.convolution.weight", f"{o}.conv.weight")]
        rows += [Row(f"{c}.normalization.{b}", f"{o}.norm.{b}") for b in _BN]
        rows += [Row(f"{pp}.projection_{hf_name}.weight", f"{o}.weight")]
        if getattr(att, x).bias is not None:
            rows += [Row(f"{pp}.projection_{hf_name}.bias", f"{o}.bias")]
        rows += [Row(f"{c}.normalization.eps", f"{o}.norm.eps", attr=True,
                     option="batch_norm_eps"),
                 Row(f"{c}.normalization.momentum", f"{o}.norm.momentum", attr=True,
                     option="batch_norm_momentum")]
    pairs = (("attention.output.dense.weight", "attention.out_weight"),
             ("attention.output.dense.bias", "attention.out_bias"),
             ("intermediate.dense.weight", "ffn.stages.0.weight"),
             ("intermediate.dense.bias", "ffn.stages.0.bias"),
             ("output.dense.weight", "ffn.stages.1.weight"),
             ("output.dense.bias", "ffn.stages.1.bias"),
             ("layernorm_before.weight", "norm1.weight"), ("layernorm_before.bias", "norm1.bias"),
             ("layernorm_after.weight", "norm2.weight"), ("layernorm_after.bias", "norm2.bias"))
    rows += [Row(f"{lp}.{t}", f"{ours}.{o}") for t, o in pairs]
    attrs = (("layernorm_before.eps", "norm1.eps", "layer_norm_eps"),
             ("layernorm_after.eps", "norm2.eps", "layer_norm_eps"),
             ("attention.attention.dropout.p", "attention.attn_dropout", "attention_drop_rate"),
             ("attention.output.dropout.p", "attention.out_dropout.p", "drop_rate"),
             ("output.dropout.p", "ffn.out_dropout.p", "drop_rate"))
    rows += [Row(f"{lp}.{t}", f"{ours}.{o}", attr=True, option=opt) for t, o, opt in attrs]
    rows += [Row(f"{lp}.drop_path.drop_prob", f"{ours}.drop_path.p", attr=True, absent=0.0,
                 option="drop_path_rate")]
    return rows


def weight_table(model: ConvolutionalVisionTransformer) -> list[Row]:
    """Every row of ``model``: each weight and buffer (Hugging Face state-dict key <-> our
    path) and each eps, momentum and rate (attribute rows)."""
    root = "cvt.encoder" if model.with_head else "encoder"
    rows: list[Row] = []
    for s, stage in enumerate(model.stages):
        sp, ss = f"{root}.stages.{s}", f"stages.{s}"
        if stage.cls_token is not None:
            rows.append(Row(f"{sp}.cls_token", f"{ss}.cls_token"))
        e = f"{sp}.embedding.convolution_embeddings"
        rows += [Row(f"{e}.projection.weight", f"{ss}.embedding.weight"),
                 Row(f"{e}.projection.bias", f"{ss}.embedding.bias"),
                 Row(f"{e}.normalization.weight", f"{ss}.embedding.norm.weight"),
                 Row(f"{e}.normalization.bias", f"{ss}.embedding.norm.bias"),
                 Row(f"{e}.normalization.eps", f"{ss}.embedding.norm.eps", attr=True,
                     option="embed_norm_eps"),
                 Row(f"{sp}.embedding.dropout.p", f"{ss}.embedding.dropout.p", attr=True,
                     option="drop_rate")]
        for n, theta in enumerate(stage.evolution.controls):
            rows += _layer_rows(f"{sp}.layers.{n}", f"{ss}.evolution.controls.sets.{n}", theta)
    if model.with_head:
        rows += [Row("layernorm.weight", "final_norm.weight"),
                 Row("layernorm.bias", "final_norm.bias"),
                 Row("layernorm.eps", "final_norm.eps", attr=True)]
        if model.classifier is not None:
            rows += [Row("classifier.weight", "classifier.weight"),
                     Row("classifier.bias", "classifier.bias")]
    return rows


def build(config: HFCvtConfig, *, device=None, dtype=None) -> ConvolutionalVisionTransformer:
    """The splitformer CvT of ``config`` with random weights; ``source`` = ``config``."""
    return build_cvt(config.stages, num_labels=config.num_labels,
                     head_norm_eps=config.head_norm_eps, source=config, device=device,
                     dtype=dtype)


def from_hf_model(model: nn.Module) -> ConvolutionalVisionTransformer:
    """The splitformer CvT with the same weights, buffers and outputs as ``model``."""
    config = cvt_config(model)
    p = next(model.parameters())
    ours = build(config, device=p.device, dtype=p.dtype)
    rows = weight_table(ours)
    check_covered(model.state_dict(), rows, "CvT")
    missing = sorted(r.theirs for r in rows if not r.attr and lookup(model, r.theirs) is None)
    if missing:
        raise ValueError(f"{config.hf_class} lacks weights its config implies: {missing[:5]}")
    copy_table(rows, theirs=model, ours=ours, into="ours")
    ours.train(model.training)
    return ours


def _check_network(model: ConvolutionalVisionTransformer) -> None:
    """to_hf needs every stage to be the network: tau = 1, constant controls, its own scheme."""
    for s, stage in enumerate(model.stages):
        evo = stage.evolution
        want = cvt_scheme(any(th["drop_path"].p > 0 for th in evo.controls))
        network_scheme(evo, {want.name: want}, "to_hf", where=f"stage {s}")


def to_hf_model(model: ConvolutionalVisionTransformer) -> nn.Module:
    """The transformers model with the same weights and buffers (the inverse map).

    The Hugging Face model computes the network: every stage at tau = 1 under the scheme it came
    with (``cvt_scheme``); anything else (``refine``, ``with_scheme``) is refused. It is built
    from the source config, which fixes every eps and rate: they must agree with the model's.
    """
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("to_hf needs `transformers` (pip install splitformer[hf])") from e
    source = hf_source(model, _CLASSES, HFCvtConfig)
    _check_network(model)
    config = transformers.CvtConfig.from_dict(dict(source.config))
    check_config(config)
    for s, stage in enumerate(model.stages):
        if len(stage.evolution.controls) != config.depth[s]:
            raise ValueError(f"to_hf: stage {s} has {len(stage.evolution.controls)} steps, its "
                             f"source config depth[{s}]={config.depth[s]}; a coarsened CvT is "
                             "not exported (its stages' depths are the config's)")
    hf = getattr(transformers, source.hf_class)(config)
    p = next(model.parameters())
    hf.to(device=p.device, dtype=p.dtype)
    rows = weight_table(model)
    try:
        check_covered(hf.state_dict(), rows, "CvT")
    except ValueError as e:
        raise ValueError(f"the model does not fit its source config: {e}") from None
    copy_table(rows, theirs=hf, ours=model, into="theirs", attributes="check")
    hf.train(model.training)
    return hf
