"""The model families ``splitformer train`` builds, from a config and a data set.

    build_model(config, dataset) -> EvolutionModel      random weights, seeded by the caller

A family is a builder plus a ``logits(model, x)`` adapter (what the loss reads):

* "vit":     a ViT evolution on the patch grid (pre-LN Euler steps), timm's read-out (class
             token, logits); images (C, H, W); ``patch_choices`` train it on random patch
             grids (``with_patch_size``, training.loop);
* "cvt":     a two-stage CvT (convolutional Q/K/V, a multigrid in x), classifier read-out;
* "encoder": a sequence classifier (series lifted to the feature grid, pre-LN encoder, mean
             pooling); series (L,) or (L, C);
* "lm":      a GPT-2-shaped causal evolution with the tied LM read-out; character ids.

Then the three choices of the config are applied: the scheme (``with_scheme``; "network" keeps
the family's own), the kernel (``with_kernel``) and the time grid (``refine(steps / depth)``);
``merge`` > 0 adds token merging (``with_token_merging``: vit and encoder; lm is causal and cvt
convolutional, both refused).
The model records ``source = {"family": ..., "config": {...}, "data": {...}}``, all that
``splitformer.load`` needs to rebuild it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..models import EvolutionModel, build_vit, causal_decoder
from ..models.cvt import CvtStageSpec, build_cvt
from ..models.sequence import sequence_classifier
from .config import ConfigError, TrainConfig
from .data import Dataset

__all__ = ["FAMILIES", "Family", "build_model", "data_signature"]


@dataclass(frozen=True)
class Family:
    """A builder, the tasks it serves, how a batch becomes the model's inputs, and how the
    read-out becomes logits."""

    build: Callable[[TrainConfig, dict[str, Any]], EvolutionModel]
    tasks: tuple[str, ...]
    ndims: tuple[int, ...] = ()  # accepted lengths of input_shape (images 3, series 1 or 2)
    inputs: Callable[[torch.Tensor], Any] = lambda x: (x,)
    read: Callable[[Any], torch.Tensor] = lambda out: (
        out if isinstance(out, torch.Tensor) else out.logits)
    causal: bool = False  # a causal support x' <= x: no token merging

    def logits(self, model: EvolutionModel, x: torch.Tensor) -> torch.Tensor:
        args = self.inputs(x)
        out = model(**args) if isinstance(args, dict) else model(*args)
        return self.read(out)


def _patch(cfg: TrainConfig, size: int) -> int:
    p = cfg.patch if cfg.patch is not None else max(1, size // 4)
    if size % p:
        raise ConfigError(f"patch={p} must divide the image size {size}")
    return p


def _vit(cfg: TrainConfig, data: dict[str, Any]) -> EvolutionModel:
    c, h, w = data["input_shape"]
    for p in cfg.patch_choices or ():  # each step's grid tiles the image (with_patch_size)
        if h % p or w % p:
            raise ConfigError(f"patch_choices: {p} must divide the image size {h}x{w} (every "
                              f"pixel in one patch), got {list(cfg.patch_choices)}")
    return build_vit(image_size=(h, w), patch_size=_patch(cfg, min(h, w)), in_chans=c,
                     dim=cfg.width, depth=cfg.depth, num_heads=cfg.heads,
                     hidden_dim=int(cfg.ffn_ratio * cfg.width), num_classes=data["num_classes"],
                     attn_dropout=cfg.dropout, out_dropout=cfg.dropout, read_out="timm")


def _cvt(cfg: TrainConfig, data: dict[str, Any]) -> EvolutionModel:
    c, h, w = data["input_shape"]
    d1 = max(cfg.heads, cfg.width // 2 // cfg.heads * cfg.heads)
    first = max(1, cfg.depth // 2)
    specs = [
        CvtStageSpec(c, d1, cfg.heads, first, patch_size=3, patch_stride=2, patch_padding=1,
                     mlp_ratio=cfg.ffn_ratio, drop_rate=cfg.dropout),
        CvtStageSpec(d1, cfg.width, cfg.heads, cfg.depth - first if cfg.depth > 1 else 1,
                     patch_size=3, patch_stride=2, patch_padding=1, mlp_ratio=cfg.ffn_ratio,
                     cls_token=True, drop_rate=cfg.dropout),
    ]
    return build_cvt(specs, num_labels=data["num_classes"])


def _encoder(cfg: TrainConfig, data: dict[str, Any]) -> EvolutionModel:
    shape = data["input_shape"]
    length, channels = (shape[0], 1) if len(shape) == 1 else shape
    return sequence_classifier(length, channels, cfg.width, cfg.heads, cfg.depth,
                               int(cfg.ffn_ratio * cfg.width), data["num_classes"],
                               dropout=cfg.dropout)


def _lm(cfg: TrainConfig, data: dict[str, Any]) -> EvolutionModel:
    return causal_decoder(data["vocab_size"], cfg.seq_len, cfg.width, cfg.heads, cfg.depth,
                          ffn_dim=int(cfg.ffn_ratio * cfg.width), attn_dropout=cfg.dropout,
                          resid_dropout=cfg.dropout, lm_head=True)


FAMILIES: dict[str, Family] = {
    "vit": Family(_vit, ("classify",), ndims=(3,)),
    "cvt": Family(_cvt, ("classify",), ndims=(3,)),
    "encoder": Family(_encoder, ("classify",), ndims=(1, 2)),
    "lm": Family(_lm, ("lm",), inputs=lambda ids: {"input_ids": ids}, causal=True),
}


def data_signature(dataset: Dataset) -> dict[str, Any]:
    """What a model needs to know of its data (kept in ``model.source``)."""
    return {"name": dataset.name, "task": dataset.task, "num_classes": dataset.num_classes,
            "input_shape": list(dataset.input_shape) if dataset.input_shape else None,
            "vocab_size": dataset.vocab_size,
            "vocab": list(dataset.vocab) if dataset.vocab is not None else None}


def _merged(model: EvolutionModel, cfg: TrainConfig) -> EvolutionModel:
    """The model with token merging of ``cfg.merge`` nodes per layer (``with_token_merging``);
    a family or setting that cannot merge is refused naming the key."""
    if FAMILIES[cfg.family].causal:
        raise ConfigError(f"merge={cfg.merge}: family {cfg.family!r} has a causal support "
                          "(x' <= x), where a merged node would carry a later token into an "
                          "earlier one; token merging is refused (merge = 0)")
    try:
        return model.with_token_merging(cfg.merge)
    except ValueError as e:
        try:  # refused only for ToMe's placement, which is the one train can ask for?
            model.with_token_merging(cfg.merge, where="step", metric="state")
        except ValueError:
            raise ConfigError(f"merge={cfg.merge} (family {cfg.family!r}): {e}") from None
        scheme = model.evolution.scheme
        raise ConfigError(f"merge={cfg.merge} (family {cfg.family!r}): training merges tokens "
                          "after the attention substep, on its keys (ToMe's placement, the one "
                          "train runs), and scheme "
                          f"{scheme.name!r} [{scheme}] has no top-level attention stage to "
                          "merge after (or saves a state before it); choose a scheme with "
                          "one (e.g. network, lie, strang) or merge = 0 (from Python, "
                          "with_token_merging(r, where='step', metric='state') merges on this "
                          "scheme)") from None


def build_model(cfg: TrainConfig, data: Dataset | dict[str, Any]) -> EvolutionModel:
    """The family's model for ``data`` with the config's scheme, kernel and time grid."""
    if cfg.family not in FAMILIES:
        raise ConfigError(f"family must be one of {sorted(FAMILIES)}, got {cfg.family!r}")
    sig = data_signature(data) if isinstance(data, Dataset) else dict(data)
    family = FAMILIES[cfg.family]
    def fits(f: Family) -> bool:
        shape = sig.get("input_shape")
        return sig["task"] in f.tasks and (not f.ndims or shape is None or len(shape) in f.ndims)

    if not fits(family):
        raise ConfigError(f"family {cfg.family!r} does not fit data {sig['name']!r} (a "
                          f"{sig['task']} task on inputs of shape {sig.get('input_shape')}); "
                          f"families for it: {sorted(n for n, f in FAMILIES.items() if fits(f))}")
    if sig.get("input_shape") is not None:
        sig["input_shape"] = tuple(sig["input_shape"])
    model = family.build(cfg, sig)
    if cfg.scheme != "network" or cfg.integrator is not None:
        name = model.evolution.scheme.name if cfg.scheme == "network" else cfg.scheme
        options = {"integrator": cfg.integrator} if cfg.integrator is not None else {}
        model = model.with_scheme(name, **options)
    if cfg.kernel.strip() != "softmax":
        model = model.with_kernel(cfg.kernel)
    k = cfg.num_steps() // cfg.depth
    if k != 1:
        model = model.refine(k)
    if cfg.merge:
        model = _merged(model, cfg)
    model.source = {"family": cfg.family, "config": cfg.to_dict(), "data": sig}
    return model
