"""Property tests (hypothesis): random torch.nn encoder configurations against torch.nn.

For every drawn configuration (d_model, nhead dividing it, dim_feedforward, 1-3 layers,
norm_first, relu/gelu, batch_first, bias, final norm or not, a single layer or a stack) and
every drawn input (key padding with at least one kept token per row; no mask, a boolean or float
mask (2-D or per head), a causal mask with ``is_causal``, or ``is_causal`` alone):

* ``from_torch(m)(x, ...)`` equals ``m(x, ...)`` in float64 to 1e-10 on the unpadded tokens
  (train mode with dropout 0: torch's reference path, not its fused eval path, which returns 0
  on padded tokens and packs nested tensors);
* ``to_torch(from_torch(m))`` is the same class with a bitwise-equal state dict.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import splitformer
from splitformer.verification.references import assert_same_state, perturb_

SETTINGS = settings(max_examples=30, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
MASK_KINDS = ("none", "bool", "bool_per_head", "float", "causal", "causal_flag")


@dataclass(frozen=True)
class Config:
    d_model: int
    nhead: int
    dim_feedforward: int
    num_layers: int
    norm_first: bool
    activation: str
    batch_first: bool
    bias: bool
    final_norm: bool
    layer_only: bool  # a bare nn.TransformerEncoderLayer instead of a stack
    seed: int


@st.composite
def configs(draw) -> Config:
    nhead = draw(st.integers(1, 3))
    layer_only = draw(st.booleans())
    return Config(
        d_model=nhead * draw(st.sampled_from([2, 4, 6])),
        nhead=nhead,
        dim_feedforward=draw(st.integers(1, 24)),
        num_layers=1 if layer_only else draw(st.integers(1, 3)),
        norm_first=draw(st.booleans()),
        activation=draw(st.sampled_from(["relu", "gelu"])),
        batch_first=draw(st.booleans()),
        bias=draw(st.booleans()),
        final_norm=False if layer_only else draw(st.booleans()),
        layer_only=layer_only,
        seed=draw(st.integers(0, 2**16)),
    )


def build(cfg: Config) -> nn.Module:
    torch.manual_seed(cfg.seed)
    layer = nn.TransformerEncoderLayer(
        cfg.d_model, cfg.nhead, cfg.dim_feedforward, dropout=0.0, activation=cfg.activation,
        batch_first=cfg.batch_first, norm_first=cfg.norm_first, bias=cfg.bias,
        dtype=torch.float64,
    )
    if cfg.layer_only:
        return perturb_(layer, seed=cfg.seed)
    norm = nn.LayerNorm(cfg.d_model, bias=cfg.bias, dtype=torch.float64) if cfg.final_norm \
        else None
    enc = nn.TransformerEncoder(layer, cfg.num_layers, norm=norm, enable_nested_tensor=False)
    return perturb_(enc, seed=cfg.seed)  # distinct layers, non-trivial norms and biases


@st.composite
def inputs(draw, cfg: Config) -> tuple[torch.Tensor, dict, dict, torch.Tensor]:
    """(x, torch.nn's keyword arguments, ours, keep (B, N) = the unpadded tokens)."""
    b, n = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(b, n, cfg.d_model, generator=g, dtype=torch.float64)
    padded = draw(st.booleans())
    pad = torch.zeros(b, n, dtype=torch.bool)
    if padded:
        pad = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n),
                                         min_size=b, max_size=b)))
        for i in range(b):  # at least one unpadded token per row
            if bool(pad[i].all()):
                pad[i, draw(st.integers(0, n - 1))] = False
    kind = draw(st.sampled_from(MASK_KINDS))
    ref: dict = {}
    ours: dict = {}
    float_masks = kind in ("float", "causal", "causal_flag")
    if kind == "bool":
        ref["mask"] = torch.rand(n, n, generator=g) < 0.4  # True = not allowed
    elif kind == "bool_per_head":
        ref["mask"] = torch.rand(b * cfg.nhead, n, n, generator=g) < 0.4
    elif kind == "float":
        ref["mask"] = torch.randn(n, n, generator=g, dtype=torch.float64)
    elif kind in ("causal", "causal_flag"):
        ref["mask"] = nn.Transformer.generate_square_subsequent_mask(n, dtype=torch.float64)
        ref["is_causal"] = True
    ours.update(ref)
    if kind == "causal_flag":  # ours takes is_causal alone (torch.nn needs the mask too)
        del ours["mask"]
    if padded:
        # one mask type per call (torch.nn deprecates a boolean padding mask beside a float mask)
        kpm = torch.zeros(b, n, dtype=torch.float64).masked_fill(pad, float("-inf")) \
            if float_masks else pad
        ref["src_key_padding_mask"] = ours["src_key_padding_mask"] = kpm
    if not cfg.batch_first:
        x = x.transpose(0, 1).contiguous()
    return x, ref, ours, ~pad


@SETTINGS
@given(data=st.data())
def test_from_torch_equals_torch_nn_on_unpadded_tokens(data):
    cfg = data.draw(configs(), label="config")
    m = build(cfg).train()  # dropout 0: torch's reference path, no fused kernels
    x, ref_kw, our_kw, keep = data.draw(inputs(cfg), label="inputs")
    ours = splitformer.from_torch(m).train()
    with torch.no_grad():
        ref = m(x, **({"src_mask": ref_kw.pop("mask")} if cfg.layer_only and "mask" in ref_kw
                      else {}), **ref_kw)
        out = ours(x, **our_kw)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    if not cfg.batch_first:
        out, ref = out.transpose(0, 1), ref.transpose(0, 1)
    assert torch.isfinite(out[keep]).all() and torch.isfinite(ref[keep]).all()
    assert (out[keep] - ref[keep]).abs().max().item() <= 1e-10, cfg


@SETTINGS
@given(cfg=configs())
def test_to_torch_of_from_torch_is_the_same_state_dict(cfg):
    m = build(cfg)
    back = splitformer.to_torch(splitformer.from_torch(m))
    assert type(back) is type(m)
    assert_same_state(m, back)
