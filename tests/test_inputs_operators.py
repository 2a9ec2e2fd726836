"""Bad input to the operators (Context, kernels, LayerScale, attention) is refused when it is
built, naming the argument; a kernel that would silently break causality or change a scale is
warned about."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import splitformer
from splitformer.models.kernels import set_kernel
from splitformer.operators import Context, DiagonalScaling, NonlocalAttention
from splitformer.operators.kernels import (
    ALiBiKernel,
    GaussianKernel,
    Kernel,
    LinearKernel,
    RotaryKernel,
    SinkhornKernel,
    SoftmaxKernel,
    probe_causality,
)


# -- 7. Context ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["yes", 1, None, torch.tensor(True)])
def test_context_is_causal_must_be_a_bool(value):
    with pytest.raises(TypeError, match="Context.is_causal must be a bool"):
        Context(is_causal=value)


@pytest.mark.parametrize("mask", [[[True]], 0.0, "causal"])
def test_context_attn_mask_must_be_none_or_a_tensor(mask):
    with pytest.raises(TypeError, match="Context.attn_mask must be None or a torch.Tensor"):
        Context(attn_mask=mask)


def test_context_extra_must_be_a_dict_and_good_values_pass():
    with pytest.raises(TypeError, match="Context.extra must be a dict"):
        Context(extra=None)
    ctx = Context(attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True, extra={"a": 1})
    assert ctx.is_causal and ctx.extra == {"a": 1}


# -- 8. scales, LayerScale, attention dropout -------------------------------------------------
SCALED = {
    "softmax": lambda s: SoftmaxKernel(scale=s),
    "sinkhorn": lambda s: SinkhornKernel(scale=s),
    "gaussian": lambda s: GaussianKernel(scale=s),
    "alibi": lambda s: ALiBiKernel(2, scale=s),
    "rotary": lambda s: RotaryKernel(4, scale=s),
}


@pytest.mark.parametrize("name", sorted(SCALED))
@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_every_kernel_with_a_scale_needs_a_finite_positive_one(name, scale):
    with pytest.raises(ValueError, match="scale must be None .* or a finite number > 0"):
        SCALED[name](scale)


@pytest.mark.parametrize("name", sorted(SCALED))
def test_kernel_scales_are_numbers(name):
    with pytest.raises(TypeError, match="scale must be None"):
        SCALED[name]("0.5")
    with pytest.raises(TypeError, match="scale must be None"):
        SCALED[name](True)
    assert SCALED[name](None).scale is None and SCALED[name](2).scale == 2.0


def test_a_refused_scale_would_have_given_nan():
    """What the check prevents: sdpa with a causal support and scale 0 returns NaN on CPU."""
    q = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    out = F.scaled_dot_product_attention(q, q, q, is_causal=True, scale=0.0)
    assert torch.isnan(out).any()  # torch 2.13 on CPU
    with pytest.raises(ValueError, match="SoftmaxKernel: scale"):
        SoftmaxKernel(scale=0.0)


def test_linear_kernel_eps_must_be_positive():
    with pytest.raises(ValueError, match="LinearKernel: eps must be a finite number > 0"):
        LinearKernel(eps=0.0)
    with pytest.raises(ValueError, match="eps must be"):
        LinearKernel(eps=math.nan)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1", True])
def test_layerscale_init_value_must_be_finite(value):
    with pytest.raises(ValueError, match="init_value must be a finite number"):
        DiagonalScaling(4, init_value=value)
    assert DiagonalScaling(4, init_value=1e-5).gamma[0].item() == pytest.approx(1e-5)


@pytest.mark.parametrize("p", [1.0, -0.1, 1.5, math.nan, "0.1", True])
def test_attn_dropout_is_refused_at_build(p):
    with pytest.raises(ValueError, match=r"attn_dropout must be a number in \[0, 1\)"):
        NonlocalAttention(8, 2, attn_dropout=p)
    assert NonlocalAttention(8, 2, attn_dropout=0.5).attn_dropout == 0.5


# -- 9. user-written kernels: causality probe, replaced scales ---------------------------------
class Leaky(Kernel):
    """Ignores is_causal: every token sees the whole sequence."""

    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)


class Causal(Kernel):
    def forward(self, q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal)


class Broken(Kernel):
    def forward(self, q, k, v, **kw):
        raise RuntimeError("cannot run")


@pytest.fixture
def model():
    torch.manual_seed(0)
    return splitformer.network_encoder(8, 2, 16, 2, dtype=torch.float64)


def test_a_kernel_that_ignores_is_causal_is_warned_about(model):
    with pytest.warns(UserWarning, match=r"Leaky ignores is_causal"):
        model.with_kernel(Leaky())
    with pytest.warns(UserWarning, match=r"Leaky ignores is_causal"):
        model.evolution.controls[0]["attention"].set_kernel(Leaky())
    with pytest.warns(UserWarning, match=r"could not probe Broken"):
        set_kernel(model, Broken())


def test_a_causal_user_kernel_and_the_builtins_pass_the_probe(model):
    state = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.with_kernel(Causal())
        model.with_kernel(SoftmaxKernel())  # built in, default scale here: no probe, no warning
    assert torch.equal(state, torch.get_rng_state())  # the probe keeps the global RNG
    assert probe_causality(Causal()) == 0.0 and probe_causality(Leaky()) > 1e-3
    for k in (SoftmaxKernel(), SinkhornKernel(), GaussianKernel(), LinearKernel(),
              ALiBiKernel(2), RotaryKernel(4)):
        assert probe_causality(k, 2, 4) < 1e-12, k


def test_a_kernel_instance_replacing_a_non_default_scale_is_named():
    m = splitformer.network_encoder(16, 2, 32, 2, attention_scales=[0.1, 0.2])
    with pytest.warns(UserWarning, match=r"evolution.controls.sets.0.attention: 0.1 -> 0.35.*"
                                         r"sets.1.attention: 0.2 -> 0.35"):
        m.with_kernel(SoftmaxKernel())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.with_kernel("softmax")  # by name: each operator keeps its scale
        m.with_kernel(LinearKernel())  # no scale: dropping it on purpose is the documented way


def test_gpt2_scale_by_layer_with_a_softmax_instance_warns():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=16,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  scale_attn_by_inverse_layer_idx=True)
    m = splitformer.from_hf(transformers.GPT2Model(cfg).double().eval())
    # layer 0 keeps 1/sqrt(d_h) (no warning for it); layer 1 has 1/sqrt(d_h) / 2
    with pytest.warns(UserWarning, match=r"evolution.controls.sets.1.attention: 0.17677.* -> "
                                         r"0.35355") as rec:
        m.with_kernel(SoftmaxKernel())
    assert "sets.0.attention" not in str(rec[0].message)


# -- 10. names with surrounding whitespace -----------------------------------------------------
def test_kernel_names_are_stripped(model):
    m = model.with_kernel("sinkhorn ")
    assert type(m.evolution.controls[0]["attention"].kernel) is SinkhornKernel
    set_kernel(model, " softmax")
    with pytest.raises(ValueError, match="kernel must be"):
        model.with_kernel("soft max")


def test_context_keys_that_became_fields_are_read_from_extra_with_a_warning():
    """memory, memory_mask, memory_weights, memory_coords, grid_shape and the merge trace are
    declared fields of Context; the old extra keys still arrive there, with a warning."""
    m = torch.randn(1, 3, 4)
    with pytest.warns(DeprecationWarning, match="Context.memory"):
        ctx = Context(extra={"memory": m, "grid_shape": [2, 3], "mine": 1})
    assert ctx.memory is m and ctx.grid_shape == (2, 3) and ctx.extra == {"mine": 1}
    with pytest.raises(TypeError, match="Context.tape must be None or a KVTape"):
        Context(tape=object())
