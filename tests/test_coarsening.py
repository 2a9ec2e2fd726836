"""Coarsening in t (docs/math.md 3.13, docs/depth.md): ``coarsen(k)``, ``drop_steps``,
``as_network``, against the real libraries.

* ``refine(k).coarsen(k)`` is the model, bitwise, for every family of the registry;
* a coarse step of tau = 2 on post-LN Lie is the transformers layer whose output projections
  and biases are doubled (its attention ``output.dense`` and FFN ``output.dense``), with the
  controls of the step's midpoint: under "constant" controls the first of each pair of layers,
  under "linear" the average of the pair; transformers runs it to 1e-5 in float32;
* ``to_hf`` / ``to_torch`` export a coarsened model as ordinary layers that transformers and
  torch.nn run to 1e-5 (float32); ``drop_steps`` is transformers' model without those layers.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_registry import FAMILIES, _run
from torch import nn

import splitformer

transformers = pytest.importorskip("transformers")

F32_TOL = 1e-5


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("k", [2, 3])
def test_refine_then_coarsen_is_the_model_bitwise(name, k):
    model, inputs = FAMILIES[name]()
    back = model.refine(k).coarsen(k)
    assert all(o.evolution.grid == p.evolution.grid
               for o, p in zip(back.evolution_owners(), model.evolution_owners(), strict=True))
    assert torch.equal(_run(back, inputs), _run(model, inputs))


def _hf_bert(layers: int = 4, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=layers,
                                  num_attention_heads=4, intermediate_size=48,
                                  max_position_embeddings=20)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


def _ids() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, 60, (3, 9))


def _scaled_layer(layer: nn.Module, c: float) -> nn.Module:
    """A transformers BertLayer computing LN(u + c A(u)), LN(h + c G(h)): its two output
    projections (attention.output.dense, output.dense) times c."""
    out = copy.deepcopy(layer)
    with torch.no_grad():
        for dense in (out.attention.output.dense, out.output.dense):
            dense.weight.mul_(c)
            dense.bias.mul_(c)
    return out


def _averaged_layer(a: nn.Module, b: nn.Module) -> nn.Module:
    out = copy.deepcopy(a)
    with torch.no_grad():
        for (_, p), (_, q) in zip(out.named_parameters(), b.named_parameters(), strict=True):
            p.copy_((p + q) / 2)
    return out


def _with_layers(hf: nn.Module, layers: list[nn.Module]) -> nn.Module:
    out = copy.deepcopy(hf)
    out.encoder.layer = nn.ModuleList(layers)
    out.config.num_hidden_layers = len(layers)
    return out.eval()


def _close(ours, theirs) -> float:
    return float((ours.last_hidden_state - theirs.last_hidden_state).abs().max())


def test_a_coarse_step_is_the_layer_with_doubled_output_projections():
    """Constant controls: coarse step i of tau = 2 reads theta at t = 2i + 1, the end of unit
    interval 2i + 1, i.e. layer 2i; transformers runs layers 0, 2 with doubled W_O, b_O."""
    hf, ids = _hf_bert(4), _ids()
    ours = splitformer.from_hf(hf).eval().coarsen(2)
    assert (ours.evolution.tau, ours.evolution.num_steps) == (2.0, 2)
    ref = _with_layers(hf, [_scaled_layer(hf.encoder.layer[i], 2.0) for i in (0, 2)])
    with torch.no_grad():
        assert _close(ours(ids), ref(ids)) < F32_TOL


def test_linear_controls_merge_two_steps_into_their_average():
    """with_controls_in_time("linear"): the coarse step's midpoint lies halfway between the
    midpoints of the pair, so its controls are the average of the two layers."""
    hf, ids = _hf_bert(4), _ids()
    ours = splitformer.from_hf(hf).eval().with_controls_in_time("linear").coarsen(2)
    layers = hf.encoder.layer
    ref = _with_layers(hf, [_scaled_layer(_averaged_layer(layers[0], layers[1]), 2.0),
                            _scaled_layer(_averaged_layer(layers[2], layers[3]), 2.0)])
    with torch.no_grad():
        assert _close(ours(ids), ref(ids)) < F32_TOL


@pytest.mark.parametrize("reading", ["constant", "linear"])
def test_to_hf_exports_a_coarsened_model_as_ordinary_layers(reading, tmp_path):
    hf, ids = _hf_bert(4), _ids()
    ours = splitformer.from_hf(hf).eval().with_controls_in_time(reading).coarsen(2)
    out = splitformer.to_hf(ours)
    out.save_pretrained(tmp_path)
    loaded = transformers.AutoModel.from_pretrained(tmp_path, local_files_only=True).eval()
    assert loaded.config.num_hidden_layers == 2
    with torch.no_grad():
        assert _close(ours(ids), loaded(ids)) < F32_TOL
        # and the coarse model is not the fine one (the step size matters)
        assert _close(ours(ids), hf(ids)) > 1e-2


def test_drop_steps_is_the_model_without_those_layers():
    hf, ids = _hf_bert(4), _ids()
    ours = splitformer.from_hf(hf).eval().drop_steps([1, 2])
    assert (ours.evolution.T, ours.evolution.num_steps, len(ours.evolution.controls)) == (2, 2, 2)
    ref = _with_layers(hf, [hf.encoder.layer[0], hf.encoder.layer[3]])
    with torch.no_grad():
        assert _close(ours(ids), ref(ids)) < F32_TOL
        assert _close(splitformer.to_hf(ours)(ids), ref(ids)) < F32_TOL
    # the parameters are shared with the model it came from
    full = splitformer.from_hf(hf)
    dropped = full.drop_steps(0)
    assert dropped.evolution.controls[0]["attention"].qkv_weight is \
        full.evolution.controls[1]["attention"].qkv_weight


@pytest.mark.parametrize("norm_first", [False, True])
def test_to_torch_exports_a_coarsened_encoder(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True,
                                       norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()
    ours = splitformer.from_torch(enc).eval().coarsen(2)
    back = splitformer.to_torch(ours).eval()
    assert len(back.layers) == 2
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        assert float((ours(x) - back(x)).abs().max()) < F32_TOL
        assert float((ours(x) - enc(x)).abs().max()) > 1e-2
    # torch.nn's own layer 0 with doubled out_proj and linear2 is the first coarse step
    ref = copy.deepcopy(enc)
    with torch.no_grad():
        for i in (0, 2):
            for lin in (ref.layers[i].self_attn.out_proj, ref.layers[i].linear2):
                lin.weight.mul_(2)
                lin.bias.mul_(2)
    ref.layers = nn.ModuleList([ref.layers[0], ref.layers[2]])
    ref.num_layers = 2
    with torch.no_grad():
        assert float((ours(x) - ref(x)).abs().max()) < F32_TOL


def test_as_network_of_a_refined_model_is_the_same_function():
    """tau = 1/2: 2L layers with halved output projections (the fold works both ways)."""
    hf, ids = _hf_bert(2), _ids()
    fine = splitformer.from_hf(hf).eval().refine(2)
    net = fine.as_network()
    assert (net.evolution.tau, len(net.evolution.controls)) == (1.0, 4)
    with torch.no_grad():
        assert _close(net(ids), fine(ids)) < F32_TOL
    model = splitformer.from_hf(hf)
    assert model.as_network() is model  # a network already


def test_coarsen_and_drop_refuse_bad_arguments():
    model = splitformer.from_hf(_hf_bert(4))
    with pytest.raises(ValueError, match="must divide the number of steps N_t=4"):
        model.coarsen(3)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="coarsen"):
            model.coarsen(bad)
    with pytest.raises(ValueError, match="outside"):
        model.drop_steps([4])
    with pytest.raises(ValueError, match="given twice"):
        model.drop_steps([1, 1])
    with pytest.raises(ValueError, match="drops every one"):
        model.drop_steps(range(4))
    with pytest.raises(TypeError, match="must be ints"):
        model.drop_steps([True])
    with pytest.raises(TypeError, match="step indices"):
        model.drop_steps(None)
    with pytest.raises(ValueError, match="one step per control set"):
        model.refine(2).drop_steps([0])
    with pytest.raises(ValueError, match="not one explicit Euler substep"):
        model.with_scheme("strang").coarsen(2).as_network()
    strang = model.with_scheme("strang")  # at tau = 1 the network's own function: kept, and
    assert model.as_network() is model and strang.as_network() is strang
    with pytest.raises(ValueError, match="needs the scheme"):  # the exporter names the scheme
        splitformer.to_hf(strang)
    with pytest.raises(ValueError, match="not one explicit Euler substep"):
        splitformer.to_hf(model.with_scheme("strang").coarsen(2))
    cvt, _ = FAMILIES["cvt"]()
    with pytest.raises(ValueError, match="drop_steps: .* evolutions"):
        cvt.drop_steps([0])


def test_numpy_integers_count_as_integers():
    """coarsen, refine and drop_steps read NumPy integers as the ints they are (a step count
    from an np.arange or an argsort); the grid holds a Python int."""
    import numpy as np

    model = splitformer.from_hf(_hf_bert(4))
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    pairs = [(model.coarsen(np.int64(2)), model.coarsen(2)),
             (model.refine(np.int32(2)), model.refine(2)),
             (model.drop_steps(np.array([1, 2])), model.drop_steps([1, 2]))]
    with torch.no_grad():
        for ours, plain in pairs:
            assert type(ours.evolution.num_steps) is int
            assert ours.evolution.num_steps == plain.evolution.num_steps
            assert torch.equal(ours(ids).last_hidden_state, plain(ids).last_hidden_state)


def test_coarsening_keeps_the_merge_schedule():
    """r is per unit of time: a coarse step of tau = 2 merges both intervals' nodes; dropping
    steps keeps the kept intervals' r."""
    model = splitformer.from_hf(_hf_bert(4)).eval()
    merged = model.with_token_merging([1, 2, 3, 4], metric="state", where="step")
    coarse = merged.coarsen(2)
    assert [coarse.evolution.merges_in(i) for i in range(2)] == [3, 7]
    dropped = merged.drop_steps([1])
    assert dropped.evolution.merging.r == (1, 3, 4)
    _, trace = dropped.solve_traced(_ids())
    assert list(trace.steps) == [0, 1, 2]


def test_to_hf_exports_a_coarsened_vit_and_gpt2():
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                 num_hidden_layers=4, num_attention_heads=4,
                                 intermediate_size=48)
    vit = splitformer.from_hf(transformers.ViTModel(cfg).eval()).eval()
    x = torch.randn(2, 3, 16, 16)
    gcfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=4,
                                   n_head=4)
    gpt = splitformer.from_hf(transformers.GPT2Model(gcfg).eval()).eval()
    ids = torch.randint(0, 50, (2, 7))
    for model, inputs in ((vit, (x,)), (gpt, (ids,))):
        for coarse in (model.coarsen(2), model.drop_steps([1]),
                       model.with_controls_in_time("linear").coarsen(2)):
            out = splitformer.to_hf(coarse).eval()
            with torch.no_grad():
                assert _close(coarse(*inputs), out(*inputs)) < F32_TOL


def test_as_network_folds_tau_through_layerscale_and_refuses_a_nonlinear_post():
    """timm's LayerScale (a linear post map) takes the fold: the coarse step equals its
    exported network; a norm after the field (not linear) is refused by name."""
    torch.manual_seed(0)
    from splitformer.models.vit import build_vit

    vit = build_vit(image_size=8, patch_size=4, in_chans=3, dim=16, depth=2, num_heads=2,
                    hidden_dim=24, num_classes=3, read_out="timm", layer_scale=0.5).eval()
    x = torch.randn(2, 3, 8, 8)
    coarse = vit.coarsen(2)
    assert any(st.post for st in coarse.evolution.scheme.stages)
    with torch.no_grad():
        assert float((coarse.as_network()(x) - coarse(x)).abs().max()) < F32_TOL
        assert float((coarse(x) - vit(x)).abs().max()) > 1e-3
    hf = splitformer.from_hf(_hf_bert(2)).eval()
    post = hf.with_scheme("attention<norm1 norm1:project ffn norm2:project").coarsen(2)
    with pytest.raises(ValueError, match="not a linear map"):
        post.as_network()


def test_linear_controls_between_grid_points_merge_on_the_keys():
    """ToMe's keys metric after the attention substep works on blended controls (a coarse
    step of linear controls), and merging nothing is the model itself."""
    model = splitformer.from_hf(_hf_bert(4)).eval().with_controls_in_time("linear").coarsen(2)
    ids = _ids()
    with torch.no_grad():
        merged = model.with_token_merging(2)(ids).last_hidden_state
        assert merged.shape == (3, 9, 32) and torch.isfinite(merged).all()
        assert torch.equal(model.with_token_merging(0)(ids).last_hidden_state,
                           model(ids).last_hidden_state)


def test_parallel_steps_is_torch_nn_layers_run_in_parallel():
    """Pre-LN torch.nn: steps 1..3 superposed are x + sum_k SA_k(LN1_k(x)), then
    h + sum_k FF_k(LN2_k(h)) with torch.nn's own submodules (each pre-norm is its field's
    own), the other layers as they are; shared parameters; not exportable as a layer."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True,
                                       norm_first=True)
    enc = nn.TransformerEncoder(layer, 5, enable_nested_tensor=False).eval()
    model = splitformer.from_torch(enc).eval()
    ours = model.parallel_steps([(1, 2, 3)])
    assert (ours.evolution.T, ours.evolution.num_steps) == (3.0, 3)
    x = torch.randn(2, 7, 16)
    L = enc.layers

    def sa(lay, h):
        y = lay.norm1(h)
        return lay.self_attn(y, y, y, need_weights=False)[0]

    def ff(lay, h):
        return lay.linear2(torch.relu(lay.linear1(lay.norm2(h))))

    with torch.no_grad():
        h = L[0](x)
        h = h + sum(sa(L[k], h) for k in (1, 2, 3))
        h = h + sum(ff(L[k], h) for k in (1, 2, 3))
        ref = L[4](h)
        assert float((ours(x) - ref).abs().max()) < F32_TOL
        assert float((ours(x) - enc(x)).abs().max()) > 1e-3
    fields = ours.evolution.controls[1]
    assert type(fields["attention"]).__name__ == "Superposition"
    assert fields["attention"].fields[2].qkv_weight is \
        model.evolution.controls[3]["attention"].qkv_weight  # shared parameters
    with pytest.raises(ValueError, match="superposition of fields"):
        splitformer.to_torch(ours)
    assert not ours.evolution.is_network


def test_parallel_steps_refuses_bad_groups():
    model = splitformer.from_hf(_hf_bert(4))
    for bad, err, match in [
            ([1, 2], TypeError, "each group is a sequence"),
            (3, TypeError, "a sequence of groups"),
            ("12", TypeError, "a sequence of groups"),
            ([], ValueError, "no group given"),
            ([(1,)], ValueError, "at least two consecutive"),
            ([(0, 2)], ValueError, "at least two consecutive"),
            ([(0, 1), (1, 2)], ValueError, "in two groups"),
            ([(3, 4)], ValueError, "outside"),
            ([(1, 1)], ValueError, "given twice"),
            ([(True, 1)], TypeError, "must be ints")]:
        with pytest.raises(err, match=match):
            model.parallel_steps(bad)
    with pytest.raises(ValueError, match="one step per control set"):
        model.refine(2).parallel_steps([(0, 1)])
    with pytest.raises(ValueError, match="merges tokens"):
        model.with_token_merging(2).parallel_steps([(0, 1)])
    cvt, _ = FAMILIES["cvt"]()
    with pytest.raises(ValueError, match="parallel_steps: .* evolutions"):
        cvt.parallel_steps([(0, 1)])
    # two groups at once, in any order, give the same network
    a = model.parallel_steps([(2, 3), (0, 1)])
    b = model.parallel_steps([(0, 1), (2, 3)])
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(a(ids).last_hidden_state, b(ids).last_hidden_state)
    assert a.evolution.num_steps == 2
