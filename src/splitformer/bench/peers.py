"""The standard networks and their splitformer forms, at one ``Size``: who is timed with whom.

Each function returns ``Contender`` values in float32, every network built from
``torch.manual_seed(seed)`` and all of a group fed one input, the first contender the reference
its group's ratios are taken to:

``torch_encoder``  ``nn.TransformerEncoder`` (post-LN or pre-LN, ReLU, dropout 0; torch's fused
    fast path in eval under no_grad) and ``splitformer.from_torch`` of it (the Lie scheme, or
    pre-norm), the same weights.
``hf_bert``  Hugging Face ``BertModel`` (no pooler, dropout 0) with ``attn_implementation``
    "eager" and "sdpa", and ``splitformer.from_hf`` of it: embeddings, post-LN Lie scheme with
    GELU; input ids of vocabulary 1024.
``timm_vit``  timm ``VisionTransformer`` (pre-norm, GELU, class token, dropout 0) on images of
    16 x 16 patches, (seq - 1) patches when seq - 1 factors well, and ``splitformer.from_timm``.

``strang_macaron``, ``heun_rk2`` and ``parallel_block`` (``bench.scheme_peers``) are the
comparisons of the other schemes. A library that does not import raises ``PeerUnavailable``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..interop import from_hf, from_timm, from_torch
from .sizes import Size
from .timing import Contender

__all__ = ["PATCH", "PeerUnavailable", "hf_bert", "lie_contender", "noted", "patch_grid",
           "reason", "sequence_input", "timm_vit", "torch_encoder", "torch_layers",
           "width_ratio"]

PATCH = 16  # the ViT pair's patch size (ViT-B/16's)


class PeerUnavailable(Exception):
    """The reference library of a comparison is not importable here (the message says why, in
    one line)."""


def reason(e: BaseException) -> str:
    """An exception in one line: "Type: first line of its message"."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def noted(c: Contender, what: str) -> Contender:
    """``c`` with its note: what it is, and its parameter count."""
    c.note = f"{what}; {c.parameters:,} parameters"
    return c


def sequence_input(size: Size, seed: int) -> torch.Tensor:
    """The (batch, seq, dim) float32 input of a sequence pair, from its own generator."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(size.batch, size.seq, size.dim, generator=g, dtype=torch.float32)


def torch_layers(size: Size, ff: int, norm_first: bool, seed: int) -> nn.TransformerEncoder:
    """``nn.TransformerEncoder`` at ``size`` with FFN width ``ff`` (ReLU, dropout 0, batch
    first), its weights drawn after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(size.dim, size.heads, ff, dropout=0.0, batch_first=True,
                                       norm_first=norm_first, dtype=torch.float32)
    return nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)


def lie_contender(size: Size, x: torch.Tensor, seed: int) -> Contender:
    """The Lie scheme on the standard post-LN network at ``size``, on input ``x``."""
    model = from_torch(torch_layers(size, size.ff, False, seed)).with_scheme("lie")
    return noted(Contender("lie", model, (x,)),
                  f"splitformer Lie scheme, post-LN, ff {size.ff} (the standard encoder)")


def width_ratio(width: int, dim: int) -> float:
    """A multiplier r with int(dim * r) == width (how x-transformers and timm size hidden
    layers)."""
    r = width / dim
    return r if int(dim * r) == width else (width + 0.5) / dim


def patch_grid(seq: int) -> tuple[int, int]:
    """(rows, cols) of patches with rows * cols == seq, as square as possible."""
    rows = max(d for d in range(1, math.isqrt(seq) + 1) if seq % d == 0)
    return rows, seq // rows


def torch_encoder(size: Size, *, norm_first: bool = False, seed: int = 0) -> list[Contender]:
    """[torch.nn, splitformer]: ``nn.TransformerEncoder`` and ``from_torch`` of it."""
    ref = torch_layers(size, size.ff, norm_first, seed)
    ours = from_torch(ref)
    x = sequence_input(size, seed)
    layout = "pre-LN" if norm_first else "post-LN"
    return [
        noted(Contender("torch.nn", ref, (x,)), f"nn.TransformerEncoder, {layout}, ReLU"),
        noted(Contender("splitformer", ours, (x,)),
               f"from_torch: {'pre-norm' if norm_first else 'Lie'} scheme, the same weights"),
    ]


def hf_bert(size: Size, *, seed: int = 0, vocab: int = 1024) -> list[Contender]:
    """[HF BertModel eager, HF BertModel sdpa, splitformer]: the same weights in all three."""
    try:
        from transformers import BertConfig, BertModel
    except Exception as e:
        raise PeerUnavailable(f"transformers does not import here: {reason(e)}") from e
    def build(attn: str):
        config = BertConfig(vocab_size=vocab, hidden_size=size.dim,
                            num_hidden_layers=size.layers, num_attention_heads=size.heads,
                            intermediate_size=size.ff,
                            max_position_embeddings=max(512, size.seq),
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                            attn_implementation=attn)
        torch.manual_seed(seed)
        return BertModel(config, add_pooling_layer=False).float()

    eager, sdpa = build("eager"), build("sdpa")
    sdpa.load_state_dict(eager.state_dict())
    ours = from_hf(eager)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (size.batch, size.seq), generator=g)
    mask = torch.ones_like(ids)
    return [
        noted(Contender("HF BERT eager", eager, (), {"input_ids": ids, "attention_mask": mask}),
               "transformers BertModel, attn_implementation='eager', GELU"),
        noted(Contender("HF BERT sdpa", sdpa, (), {"input_ids": ids, "attention_mask": mask}),
               "transformers BertModel, attn_implementation='sdpa'"),
        noted(Contender("splitformer", ours, (), {"input_ids": ids, "attention_mask": mask}),
               "from_hf: embeddings, Lie scheme (post-LN), the same weights"),
    ]


def timm_vit(size: Size, *, seed: int = 0) -> list[Contender]:
    """[timm ViT, splitformer]: a timm ``VisionTransformer`` with a class token and
    ``from_timm`` of it; seq - 1 patch tokens + the class token (seq patches when seq - 1 is a
    prime with no near-square grid: the token count is said in the note)."""
    try:
        from timm.models.vision_transformer import VisionTransformer
    except Exception as e:
        raise PeerUnavailable(f"timm does not import here: {reason(e)}") from e
    patches = size.seq - 1 if size.seq > 1 else 1
    rows, cols = patch_grid(patches)
    if rows == 1 and cols > 4:  # a long thin strip: use seq patches instead
        rows, cols = patch_grid(size.seq)
    torch.manual_seed(seed)
    ref = VisionTransformer(img_size=(rows * PATCH, cols * PATCH), patch_size=PATCH,
                            in_chans=3, num_classes=0, global_pool="token",
                            embed_dim=size.dim, depth=size.layers, num_heads=size.heads,
                            mlp_ratio=width_ratio(size.ff, size.dim), drop_rate=0.0,
                            pos_drop_rate=0.0, proj_drop_rate=0.0, attn_drop_rate=0.0,
                            drop_path_rate=0.0).float()
    ours = from_timm(ref)
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(size.batch, 3, rows * PATCH, cols * PATCH, generator=g)
    tokens = rows * cols + 1
    return [
        noted(Contender("timm ViT", ref, (images,)),
               f"timm VisionTransformer, pre-norm, GELU, {tokens} tokens ({rows}x{cols} "
               f"patches + class token)"),
        noted(Contender("splitformer", ours, (images,)),
               "from_timm: pre-norm scheme, the same weights"),
    ]
