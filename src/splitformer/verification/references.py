"""The one home of what checks and tests share: building reference modules (random
perturbations, a torch.nn post-LN encoder assembled from splitformer controls: the independent
side of a comparison), importing the reference library, and comparing (max abs difference,
bitwise state dicts, the tolerances).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..operators import SphereProjection
from . import TOLERANCES, SkipCheck

__all__ = ["TOL", "assert_same_state", "maxdiff", "perturb_", "post_ln_reference",
           "require_transformers"]

# float64 / float32 tolerances of every comparison (the ones ``splitformer verify`` uses)
TOL = TOLERANCES


def require_transformers() -> Any:
    """The ``transformers`` module; ``SkipCheck`` when it is not installed (a verify row then
    says SKIP)."""
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SkipCheck("transformers is not installed") from e
    return transformers


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| as a float."""
    return float((a - b).detach().abs().max())


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    """Same state-dict keys in the same order, same dtypes, bitwise equal values."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(sa[k], sb[k]), k


def perturb_(module: nn.Module, seed: int = 2, scale: float = 0.2) -> nn.Module:
    """Add scale * N(0, 1) to every parameter (in place): biases and gains become non-trivial,
    and the layers of a deep-copied nn.TransformerEncoder become distinct, so that a wrong
    weight or layer mapping cannot pass a comparison."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device))
    return module


def post_ln_reference(controls, dtype: torch.dtype, *, activation="relu") -> nn.TransformerEncoder:
    """The torch.nn post-LN encoder whose layer n holds theta^n of ``controls``.

    Works for the network form (attention, norm1, ffn, norm2 with LayerNormProjection) and the
    paper's literal form (ffn1, ffn2 in the (I + W_j) form: linear weight = E + W_j; norms
    SphereProjection: LayerNorm with eps = 0, gain s2, bias s1). Weights are written by hand
    from the operators' parameters, independently of ``to_torch``.
    """
    theta0 = controls[0]
    a0 = theta0["attention"]
    paper = "ffn1" in theta0
    ff = theta0["ffn1"].out_dim if paper else theta0["ffn"].widths[1]
    eps = 0.0 if isinstance(theta0["norm1"], SphereProjection) else theta0["norm1"].eps
    layer = nn.TransformerEncoderLayer(a0.dim, a0.num_heads, ff, dropout=0.0, batch_first=True,
                                       activation=activation, layer_norm_eps=eps, dtype=dtype)
    enc = nn.TransformerEncoder(layer, len(controls), enable_nested_tensor=False).eval()
    with torch.no_grad():
        for theta, lyr in zip(controls, enc.layers, strict=True):
            a = theta["attention"]
            lyr.self_attn.in_proj_weight.copy_(a.qkv_weight)
            lyr.self_attn.in_proj_bias.copy_(a.qkv_bias)
            lyr.self_attn.out_proj.weight.copy_(a.out_weight)
            lyr.self_attn.out_proj.bias.copy_(a.out_bias)
            stages = [theta["ffn1"], theta["ffn2"]] if paper else list(theta["ffn"].stages)
            for st, lin in zip(stages, (lyr.linear1, lyr.linear2), strict=True):
                w = st.weight + torch.eye(*st.weight.shape, dtype=dtype) if paper else st.weight
                lin.weight.copy_(w)
                lin.bias.copy_(st.bias)
            for nm in ("norm1", "norm2"):
                ours, ln = theta[nm], getattr(lyr, nm)
                if isinstance(ours, SphereProjection):
                    ln.weight.fill_(ours.s2.item())
                    ln.bias.fill_(ours.s1.item())
                    ln.eps = 0.0
                else:
                    ln.weight.copy_(ours.weight)
                    ln.bias.copy_(ours.bias)
    return enc
