"""The paper's correspondence table, measured against torch.nn on random weights."""

from __future__ import annotations

import torch
from torch import nn

from ..interop.torch_nn import from_torch
from ..models.encoder import paper_encoder
from ..operators import FeedForward, NonlocalAttention, ProjectionS2, SphereProjection
from ..operators.projections import LayerNormProjection
from . import register
from .references import maxdiff, perturb_, post_ln_reference

D, H, FF, B, N = 32, 4, 48, 3, 9


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _x(dtype, seed=1, shape=(B, N, D)):
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype)


def _distinct_layers(enc: nn.TransformerEncoder) -> nn.TransformerEncoder:
    """nn.TransformerEncoder deep-copies one layer: perturb every parameter of every layer, so
    that a wrong layer -> theta^n or weight map cannot pass."""
    return perturb_(enc, seed=3)


def _encoder_layer(dtype, **kw) -> nn.TransformerEncoderLayer:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, dtype=dtype, **kw)
    with torch.no_grad():  # non-trivial norm parameters
        for ln in (layer.norm1, layer.norm2):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    return layer.eval()


@register("core", "one Lie step, tau = 1 (A, P_S1, G, P_S1)", "nn.TransformerEncoderLayer")
def lie_step(dtype):
    layer = _encoder_layer(dtype)
    x = _x(dtype)
    with torch.no_grad():
        return maxdiff(from_torch(layer)(x), layer(x))


@register("core", "N_t = 6 Lie steps on [0, 6]", "nn.TransformerEncoder, 6 layers")
def six_steps(dtype):
    layer = _encoder_layer(dtype)
    enc = _distinct_layers(nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)).eval()
    x = _x(dtype)
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, -3:] = True
    with torch.no_grad():
        ref = enc(x, src_key_padding_mask=kpm)
        return maxdiff(from_torch(enc)(x, src_key_padding_mask=kpm), ref)


@register("core", "projection in the vector field: u + tau A(P u)", "norm_first=True (pre-LN)")
def prenorm_step(dtype):
    layer = _encoder_layer(dtype, norm_first=True, activation="gelu")
    enc = _distinct_layers(nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(D, dtype=dtype),
                                                 enable_nested_tensor=False)).eval()
    x = _x(dtype)
    with torch.no_grad():
        return maxdiff(from_torch(enc)(x), enc(x))


@register("core", "J = 2 feature integrals", "standard FFN linear2(relu(linear1(x)))")
def ffn(dtype):
    torch.manual_seed(0)
    lin1, lin2 = nn.Linear(D, FF, dtype=dtype), nn.Linear(FF, D, dtype=dtype)
    g = FeedForward([D, FF, D], activation="relu", dtype=dtype)
    with torch.no_grad():
        for st, lin in zip(g.stages, (lin1, lin2), strict=True):
            st.weight.copy_(lin.weight)
            st.bias.copy_(lin.bias)
        x = _x(dtype)
        return maxdiff(g(x), lin2(torch.relu(lin1(x))))


@register("core", "projection onto S1(s1, s2) (eps = 0)", "nn.LayerNorm, scalar gain/bias")
def projection_s1(dtype):
    p = SphereProjection(D, s1=0.3, s2=1.7, dtype=dtype)
    ln = nn.LayerNorm(D, eps=0.0, dtype=dtype)
    with torch.no_grad():
        ln.weight.fill_(1.7)
        ln.bias.fill_(0.3)
        x = _x(dtype)
        return maxdiff(p(x), ln(x))


@register("core", "ghost-point projection + affine map", "nn.LayerNorm(eps > 0, gamma, beta)")
def layernorm_reading(dtype):
    torch.manual_seed(0)
    ln = nn.LayerNorm(D, eps=1e-2, dtype=dtype)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    p = LayerNormProjection(D, eps=1e-2, dtype=dtype)
    p.load_state_dict(ln.state_dict())
    with torch.no_grad():
        x = _x(dtype)
        return maxdiff(p.affine(p.ghost_projection(x)), ln(x))


@register("core", "projection onto S2 = {u >= 0}", "nn.ReLU")
def projection_s2(dtype):
    x = _x(dtype)
    return maxdiff(ProjectionS2()(x), nn.ReLU()(x))


@register("core", "head integral sum_h (g_h V_h) W_O,h", "nn.MultiheadAttention")
def head_integral(dtype):
    torch.manual_seed(0)
    mha = perturb_(nn.MultiheadAttention(D, H, batch_first=True, dtype=dtype)).eval()
    a = NonlocalAttention(D, H, dtype=dtype)
    with torch.no_grad():
        a.qkv_weight.copy_(mha.in_proj_weight)
        a.qkv_bias.copy_(mha.in_proj_bias)
        a.out_weight.copy_(mha.out_proj.weight)
        a.out_bias.copy_(mha.out_proj.bias)
        x = _x(dtype)
        ref = mha(x, x, x, need_weights=False)[0]
        return max(maxdiff(a.head_sum(x), ref), maxdiff(a(x), ref))


@register("core", "paper's literal Lie scheme, M = 4 + J substeps: (I + W_j), s1, s2, eps = 0, "
          "relaxation 1/2",
          "post-LN encoder, 6 layers, eps = 0")
def paper_literal(dtype):
    torch.manual_seed(0)
    model = paper_encoder(D, H, FF, 6, dtype=dtype).eval()
    with torch.no_grad():
        for theta in model.evolution.controls:
            theta["norm1"].s1.uniform_(-0.5, 0.5)
            theta["norm1"].s2.uniform_(0.5, 1.5)
            theta["norm2"].s1.uniform_(-0.5, 0.5)
            theta["norm2"].s2.uniform_(0.5, 1.5)
    # the reference: a torch.nn post-LN encoder whose linear weights are I + W_j (the
    # rectangular identity when widths differ) and whose LayerNorms have eps = 0, gain s2, bias s1
    enc = post_ln_reference(model.evolution.controls, dtype)
    x = _x(dtype)
    with torch.no_grad():
        return maxdiff(model(x), enc(x))
