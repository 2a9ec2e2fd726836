"""Compression in depth (docs/depth.md): the coarse grids of ``compression.coarsenings``, the
healing objective and loop, the result folder, against transformers where there is a
reference.

* ShortGPT's drop removes the steps of least block influence, computed here from transformers'
  own hidden states (``output_hidden_states``), and the dropped model is transformers' model
  without those layers;
* the healing objective is zero for the fine model itself and decreases under healing; a
  healing run killed after a checkpoint resumes to the same parameters as an uninterrupted one;
* ``splitformer.load`` of the result folder is the healed model, and its hf/ folder, loaded by
  transformers, gives the same last hidden state (1e-5, float32).
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

import splitformer
from splitformer.compression import method_names, plan
from splitformer.compression.heal import HealConfig, heal
from splitformer.compression.store import load_compressed, write_result
from splitformer.control.healing import Distillation
from splitformer.verification.references import perturb_

transformers = pytest.importorskip("transformers")


def _hf(layers: int = 6) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=layers,
                                  num_attention_heads=4, intermediate_size=48,
                                  max_position_embeddings=40)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


def _windows(n: int = 64, length: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 60, (n, length), generator=g)


def _hf_reference(hf: nn.Module, method: str, steps: int, c) -> nn.Module:
    """The coarse network built from transformers' own layers, independently of splitformer:
    a layer list keeps the fine layers the method names; a coarse grid (tau = 6 / steps) takes,
    for its step over [t, t + tau], the controls at the midpoint (constant: theta^n on the
    unit interval (n, n + 1], so layer ceil(t_mid) - 1, the first of a pair at a boundary;
    linear: interpolated between the layers' nodes n + 1/2) with the attention's and the FFN's
    output projections times tau (docs/math.md 3.13)."""
    L = len(hf.encoder.layer)
    if method in ("keep-first", "every-other", "drop", "angular", "pairs"):
        (op, drop), = c.ops
        keep = [i for i in range(L) if i not in drop]
        if method == "pairs":  # the second step of each disjoint pair (n, n + 1) dropped
            assert all(n - 1 in keep for n in drop) and len(drop) == L - steps
        if method == "keep-first":
            assert keep == list(range(steps))
        elif method == "every-other":
            assert keep == list(range(0, L, L // steps))
        elif method == "angular":  # one contiguous block is dropped
            assert list(drop) == list(range(drop[0], drop[0] + L - steps))
        ref = copy.deepcopy(hf)
        ref.encoder.layer = nn.ModuleList(copy.deepcopy(hf.encoder.layer[i]) for i in keep)
        return ref
    if method == "parallel":  # the middle group's fields summed (Sun et al.'s parallel layers)
        (op, (group,)), = c.ops
        assert op == "parallel_steps" and len(group) == L - steps + 1
        assert list(group) == list(range(group[0], group[0] + len(group)))
        layers = list(hf.encoder.layer)
        ref = copy.deepcopy(hf)
        ref.encoder.layer = nn.ModuleList(
            [*layers[:group[0]], _HFParallelLayers([layers[i] for i in group]),
             *layers[group[-1] + 1:]])
        return ref
    tau = L / steps
    layers = [dict(layer.state_dict()) for layer in hf.encoder.layer]
    ref = copy.deepcopy(hf)
    ref.encoder.layer = nn.ModuleList(copy.deepcopy(hf.encoder.layer[i]) for i in range(steps))
    for j, layer in enumerate(ref.encoder.layer):
        mid = (j + 0.5) * tau
        if method == "coarsen":
            weights = {math.ceil(mid) - 1: 1.0}
        else:  # theta^n sits at n + 1/2
            lo = min(max(int(mid - 0.5), 0), L - 2)
            f = min(max(mid - 0.5 - lo, 0.0), 1.0)
            weights = {lo: 1 - f, lo + 1: f}
        state = {k: sum(w * layers[n][k] for n, w in weights.items()) for k in layers[0]}
        for k in ("attention.output.dense.weight", "attention.output.dense.bias",
                  "output.dense.weight", "output.dense.bias"):
            state[k] = tau * state[k]
        layer.load_state_dict(state)
    return ref


class _HFParallelLayers(nn.Module):
    """transformers' BertLayers a .. b run in parallel on one input: post-LN
    LN_b(h + sum_k SelfOutput_k(SelfAttention_k(h))), then LN'_b(x + sum_k FFN_k(x)), the
    norms the last layer's (transformers' own submodules, no splitformer code)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, h, attention_mask=None, *args, **kwargs):
        def first(x):
            return x[0] if isinstance(x, tuple) else x
        like = self.layers[-1](h, attention_mask, *args, **kwargs)  # the output's type
        last = self.layers[-1]
        x = last.attention.output.LayerNorm(h + sum(
            layer.attention.output.dense(first(layer.attention.self(h, attention_mask)))
            for layer in self.layers))
        x = last.output.LayerNorm(x + sum(layer.output.dense(layer.intermediate(x))
                                          for layer in self.layers))
        return (x, *like[1:]) if isinstance(like, tuple) else x


@pytest.mark.parametrize("method", method_names())
@pytest.mark.parametrize("steps", [4, 3, 2])
def test_every_method_is_the_coarse_network_transformers_computes(method, steps):
    """Each method's coarse model equals a BertModel assembled from transformers' layers by the
    method's rule (kept layers; midpoint controls and outputs times tau), to round-off."""
    hf = _hf()
    model = splitformer.from_hf(hf).eval()
    ids = _windows(8)
    try:
        c = plan(method, model, steps, {"input_ids": ids})
    except ValueError as e:
        assert (method == "every-other" and "divide" in str(e)) or (
            method == "sleb" and "causal LM" in str(e)) or (
            method == "pairs" and "do not fit" in str(e)), (method, str(e))
        return
    coarse = c.apply(model)
    assert coarse.evolution.num_steps == steps == c.steps
    assert c.fine_points[0] == 0 and c.fine_points[-1] == 6
    ref = _hf_reference(hf, method, steps, c).eval()
    with torch.no_grad():
        out = coarse(ids).last_hidden_state
        fine = model(ids).last_hidden_state
        assert float((out - ref(ids).last_hidden_state).abs().max()) < 1e-5
    # the coarse network is another function; a parallel step of these near-identity random
    # layers differs from the sequential ones at second order only (the frozen state's error,
    # O(|F| |grad F|) per pair of steps: about 1e-3 here)
    assert float((out - fine).abs().max()) > (1e-4 if method == "parallel" else 1e-2)
    assert type(c).from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_shortgpt_drops_the_least_influential_layers_of_transformers():
    hf = _hf()
    ids = _windows(8)
    model = splitformer.from_hf(hf).eval()  # before transformers' hidden-state hooks
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states
    bi = [1 - float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).mean())
          for a, b in zip(hidden[:-1], hidden[1:], strict=True)]
    want = sorted(sorted(range(6), key=lambda n: bi[n])[:3])
    c = plan("drop", model, 3, {"input_ids": ids})
    assert c.ops == (("drop_steps", tuple(want)),)
    assert c.note["block_influence"] == pytest.approx(bi, abs=1e-6)
    ref = copy.deepcopy(hf)
    ref.encoder.layer = nn.ModuleList(hf.encoder.layer[i] for i in range(6) if i not in want)
    with torch.no_grad():
        ours = c.apply(model)(ids).last_hidden_state
        assert float((ours - ref(ids).last_hidden_state).abs().max()) < 1e-5


def test_the_objective_is_zero_on_the_fine_path_and_names_bad_points():
    model = splitformer.from_hf(_hf()).eval()
    same = Distillation(model, model, range(7), shooting=1.0, embedding=1.0)
    obj = same({"input_ids": _windows(4)})
    assert float(obj.total.detach()) == pytest.approx(0.0, abs=1e-6)
    assert set(obj.parts) == {"terminal", "shooting", "embedding"}
    coarse = model.coarsen(2)
    d = Distillation(coarse, model, (0, 2, 4, 6), shooting=1.0)
    assert d.interior() == [(1, 2), (2, 4)]
    assert float(d({"input_ids": _windows(4)}).total.detach()) > 0
    with pytest.raises(ValueError, match="3 entries, the student has 4"):
        Distillation(coarse, model, (0, 2, 6))
    with pytest.raises(ValueError, match="shooting must be a number >= 0"):
        Distillation(coarse, model, (0, 2, 4, 6), shooting=-1)


def test_the_teacher_is_a_target_not_a_trained_submodule():
    """Distillation holds the fine model as a FineSolution value: only the student's parameters
    are the objective's, and the teacher gets no gradient from the cost."""
    teacher = splitformer.from_hf(_hf()).eval()
    student = copy.deepcopy(teacher).coarsen(2)
    d = Distillation(student, teacher, (0, 2, 4, 6), shooting=1.0, embedding=1.0)
    ours = {id(p) for p in d.parameters()}
    assert ours == {id(p) for p in student.parameters()}
    assert not ours & {id(p) for p in teacher.parameters()}
    assert all(k.startswith("student.") for k in d.state_dict())
    d({"input_ids": _windows(2)}).total.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None for p in student.parameters())


def _cfg(**kw) -> HealConfig:
    base = {"method": "drop", "steps": (3,), "budget": 1e6, "max_steps": 30, "lr": 1e-3,
            "batch_size": 4, "length": 16, "checkpoint_every": 10, "log_every": 5,
            "probe": 8, "warmup": 2}
    return HealConfig(**{**base, **kw})


def test_healing_lowers_the_terminal_cost():
    teacher = splitformer.from_hf(_hf()).eval()
    result = heal(_cfg(), teacher=teacher, windows=_windows(), out=None)
    losses = [r["terminal"] for r in result.history]
    assert result.metrics["steps_taken"] == 30 and losses[-1] < 0.5 * losses[0]
    # the student shares nothing with the teacher, whose flags are as they were
    assert not any(p is q for p in result.base.parameters() for q in teacher.parameters())
    teacher.train()
    heal(_cfg(max_steps=1), teacher=teacher, windows=_windows(), out=None)
    assert teacher.training and all(p.requires_grad for p in teacher.parameters())


def test_mixed_precision_healing_computes_in_bfloat16_and_keeps_float32_parameters():
    """precision="bfloat16": the objective runs under autocast (its first logged loss is not
    the float32 one, but within bfloat16's rounding of it), the parameters stay float32, and
    the terminal cost still falls."""
    teacher = splitformer.from_hf(_hf()).eval()
    full = heal(_cfg(max_steps=10), teacher=teacher, windows=_windows(), out=None)
    mixed = heal(_cfg(max_steps=10, precision="bfloat16"), teacher=teacher,
                 windows=_windows(), out=None)
    a, b = full.history[0]["terminal"], mixed.history[0]["terminal"]
    assert a != b and abs(a - b) < 0.05 * a
    assert all(p.dtype == torch.float32 for p in mixed.base.parameters())
    longer = heal(_cfg(precision="bfloat16"), teacher=teacher, windows=_windows(), out=None)
    losses = [r["terminal"] for r in longer.history]
    assert losses[-1] < 0.5 * losses[0]
    with pytest.raises(ValueError, match="precision must be one of"):
        _cfg(precision="float16")
    # the relation term's differences of cosines stay float32 under autocast
    student = copy.deepcopy(teacher)
    d = Distillation(student, teacher, list(range(7)), relation=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        obj = d({"input_ids": _windows(4)})
    assert obj.parts["relation"].dtype == torch.float32


def test_healing_the_controls_alone_keeps_the_lift_and_heals_theta():
    """healed="controls": the embeddings (the lift u(0) = E(ids)) end as the teacher's, bit
    for bit, while the controls of the kept steps move and the terminal cost still falls."""
    teacher = splitformer.from_hf(_hf()).eval()
    result = heal(_cfg(healed="controls"), teacher=teacher, windows=_windows(), out=None)
    losses = [r["terminal"] for r in result.history]
    assert losses[-1] < 0.5 * losses[0]
    fine = dict(teacher.named_parameters())
    moved = {n for n, p in result.base.named_parameters() if not torch.equal(p, fine[n])}
    assert moved and all(n.startswith("evolution.") for n in moved)
    assert any(n.startswith("embedding.") for n in fine)
    everything = heal(_cfg(), teacher=teacher, windows=_windows(), out=None)
    assert any(not torch.equal(p, fine[n]) for n, p in everything.base.named_parameters()
               if n.startswith("embedding."))
    with pytest.raises(ValueError, match=r"healed must be one of \['all', 'controls'\]"):
        _cfg(healed="embeddings")


def test_a_run_of_the_other_healed_set_is_refused_by_name(tmp_path):
    """A folder healed with every parameter is not resumed with the controls alone (its
    optimiser state holds other tensors): the refusal names the key, before any tensor is
    loaded."""
    teacher = splitformer.from_hf(_hf()).eval()
    heal(_cfg(max_steps=5), teacher=teacher, windows=_windows(), out=tmp_path)
    with pytest.raises(ValueError, match=r"differs in \['healed'\]; the run's: healed='all'"):
        heal(_cfg(max_steps=5, healed="controls"), teacher=teacher, windows=_windows(),
             out=tmp_path)


def test_cut_windows_keep_their_start_and_last_token_and_heal_short_inputs(monkeypatch):
    """min_length: each step's batch is cut to a length drawn in [min_length, length], the
    first l - 1 tokens and the last kept; healing on cut windows lowers the terminal cost on
    short inputs."""
    from splitformer.compression.heal import _cut

    cfg = _cfg(min_length=6)
    w = _windows(4)
    seen = set()
    for step in range(40):
        cut = _cut(w, cfg, step)
        n = cut.shape[1]
        seen.add(n)
        assert torch.equal(cut[:, :n - 1], w[:, :n - 1]) and torch.equal(cut[:, -1], w[:, -1])
        assert torch.equal(cut, _cut(w, cfg, step))  # the draw is the step's
    assert min(seen) >= 6 and max(seen) <= 16 and len(seen) > 5
    assert _cut(w, _cfg(), 3) is w
    teacher = splitformer.from_hf(_hf()).eval()
    import splitformer.compression.heal as heal_module

    lengths = []
    step_fn = heal_module._optimiser_step

    def recording(problem, optimizer, batch, *rest):
        lengths.append(batch.shape[1])
        return step_fn(problem, optimizer, batch, *rest)

    monkeypatch.setattr(heal_module, "_optimiser_step", recording)
    result = heal(cfg, teacher=teacher, windows=_windows(), out=None)
    assert lengths == [_cut(w, cfg, s).shape[1] for s in range(30)]  # the steps see the cuts
    losses = [r["terminal"] for r in result.history]
    assert losses[-1] < 0.5 * losses[0]
    for bad in (1, 17, True, 2.5):
        with pytest.raises(ValueError, match="min_length must be"):
            _cfg(min_length=bad)


def test_a_run_from_before_a_config_key_resumes_with_its_default(tmp_path):
    """A checkpoint whose config lacks a key added since (here ``precision``) is the run of
    that key's default: it is accepted; another value is refused by name."""
    from splitformer.compression.heal import _refuse_another_run

    cfg = _cfg(max_steps=10)
    old = cfg.to_dict()
    old.pop("precision")
    state = {"config": old, "teacher": "t", "windows": "w"}
    identity = {"teacher": "t", "windows": "w"}
    _refuse_another_run(tmp_path, state, cfg, identity)
    with pytest.raises(ValueError, match=r"another config \(differs in \['precision'\]; the "
                                         r"run's: precision='float32'\)"):
        _refuse_another_run(tmp_path, state, _cfg(max_steps=10, precision="bfloat16"),
                            identity)
    with pytest.raises(ValueError, match="another teacher"):
        _refuse_another_run(tmp_path, {**state, "teacher": "u"}, cfg, identity)


def test_a_killed_healing_run_resumes_to_the_uninterrupted_parameters(tmp_path):
    teacher = splitformer.from_hf(_hf()).eval()
    cfg = _cfg(shooting=1.0, method="coarsen-linear")
    whole = heal(cfg, teacher=teacher, windows=_windows(), out=tmp_path / "a")

    class Killed(Exception):
        pass

    def kill(row):
        if row["step"] == 15:
            raise Killed

    with pytest.raises(Killed):
        heal(cfg, teacher=teacher, windows=_windows(), out=tmp_path / "b", progress=kill)
    assert not (tmp_path / "b" / "final.json").exists()
    resumed = heal(cfg, teacher=teacher, windows=_windows(), out=tmp_path / "b")
    assert resumed.metrics["steps_taken"] == 30
    for (name, p), q in zip(whole.base.state_dict().items(), resumed.base.state_dict().values(),
                            strict=True):
        assert torch.equal(p, q), name
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [5, 10, 15, 20, 25, 30]
    with pytest.raises(ValueError, match="another config"):
        heal(_cfg(lr=2e-3), teacher=teacher, windows=_windows(), out=tmp_path / "b")


def test_random_tau_healing_serves_every_depth():
    """One set of parameters healed at N_t drawn from {6, 3, 2} lowers the terminal cost of
    the coarse depths on held-out windows, and each student is its own coarse grid of them."""
    teacher = splitformer.from_hf(perturb_(_hf(), seed=5, scale=0.05)).eval()  # layers that act
    cfg = _cfg(method="coarsen-linear", steps=(6, 3, 2), max_steps=24)
    result = heal(cfg, teacher=teacher, windows=_windows(), out=None)
    assert {r["steps"] for r in result.history} <= {6, 3, 2}
    held_out = {"input_ids": torch.randint(0, 60, (8, 16),
                                           generator=torch.Generator().manual_seed(11))}
    for n in (3, 2):
        c = plan("coarsen-linear", teacher, n)
        before = Distillation(c.apply(teacher).eval(), teacher, c.fine_points)(held_out)
        student = result.student(n)
        assert student.evolution.num_steps == n
        after = Distillation(student, teacher, c.fine_points)(held_out)
        assert float(after.terminal) < 0.8 * float(before.terminal), n
    with pytest.raises(ValueError, match="healed for"):
        result.student(4)


def test_the_result_folder_loads_in_splitformer_and_transformers(tmp_path):
    teacher = splitformer.from_hf(_hf()).eval()
    result = heal(_cfg(max_steps=5), teacher=teacher, windows=_windows(), out=None)
    record = write_result(tmp_path, base=result.base, coarsenings=result.coarsenings, default=3,
                          info={}, tokenizer_from=None)
    assert record["hf"] == "hf"
    ids = _windows(3)
    student = result.student(3)
    loaded = splitformer.load(tmp_path)
    hf = transformers.AutoModel.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    assert hf.config.num_hidden_layers == 3
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert len(set(modes.values())) == 1, modes  # the weights readable as the config is
    with torch.no_grad():
        want = student(ids).last_hidden_state
        assert torch.equal(loaded(ids).last_hidden_state, want)
        assert float((hf(ids).last_hidden_state - want).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="healed for N_t in"):
        load_compressed(tmp_path, steps=2)
    with pytest.raises(TypeError, match="steps must be an int"):
        splitformer.load(tmp_path, steps=[3])
    with pytest.raises(ValueError, match="not a compression folder"):
        splitformer.load(tmp_path / "hf", steps=3)


def test_heal_config_refuses_bad_values():
    for kw, match in [({"method": "nope"}, "method must be one of"),
                      ({"steps": (0,)}, "steps must be distinct"),
                      ({"steps": (3, 3)}, "steps must be distinct"),
                      ({"budget": -1}, "budget must be"),
                      ({"lr": float("nan")}, "lr must be"),
                      ({"batch_size": 0}, "batch_size must be"),
                      ({"max_steps": -2}, "max_steps must be")]:
        with pytest.raises(ValueError, match=match):
            _cfg(**kw)
    teacher = splitformer.from_hf(_hf()).eval()
    with pytest.raises(ValueError, match="windows must be a 2-D integer tensor"):
        heal(_cfg(), teacher=teacher, windows=torch.zeros(4, 8), out=None)
    with pytest.raises(ValueError, match=r"steps must be an int in \[1, 6\]"):
        plan("drop", teacher, 7, {"input_ids": _windows(4)})


def test_a_parallel_result_folder_loads_in_splitformer_and_says_why_no_hf(tmp_path):
    """A healed parallel grid round-trips through the result folder (its superposed step
    rebuilt from compress.json) and writes no HF folder, saying why (no layer sums fields)."""
    teacher = splitformer.from_hf(_hf()).eval()
    result = heal(_cfg(method="parallel", max_steps=3), teacher=teacher, windows=_windows(),
                  out=None)
    record = write_result(tmp_path, base=result.base, coarsenings=result.coarsenings, default=3,
                          info={}, tokenizer_from=None)
    assert record["hf"] is None and "superposition" in record["hf_note"]
    assert not (tmp_path / "hf").exists()
    ids = _windows(3)
    with torch.no_grad():
        assert torch.equal(splitformer.load(tmp_path)(ids).last_hidden_state,
                           result.student(3)(ids).last_hidden_state)


def test_the_relation_term_is_the_pair_cosines_of_transformers_embeddings():
    """w_r's part: mean over pairs b != b' of (cos(e_c,b, e_c,b') - cos(e_f,b, e_f,b'))^2,
    e the mean of the last hidden state, computed here from transformers' own models (the
    fine BertModel and the BertModel without the dropped layers); zero for the fine model
    against itself; a batch of one and a config of batch_size 1 refused."""
    hf = _hf().double()
    model = splitformer.from_hf(hf).eval()
    ids = _windows(5)
    c = plan("drop", model, 3, {"input_ids": ids})
    ref = _hf_reference(hf, "drop", 3, c).eval()
    obj = Distillation(c.apply(model).eval(), model, c.fine_points, relation=2.0)
    with torch.no_grad():
        got = obj({"input_ids": ids})
        ec = ref(ids).last_hidden_state.double().mean(1)
        ef = hf(ids).last_hidden_state.double().mean(1)
    cos = torch.nn.functional.cosine_similarity
    want = sum((float(cos(ec[a], ec[b], dim=0)) - float(cos(ef[a], ef[b], dim=0))) ** 2
               for a in range(5) for b in range(5) if a != b) / 20
    assert float(got.parts["relation"]) == pytest.approx(want, rel=1e-6)
    assert want > 1e-8  # float64: the pair cosines differ by about 4e-4 here
    assert float(got.total) == pytest.approx(float(got.terminal) + 2 * want, rel=1e-6)
    same = Distillation(model, model, list(range(7)), relation=1.0)
    with torch.no_grad():
        assert float(same({"input_ids": ids}).parts["relation"]) == 0.0
        with pytest.raises(ValueError, match="at least two inputs"):
            obj({"input_ids": ids[:1]})
    with pytest.raises(ValueError, match="relation needs batch_size >= 2"):
        _cfg(relation=1.0, batch_size=1)
    with pytest.raises(ValueError, match="relation must be"):
        _cfg(relation=-1.0)


def test_a_checkpoint_every_so_many_seconds_survives_a_kill(tmp_path):
    """checkpoint_seconds: a run killed (an exception that writes nothing, as kill -9) long
    before checkpoint_every steps has a checkpoint to resume from; killed before any, the run
    says it starts over. A run that ended keeps no lock file."""
    teacher = splitformer.from_hf(_hf()).eval()
    cfg = _cfg(checkpoint_every=1000, checkpoint_seconds=1e-6)

    class Killed(Exception):
        pass

    def kill(row):
        if row["step"] == 10:
            raise Killed

    with pytest.raises(Killed):
        heal(cfg, teacher=teacher, windows=_windows(), out=tmp_path / "a", progress=kill)
    from splitformer.training.checkpoints import latest_checkpoint

    assert latest_checkpoint(tmp_path / "a").name == "ckpt-000000009"
    said = []
    resumed = heal(cfg, teacher=teacher, windows=_windows(), out=tmp_path / "a",
                   notice=said.append)
    assert resumed.metrics["steps_taken"] == 30 and said[1].startswith("resuming from step 9")
    assert not (tmp_path / "a" / ".lock").exists()
    with pytest.raises(Killed):  # a kill -9 before the first checkpoint leaves the lock file
        heal(_cfg(), teacher=teacher, windows=_windows(), out=tmp_path / "b", progress=kill)
    (tmp_path / "b" / ".lock").write_text("pid 1")
    said = []
    heal(_cfg(), teacher=teacher, windows=_windows(), out=tmp_path / "b", notice=said.append)
    assert "starting over: the killed run left no checkpoint" in said
    with pytest.raises(ValueError, match="checkpoint_seconds must be"):
        _cfg(checkpoint_seconds=0)


def test_a_run_resumes_with_a_longer_budget_and_heals_on_when_finished(tmp_path):
    """budget and max_steps may change on resume (RESUMABLE); a finished run with a config
    that allows more steps heals on from its checkpoint; the others are refused by name."""
    teacher = splitformer.from_hf(_hf()).eval()
    short = heal(_cfg(max_steps=10), teacher=teacher, windows=_windows(), out=tmp_path)
    assert short.metrics["steps_taken"] == 10
    again = heal(_cfg(max_steps=10, budget=5.0), teacher=teacher, windows=_windows(),
                 out=tmp_path)
    assert again.metrics == short.metrics  # nothing more to do: returned as it was
    said = []
    longer = heal(_cfg(max_steps=20), teacher=teacher, windows=_windows(), out=tmp_path,
                  notice=said.append)
    assert longer.metrics["steps_taken"] == 20 and "healing on from step 10" in said[1]
    before = short.base.state_dict()
    assert any(not torch.equal(v, before[k]) for k, v in longer.base.state_dict().items())
    with pytest.raises(ValueError, match=r"differs in \['lr'\]"):
        heal(_cfg(max_steps=30, lr=2e-3), teacher=teacher, windows=_windows(), out=tmp_path)


def test_a_finished_run_without_checkpoints_heals_on_from_its_parameters(tmp_path):
    """compress's finished folder keeps no checkpoint: given the healed parameters, heal
    continues from them (AdamW's moments afresh, a new warm-up); without them it is refused."""
    from splitformer.compression.heal import _progress_lr
    from splitformer.training.checkpoints import remove_checkpoints

    teacher = splitformer.from_hf(_hf()).eval()
    first = heal(_cfg(max_steps=10), teacher=teacher, windows=_windows(), out=tmp_path)
    remove_checkpoints(tmp_path)
    with pytest.raises(ValueError, match="checkpoints were removed"):
        heal(_cfg(max_steps=20), teacher=teacher, windows=_windows(), out=tmp_path)
    weights = {k: v.clone() for k, v in first.base.state_dict().items()}
    on = heal(_cfg(max_steps=20), teacher=teacher, windows=_windows(), out=tmp_path,
              healed=weights)
    assert on.metrics["steps_taken"] == 20
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    cfg = _cfg(max_steps=20)  # the warm-up (2 steps here) starts again at step 10
    assert _progress_lr(cfg, 10, 0.0, (10, 0.0)) == pytest.approx(
        0.5 * _progress_lr(cfg, 10, 0.0))
    other = splitformer.from_hf(perturb_(_hf(), seed=1)).eval()
    with pytest.raises(ValueError, match="another teacher"):
        heal(_cfg(max_steps=30), teacher=other, windows=_windows(), out=tmp_path,
             healed=weights)


def test_nothing_healed_writes_no_checkpoint(tmp_path):
    """budget 0 (the training-free model): final.json, and no checkpoint (no weights, no
    AdamW moments)."""
    teacher = splitformer.from_hf(_hf()).eval()
    result = heal(_cfg(budget=0.0, max_steps=0), teacher=teacher, windows=_windows(),
                  out=tmp_path)
    assert result.metrics["steps_taken"] == 0 and (tmp_path / "final.json").is_file()
    assert not list(tmp_path.glob("ckpt-*")) and not (tmp_path / "latest").exists()


def test_a_short_run_does_not_end_inside_its_warm_up():
    """The warm-up ends after ``warmup`` steps or 10% of the progress, whichever is first: a
    run of 10 steps against a warm-up of 20 reaches its full rate at step 1 (the cosine's)."""
    from splitformer.compression.heal import _progress_lr, _warm

    cfg = _cfg(max_steps=10, warmup=20, lr=1e-3)
    rates = [_progress_lr(cfg, s, 0.0) for s in range(10)]
    assert rates[0] == pytest.approx(1e-3 / 20)
    assert rates[1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.1)))
    assert _warm(cfg, 1, 0.0) == (1.0, True)
    budget = _cfg(max_steps=None, budget=60.0, warmup=20, lr=1e-3)  # by seconds
    assert _warm(budget, 3, 6.0) == (1.0, True) and _warm(budget, 3, 3.0)[0] == 0.5
    long = _cfg(max_steps=10_000, warmup=20)  # a long run: the 20 steps, as before
    assert _warm(long, 19, 0.0) == (1.0, False) and _warm(long, 9, 0.0)[0] == 0.5


def test_the_result_weights_are_checked_against_their_sha256(tmp_path):
    """compress.json records the size and SHA-256 of model.safetensors (the training
    checkpoints' entries); 100 zeroed bytes are refused by name, as in a checkpoint; a folder
    from before the record loads with a warning."""
    from splitformer.training.checkpoints import CheckpointError

    teacher = splitformer.from_hf(_hf()).eval()
    result = heal(_cfg(max_steps=2), teacher=teacher, windows=_windows(), out=None)
    record = write_result(tmp_path, base=result.base, coarsenings=result.coarsenings,
                          default=3, info={}, tokenizer_from=None)
    entry = record["files"]["model.safetensors"]
    data = (tmp_path / "model.safetensors").read_bytes()
    assert entry["bytes"] == len(data) and len(entry["sha256"]) == 64
    splitformer.load(tmp_path)
    damaged = bytearray(data)
    damaged[len(data) // 2:len(data) // 2 + 100] = bytes(100)
    (tmp_path / "model.safetensors").write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="model.safetensors: content does not match the "
                                              "sha256 in compress.json"):
        splitformer.load(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(data)
    old = json.loads((tmp_path / "compress.json").read_text())
    del old["files"]
    (tmp_path / "compress.json").write_text(json.dumps(old))
    with pytest.warns(UserWarning, match="records no SHA-256 of model.safetensors"):
        splitformer.load(tmp_path)
