"""The token grid at the family level (docs/math.md 3.12): registry-driven property tests.

Every family of ``tests/test_registry.FAMILIES`` (plus the families of ``splitformer.models``
that list does not hold: ``EXTRA``), float64, tolerance 1e-10, hypothesis drawing the node j,
the weights and the coordinates:

a. constant weights give the output without weights, and the index coordinates 0 .. N-1 the
   output without coordinates;
b. splitting node j into two copies at x_j with half its weight leaves every node's u(T) (the
   copies get node j's) and every read-out (pooled, per token) unchanged, on the skeleton
   (``initial_condition`` -> split u(0) and the context's grid and masks -> ``evolution`` ->
   ``read_out``) and, for every input that is a field on the token grid (token ids, embedded
   tokens, a series), at the input: node j duplicated, ``token_coords`` with x_j twice (the
   learned position tables read the coordinates), the weights halved;
c. the same split with full-weight copies DOES change the output (> 1e-6);
d. permutation equivariance: the torch.nn encoder (no causal support, no positions) permutes
   its output with its nodes and their weights; with the coordinates carried along, u(T) of
   every family is permuted with its input nodes;
e. ``with_kernel(name)`` for every kernel keeps (b) on the skeleton (or is refused, naming the
   kernel and the family).

CvT's convolutions need the regular 2-D grid: there (``REGULAR_GRID_ONLY``) weights other than
constant and any coordinates are refused by name, which is asserted instead. Padding is a
zero-weight node: the same outputs at the other nodes as the key-padding masks.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_registry import FAMILIES

from splitformer.models import Encoder
from splitformer.models.seq2seq import network_decoder
from splitformer.models.sequence import sequence_classifier
from splitformer.operators.base import Context
from splitformer.operators.kernels import KERNEL_NAMES
from splitformer.operators.token_grid import split_node

D = torch.float64
TOL = 1e-10


def _sequence():
    torch.manual_seed(0)
    m = sequence_classifier(6, 2, 16, 2, 2, 24, 3, dtype=D)
    return m, (torch.randn(2, 6, 2, dtype=D),)


def _decoder():
    torch.manual_seed(0)
    m = network_decoder(16, 2, 24, 2, dtype=D)
    return m, (torch.randn(2, 4, 16, dtype=D), torch.randn(2, 5, 16, dtype=D))


# families of splitformer.models not in the registry's list: the sequence classifier, the
# decoder with a given memory (nn.TransformerDecoder's front: tgt_ and memory_ grids)
EXTRA = {"sequence": _sequence, "decoder": _decoder}
ALL = {**FAMILIES, **EXTRA}
REGULAR_GRID_ONLY = {"cvt"}  # convolutions in x: constant weights only, no coordinates
GRID_FAMILIES = sorted(set(ALL) - REGULAR_GRID_ONLY)
FEW = settings(max_examples=5, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=10, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

_MODELS: dict = {}


def family(name: str, kernel: str | None = None):
    """(model in eval mode, inputs), built once; ``kernel``: ``with_kernel(kernel)``, or None
    where the family refuses it (the message names the kernel and the model's class)."""
    key = (name, kernel)
    if key not in _MODELS:
        if kernel is None:
            model, inputs = ALL[name]()
            _MODELS[key] = (_float64_softmax(model).eval(), inputs)
        else:
            model, inputs = family(name)
            try:
                _MODELS[key] = (model.with_kernel(kernel).eval(), inputs)
            except ValueError as e:
                assert kernel in str(e) and type(model).__name__ in str(e), str(e)
                _MODELS[key] = None
    return _MODELS[key]


def _float64_softmax(model):
    """Gemma2's map computes its soft-capped softmax in float32 (``upcast``), as transformers'
    eager path does: exact against transformers, float32's precision. The grid's invariances
    are checked at float64's (1e-10), so these kernels compute in the model's dtype here."""
    from splitformer.operators.kernels import SoftcapKernel

    for m in model.modules():
        if isinstance(m, SoftcapKernel):
            m.upcast = False
    return model


def outputs(out) -> dict[str, torch.Tensor]:
    """Every tensor read-out of a family's output with a batch and a second axis."""
    if isinstance(out, torch.Tensor):
        return {"out": out}
    return {k: v for k in out.keys() if isinstance(v := out[k], torch.Tensor) and v.dim() >= 2}


def unsplit(t: torch.Tensor, j: int) -> torch.Tensor:
    keep = [i for i in range(t.shape[1]) if i != j + 1]
    return t.index_select(1, torch.tensor(keep, device=t.device))


def split_error(y: dict, y2: dict, j: int) -> float:
    """max |y2 - y| over every read-out, the copy j + 1 of node j compared with node j where a
    read-out has a node axis that grew by one."""
    err = 0.0
    for k, a in y.items():
        b = y2[k]
        if b.shape != a.shape:
            assert b.shape[1] == a.shape[1] + 1, (k, a.shape, b.shape)
            err = max(err, float((b[:, j + 1] - a[:, j]).abs().max()))
            b = unsplit(b, j)
        err = max(err, float((b - a).abs().max()))
    return err


def duplicate(t: torch.Tensor, j: int, axis: int = 1) -> torch.Tensor:
    n = t.shape[axis]
    return t.index_select(axis, torch.tensor([*range(j + 1), j, *range(j + 1, n)]))


def token_inputs(model, inputs) -> list[tuple[int, str, str]]:
    """(position, weights keyword, coords keyword) of each input that is a field on the token
    grid (integer ids (B, N); floating (B, N) or (B, N, C): embedded tokens, a series; not
    pixels). The keyword is ``<argument>_token_weights`` where the forward has it (the pair:
    src_, tgt_), else ``token_weights``: every such family's forward takes them."""
    params = list(inspect.signature(model.forward).parameters)
    found = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and (
        t.dim() == 2 if not t.is_floating_point() else t.dim() in (2, 3))]
    out = []
    for i in found:
        prefix = f"{params[i]}_" if f"{params[i]}_token_weights" in params else ""
        assert prefix or len(found) == 1, (type(model).__name__, params[i])
        names = (f"{prefix}token_weights", f"{prefix}token_coords")
        assert all(n in params for n in names), (type(model).__name__, names, params)
        out.append((i, *names))
    return out


@st.composite
def grid_of(draw, b: int, n: int, low: float = 0.0, high: float | None = None):
    """(weights (B, N) or (N,) in [0.2, 3], coords (B, N) in [low, high], j in [0, N))."""
    high = float(n - 1) if high is None else high
    rows = draw(st.sampled_from([1, b]))
    w = torch.tensor(draw(st.lists(st.floats(0.2, 3.0), min_size=rows * n,
                                   max_size=rows * n)), dtype=D).view(rows, n)
    c = torch.tensor(draw(st.lists(st.floats(low, high), min_size=b * n, max_size=b * n)),
                     dtype=D).view(b, n)
    return (w[0] if rows == 1 else w), c, draw(st.integers(0, n - 1))


def run(model, inputs, **kw) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return outputs(model(*inputs, **kw))


# -- the skeleton: u(0) and the context split, then evolution and read-out ------------------
def skeleton(model, inputs):
    with torch.no_grad():
        return model.initial_condition(*inputs)


def on_grid(ctx: Context, w, c) -> Context:
    return dataclasses.replace(ctx, extra=dict(ctx.extra), readout=dict(ctx.readout),
                               token_weights=w, token_coords=c)


def split_context(u0, ctx: Context, w, c, j: int, halve: bool = True):
    """u(0) and the context with node j split (``split_node``: u, the grid, the mask; the
    cross-attention's memory mask along its query axis); full-weight copies unless ``halve``."""
    n = u0.shape[1]
    u2, w2, c2, m2 = split_node(u0, w, c, j, ctx.attn_mask)
    if not halve:
        w2 = duplicate(torch.broadcast_to(w, (u0.shape[0], n)), j, 1)
    mm = ctx.memory_mask
    if isinstance(mm, torch.Tensor) and mm.dim() >= 2 and mm.shape[-2] == n:
        mm = duplicate(mm, j, mm.dim() - 2)
    return u2, dataclasses.replace(ctx, attn_mask=m2, extra=dict(ctx.extra),
                                   readout=dict(ctx.readout), memory_mask=mm,
                                   token_weights=w2, token_coords=c2)


def solve_on(model, u0, ctx) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return outputs(model.read_out(model.evolution(u0, ctx), ctx))


def _check_split_on_skeleton(model, inputs, data) -> None:
    u0, ctx = skeleton(model, inputs)
    w, c, j = data.draw(grid_of(u0.shape[0], u0.shape[1], -3.0, 9.0))
    y = solve_on(model, u0, on_grid(ctx, w, c))
    assert split_error(y, solve_on(model, *split_context(u0, ctx, w, c, j)), j) <= TOL


def _check_split_at_input(model, inputs, data) -> None:
    for i, wn, cn in token_inputs(model, inputs):
        x = inputs[i]
        w, c, j = data.draw(grid_of(x.shape[0], x.shape[1]))
        y = run(model, inputs, **{wn: w, cn: c})
        w2 = duplicate(torch.broadcast_to(w, c.shape), j).clone()
        w2[:, j:j + 2] /= 2
        split = (*inputs[:i], duplicate(x, j), *inputs[i + 1:])
        assert split_error(y, run(model, split, **{wn: w2, cn: duplicate(c, j)}), j) <= TOL


@pytest.mark.parametrize("name", GRID_FAMILIES)
@SOME
@given(data=st.data())
def test_splitting_a_node_with_half_weights_changes_no_output(name, data):
    model, inputs = family(name)
    _check_split_on_skeleton(model, inputs, data)
    _check_split_at_input(model, inputs, data)


@pytest.mark.parametrize("kernel", sorted(KERNEL_NAMES))
@pytest.mark.parametrize("name", GRID_FAMILIES)
@FEW
@given(data=st.data())
def test_every_kernel_keeps_the_split(name, kernel, data):
    built = family(name, kernel)
    if built is None:  # refused by name (asserted in family())
        return
    _check_split_on_skeleton(*built, data)  # (the positions at the input read no kernel)


@pytest.mark.parametrize("name", GRID_FAMILIES)
@SOME
@given(data=st.data())
def test_splitting_without_the_weights_changes_the_output(name, data):
    model, inputs = family(name)
    u0, ctx = skeleton(model, inputs)
    w, c, j = data.draw(grid_of(u0.shape[0], u0.shape[1] - 1, -3.0, 9.0))  # j < N - 1
    w = torch.cat([torch.broadcast_to(w, c.shape), torch.ones(c.shape[0], 1, dtype=D)], 1)
    c = torch.cat([c, torch.full((c.shape[0], 1), 10.0, dtype=D)], 1)  # node N - 1 sees j
    y = solve_on(model, u0, on_grid(ctx, w, c))
    assert split_error(y, solve_on(model, *split_context(u0, ctx, w, c, j, halve=False)),
                       j) > 1e-6
    for i, wn, cn in token_inputs(model, inputs):  # at the input: full-weight copies
        x = inputs[i]
        w, c, j = data.draw(grid_of(x.shape[0], x.shape[1]))
        y = run(model, inputs, **{wn: w, cn: c})
        split = (*inputs[:i], duplicate(x, j), *inputs[i + 1:])
        w2 = duplicate(torch.broadcast_to(w, c.shape), j)
        assert split_error(y, run(model, split, **{wn: w2, cn: duplicate(c, j)}), j) > 1e-6


@pytest.mark.parametrize("name", GRID_FAMILIES)
@SOME
@given(scale=st.floats(0.05, 20.0))
def test_constant_weights_and_index_coordinates_are_the_network(name, scale):
    model, inputs = family(name)
    u0, ctx = skeleton(model, inputs)
    b, n = u0.shape[:2]
    y = solve_on(model, u0, ctx)
    for w, c in ((torch.full((n,), scale, dtype=D), None),
                 (torch.full((b, n), scale, dtype=D), None),
                 (None, torch.arange(n, dtype=D))):
        assert split_error(y, solve_on(model, u0, on_grid(ctx, w, c)), 0) <= TOL
    y = run(model, inputs)
    for i, wn, cn in token_inputs(model, inputs):
        n = inputs[i].shape[1]
        assert split_error(y, run(model, inputs, **{wn: torch.full((n,), scale, dtype=D)}),
                           0) <= TOL
        assert split_error(y, run(model, inputs, **{cn: torch.arange(n, dtype=D)}), 0) <= TOL


@pytest.mark.parametrize("name", GRID_FAMILIES)
@SOME
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_permuting_the_nodes_with_their_coordinates_permutes_u_T(name, data, seed):
    """Every family, causal ones included: the coordinates carry the positions and the causal
    support with the nodes (u(T) is read before any read-out: a class-token read-out is not
    invariant, the node it reads moves)."""
    model, inputs = family(name)
    for i, wn, cn in token_inputs(model, inputs):
        x = inputs[i]
        w, c, _ = data.draw(grid_of(x.shape[0], x.shape[1]))
        w = torch.broadcast_to(w, c.shape)
        perm = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            u = model.trajectory(*inputs, **{wn: w, cn: c}).final
            xp = (*inputs[:i], x[:, perm], *inputs[i + 1:])
            up = model.trajectory(*xp, **{wn: w[:, perm], cn: c[:, perm]}).final
        expected = u[:, perm] if u.shape[1] == x.shape[1] else u  # the field read, or not
        assert (up - expected).abs().max() <= TOL


@pytest.mark.parametrize("name", sorted(n for n in ALL if isinstance(family(n)[0], Encoder)))
@SOME
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_the_encoder_is_permutation_equivariant_with_its_weights(name, data, seed):
    """No causal support and no positions: the plain index grid, nodes permuted with their
    weights only, permutes the output."""
    model, (x,) = family(name)
    w, _, _ = data.draw(grid_of(x.shape[0], x.shape[1]))
    w = torch.broadcast_to(w, x.shape[:2])
    perm = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        y = model(x, token_weights=w)
        yp = model(x[:, perm], token_weights=w[:, perm])
    assert (yp - y[:, perm]).abs().max() <= TOL


# masks and causal supports that travel with the split (a padding mask is per node: its entry
# j is duplicated with the node; a causal support stays on the coordinates)
PADDED = {
    "bert": lambda keep: {"attention_mask": keep.long()},
    "gpt2": lambda keep: {"attention_mask": keep.long()},
    "encoder_post_ln": lambda keep: {"src_key_padding_mask": keep == 0, "is_causal": True},
    "encoder_pre_ln": lambda keep: {"src_key_padding_mask": keep == 0},
}


@pytest.mark.parametrize("additive", [False, True], ids=["bool", "finfo"])
@pytest.mark.parametrize("name", sorted(PADDED))
@SOME
@given(data=st.data())
def test_splitting_with_padding_and_causal_supports(name, additive, data):
    model, (x,) = ALL[name]()
    model.eval()
    if name in ("bert", "gpt2"):
        model.additive_mask = additive
    b, n = x.shape[:2]
    w, c, j = data.draw(grid_of(b, n))
    pad = data.draw(st.integers(0, n - 1).filter(lambda p: p != j))
    keep = torch.ones(b, n, dtype=D)
    keep[0, pad] = 0
    y = run(model, (x,), token_weights=w, token_coords=c, **PADDED[name](keep))
    w2 = duplicate(torch.broadcast_to(w, c.shape), j).clone()
    w2[:, j:j + 2] /= 2
    y2 = run(model, (duplicate(x, j),), token_weights=w2, token_coords=duplicate(c, j),
             **PADDED[name](duplicate(keep, j)))
    keep2 = duplicate(keep, j)
    for k in y:  # the padded node's own row is not compared (torch.nn's convention)
        if y[k].shape[1] == n:
            y[k], y2[k] = y[k] * keep[..., None], y2[k] * keep2[..., None]
    assert split_error(y, y2, j) <= TOL


def test_the_pair_splits_with_causal_and_padded_grids():
    model, (src, tgt) = ALL["transformer"]()
    model.eval()
    gen = torch.Generator().manual_seed(1)
    ws, wt = torch.rand(2, 5, generator=gen, dtype=D) + 0.2, torch.rand(4, generator=gen,
                                                                         dtype=D) + 0.2
    cs, ct = torch.rand(2, 5, generator=gen, dtype=D) * 4, torch.tensor([0.0, 1, 1.5, 3],
                                                                      dtype=D)
    ks = torch.tensor([[False, False, True, False, False], [False] * 5])
    kt = torch.tensor([[False, True, False, False], [False] * 4])
    kw = {"tgt_is_causal": True, "memory_is_causal": True}

    def out(s, t, k, a, b, m, c, d):
        with torch.no_grad():
            return model(s, t, src_key_padding_mask=k, memory_key_padding_mask=k,
                         tgt_key_padding_mask=m, src_token_weights=a, src_token_coords=b,
                         tgt_token_weights=c, tgt_token_coords=d, **kw)

    y = out(src, tgt, ks, ws, cs, kt, wt, ct)
    for j in range(5):  # a source node: the whole output unchanged
        w2 = duplicate(ws, j).clone()
        w2[:, j:j + 2] /= 2
        y2 = out(duplicate(src, j), tgt, duplicate(ks, j), w2, duplicate(cs, j), kt, wt, ct)
        assert (y2 - y).abs().max() <= TOL, j
    for j in range(4):  # a target node: every other target node unchanged
        w2 = duplicate(wt, j, 0).clone()
        w2[j:j + 2] /= 2
        y2 = out(src, duplicate(tgt, j), ks, ws, cs, duplicate(kt, j), w2, duplicate(ct, j, 0))
        assert split_error({"y": y}, {"y": y2}, j) <= TOL, j


# -- padding is a zero-weight node --------------------------------------------------------
def _padded(n: int, keep: int, b: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(1 = kept / 0 = padding, the weights: 1 on kept nodes, 0 on padding), (B, N)."""
    k = torch.zeros(b, n, dtype=D)
    k[0, :keep] = 1
    k[1, :] = 1
    return k, k.clone()


@pytest.mark.parametrize("additive", [False, True], ids=["bool", "finfo"])
def test_bert_padding_mask_and_zero_weights_agree(additive):
    model, (ids,) = ALL["bert"]()
    model.eval().additive_mask = additive
    keep, w = _padded(ids.shape[1], 3)
    with torch.no_grad():
        a = model(ids, attention_mask=keep.long())
        b = model(ids, token_weights=w)
        alone = model(ids[:1, :3])
    assert (a.last_hidden_state[0, :3] - b.last_hidden_state[0, :3]).abs().max() <= TOL
    assert (a.last_hidden_state[1] - b.last_hidden_state[1]).abs().max() <= TOL
    assert (a.pooler_output - b.pooler_output).abs().max() <= TOL
    assert (b.last_hidden_state[0, :3] - alone.last_hidden_state[0]).abs().max() <= TOL


def test_gpt2_left_padding_mask_and_zero_weights_agree():
    model, (ids,) = ALL["gpt2"]()
    model.eval()
    keep = torch.ones(2, ids.shape[1], dtype=D)
    keep[0, :2] = 0
    with torch.no_grad():
        a = model(ids, attention_mask=keep.long())
        b = model(ids, token_weights=keep)
    assert (a.logits[0, 2:] - b.logits[0, 2:]).abs().max() <= TOL
    assert (a.logits[1] - b.logits[1]).abs().max() <= TOL


def test_encoder_and_pair_key_padding_and_zero_weights_agree():
    enc, (x,) = ALL["encoder_post_ln"]()
    keep, w = _padded(x.shape[1], 3)
    with torch.no_grad():
        a = enc.eval()(x, src_key_padding_mask=keep == 0)
        b = enc(x, token_weights=w)
    assert (a[0, :3] - b[0, :3]).abs().max() <= TOL and (a[1] - b[1]).abs().max() <= TOL
    pair, (src, tgt) = ALL["transformer"]()
    ks, ws = _padded(src.shape[1], 2)
    kt, wt = _padded(tgt.shape[1], 3)
    with torch.no_grad():
        a = pair.eval()(src, tgt, src_key_padding_mask=ks == 0,
                        memory_key_padding_mask=ks == 0, tgt_key_padding_mask=kt == 0)
        b = pair(src, tgt, src_token_weights=ws, tgt_token_weights=wt)
    assert (a[0, :3] - b[0, :3]).abs().max() <= TOL and (a[1] - b[1]).abs().max() <= TOL


def test_sequence_classifier_pools_by_quadrature():
    """Zero-weight nodes are padding for the pooled read-out too: the logits of the padded
    series equal those of the series without the padding (its nodes at their coordinates);
    split weights pool as the weighted mean sum_j w_j u_j / sum_j w_j."""
    model, (x,) = ALL["sequence"]()
    model.eval()
    keep = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], dtype=D)
    coords = torch.arange(6, dtype=D)
    with torch.no_grad():
        padded = model(x, token_weights=keep, token_coords=coords)
        alone = model(x[:, :4], token_coords=coords[:4])
        assert (padded - alone).abs().max() <= TOL
        assert (model(x[:, :4], token_coords=coords[:4] + 1.5)
                - alone).abs().max() > 1e-6  # the positions move with the coordinates


# -- the position table read at the coordinates --------------------------------------------
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_learned_positions_are_samples_of_p_x(name):
    """Integer coordinates give the position_ids look-up bit for bit; between rows, the linear
    interpolation of the two table rows; outside [0, P-1], or with position_ids, refused."""
    model, (ids,) = ALL[name]()
    emb = model.embedding.eval()
    n = ids.shape[1]
    table = emb.position.weight
    with torch.no_grad():
        pos = torch.tensor([[0, 3, 3, 1, 7, 11]]).expand(2, n)
        assert torch.equal(emb(ids, token_coords=pos.to(D)), emb(ids, position_ids=pos))
        x = torch.tensor([0.25, 2.5, 3.0, 10.75, 11.0, 4.9], dtype=D)
        lo = x.floor().long()
        hi = (lo + 1).clamp(max=table.shape[0] - 1)
        theta = (x - lo.to(D))[:, None]
        p = (1 - theta) * table[lo] + theta * table[hi]
        plain = emb.word(ids) if emb.token_type is None else emb.word(ids) + emb.token_type(
            torch.zeros_like(ids))
        f = plain + p
        f = emb.norm(f) if emb.norm is not None else f
        assert (emb(ids, token_coords=x) - f).abs().max() <= TOL
    with pytest.raises(ValueError, match=r"token_coords must lie in \[0, 11\]"):
        model(ids, token_coords=torch.linspace(0, 11.5, n, dtype=D))
    with pytest.raises(ValueError, match=r"token_coords must lie in \[0, 11\]"):
        model(ids, token_coords=torch.linspace(-0.5, 3, n, dtype=D))
    with pytest.raises(ValueError, match="position_ids or token_coords"):
        model(ids, position_ids=torch.arange(n)[None], token_coords=torch.arange(n, dtype=D))


# -- refusals and bad input ----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(REGULAR_GRID_ONLY))
def test_regular_grid_families_refuse_other_grids_by_name(name):
    model, inputs = family(name)
    u0, ctx = skeleton(model, inputs)
    b, n = u0.shape[:2]
    y = run(model, inputs)
    assert split_error(y, run(model, inputs, token_weights=torch.full((n,), 0.3, dtype=D)),
                       0) <= TOL
    bumpy = torch.linspace(0.5, 2.0, n, dtype=D)
    with pytest.raises(ValueError, match=r"\(CvT\): token_weights other than constant"):
        model(*inputs, token_weights=bumpy)
    with pytest.raises(ValueError, match=r"\(CvT\): token_coords are refused"):
        model(*inputs, token_coords=torch.arange(n, dtype=D))
    with pytest.raises(ValueError, match=rf"token_weights has shape \({n + 1},\)"):
        model(*inputs, token_weights=torch.ones(n + 1, dtype=D))
    with pytest.raises(ValueError, match=r"ConvolutionalAttention \(CvT\): token_weights"):
        solve_on(model, u0, on_grid(ctx, bumpy, None))


@pytest.mark.parametrize("name", GRID_FAMILIES)
def test_a_bad_grid_is_refused_naming_the_argument(name):
    model, inputs = family(name)
    for i, wn, cn in token_inputs(model, inputs):
        b, n = inputs[i].shape[:2]
        bad = [({wn: torch.ones(n + 1, dtype=D)}, ValueError, rf"{wn} has shape \({n + 1},\)"),
               ({wn: torch.ones(b + 1, n, dtype=D)}, ValueError, rf"{wn} has shape"),
               ({wn: -torch.ones(n, dtype=D)}, ValueError, rf"{wn} must be >= 0"),
               ({wn: torch.zeros(n, dtype=D)}, ValueError, rf"{wn}: every row"),
               ({wn: torch.ones(n, dtype=torch.bool)}, TypeError, rf"{wn} must be a real"),
               ({cn: torch.ones(n, dtype=torch.complex128)}, TypeError, rf"{cn} must be a real"),
               ({cn: [0.0] * n}, TypeError, rf"{cn} must be None or a torch.Tensor"),
               ({cn: torch.full((n,), float("nan"), dtype=D)}, ValueError, rf"{cn} must be "
                                                                           "finite")]
        for kw, error, match in bad:
            with pytest.raises(error, match=match):
                model(*inputs, **kw)
