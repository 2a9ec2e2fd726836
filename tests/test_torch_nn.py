"""from_torch / to_torch against torch.nn.TransformerEncoder(Layer), on random configurations."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

import splitformer
from splitformer.verification.references import TOL, perturb_


def _random_config(seed: int) -> dict:
    rng = random.Random(seed)
    nhead = rng.choice([1, 2, 3, 4])
    d = nhead * rng.choice([4, 6, 8])
    return {
        "d_model": d,
        "nhead": nhead,
        "dim_feedforward": rng.choice([d, 2 * d + 3, 4 * d, 17]),
        "activation": rng.choice(["relu", "gelu"]),
        "norm_first": rng.random() < 0.5,
        "batch_first": rng.random() < 0.5,
        "bias": rng.random() < 0.8,
        "layer_norm_eps": rng.choice([1e-5, 1e-6, 1e-3]),
        "num_layers": rng.choice([1, 2, 3]),
        "final_norm": rng.random() < 0.5,
        # batch >= 2 and seq >= 3: padding really pads, and softmax has more than one key
        "batch": rng.choice([2, 3]),
        "seq": rng.choice([3, 5, 8]),
    }


def _build(cfg: dict, dtype: torch.dtype) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(
        cfg["d_model"], cfg["nhead"], cfg["dim_feedforward"], dropout=0.0,
        activation=cfg["activation"], layer_norm_eps=cfg["layer_norm_eps"],
        batch_first=cfg["batch_first"], norm_first=cfg["norm_first"], bias=cfg["bias"],
        dtype=dtype,
    )
    norm = None
    if cfg["final_norm"]:
        norm = nn.LayerNorm(cfg["d_model"], eps=cfg["layer_norm_eps"], bias=cfg["bias"],
                            dtype=dtype)
    enc = nn.TransformerEncoder(layer, cfg["num_layers"], norm=norm, enable_nested_tensor=False)
    # TransformerEncoder deep-copies one layer: perturb every parameter of every layer, so that
    # a wrong layer or weight map (biases and norms included) cannot pass
    return perturb_(enc, seed=cfg["num_layers"])


def _inputs(cfg, dtype, *, padded: bool):
    b, n, d = cfg["batch"], cfg["seq"], cfg["d_model"]
    x = torch.randn(b, n, d, dtype=dtype)
    kpm = None
    if padded:
        kpm = torch.zeros(b, n, dtype=torch.bool)
        for i in range(1, b):  # row i pads its last i tokens (row 0 none; every row keeps one)
            kpm[i, n - min(i, n - 1):] = True
    if not cfg["batch_first"]:
        x = x.transpose(0, 1).contiguous()
    return x, kpm


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", ["train", "eval", "eval_no_grad"])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_from_torch_matches(seed, mode, padded, dtype):
    torch.manual_seed(seed)
    cfg = _random_config(seed)
    enc = _build(cfg, dtype)
    ours = splitformer.from_torch(enc)
    x, kpm = _inputs(cfg, dtype, padded=padded)
    enc.train(mode == "train")
    ours.train(mode == "train")
    ctx = torch.no_grad() if mode == "eval_no_grad" else torch.enable_grad()
    with ctx:
        ref = enc(x, src_key_padding_mask=kpm)
        out = ours(x, src_key_padding_mask=kpm)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert (out - ref).abs().max().item() <= TOL[dtype]


@pytest.mark.parametrize("norm_first", [False, True])
def test_fused_inference_path_with_nested_tensor(norm_first, dtype):
    """torch.nn's eval fast path packs padded batches into nested tensors and returns 0 on
    padded tokens; on every real token the values agree."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 40, dropout=0.1, batch_first=True,
                                       norm_first=norm_first, dtype=dtype)
    enc = perturb_(nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)).eval()
    ours = splitformer.from_torch(enc).eval()
    x = torch.randn(3, 7, 16, dtype=dtype)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, 4:] = True
    kpm[2, 2:] = True
    with torch.no_grad():
        ref, out = enc(x, src_key_padding_mask=kpm), ours(x, src_key_padding_mask=kpm)
    keep = ~kpm
    assert (out[keep] - ref[keep]).abs().max().item() <= TOL[dtype]


@pytest.mark.parametrize("mask_kind", ["bool", "float", "bool3d", "causal", "causal_flag"])
def test_attention_masks(mask_kind, dtype):
    torch.manual_seed(1)
    n, b, h, d = 6, 2, 2, 8
    layer = nn.TransformerEncoderLayer(d, h, 24, dropout=0.0, batch_first=True, dtype=dtype)
    enc = perturb_(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)).eval()
    ours = splitformer.from_torch(enc).eval()
    x = torch.randn(b, n, d, dtype=dtype)
    causal = nn.Transformer.generate_square_subsequent_mask(n, dtype=dtype)
    kw: dict = {}
    if mask_kind == "bool":
        kw["mask"] = torch.rand(n, n) < 0.3
        kw["mask"].fill_diagonal_(False)
    elif mask_kind == "float":
        kw["mask"] = torch.randn(n, n, dtype=dtype)
    elif mask_kind == "bool3d":
        m = torch.rand(b * h, n, n) < 0.3
        m[:, torch.arange(n), torch.arange(n)] = False
        kw["mask"] = m
    elif mask_kind == "causal":
        kw["mask"] = causal
    else:
        kw.update(mask=causal, is_causal=True)
    kpm = torch.zeros(b, n, dtype=torch.bool)
    kpm[1, -2:] = True
    kw["src_key_padding_mask"] = kpm
    ref = enc(x, **kw)  # grad enabled: torch's reference (non-fused) path
    with torch.no_grad():
        out = ours(x, **kw)
    assert (out - ref).abs().max().item() <= TOL[dtype]
    if mask_kind not in ("float", "bool3d"):
        # torch's fused inference path agrees too (with a general float mask or a per-head mask it
        # returns NaN in torch 2.13, so those cases are compared on the reference path only)
        with torch.no_grad():
            fast = enc(x, **kw)
        assert (out - fast).abs().max().item() <= TOL[dtype]


def test_is_causal_without_mask_is_the_volterra_support(dtype):
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, dtype=dtype)
    ours = splitformer.from_torch(layer).eval()
    x = torch.randn(2, 5, 8, dtype=dtype)
    mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=dtype)
    with torch.no_grad():
        ref = layer.eval()(x, src_mask=mask, is_causal=True)
        assert (ours(x, is_causal=True) - ref).abs().max().item() <= TOL[dtype]
        assert (ours(x, src_mask=mask) - ref).abs().max().item() <= TOL[dtype]


def test_layer_and_unbatched(dtype):
    torch.manual_seed(3)
    layer = nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0, dtype=dtype).eval()  # seq first
    ours = splitformer.from_torch(layer).eval()
    x = torch.randn(5, 2, 12, dtype=dtype)
    with torch.no_grad():
        assert (ours(x) - layer(x)).abs().max().item() <= TOL[dtype]
        xu = x[:, 0]
        assert (ours(xu) - layer(xu)).abs().max().item() <= TOL[dtype]


def test_backward_gradients_match():
    """Backprop through the scheme (the discrete adjoint) gives torch.nn's gradients."""
    torch.manual_seed(4)
    cfg = _random_config(4)
    enc = _build(cfg, torch.float64).train()
    ours = splitformer.from_torch(enc).train()
    x, _ = _inputs(cfg, torch.float64, padded=False)
    enc(x).square().sum().backward()
    ours(x).square().sum().backward()
    named = dict(enc.named_parameters())
    for n, theta in enumerate(ours.evolution.controls):
        pairs = {
            "self_attn.in_proj_weight": theta["attention"].qkv_weight,
            "self_attn.out_proj.weight": theta["attention"].out_weight,
            "linear1.weight": theta["ffn"].stages[0].weight,
            "linear2.weight": theta["ffn"].stages[1].weight,
            "norm1.weight": theta["norm1"].weight,
            "norm2.weight": theta["norm2"].weight,
            "self_attn.in_proj_bias": theta["attention"].qkv_bias,
            "self_attn.out_proj.bias": theta["attention"].out_bias,
            "linear1.bias": theta["ffn"].stages[0].bias,
            "linear2.bias": theta["ffn"].stages[1].bias,
            "norm1.bias": theta["norm1"].bias,
            "norm2.bias": theta["norm2"].bias,
        }
        for k, p in pairs.items():
            if p is None:  # bias=False configuration
                continue
            ref = named[f"layers.{n}.{k}"].grad
            assert (p.grad - ref).abs().max().item() <= 1e-10, k


@pytest.mark.parametrize("seed", range(6))
def test_round_trip_is_identity_on_state_dict(seed):
    cfg = _random_config(seed)
    enc = _build(cfg, torch.float32)
    back = splitformer.to_torch(splitformer.from_torch(enc))
    a, b = enc.state_dict(), back.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert type(back) is type(enc)
    layer = enc.layers[0]
    back_layer = splitformer.to_torch(splitformer.from_torch(layer))
    assert isinstance(back_layer, nn.TransformerEncoderLayer)
    for k, v in layer.state_dict().items():
        assert torch.equal(v, back_layer.state_dict()[k])


def test_converted_model_contract():
    enc = _build(_random_config(5), torch.float64)
    m = splitformer.from_torch(enc)
    evo = m.evolution
    assert evo.tau == 1.0 and evo.num_steps == len(enc.layers)
    assert evo.scheme.name in ("lie", "prenorm") and len(evo.controls) == len(enc.layers)
    r = m.refine(4)
    assert r.evolution.num_steps == 4 * len(enc.layers) and r.evolution.tau == 0.25
    assert all(p is q for p, q in zip(r.evolution.controls.parameters(), evo.controls.parameters(),
                                      strict=True))  # shared parameters
    p = m.with_scheme("prenorm" if evo.scheme.name == "lie" else "lie")
    assert p.evolution.scheme.name != evo.scheme.name


def test_per_layer_eps_survives_the_round_trip(dtype):
    """eps is not in the state dict: the round trip must carry it per layer and per norm."""
    torch.manual_seed(6)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                           batch_first=True, dtype=dtype), 2,
                                enable_nested_tensor=False).eval()
    enc.layers[1] = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                               layer_norm_eps=0.1, dtype=dtype).eval()
    enc.layers[1].norm2.eps = 0.5
    x = torch.randn(2, 5, 8, dtype=dtype)
    with torch.no_grad():
        ours = splitformer.from_torch(enc)
        back = splitformer.to_torch(ours).eval()
        assert (ours(x) - enc(x)).abs().max() <= TOL[dtype]
        assert (back(x) - enc(x)).abs().max() <= TOL[dtype]
    assert back.layers[1].norm1.eps == 0.1 and back.layers[1].norm2.eps == 0.5


# -- what the map cannot carry is refused, not dropped ------------------------------------------

class _CustomForwardLayer(nn.TransformerEncoderLayer):
    def forward(self, src, *args, **kwargs):
        return 2 * super().forward(src, *args, **kwargs)


class _CustomBlockLayer(nn.TransformerEncoderLayer):
    def _ff_block(self, x):
        return torch.zeros_like(x)


class _CustomDecoderLayer(nn.TransformerDecoderLayer):
    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal=False):
        return torch.zeros_like(x)


class _CustomEncoder(nn.TransformerEncoder):
    def forward(self, src, *args, **kwargs):
        return super().forward(src, *args, **kwargs).flip(1)


class _CustomTransformer(nn.Transformer):
    def forward(self, src, tgt, *args, **kwargs):
        return super().forward(src, tgt, *args, **kwargs) + 1


class _CustomNorm(nn.LayerNorm):
    def forward(self, x):
        return x


class _RenamedLayer(nn.TransformerEncoderLayer):
    """A subclass that only adds an attribute: torch.nn computes exactly what its base does."""

    tag = "mine"


def _layer(cls=nn.TransformerEncoderLayer, **kw):
    torch.manual_seed(0)
    return cls(8, 2, 16, dropout=0.0, batch_first=True, dtype=torch.float64, **kw).eval()


@pytest.mark.parametrize("make, names", [
    (lambda: _layer(_CustomForwardLayer), "_CustomForwardLayer.*overrides forward"),
    (lambda: nn.TransformerEncoder(_layer(_CustomBlockLayer), 2, enable_nested_tensor=False),
     "_CustomBlockLayer.*overrides _ff_block"),
    (lambda: nn.TransformerDecoder(_CustomDecoderLayer(8, 2, 16, batch_first=True), 2),
     "_CustomDecoderLayer.*overrides _mha_block"),
    (lambda: _CustomEncoder(_layer(), 2, enable_nested_tensor=False),
     "the module of class _CustomEncoder.*overrides forward"),
    (lambda: _CustomTransformer(8, 2, 1, 1, 16, batch_first=True),
     "the module of class _CustomTransformer.*overrides forward"),
], ids=["forward", "_ff_block", "decoder-_mha_block", "encoder-forward", "transformer-forward"])
def test_subclasses_that_change_forward_are_refused(make, names):
    module = make()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    if isinstance(module, nn.TransformerEncoderLayer):  # torch.nn runs the subclass's code
        with torch.no_grad():
            assert not torch.equal(module(x), nn.TransformerEncoderLayer.forward(module, x))
    with pytest.raises(ValueError, match=names):
        splitformer.from_torch(module)


def test_a_submodule_subclass_that_changes_forward_is_refused():
    layer = _layer()
    layer.norm1 = _CustomNorm(8, dtype=torch.float64)
    with pytest.raises(ValueError, match="norm1 of class _CustomNorm: it overrides forward"):
        splitformer.from_torch(layer)


def test_a_subclass_that_keeps_forward_is_converted(dtype):
    layer = _RenamedLayer(8, 2, 16, dropout=0.0, batch_first=True, dtype=dtype).eval()
    perturb_(layer)
    x = torch.randn(2, 5, 8, dtype=dtype)
    with torch.no_grad():
        assert (splitformer.from_torch(layer)(x) - layer(x)).abs().max() <= TOL[dtype]


def test_parametrized_weights_are_read_by_value(dtype):
    """A parametrization (torch.nn.utils.parametrize, weight_norm) is not a hook that is
    dropped: the map copies the weight it computes."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.parametrizations import weight_norm

    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w

    layer = perturb_(_layer().to(dtype))
    parametrize.register_parametrization(layer.linear1, "weight", Doubled())
    weight_norm(layer.linear2)
    x = torch.randn(2, 5, 8, dtype=dtype)
    with torch.no_grad():
        assert (splitformer.from_torch(layer)(x) - layer(x)).abs().max() <= TOL[dtype]


@pytest.mark.parametrize("where, register, label", [
    ("", lambda m: m.register_forward_hook(lambda mod, args, out: 2 * out), "forward hook"),
    ("", lambda m: m.register_forward_pre_hook(lambda mod, args: (2 * args[0],)),
     "forward pre-hook"),
    ("layers.1.linear1", lambda m: m.register_forward_hook(lambda mod, args, out: out + 1),
     "forward hook"),
    ("layers.0.norm2", lambda m: m.register_full_backward_hook(lambda mod, gi, go: gi),
     "backward hook"),
    ("layers.0", lambda m: m.register_state_dict_post_hook(lambda mod, sd, prefix, meta: None),
     "state-dict hook"),
], ids=["forward", "pre-forward", "submodule-forward", "backward", "state-dict"])
def test_hooks_are_refused(where, register, label):
    enc = nn.TransformerEncoder(_layer(), 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        before = enc(x)
    register(enc.get_submodule(where))
    if "forward" in label:  # the hook changes what torch.nn computes
        with torch.no_grad():
            assert not torch.equal(enc(x), before)
    with pytest.raises(ValueError, match=f"{label}s registered on {where or 'the module'}"):
        splitformer.from_torch(enc)


def test_hooks_on_a_transformer_are_refused():
    t = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)
    t.decoder.layers[0].multihead_attn.register_forward_hook(lambda mod, args, out: out)
    with pytest.raises(ValueError, match="forward hooks registered on "
                                         "decoder.layers.0.multihead_attn"):
        splitformer.from_torch(t)


def test_to_torch_names_the_number_of_ffn_stages():
    model = splitformer.paper_encoder(8, 2, 16, 2, num_ffn_stages=3)
    with pytest.raises(ValueError, match=r"to_torch needs J = 2 feed-forward stages .*got J = 3"):
        splitformer.to_torch(model)
    from splitformer.models.encoder import Encoder, encoder_controls
    from splitformer.time import Evolution, TimeGrid, lie

    controls = encoder_controls(8, 2, 16, 2, ffn_widths=[8, 16, 12, 10, 8])
    model = Encoder(Evolution(controls, lie(), TimeGrid(2, 2)))
    with pytest.raises(ValueError, match=r"J = 2 feed-forward stages .*got J = 4"):
        splitformer.to_torch(model)
