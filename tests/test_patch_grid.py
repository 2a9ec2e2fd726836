"""Refinement in x for the ViT families (docs/space.md): the position table read as samples of
p(x) and resampled, the patch kernel PI-resized (``models.resample``), ``with_patch_size`` /
``with_image_size`` against timm's own resampling (``resample_patch_embed``,
``resample_abs_pos_embed``, ``checkpoint_filter_fn``) and transformers' ViTModel with
``interpolate_pos_encoding=True``; the token grid (``token_weights`` / ``token_coords``) in
the ViT forward pass and its quadrature read-out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import splitformer
from splitformer.models.resample import Resampling, pi_resize, resample_grid, resize_matrix
from splitformer.models.vit import build_vit
from splitformer.operators.base import Context
from splitformer.operators.token_grid import split_node
from splitformer.verification.references import TOL, maxdiff, perturb_

try:
    import timm  # noqa: F401  (conftest's torchvision stand-in)
    from timm.layers import resample_abs_pos_embed, resample_patch_embed
    from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
except Exception as e:  # pragma: no cover - depends on the environment
    pytest.skip(f"timm cannot be imported: {e}", allow_module_level=True)

RULES = [Resampling("bicubic", True), Resampling("bicubic", False),
         Resampling("bilinear", True), Resampling("bilinear", False)]
SIZES = [((7, 7), (4, 4)), ((7, 7), (14, 14)), ((4, 4), (7, 7)), ((8, 4), (4, 8)),
         ((16, 16), (8, 8)), ((7, 7), (2, 2))]
SMALL = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4,
         "num_classes": 5}


def _vit(dtype=torch.float64, **kw):
    torch.manual_seed(0)
    options = {"image_size": 28, "patch_size": 7, "in_chans": 1, "dim": 16, "depth": 2,
               "num_heads": 2, "hidden_dim": 32, "num_classes": 3, "read_out": "timm", **kw}
    return perturb_(build_vit(**options, dtype=dtype).eval(), seed=3)


def _image(size, dtype=torch.float64, batch=2, channels=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, *size, generator=g, dtype=dtype)


# -- PI-resize and position resampling against timm's functions ---------------------------------
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.interpolation}-aa{int(r.antialias)}")
@pytest.mark.parametrize("old, new", SIZES)
def test_pi_resize_is_timms_resample_patch_embed(old, new, rule):
    """timm computes in float32 (its pinv too); ours in float64, cast back: they agree to
    float32 round-off (measured: <= 1e-6 relative)."""
    w = torch.randn(6, 2, *old, generator=torch.Generator().manual_seed(0))
    ref = resample_patch_embed(w, list(new), interpolation=rule.interpolation,
                               antialias=rule.antialias)
    ours = pi_resize(w, new, rule)
    assert ours.shape == ref.shape == (6, 2, *new)
    assert maxdiff(ours, ref) <= 5e-6 * float(ref.abs().max())


@pytest.mark.parametrize("old, new", SIZES)
def test_pi_resize_keeps_the_token_of_a_resized_patch(old, new):
    """<z, K> = <resize(z), K'> for every patch z when the kernel is refined (B has full column
    rank), with resize = torch's F.interpolate; when it is coarsened K' is the least-squares
    solution: B^T K' is the orthogonal projection of K onto the range of B^T."""
    rule = Resampling("bicubic", True)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3, *old, generator=g, dtype=torch.float64)
    z = torch.randn(40, 3, *old, generator=g, dtype=torch.float64)
    big = F.interpolate(z, size=new, mode="bicubic", align_corners=False, antialias=True)
    k2 = pi_resize(w, new, rule)
    tokens = torch.einsum("bchw,ochw->bo", z, w)
    resized = torch.einsum("bchw,ochw->bo", big, k2)
    b = resize_matrix(old, new, rule)
    assert maxdiff(b @ z[0, 0].reshape(-1), big[0, 0].reshape(-1)) <= 1e-12
    if new[0] * new[1] >= old[0] * old[1] and torch.linalg.matrix_rank(b) == b.shape[1]:
        assert maxdiff(tokens, resized) <= 1e-10 * float(tokens.abs().max())
    else:
        back = (k2.flatten(2) @ b).reshape(w.shape)  # B^T K' (rows of K' times B)
        residual = (w - back).flatten(2)
        assert float(residual.abs().max()) > 1e-3  # not exact: a coarser kernel loses detail
        # normal equations: the residual is orthogonal to the range of B^T
        assert float((residual @ b.T).abs().max()) <= 1e-10 * float(w.abs().max())


def test_pi_resize_at_the_same_size_is_the_tensor_itself():
    w = torch.randn(4, 1, 7, 7)
    assert pi_resize(w, 7) is w
    t = torch.randn(1, 16, 8)
    assert resample_grid(t, (4, 4), (4, 4)) is t


@pytest.mark.parametrize("prefix", [0, 1, 3])
@pytest.mark.parametrize("new", [(7, 7), (2, 2), (3, 5)])
def test_position_resampling_is_timms_resample_abs_pos_embed(prefix, new):
    """The patch rows of the table resampled, the prefix rows kept: bit for bit timm's
    (float32, both rules)."""
    for rule in (Resampling("bicubic", True), Resampling("bicubic", False)):
        m = _vit(torch.float32, class_token=prefix > 0, reg_tokens=max(prefix - 1, 0),
                 pool="avg")
        e = m.embedding
        ref = resample_abs_pos_embed(e.position.detach(), list(new), old_size=[4, 4],
                                     num_prefix_tokens=prefix, antialias=rule.antialias)
        e.patch.resampling = rule
        assert torch.equal(e.position_on(new).detach(), ref)


# -- the model on another grid against timm and transformers -----------------------------------
def _timm(**overrides):
    torch.manual_seed(0)
    return perturb_(VisionTransformer(**{**SMALL, **overrides}).eval(), seed=2)


def _timm_at(tm0, overrides, **size):
    """timm's own model at another patch or image size, its weights through timm's
    checkpoint_filter_fn (resample_patch_embed, resample_abs_pos_embed)."""
    tm = VisionTransformer(**{**SMALL, **overrides, **size}).eval()
    tm.load_state_dict(checkpoint_filter_fn(tm0.state_dict(), tm))
    return tm


TIMM_CONFIGS = {
    "token": {},
    "registers_no_embed_class_avg": {"reg_tokens": 2, "no_embed_class": True,
                                     "global_pool": "avg"},
    "avg_class_token_layerscale": {"global_pool": "avg", "fc_norm": False, "init_values": 0.1},
}


@pytest.mark.parametrize("name", list(TIMM_CONFIGS))
def test_with_patch_size_and_image_size_are_timms_resampled_model(name):
    tm0 = _timm(**TIMM_CONFIGS[name])
    ours = splitformer.from_timm(tm0)
    with torch.no_grad():
        for size, derived in (({"patch_size": 4}, ours.with_patch_size(4)),
                              ({"patch_size": 16}, ours.with_patch_size(16)),
                              ({"img_size": 48}, ours.with_image_size(48)),
                              ({"img_size": 48, "patch_size": 12},
                               ours.with_image_size(48).with_patch_size(12))):
            ref = _timm_at(tm0, TIMM_CONFIGS[name], **size)
            x = _image(ref.patch_embed.img_size, torch.float32, channels=3)
            a, b = ref(x), derived(x)
            assert a.shape == b.shape
            assert maxdiff(a, b) <= 1e-4 * (1 + float(a.abs().max())), (name, size)
            fa, fb = ref.forward_features(x), derived.forward_features(x)
            assert fa.shape == fb.shape and maxdiff(fa, fb) <= 1e-4 * (1 + float(fa.abs().max()))


def test_hf_with_image_size_is_interpolate_pos_encoding(dtype):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=48, image_size=32, patch_size=8)
    config._attn_implementation = "sdpa"
    ref = perturb_(transformers.ViTModel(config).to(dtype).eval(), seed=2)
    ours = splitformer.from_hf(ref)
    for size in [(48, 48), (32, 48), (16, 64), (24, 24)]:
        x = _image(size, dtype, channels=3)
        with torch.no_grad():
            a = ref(x, interpolate_pos_encoding=True)
            b = ours.with_image_size(size)(x)
        assert maxdiff(a.last_hidden_state, b.last_hidden_state) <= TOL[dtype], size
        assert maxdiff(a.pooler_output, b.pooler_output) <= TOL[dtype], size


# -- identity, sharing, gradients ---------------------------------------------------------------
@pytest.mark.parametrize("read_out", ["timm", "hf"])
def test_at_the_trained_size_it_is_the_identity_bitwise(read_out):
    m = _vit(read_out=read_out, pool="avg", reg_tokens=1)
    x = _image((28, 28))
    same = [m.with_patch_size(7), m.with_image_size(28), m.with_patch_size(4).with_patch_size(7),
            m.with_image_size(56).with_image_size(28)]
    with torch.no_grad():
        ref = m(x)
        for d in same:
            out = d(x)
            assert torch.equal(out if read_out == "timm" else out.logits,
                               ref if read_out == "timm" else ref.logits)
            assert d.embedding.on_base_grid


def test_shared_and_derived_and_the_gradient_reaches_the_base():
    """Every parameter is shared (the same tensors); the kernel and position rows of the new
    grid are computed from them in forward: the derivative of the derived model's output in
    the base kernel and table matches a central difference, and an optimiser step on the
    derived model moves the base model."""
    m = _vit()
    d = m.with_patch_size(4)
    assert dict(d.named_parameters()).keys() == dict(m.named_parameters()).keys()
    assert all(a is b for a, b in zip(d.parameters(), m.parameters(), strict=True))
    assert d.embedding.patch.kernel().shape == (16, 1, 4, 4)
    assert not d.embedding.on_base_grid and d.embedding.num_tokens == 1 + 49
    x = _image((28, 28))
    for param in (m.embedding.patch.weight, m.embedding.position):
        direction = torch.randn_like(param)
        d.zero_grad()
        d(x).square().sum().backward()
        analytic = float((param.grad * direction).sum())
        eps = 1e-6
        with torch.no_grad():
            param += eps * direction
            up = float(d(x).square().sum())
            param -= 2 * eps * direction
            down = float(d(x).square().sum())
            param += eps * direction
        assert analytic != 0.0
        assert abs(analytic - (up - down) / (2 * eps)) <= 1e-6 * (1 + abs(analytic))
    before = m.embedding.patch.weight.detach().clone()
    opt = torch.optim.SGD(d.parameters(), lr=0.1)
    opt.zero_grad()
    d(x).sum().backward()
    opt.step()
    assert not torch.equal(before, m.embedding.patch.weight.detach())


def test_what_cannot_be_honoured_is_refused_by_name():
    m = _vit()
    with pytest.raises(ValueError, match=r"with_patch_size: patch_size=\(5, 5\) must divide the "
                       r"image size \(28, 28\)"):
        m.with_patch_size(5)
    with pytest.raises(ValueError, match=r"with_image_size: patch_size=\(7, 7\) must divide "
                       r"the image size \(30, 30\)"):
        m.with_image_size(30)
    for bad in (0, -2, 2.5, True, (4, 4, 4), "4"):
        with pytest.raises(ValueError, match="patch_size must be an int"):
            m.with_patch_size(bad)
    with pytest.raises(ValueError, match="image_size must be an int"):
        m.with_image_size(0)
    with pytest.raises(ValueError, match="interpolation must be one of"):
        m.with_patch_size(4, interpolation="nearest")
    with pytest.raises(TypeError, match="antialias must be a bool"):
        m.with_patch_size(4, antialias=1)
    with pytest.raises(ValueError, match=r"doesn't match .*with_image_size\(\(56, 56\)\)"):
        m.with_patch_size(4)(_image((56, 56)))
    tm = splitformer.from_timm(_timm())
    with pytest.raises(ValueError, match="to_timm\\(model\\): the model evaluates on another "
                       "patch grid"):
        splitformer.to_timm(tm.with_patch_size(4))
    splitformer.to_timm(tm.with_patch_size(8))  # the trained size: the model itself


# -- the token grid in the forward pass -----------------------------------------------------
def test_token_weights_and_coords_reach_the_context_and_bad_ones_are_named():
    m = _vit(pool="avg", reg_tokens=1)
    x = _image((28, 28))
    n = m.embedding.num_tokens  # class + register + 16 patches
    with torch.no_grad():
        ref = m(x)
        assert maxdiff(m(x, token_weights=torch.full((n,), 0.3, dtype=torch.float64)),
                       ref) <= 1e-14
        assert maxdiff(m(x, token_weights=torch.full((2, n), 4.0, dtype=torch.float64),
                         token_coords=torch.arange(n, dtype=torch.float64)), ref) <= 1e-14
        u0, ctx = m.initial_condition(x, token_coords=torch.arange(n, dtype=torch.float64) * 2)
        assert ctx.token_weights is None and ctx.token_coords[1] == 2.0
    for kwargs, err, match in (
            ({"token_weights": torch.ones(n - 2, dtype=torch.float64)}, ValueError,
             rf"class and register tokens.*token_weights has shape \({n - 2},\) but the field "
             rf"has {n} nodes"),
            ({"token_coords": torch.ones(3, n, dtype=torch.float64)}, ValueError,
             rf"token_coords has shape \(3, {n}\) .* expected \({n},\) or \(2, {n}\)"),
            ({"token_weights": [1.0] * n}, TypeError, "token_weights must be None or a torch"),
            ({"token_weights": -torch.ones(n, dtype=torch.float64)}, ValueError,
             "token_weights must be >= 0")):
        with pytest.raises(err, match=match):
            m(x, **kwargs)


@pytest.mark.parametrize("pool", ["avg", "avgmax", "token"])
def test_a_weight_two_node_is_two_copies_of_it(pool):
    """w_j = 2 at patch j equals the unweighted network on the grid with node j duplicated
    (split_node: the consistency refinement read backwards): every other node's u(T) and the
    pooled read-out, float64 to 1e-10; the unweighted model on the original grid differs."""
    m = _vit(pool=pool)
    x = _image((28, 28))
    n, j = m.embedding.num_tokens, 6
    w = torch.ones(n, dtype=torch.float64)
    w[j] = 2.0
    with torch.no_grad():
        u0, _ = m.initial_condition(x)
        weighted = m.evolution(u0, Context(token_weights=w))
        u_split, w_split, _, _ = split_node(u0, w, None, j)
        assert torch.equal(w_split, torch.ones(n + 1, dtype=torch.float64))
        copies = m.evolution(u_split, Context())
        others = [i for i in range(n) if i != j]
        assert maxdiff(weighted[:, others], copies[:, [i + (i > j) for i in others]]) <= 1e-10
        pooled = m.forward_head(m.features(weighted), pre_logits=True, token_weights=w)
        pooled_copies = m.forward_head(m.features(copies), pre_logits=True)
        assert maxdiff(pooled, pooled_copies) <= 1e-10
        assert maxdiff(m(x, token_weights=w), m.head(pooled)) <= 1e-12
        assert maxdiff(m.forward_head(m.features(m.evolution(u0, Context())), pre_logits=True),
                       pooled_copies) > 1e-4  # without the weight: another answer


@pytest.mark.parametrize("pool", ["avg", "max", "avgmax"])
def test_a_padding_node_changes_nothing(pool):
    """A patch of weight 0 is padding: what the image holds there changes no other token and
    no pooled read-out (the max runs over the nodes of positive weight)."""
    m = _vit(pool=pool, read_out="hf")
    x = _image((28, 28))
    y = x.clone()
    y[:, :, 7:14, 0:7] = 50.0  # patch (1, 0): token 1 + 4 = 5
    w = torch.ones(m.embedding.num_tokens, dtype=torch.float64)
    w[5] = 0.0
    with torch.no_grad():
        a, b = m(x, token_weights=w), m(y, token_weights=w)
        keep = [i for i in range(m.embedding.num_tokens) if i != 5]
        assert maxdiff(a.last_hidden_state[:, keep], b.last_hidden_state[:, keep]) <= 1e-12
        assert maxdiff(a.pooler_output, b.pooler_output) <= 1e-12
        assert maxdiff(m(x).pooler_output, m(y).pooler_output) > 1e-3


def test_a_resize_cached_under_inference_mode_still_trains():
    """Review finding: B^+ first built under torch.inference_mode() was an inference tensor
    and broke every later backward ('Inference tensors cannot be saved for backward')."""
    from splitformer.models import build_vit
    from splitformer.models.resample import _matrices, _pinv_on

    _matrices.cache_clear()
    _pinv_on.cache_clear()
    torch.manual_seed(0)
    v = build_vit(image_size=16, patch_size=4, in_chans=3, dim=16, depth=1, num_heads=2,
                  hidden_dim=24, num_classes=3).with_patch_size(8)
    x = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        v.eval()(x)
    v.train()(x).logits.sum().backward()
    assert v.embedding.patch.weight.grad is not None
