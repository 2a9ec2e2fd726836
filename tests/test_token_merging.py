"""Coarsening in x: token merging (ToMe's bipartite soft matching) as a quadrature coarsening.

What is checked against what (nothing here re-implements our merge):
* r = 0 is the model itself, bit for bit;
* the quadrature property: two nodes with equal states merged into one of double weight leave
  every node's output unchanged (float64, 1e-10), and without the weights they do not;
* the published behaviour of ToMe: N - L r nodes after L steps (r clipped to half of the
  unprotected nodes), the merged pairs are the top-r A -> B edges of highest cosine found by
  brute force in Python, the merged state is the size-weighted mean, the sizes add;
* the bookkeeping: the trace maps every input node to a valid node, unmerging restores the
  input's shape, protected and padding nodes never merge;
* the placement survives with_scheme / refine / with_controls_in_time, and what cannot merge
  is refused by name; training with --merge runs and learns.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitformer.models import build_vit, causal_decoder, network_encoder
from splitformer.models.cvt import CvtStageSpec, build_cvt
from splitformer.operators.base import Context
from splitformer.operators.merging import (
    METRICS,
    TokenMerging,
    attention_keys,
    bipartite_soft_matching,
    matching_vectors,
    merge_nodes,
    merge_tokens,
    start_trace,
)
from splitformer.time import SaveAt

D, H, FF, L, N, B = 16, 4, 24, 3, 10, 2


def encoder(norm_first: bool = False, seed: int = 0, layers: int = L):
    torch.manual_seed(seed)
    return network_encoder(D, H, FF, layers, norm_first=norm_first, dtype=torch.float64).eval()


def vit(seed: int = 0, depth: int = 4):
    torch.manual_seed(seed)
    return build_vit(image_size=16, patch_size=4, in_chans=1, dim=32, depth=depth, num_heads=4,
                     hidden_dim=48, num_classes=3, read_out="timm").eval()


def src(seed: int = 1, n: int = N):
    return torch.randn(B, n, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# -- the model itself ---------------------------------------------------------------------------
def test_r0_is_bitwise_the_model():
    m = encoder()
    x = src()
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, -3:] = True
    assert torch.equal(m.with_token_merging(0)(x, src_key_padding_mask=kpm),
                       m(x, src_key_padding_mask=kpm))
    v = vit()
    img = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    v0 = v.with_token_merging(0)
    assert torch.equal(v0(img), v(img))
    assert "merge(r=0, metric=keys, protect=1)" in repr(v0.evolution)
    assert v0.merge_trace(img) is None  # nothing merged: no trace


# -- the quadrature property ---------------------------------------------------------------------
@settings(max_examples=8, deadline=None)
@given(j=st.integers(0, N - 2), norm_first=st.booleans(), metric=st.sampled_from(METRICS),
       where=st.sampled_from(["attention", "step"]), seed=st.integers(0, 3))
def test_merging_two_equal_nodes_with_their_weights_changes_nothing(j, norm_first, metric, where,
                                                                   seed):
    """Nodes j, j+1 (one in A, one in B) hold the same state: the merge takes them (cosine 1),
    and one node of weight 2 is the quadrature of the two, so every output is unchanged; with
    weight 1 (proportional=False, ToMe's ablation) every other node's output changes."""
    m = encoder(norm_first, seed)
    x = src(seed + 1)
    x[:, j + 1] = x[:, j]
    plain = m(x)
    once = (1,) + (0,) * (L - 1)
    merged = m.with_token_merging(once, metric=metric, where=where)
    out, trace = merged.solve_traced(x)
    assert trace.nodes == [N - 1]
    assert torch.equal(trace.index[0][:, j], trace.index[0][:, j + 1])  # the equal pair merged
    assert (out - plain).abs().max() < 1e-10
    assert trace.mass.sum(1).tolist() == [float(N)] * B
    ablation = m.with_token_merging(once, metric=metric, where=where, proportional=False)(x)
    others = [i for i in range(N) if i not in (j, j + 1)]
    assert (ablation - plain)[:, others].abs().amax(-1).min() > 1e-6


def test_the_weights_after_merging_sum_to_the_input_weights():
    m = encoder()
    x = src()
    w = torch.rand(B, N, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) + 0.1
    for proportional in (True, False):
        evo = m.with_token_merging(2, proportional=proportional).evolution
        ctx = Context(token_weights=w.clone())
        u = evo(x, ctx)
        assert u.shape == (B, N - 2 * L, D)
        trace = ctx.merge_trace
        torch.testing.assert_close(trace.mass.sum(1), w.sum(1), rtol=1e-14, atol=0)
        if proportional:  # the kernels integrate against the merged weights
            assert torch.equal(ctx.token_weights, trace.mass)
        else:  # no weights added: each node keeps the weight of the node it was kept as
            idx = trace.index[-1]
            for b in range(B):
                for k in range(N - 2 * L):
                    into = {w[b, i].item() for i in range(N) if idx[b, i] == k}
                    assert ctx.token_weights[b, k].item() in into


def test_merged_state_is_the_size_weighted_mean_and_others_are_untouched():
    g = torch.Generator().manual_seed(5)
    u = torch.randn(1, 6, 4, dtype=torch.float64, generator=g)
    w = torch.tensor([[1.0, 2.0, 0.5, 1.5, 3.0, 1.0]], dtype=torch.float64)
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]], dtype=torch.float64)
    ctx = Context(token_weights=w, token_coords=x)
    start_trace(u, ctx, TokenMerging(1, metric="state"))
    out = merge_tokens(u, ctx, 1, None, step=0)
    idx = ctx.merge_trace.index[0][0].tolist()
    a = next(i for i in range(6) if idx.count(idx[i]) == 2)
    b = next(i for i in range(6) if idx.count(idx[i]) == 2 and i != a)
    node = idx[a]
    wa, wb = w[0, a], w[0, b]
    torch.testing.assert_close(out[0, node], (wa * u[0, a] + wb * u[0, b]) / (wa + wb))
    torch.testing.assert_close(ctx.token_coords[0, node], (wa * x[0, a] + wb * x[0, b]) / (wa + wb))
    assert ctx.token_weights[0, node] == wa + wb
    for i in range(6):
        if i not in (a, b):
            assert torch.equal(out[0, idx[i]], u[0, i])  # bit for bit
            assert ctx.token_weights[0, idx[i]] == w[0, i]
    src_node = a if a % 2 == 0 else b  # A: the 1st, 3rd, ... node; it goes into its B node
    assert [idx[i] for i in range(6) if i != src_node] == list(range(5))  # the order is kept


# -- ToMe's published behaviour ------------------------------------------------------------------
def _brute_force(metric: torch.Tensor, mergeable: list[bool], r: int) -> set[tuple[int, int]]:
    """ToMe's bipartite soft matching, by the book: A and B alternate over the mergeable
    nodes, each a in A takes its most similar b in B, the r best such edges merge."""
    free = [i for i, ok in enumerate(mergeable) if ok]
    a_set, b_set = free[0::2], free[1::2]
    v = metric.tolist()

    def cos(i, k):
        dot = sum(p * q for p, q in zip(v[i], v[k], strict=True))
        return dot / math.sqrt(sum(p * p for p in v[i]) * sum(q * q for q in v[k]))
    best = [(max(cos(a, b) for b in b_set), a, max(b_set, key=lambda b: cos(a, b)))
            for a in a_set]
    best.sort(reverse=True)
    return {(a, b) for _, a, b in best[:r]}


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(4, 17), r=st.integers(1, 4),
       protect=st.integers(0, 2), pad=st.integers(0, 3))
def test_the_matching_is_the_top_r_edges_of_highest_cosine(seed, n, r, protect, pad):
    g = torch.Generator().manual_seed(seed)
    metric = torch.randn(2, n, 5, dtype=torch.float64, generator=g)
    ok = torch.ones(2, n, dtype=torch.bool)
    ok[:, :protect] = False
    ok[1, n - pad:] = False  # padding in the second row only
    r = min(r, int(ok.sum(1).min()) // 2)
    if r == 0:
        return
    src_, dst_ = bipartite_soft_matching(metric, r, ok)
    for b in range(2):
        got = set(zip(src_[b].tolist(), dst_[b].tolist(), strict=True))
        assert got == _brute_force(metric[b], ok[b].tolist(), r)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), r=st.integers(1, 4))
def test_keys_and_state_merge_the_keys_partners_of_highest_mean_cosine(seed, r):
    """metric="keys+state" at the start of a step: each node of A takes its partner in B by the
    cosine of the head-averaged keys of the attention operator (its own qkv), as ToMe, and the
    r pairs of highest (2 cos(k_a, k_b) + cos(u_a, u_b)) / 3 merge, found by brute force."""
    m = encoder(seed=seed % 7)
    x = src(seed)
    once = (r,) + (0,) * (L - 1)
    trace = m.with_token_merging(once, metric="keys+state", where="step",
                                 protect=0).merge_trace(x)
    with torch.no_grad():
        keys = m.evolution.controls[0]["attention"].qkv(x)[1].mean(1)
    cos = torch.nn.functional.cosine_similarity
    for b in range(B):
        a_set, b_set = list(range(0, N, 2)), list(range(1, N, 2))
        partner = {a: max(b_set, key=lambda k, a=a: float(cos(keys[b, a], keys[b, k], dim=0)))
                   for a in a_set}
        score = {a: float(2 * cos(keys[b, a], keys[b, partner[a]], dim=0)
                          + cos(x[b, a], x[b, partner[a]], dim=0)) / 3 for a in a_set}
        best = sorted(a_set, key=lambda a: score[a], reverse=True)[:r]
        idx = trace.index[0][b].tolist()
        merged = {(a, k) for a in a_set for k in b_set if idx[a] == idx[k]}
        assert merged == {(a, partner[a]) for a in best}


def test_keys_and_state_in_float16_with_a_zero_row_is_an_ordinary_matching():
    """A zero state and key in float16 (where F.normalize's eps underflows to 0) gives no NaN
    score: nodes pair as in float32, not all into the zero node."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(1, 8, 6, generator=g)
    k = torch.randn(1, 8, 3, generator=g)
    u[:, 1] = 0
    k[:, 1] = 0
    ok = torch.ones(1, 8, dtype=torch.bool)
    partners, rank = matching_vectors("keys+state", u.half(), k.half())
    got = bipartite_soft_matching(partners, 3, ok, rank)
    want = bipartite_soft_matching(k, 3, ok, u)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert int((got[1] == 1).sum()) <= 1


def test_keys_and_state_is_neither_metric_alone():
    """On some input the keys+state matching differs from both the keys' and the state's (so
    the metric is a third rule, not a renamed one)."""
    m = encoder()
    differs = set()
    for seed in range(20):
        x = src(seed)
        pairs = {metric: m.with_token_merging((3, 0, 0), metric=metric, where="step",
                                              protect=0).merge_trace(x).index[0].tolist()
                 for metric in METRICS}
        differs |= {metric for metric in ("keys", "state")
                    if pairs[metric] != pairs["keys+state"]}
    assert differs == {"keys", "state"}


def test_nodes_after_L_steps_are_N_minus_L_r_with_the_clip():
    v = vit(depth=4)
    img = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    trace = v.with_token_merging(2).merge_trace(img)
    assert trace.nodes == [17 - 2 * (k + 1) for k in range(4)]  # 16 patches + the class token
    trace = v.with_token_merging(5).merge_trace(img)  # clipped: half of the unprotected remain
    n, expect = 17, []
    for _ in range(4):
        n -= min(5, (n - 1) // 2)
        expect.append(n)
    assert trace.nodes == expect == [12, 7, 4, 3]


def test_the_trace_maps_every_input_node_and_unmerging_keeps_the_shape():
    m = encoder(layers=3)
    x = src()
    merged = m.with_token_merging([2, 1, 2], metric="state")
    out, trace = merged.solve_traced(x)
    assert out.shape == (B, N, D)
    assert trace.steps == [0, 1, 2] and trace.nodes == [8, 7, 5]
    for idx, n in zip(trace.index, trace.nodes, strict=True):
        assert idx.shape == (B, N)
        for b in range(B):  # onto 0 .. n-1
            assert sorted(set(idx[b].tolist())) == list(range(n))
    coarse = m.with_token_merging([2, 1, 2], metric="state", unmerge=False)
    u = coarse(x)
    assert u.shape == (B, 5, D)
    torch.testing.assert_close(trace.unmerge(u), out, rtol=0, atol=0)
    # the quadrature mean on the merged grid is the mean over the input nodes of the unmerged
    mass = trace.mass
    torch.testing.assert_close((u * mass[..., None]).sum(1) / mass.sum(1, keepdim=True),
                               out.mean(1), rtol=1e-13, atol=1e-13)


def test_protected_and_padding_nodes_never_merge():
    m = encoder()
    x = src()
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, -3:] = True  # row 0: three padded keys
    merged = m.with_token_merging(3, protect=2, metric="state")
    _, trace = merged.solve_traced(x, src_key_padding_mask=kpm)
    assert trace.nodes == [8, 7, 6]  # row 0 has 5 mergeable nodes: r clipped to 2, 1, 1
    for idx in trace.index:
        for b in range(B):
            row = idx[b].tolist()
            lonely = [0, 1] + ([7, 8, 9] if b == 0 else [])
            for i in lonely:
                assert row.count(row[i]) == 1, (b, i, row)
            assert row[:2] == [0, 1]
    assert trace.mass[0, -3:].tolist() == [1.0, 1.0, 1.0]  # each holds its own node only
    # padding as weight-0 nodes (no mask) never merges either
    w = (~kpm).to(torch.float64)
    ctx = Context(token_weights=w)
    merged.evolution(x, ctx)
    rows = ctx.merge_trace.index[-1][0].tolist()
    assert all(rows.count(rows[i]) == 1 for i in (0, 1, 7, 8, 9))
    # an additive (float) key-padding mask gives the same
    fmask = torch.zeros(B, N, dtype=torch.float64).masked_fill(kpm, float("-inf"))
    _, t2 = merged.solve_traced(x, src_key_padding_mask=fmask)
    assert all(torch.equal(a, b) for a, b in zip(t2.index, trace.index, strict=True))


# -- where it sits ---------------------------------------------------------------------------------
def test_with_scheme_refine_and_controls_keep_the_merging():
    v = vit()
    merged = v.with_token_merging(2)
    assert "norm1>attention merge(r=2, metric=keys, protect=1) norm2>ffn" in repr(merged.evolution)
    strang = merged.with_scheme("strang")
    assert "attention:heun merge(r=2" in repr(strang.evolution)
    step = v.with_token_merging(2, where="step", metric="state")
    assert "[merge(r=2, metric=state, protect=1) norm1>attention" in repr(step.evolution)
    img = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    fine = merged.refine(2)
    assert "merge(r=2" in repr(fine.evolution)
    t1, t2 = merged.merge_trace(img), fine.merge_trace(img)
    assert t2.steps == [0, 2, 4, 6]  # the first step of each unit interval
    assert t2.nodes == t1.nodes  # the same grid at every integer time
    lin = merged.with_controls_in_time("linear")
    assert lin.evolution.merging == merged.evolution.merging
    assert merged.with_adjoint("backprop").evolution.merging == merged.evolution.merging
    assert v.with_token_merging(2).with_token_merging(None).evolution.merging is None
    subs = merged.validating(True).trajectory(img, saveat=SaveAt(substeps=True)).substeps
    assert [s.label for s in subs[:3]] == ["norm1>attention", "merge(r=2, metric=keys, protect=1)",
                                          "norm2>ffn"]
    assert [s.state.shape[1] for s in subs[:3]] == [17, 15, 15]  # on the grid of their time


def test_hidden_states_are_unmerged_at_their_times():
    m = vit()
    img = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    merged = m.with_token_merging(3)
    plain_path = m.trajectory(img)
    path = merged.trajectory(img)
    assert path.states.shape == plain_path.states.shape  # every grid point on 17 nodes
    assert torch.equal(path.state_list[0], plain_path.state_list[0])
    _, out_path = merged.solve_along(img, saveat=SaveAt(steps=True))
    torch.testing.assert_close(out_path.states, path.states, rtol=0, atol=0)
    coarse = m.with_token_merging(3, unmerge=False).trajectory(img)
    assert [s.shape[1] for s in coarse.state_list] == [17, 14, 11, 8, 5]
    with pytest.raises(ValueError, match="different sizes"):
        _ = coarse.states


def test_bert_keeps_its_outputs_shapes_and_its_class_token():
    transformers = pytest.importorskip("transformers")
    import splitformer

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3,
                                     num_attention_heads=4, intermediate_size=48,
                                     max_position_embeddings=24)
    hf = transformers.BertModel(config).to(torch.float64).eval()
    bert = splitformer.from_hf(hf)
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    plain = bert(ids, mask, output_hidden_states=True)
    merged = bert.with_token_merging(2, protect=1)
    out = merged(ids, mask, output_hidden_states=True)
    assert out.last_hidden_state.shape == plain.last_hidden_state.shape
    assert [h.shape for h in out.hidden_states] == [h.shape for h in plain.hidden_states]
    assert torch.equal(out.hidden_states[0], plain.hidden_states[0])
    trace = merged.merge_trace(ids, mask)
    assert trace.nodes == [10, 8, 7]  # row 1: 7 mergeable nodes (12 - [CLS] - 4 padded)
    assert all((idx[:, 0] == 0).all() and ((idx == 0).sum(1) == 1).all() for idx in trace.index)
    # the pooler reads [CLS], which stays a node of its own
    torch.testing.assert_close(out.pooler_output, bert.pooler(out.last_hidden_state))
    alibi = merged.with_kernel("alibi")
    assert alibi.evolution.merging == merged.evolution.merging
    assert alibi(ids, mask).last_hidden_state.shape == (2, 12, 32)  # reads the coordinates


def test_keys_metric_is_the_head_mean_of_the_operators_keys():
    m = encoder()
    op = m.evolution.controls[0]["attention"]
    x = src()
    torch.testing.assert_close(attention_keys(op, x, None), op.qkv(x)[1].mean(1))


# -- refusals ------------------------------------------------------------------------------------
def test_refusals_name_what_cannot_merge():
    m = encoder()
    x = src()
    with pytest.raises(ValueError, match="causal"):
        m.with_token_merging(1)(x, is_causal=True, mask=torch.ones(N, N).triu(1).bool())
    with pytest.raises(ValueError, match="key-padding mask"):
        m.with_token_merging(1)(x, mask=torch.zeros(N, N, dtype=torch.bool))
    gpt = causal_decoder(11, 8, 16, 2, 2)
    with pytest.raises(ValueError, match="causal"):
        gpt.with_token_merging(1)(torch.randint(0, 11, (2, 8)))
    with pytest.raises(ValueError, match="adjoint 'checkpoint'"):
        m.with_token_merging(1).with_adjoint("checkpoint")
    with pytest.raises(ValueError, match="adjoint 'checkpoint'"):
        m.with_adjoint("checkpoint").with_token_merging(1)
    with pytest.raises(ValueError, match="runs a step of its own"):
        m.with_token_merging(1).with_scheme("reversible")
    with pytest.raises(ValueError, match="no top-level stage with an attention field"):
        m.with_token_merging(1).with_scheme("parallel")
    m.with_token_merging(1, where="step", metric="state").with_scheme("parallel")(x)  # fine
    with pytest.raises(ValueError, match="no top-level stage with an attention field"):
        m.with_token_merging(1, where="step", metric="keys+state").with_scheme("parallel")
    cvt = build_cvt([CvtStageSpec(1, 16, 2, 1, cls_token=True)], num_labels=3)
    with pytest.raises(ValueError, match="evolution|convolutional"):
        cvt.with_token_merging(1)
    with pytest.raises(ValueError, match="needs the regular token grid"):
        cvt.stages[0].with_token_merging(1)
    for bad, match in (({"r": -1}, "int >= 0"), ({"r": 1.5}, "int >= 0"),
                       ({"r": 1, "metric": "values"}, "metric"),
                       ({"r": 1, "where": "ffn"}, "where"), ({"r": [1, 2]}, "schedule")):
        with pytest.raises(ValueError, match=match):
            m.with_token_merging(bad.pop("r"), **bad)


# -- training ----------------------------------------------------------------------------------
def test_gradients_flow_through_the_merge():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(2, 7, 3, dtype=torch.float64, generator=g, requires_grad=True)
    mass = torch.rand(2, 7, dtype=torch.float64, generator=g) + 0.5
    src_ = torch.tensor([[0, 4], [2, 6]])
    dst_ = torch.tensor([[1, 1], [3, 5]])
    assert torch.autograd.gradcheck(lambda t: merge_nodes([t], mass, src_, dst_)[0][0], (u,))
    m = vit().with_token_merging(3).train()
    img = torch.randn(2, 1, 16, 16, generator=g)
    m(img).square().sum().backward()
    for name, p in m.named_parameters():
        if "head" not in name and "fc_norm" not in name:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert m.evolution.controls[-1]["attention"].qkv_weight.grad.abs().sum() > 0


def test_training_with_merge_runs_and_learns(tmp_path):
    from splitformer.training import ConfigError, TrainConfig
    from splitformer.training.config import settings as config_settings
    from splitformer.training.loop import fit

    assert config_settings()["merge"].flag == "--merge"
    with pytest.raises(ConfigError, match="merge must be >= 0"):
        TrainConfig(merge=-1)
    from splitformer.training.families import build_model

    lm = TrainConfig(family="lm", data="tiny_shakespeare", merge=2)
    with pytest.raises(ConfigError, match="causal"):
        build_model(lm, {"name": "x", "task": "lm", "num_classes": None, "vocab_size": 11,
                         "input_shape": None})
    f = tmp_path / "run.toml"
    f.write_text("[train]\nmerge = 3\n")
    assert TrainConfig.from_toml(f).merge == 3
    cfg = TrainConfig(width=32, heads=2, depth=2, epochs=2, batch_size=64, log_every=1,
                      dropout=0.0, lr=1e-2, warmup=0.0, weight_decay=0.0, merge=3,
                      schedule="constant")
    run = fit(cfg, out=tmp_path / "merge")
    assert "merge(r=3, metric=keys, protect=1)" in repr(run.model.evolution)
    losses = [r["loss"] for r in run.history if "loss" in r]
    head, tail = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert tail < 0.85 * head, losses
    images = torch.zeros(2, 1, 8, 8)  # digits: 8 x 8, patch 2: 16 patches + the class token
    assert run.model.merge_trace(images).nodes == [14, 11]


def _tiny_hf_bert():
    """splitformer.from_hf of a random 2-layer transformers BertModel (vocabulary 40)."""
    import transformers

    import splitformer

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=24)
    return splitformer.from_hf(transformers.BertModel(cfg).eval())


def test_bert_protects_its_class_token_and_vit_features_are_unmerged():
    """BERT declares its [CLS] node a prefix (never merged without protect=); ViT's
    forward_features and outputs read out on the input grid like forward."""

    from splitformer.models import build_vit

    m = _tiny_hf_bert().with_token_merging(3)
    ids = torch.randint(0, 40, (2, 12))
    trace = m.merge_trace(ids)
    assert m.num_prefix_tokens == 1
    for index in trace.index:  # node 0 ([CLS]) is alone in its node after every merge
        assert (index[:, 1:] != index[:, :1]).all()
    v = build_vit(image_size=8, patch_size=2, in_chans=3, dim=16, depth=2, num_heads=2,
                  hidden_dim=24, num_classes=3, read_out="hf", dtype=torch.float64).eval()
    vm = v.with_token_merging(3)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        full = vm(x).last_hidden_state
        assert full.shape == v(x).last_hidden_state.shape
        assert torch.equal(vm.forward_features(x), full)
        assert torch.equal(vm.outputs(x).last_hidden_state, full)


def test_families_without_a_patch_grid_refuse_with_patch_size_by_name():
    from splitformer.models.cvt import CvtStageSpec, build_cvt

    specs = [CvtStageSpec(3, 8, 1, 1, patch_size=3, patch_stride=2)]
    m = build_cvt(specs, num_labels=3)
    for call in (lambda: m.with_patch_size(4), lambda: m.with_image_size(32)):
        with pytest.raises(ValueError, match="has no patch grid.*CvT"):
            call()


def test_what_reads_the_path_or_brings_a_causal_kernel_refuses_merging():
    """Review findings: a causal ALiBi kernel (its own support x' <= x, not is_causal) is
    refused by with_token_merging, and at run time when with_kernel installs it after the
    merging; convergence, adaptive depth and analyze refuse a merging model by name (they
    compared or read states on token grids that differ)."""
    from splitformer.analysis import adaptive_depth, analyze, convergence
    from splitformer.analysis.checks import ArgumentError
    from splitformer.models.encoder import network_encoder

    torch.manual_seed(0)
    enc = network_encoder(16, 4, 24, 2, dtype=torch.float64).eval()
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="causal support of its own"):
        enc.with_kernel("alibi", causal=True).with_token_merging(2, metric="state")
    causal = enc.with_token_merging(2, metric="state").with_kernel("alibi", causal=True)
    with pytest.raises(ValueError, match="causal support of its own"):
        causal(x)
    merged = enc.with_token_merging(2)
    with pytest.raises(ArgumentError, match="merges tokens"):
        convergence(merged, x, ks=(1, 2), ref_k=3)
    with pytest.raises(ArgumentError, match="merges tokens"):
        analyze(merged, (x,))
    with pytest.raises(ArgumentError, match="merges tokens"):
        adaptive_depth(merged, x, 0.1)


def test_a_causal_lm_refuses_labels_on_a_token_grid():
    from splitformer.models import causal_decoder

    torch.manual_seed(0)
    m = causal_decoder(31, 12, 16, 2, 2, lm_head=True).eval()
    ids = torch.randint(0, 31, (1, 6))
    assert m(ids, labels=ids).loss is not None
    with pytest.raises(ValueError, match="labels with token_weights"):
        m(ids, labels=ids, token_weights=torch.ones(6))


def test_exports_train_flags_and_unmerge_refuse_what_they_cannot_honour():
    """Trial findings: to_torch / to_hf wrote a network without the merge; --merge with the
    checkpoint adjoint was a traceback; MergeTrace.unmerge accepted a state of the wrong
    size and returned it silently misread."""

    import splitformer
    from splitformer.models.encoder import network_encoder
    from splitformer.training.config import ConfigError, TrainConfig

    torch.manual_seed(0)
    enc = network_encoder(16, 4, 24, 2).eval()
    merged = enc.with_token_merging(2)
    with pytest.raises(ValueError, match="merges tokens"):
        splitformer.to_torch(merged)
    bert = _tiny_hf_bert()
    with pytest.raises(ValueError, match="merges tokens"):
        splitformer.to_hf(bert.with_token_merging(2))
    splitformer.to_hf(bert)  # the unmerged model still exports
    with pytest.raises(ConfigError, match="adjoint 'backprop'"):
        TrainConfig(merge=2, adjoint="checkpoint")
    m = network_encoder(16, 4, 24, 2).eval().with_token_merging(2, unmerge=False)
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        out, trace = m.solve_traced(x)
    assert trace.unmerge(out).shape == (2, 10, 16)
    for bad, point in ((torch.randn(2, 7, 16), None), (out, -1), (out[:1], None),
                       (out, True)):
        with pytest.raises(ValueError, match="MergeTrace.unmerge"):
            trace.unmerge(bad, point)


# -- leftovers of the trial and the review (issue 17) -------------------------------------------
def test_causal_models_refuse_merging_when_it_is_asked_for():
    """GPT-2 and the decoder-only models have a causal support whatever the inputs:
    with_token_merging refuses them itself (it used to accept, and only the forward refused);
    r = 0 and None (no merging) stay accepted, and the forward check stays for the supports
    the inputs ask for (is_causal on the encoder)."""
    import transformers

    import splitformer

    torch.manual_seed(0)
    gpt2 = splitformer.from_hf(transformers.GPT2Model(transformers.GPT2Config(
        vocab_size=31, n_positions=16, n_embd=16, n_layer=2, n_head=2)).eval())
    for model in (gpt2, causal_decoder(11, 8, 16, 2, 2), causal_decoder(11, 8, 16, 2, 2,
                                                                        lm_head=True)):
        assert model.causal_support
        with pytest.raises(ValueError, match=rf"with_token_merging: {type(model).__name__} has "
                                             r"a causal support \(x' <= x"):
            model.with_token_merging(2)
        with pytest.raises(ValueError, match="causal support"):
            model.with_token_merging([0, 1], where="step", metric="state")
        model.with_token_merging(0)
        model.with_token_merging(None)
    assert not encoder().causal_support
    with pytest.raises(ValueError, match="causal"):  # asked for by the input: at the forward
        encoder().with_token_merging(1)(src(), is_causal=True,
                                        mask=torch.ones(N, N).triu(1).bool())


def test_nothing_mergeable_warns_naming_protect_and_n_and_runs_unmerged():
    """protect covering the grid (or padding leaving fewer than 2 mergeable nodes in a row)
    merges nothing: a warning names protect and N, and the output is the unmerged model's."""
    import warnings

    m, x = encoder(), src()
    with torch.no_grad():
        plain = m(x)
        for protect in (N, N - 1, N + 5):
            with pytest.warns(UserWarning, match=rf"nothing can merge.*N = {N} nodes with "
                                                 rf"protect = {protect}"):
                out = m.with_token_merging(2, protect=protect)(x)
            assert torch.equal(out, plain)
        kpm = torch.zeros(B, N, dtype=torch.bool)
        kpm[1, 1:] = True  # row 1: one node left, nothing to merge it with
        with pytest.warns(UserWarning, match=r"fewest row has 1 mergeable node"):
            m.with_token_merging(2)(x, src_key_padding_mask=kpm)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # two mergeable nodes: one merge, no warning
            trace = m.with_token_merging(2, protect=N - 2).merge_trace(x)
    assert trace.nodes == [N - 1]


def test_merging_on_the_meta_device_is_a_shape_pass_or_a_clear_refusal():
    """A model built under torch.device('meta'): without weights or padding the merge runs
    shape-only (the node counts of the trace); token_weights with values (on the CPU) count
    the mergeable nodes there; weights or a padding mask on the meta device (no values) are
    refused naming them (was: 'Tensor.item() cannot be called on meta tensors')."""
    with torch.device("meta"):
        m = network_encoder(D, H, FF, L).with_token_merging(2)
    x = torch.empty(B, N, D, device="meta")
    trace = m.merge_trace(x)
    assert trace.nodes == [8, 6, 4] and trace.index[-1].is_meta
    assert m.merge_trace(x, token_weights=torch.ones(N)).nodes == [8, 6, 4]
    assert m(x).shape == (B, N, D)
    with pytest.raises(ValueError, match="token_weights on the meta device"):
        m(x, token_weights=torch.ones(N, device="meta"))
    with pytest.raises(ValueError, match="key-padding mask.*on the meta device"):
        m(x, src_key_padding_mask=torch.zeros(B, N, dtype=torch.bool, device="meta"))


def test_train_merge_on_a_scheme_without_an_attention_stage_says_what_train_can_do():
    """The library's advice (where='step', metric='state') names with_token_merging options
    that `splitformer train` does not have: the ConfigError says what train can do instead
    (a scheme with a top-level attention stage, or merge = 0); other refusals keep the
    library's message."""
    from splitformer.training.config import ConfigError, TrainConfig
    from splitformer.training.families import build_model

    digits = {"name": "digits", "task": "classify", "num_classes": 10, "vocab_size": None,
              "input_shape": (1, 8, 8)}
    cfg = TrainConfig(width=16, heads=2, depth=2, merge=2, scheme="parallel")
    with pytest.raises(ConfigError, match=r"merge=2 \(family 'vit'\): training merges tokens "
                                          r"after the attention substep.*scheme 'parallel'.*"
                                          r"choose a scheme with one \(e.g. network, lie, "
                                          r"strang\) or merge = 0") as e:
        build_model(cfg, digits)
    assert "use where=" not in str(e.value)
    build_model(cfg.replace(scheme="strang"), digits)  # the advice holds
    with pytest.raises(ConfigError, match="runs a step of its own"):
        build_model(cfg.replace(scheme="reversible"), digits)


def test_a_batch_whose_shortest_row_cuts_r_warns_that_rows_depend_on_their_batch():
    """One r serves every row: a short row (padding) cuts it for the long ones, so a row's
    output depends on its batch; that is warned about (it was silent), once per forward."""
    import splitformer

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32)
    model = splitformer.from_hf(transformers.BertModel(cfg).eval()).eval().with_token_merging(8)
    ids = torch.randint(0, 50, (2, 33))
    mask = torch.ones(2, 33, dtype=torch.long)
    mask[1, 4:] = 0  # a 4-token sentence beside a 33-token one
    with pytest.warns(UserWarning, match="r = 8 cut to 1 by the row with the fewest") as got:
        model(ids, attention_mask=mask)
    assert sum("cut to" in str(w.message) for w in got) == 1
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(ids[:1])  # one row alone: nothing to warn about
