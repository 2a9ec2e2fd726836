"""Network sizes the benchmarks run at: one ``Size`` value says every dimension.

    Size(dim, heads, layers, ff, batch, seq)

``SIZES`` names the ones docs/performance.md reports: "tiny" (d 64 / 2 heads / 2 layers),
"d256" (d 256 / 8 heads / 6 layers / ff 1024 / batch 32 / seq 128) and "d768" (d 768 / 12 heads /
12 layers / ff 3072 / batch 4 / seq 512). ``parse_size`` reads a name or "key=value,..." text
(``--size dim=128,heads=4``: the keys not given come from "d256").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

__all__ = ["SIZES", "Size", "parse_size"]


@dataclass(frozen=True)
class Size:
    """A network and input size: feature width N_y (``dim``), heads, N_t = ``layers`` at tau 1,
    FFN hidden width, batch and sequence length N_x."""

    dim: int
    heads: int
    layers: int
    ff: int
    batch: int
    seq: int
    name: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "name":
                continue
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"size {f.name} must be a positive int, got {v!r}")
        if self.dim % self.heads:
            raise ValueError(f"size heads={self.heads} must divide dim={self.dim}")

    @property
    def label(self) -> str:
        return self.name or (f"d{self.dim}/h{self.heads}/L{self.layers}/ff{self.ff}/"
                             f"b{self.batch}/n{self.seq}")

    def describe(self) -> str:
        return (f"d {self.dim} / {self.heads} heads / {self.layers} layers / ff {self.ff} / "
                f"batch {self.batch} / seq {self.seq}")

    def as_dict(self) -> dict:
        return asdict(self)

    def forward_flops(self, ff_evaluations: float = 1.0, attention_evaluations: float = 1.0
                      ) -> float:
        """Matmul FLOPs of one forward pass of the standard encoder at this size (multiply-add
        = 2): per layer and token 8 d^2 (Q, K, V, O) + 4 d ff (FFN) and per layer 4 N^2 d per
        sequence (Q K^T and g V). Pointwise work (softmax, norms, activations) is not counted."""
        tokens = self.batch * self.seq
        attn = 8 * tokens * self.dim ** 2 + 4 * self.batch * self.seq ** 2 * self.dim
        ffn = 4 * tokens * self.dim * self.ff
        return float(self.layers * (attention_evaluations * attn + ff_evaluations * ffn))


    def training_bytes(self) -> int:
        """A rough float32 estimate of a training step's memory: weights, their gradients and
        two optimizer-free copies, and about 12 fields of the token grid per layer (attention:
        Q, K, V, outputs; FFN: the lifted field; norms) kept for the backward pass."""
        weights = self.layers * (4 * self.dim ** 2 + 2 * self.dim * self.ff)
        tokens = self.batch * self.seq
        fields = self.layers * tokens * (10 * self.dim + 2 * self.ff)
        return 4 * (3 * weights + fields)


SIZES: dict[str, Size] = {
    "tiny": Size(64, 2, 2, 256, 8, 64, "tiny"),
    "d256": Size(256, 8, 6, 1024, 32, 128, "d256"),
    "d768": Size(768, 12, 12, 3072, 4, 512, "d768"),
    # GPT-2 small's shape, one prompt of 128 tokens: the generate suite's default
    "gpt2": Size(768, 12, 12, 3072, 1, 128, "gpt2"),
}


def parse_size(text: str) -> Size:
    """A name of ``SIZES`` or "key=value,..." over "d256" (keys: dim, heads, layers, ff, batch,
    seq). ValueError naming what is wrong."""
    text = text.strip()
    if text in SIZES:
        return SIZES[text]
    if "=" not in text:
        raise ValueError(f"size {text!r}: expected one of {sorted(SIZES)} or key=value pairs "
                         "such as dim=128,heads=4,layers=2")
    keys = {f.name for f in fields(Size)} - {"name"}
    values: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in keys:
            raise ValueError(f"size {text!r}: unknown key {key!r} (keys: {sorted(keys)})")
        try:
            values[key] = int(val)
        except ValueError:
            raise ValueError(f"size {text!r}: {key}={val!r} is not an integer") from None
    return replace(SIZES["d256"], name="", **values)
