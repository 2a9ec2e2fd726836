"""The paper's literal scheme (docs/math.md section 2) equals a post-LN encoder."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitformer
from splitformer.time import paper_lie
from splitformer.verification.references import TOL, perturb_, post_ln_reference


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
    enc = post_ln_reference(model.evolution.controls, dtype)
    x = torch.randn(3, 8, d, dtype=dtype)
    with torch.no_grad():
        assert (model(x) - enc(x)).abs().max() <= TOL[dtype]


def test_paper_scheme_has_the_relaxation_and_projections():
    s = paper_lie(2)
    kinds = [st.kind for st in s.stages]
    assert kinds == ["field", "project", "field", "field", "relax", "project"]
    assert s.stages[2].then == ("relu",)  # linear + projection onto S2: one substep
    assert s.stages[4].weight == 0.5
    assert len(paper_lie(3).stages) == 4 + 3


def test_paper_form_from_torch_and_back():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True,
                                       layer_norm_eps=0.0, dtype=torch.float64)
    enc = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
    perturb_(enc)  # distinct layers (the encoder deep-copies one): a wrong layer map shows
    with torch.no_grad():  # scalar, positive, different per layer and per norm
        for n, lyr in enumerate(enc.layers):
            lyr.norm1.weight.fill_(1.5 + 0.1 * n)
            lyr.norm1.bias.fill_(0.1 * n)
            lyr.norm2.weight.fill_(0.7 + 0.2 * n)
            lyr.norm2.bias.fill_(-0.2 - 0.1 * n)
    enc.eval()
    m = splitformer.from_torch(enc, form="paper").eval()
    assert m.evolution.scheme.name == "paper"
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        assert (m(x) - enc(x)).abs().max() < 1e-10
    back = splitformer.to_torch(m)
    for k, v in enc.state_dict().items():
        assert torch.allclose(v, back.state_dict()[k], atol=1e-15, rtol=0), k
    # the weights are the W of the (I + W) form
    for theta, lyr in zip(m.evolution.controls, enc.layers, strict=True):
        w1 = theta["ffn1"].weight
        assert torch.allclose(w1 + torch.eye(12, 8, dtype=torch.float64), lyr.linear1.weight)


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
