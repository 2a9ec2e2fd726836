"""One figure per theory check, from the check's own data (``Check.data``): ``draw(check,
folder)`` writes ``theory-<name>.png`` and ``.svg`` (matplotlib's Agg canvas, as
``analysis.figures``) and records it on the check (``check.figure``); a check that ran nothing
(not applicable before measuring) gets a figure saying so.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..figures import Figure, _new, _save
from .core import Check

__all__ = ["draw"]


def draw(check: Check, folder: str | Path) -> Figure:
    """The figure of ``check`` in ``folder`` (module docstring)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"theory-{check.name.replace('_', '-')}"
    drawer = _DRAWERS.get(check.name)
    if drawer is None or not check.data:
        fig = _new(6.0, 2.0)
        ax = fig.subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, f"{check.verdict}: {check.reason}", ha="center", va="center",
                wrap=True, fontsize=9)
        out = _save(fig, folder, name, check.title, f"Nothing was measured: {check.reason}.")
    else:
        out = drawer(check, folder, name)
    check.figure = {"name": out.name, "title": out.title, "caption": out.caption,
                    "png": out.png.name, "svg": out.svg.name}
    return out


def _style(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _rank(check: Check, folder: Path, name: str) -> Figure:
    d = check.data
    fig = _new(11.0, 3.8)
    a, b = fig.subplots(1, 2)
    steps, ll = d["steps"], d["loglog_pure"]
    pts = [(n, y) for n, y in zip(steps, ll, strict=True) if y is not None]
    a.plot([p[0] for p in pts], [p[1] for p in pts], "o", label="pure attention")
    f = check.fit
    if f.get("slope") is not None:
        xs = [pts[0][0], pts[-1][0]]
        r2 = "n/a" if f["r2"] is None else f"{f['r2']:.3f}"
        a.plot(xs, [f["intercept"] + f["slope"] * x for x in xs], "-",
               label=f"fit: slope {f['slope']:.3g}, R^2 {r2}")
    _style(a, "steps n", "log(-log r_n)", "pure attention: doubly exponential collapse")
    a.legend(fontsize=7)
    floor = d["floor"]
    for key, label in (("pure_attention", "pure attention (no skip)"),
                       ("attention_with_skip", "attention with skip ('attention')"),
                       ("full_scheme", f"full scheme ('{d['scheme']}')")):
        series = d.get(key) or []
        if series:
            b.semilogy(range(len(series)), [max(r, floor / 10) for r in series], "o-",
                       label=label)
    b.axhline(floor, color="grey", ls=":", lw=1, label="round-off floor")
    _style(b, "steps n", "r_n = ||U - 1 mean U|| / ||U||", "relative residual")
    b.legend(fontsize=7)
    return _save(fig, folder, name, check.title,
                 "Left: log(-log r_n) of pure attention against the number of steps, with the "
                 "least-squares line; right: the relative residual r_n of pure attention, "
                 "attention with the skip and the full scheme (log axis; points below the "
                 "round-off floor drawn at the floor / 10).")


def _clustering(check: Check, folder: Path, name: str) -> Figure:
    steps = check.data["steps"]
    fig = _new(12.0, 3.8)
    axes = fig.subplots(1, 3 if "layernorm_alone_clusters" in steps[0] else 2)
    for key, ax, title in (("sphere_clusters", axes[0], "attention on the sphere"),
                           ("layernorm_clusters", axes[1], "attention with the network's LN"),
                           *((("layernorm_alone_clusters", axes[2], "the LN alone (control)"),)
                             if len(axes) > 2 else ())):
        for r in steps:
            c = r[key]
            ax.step(range(len(c)), c, where="post", label=f"step {r['step']}")
        ax.set_yscale("log")
        _style(ax, "t", "clusters (cos > 0.99)", title)
    axes[0].legend(fontsize=6, ncol=2)
    return _save(fig, folder, name, check.title,
                 "The number of clusters (components at cosine > 0.99) of each frozen step "
                 "against t: attention on the sphere, attention with the network's LayerNorm"
                 + (", and the LayerNorm iterated alone" if len(axes) > 2 else "")
                 + " (log axis; a run stops once its tokens are one point).")


def _metastability(check: Check, folder: Path, name: str) -> Figure:
    d = check.data
    fig = _new(12.0, 3.8)
    a, b = fig.subplots(1, 2)
    runs = d["runs"]
    for n in sorted({r["step"] for r in runs}):
        rs = [r for r in runs if r["step"] == n]
        a.plot([r["beta"] for r in rs], [max(r["dwell"], 1e-3) for r in rs], ".", alpha=0.6,
               label=f"step {n}")
    betas = check.constants["betas"]
    med = check.constants["median_dwell"]
    a.plot(betas, [m if m else math.nan for m in med], "ko-", label="median")
    f = check.fit
    if f.get("slope") is not None:
        a.plot(betas, [math.exp(f["intercept"] + f["slope"] * x) for x in betas], "k--",
               label=f"fit: slope {f['slope']:.3g}, R^2 "
                     f"{'n/a' if f['r2'] is None else format(f['r2'], '.3f')}")
    a.set_yscale("log")
    _style(a, "beta (score scale / pretrained)", "dwell time", "network: longest multi-cluster "
           "plateau")
    a.legend(fontsize=6, ncol=2)
    ref = d.get("reference")
    if ref:
        rows = ref["rows"]
        xs = [r["beta"] for r in rows]
        b.plot(xs, [max(r["dwell"], 1e-3) for r in rows], "ko", label="dwell")
        rf = ref["fit"]
        if rf.get("slope") is not None:
            b.plot(xs, [math.exp(rf["intercept"] + rf["slope"] * x) for x in xs], "k--",
                   label=f"fit: slope {rf['slope']:.3g}, R^2 "
                         f"{'n/a' if rf['r2'] is None else format(rf['r2'], '.3f')}")
        for r in rows:
            b.annotate(f"{r['first_metastable_clusters']} clusters (Gegenbauer "
                       f"{r['gegenbauer_mode']})", (r["beta"], max(r["dwell"], 1e-3)),
                       fontsize=6, xytext=(4, -10), textcoords="offset points")
        b.set_yscale("log")
        _style(b, "beta", "dwell time", "reference: Q = K = V = I on the circle")
        b.legend(fontsize=6)
    else:
        b.axis("off")
    return _save(fig, folder, name, check.title,
                 "Left: the dwell time (longest plateau of 2 <= clusters < N) of each step's "
                 "sphere run against beta, their median and the fit of log dwell against beta "
                 "(log axis); right: the same for the reference system (Q = K = V = I on the "
                 "circle), each point labelled with its first metastable cluster count and the "
                 "Gegenbauer mode.")


def _scaling(check: Check, folder: Path, name: str) -> Figure:
    rows = check.data["rows"]
    fig = _new(11.0, 3.8)
    a, b = fig.subplots(1, 2)
    n = [r["tokens"] for r in rows]
    for key, label in (("pretrained", "pretrained scale"), ("scaled", "beta_n = log n / log n0")):
        a.plot(n, [r[f"{key}_mean_entropy"] for r in rows], "o-", label=label)
        b.plot(n, [r[f"{key}_mean_rank"] for r in rows], "o-", label=label)
    for ax, ylabel, title in ((a, "H / log n (mean over steps)", "normalised attention entropy"),
                              (b, "erank / n (mean over steps)", "normalised effective rank")):
        ax.set_xscale("log", base=2)
        _style(ax, "tokens n", ylabel, title)
        ax.legend(fontsize=7)
    return _save(fig, folder, name, check.title,
                 "The mean over the steps of the normalised attention entropy (left) and of the "
                 "normalised effective rank (right) against the number of tokens, with the "
                 "pretrained score scale and with the scores times log n / log n0.")


def _stochastic(check: Check, folder: Path, name: str) -> Figure:
    d = check.data
    fig = _new(7.0, 3.8)
    ax = fig.subplots()
    steps = d["steps"]
    width = 0.27
    for i, (key, label) in enumerate((("trained", "trained"), ("init", "initialisation"),
                                      ("matched", "matched noise"))):
        ax.bar([s + (i - 1) * width for s in steps], d[key], width, label=label)
    _style(ax, "step n", "mean |column sum - 1|", "column-sum deviation of the kernels")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    return _save(fig, folder, name, check.title,
                 "The column-sum deviation of each step's attention kernels (mean over heads "
                 "and keys): trained, at the operators' initialisation, and with matched "
                 "Gaussian weights (log axis).")


_DRAWERS = {"rank_collapse": _rank, "clustering": _clustering, "metastability": _metastability,
            "log_n_scaling": _scaling, "doubly_stochastic": _stochastic}
