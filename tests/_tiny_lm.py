"""A tiny Llama with a byte-level tokenizer (256 bytes + ``</s>``), saved offline: the causal LM
that the cache command's and the passkey test's tests read (``save_tiny_llama``)."""

from __future__ import annotations

from pathlib import Path

import torch


def save_byte_tokenizer(folder: Path, eos: str, **special: str) -> int:
    """A byte-level BPE tokenizer without merges (the 256 bytes, then ``eos``) saved in
    ``folder``; returns its vocabulary size."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(chars)}
    vocab[eos] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, **special)
    fast.save_pretrained(folder)
    return len(vocab)


def save_tiny_llama(folder: Path, positions: int = 1024) -> Path:
    """``folder`` holding a 2-layer Llama (grouped heads 4 / 2, rotary, random weights of seed
    0) and its byte-level tokenizer, as ``save_pretrained`` writes them; returns ``folder``."""
    import transformers

    vocab = save_byte_tokenizer(folder, "</s>")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=positions,
                                   rope_theta=100.0, eos_token_id=256, bos_token_id=256)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder
