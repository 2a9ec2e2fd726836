"""The initial condition of token models: f = sum of learned dictionaries, then maps.

    f(x, .) = E_w(id_x, .) + E_t(type_x, .) + E_p(pos_x, .)      then P_S1 (optional), dropout

Look-ups in learned dictionaries indexed by token, token type and position, summed, then the
optional LayerNorm projection (BERT: the initial condition lies on the constraint set) and
dropout. One class serves BERT and GPT-2; they differ in data, not in kind:

* BERT: its own token-type table, summed ((word + type) + position), then the LayerNorm;
* GPT-2: no type table; type ids, when given, are looked up in the word table and added last
  ((word + position) + word[types]), no norm.

The order of the sums is the reference library's, so that results agree to the last bit.

Positions on a token grid (docs/math.md 3.12). The learned table E_p is read as the samples
p(n) = E_p[n], n = 0 .. P-1, of a function p(x) on [0, P-1]; ``token_coords`` x_j evaluate it
(``sample_positions``): an integer coordinate gathers its row (exactly the look-up at that
index), a coordinate between rows is the linear interpolation

    p(x) = E_p[n] + (x - n) (E_p[n+1] - E_p[n]),     n = floor(x),

so that a node split into two copies at x_j gives both copies p(x_j). Coordinates outside
[0, P-1] are refused (there is no sample to interpolate), and so are ``position_ids`` together
with ``token_coords`` (two answers to one question).
"""

from __future__ import annotations

import torch
from torch import nn

from ..operators import LayerNormProjection
from ..operators.token_grid import check_grid_tensor

__all__ = ["TokenEmbedding", "WordEmbedding", "sample_positions"]


def sample_positions(table: torch.Tensor, coords: torch.Tensor, *, name: str = "token_coords"
                     ) -> torch.Tensor:
    """p(x_j) for the learned positions ``table`` (P, D) read as samples p(n), n = 0 .. P-1:
    row x_j for an integer x_j (exactly), p(n) + (x - n)(p(n+1) - p(n)) with n = floor(x)
    between rows. ``coords`` (N,) or (B, N), floating point or integer (read in the table's
    dtype), in [0, P-1] (ValueError naming ``name`` otherwise; under ``torch.compile`` asserted
    inside the graph; not on the meta device, which has no values); returns (1 or B, N, D) in
    the table's dtype."""
    coords = check_grid_tensor(coords, name, weights=False, dtype=table.dtype)
    last = table.shape[0] - 1
    x = (coords if coords.dim() == 2 else coords.unsqueeze(0)).to(device=table.device)
    if torch.compiler.is_compiling():
        torch._assert_async(((x >= 0) & (x <= last)).all(), f"{name} must lie in [0, {last}]")
    elif x.is_meta:
        pass
    elif float(x.min()) < 0 or float(x.max()) > last:
        raise ValueError(f"{name} must lie in [0, {last}] (the learned positions p(0) .. "
                         f"p({last}) are samples of p(x) on that interval), got values in "
                         f"[{float(x.min())!r}, {float(x.max())!r}]")
    lo = x.floor().long().clamp(0, last)
    hi = (lo + 1).clamp(max=last)
    theta = (x.to(table.dtype) - lo.to(table.dtype)).unsqueeze(-1)
    below = table[lo]
    return below + theta * (table[hi] - below)


class TokenEmbedding(nn.Module):
    """f = E_w[ids] + E_t[types] + E_p[positions] (in the source's order), P_S1, dropout.

    ``type_vocab_size`` > 0 gives an own token-type table ``token_type`` (BERT); 0 looks type
    ids up in the word table (GPT-2). ``norm_eps`` not None adds the LayerNorm projection
    ``norm``.
    """

    def __init__(
        self,
        vocab_size: int,
        max_positions: int,
        dim: int,
        *,
        type_vocab_size: int = 0,
        norm_eps: float | None = None,
        dropout: float = 0.0,
        padding_idx: int | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.dim = dim
        self.max_positions = max_positions
        self.word = nn.Embedding(vocab_size, dim, padding_idx=padding_idx, **kw)
        self.position = nn.Embedding(max_positions, dim, **kw)
        self.token_type = nn.Embedding(type_vocab_size, dim, **kw) if type_vocab_size else None
        self.norm = LayerNormProjection(dim, eps=norm_eps, **kw) if norm_eps is not None else None
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 0.02^2) tables (transformers' initializer_range), the padding row 0: at the
        start the tied LM read-out <u, E_w> is small, not of size sqrt(width)."""
        for table in (self.word, self.position, self.token_type):
            if table is not None:
                nn.init.normal_(table.weight, std=0.02)
                if table.padding_idx is not None:
                    with torch.no_grad():
                        table.weight[table.padding_idx].zero_()

    def extra_repr(self) -> str:
        return (f"vocab={self.word.num_embeddings}, positions={self.max_positions}, "
                f"dim={self.dim}")

    @staticmethod
    def _check_ids(ids: torch.Tensor, name: str, size: int) -> None:
        """Integer ids in [0, size): the dictionary's rows (a clear error, not an IndexError).
        Under ``torch.compile`` the range is asserted inside the graph (``_assert_async``: a
        RuntimeError naming the ids at run time), since reading the values back would break
        the graph."""
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise TypeError(f"{name} must be an integer tensor, got {ids.dtype}")
        if torch.compiler.is_compiling():
            torch._assert_async(((ids >= 0) & (ids < size)).all(),
                                f"{name} must lie in [0, {size})")
            return
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise ValueError(f"{name} must lie in [0, {size}), got values in "
                             f"[{int(ids.min())}, {int(ids.max())}]")

    def _start(self, input_ids, inputs_embeds) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
                raise ValueError("input_ids must be a tensor of shape (batch, seq), got "
                                 f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
            self._check_ids(input_ids, "input_ids", self.word.num_embeddings)
            return self.word(input_ids)
        if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.dim() != 3 or \
                inputs_embeds.shape[-1] != self.dim:
            raise ValueError(f"inputs_embeds must have shape (batch, seq, {self.dim}), got "
                             f"{getattr(inputs_embeds, 'shape', type(inputs_embeds).__name__)}")
        if inputs_embeds.dtype != self.word.weight.dtype:
            raise TypeError(f"inputs_embeds has dtype {inputs_embeds.dtype} but the model's "
                            f"parameters are {self.word.weight.dtype}")
        return inputs_embeds

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        *,
        token_coords: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """f = E_w[ids] + E_t[types] + p (in the source's order), then P_S1 and dropout; p is
        E_p[position_ids] (default 0 .. N-1) or, with ``token_coords`` x_j (N,) or (B, N), the
        positions p(x_j) (``sample_positions``: a gather at integer x_j, linear interpolation
        between rows)."""
        e = self._start(input_ids, inputs_embeds)
        b, n = e.shape[:2]
        if token_coords is not None:
            position = self._positions_at(token_coords, position_ids, b, n)
            return self._sum(e, token_type_ids, position, b, n)
        if position_ids is None:  # 0 .. n-1: in range once n is
            if n > self.max_positions:
                raise ValueError(f"sequence length {n} exceeds the {self.max_positions} learned "
                                 "positions (max_position_embeddings / n_positions)")
            position_ids = torch.arange(n, device=e.device).unsqueeze(0)
        else:
            if not isinstance(position_ids, torch.Tensor):
                raise TypeError(f"position_ids must be a torch.Tensor, got "
                                f"{type(position_ids).__name__}")
            if tuple(position_ids.shape) not in ((b, n), (1, n), (n,)):
                raise ValueError(f"position_ids must have shape (batch, seq) = ({b}, {n}), "
                                 f"(1, {n}) or ({n},), got {tuple(position_ids.shape)}")
            self._check_ids(position_ids, "position_ids", self.max_positions)
        return self._sum(e, token_type_ids, self.position(position_ids), b, n)

    def _positions_at(self, coords: torch.Tensor, position_ids: torch.Tensor | None, b: int,
                      n: int) -> torch.Tensor:
        """p(x_j) at the token coordinates (checked: (N,) or (B, N), in [0, P-1])."""
        if position_ids is not None:
            raise ValueError("pass position_ids or token_coords, not both: both say where the "
                             "tokens sit (token_coords x_j evaluate the learned positions p(x) "
                             "on [0, max_positions - 1]; position_ids index its rows)")
        coords = check_grid_tensor(coords, "token_coords", weights=False,
                                   dtype=self.position.weight.dtype)
        if coords.shape[-1] != n or (coords.dim() == 2 and coords.shape[0] not in (1, b)):
            raise ValueError(f"token_coords has shape {tuple(coords.shape)} but the input has "
                             f"{n} tokens (batch {b}): expected ({n},) or ({b}, {n})")
        return sample_positions(self.position.weight, coords)

    def _sum(self, e: torch.Tensor, token_type_ids: torch.Tensor | None,
             position: torch.Tensor, b: int, n: int) -> torch.Tensor:
        """The sums in the source's order (BERT: (word + type) + position; GPT-2: (word +
        position) + word[types]), then P_S1 and dropout."""
        if token_type_ids is not None:
            table = self.token_type if self.token_type is not None else self.word
            self._check_ids(token_type_ids, "token_type_ids", table.num_embeddings)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros(1, n, dtype=torch.long, device=e.device).expand(b, n)
            e = e + self.token_type(token_type_ids)
            e = e + position
        else:
            e = e + position
            if token_type_ids is not None:
                e = e + self.word(token_type_ids.view(-1, n))
        if self.norm is not None:
            e = self.norm(e)
        return self.dropout(e)


class WordEmbedding(nn.Module):
    """f = c E_w[ids]: the initial condition of a rotary decoder (Llama family), where the
    positions enter the kernel (rotary angles at the coordinates), not the state.

    ``scale`` c: 1 (Llama, Qwen, Mistral) or sqrt(d) (Gemma), multiplied in the state's dtype
    as transformers does (a 0-dim tensor of that dtype); ``scale_embeds``: whether inputs_embeds
    given by the caller are scaled too (Gemma2 scales them, Gemma3 does not). ``position_ids``
    and ``token_coords`` are accepted and not read here: the model turns them into the rotary
    angles (``Context.rotary``). There are no learned positions (``max_positions`` None).
    """

    max_positions = None

    def __init__(self, vocab_size: int, dim: int, *, scale: float = 1.0,
                 scale_embeds: bool = True, padding_idx: int | None = None, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.dim = dim
        self.scale = float(scale)
        self.scale_embeds = bool(scale_embeds)
        self.word = nn.Embedding(vocab_size, dim, padding_idx=padding_idx, device=device,
                                 dtype=dtype)
        nn.init.normal_(self.word.weight, std=0.02)

    def extra_repr(self) -> str:
        extra = f", scale={self.scale:g}" if self.scale != 1.0 else ""
        return f"vocab={self.word.num_embeddings}, dim={self.dim}{extra}"

    _start = TokenEmbedding._start
    _check_ids = staticmethod(TokenEmbedding._check_ids)

    def forward(self, input_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, *,
                token_coords: torch.Tensor | None = None) -> torch.Tensor:
        """c E_w[ids] (or c inputs_embeds when ``scale_embeds``)."""
        if token_type_ids is not None:
            raise ValueError("token_type_ids: this model has no token types (a rotary decoder "
                             "of the Llama family); pass None")
        e = self._start(input_ids, inputs_embeds)
        if self.scale == 1.0 or (input_ids is None and not self.scale_embeds):
            return e
        return e * torch.tensor(self.scale, dtype=e.dtype, device=e.device)
