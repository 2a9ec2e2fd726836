"""Figures of a sweep (matplotlib, each as PNG and SVG): what ``splitformer experiment`` draws.

* ``bars``: the metric per label, mean with one-standard-deviation error bars over the seeds;
* ``curves``: the test metric after every epoch (metrics.jsonl of each run), mean over seeds,
  the band one standard deviation wide;
* ``against_tau``: the metric of the same weights at each tau (depth chosen at inference);
* ``adaptive``: accuracy against mean steps per input for each tolerance of adaptive depth,
  beside the fixed depths N_t = T / tau.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .sweep import iter_labels, mean_std, run_dir_of

__all__ = ["adaptive", "against_tau", "bars", "curves", "draw_all"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, stem: Path) -> list[Path]:
    """``fig`` as PNG and SVG next to ``stem``, each written at once (``files.save_figure``:
    a figure is never half-drawn on disk)."""
    from ..files import save_figure

    paths = []
    for ext in ("png", "svg"):
        p = stem.with_suffix(f".{ext}")
        save_figure(fig, p, dpi=120, bbox_inches="tight")
        paths.append(p)
    _plt().close(fig)
    return paths


def _finish(fig, ax, stem: Path, xlabel: str, ylabel: str, title: str) -> list[Path]:
    """Labels, title, grid and legend of a one-axes figure, saved as PNG and SVG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, stem)


def _nice(metric: str) -> str:
    return {"test_accuracy": "test accuracy", "test_bpc": "test bits per character",
            "test_loss": "test loss"}.get(metric, metric)


def bars(rows: list[dict[str, Any]], stem: Path, title: str = "") -> list[Path]:
    plt = _plt()
    metric = rows[0]["metric"]
    labels = [r["label"] for r in rows]
    means = [r[metric]["mean"] for r in rows]
    stds = [r[metric]["std"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(rows) + 1.5), 3.2))
    ax.bar(range(len(rows)), means, yerr=stds, capsize=4, color="tab:blue", alpha=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    lo = min(m - s for m, s in zip(means, stds, strict=True))
    hi = max(m + s for m, s in zip(means, stds, strict=True))
    pad = max(hi - lo, 1e-3) * 0.6
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_ylabel(_nice(metric))
    ax.set_title(title or f"{_nice(metric)}: mean +- std over seeds", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, stem)


def _epoch_curve(run_dir: Path, metric: str) -> list[float]:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
    return [r[metric] for r in rows if isinstance(r, dict) and metric in r and "lr" not in r]


def curves(results: list[dict[str, Any]], stem: Path, out: Path, title: str = ""
           ) -> list[Path]:
    """Needs the run folders (runs/, not committed): without them it draws nothing and
    returns []."""
    plt = _plt()
    metric = results[0]["metric"]
    per_label = {label: [c for c in (_epoch_curve(run_dir_of(out, r), metric)
                                     for r in results if r["label"] == label) if c]
                 for label in iter_labels(results)}
    if not any(per_label.values()):
        return []
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for label, runs in per_label.items():
        if not runs:
            continue
        n = min(len(c) for c in runs)
        stats = [mean_std([c[i] for c in runs]) for i in range(n)]
        xs = list(range(1, n + 1))
        m = [s[0] for s in stats]
        sd = [s[1] for s in stats]
        (line,) = ax.plot(xs, m, label=label, lw=1.2)
        ax.fill_between(xs, [a - b for a, b in zip(m, sd, strict=True)],
                        [a + b for a, b in zip(m, sd, strict=True)],
                        color=line.get_color(), alpha=0.15)
    return _finish(fig, ax, stem, "epoch", _nice(metric),
                   title or f"{_nice(metric)} after each epoch (mean over seeds)")


def against_tau(rows: list[dict[str, Any]], stem: Path, title: str = "") -> list[Path]:
    plt = _plt()
    metric = rows[0]["metric"]
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    for r in rows:
        at = r.get("at_tau") or {}
        pts = sorted((float(t), s) for t, s in at.items() if s is not None)
        if not pts:
            continue
        ax.errorbar([p[0] for p in pts], [p[1]["mean"] for p in pts],
                    yerr=[p[1]["std"] for p in pts], marker="o", capsize=3, label=r["label"])
    ax.set_xscale("log", base=2)
    ax.invert_xaxis()
    return _finish(fig, ax, stem, "tau at inference (T fixed; N_t = T / tau)", _nice(metric),
                   title or f"{_nice(metric)} of the same weights at each tau")


def adaptive(rows: list[dict[str, Any]], stem: Path, depth: dict[str, int], title: str = ""
             ) -> list[Path]:
    """``depth``: T of each row's label (fixed N_t = T / tau)."""
    plt = _plt()
    metric = rows[0]["metric"]
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    for r in rows:
        color = None
        at = r.get("at_tau") or {}
        pts = sorted((depth[r["label"]] / float(t), s) for t, s in at.items() if s is not None)
        if pts:
            (line,) = ax.plot([p[0] for p in pts], [p[1]["mean"] for p in pts], "s--",
                              label=f"{r['label']}: fixed N_t")
            color = line.get_color()
        ad = [a for a in r.get("adaptive") or [] if a.get("accuracy")]
        if ad:
            ax.plot([a["mean_steps"]["mean"] for a in ad], [a["accuracy"]["mean"] for a in ad],
                    "o-", color=color, label=f"{r['label']}: adaptive (tolerances)")
    ax.set_xscale("log", base=2)
    return _finish(fig, ax, stem, "mean steps per input (N_t of the accepted solution)",
                   _nice(metric), title or "adaptive depth against fixed depths")


def draw_all(results: list[dict[str, Any]], rows: list[dict[str, Any]], folder: Path,
             name: str) -> list[Path]:
    """Every figure the sweep's rows support, into ``folder`` as ``<name>-<kind>.{png,svg}``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = bars(rows, folder / f"{name}-bars")
    paths += curves(results, folder / f"{name}-curves", folder)
    if any(r.get("at_tau") for r in rows):
        paths += against_tau(rows, folder / f"{name}-tau")
    if any(r.get("adaptive") for r in rows):
        depth = {r["label"]: int(r["config"]["depth"]) for r in results}
        paths += adaptive(rows, folder / f"{name}-adaptive", depth)
    return paths
