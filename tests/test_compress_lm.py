"""`splitformer compress` on a causal LM (docs/depth-llm.md): the flags that belong to one kind
of model refused on the other by name, and a short real run whose DIR and DIR/hf (renumbered
layers) give transformers' logits and greedy ids."""

from __future__ import annotations

import json

import pytest
import torch
from _cli import cli
from _optional_data import needs

transformers = pytest.importorskip("transformers")


def tiny_folder(path, layers: int = 4):
    """A random LlamaForCausalLM with a word-level tokenizer, saved as transformers does."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "[BOS]", "[EOS]", *"the and of to in that he shall unto for i his a lord "
             "they be is him not them it with all thou thy was god which my me said but ye "
             "their have will thee from as are when this out were upon man by you".split()]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                                bos_token="[BOS]", eos_token="[EOS]")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.mark.parametrize("argv, flag", [
    (["--news", "0.5"], "--news"),
    (["--merge", "2"], "--merge"),
    (["--embedding", "1"], "--embedding"),
    (["--recipe", "best"], "--recipe"),
    (["--fit-budget", "5m"], "--fit-budget"),  # --fit is keep by default when healing
    (["--fit", "keep", "--fit-steps", "10"], "--fit-steps"),
    (["--fit-init", "linear"], "--fit-init"),  # starts --fit step; --fit is keep
    (["--heal", "none", "--fit-init", "linear"], "--fit-init"),  # --fit is linear
    (["--heal", "none", "--steps", "3,2"], "--steps"),  # --fit linear fits one grid
    (["--heal", "none", "--lr", "1e-4"], "--lr"),
    (["--fit", "step", "--fit-budget", "0"], "argument --fit-budget"),  # named, not fit_budget
    (["--heal", "none", "--shooting", "0.3"], "--shooting"),  # nothing healed
    (["--heal", "distill", "--shooting", "1"], "--shooting"),  # u(T) alone
])
def test_encoder_flags_and_misplaced_fit_flags_are_refused_for_a_causal_lm(
        argv, flag, capsys, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    rc, out, err = cli(["compress", str(model), *argv, "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and flag in err, err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("where, words", [
    ("f/o", "cannot be created"),  # under a file
    ("x" * 300 + "/o", "not a usable folder name"),  # was an OSError traceback
])
def test_an_out_that_cannot_be_made_is_refused_before_model_is_read(where, words, capsys,
                                                                     tmp_path):
    """MODEL here has a config and no weights: reading it would fail on the weights, so a
    refusal naming --out shows that --out was checked first (it was found after loading)."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "f").write_text("a file")
    rc, out, err = cli(["compress", str(model), "--out", str(tmp_path / where)], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--out" in err and words in err and "Traceback" not in err


@pytest.mark.parametrize("argv, flag", [
    (["--heal", "kl"], "--heal"),
    (["--fit", "linear"], "--fit"),
    (["--fit-steps", "3"], "--fit-steps"),
    (["--fit-init", "average"], "--fit-init"),
])
def test_causal_lm_flags_are_refused_for_an_encoder(argv, flag, capsys, tmp_path):
    rc, out, err = cli(["compress", *argv, "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and flag in err and len(err.strip().splitlines()) == 1, err


def test_fit_init_reaches_the_heal_config_of_a_causal_lm(tmp_path):
    from splitformer.cli import build_parser
    from splitformer.commands.compress import _heal_config

    model = tiny_folder(tmp_path / "m")
    args = build_parser().parse_args(["compress", str(model), "--fit", "step", "--fit-init",
                                      "linear", "--fit-steps", "5"])
    cfg = _heal_config(args)
    assert (cfg.fit, cfg.fit_init, cfg.fit_steps) == ("step", "linear", 5)
    assert cfg.fit_config().init == "linear"
    plain = _heal_config(build_parser().parse_args(["compress", str(model), "--fit", "step"]))
    assert plain.fit_init == "keep" and plain.fit_budget == 240.0


@pytest.mark.parametrize("argv, weights", [
    ([], (0.0, 1.0, 0.0)),  # (w_s, w_k, w_T): the KL alone
    (["--shooting", "0.3"], (0.3, 1.0, 0.0)),  # the states at the coarse grid's times too
    (["--heal", "shoot"], (1.0, 0.0, 1.0)),
    (["--heal", "shoot", "--shooting", "2"], (2.0, 0.0, 1.0)),
])
def test_shooting_weighs_kl_or_shoot_for_a_causal_lm(argv, weights, tmp_path):
    from splitformer.cli import build_parser
    from splitformer.commands.compress import _heal_config

    model = tiny_folder(tmp_path / "m")
    cfg = _heal_config(build_parser().parse_args(["compress", str(model), *argv]))
    assert (cfg.shooting, cfg.next_token, cfg.terminal) == weights


@pytest.mark.parametrize("argv, fit", [
    ([], "keep"),  # healed (--heal kl): deletion heals best (docs/depth-llm.md)
    (["--heal", "none"], "linear"),  # training-free: the least-squares map is best
    (["--heal", "none", "--fit", "keep"], "keep"),  # a given --fit wins
    (["--fit", "linear"], "linear"),
    (["--heal", "none", "--method", "parallel", "--steps", "2"], "keep"),  # nothing to fit
    (["--heal", "none", "--method", "coarsen", "--steps", "2"], "keep"),
])
def test_the_default_fit_of_a_causal_lm_follows_heal(argv, fit, tmp_path):
    from splitformer.cli import build_parser
    from splitformer.commands.compress import _heal_config

    model = tiny_folder(tmp_path / "m")
    args = build_parser().parse_args(["compress", str(model), *argv])
    cfg = _heal_config(args)
    assert cfg.fit == fit
    # the causal-LM healing defaults measured in docs/depth-llm.md (an encoder's lr is 1e-4)
    assert (cfg.lr, cfg.batch_size, cfg.healed) == (3e-4, 4, "controls")


def test_bad_grids_of_a_causal_lm_are_named_before_anything_is_written(capsys, tmp_path):
    model = tiny_folder(tmp_path / "m")
    capsys.readouterr()
    for argv, flag in ((["--steps", "4"], "--steps"), (["--steps", "9"], "--steps"),
                       (["--steps", "1", "--method", "pairs"], "--steps"),
                       (["--steps", "2", "--method", "coarsen", "--fit", "linear"], "--fit"),
                       (["--steps", "2", "--length", "4096"], "--length")):
        rc, out, err = cli(["compress", str(model), *argv, "--heal", "none", "--out",
                            str(tmp_path / "o")], capsys)
        last = err.strip().splitlines()[-1]  # after the progress line "reading MODEL"
        assert rc == 2 and flag in last and last.startswith("splitformer compress: error"), err
        assert "Traceback" not in err and not (tmp_path / "o").exists()


@needs("text", "wiki", "gensim")
def test_a_short_run_writes_dir_and_a_renumbered_hf_folder(capsys, tmp_path):
    import splitformer

    model = tiny_folder(tmp_path / "m", layers=5)
    capsys.readouterr()
    out = tmp_path / "o"
    rc, stdout, err = cli(["compress", str(model), "--steps", "3", "--method", "sleb",
                           "--fit", "linear", "--heal", "kl", "--max-steps", "2",
                           "--windows", "16", "--length", "32", "--batch-size", "4",
                           "--probe", "4", "--no-eval", "--json", "--out", str(out)], capsys)
    assert rc == 0, err
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["steps"] == [3] and report["metrics"]["steps_taken"] == 2
    assert report["metrics"]["fit"]["absorb"] == "linear"
    assert report["hf"] == str(out / "hf")
    assert "measures" not in report and "fidelity" not in report  # --no-eval: none measured
    ours = splitformer.load(out)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out / "hf").eval()
    assert theirs.config.num_hidden_layers == 3 == ours.evolution.num_steps
    assert [layer.self_attn.layer_idx for layer in theirs.model.layers] == [0, 1, 2]
    ids = torch.randint(3, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, theirs(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)
    greedy = theirs.generate(ids[:1], max_new_tokens=6, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    assert torch.equal(ours.generate(ids[:1], 6, eos_token_id=None), greedy)
    assert (out / "hf" / "tokenizer.json").is_file() and (out / "tokenizer").is_dir()
    # the same command on the finished folder is refused by name (nothing more to heal)
    rc, stdout, err = cli(["compress", str(model), "--steps", "3", "--method", "sleb",
                           "--fit", "linear", "--heal", "kl", "--max-steps", "2",
                           "--windows", "16", "--length", "32", "--batch-size", "4",
                           "--probe", "4", "--no-eval", "--json", "--out", str(out)], capsys)
    assert rc == 2 and "finished compression" in err
