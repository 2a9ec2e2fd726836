"""Token merging measured: throughput and fidelity against r, the plain ToMe peer beside ours.

A *setting* is a family, r (nodes merged per step) and whether attention is proportional
(softmax(a + log s)):

    transformers   the unmerged transformers ``BertModel`` (the reference of every fidelity)
    peer           ``merge_peers.PlainToMeBert``: plain ToMe over the same weights
    splitformer    ``splitformer.from_hf`` of the same model, merged by the library
                   (``ours_merged``: the one place the library's token merging is called)

Every encoder returns the last hidden state unmerged to the input's N; the sentence embedding
is the mean over the attention mask, L2-normalised (sentence-transformers' mean pooling and
Normalize: ``sentence_embeddings``), so a merged model's embedding is the size-weighted mean of
its merged nodes. Sequences are never padded: ``embed`` groups them by length.

``merge_rows(workload, rs, ...)`` times every setting on ``workload``'s passages of each length
(the repeats interleaved, eval under no_grad, ``timing.measure``) and gives one row per setting
and length: ``median_s``, ``speedup`` (its family's r = 0 median over its median: the
throughput ratio), ``ratios`` (median over that r = 0 median; the r = 0 rows over the
transformers model's), ``r`` (the r asked for) and ``r_used`` (the nodes each layer merged:
r clipped to half the unprotected nodes left, ``merge_peers.merged_schedule``, as the peer
and the library clip it), ``tokens_out`` (nodes after the last step,
``merge_peers.merged_length``), ``path`` ("no_grad": eval under no_grad, the only path
timed), ``mean_cosine`` (of its embeddings of all the passages with the
unmerged model's) and whatever ``workload.quality`` measures (once per setting).
``random_workload(size)`` is a random-weight BERT at a bench ``Size`` on random ids
(``splitformer bench merge --size``); the pretrained all-MiniLM-L6-v2 on King James passages
and Lee-50 is ``experiments.merging``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from ..interop import from_hf
from .merge_peers import PlainToMeBert, merged_length, merged_schedule
from .timing import Contender, measure

__all__ = ["FAMILIES", "METRIC_OF", "OURS", "LastHidden", "MergeWorkload", "Setting",
           "embed", "embed_by_length", "encoder", "mean_cosine", "merge_rows", "ours_merged",
           "quality_embedding", "random_workload", "sentence_embeddings", "settings"]

FAMILIES = ("transformers", "peer", "splitformer", "splitformer-state",
            "splitformer-keys+state")
"""The contenders: transformers' BertModel (the reference, r = 0), the plain ToMe peer,
splitformer's merging on ToMe's metric (the keys), on the state (``metric="state"``: merge
nodes whose states are close, the quadrature view) and on both (``metric="keys+state"``: the
attention integrand's key and state agree)."""
OURS = ("splitformer", "splitformer-state", "splitformer-keys+state")
METRIC_OF = {"splitformer": "keys", "splitformer-state": "state",
             "splitformer-keys+state": "keys+state"}  # the library's metric of each family
Say = Callable[[str], None]
Embed = Callable[[Sequence[torch.Tensor]], torch.Tensor]


def ours_merged(model: nn.Module, r: int, *, proportional: bool, **options) -> nn.Module:
    """THE LIBRARY CALL: the splitformer model ``model`` merging r nodes per step,
    ``model.with_token_merging(r, proportional=..., **options)`` (``options``: the library's
    ``metric=``, ``where=``, ...; its read-out unmerged to the input's N). r = 0 is ``model``."""
    if r == 0:
        return model
    return model.with_token_merging(r, proportional=proportional, **options)


@dataclass(frozen=True)
class Setting:
    """One contender: ``family`` (``FAMILIES``), r merged per step, proportional attention."""

    family: str
    r: int = 0
    proportional: bool = False

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 0:
            raise ValueError(f"r must be an int >= 0, got {self.r!r}")
        if self.family == "transformers" and self.r:
            raise ValueError("the transformers reference does not merge (r = 0)")

    @property
    def name(self) -> str:
        if self.family == "transformers":
            return "transformers BertModel"
        metric = METRIC_OF.get(self.family)
        who = ("ToMe peer" if metric is None else
               "splitformer" if metric == "keys" else f"splitformer {metric}")
        return f"{who} r={self.r}" + (" prop" if self.proportional and self.r else "")

    @property
    def key(self) -> tuple[str, int, bool]:
        return (self.family, self.r, self.proportional and self.r > 0)


def settings(rs: Sequence[int], families: Sequence[str] = ("peer", *OURS),
             proportional: Sequence[bool] = (False, True)) -> list[Setting]:
    """The transformers reference, then each family at r = 0 and at every r > 0 with each
    choice of ``proportional`` (r = 0 once: there s = 1)."""
    out = [Setting("transformers")]
    for family in families:
        out.append(Setting(family))
        out += [Setting(family, r, p) for r in dict.fromkeys(rs) if r > 0 for p in proportional]
    return out


class LastHidden(nn.Module):
    """``model(input_ids=, attention_mask=)`` as the tensor of its last hidden state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out if isinstance(out, torch.Tensor) else out.last_hidden_state


def encoder(setting: Setting, bert: nn.Module, ours: nn.Module | None = None,
            **options) -> nn.Module:
    """The network of ``setting`` over the transformers ``bert`` (``ours``: its
    ``splitformer.from_hf``; ``options`` go to the library call, except the metric, which is
    the family's: ``METRIC_OF``)."""
    if setting.family == "transformers":
        return LastHidden(bert).eval()
    if setting.family == "peer":
        return PlainToMeBert(bert, setting.r, proportional=setting.proportional).eval()
    if ours is None:
        raise ValueError("the splitformer setting needs ours = splitformer.from_hf(bert)")
    if "metric" in options:  # a family is a metric: a second name for it would mislabel rows
        raise ValueError(f"options: the metric is the family's ({METRIC_OF}); choose the "
                         f"family, not metric={options['metric']!r}")
    options = {**options, "metric": METRIC_OF[setting.family]}
    return LastHidden(ours_merged(ours, setting.r, proportional=setting.proportional,
                                  **options)).eval()


def sentence_embeddings(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """e = normalize(sum_j m_j u_j / sum_j m_j): mean pooling over the attention mask, then
    L2 normalisation (sentence-transformers' Pooling(mean) and Normalize)."""
    m = mask.to(hidden.dtype)[..., None]
    pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
    return F.normalize(pooled, p=2, dim=-1)


def embed(model: nn.Module, sequences: Sequence[torch.Tensor] | torch.Tensor,
          batch: int = 8) -> torch.Tensor:
    """The sentence embeddings (len(sequences), d) of 1-D id tensors, in their order: batches of
    up to ``batch`` sequences of one length, never padded."""
    return embed_by_length(lambda _n: model, sequences, batch)


@torch.no_grad()
def embed_by_length(model_at: Callable[[int], nn.Module],
                    sequences: Sequence[torch.Tensor] | torch.Tensor,
                    batch: int = 8) -> torch.Tensor:
    """``embed`` with the network ``model_at(n)`` for the sequences of length n."""
    seqs = list(sequences)
    if not seqs:
        raise ValueError("embed: no sequences")
    by_length: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_length.setdefault(int(s.shape[-1]), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(seqs)
    for n, idx in by_length.items():
        model = model_at(n).eval()
        for start in range(0, len(idx), batch):
            part = idx[start:start + batch]
            ids = torch.stack([seqs[i] for i in part])
            mask = torch.ones_like(ids)
            for i, e in zip(part, sentence_embeddings(model(ids, mask), mask), strict=True):
                out[i] = e
    return torch.stack(out)


def mean_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The mean over rows of cos(a_i, b_i)."""
    return float(F.cosine_similarity(a.double(), b.double(), dim=-1).mean())


@dataclass(frozen=True)
class MergeWorkload:
    """What ``merge_rows`` measures: ``bert`` (a transformers ``BertModel``, eval), labelled
    ``label``; ``passages`` maps a length to (P, length) input ids (the first ``batch`` are
    timed, all P give the mean cosine); ``quality(embed_fn)`` (optional) measures a setting from
    its embedding function (a list of 1-D id tensors -> embeddings), with the setting's r on
    every text, or, with ``quality_r_at`` = n_ref, r scaled to each text's length N as
    round(r N / n_ref) (the fraction merged per step at n_ref); ``options`` go to the library
    call."""

    label: str
    bert: nn.Module
    passages: dict[int, torch.Tensor]
    batch: int = 8
    quality: Callable[[Embed], dict[str, float]] | None = None
    options: dict | None = None
    note: str = ""
    quality_r_at: int | None = None


def _contenders(workload: MergeWorkload, chosen: list[Setting], ids: torch.Tensor,
                ours: nn.Module | None) -> list[tuple[Setting, Contender]]:
    """Each setting's network, timed on ``ids``."""
    mask = torch.ones_like(ids)
    return [(s, Contender(s.name, encoder(s, workload.bert, ours, **(workload.options or {})),
                          (ids, mask))) for s in chosen]


def _row(suite_label: str, group: str, s: Setting, result: dict, names: dict, n: int,
         layers: int, batch: int, note: str) -> dict:
    r = result[s.name]
    base = names[(s.family, 0, False)] if s.r else names[("transformers", 0, False)]
    ratios = {} if s.family == "transformers" else {base: r["median_s"] /
                                                    result[base]["median_s"]}
    speedup = result[names[(s.family, 0, False)]]["median_s"] / r["median_s"]
    return {"suite": "merge", "size": suite_label, "group": group, "path": "no_grad",
            "name": s.name, "splitformer": s.family in OURS, "family": s.family,
            "r": s.r, "r_used": merged_schedule(n, s.r, layers),
            "proportional": s.proportional and s.r > 0, "seq": n, "batch": batch,
            "tokens_out": merged_length(n, s.r, layers), **r, "ratios": ratios,
            "speedup": speedup, "note": note}


def quality_embedding(workload: MergeWorkload, s: Setting, model: nn.Module,
                      ours: nn.Module | None) -> Embed:
    """The embedding function of setting ``s`` on texts of any length: ``model`` (r on every
    text) or, with ``workload.quality_r_at``, the setting at round(r N / n_ref) for length N."""
    if workload.quality_r_at is None or s.r == 0:
        return lambda seqs: embed(model, seqs, workload.batch)
    nets: dict[int, nn.Module] = {}

    def model_at(n: int) -> nn.Module:
        r = round(s.r * n / workload.quality_r_at)
        if r not in nets:
            nets[r] = encoder(replace(s, r=r), workload.bert, ours, **(workload.options or {}))
        return nets[r]

    return lambda seqs: embed_by_length(model_at, seqs, workload.batch)


def merge_rows(workload: MergeWorkload, rs: Sequence[int], *, repeats: int = 5,
               warmup: int = 1, families: Sequence[str] = ("peer", *OURS),
               say: Say | None = None) -> list[dict]:
    """One row per setting and passage length (module doc)."""
    say = say or (lambda _m: None)
    ours = from_hf(workload.bert).eval() if set(OURS) & set(families) else None
    chosen = settings(rs, families)
    layers = workload.bert.config.num_hidden_layers
    rows: list[dict] = []
    quality: dict[tuple, dict] = {}
    for n, passages in workload.passages.items():
        group = f"{n} tokens, batch {workload.batch}"
        built = _contenders(workload, chosen, passages[:workload.batch], ours)
        say(f"merge {workload.label}: {group}, {len(built)} settings")
        result = measure([c for _s, c in built], "no_grad", repeats=repeats, warmup=warmup)
        names = {s.key: s.name for s, _c in built}
        reference = embed(built[0][1].model, passages, workload.batch)
        for s, c in built:
            row = _row(workload.label, group, s, result, names, n, layers, workload.batch,
                       workload.note)
            row["mean_cosine"] = mean_cosine(embed(c.model, passages, workload.batch),
                                             reference)
            if workload.quality is not None:
                if s.key not in quality:
                    say(f"merge {workload.label}: quality of {s.name}")
                    quality[s.key] = workload.quality(quality_embedding(
                        workload, s, c.model, ours))
                row.update(quality[s.key])
            rows.append(row)
    return rows


def random_workload(size, seed: int = 0, vocab: int = 1024) -> MergeWorkload:
    """A random-weight transformers ``BertModel`` at a bench ``Size`` (sdpa, dropout 0) on
    ``size.batch`` random id sequences of ``size.seq`` (the first node is the protected one)."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=vocab, hidden_size=size.dim, num_hidden_layers=size.layers,
                        num_attention_heads=size.heads, intermediate_size=size.ff,
                        max_position_embeddings=max(512, size.seq), hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    torch.manual_seed(seed)
    bert = BertModel(config, add_pooling_layer=False).float().eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (size.batch, size.seq), generator=g)
    return MergeWorkload(size.label, bert, {size.seq: ids}, batch=size.batch,
                         note="random weights and ids")
