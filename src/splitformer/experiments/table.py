"""The table of a sweep: one row per label, mean +- standard deviation over seeds.

``summarise(results)`` groups the lines of results.jsonl by label (the variant and the axis
values other than the seed) and gives, per row: the metric's mean and sample standard deviation
over the seeds, the parameter count, seconds per training epoch (mean), the ``splitformer
train`` command of each seed, and the same statistics for every evaluation (the metric at each
tau, the observed order, the path's kinetic energy, adaptive depth per tolerance).
``markdown(rows)`` and ``json`` of the same rows are what ``splitformer experiment`` writes.
"""

from __future__ import annotations

import math
from typing import Any

from .sweep import iter_labels, mean_std

__all__ = ["markdown", "summarise", "tie"]


def _stat(values: list[float]) -> dict[str, float] | None:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals:
        return None
    m, s = mean_std(vals)
    return {"mean": m, "std": s, "n": len(vals)}


def _metric_at(ev: dict[str, Any], tau: str, metric: str) -> float | None:
    return ev.get("at_tau", {}).get(tau, {}).get(metric)


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per label (first-seen order); see the module docstring."""
    rows = []
    for label in iter_labels(results):
        runs = [r for r in results if r["label"] == label]
        metric = runs[0]["metric"]
        row: dict[str, Any] = {
            "label": label, "metric": metric, "seeds": [r["seed"] for r in runs],
            metric: _stat([r["value"] for r in runs]),
            "parameters": runs[0]["parameters"],
            "seconds_per_epoch": _stat([r["seconds_per_epoch"] for r in runs]),
            "commands": [r["command"] for r in runs],
        }
        evs = [r.get("evaluation", {}) for r in runs]
        taus = list(evs[0].get("at_tau", {}))
        if taus:
            row["at_tau"] = {t: _stat([_metric_at(e, t, metric) for e in evs]) for t in taus}
        if any("order" in e for e in evs):
            row["order"] = _stat([e.get("order", {}).get("order") for e in evs])
        if any("kinetic_energy" in e for e in evs):
            row["kinetic_energy"] = _stat([e.get("kinetic_energy") for e in evs])
        if any("adaptive" in e for e in evs):
            tols = [a["tol"] for a in evs[0].get("adaptive", []) if "tol" in a]
            row["adaptive"] = [
                {"tol": tol, **{k: _stat([a[k] for e in evs for a in e.get("adaptive", [])
                                          if a.get("tol") == tol])
                                for k in ("accuracy", "mean_steps", "mean_work",
                                          "fraction_converged")}}
                for tol in tols]
        rows.append(row)
    return rows


def tie(a: dict[str, float] | None, b: dict[str, float] | None) -> bool:
    """Whether two mean +- std differ by at most one standard deviation (the larger of the
    two; to a relative 1e-9, so that a difference equal to the std up to round-off is a tie)."""
    if a is None or b is None:
        return False
    return abs(a["mean"] - b["mean"]) <= max(a["std"], b["std"]) * (1 + 1e-9)


def _pm(stat: dict[str, float] | None, digits: int = 4, seeds: int | None = None) -> str:
    """mean +- std; "(n of N)" when fewer values than seeds were finite."""
    if stat is None:
        return "-"
    text = (f"{stat['mean']:.{digits}f}" if stat["n"] < 2
            else f"{stat['mean']:.{digits}f} +- {stat['std']:.{digits}f}")
    if seeds is not None and stat["n"] < seeds:
        text += f" ({stat['n']} of {seeds})"
    return text


def markdown(rows: list[dict[str, Any]], *, commands: bool = True) -> str:
    """A Markdown table of ``summarise``'s rows (columns: what the rows hold)."""
    if not rows:
        return "(no finished runs)\n"
    metric = rows[0]["metric"]
    head = ["label", "seeds", metric, "parameters", "s / epoch"]
    taus = list(rows[0].get("at_tau", {}))
    head += [f"{metric} at tau={t}" for t in taus]
    has_order = any("order" in r for r in rows)
    has_kinetic = any("kinetic_energy" in r for r in rows)
    if has_order:
        head.append("order of u(T) in tau")
    if has_kinetic:
        head.append("kinetic energy")
    if commands:
        head.append("command (one seed)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"], ",".join(str(s) for s in r["seeds"]), _pm(r[metric]),
                 f"{r['parameters']:,}", _pm(r["seconds_per_epoch"], 2)]
        n = len(r["seeds"])
        cells += [_pm(r.get("at_tau", {}).get(t), seeds=n) for t in taus]
        if has_order:
            cells.append(_pm(r.get("order"), 2, seeds=n))
        if has_kinetic:
            cells.append(_pm(r.get("kinetic_energy"), 2, seeds=n))
        if commands:
            cells.append(f"`{r['commands'][0]}`")
        lines.append("| " + " | ".join(cells) + " |")
    out = "\n".join(lines) + "\n"
    adaptive = [r for r in rows if r.get("adaptive")]
    if adaptive:
        out += "\n| label | tolerance | accuracy | mean steps | mean work | converged |\n"
        out += "|---|---|---|---|---|---|\n"
        for r in adaptive:
            for a in r["adaptive"]:
                out += (f"| {r['label']} | {a['tol']:g} | {_pm(a['accuracy'])} | "
                        f"{_pm(a['mean_steps'], 2)} | {_pm(a['mean_work'], 2)} | "
                        f"{_pm(a['fraction_converged'], 3)} |\n")
    return out
