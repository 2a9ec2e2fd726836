"""`splitformer generate`: the text of transformers' greedy generate, streamed; refusals as one
line and exit 2; Ctrl-C keeps what was made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _cli import cli
from _tiny_lm import save_byte_tokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    """A tiny GPT-2 with a byte-level tokenizer (256 bytes + <|endoftext|>), saved offline."""
    folder = tmp_path_factory.mktemp("gpt2")
    vocab = save_byte_tokenizer(folder, "<|endoftext|>", bos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=vocab,
                                  n_positions=4096, bos_token_id=256, eos_token_id=256)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    return folder


def _reference(folder: Path, prompt: str, new: int) -> str:
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                      do_sample=False, pad_token_id=256)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_generate_prints_the_text_of_transformers_greedy_generate(gpt2_folder, capsys):
    rc, out, err = cli(["generate", str(gpt2_folder), "--prompt", "Hello there",
                        "--max-new-tokens", "24"], capsys)
    assert rc == 0, err
    assert out == "Hello there" + _reference(gpt2_folder, "Hello there", 24) + "\n"
    assert "24 new tokens" in err


def test_generate_json_is_one_object_on_the_last_line(gpt2_folder, capsys):
    rc, out, err = cli(["generate", str(gpt2_folder), "--prompt", "Hi", "--max-new-tokens",
                        "10", "--json"], capsys)
    assert rc == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    assert data["new_tokens"] == len(data["ids"]) == 10 and data["cache"] is True
    assert data["text"] == _reference(gpt2_folder, "Hi", 10)
    assert data["stopped"] in ("max_new_tokens", "eos") and data["prompt_tokens"] == 2
    rc, out2, _ = cli(["generate", str(gpt2_folder), "--prompt", "Hi", "--max-new-tokens",
                       "10", "--json", "--no-cache"], capsys)
    assert json.loads(out2.strip())["ids"] == data["ids"]


def test_generate_sampling_is_reproducible_by_seed(gpt2_folder, capsys):
    argv = ["generate", str(gpt2_folder), "--prompt", "Hi", "--max-new-tokens", "16", "--json",
            "--sample", "--top-k", "40", "--top-p", "0.95", "--temperature", "1.3"]
    runs = [json.loads(cli(argv + ["--seed", s], capsys)[1].strip())["ids"]
            for s in ("3", "3", "4")]
    assert runs[0] == runs[1] != runs[2]


def test_generate_on_a_built_in_character_model(capsys):
    rc, out, err = cli(["generate", "gpt2-tiny", "--prompt", "In the", "--max-new-tokens",
                        "12"], capsys)
    assert rc == 0 and out.startswith("In the") and len(out) == len("In the") + 12 + 1


@pytest.mark.parametrize("argv,needle", [
    (["--max-new-tokens", "-1"], "argument --max-new-tokens"),
    (["--max-new-tokens", "5000"], "argument --max-new-tokens: max_new_tokens=5000"),
    (["--top-p", "0"], "argument --top-p: expected a number in (0, 1]"),
    (["--top-p", "1.5"], "argument --top-p"),
    (["--temperature", "0"], "argument --temperature"),
    (["--seed", "-1"], "argument --seed"),
    (["--seed", str(2 ** 40)], "argument --seed: expected an integer >= 0 at most"),
    (["--top-k", "x"], "argument --top-k"),
])
def test_bad_flags_are_one_line_and_exit_2(gpt2_folder, capsys, argv, needle):
    rc, out, err = cli(["generate", str(gpt2_folder), "--prompt", "Hi", *argv], capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_bad_models_and_prompts_are_named(gpt2_folder, tmp_path, capsys):
    for argv, needle in (
        (["generate", str(tmp_path / "none"), "--prompt", "x"], "argument MODEL"),
        (["generate", "bert-tiny", "--prompt", "x"], "not a causal language model"),
        (["generate", "vit-digits", "--prompt", "x"], "not a causal language model"),
        (["generate", str(gpt2_folder), "--prompt", ""], "argument --prompt"),
        (["generate", "gpt2-tiny", "--prompt", "x" * 70], "argument --prompt: 70 tokens"),
        (["generate", str(gpt2_folder)], "--prompt"),
    ):
        rc, out, err = cli(argv, capsys)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_ctrl_c_stops_cleanly_and_keeps_the_text(gpt2_folder):
    """SIGINT while decoding: the line is finished, one line on stderr, exit 130."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitformer.cli", "generate", str(gpt2_folder), "--prompt",
         "Hi", "--max-new-tokens", "4000", "--no-cache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # Ctrl-C's default action in the child even when the tests run as a background job
        # (started with SIGINT ignored, which Python keeps ignored: the child never stopped)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:  # wait for the first streamed characters, then interrupt
        deadline = time.monotonic() + 120
        first = ""
        while time.monotonic() < deadline and not first:
            first = proc.stdout.read(3)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:  # a failed wait leaves no 4000-token run behind
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert first.startswith("Hi") and (first + out).endswith("\n")
    assert err.strip().splitlines()[-1].startswith("splitformer generate: interrupted after")
    assert "Traceback" not in err


def test_sampling_flags_need_sample_and_a_refusal_prints_no_prompt(gpt2_folder, capsys):
    rc, out, err = cli(["generate", str(gpt2_folder), "--prompt", "Hi", "--temperature", "0.5"],
                       capsys)
    assert rc == 2 and "argument --temperature: it acts on sampling; add --sample" in err
    assert out == ""


def test_unknown_characters_are_noted(capsys):
    rc, out, err = cli(["generate", "gpt2-tiny", "--prompt", "h\u00e9llo \u2603",
                        "--max-new-tokens", "2"], capsys)
    assert rc == 0 and "are not in the model's vocabulary" in err


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def chat_folder(gpt2_folder, tmp_path_factory) -> Path:
    """The tiny GPT-2 with a chat template on its tokenizer."""
    import shutil

    folder = tmp_path_factory.mktemp("gpt2-chat") / "model"
    shutil.copytree(gpt2_folder, folder)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return folder


def test_chat_prints_the_answer_of_transformers_greedy_generate_on_the_template(chat_folder,
                                                                               capsys):
    tok = transformers.AutoTokenizer.from_pretrained(str(chat_folder))
    made = tok.apply_chat_template([{"role": "user", "content": "Hi there"}],
                                   add_generation_prompt=True, tokenize=True)
    ids = torch.tensor([list(made["input_ids"] if hasattr(made, "keys") else made)])
    assert tok.decode(ids[0]) == "<|user|>Hi there\n<|assistant|>"
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(chat_folder)).eval()
    ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                      do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=256)
    answer = tok.decode(ref[0, ids.shape[1]:], skip_special_tokens=True)
    rc, out, err = cli(["generate", str(chat_folder), "--prompt", "Hi there", "--chat",
                        "--max-new-tokens", "16"], capsys)
    assert rc == 0, err
    assert out == answer + "\n"  # the answer alone, not the templated prompt
    assert f"chat prompt (template) {ids.shape[1]} tokens" in err
    rc, out, err = cli(["generate", str(chat_folder), "--prompt", "Hi there", "--chat",
                        "--max-new-tokens", "16", "--json"], capsys)
    data = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and data["chat"] is True and data["text"] == answer
    assert data["prompt_tokens"] == ids.shape[1] and data["prompt"] == "Hi there"


def test_chat_without_a_chat_template_is_one_line_and_exit_2(gpt2_folder, capsys):
    for model in (str(gpt2_folder), "gpt2-tiny"):
        rc, out, err = cli(["generate", model, "--prompt", "Hi", "--chat"], capsys)
        assert rc == 2 and "argument --chat" in err and "chat template" in err, err
        assert len(err.strip().splitlines()) == 1 and out == ""


def test_chat_is_in_the_help(capsys):
    rc, out, _ = cli(["generate", "--help"], capsys)
    assert rc == 0 and "--chat" in out and "chat template" in out
