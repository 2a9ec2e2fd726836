"""Where a healed row of docs/depth.md loses fidelity (issue 18): the healed 3-step model's
cosine to the 6-step model on each Lee-50 document against the document's length, and its
pooled cosine on its own healing windows against fresh windows of the same text.

    python benchmarks/depth_diagnose.py SPEC [--out results/depth-minilm] [--threads 1]

SPEC is a ``--heal`` spec of ``depth_minilm.py`` whose run is finished in ``--out``/runs (it is
read back, not healed again). Prints the Lee documents' mean cosine, its Spearman correlation
with the document's token count (``scipy.stats.spearmanr``) and its mean in length bins, then
the mean pooled cosine on the first 256 healing windows and on 256 fresh windows (seed 7, the
same news fraction and alignment, whole windows of the row's length). ``--budget``: the
``depth_minilm.py --budget`` the row was healed with (7200 in depth_queue.sh).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from scipy.stats import spearmanr

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import depth_minilm as dm  # noqa: E402

from splitformer.experiments import depth_eval  # noqa: E402

BINS = ((0, 80), (80, 110), (110, 130), (130, 10_000))


def _pooled_cosine(student, teacher, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        a = student(input_ids=ids).last_hidden_state.mean(1)
        b = teacher(input_ids=ids).last_hidden_state.mean(1)
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


def main() -> int:
    args, study, cfg, windows, result = dm.finished_row(None, __doc__.split("\n\n")[0], 1)
    student = result.student(cfg.steps[0])
    text = dm.parse_spec(args.spec, args.budget)[2]
    ev = study.evaluation
    lee = depth_eval.minilm_embed(student)(ev.texts.lee)
    cos = torch.nn.functional.cosine_similarity(torch.as_tensor(lee),
                                                torch.as_tensor(ev.reference_lee), dim=-1)
    cos = cos.numpy()
    lengths = np.array([len(x) for x in ev.texts.lee])
    rho = spearmanr(cos, lengths)
    print(f"Lee documents: mean cosine {cos.mean():.4f}; Spearman with length "
          f"{rho.statistic:.2f} (p {rho.pvalue:.1g})")
    for lo, hi in BINS:
        m = (lengths >= lo) & (lengths < hi)
        print(f"  {lo}-{hi if hi < 10_000 else ''} tokens: {m.sum()} documents, mean cosine "
              f"{cos[m].mean():.4f}")
    fresh = depth_eval.healing_windows(study.minilm.tokenizer, cfg.length, 256, 7, *text[:2],
                                       wiki=text[3])
    for name, ids in (("its healing windows", windows[:256]), ("fresh windows", fresh)):
        c = torch.cat([_pooled_cosine(student, study.teacher, ids[i:i + 16])
                       for i in range(0, 256, 16)])
        print(f"pooled cosine on {name}: {c.mean():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
