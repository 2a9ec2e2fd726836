"""Shrinking a causal LM in t (docs/depth-llm.md, docs/math.md 3.20): the fitted coarse steps,
the step rankings and SLEB, the next-token healing objective, against transformers."""

from __future__ import annotations

import copy
import itertools
import random

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import splitformer as sf  # noqa: E402
from splitformer.compression.coarsenings import _least_pairs, plan  # noqa: E402
from splitformer.compression.fitting import (  # noqa: E402
    FitConfig,
    absorbers,
    fit,
    relative_error,
)
from splitformer.compression.heal import HealConfig, heal, healed_copy  # noqa: E402
from splitformer.compression.rankings import (  # noqa: E402
    merge_errors,
    removal_losses,
    sleb_order,
)
from splitformer.control.healing import Distillation, next_token_kl  # noqa: E402
from splitformer.time import SaveAt  # noqa: E402

torch.set_default_dtype(torch.float32)


def tiny(layers: int = 4, seed: int = 0, tie: bool = True):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=tie)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # trained-looking layers: not all at their init scale
        for p in hf.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return hf, sf.from_hf(hf).eval()


def ids(m: int = 6, n: int = 20, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 96, (m, n), generator=torch.Generator().manual_seed(seed))


def hf_without(hf, drop: list[int]):
    """transformers' model with the layers ``drop`` deleted and the rest renumbered."""
    out = copy.deepcopy(hf)
    keep = [i for i in range(len(out.model.layers)) if i not in drop]
    out.model.layers = torch.nn.ModuleList([out.model.layers[i] for i in keep])
    for j, layer in enumerate(out.model.layers):
        layer.self_attn.layer_idx = j
    out.config.num_hidden_layers = len(keep)
    return out


def lm_loss(hf, x: torch.Tensor) -> float:
    with torch.no_grad():
        logits = hf(input_ids=x).logits
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten()))


def test_removal_losses_are_transformers_losses_without_that_layer():
    hf, m = tiny()
    x = ids()
    found = removal_losses(m, x, batch=4)
    assert found["loss"] == pytest.approx(lm_loss(hf, x), rel=1e-5)
    for n in range(4):
        assert found["removal"][n] == pytest.approx(lm_loss(hf_without(hf, [n]), x), rel=1e-5)


def test_sleb_removes_the_step_of_least_loss_then_the_next_given_it():
    hf, m = tiny(layers=5)
    x = ids()
    order = sleb_order(m, x, 2, batch=4)
    first = min(range(5), key=lambda n: lm_loss(hf_without(hf, [n]), x))
    assert order["order"][0] == first
    second = min((n for n in range(5) if n != first),
                 key=lambda n: lm_loss(hf_without(hf, [first, n]), x))
    assert order["order"][1] == second
    assert order["losses"][1] == pytest.approx(lm_loss(hf_without(hf, [first, second]), x),
                                               rel=1e-5)
    c = plan("sleb", m, 3, {"input_ids": x})
    assert c.ops == (("drop_steps", tuple(sorted([first, second]))),)


def test_least_pairs_is_the_least_sum_of_disjoint_neighbour_pairs():
    rng = random.Random(0)
    for _ in range(30):
        L = rng.randint(2, 9)
        e = [rng.random() for _ in range(L - 1)]
        for k in range(1, L // 2 + 1):
            got = _least_pairs(e, k)
            assert len(got) == k and all(b - a >= 2 for a, b in itertools.pairwise(got))
            best = min(sum(e[i] for i in c)
                       for c in itertools.combinations(range(L - 1), k)
                       if all(b - a >= 2 for a, b in itertools.pairwise(c)))
            assert sum(e[i] for i in got) == pytest.approx(best)


def test_a_merged_pair_is_one_step_of_tau_two_at_the_average_controls():
    """absorb="average" on the pair (0, 1) of a 2-step network is coarsen-linear's step (the
    controls at the midpoint of [0, 2], tau = 2), and its export is transformers' layer."""
    hf, m = tiny(layers=2)
    x = ids()
    c = plan("keep-first", m, 1)  # keep step 0, drop 1: step 0 absorbs [0, 2]
    assert absorbers(c)[0].span == 2
    base = healed_copy(m)
    fit(base, c, FitConfig(absorb="average"))
    merged = c.apply(base).eval()
    reference = m.with_controls_in_time("linear").coarsen(2).eval()
    with torch.no_grad():
        a, b = merged(input_ids=x).logits, reference(input_ids=x).logits
        exported = sf.to_hf(merged).eval()
        assert exported.config.num_hidden_layers == 1
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(exported(input_ids=x).logits, a, rtol=1e-5, atol=1e-5)


def test_merge_error_is_the_relative_error_of_the_merged_step():
    hf, m = tiny(layers=3)
    x = ids()
    e = merge_errors(m, x)
    base = healed_copy(m)
    c = plan("keep-first", m, 2)  # keep 0, 1; step 1 absorbs [1, 3]
    fit(base, c, FitConfig(absorb="average"))
    with torch.no_grad():
        states = m.trajectory(input_ids=x, saveat=SaveAt(steps=True)).state_list
        coarse = c.apply(base).trajectory(input_ids=x, saveat=SaveAt(steps=True)).state_list
        assert e[1] == pytest.approx(float(relative_error(coarse[2].double(),
                                                          states[3].double())), rel=1e-4)


def test_least_squares_map_beats_the_kept_step_and_folds_exactly_into_w_d():
    hf, m = tiny(layers=4)
    x = ids(m=8, n=24)
    c = plan("keep-first", m, 2)  # step 1 absorbs [1, 4]
    base = healed_copy(m)
    report = fit(base, c, FitConfig(absorb="linear", ridge=0.0), teacher=m, calibration=x)
    (row,) = report["fits"].values()
    assert row["relative_error_fitted"] < row["relative_error_kept"]
    with torch.no_grad():
        fine = m.trajectory(input_ids=x, saveat=SaveAt(steps=True)).state_list
        coarse = c.apply(base).trajectory(input_ids=x, saveat=SaveAt(steps=True)).state_list
    measured = float(relative_error(coarse[2].double(), fine[4].double()))
    assert measured == pytest.approx(row["relative_error_fitted"], rel=1e-4)
    # only the absorbing step's W_d changed, and the export is transformers' network
    changed = [k for k, v in base.state_dict().items()
               if not torch.equal(v, m.state_dict()[k])]
    assert changed == ["evolution.controls.sets.1.ffn.down.weight"]
    exported = sf.to_hf(c.apply(base)).eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=x).logits,
                                   c.apply(base)(input_ids=x).logits, rtol=1e-4, atol=1e-4)


def test_fitted_step_lowers_its_shooting_error_and_touches_only_itself():
    hf, m = tiny(layers=4)
    x = ids(m=8, n=16)
    c = plan("keep-first", m, 2)
    base = healed_copy(m)
    report = fit(base, c, FitConfig(absorb="step", budget=0, max_steps=40, lr=1e-3),
                 teacher=m, calibration=x)
    (row,) = report["fits"].values()
    assert row["adam_steps"] == 40 and row["last_loss"] < 0.8 * row["first_loss"]
    changed = {k.split(".")[3] for k, v in base.state_dict().items()
               if not torch.equal(v, m.state_dict()[k])}
    assert changed == {"1"}


def test_fitted_step_from_the_least_squares_map_starts_at_its_error_and_goes_below():
    """init="linear": the AdamW fit starts from the kept step with ReplaceMe's map folded in
    (its first loss, on one batch, near the map's error on all windows) and ends below the
    map's error; the report holds both."""
    hf, m = tiny(layers=4)
    x = ids(m=8, n=16)
    c = plan("keep-first", m, 2)
    linear = healed_copy(m)
    (ls,) = fit(linear, c, FitConfig(absorb="linear"), teacher=m,
                calibration=x)["fits"].values()
    base = healed_copy(m)
    (row,) = fit(base, c, FitConfig(absorb="step", init="linear", budget=0, max_steps=60,
                                    lr=1e-3, batch=8),
                 teacher=m, calibration=x)["fits"].values()
    assert row["relative_error_fitted"] == pytest.approx(ls["relative_error_fitted"])
    # one batch of 8 drawn with replacement: near the map's error, far below the kept step's
    assert row["first_loss"] == pytest.approx(ls["relative_error_fitted"], rel=0.05)
    assert row["first_loss"] < 0.8 * ls["relative_error_kept"]
    assert row["last_loss"] < 0.9 * ls["relative_error_fitted"]
    # measured on every window after the fit: below the map's error, on the same windows
    assert row["relative_error_after_adam"] < ls["relative_error_fitted"]
    with pytest.raises(ValueError, match="init must be one of"):
        FitConfig(absorb="step", init="ridge", budget=1)
    with pytest.raises(ValueError, match="fit_init='linear' is where fit='step' starts"):
        HealConfig(fit="linear", fit_init="linear")
    with pytest.raises(ValueError, match="fit_init must be one of"):
        HealConfig(fit="step", fit_budget=1, fit_init="ridge")


def test_seed_groups_are_one_command_at_several_seeds_per_n():
    from splitformer.experiments.depth_llm import seed_groups

    rows = [{"run": "heal-22-a-s0", "steps": 22}, {"run": "heal-22-a-s1", "steps": 22},
            {"run": "heal-x", "steps": 22}, {"run": "heal-x", "steps": 15},
            {"run": "heal-22-b-s0", "steps": 22}]
    groups = seed_groups(rows)
    assert list(groups) == [("heal-22-a", 22)]  # one run at two N is not two seeds
    assert [r["run"] for r in groups[("heal-22-a", 22)]] == ["heal-22-a-s0", "heal-22-a-s1"]


def test_seed_groups_at_one_n_are_compared_by_welchs_t_test(capsys):
    """Two seed groups at one N: the printed difference of means and Welch's t are
    scipy.stats' (groups at other N are not compared)."""
    from scipy import stats

    from splitformer.experiments.depth_llm import _compare_seed_groups

    a, b = [1.83, 1.84, 1.835], [1.90, 1.92, 1.905]
    groups = {("heal-22-a", 22): [{"perplexity_ratio": x} for x in a],
              ("heal-22-b", 22): [{"perplexity_ratio": x} for x in b],
              ("heal-15-a", 15): [{"perplexity_ratio": x} for x in (3.3, 3.4)]}
    _compare_seed_groups(groups)
    lines = capsys.readouterr().out.splitlines()
    t = stats.ttest_ind(a, b, equal_var=False)
    assert lines == [f"heal-22-a - heal-22-b at N=22: perplexity ratio "
                     f"{sum(a) / 3 - sum(b) / 3:+.4f} (Welch's t {t.statistic:.2f}, p "
                     f"{t.pvalue:.2g}, 3 and 3 seeds)"]


def test_the_table_names_the_shooting_weight_beside_the_kl(tmp_path, capsys):
    """A healed row's line says "+ kl + shooting w" when its compress.json healed with both,
    and "+ kl" alone when w_s is 0 or absent (runs before --shooting)."""
    import json

    from splitformer.experiments.depth_llm import table

    (tmp_path / "healed").mkdir()
    (tmp_path / "training-free.jsonl").write_text("")
    measures = {"perplexity": 30.0, "perplexity_ratio": 1.5, "bits_per_byte": 1.2, "kl": 0.7,
                "top1": 0.6}
    for name, config in (("a-s0", {"fit": "keep", "shooting": 0.3}), ("b-s0", {"fit": "keep"}),
                         ("c-s0", {"fit": "keep", "shooting": 0.0})):
        (tmp_path / "healed" / f"{name}.json").write_text(json.dumps(
            {"heal": config, "method": "drop", "objective": "kl", "fidelity": {"22": measures},
             "metrics": {"steps_taken": 260, "seconds": 1800.0}}))
    table(tmp_path)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("healed")]
    assert [line.split(": N=22 drop fit keep (nothing fitted) ")[1].split(" (260")[0]
            for line in lines] == ["+ kl + shooting 0.3", "+ kl", "+ kl"]


def test_next_token_kl_is_torch_kl_div_per_node():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 5, 11, generator=g), torch.randn(2, 5, 11, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    per = F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True,
                   reduction="none").sum(-1)
    assert float(next_token_kl(s, t, None)) == pytest.approx(float(per.mean()), rel=1e-6)
    assert float(next_token_kl(s, t, mask)) == pytest.approx(
        float(per[mask.bool()].mean()), rel=1e-6)


def test_a_causal_lms_shooting_weighs_each_token_by_its_own_norm():
    """With the next-token term on, the shooting terms are sum_i mean_x |u_c(x, t_i) -
    u_f(x, s_i)|^2 / |u_f(x, s_i)|^2 (each token relative to its own norm, not a ratio of
    sums over the tokens, which SmolLM2's sink would dominate; without the KL they stay
    ratios of sums), read here from transformers'
    hidden states of the teacher and of the teacher with layer 1 deleted (``hf_without``):
    coarse point j is the input of the j-th kept step, fine point keep[j]."""
    hf, m = tiny(layers=6)
    x = ids(m=3, n=12)
    d = Distillation(sf.from_hf(hf_without(hf, [1])).eval(), m, [0, 2, 3, 4, 5, 6],
                     shooting=1.0, next_token=1.0, terminal=0.0)
    with torch.no_grad():
        obj = d({"input_ids": x})
        fine = hf(input_ids=x, output_hidden_states=True).hidden_states
        coarse = hf_without(hf, [1])(input_ids=x, output_hidden_states=True).hidden_states
    pairs = ((1, 2), (2, 3), (3, 4), (4, 5))  # the interior points; 0 and T are not shot at
    per_token = sum(((coarse[i] - fine[p]).pow(2).sum(-1) / fine[p].pow(2).sum(-1)).mean()
                    for i, p in pairs)
    of_sums = sum((coarse[i] - fine[p]).pow(2).sum(-1).mean() / fine[p].pow(2).sum(-1).mean()
                  for i, p in pairs)
    assert float(obj.parts["shooting"]) == pytest.approx(float(per_token), rel=1e-4)
    assert abs(float(of_sums) - float(per_token)) > 1e-3 * float(per_token)
    assert float(obj.total) == pytest.approx(float(obj.parts["next_token"] + per_token),
                                             rel=1e-4)
    # without the KL (--heal shoot, and every encoder) they stay ratios of sums
    d.next_token, d.terminal = 0.0, 1.0
    with torch.no_grad():
        assert float(d({"input_ids": x}).parts["shooting"]) == pytest.approx(float(of_sums),
                                                                            rel=1e-4)


def _kl_to_teacher(student, teacher, x) -> float:
    with torch.no_grad():
        s, t = student(input_ids=x).logits, teacher(input_ids=x).logits
    return float(F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True,
                          reduction="none").sum(-1).mean())


def test_heal_on_next_token_kl_after_the_linear_fit():
    """The local phase is the linear fit alone (max_steps 0 heals nothing after it); 12 KL
    steps then lower the KL to the teacher on held-out windows, measured with torch's kl_div;
    terminal weight 0 leaves the state term out of the loss."""
    hf, m = tiny(layers=4)
    windows, held_out = ids(m=16, n=16, seed=3), ids(m=8, n=16, seed=9)
    common = dict(method="keep-first", steps=(2,), budget=600, lr=3e-3, batch_size=4,
                  length=16, next_token=1.0, terminal=0.0, fit="linear", warmup=0,
                  log_every=1)
    base = healed_copy(m)
    c = plan("keep-first", m, 2)
    fit(base, c, FitConfig(absorb="linear"), teacher=m, calibration=windows[:64])
    before = _kl_to_teacher(c.apply(base).eval(), m, held_out)
    result = heal(HealConfig(**common, max_steps=12), teacher=m, windows=windows, out=None)
    assert result.metrics["steps_taken"] == 12
    assert result.metrics["fit"]["absorb"] == "linear"
    after = _kl_to_teacher(result.student(2), m, held_out)
    assert after < 0.9 * before
    row = result.history[-1]
    assert row["loss"] == pytest.approx(row["next_token"])  # w_T = 0: KL alone


def test_fit_config_refuses_by_name():
    with pytest.raises(ValueError, match="absorb must be one of"):
        FitConfig(absorb="median")
    with pytest.raises(ValueError, match="needs a budget"):
        FitConfig(absorb="step", budget=0)
    with pytest.raises(ValueError, match="fit must be one of"):
        HealConfig(fit="median")
    with pytest.raises(ValueError, match="one grid"):
        HealConfig(fit="linear", steps=(3, 2))
    hf, m = tiny(layers=4)
    with pytest.raises(ValueError, match="grid of kept steps"):
        absorbers(plan("coarsen", m, 2))
    with pytest.raises(ValueError, match="pairs"):
        plan("pairs", m, 1, {"input_ids": ids()})
