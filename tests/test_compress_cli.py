"""`splitformer compress` (docs/depth.md): bad inputs are one line and exit 2 before anything
is loaded or written; a short real run writes a folder that splitformer and transformers
load to the same embeddings, and the same command on a finished folder is refused."""

from __future__ import annotations

import json

import pytest
import torch
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
    afile = tmp_path / "afile"
    afile.write_text("x")
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
