"""Where a healed row of docs/depth.md loses its Lee-50 fidelity (issue 18): fitting the healing
text against generalising to unseen documents, and the part one direction carries.

    python benchmarks/depth_gap.py SPEC [--out results/depth-minilm] [--threads 2]
        [--continue-steps 300]

SPEC is a ``--heal`` spec of ``depth_minilm.py`` whose run is finished in ``--out``/runs (read
back, not healed again). Prints:

- the healed model's pooled cosine to the 6-step model on 256 windows (seed 11, 128 tokens) of
  each part of the healing text (the King James training books, the background news, the
  Wikipedia articles), on the held-out King James passages of 128 tokens and on the Lee
  documents;
- the pair-cosine Spearman on 100 news windows (as the Lee fidelity reads the 50 documents)
  and the Lee fidelity;
- the Lee fidelity with each document's normalised embedding given the 6-step model's
  component along d, the normalised mean of the 6-step model's normalised pooled embeddings:
  d from the first 512 healing windows, from 256 news windows, and (an oracle that uses the
  evaluation documents) from the Lee documents themselves;
- with ``--continue-steps N``: three continuations of the healed model, N more AdamW steps at
  lr 1e-4 (constant; 16 windows cut to [48, 128] drawn with seed 5; bfloat16; the row's
  objective), without a new term, with the squared error of the component along d (the
  healing windows' d) weighted 300, and with the relation term weighted 30; each scored.
  A diagnostic of objectives, not a healing row: it runs past the row's budget.
"""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import depth_minilm as dm  # noqa: E402

from splitformer.compression.heal import HealConfig, _cut  # noqa: E402
from splitformer.control.healing import Distillation  # noqa: E402
from splitformer.experiments import depth_eval  # noqa: E402
from splitformer.experiments import text_benchmarks as tb  # noqa: E402


def _pooled(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(input_ids=ids[i:i + 16]).last_hidden_state.mean(1)
                          for i in range(0, len(ids), 16)]).double()


def _with_component(e: torch.Tensor, ref: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """e (normalised) with its component along d replaced by ref's."""
    e, ref = F.normalize(e, dim=-1), F.normalize(ref, dim=-1)
    return e - (e @ d)[:, None] * d + (ref @ d)[:, None] * d


def _direction(e: torch.Tensor) -> torch.Tensor:
    return F.normalize(F.normalize(e, dim=-1).mean(0), dim=0)


def main() -> int:
    args, study, cfg, windows, result = dm.finished_row(
        None, __doc__.split("\n\n")[0], 2, **{"--continue-steps": 0})
    n_t = cfg.steps[0]
    student, teacher, ev = result.student(n_t), study.teacher, study.evaluation
    tok = study.minilm.tokenizer

    def cos(ids: torch.Tensor) -> float:
        return float(F.cosine_similarity(_pooled(student, ids), _pooled(teacher, ids),
                                         dim=-1).mean())

    parts = {"King James training books": depth_eval.healing_windows(tok, 128, 256, 11, 0.0),
             "background news": depth_eval.healing_windows(tok, 128, 256, 11, 1.0),
             "Wikipedia": depth_eval.healing_windows(tok, 128, 256, 11, None, False, 1.0)}
    for name, ids in parts.items():
        print(f"pooled cosine, healing text, {name}: {cos(ids):.4f}")
    if 128 in ev.texts.kjv:
        print(f"pooled cosine, held-out King James passages of 128 tokens: "
              f"{cos(ev.texts.kjv[128]):.4f}")
    lee_c = torch.as_tensor(depth_eval.minilm_embed(student)(ev.texts.lee)).double()
    lee_f = torch.as_tensor(ev.reference_lee).double()
    print(f"pooled cosine, Lee documents: {float(F.cosine_similarity(lee_c, lee_f).mean()):.4f}")
    news = parts["background news"][:100]
    news_c, news_f = _pooled(student, news), _pooled(teacher, news)
    print(f"pair-cosine Spearman, 100 news windows: "
          f"{tb.spearman(tb.pair_cosines(news_c), tb.pair_cosines(news_f)):.4f}")

    def fidelity(e: torch.Tensor) -> float:
        return tb.spearman(tb.pair_cosines(e), ev.reference_lee_pairs)

    print(f"Lee fidelity: {fidelity(lee_c):.4f}")
    d_heal = _direction(_pooled(teacher, windows[:512]))
    for name, d in (("the healing windows", d_heal),
                    ("256 news windows", _direction(_pooled(teacher, parts["background news"]))),
                    ("the Lee documents (oracle)", _direction(lee_f))):
        print(f"Lee fidelity, the component along d of {name} the 6-step model's: "
              f"{fidelity(_with_component(lee_c, lee_f, d)):.4f}")
    if args.continue_steps:
        _continuations(args.continue_steps, result, cfg, n_t, teacher, windows, d_heal.float(),
                       ev)
    return 0


def _continuations(steps, result, cfg, n_t, teacher, windows, d, ev) -> None:
    for name, relation, direction in (("no new term", 0.0, 0.0),
                                      ("direction error x 300", 0.0, 300.0),
                                      ("relation x 30", 30.0, 0.0)):
        base = copy.deepcopy(result.base)
        coarse = result.coarsenings[n_t]
        student = coarse.apply(base).eval()
        problem = Distillation(student, teacher, coarse.fine_points, shooting=cfg.shooting,
                               embedding=cfg.embedding, relation=relation)
        opt = torch.optim.AdamW([q for q in base.parameters() if q.requires_grad], lr=1e-4)
        cut = HealConfig(length=cfg.length, min_length=48)
        g = torch.Generator().manual_seed(5)
        for step in range(steps):
            batch = _cut(windows[torch.randint(0, len(windows), (16,), generator=g)], cut,
                         step + 10_000)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                obj = problem({"input_ids": batch})
                total = obj.total
                if direction:
                    with torch.no_grad():
                        ef = teacher(input_ids=batch).last_hidden_state.mean(1).float()
                    ec = obj.output.mean(1).float()
                    err = F.normalize(ec, dim=-1) @ d - F.normalize(ef, dim=-1) @ d
                    total = total + direction * err.pow(2).mean()
            opt.zero_grad(set_to_none=True)
            total.backward()
            opt.step()
        s = ev(depth_eval.minilm_embed(student.eval()), full=False)
        print(f"{steps} more steps, {name}: cos {s['mean_cosine']:.4f}, Lee fidelity "
              f"{s['lee_fidelity_spearman']:.4f}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
