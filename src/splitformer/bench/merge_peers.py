"""Plain Token Merging (ToMe; Bolya et al., ICLR 2023) over a transformers ``BertModel``: the
peer that splitformer's token merging is measured beside (``bench.merge_suite``).

A forward pass written out over the weights of Hugging Face's BERT layers (eval only: no
dropout). Layer n, on the N_n nodes x (sizes s, all 1 at the input), post-LN:

    q, k, v = x W_Q + b_Q, x W_K + b_K, x W_V + b_V              (H heads of width d_h)
    a_ij = q_i . k_j / sqrt(d_h)   (+ log s_j: proportional attention, optional)
    h = LN1(x + W_O softmax_j(a_ij) v_j + b_O)                      attention
    (h, s) <- merge r nodes of h                                     ToMe, after attention
    x = LN2(h + W_2 gelu(W_1 h + b_1) + b_2)                         the MLP, on N_n - r nodes

The merge is ToMe's bipartite soft matching (their Algorithm 1) on the metric m_j = the keys
of node j averaged over the heads: the nodes alternate into A (even positions, the class token
first) and B (odd); each a in A takes its most similar b in B by the cosine of m; the r edges
of highest similarity are merged: a joins b with the size-weighted mean
(s_a h_a + s_b h_b) / (s_a + s_b) and the sizes add. The class token never merges (its
similarities are -inf); per layer r is at most (N_n - 1) // 2. The nodes come out in ToMe's
order: the unmerged nodes of A (in order), then B.

The read-out is unmerged by the source map: every input token reads the final state of the
node it went into, so the output is (batch, N, d) in the input's order and a mean pool over it
is the size-weighted mean sum_j s_j x_j / sum_j s_j of the merged nodes (what splitformer's
merged models read out by default). Padding is refused (the measurement never pads: it groups
sequences of one length).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Matching", "Merged", "PlainToMeBert", "bipartite_soft_matching", "merged_length",
           "merged_schedule"]


def merged_schedule(n: int, r: int, layers: int, protected: int = 1) -> list[int]:
    """The nodes each of ``layers`` merge steps of r nodes on N = ``n`` merges: r clipped to
    half the unprotected nodes left, min(r, (N_n - protected) // 2) (ToMe's clip, and the
    library's on a grid without padding: ``MergeTrace.clip``)."""
    out = []
    for _ in range(layers):
        out.append(max(0, min(r, (n - protected) // 2)))
        n -= out[-1]
    return out


def merged_length(n: int, r: int, layers: int, protected: int = 1) -> int:
    """The number of nodes after ``layers`` merge steps of r nodes on N = ``n``
    (``merged_schedule``)."""
    return n - sum(merged_schedule(n, r, layers, protected))


@dataclass(frozen=True)
class Matching:
    """One step of bipartite soft matching on N nodes: the A-nodes kept (``unmerged``), the
    A-nodes merged (``sources``) and the B-node each joins (``targets``), (batch, .) each."""

    n: int
    unmerged: torch.Tensor
    sources: torch.Tensor
    targets: torch.Tensor

    def merge_sum(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, N, c) -> (batch, N - r, c): the unmerged A nodes, then B with the merged
        A nodes added in."""
        a, b = x[:, ::2], x[:, 1::2]
        c = x.shape[-1]
        kept = a.gather(1, self.unmerged[..., None].expand(-1, -1, c))
        moved = a.gather(1, self.sources[..., None].expand(-1, -1, c))
        b = b.scatter_reduce(1, self.targets[..., None].expand(-1, -1, c), moved, reduce="sum")
        return torch.cat([kept, b], dim=1)

    def merge_mean(self, x: torch.Tensor, size: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """ToMe's size-weighted merge (their ``merge_wavg``: merge_sum(s x) / merge_sum(s)) of
        ``x`` (batch, N, c) with sizes (batch, N, 1), computed on the moved rows only: the
        N - r surviving rows are gathered once, then each target row b becomes
        (s_b x_b + sum_a s_a x_a) / (s_b + sum_a s_a) over the sources a that join it."""
        batch, _, c = x.shape
        kept = self.unmerged.shape[1]
        odd = 1 + 2 * torch.arange(self.n // 2, device=x.device).expand(batch, -1)
        survivors = torch.cat([2 * self.unmerged, odd], dim=1)[..., None]
        out, s_out = x.gather(1, survivors.expand(-1, -1, c)), size.gather(1, survivors)
        src, dst = (2 * self.sources)[..., None], (kept + self.targets)[..., None]
        s_src, rows = size.gather(1, src), dst.expand(-1, -1, c)
        out.scatter_(1, rows, out.gather(1, rows) * s_out.gather(1, dst))
        out.scatter_add_(1, rows, x.gather(1, src.expand(-1, -1, c)) * s_src)
        s_out = s_out.scatter_add(1, dst, s_src)
        out.scatter_(1, rows, out.gather(1, rows) / s_out.gather(1, dst))
        return out, s_out

    def new_index(self) -> torch.Tensor:
        """(batch, N): the index each node has after the step."""
        batch, kept = self.unmerged.shape
        index = torch.empty(batch, self.n, dtype=torch.long, device=self.unmerged.device)
        a = torch.empty(batch, (self.n + 1) // 2, dtype=torch.long, device=index.device)
        a.scatter_(1, self.unmerged, torch.arange(kept, device=index.device).expand(batch, -1))
        a.scatter_(1, self.sources, kept + self.targets)
        index[:, ::2] = a
        index[:, 1::2] = kept + torch.arange(self.n // 2, device=index.device)
        return index


def bipartite_soft_matching(metric: torch.Tensor, r: int, protected: int = 1
                            ) -> Matching | None:
    """ToMe's matching of ``metric`` (batch, N, c): r = min(r, (N - protected) // 2) edges (None
    when that is 0); the first node (the class token) is never a source when ``protected``."""
    n = metric.shape[1]
    r = min(r, (n - protected) // 2)
    if r <= 0:
        return None
    m = metric / metric.norm(dim=-1, keepdim=True)
    scores = m[:, ::2] @ m[:, 1::2].transpose(-1, -2)
    if protected:
        scores[:, 0, :] = -torch.inf
    best, target = scores.max(dim=-1)
    order = best.argsort(dim=-1, descending=True)
    sources = order[:, :r]
    return Matching(n, order[:, r:].sort(dim=1).values, sources, target.gather(1, sources))


@dataclass(frozen=True)
class Merged:
    """The merged nodes' states (batch, N_L, d), their sizes (batch, N_L) and the source map
    (batch, N): the node each input token went into."""

    state: torch.Tensor
    sizes: torch.Tensor
    source: torch.Tensor

    def unmerged(self) -> torch.Tensor:
        """(batch, N, d): each input token with its node's state."""
        d = self.state.shape[-1]
        return self.state.gather(1, self.source[..., None].expand(-1, -1, d))


class PlainToMeBert(nn.Module):
    """``bert`` (a transformers ``BertModel``, its weights shared) with ToMe's r merges per
    layer after attention; ``proportional`` adds log s to the attention logits. ``forward``
    returns the unmerged last hidden state (batch, N, d); ``merged`` the merged nodes.
    The merge is ``Matching.merge_mean`` (the moved rows only); ``literal=True`` runs ToMe's
    ``merge_wavg`` as written instead (the same values to round-off, several whole-tensor
    passes more: slower where memory bandwidth is short)."""

    def __init__(self, bert: nn.Module, r: int, *, proportional: bool = False,
                 literal: bool = False) -> None:
        super().__init__()
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"r must be an int >= 0 (nodes merged per layer), got {r!r}")
        if bert.config.hidden_act != "gelu":
            raise ValueError("PlainToMeBert implements BERT's hidden_act 'gelu', got "
                             f"{bert.config.hidden_act!r}")
        self.bert = bert
        self.r = r
        self.proportional = bool(proportional)
        self.literal = bool(literal)
        self.heads = bert.config.num_attention_heads

    def extra_repr(self) -> str:
        return f"r={self.r}, proportional={self.proportional}, literal={self.literal}"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.merged(input_ids, attention_mask, token_type_ids).unmerged()

    def merged(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> Merged:
        if self.training:
            raise RuntimeError("PlainToMeBert runs in eval mode only (it has no dropout): "
                               "call .eval()")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("PlainToMeBert takes no padding: attention_mask must be all ones "
                             "(group the sequences by length)")
        x = self.bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        batch, n, _ = x.shape
        size = x.new_ones(batch, n, 1)
        source = torch.arange(n, device=x.device).expand(batch, n)
        for layer in self.bert.encoder.layer:
            h, metric = self._attention(layer, x, size)
            matching = bipartite_soft_matching(metric, self.r)
            if matching is not None:
                if self.literal:  # ToMe's merge_wavg as written: whole-tensor passes
                    h, size = matching.merge_sum(h * size), matching.merge_sum(size)
                    h = h / size
                else:
                    h, size = matching.merge_mean(h, size)
                source = matching.new_index().gather(1, source)
            x = self._mlp(layer, h)
        return Merged(x, size[..., 0], source)

    def _attention(self, layer: nn.Module, x: torch.Tensor, size: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """h = LN1(x + W_O softmax(q k^T / sqrt(d_h) [+ log s]) v) and the keys averaged over
        the heads (batch, N, d_h)."""
        sa, out = layer.attention.self, layer.attention.output
        batch, n, d = x.shape

        def heads(lin: nn.Linear) -> torch.Tensor:
            return F.linear(x, lin.weight, lin.bias).view(batch, n, self.heads, -1).transpose(1, 2)

        q, k, v = heads(sa.query), heads(sa.key), heads(sa.value)
        bias = size.log().view(batch, 1, 1, n).to(q.dtype) if self.proportional else None
        g = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        g = F.linear(g.transpose(1, 2).reshape(batch, n, d), out.dense.weight, out.dense.bias)
        ln = out.LayerNorm
        return F.layer_norm(x + g, (d,), ln.weight, ln.bias, ln.eps), k.mean(dim=1)

    @staticmethod
    def _mlp(layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """LN2(h + W_2 gelu(W_1 h + b_1) + b_2)."""
        up, down, ln = layer.intermediate.dense, layer.output.dense, layer.output.LayerNorm
        y = F.linear(F.gelu(F.linear(h, up.weight, up.bias)), down.weight, down.bias)
        return F.layer_norm(h + y, (h.shape[-1],), ln.weight, ln.bias, ln.eps)
