"""The token grid at the operator level (docs/math.md 3.12), as property tests (hypothesis).

Every kernel of ``operators.kernels.KERNELS``, causal and not, in self-attention
(``NonlocalAttention``) and cross-attention (``CrossAttention``, the memory on its own grid),
float64, tolerance 1e-10:

a. constant weights give the output without weights; coordinates 0 .. N-1 give the output
   without coordinates;
b. splitting node j into two copies at x_j with weight w_j / 2 each (``split_node``) leaves
   every node's output unchanged (the copies get the output of node j), for any positive
   weights and any real coordinates;
c. the same split with full-weight copies DOES change the output (> 1e-6): the weights are
   what makes the refinement consistent;
d. permuting the nodes with their weights permutes the output (kernels without positions, no
   causal support); with their coordinates carried along, for every kernel, causal ones too;
e. zero weights are padding: weight-0 nodes change nothing at the other nodes, as if they
   were not there.

The relative kernels (ALiBi, rotary) are refused by name in cross-attention (two grids: the
offset x - x' is not defined there); that refusal is asserted instead.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitformer.operators import CrossAttention, NonlocalAttention
from splitformer.operators.base import Context
from splitformer.operators.kernels import KERNELS
from splitformer.operators.token_grid import split_node, weighted_mean

D = torch.float64
TOL = 1e-10
DIM, HEADS, B = 8, 2, 2
SETTINGS = settings(max_examples=10, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
KERNEL_NAMES = sorted(KERNELS)
RELATIVE = sorted(n for n, k in KERNELS.items() if k.relative)


def _op(kind: type, kernel: str):
    torch.manual_seed(0)
    op = kind(DIM, HEADS, dtype=D).eval()
    op.set_kernel(kernel)
    with torch.no_grad():  # non-zero biases: a kernel must integrate V + b_V, not only V
        op.qkv_bias.normal_()
    return op


@st.composite
def grids(draw, min_n: int = 2, max_n: int = 6):
    """(u (B, N, DIM), weights (B, N) > 0, coords (B, N) real or None, node j, seed)."""
    n = draw(st.integers(min_n, max_n))
    w = draw(st.lists(st.floats(0.2, 3.0), min_size=B * n, max_size=B * n))
    c = draw(st.one_of(st.none(), st.lists(st.floats(-4.0, 8.0), min_size=B * n,
                                            max_size=B * n)))
    j = draw(st.integers(0, n - 1))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(B, n, DIM, generator=gen, dtype=D)
    return (u, torch.tensor(w, dtype=D).view(B, n),
            None if c is None else torch.tensor(c, dtype=D).view(B, n), j, seed)


def unsplit(t: torch.Tensor, j: int, axis: int = 1) -> torch.Tensor:
    """t on N + 1 nodes with the copy j + 1 of node j removed."""
    n1 = t.shape[axis]
    keep = [i for i in range(n1) if i != j + 1]
    return t.index_select(axis, torch.tensor(keep))


def full_weight_split(w: torch.Tensor, j: int) -> torch.Tensor:
    """The weights of a split whose copies keep the full weight w_j (the wrong refinement)."""
    n = w.shape[-1]
    idx = torch.tensor([*range(j + 1), j, *range(j + 1, n)])
    return w.index_select(-1, idx)


def assert_split_exact(y: torch.Tensor, y2: torch.Tensor, j: int) -> None:
    assert (unsplit(y2, j) - y).abs().max() <= TOL
    assert (y2[:, j + 1] - y[:, j]).abs().max() <= TOL


def _self(op, u, w, c, causal):
    """Self-attention on the grid (w, c); ``causal`` True: is_causal; "mask": the causal
    support x_k <= x_q on the coordinates given as a boolean mask (what Sinkhorn must
    recognise as causal on the coordinates)."""
    if causal == "mask":
        x = (c if c is not None else torch.arange(u.shape[1], dtype=D)).expand(B, -1)
        mask = (x[:, None, :] <= x[:, :, None]).unsqueeze(1)
        return op(u, Context(attn_mask=mask, token_weights=w, token_coords=c))
    return op(u, Context(is_causal=causal, token_weights=w, token_coords=c))


# -- self-attention ------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@SETTINGS
@given(case=grids())
def test_constant_weights_and_index_coordinates_are_the_network(kernel, causal, case):
    u, w, _, _, seed = case
    op = _op(NonlocalAttention, kernel)
    with torch.no_grad():
        y = op(u, Context(is_causal=causal))
        c = 0.1 + (seed % 7)  # any positive constant
        assert (_self(op, u, torch.full_like(w, c), None, causal) - y).abs().max() <= TOL
        assert (_self(op, u, torch.full((u.shape[1],), c, dtype=D), None, causal)
                - y).abs().max() <= TOL
        index = torch.arange(u.shape[1], dtype=D)
        assert (_self(op, u, None, index, causal) - y).abs().max() <= TOL


@pytest.mark.parametrize("causal", [False, True, "mask"], ids=["full", "causal", "mask"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@SETTINGS
@given(case=grids())
def test_splitting_a_node_with_half_weights_changes_nothing(kernel, causal, case):
    u, w, c, j, _ = case
    op = _op(NonlocalAttention, kernel)
    with torch.no_grad():
        y = _self(op, u, w, c, causal)
        u2, w2, c2, _ = split_node(u, w, c, j)
        assert_split_exact(y, _self(op, u2, w2, c2, causal), j)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@SETTINGS
@given(case=grids())
def test_splitting_a_node_without_the_weights_changes_the_output(kernel, causal, case):
    u, w, c, j, _ = case
    op = _op(NonlocalAttention, kernel)
    with torch.no_grad():
        y = _self(op, u, w, c, causal)
        u2, _, c2, _ = split_node(u, w, c, j)
        y2 = _self(op, u2, full_weight_split(w, j), c2, causal)
        assert torch.cat([(unsplit(y2, j) - y).abs().flatten(),
                          (y2[:, j + 1] - y[:, j]).abs().flatten()]).max() > 1e-6


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@SETTINGS
@given(case=grids(), perm_seed=st.integers(0, 2**16))
def test_permuting_the_nodes_permutes_the_output(kernel, causal, case, perm_seed):
    """With the coordinates carried along: every kernel, causal ones too (the support
    x_k <= x_q and the offsets read the coordinates, not the index). Without coordinates:
    the kernels that read no position, without a causal support."""
    u, w, c, _, _ = case
    n = u.shape[1]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(perm_seed))
    op = _op(NonlocalAttention, kernel)
    coords = c if c is not None else torch.arange(n, dtype=D).expand(B, n)
    with torch.no_grad():
        y = _self(op, u, w, coords, causal)
        yp = _self(op, u[:, perm], w[:, perm], coords[:, perm], causal)
        assert (yp - y[:, perm]).abs().max() <= TOL
        if causal or kernel in RELATIVE:
            return
        y = _self(op, u, w, None, False)
        assert (_self(op, u[:, perm], w[:, perm], None, False) - y[:, perm]).abs().max() <= TOL


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@SETTINGS
@given(case=grids(), pad=st.integers(1, 3))
def test_zero_weight_nodes_are_padding(kernel, case, pad):
    """Appended nodes of weight 0 (any values, any coordinates) leave the others as they were
    without them, and the quadrature mean ignores them."""
    u, w, c, _, seed = case
    n = u.shape[1]
    gen = torch.Generator().manual_seed(seed + 1)
    up = torch.cat([u, 5 * torch.randn(B, pad, DIM, generator=gen, dtype=D)], 1)
    wp = torch.cat([w, torch.zeros(B, pad, dtype=D)], 1)
    coords = c if c is not None else torch.arange(n, dtype=D).expand(B, n)
    cp = torch.cat([coords, 3 * torch.randn(B, pad, generator=gen, dtype=D)], 1)
    op = _op(NonlocalAttention, kernel)
    with torch.no_grad():
        y = _self(op, u, w, coords, False)
        yp = _self(op, up, wp, cp, False)
        assert (yp[:, :n] - y).abs().max() <= TOL
        assert (weighted_mean(yp, wp) - weighted_mean(y, w)).abs().max() <= TOL


# -- cross-attention -----------------------------------------------------------------------
def _memory_context(m, wm, cm, w, c, causal):
    """The decoder-side context: the memory field on its grid; a causal support x_s <= x on
    the coordinates (the index where there are none) as the memory mask."""
    mask = None
    if causal:
        xq = (c if c is not None else torch.arange(w.shape[-1], dtype=D)).expand(B, -1)
        xk = (cm if cm is not None else torch.arange(wm.shape[-1], dtype=D)).expand(B, -1)
        mask = (xk[:, None, :] <= xq[:, :, None]).unsqueeze(1)
    return Context(token_weights=w, token_coords=c, memory=m, memory_mask=mask,
                   memory_weights=wm, memory_coords=cm)


@pytest.mark.parametrize("kernel", RELATIVE)
def test_relative_kernels_are_refused_in_cross_attention(kernel):
    torch.manual_seed(0)
    op = CrossAttention(DIM, HEADS, dtype=D)
    with pytest.raises(ValueError, match=f"{kernel}.*CrossAttention"):
        op.set_kernel(kernel)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel", sorted(set(KERNEL_NAMES) - set(RELATIVE)))
@SETTINGS
@given(case=grids(), memory=grids(min_n=2, max_n=7))
def test_cross_attention_on_two_grids(kernel, causal, case, memory):
    """(a) constant memory weights are the network; (b) splitting a memory node or a query
    node with half weights changes nothing; (c) full-weight copies of a memory node do."""
    u, w, c, j, _ = case
    m, wm, cm, jm, seed = memory
    if causal:  # a causal support between two grids compares coordinates: give both
        c = torch.arange(u.shape[1], dtype=D).expand(B, -1) if c is None else c
        cm = torch.arange(m.shape[1], dtype=D).expand(B, -1) if cm is None else cm
    op = _op(CrossAttention, kernel)
    with torch.no_grad():
        y = op(u, _memory_context(m, wm, cm, w, c, causal))
        if not causal:
            plain = op(u, Context(memory=m))
            const = op(u, _memory_context(m, torch.full_like(wm, 0.3 + seed % 5), None,
                                          torch.full_like(w, 2.0), None, False))
            assert (const - plain).abs().max() <= TOL
        m2, wm2, cm2, _ = split_node(m, wm, cm, jm)  # a memory node: every output unchanged
        y2 = op(u, _memory_context(m2, wm2, cm2, w, c, causal))
        assert (y2 - y).abs().max() <= TOL
        u2, w2, c2, _ = split_node(u, w, c, j)  # a query node: the others unchanged
        assert_split_exact(y, op(u2, _memory_context(m, wm, cm, w2, c2, causal)), j)
        if cm is None:
            cm = torch.arange(m.shape[1], dtype=D).expand(B, -1)
            m2, _, cm2, _ = split_node(m, wm, cm, jm)
        y3 = op(u, _memory_context(m2, full_weight_split(wm, jm), cm2, w, c, causal))
        if causal:  # node jm must share some query's support with another memory node
            xq = (c if c is not None else torch.arange(u.shape[1], dtype=D)).expand(B, -1)
            seen = cm[:, None, :] <= xq[:, :, None]  # (B, N_q, N_k)
            if not bool((seen[..., jm] & (seen.sum(-1) >= 2)).any()):
                return
        assert (y3 - y).abs().max() > 1e-6


def test_cross_attention_query_index_does_not_move_when_the_memory_is_refined():
    """Memory coordinates given, query coordinates not: the queries sit at their own index
    0 .. N_q - 1, whatever the memory's length (an index aligned to the memory's length would
    move them, and Sinkhorn's causal plan with them, when a memory node is split)."""
    op = _op(CrossAttention, "sinkhorn")
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(B, 4, DIM, generator=gen, dtype=D)
    m = torch.randn(B, 3, DIM, generator=gen, dtype=D)
    wm, cm = torch.tensor([1.0, 0.5, 2.0], dtype=D), torch.tensor([0.0, 1.0, 2.0], dtype=D)

    def run(m, wm, cm):
        mask = (cm[None, :] <= torch.arange(4, dtype=D)[:, None])  # x_s <= x on the grids
        return op(u, Context(memory=m, memory_mask=mask, memory_weights=wm, memory_coords=cm))

    with torch.no_grad():
        y = run(m, wm, cm)
        for j in range(3):
            m2, wm2, cm2, _ = split_node(m, wm, cm, j)
            assert (run(m2, wm2, cm2) - y).abs().max() <= TOL, j


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_weights_are_a_rule_up_to_scale_and_relative_kernels_read_real_coordinates(name):
    """Review findings: w -> c w changes nothing even for tiny c (float16 underflow, the linear
    kernel's eps floor), and a relative kernel is invariant under a shift of every coordinate
    by a fraction (a kernel that rounded the coordinates would fail: floor moved rotary by 0.29,
    ALiBi by 0.02)."""
    from splitformer.operators import NonlocalAttention

    torch.manual_seed(0)
    op = NonlocalAttention(8, 2, dtype=torch.float64).eval()
    op.set_kernel(name)
    u = torch.randn(2, 5, 8, dtype=torch.float64)
    w = torch.rand(5, dtype=torch.float64) + 0.5
    with torch.no_grad():
        y = op(u, Context(token_weights=w))
        for c in (1e-14, 1e12):
            assert (op(u, Context(token_weights=w * c)) - y).abs().max() < 1e-10
        x = torch.arange(5, dtype=torch.float64) * 0.7
        a = op(u, Context(token_weights=w, token_coords=x))
        b = op(u, Context(token_weights=w, token_coords=x + 0.37))
        assert (a - b).abs().max() < 1e-10
    half = NonlocalAttention(8, 2, dtype=torch.float16).eval()
    with torch.no_grad():
        uh = u.half()
        assert torch.equal(half(uh), half(uh, Context(token_weights=torch.full((5,), 1e-8))))


# -- what a grid tensor may be (issue 17 leftovers) -------------------------------------------
def test_integer_grids_are_read_as_their_floating_values():
    """torch.arange(N) as coordinates and integer counts as weights are accepted (they were
    refused as not floating point): cast to the state's floating dtype, the same output bit
    for bit, in the operators (Context) and in every family with a token grid; bool, complex,
    NaN and inf are still refused naming the argument."""
    from test_token_grid_families import GRID_FAMILIES, family, outputs, token_inputs

    from splitformer.models import network_encoder
    from splitformer.operators.token_grid import check_grid_tensor

    op = _op(NonlocalAttention, "softmax")
    encoder = network_encoder(4, 2, 8, 1, dtype=D).eval()
    u = torch.randn(B, 5, DIM, dtype=D, generator=torch.Generator().manual_seed(0))
    counts = torch.tensor([1, 3, 1, 2, 1])
    ctx = Context(is_causal=True, token_weights=counts, token_coords=torch.arange(5))
    assert ctx.token_weights.is_floating_point() and ctx.token_coords.is_floating_point()
    assert check_grid_tensor(counts, "w", weights=True, dtype=D).dtype == D
    with torch.no_grad():
        assert torch.equal(op(u, ctx), op(u, Context(is_causal=True,
                                                    token_weights=counts.to(D),
                                                    token_coords=torch.arange(5.0, dtype=D))))
        for name in GRID_FAMILIES:
            model, inputs = family(name)
            for i, wn, cn in token_inputs(model, inputs):
                n = inputs[i].shape[1]
                w = torch.arange(n) % 3 + 1
                got = outputs(model(*inputs, **{wn: w, cn: torch.arange(n)}))
                want = outputs(model(*inputs, **{wn: w.to(D), cn: torch.arange(n, dtype=D)}))
                for k, v in want.items():
                    assert torch.equal(got[k], v), (name, k)
    real, finite = "must be a real", "must be finite"
    for bad, error, match in ((torch.ones(5, dtype=torch.bool), TypeError, real),
                              (torch.ones(5, dtype=torch.complex64), TypeError, real),
                              (torch.tensor([0.0, 1, float("nan"), 3, 4]), ValueError, finite),
                              (torch.tensor([0.0, 1, float("inf"), 3, 4]), ValueError, finite)):
        with pytest.raises(error, match=rf"Context.token_coords {match}"):
            Context(token_coords=bad)
        with pytest.raises(error, match=rf"Encoder: token_weights {match}"):
            encoder(u[..., :4], token_weights=bad)


def test_a_grid_on_the_meta_device_is_checked_by_shape():
    """A model built under torch.device('meta') runs shape-only with a grid on meta (the
    values cannot be checked there: was 'Tensor.item() cannot be called on meta tensors'); the
    shape is still checked, naming the argument."""
    from splitformer.models import network_encoder

    with torch.device("meta"):
        m = network_encoder(16, 4, 24, 2)
        x = torch.empty(2, 6, 16)
        w, c = torch.ones(6), torch.arange(6.0)
    assert m(x, token_weights=w, token_coords=c).shape == (2, 6, 16)
    assert m(x, token_coords=torch.arange(6, device="meta")).is_meta  # an integer one too
    with pytest.raises(ValueError, match=r"token_weights has shape \(7,\)"):
        m(x, token_weights=torch.ones(7, device="meta"))


def test_cvt_weights_are_sized_to_its_last_stage():
    """CvT takes token_weights on its last stage's grid only (N of that stage, its class token
    included), constant along each row (they cancel); the earlier stages take none, and a
    grid of another stage's size is refused saying so."""
    from splitformer.models.cvt import CvtStageSpec, build_cvt

    torch.manual_seed(0)
    cvt = build_cvt([CvtStageSpec(1, 8, 1, 1), CvtStageSpec(8, 16, 2, 1, cls_token=True)],
                    num_labels=3, dtype=D).eval()
    x = torch.randn(2, 1, 16, 16, dtype=D)
    with torch.no_grad():
        out = cvt(x, output_hidden_states=True)
        assert [tuple(h.shape[-2:]) for h in out.hidden_states] == [(8, 8), (4, 4)]
        assert torch.equal(cvt(x, token_weights=torch.full((17,), 2, dtype=D)).logits,
                           out.logits)  # 4 x 4 + the class token: constant weights cancel
        assert torch.equal(cvt(x, token_weights=torch.full((17,), 2)).logits, out.logits)
        for n in (16, 64, 65):  # without the class token; the first stage's grid
            with pytest.raises(ValueError, match=r"last stage's token grid \(stage 2 of 2: 17 "
                                                 r"nodes, its class token first; the earlier "
                                                 rf"stages take none\).*shape \({n},\)"):
                cvt(x, token_weights=torch.ones(n, dtype=D))
