"""Checks of the ViT family: transformers' ViTModel / ViTForImageClassification against the
splitformer weight map.

Each check builds a small random-weight ViT (seeded; every parameter perturbed so that the norms
and biases are non-trivial), converts it with ``from_hf`` and returns the max abs difference of
the named output. The reference is transformers' sdpa attention path: its eager path computes
the softmax in float32 even for a float64 model, so only sdpa is float64-accurate.
"""

from __future__ import annotations

import torch

from . import register
from .references import maxdiff, perturb_, require_transformers

_SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "image_size": 32,
    "patch_size": 8,
}


def _pair(dtype: torch.dtype, *, classifier: bool = False, attn: str = "sdpa", **overrides):
    from ..interop.hf_vit import from_hf_model

    tr = require_transformers()
    torch.manual_seed(0)
    config = tr.ViTConfig(**{**_SMALL, **overrides})
    config._attn_implementation = attn
    if classifier:
        config.num_labels = 5
        ref = tr.ViTForImageClassification(config)
    else:
        ref = tr.ViTModel(config)
    ref = ref.to(dtype).eval()
    perturb_(ref, seed=2)
    ours = from_hf_model(ref)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, config.num_channels, 32, 32, generator=g, dtype=dtype)
    return ref, ours, x


@register("vit", "pre-LN ViT = Euler for u_t = A(P1 u) + G(P2 u) on the 2-D patch grid",
          "transformers ViTModel last_hidden_state + pooler_output (sdpa)")
def check_vit_model(dtype: torch.dtype) -> float:
    ref, ours, x = _pair(dtype)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    return max(maxdiff(a.last_hidden_state, b.last_hidden_state),
               maxdiff(a.pooler_output, b.pooler_output))


@register("vit", "read-out: classifier on the class-token point",
          "transformers ViTForImageClassification logits (sdpa, qkv_bias=False, relu)")
def check_vit_classifier(dtype: torch.dtype) -> float:
    ref, ours, x = _pair(dtype, classifier=True, qkv_bias=False, hidden_act="relu")
    with torch.no_grad():
        return maxdiff(ref(x).logits, ours(x).logits)


@register("vit", "trajectory u(t_n), n = 0..L (u(0) = f on the patch grid)",
          "transformers ViTModel hidden_states (sdpa)")
def check_vit_trajectory(dtype: torch.dtype) -> float:
    ref, ours, x = _pair(dtype)
    with torch.no_grad():
        hs = ref(x, output_hidden_states=True).hidden_states
        traj = ours.trajectory(x)
    return max(maxdiff(h, s) for h, s in zip(hs, traj.states, strict=True))
