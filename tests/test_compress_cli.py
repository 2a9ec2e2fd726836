"""`splitformer compress` (docs/depth.md): bad inputs are one line and exit 2 before anything
is loaded or written; a short real run writes a folder that splitformer and transformers
load to the same embeddings, and the same command on a finished folder is refused."""

from __future__ import annotations

import json

import pytest
import torch
from _cli import cli
from _optional_data import needs

import splitformer
from splitformer.cli import main


@pytest.mark.parametrize("argv, flag", [
    (["--steps", "0"], "--steps"),
    (["--steps", "3,x"], "--steps"),
    (["--budget", "ten"], "--budget"),
    (["--budget", "-5"], "--budget"),
    (["--method", "nope"], "--method"),
    (["--heal", "magic"], "--heal"),
    (["--lr", "0"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--shooting", "-1"], "--shooting"),
    (["--shooting", "1"], "--shooting"),  # --heal distill (an encoder's default): u(T) alone
    (["--merge", "-2"], "--merge"),
    (["--batch-size", "0"], "--batch-size"),
    (["--max-steps", "1.5"], "--max-steps"),
    (["--steps", "3,3"], "--steps"),  # a repeat would heal one depth twice as often
    (["--windows", "1e12"], "--windows"),
    (["--heal", "none", "--lr", "3e-4"], "--lr"),  # read by nothing without healing
    (["--heal", "none", "--budget", "5m"], "--budget"),
    (["--heal", "none", "--merge", "8"], "--merge"),
    (["--heal", "none", "--budget", "10m"], "--budget"),  # the default, typed out
    (["--max-steps", "0"], "--max-steps"),  # heals nothing, as --budget 0
    (["--budget", "0", "--max-steps", "100"], "--budget"),
    (["--batch-size", "17", "--windows", "16"], "--batch-size"),
    (["--batch-size", "100000000"], "--batch-size"),  # was an allocation traceback
    (["--steps", "3,"], "--steps"),
    (["--lr", "nan"], "--lr"),
    (["--news", "1.5"], "--news"),
    (["--news", "-0.1"], "--news"),
    (["--news", "nan"], "--news"),
    (["--method", "parallel", "--steps", "1"], "--method"),  # everything superposed
    (["--relation", "-1"], "--relation"),
    (["--relation", "5", "--batch-size", "1"], "--relation"),  # pairs need two windows
    (["--heal", "none", "--news", "0.5"], "--news"),
    (["--heal", "none", "--relation", "1"], "--relation"),
    (["--precision", "float16"], "--precision"),
    (["--min-length", "1"], "--min-length"),
    (["--aligned"], "--aligned"),  # aligns the news windows: needs --news
    (["--aligned", "--news", "0"], "--aligned"),  # no news window to align
    (["--heal", "none", "--aligned"], "--aligned"),
    (["--min-length", "0"], ">= 2"),
    (["--min-length", "200"], "--min-length"),  # longer than --length 128
    (["--heal", "none", "--min-length", "64"], "--min-length"),
    (["--heal", "none", "--precision", "bfloat16"], "--precision"),
    (["--healed", "lift"], "--healed"),
    (["--heal", "none", "--healed", "controls"], "--healed"),
    (["--wiki", "1.5"], "--wiki"),
    (["--wiki", "nan"], "--wiki"),
    (["--news", "0.5", "--wiki", "0.6"], "--wiki"),  # more than all the windows
    (["--heal", "none", "--wiki", "0.5"], "--wiki"),
    (["--probe", "0"], "--probe"),
    (["--probe", "16", "--method", "keep-first"], "--probe"),  # read by drop, angular only
    (["--wiki", "1e-9"], "--wiki"),  # no window
    (["--probe", "64", "--windows", "32"], "--probe"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["compress", *argv, "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "Traceback" not in err
    # the bound it states is the one it checks
    assert "nan" not in argv or "> 0" in err or "[0, 1]" in err
    assert not (tmp_path / "o").exists()


def _code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


def test_bad_model_and_out_are_named(capsys, tmp_path):
    assert _code(["compress", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "argument MODEL" in capsys.readouterr().err
    held = tmp_path / "held" / "heal"  # another run's folder: still MODEL that is named
    held.mkdir(parents=True)
    (held / "config.json").write_text(json.dumps({"batch_size": 4, "healed": "controls"}))
    (held / "final.json").write_text("{}")  # a finished healing: --out is compared with it
    afile = tmp_path / "afile"
    afile.write_text("x")
    for model, said in ((tmp_path / "missing.gguf", "no such GGUF file"),
                        (tmp_path / "missing", "does not exist"),
                        (afile, "is a file"), (tmp_path, "no config.json"),
                        ("SmolLM2", "the packaged model is 'smollm2'")):
        assert _code(["compress", str(model), "--out", str(held.parent)]) == 2
        err = capsys.readouterr().err
        assert "argument MODEL" in err and said in err and "--out" not in err, (model, err)
    done = tmp_path / "done"  # a compress result: its hf/ is the transformers folder
    (done / "hf").mkdir(parents=True)
    (done / "compress.json").write_text("{}")
    (done / "hf" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert _code(["compress", str(done), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "is a compress result folder" in err and str(done / "hf") in err
    vit = tmp_path / "vit"
    vit.mkdir()
    (vit / "config.json").write_text(json.dumps({"model_type": "vit"}))
    assert _code(["compress", str(vit), "--out", str(tmp_path / "o")]) == 2
    assert "model_type 'bert'" in capsys.readouterr().err
    import transformers

    notok = tmp_path / "notok"  # a BertModel saved without its tokenizer: refused, not [UNK]s
    transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        vocab_size=100)).save_pretrained(notok)
    assert _code(["compress", str(notok), "--steps", "1", "--heal", "none", "--out",
                  str(tmp_path / "o2")]) == 2
    assert "no tokenizer files" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    assert _code(["compress", "--out", str(afile)]) == 2
    assert "is a file" in capsys.readouterr().err
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    assert _code(["compress", "--out", str(full)]) == 2
    assert "holds other files" in capsys.readouterr().err
    assert (full / "notes.txt").read_text() == "mine"


@needs("minilm", "text", "gensim", "wiki")
def test_a_short_compression_loads_in_splitformer_and_transformers(capsys, tmp_path):
    import transformers

    out = tmp_path / "c"
    argv = ["compress", "--steps", "3", "--method", "drop", "--heal", "shoot", "--max-steps",
            "2", "--windows", "16", "--batch-size", "2", "--length", "32", "--threads", "1",
            "--relation", "10", "--news", "0.5", "--aligned", "--precision", "bfloat16",
            "--min-length", "8", "--wiki", "0.25", "--healed", "controls", "--probe", "16",
            "--out", str(out), "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["metrics"]["steps_taken"] == 2 and report["hf"] == str(out / "hf")
    record = json.loads((out / "compress.json").read_text())
    assert record["heal"]["relation"] == 10.0 and report["windows"]["news"] == 0.5
    assert report["windows"]["aligned"] is True and report["heal"] == record["heal"]
    assert record["heal"]["precision"] == "bfloat16" and record["heal"]["min_length"] == 8
    assert record["heal"]["healed"] == "controls" and report["windows"]["wiki"] == 0.25
    assert record["heal"]["probe"] == 16
    assert (out / "tokenizer" / "vocab.txt").is_file()
    assert 0.3 < report["fidelity"]["3"]["mean_cosine"] < 1.0
    model = splitformer.load(out)
    assert model.evolution.num_steps == 3
    from splitformer.experiments.text_benchmarks import load_minilm

    fine = splitformer.from_hf(load_minilm().model)  # --healed controls: the lift unchanged
    assert torch.equal(model.embedding.word.weight, fine.embedding.word.weight)
    hf = transformers.AutoModel.from_pretrained(out / "hf", local_files_only=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out / "hf", local_files_only=True)
    enc = tok(["In the beginning was the Word."], return_tensors="pt")
    with torch.no_grad():
        a = model(**enc).last_hidden_state
        b = hf(**enc).last_hidden_state
    assert float((a - b).abs().max()) < 1e-5
    assert (out / "heal" / "final.json").is_file() and not list((out / "heal").glob("ckpt-*"))
    assert not (out / "heal" / "latest").exists()
    assert _code(argv) == 2
    assert "holds a finished compression" in capsys.readouterr().err


@needs("minilm", "text", "gensim")
def test_a_plain_transformers_folder_and_a_rerun_of_other_settings(capsys, tmp_path,
                                                                   monkeypatch):
    """MODEL may be a BertModel folder without sentence-transformers files (the embedding is
    then the masked mean, said so in the report); a folder healed with other settings is
    refused in one line naming what differs."""
    import transformers

    from splitformer.experiments.text_benchmarks import minilm_folder

    plain = tmp_path / "plain"
    transformers.BertModel.from_pretrained(minilm_folder()).save_pretrained(plain)
    transformers.AutoTokenizer.from_pretrained(minilm_folder()).save_pretrained(plain)
    out = tmp_path / "c"
    from splitformer.training import checkpoints

    monkeypatch.setattr(checkpoints, "remove_checkpoints", lambda folder: None)  # killed before
    argv = ["compress", str(plain), "--steps", "3", "--max-steps", "1", "--windows", "8",
            "--batch-size", "2", "--length", "16", "--threads", "1", "--out", str(out),
            "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "masked mean" in report["sentence_embedding"]
    assert 0.3 < report["fidelity"]["3"]["mean_cosine"] < 1.0
    for name in ("compress.json", "model.safetensors"):  # as if killed after the healing
        (out / name).unlink()
    capsys.readouterr()
    assert _code([*argv[:-1], "--lr", "3e-4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.count("out:") == 1 and "['lr']" in err


# -- issue 29's defects, on a tiny BERT with the healing text replaced (no data needed) --------
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A 4-layer BERT of width 16 with a BertTokenizer of ten words (no data needed)."""
    import transformers

    folder = tmp_path_factory.mktemp("tiny") / "bert"
    folder.mkdir()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "the", "a", "##s"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    transformers.BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=4,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)
    transformers.BertModel(cfg).save_pretrained(folder)
    return folder


@pytest.fixture
def tiny(tiny_bert, monkeypatch, tmp_path):
    """``tiny(*flags)``: the argv of a short compress run of the tiny BERT into tmp_path/c,
    the healing windows random ids of its vocabulary ([CLS] ... [SEP]) in place of the text
    of `make data`, no evaluation (it reads held-out text)."""
    from splitformer.experiments import depth_eval

    def windows(tokenizer, length, count, seed=0, news=None, aligned=False, wiki=0.0):
        ids = torch.randint(5, 10, (count, length), generator=torch.Generator().manual_seed(seed))
        ids[:, 0], ids[:, -1] = 2, 3
        return ids

    monkeypatch.setattr(depth_eval, "healing_windows", windows)

    def argv(*flags, out=None):
        return ["compress", str(tiny_bert), "--windows", "16", "--length", "16", "--threads",
                "1", "--no-eval", "--out", str(out or tmp_path / "c"), *flags]

    return argv


def _enospc(*args, **kwargs):
    import errno
    import os

    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["checkpoint", "result", "hf"])
def test_a_full_disk_is_one_line_and_leaves_nothing(where, tiny, capsys, monkeypatch, tmp_path):
    """ENOSPC (the writers made to raise it: no disk is filled) while the healing writes its
    checkpoint, while the result's weights are written, or inside the HF folder: one line,
    exit status 1, and the new folder is gone."""
    from splitformer.compression import store
    from splitformer.training import checkpoints

    if where == "checkpoint":
        monkeypatch.setattr(checkpoints, "_write", _enospc)
    elif where == "result":
        monkeypatch.setattr(store, "write_atomic", _enospc)
    else:
        monkeypatch.setattr(store, "write_synced", _enospc)  # the tokenizer copied into hf/
    rc, out, err = cli(tiny("--max-steps", "2", "--json"), capsys)
    assert rc == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("splitformer compress: error: ") and "No space left on device" in err
    assert str(tmp_path / "c") in err and "nothing kept" in err
    assert not (tmp_path / "c").exists()


def test_heal_none_writes_no_healing_checkpoint(tiny, capsys, monkeypatch, tmp_path):
    """--heal none heals nothing: no checkpoint (weights and AdamW moments) is written, and
    no heal/ folder."""
    from splitformer.training import checkpoints

    written = []
    real = checkpoints._write
    monkeypatch.setattr(checkpoints, "_write", lambda path, data: (written.append(path),
                                                                   real(path, data)))
    rc, out, err = cli(tiny("--heal", "none", "--json"), capsys)
    assert rc == 0, err
    assert written == [] and not (tmp_path / "c" / "heal").exists()
    assert (tmp_path / "c" / "compress.json").is_file()


def test_each_phase_is_a_line_at_once(tiny, capsys, monkeypatch, tmp_path):
    """Off a terminal (pytest's capture) each phase is a line on stderr when it starts: the
    model, the header, the healing text, the grid's probe, the healing (its first step at
    once), the writing."""
    import splitformer.compression.heal as heal_module
    from splitformer.experiments import depth_eval

    seen: dict[str, str] = {}
    parts: list[str] = []
    windows = depth_eval.healing_windows

    def so_far() -> str:
        parts.append(capsys.readouterr().err)
        return "".join(parts)

    def reading_text(*args, **kwargs):
        seen["text"] = so_far()
        return windows(*args, **kwargs)

    step = heal_module._optimiser_step

    def first_step(*args, **kwargs):
        seen["step"] = seen.get("step") or so_far()
        return step(*args, **kwargs)

    monkeypatch.setattr(depth_eval, "healing_windows", reading_text)
    monkeypatch.setattr(heal_module, "_optimiser_step", first_step)
    rc, out, err = cli(tiny("--max-steps", "3", "--steps", "2"), capsys)
    assert rc == 0, err
    err = "".join(parts) + err
    assert "reading MODEL" in seen["text"] and "healing text: 16 windows" in seen["text"]
    assert "compress: drop 4 -> 2 steps, heal distill" in seen["text"]
    assert "choosing the grid" in seen["step"] and "] healing" in seen["step"]
    lines = err.splitlines()
    assert any(line.startswith("  step 1 ") for line in lines)  # the first step, at once
    assert lines[-1].endswith(f"writing {tmp_path / 'c'}")
    assert not (tmp_path / "c" / ".lock").exists()  # the finished folder keeps no lock
    assert not (tmp_path / "c" / "heal" / ".lock").exists()


def test_a_short_budget_does_not_end_in_the_warm_up(tiny, capsys, monkeypatch):
    """3 optimiser steps against a warm-up of 20: the warm-up is cut to the first 10% of the
    run, and a line says so; the rate is not ~0 throughout."""
    import splitformer.compression.heal as heal_module

    rates = []
    step = heal_module._optimiser_step

    def recording(problem, optimizer, batch, lr, *rest):
        rates.append(lr)
        return step(problem, optimizer, batch, lr, *rest)

    monkeypatch.setattr(heal_module, "_optimiser_step", recording)
    rc, out, err = cli(tiny("--max-steps", "10", "--lr", "1e-3", "--steps", "2"), capsys)
    assert rc == 0, err
    assert max(rates) > 0.8e-3
    assert "warm-up cut to 1 step" in err


def test_a_finished_run_heals_on_with_a_longer_budget(tiny, capsys):
    """The same command with more --max-steps (or a longer --budget) heals a finished folder
    on from where it ended; the same budget again is still refused; another setting too."""
    rc, out, err = cli(tiny("--max-steps", "2", "--steps", "2", "--json"), capsys)
    assert rc == 0, err
    first = json.loads(out.strip().splitlines()[-1])
    assert first["metrics"]["steps_taken"] == 2
    rc, out, err = cli(tiny("--max-steps", "2", "--steps", "2", "--json"), capsys)
    assert rc == 2 and "holds a finished compression" in err and "--max-steps" in err
    rc, out, err = cli(tiny("--max-steps", "5", "--steps", "2", "--json"), capsys)
    assert rc == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["metrics"]["steps_taken"] == 5 and report["heal"]["max_steps"] == 5
    rc, out, err = cli(tiny("--max-steps", "8", "--steps", "2", "--lr", "3e-4"), capsys)
    assert rc == 2 and "['lr']" in err
    rc, out, err = cli(tiny("--max-steps", "8", "--steps", "2"), capsys)
    assert rc == 0 and "healing on" in err


def test_a_killed_run_resumes_with_a_longer_budget(tiny, capsys, monkeypatch, tmp_path):
    """A run killed after a checkpoint resumes with more --max-steps than it was started
    with (the budget is not part of what must match)."""
    import splitformer.compression.heal as heal_module

    step = heal_module._optimiser_step
    calls = []

    def killed(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt  # Ctrl-C: the checkpoint is written
        return step(*args, **kwargs)

    monkeypatch.setattr(heal_module, "_optimiser_step", killed)
    rc, out, err = cli(tiny("--max-steps", "6", "--steps", "2"), capsys)
    assert rc == 130
    monkeypatch.setattr(heal_module, "_optimiser_step", step)
    rc, out, err = cli(tiny("--max-steps", "9", "--steps", "2", "--json"), capsys)
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["metrics"]["steps_taken"] == 9


def test_ctrl_c_while_dir_is_written_says_what_is_kept(tiny, capsys, monkeypatch, tmp_path):
    """Ctrl-C after the healing, while DIR is written: one line saying the healing's
    checkpoint is kept (not "before healing began"), no compress.json, and the same command
    writes DIR from the checkpoint without healing again; Ctrl-C once DIR is complete says so."""
    import splitformer.compression.store as store
    import splitformer.training.checkpoints as checkpoints

    write = store.write_result

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "write_result", stopped)
    rc, _, err = cli(tiny("--max-steps", "3", "--steps", "2"), capsys)
    out = tmp_path / "c"
    assert rc == 130 and err.strip().splitlines()[-1] == (
        f"splitformer compress: interrupted after healing, before {out} was complete (the "
        f"healing's checkpoint in {out / 'heal'} is kept: the same command evaluates and "
        "writes it)")
    assert not (out / "compress.json").exists() and (out / "heal" / "latest").is_file()
    monkeypatch.setattr(store, "write_result", write)
    monkeypatch.setattr(checkpoints, "remove_checkpoints", stopped)
    rc, _, err = cli(tiny("--max-steps", "3", "--steps", "2"), capsys)
    assert rc == 130 and err.strip().splitlines()[-1] == (
        f"splitformer compress: interrupted after {out} was written (it is complete)")
    assert "step 1 " not in err and (out / "compress.json").is_file()  # not healed again
    monkeypatch.setattr(store, "write_result", stopped)
    rc, _, err = cli(tiny("--steps", "2", "--heal", "none", out=tmp_path / "d"), capsys)
    assert rc == 130 and err.strip().splitlines()[-1].endswith(
        f"interrupted before {tmp_path / 'd'} was complete (nothing to resume)")


def test_a_diverging_lr_is_one_line_naming_lr(tiny, capsys):
    rc, _, err = cli(tiny("--max-steps", "3", "--steps", "2", "--lr", "1e10"), capsys)
    assert rc == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("splitformer compress: error: argument --lr: the healing diverged "
                           "at lr 1e+10 (the loss is nan at step 1): lower --lr"), last
    assert "Traceback" not in err


def test_a_kill_before_the_first_checkpoint_says_it_starts_over(tiny, capsys, tmp_path):
    """What kill -9 leaves before the first checkpoint (the folders' lock files and the
    healing's config, no checkpoint): the same command starts over and says so."""
    out = tmp_path / "c"
    (out / "heal").mkdir(parents=True)
    (out / ".lock").write_text("pid 1")
    (out / "heal" / ".lock").write_text("pid 1")
    (out / "heal" / "metrics.jsonl").write_text("")
    rc, _, err = cli(tiny("--max-steps", "2"), capsys)
    assert rc == 0, err
    assert err.count("starting over: the killed run left no checkpoint") == 1


@pytest.mark.parametrize("argv, flag", [
    (["--out", ""], "--out"),
    (["--out", "  "], "--out"),
    (["--nope"], "unrecognized arguments: --nope"),
    (["--recipe", "fastest"], "--recipe"),
    (["--recipe", "best", "--heal", "none"], "--recipe"),
])
def test_more_bad_arguments_are_the_subcommands_one_line(argv, flag, capsys, tmp_path,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = cli(["compress", *argv], capsys)
    assert rc == 2
    assert err.startswith("splitformer compress: error: ") and err.count("\n") == 1
    assert flag in err
    assert list(tmp_path.iterdir()) == []


def test_the_budget_takes_seconds_as_a_number():
    from splitformer.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["compress", "--budget", "1e3"]).budget == 1000.0
    assert parse(["compress", "--budget", "1.5e1s"]).budget == 15.0
    assert parse(["compress", "--budget", "2.5m"]).budget == 150.0


def test_hf_in_the_json_is_a_path_or_null(tiny, capsys, tmp_path):
    """With merging the network is no layer list: "hf" is null and "hf_note" says why."""
    rc, out, err = cli(tiny("--steps", "2", "--merge", "2", "--max-steps", "1", "--json"),
                       capsys)
    assert rc == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["hf"] is None and "merging" in report["hf_note"]
    rc, out, err = cli(tiny("--steps", "2", "--max-steps", "1", "--json", out=tmp_path / "e"),
                       capsys)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["hf"] == str(tmp_path / "e" / "hf") and report["hf_note"] is None


def test_the_merged_network_heals_at_full_depth(tiny, capsys, tmp_path):
    """--steps = the model's depth is allowed with --merge (the merged network healed at
    full depth), refused without it."""
    rc, out, err = cli(tiny("--steps", "4", "--merge", "2", "--max-steps", "1", "--json"),
                       capsys)
    assert rc == 0, err
    model = splitformer.load(tmp_path / "c")
    assert model.evolution.num_steps == 4 and model.evolution.merging is not None
    rc, out, err = cli(tiny("--steps", "4", "--max-steps", "1", out=tmp_path / "d"), capsys)
    assert rc == 2 and "is the model itself" in err and "--merge" in err


def test_the_best_recipe_is_one_flag(capsys):
    """--recipe best is the measured best recipe of docs/depth.md; a flag given beside it
    wins; --help says what it costs."""
    from splitformer.cli import build_parser
    from splitformer.commands.compress import _heal_config

    args = build_parser().parse_args(["compress", "--recipe", "best"])
    cfg = _heal_config(args)
    assert (cfg.method, cfg.shooting, cfg.embedding, cfg.lr, cfg.precision, cfg.min_length,
            cfg.healed, cfg.probe) == ("drop", 1.0, 4.0, 6e-4, "bfloat16", 48, "controls", 512)
    assert (args.news, args.wiki, args.windows, args.heal) == (0.5, 0.25, 65536, "shoot")
    args = build_parser().parse_args(["compress", "--recipe", "best", "--lr", "3e-4",
                                      "--windows", "4096"])
    cfg = _heal_config(args)
    assert cfg.lr == 3e-4 and args.windows == 4096 and cfg.probe == 512
    plain = _heal_config(build_parser().parse_args(["compress"]))
    assert (plain.lr, plain.shooting, plain.precision, plain.healed) == (1e-4, 0.0, "float32",
                                                                        "all")
    rc, out, err = cli(["compress", "--help"], capsys)
    text = " ".join(out.split())
    assert "--recipe" in text and "Wikipedia" in text and "mwparserfromhell" in text


def test_kill_9_before_the_first_checkpoint_then_the_same_command(tiny, tiny_bert, capsys,
                                                                   tmp_path):
    """A real SIGKILL of `splitformer compress` after its first healing step (checkpoints
    every 100 steps or 60 s: none yet): the same command starts over and says so."""
    import signal
    import subprocess
    import sys
    import textwrap

    argv = tiny("--steps", "2", "--max-steps", "4")
    script = textwrap.dedent(f"""
        import sys, time, torch
        from splitformer.experiments import depth_eval
        import splitformer.compression.heal as heal_module
        def windows(tokenizer, length, count, seed=0, news=None, aligned=False, wiki=0.0):
            ids = torch.randint(5, 10, (count, length),
                                generator=torch.Generator().manual_seed(seed))
            ids[:, 0], ids[:, -1] = 2, 3
            return ids
        depth_eval.healing_windows = windows
        step = heal_module._optimiser_step
        def slow(*args):
            time.sleep(0.5)
            return step(*args)
        heal_module._optimiser_step = slow
        from splitformer.cli import main
        sys.exit(main({argv!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if line.startswith("  step 1 "):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "c" / ".lock").exists() and not (tmp_path / "c" / "heal" / "latest").exists()
    rc, out, err = cli(argv, capsys)
    assert rc == 0, err
    assert err.count("starting over: the killed run left no checkpoint") == 1
    assert not (tmp_path / "c" / ".lock").exists()
