"""The paper's literal scheme (MATH.md section 2) equals a post-LN encoder."""

from __future__ import annotations

import pytest
import torch
from conftest import TOL
from torch import nn

import splitformer
from splitformer.time import paper_lie


def _post_ln_reference(model, dtype, d, h, ff, L):
    """torch.nn encoder whose weights are the (I + W_j) relabelling and whose LayerNorms have
    eps = 0, gain s2 and bias s1: built here from the controls, independently of to_torch."""
    layer = nn.TransformerEncoderLayer(d, h, ff, dropout=0.0, batch_first=True,
                                       layer_norm_eps=0.0, dtype=dtype)
    enc = nn.TransformerEncoder(layer, L, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for theta, lyr in zip(model.evolution.controls, enc.layers, strict=True):
            a = theta["attention"]
            lyr.self_attn.in_proj_weight.copy_(a.qkv_weight)
            lyr.self_attn.in_proj_bias.copy_(a.qkv_bias)
            lyr.self_attn.out_proj.weight.copy_(a.out_weight)
            lyr.self_attn.out_proj.bias.copy_(a.out_bias)
            for j, lin in ((1, lyr.linear1), (2, lyr.linear2)):
                w = theta[f"ffn{j}"].weight
                lin.weight.copy_(w + torch.eye(*w.shape, dtype=dtype))
                lin.bias.copy_(theta[f"ffn{j}"].bias)
            for nm in ("norm1", "norm2"):
                getattr(lyr, nm).weight.fill_(theta[nm].s2.item())
                getattr(lyr, nm).bias.fill_(theta[nm].s1.item())
    return enc


@pytest.mark.parametrize("d,h,ff,L", [(16, 4, 16, 6), (16, 2, 40, 3), (12, 3, 7, 2)])
def test_paper_literal_scheme_equals_post_ln_encoder(d, h, ff, L, dtype):
    torch.manual_seed(0)
    model = splitformer.paper_encoder(d, h, ff, L, dtype=dtype).eval()
    assert len(model.evolution.scheme.stages) == 4 + 2  # M = 4 + J substeps, J = 2
    with torch.no_grad():
        for theta in model.evolution.controls:
            for nm in ("norm1", "norm2"):
                theta[nm].s1.uniform_(-0.5, 0.5)
                theta[nm].s2.uniform_(0.5, 1.5)
    enc = _post_ln_reference(model, dtype, d, h, ff, L)
    x = torch.randn(3, 8, d, dtype=dtype)
    with torch.no_grad():
        assert (model(x) - enc(x)).abs().max() <= TOL[dtype]


def test_paper_scheme_has_the_relaxation_and_projections():
    s = paper_lie(2)
    kinds = [st.integrator for st in s.stages]
    assert kinds == ["euler", "project", "euler", "euler", "relax", "project"]
    assert s.stages[2].then == ("relu",)  # linear + projection onto S2: one substep
    assert s.stages[4].weight == 0.5
    assert len(paper_lie(3).stages) == 4 + 3


def test_paper_form_from_torch_and_back():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True,
                                       layer_norm_eps=0.0, dtype=torch.float64)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for lyr in enc.layers:
            lyr.norm1.weight.fill_(1.5)
            lyr.norm2.bias.fill_(-0.2)
    m = splitformer.from_torch(enc, form="paper").eval()
    assert m.evolution.scheme.name == "paper"
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        assert (m(x) - enc(x)).abs().max() < 1e-10
    back = splitformer.to_torch(m)
    for k, v in enc.state_dict().items():
        assert torch.allclose(v, back.state_dict()[k], atol=1e-15, rtol=0), k
    # the weights are the W of the (I + W) form
    w1 = m.evolution.controls[0]["ffn1"].weight
    assert torch.allclose(w1 + torch.eye(12, 8, dtype=torch.float64), enc.layers[0].linear1.weight)


def test_paper_form_rejects_what_is_not_the_paper():
    layer = nn.TransformerEncoderLayer(8, 2, 12, batch_first=True)  # eps = 1e-5
    with pytest.raises(ValueError, match="eps"):
        splitformer.from_torch(layer, form="paper")
    layer = nn.TransformerEncoderLayer(8, 2, 12, batch_first=True, layer_norm_eps=0.0)
    with torch.no_grad():
        layer.norm1.weight[0] = 2.0
    with pytest.raises(ValueError, match="scalar"):
        splitformer.from_torch(layer, form="paper")
    layer = nn.TransformerEncoderLayer(8, 2, 12, batch_first=True, layer_norm_eps=0.0,
                                       activation="gelu")
    with pytest.raises(ValueError, match="relu"):
        splitformer.from_torch(layer, form="paper")
