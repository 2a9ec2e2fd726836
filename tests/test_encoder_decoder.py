"""nn.Transformer / TransformerDecoder(Layer) <-> the coupled pair of fields: exact, both ways."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitformer
from splitformer.interop.torch_transformer import (
    DECODER_LAYER_MAP,
    from_torch_transformer,
    to_torch_transformer,
    weight_map,
)
from splitformer.models.masks import attention_support
from splitformer.models.seq2seq import (
    CrossDecoder,
    EncoderDecoderModel,
    decoder_lie,
    encoder_decoder,
    network_decoder,
)
from splitformer.time import Scheme, Stage
from splitformer.verification.references import TOL, perturb_

D, H, FF, B, S, T = 16, 4, 24, 3, 7, 5

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*nested.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*mismatched key_padding_mask.*:UserWarning"),
]




def make_transformer(dtype, *, norm_first=False, batch_first=True, activation="relu",
                     bias=True, seed=0, **kw) -> nn.Transformer:
    torch.manual_seed(seed)
    t = nn.Transformer(D, H, 2, 3, FF, dropout=0.0, activation=activation,
                       batch_first=batch_first, norm_first=norm_first, bias=bias, dtype=dtype,
                       **kw)
    return perturb_(t, seed=3).eval()


def data(dtype, batch_first=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(B, S, D, generator=g, dtype=dtype)
    tgt = torch.randn(B, T, D, generator=g, dtype=dtype)
    if not batch_first:
        src, tgt = src.transpose(0, 1), tgt.transpose(0, 1)
    return src, tgt


def masks(dtype, seed=2):
    g = torch.Generator().manual_seed(seed)
    src_kpm = torch.zeros(B, S, dtype=torch.bool)
    src_kpm[0, -2:] = True
    tgt_kpm = torch.zeros(B, T, dtype=torch.bool)
    tgt_kpm[1, -1] = True
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=dtype)
    memory_mask = torch.rand(T, S, generator=g) < 0.3
    memory_mask[:, 0] = False  # every query keeps a key
    return {"src_kpm": src_kpm, "tgt_kpm": tgt_kpm, "causal": causal,
            "memory_mask": memory_mask}


def maxdiff(a, b) -> float:
    return float((a - b).detach().abs().max())


PAIR_CONFIGS = {
    "post-relu": {},
    "pre-gelu": {"norm_first": True, "activation": "gelu"},
    "post-gelu-seqfirst": {"activation": "gelu", "batch_first": False},
    "pre-relu-nobias-seqfirst": {"norm_first": True, "bias": False, "batch_first": False},
    "post-tanhgelu-eps": {"activation": nn.GELU(approximate="tanh"), "layer_norm_eps": 1e-3},
}


@pytest.mark.parametrize("name", list(PAIR_CONFIGS))
def test_transformer_matches(name, dtype):
    cfg = PAIR_CONFIGS[name]
    ref = make_transformer(dtype, **cfg)
    ours = splitformer.from_torch(ref)
    assert isinstance(ours, EncoderDecoderModel)
    bf = cfg.get("batch_first", True)
    src, tgt = data(dtype, bf)
    m = masks(dtype)
    cases = [
        {},
        {"tgt_mask": m["causal"]},
        {"tgt_mask": m["causal"], "tgt_is_causal": True, "src_key_padding_mask": m["src_kpm"],
         "memory_key_padding_mask": m["src_kpm"], "tgt_key_padding_mask": m["tgt_kpm"]},
        {"tgt_mask": m["causal"].isinf(), "memory_mask": m["memory_mask"],
         "src_mask": torch.zeros(S, S, dtype=dtype)},
    ]
    # torch's fused encoder path (eval, no grad) computes the exact GELU for an
    # nn.GELU(approximate="tanh") activation; its autograd path is the reference then
    grad = isinstance(cfg.get("activation"), nn.GELU)
    with torch.set_grad_enabled(grad):
        for kw in cases:
            a = ref(src, tgt, **kw)
            b = ours(src, tgt, **kw)
            assert a.shape == b.shape
            assert maxdiff(a, b) <= TOL[dtype], (list(kw), maxdiff(a, b))


def test_train_mode_dropout_zero_and_gradients(dtype):
    ref = make_transformer(dtype, norm_first=True).train()
    ours = splitformer.from_torch(ref)
    assert ours.training and ours.encoder.training and ours.decoder.training
    src, tgt = data(dtype)
    m = masks(dtype)
    kw = {"tgt_mask": m["causal"], "src_key_padding_mask": m["src_kpm"],
          "memory_key_padding_mask": m["src_kpm"]}
    a, b = ref(src, tgt, **kw), ours(src, tgt, **kw)
    assert maxdiff(a, b) <= TOL[dtype]
    a.pow(2).sum().backward()
    b.pow(2).sum().backward()
    pairs = [
        (ref.decoder.layers[1].multihead_attn.in_proj_weight.grad,
         ours.decoder.evolution.controls[1]["cross_attention"].qkv_weight.grad),
        (ref.encoder.layers[0].self_attn.in_proj_weight.grad,
         ours.encoder.evolution.controls[0]["attention"].qkv_weight.grad),
    ]
    for g_ref, g_ours in pairs:
        assert maxdiff(g_ref, g_ours) <= TOL[dtype] * max(1.0, float(g_ref.abs().max()))


def test_three_dimensional_and_float_masks(dtype):
    ref = make_transformer(dtype)
    ours = splitformer.from_torch(ref)
    src, tgt = data(dtype)
    g = torch.Generator().manual_seed(4)
    tgt3 = torch.randn(B * H, T, T, generator=g, dtype=dtype)
    mem3 = torch.randn(B * H, T, S, generator=g, dtype=dtype)
    mkpm = torch.zeros(B, S, dtype=dtype)
    mkpm[2, -1] = float("-inf")
    with torch.no_grad():
        kw = {"tgt_mask": tgt3, "memory_mask": mem3, "memory_key_padding_mask": mkpm}
        assert maxdiff(ref(src, tgt, **kw), ours(src, tgt, **kw)) <= TOL[dtype]


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_and_layer_match(norm_first, dtype):
    torch.manual_seed(0)
    layer = perturb_(nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, norm_first=norm_first,
                                                dtype=dtype), seed=3).eval()
    stack = perturb_(nn.TransformerDecoder(layer, 3, norm=nn.LayerNorm(D, dtype=dtype)),
                     seed=3).eval()
    bare = perturb_(nn.TransformerDecoder(layer, 2), seed=5).eval()
    src, tgt = data(dtype, batch_first=False)
    m = masks(dtype)
    kw = {"tgt_mask": m["causal"], "memory_mask": m["memory_mask"],
          "tgt_key_padding_mask": m["tgt_kpm"], "memory_key_padding_mask": m["src_kpm"]}
    with torch.no_grad():
        for ref in (layer, stack, bare):
            ours = splitformer.from_torch(ref)
            assert isinstance(ours, CrossDecoder)
            assert maxdiff(ref(tgt, src, **kw), ours(tgt, src, **kw)) <= TOL[dtype]
            assert maxdiff(ref(tgt, src), ours(tgt, src)) <= TOL[dtype]
            # unbatched inputs
            kw1 = {"tgt_mask": m["causal"], "memory_key_padding_mask": m["src_kpm"][0]}
            a = ref(tgt[:, 0], src[:, 0], **kw1)
            b = ours(tgt[:, 0], src[:, 0], **kw1)
            assert a.shape == b.shape == (T, D) and maxdiff(a, b) <= TOL[dtype]


def test_causal_hint_without_a_mask_gives_the_causal_support(dtype):
    """torch.nn needs the mask with tgt_is_causal; here the hint alone is the Volterra support."""
    torch.manual_seed(0)
    ref = perturb_(nn.TransformerDecoder(
        nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, dtype=dtype), 2),
        seed=3).eval()
    ours = splitformer.from_torch(ref)
    src, tgt = data(dtype)
    m = masks(dtype)
    with torch.no_grad():
        for kpm in (None, m["tgt_kpm"]):
            a = ref(tgt, src, tgt_mask=m["causal"], tgt_key_padding_mask=kpm)
            b = ours(tgt, src, tgt_is_causal=True, tgt_key_padding_mask=kpm)
            assert maxdiff(a, b) <= TOL[dtype]
        # memory_is_causal without a memory_mask: the top-left causal support x_s <= x
        tri = torch.ones(T, S, dtype=torch.bool).tril()
        a = ref(tgt, src, memory_mask=~tri)
        b = ours(tgt, src, memory_is_causal=True)
        assert maxdiff(a, b) <= TOL[dtype]


def test_volterra_and_coupling():
    ours = encoder_decoder(D, H, 2, 2, FF, dtype=torch.float64)
    src, tgt = data(torch.float64)
    tgt2 = tgt.clone()
    tgt2[:, 3:] += 1.0
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    with torch.no_grad():
        a = ours(src, tgt, tgt_mask=causal)
        b = ours(src, tgt2, tgt_mask=causal)
        c = ours(src + 0.5, tgt, tgt_mask=causal)
    assert torch.equal(a[:, :3], b[:, :3]) and not torch.allclose(a[:, 3:], b[:, 3:])
    assert not torch.allclose(a, c)  # the memory enters every decoder step


@pytest.mark.parametrize("kind", ["transformer", "transformer-pre-seqfirst", "decoder",
                                  "decoder-nonorm", "layer"])
def test_round_trip_state_dict(kind):
    dtype = torch.float32
    if kind.startswith("transformer"):
        pre = kind.endswith("seqfirst")
        ref = make_transformer(dtype, norm_first=pre, batch_first=not pre,
                               activation=nn.GELU(approximate="tanh") if pre else "relu")
    else:
        torch.manual_seed(0)
        layer = perturb_(nn.TransformerDecoderLayer(D, H, FF, dropout=0.1, batch_first=True,
                                                    bias=kind != "decoder-nonorm", dtype=dtype),
                         seed=3)
        if kind == "layer":
            ref = layer
        else:
            norm = nn.LayerNorm(D, dtype=dtype) if kind == "decoder" else None
            ref = perturb_(nn.TransformerDecoder(layer, 2, norm=norm), seed=3)
    ours = splitformer.from_torch(ref)
    back = splitformer.to_torch(ours)
    assert type(back) is type(ref)
    s1, s2 = ref.state_dict(), back.state_dict()
    assert list(s1) == list(s2)
    for k in s1:
        assert torch.equal(s1[k], s2[k]), k
    assert back.training == ref.training
    if kind == "layer":
        assert back.dropout1.p == 0.1 and back.multihead_attn.dropout == 0.1
        assert ours.evolution.controls[0]["cross_attention"].attn_dropout == 0.1
    if kind.startswith("transformer"):
        assert back.batch_first == ref.batch_first
        src, tgt = data(dtype, ref.batch_first)
        with torch.no_grad():
            assert torch.equal(back.eval()(src, tgt), ref.eval()(src, tgt))
    tensors = [r for r in weight_map(ours) if not r.attr]
    assert {r.theirs for r in tensors} == set(s1)
    ours_params = dict(ours.named_parameters())
    assert {r.ours for r in tensors} == set(ours_params)


def test_to_torch_exports_a_refined_decoder_as_its_steps():
    """CrossDecoder.refine(2) (tau = 1/2) goes out as a 4-layer nn.TransformerDecoder whose
    output projections carry the factor tau (Evolution.as_network); torch.nn computes it."""
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True,
                                       dtype=torch.float64)
    ref = perturb_(nn.TransformerDecoder(layer, 2), seed=3).eval()
    fine = splitformer.from_torch(ref).refine(2)
    exported = splitformer.to_torch(fine)
    assert len(exported.layers) == 4
    x = torch.randn(B, T, D, dtype=torch.float64)
    m = torch.randn(B, S, D, dtype=torch.float64)
    with torch.no_grad():
        want, got, plain = fine(x, m), exported(x, m), ref(x, m)
    assert (got - want).abs().max() <= TOL[torch.float64]
    assert (plain - want).abs().max() > 1e-3  # the refined evolution is another function


def test_unsupported_options_raise():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, H, FF, batch_first=True)
    with pytest.raises(TypeError, match="custom_encoder"):
        from_torch_transformer(nn.Transformer(D, H, 1, 1, FF, custom_encoder=nn.Linear(D, D)))
    bad = nn.TransformerDecoderLayer(D, H, FF, activation=lambda x: x * 2)
    with pytest.raises(ValueError, match="activation"):
        splitformer.from_torch(bad)
    kv = nn.TransformerDecoderLayer(D, H, FF)
    kv.multihead_attn = nn.MultiheadAttention(D, H, kdim=8, vdim=8)
    with pytest.raises(ValueError, match="kdim/vdim"):
        splitformer.from_torch(kv)
    zero = nn.TransformerDecoderLayer(D, H, FF)
    zero.self_attn = nn.MultiheadAttention(D, H, add_zero_attn=True)
    with pytest.raises(ValueError, match="add_zero_attn"):
        splitformer.from_torch(zero)
    mixed = nn.TransformerDecoder(layer, 2)
    mixed.layers[1] = nn.TransformerDecoderLayer(D, H, 2 * FF, batch_first=True)
    with pytest.raises(ValueError, match="dim_feedforward"):
        splitformer.from_torch(mixed)
    with pytest.raises(TypeError, match="from_torch_transformer expects"):
        from_torch_transformer(nn.Linear(2, 2))
    ours = splitformer.from_torch(nn.TransformerDecoder(layer, 2))
    with pytest.raises(ValueError, match="in the decoder"):
        splitformer.to_torch(ours.with_scheme("strang"))
    with pytest.raises(ValueError, match="cross_attention"):
        ours.with_scheme("attention norm1:project ffn norm3:project")
    with pytest.raises(TypeError, match="CrossDecoder"):
        to_torch_transformer(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="memory_mask must have shape"):
        ours(torch.randn(2, T, D), torch.randn(2, S, D), memory_mask=torch.zeros(S, T))
    with pytest.raises(TypeError, match="dtype"):
        ours(torch.randn(2, T, D, dtype=torch.float64), torch.randn(2, S, D))
    with pytest.raises(ValueError, match="batch size"):
        ours(torch.randn(2, T, D), torch.randn(3, S, D))


def test_attention_support_conventions():
    kw = {"batch": 2, "num_heads": 2, "q_len": 3, "k_len": 4, "dtype": torch.float32,
          "device": torch.device("cpu")}
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[0, 1] = True  # True = not allowed in torch.nn
    kpm = torch.zeros(2, 4, dtype=torch.bool)
    kpm[1, 3] = True
    s = attention_support(mask, kpm, **kw)
    assert s.dtype == torch.bool and s.shape == (2, 1, 3, 4)
    assert not s[0, 0, 0, 1] and not s[1, 0, 2, 3] and s[0, 0, 2, 3]
    f = attention_support(mask.float(), kpm, **kw)
    assert f.dtype == torch.float32 and f[1, 0, 0, 3] == float("-inf")
    assert attention_support(None, None, **kw) is None


def test_contract_and_schemes():
    ref = make_transformer(torch.float64)
    ours = splitformer.from_torch(ref)
    assert ours.evolution is ours.decoder.evolution
    assert ours.encoder_evolution is ours.encoder.evolution
    assert (ours.evolution.num_steps, ours.encoder_evolution.num_steps) == (3, 2)
    assert ours.evolution.scheme.stages == decoder_lie().stages
    src, tgt = data(torch.float64)
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    with torch.no_grad():
        base = ours(src, tgt, tgt_mask=causal)
        fine = ours.refine(2)
        assert (fine.evolution.tau, fine.encoder_evolution.tau) == (0.5, 0.5)
        assert ours.refine(2, encoder_k=1).encoder_evolution.tau == 1.0
        refined = fine(src, tgt, tgt_mask=causal)
        traj = fine.trajectory(src, tgt, tgt_mask=causal)
        etraj = fine.encoder_trajectory(src)
        pre = ours.with_scheme("prenorm")
        assert pre.evolution.scheme.name == "prenorm"
        assert "cross_attention" in pre.evolution.scheme.operators()
        assert pre.encoder_evolution.scheme.name == "prenorm"
        strang = ours.with_scheme("strang")(src, tgt, tgt_mask=causal)
        only_dec = ours.with_scheme(Scheme((Stage("cross_attention"), Stage("norm2", "project"),
                                            Stage("attention"), Stage("norm1", "project"),
                                            Stage("ffn"), Stage("norm3", "project"))))
        assert only_dec.encoder_evolution.scheme is ours.encoder_evolution.scheme
        both = ours.with_scheme(decoder_lie("heun"), encoder_scheme="prenorm")
        assert both.encoder_evolution.scheme.name == "prenorm"
        pre_out = pre(src, tgt, tgt_mask=causal)
    assert torch.isfinite(refined).all() and maxdiff(base, refined) > 1e-6
    assert len(traj) == 7 and traj.states.shape == (7, B, T, D) and len(etraj) == 5
    assert torch.isfinite(strang).all() and maxdiff(base, strang) > 1e-6
    assert maxdiff(base, pre_out) > 1e-6
    # parameters are shared, the original is untouched
    assert all(p is q for p, q in zip(fine.parameters(), ours.parameters(), strict=True))
    assert ours.evolution.num_steps == 3
    assert splitformer.to_torch(ours.with_scheme("prenorm")).encoder.layers[0].norm_first
    ours.validating()
    assert ours.evolution.validate and ours.encoder_evolution.validate


def test_random_weight_builders():
    dec = network_decoder(D, H, FF, 2, norm_first=True, batch_first=False)
    back = splitformer.to_torch(dec)
    assert isinstance(back, nn.TransformerDecoder) and back.layers[0].norm_first
    pair = encoder_decoder(D, H, 1, 2, FF, bias=False)
    t = splitformer.to_torch(pair)
    assert isinstance(t, nn.Transformer) and t.decoder.layers[0].linear1.bias is None
    assert set(DECODER_LAYER_MAP) and t.encoder.norm.bias is None
