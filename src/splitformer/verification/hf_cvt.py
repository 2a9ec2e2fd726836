"""Group "cvt": Hugging Face CvT against its splitformer evolution (docs/math.md 3.7).

Each check builds a small random-weight ``transformers`` CvT (every weight and BatchNorm
statistic drawn at random, so that no operator is the identity), converts it with ``from_hf``
and returns the max abs difference of the outputs. Skipped when transformers is missing.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import SkipCheck, register
from .references import maxdiff, require_transformers

GROUP = "cvt"

# Three stages, class token in the last one, K/V stride 2 (the defaults of CvT-13, scaled down).
SMALL_CONFIG: dict[str, Any] = {
    "num_channels": 3,
    "patch_sizes": [7, 3, 3],
    "patch_stride": [4, 2, 2],
    "patch_padding": [2, 1, 1],
    "embed_dim": [8, 12, 16],
    "num_heads": [1, 2, 4],
    "depth": [1, 2, 3],
    "mlp_ratio": [2.0, 2.0, 2.0],
    "attention_drop_rate": [0.0, 0.0, 0.0],
    "drop_rate": [0.0, 0.0, 0.0],
    "drop_path_rate": [0.0, 0.0, 0.0],
    "qkv_bias": [True, True, True],
    "cls_token": [False, False, True],
    "num_labels": 5,
}


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Draw every parameter and BatchNorm statistic at random (fan-in scaled matrices, gains
    near 1, running variances in [0.5, 1.5], num_batches_tracked = 7)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if p.dim() >= 2:
                p.copy_(r / math.sqrt(p[0].numel()))
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            else:
                p.copy_(0.2 * r)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.3 * torch.randn(b.shape, generator=g, dtype=torch.float64))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g, dtype=torch.float64))
            elif name.endswith("num_batches_tracked"):
                b.fill_(7)
    return model


def random_cvt(cls_name: str, dtype: torch.dtype, seed: int = 0, **overrides: Any):
    """A random-weight transformers CvT (``CvtModel`` / ``CvtForImageClassification``)."""
    transformers = require_transformers()
    cfg = {**SMALL_CONFIG, **overrides}
    try:
        cls, config_cls = getattr(transformers, cls_name), transformers.CvtConfig
    except ImportError as e:  # e.g. a torchvision that transformers cannot use
        raise SkipCheck(f"transformers' CvT cannot be imported here: {e}") from e
    torch.manual_seed(seed)
    model = cls(config_cls(**cfg))
    return randomize_(model.to(dtype), seed).eval()


def _pixels(dtype: torch.dtype, shape=(2, 3, 32, 24), seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def _max(*pairs) -> float:
    return max(maxdiff(a, b) for a, b in pairs)


@register(GROUP, "3 grid levels: R_s + pre-LN evolution, conv Q/K/V + BN(eval), K/V stride 2",
          "transformers CvtModel (last_hidden_state, cls_token_value)")
def check_model(dtype: torch.dtype) -> float:
    from ..interop.hf import from_hf

    ref = random_cvt("CvtModel", dtype)
    ours = from_hf(ref)
    x = _pixels(dtype)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    return _max((a.last_hidden_state, b.last_hidden_state), (a.cls_token_value, b.cls_token_value))


@register(GROUP, "read-out: LN(class token), mean, linear classifier",
          "transformers CvtForImageClassification (logits)")
def check_classifier(dtype: torch.dtype) -> float:
    from ..interop.hf import from_hf

    ref = random_cvt("CvtForImageClassification", dtype, seed=2)
    ours = from_hf(ref)
    x = _pixels(dtype)
    with torch.no_grad():
        return _max((ref(x).logits, ours(x).logits))


@register(GROUP, "train mode: BN batch statistics and running-stat updates, dropout 0",
          "transformers CvtModel.train() (outputs and BatchNorm buffers)")
def check_train_batchnorm(dtype: torch.dtype) -> float:
    from ..interop.hf import from_hf, to_hf

    ref = random_cvt("CvtModel", dtype, seed=3).train()
    ours = from_hf(ref)
    x = _pixels(dtype, shape=(3, 3, 32, 24))
    with torch.no_grad():
        a, b = ref(x), ours(x)
    errs = [(a.last_hidden_state, b.last_hidden_state), (a.cls_token_value, b.cls_token_value)]
    theirs, mine = ref.state_dict(), to_hf(ours).state_dict()
    for k, v in theirs.items():
        if k.endswith("num_batches_tracked"):
            if not torch.equal(v, mine[k]):
                return math.inf
        elif "running" in k:
            errs.append((v, mine[k]))
    return _max(*errs)


@register(GROUP, "round trip to_hf(from_hf(m)): state dict (BN buffers included)",
          "transformers CvtForImageClassification.state_dict()")
def check_round_trip(dtype: torch.dtype) -> float:
    from ..interop.hf import from_hf, to_hf

    ref = random_cvt("CvtForImageClassification", dtype, seed=4)
    back = to_hf(from_hf(ref)).state_dict()
    theirs = ref.state_dict()
    if back.keys() != theirs.keys():
        return math.inf
    same = all(torch.equal(v, back[k]) and v.dtype == back[k].dtype for k, v in theirs.items())
    return 0.0 if same else math.inf
