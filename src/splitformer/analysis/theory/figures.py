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
        size, drawer = (6.0, 2.0), _nothing
    else:
        size, drawer = drawer
    fig = _new(*size)
    out = _save(fig, folder, name, check.title, drawer(check, fig))
    check.figure = {"name": out.name, "title": out.title, "caption": out.caption,
                    "png": out.png.name, "svg": out.svg.name}
    return out


def _style(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _fit_label(f: dict) -> str:
    """'fit: slope s, R^2 r' of a ``linear_fit`` (R^2 'n/a' where there is none)."""
    r2 = "n/a" if f["r2"] is None else f"{f['r2']:.3f}"
    return f"fit: slope {f['slope']:.3g}, R^2 {r2}"


def _exp_fit(ax, xs: list[float], f: dict, style: str) -> None:
    """The fitted line of log y = intercept + slope x drawn as y (when there is a fit)."""
    if f.get("slope") is not None:
        ax.plot(xs, [math.exp(f["intercept"] + f["slope"] * x) for x in xs], style,
                label=_fit_label(f))


# Each drawer draws ``check`` on a new matplotlib figure and returns its caption.
def _nothing(check: Check, fig) -> str:
    ax = fig.subplots()
    ax.axis("off")
    ax.text(0.5, 0.5, f"{check.verdict}: {check.reason}", ha="center", va="center",
            wrap=True, fontsize=9)
    return f"Nothing was measured: {check.reason}."


def _rank(check: Check, fig) -> str:
    d = check.data
    a, b = fig.subplots(1, 2)
    steps, ll = d["steps"], d["loglog_pure"]
    pts = [(n, y) for n, y in zip(steps, ll, strict=True) if y is not None]
    a.plot([p[0] for p in pts], [p[1] for p in pts], "o", label="pure attention")
    f = check.fit
    if f.get("slope") is not None:
        xs = [pts[0][0], pts[-1][0]]
        a.plot(xs, [f["intercept"] + f["slope"] * x for x in xs], "-", label=_fit_label(f))
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
    return ("Left: log(-log r_n) of pure attention against the number of steps, with the "
            "least-squares line; right: the relative residual r_n of pure attention, "
            "attention with the skip and the full scheme (log axis; points below the "
            "round-off floor drawn at the floor / 10).")


def _clustering(check: Check, fig) -> str:
    steps = check.data["steps"]
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
    return ("The number of clusters (components at cosine > 0.99) of each frozen step "
            "against t: attention on the sphere, attention with the network's LayerNorm"
            + (", and the LayerNorm iterated alone" if len(axes) > 2 else "")
            + " (log axis; a run stops once its tokens are one point).")


def _metastability(check: Check, fig) -> str:
    d = check.data
    a, b = fig.subplots(1, 2)
    runs = d["runs"]
    for n in sorted({r["step"] for r in runs}):
        rs = [r for r in runs if r["step"] == n]
        a.plot([r["beta"] for r in rs], [max(r["dwell"], 1e-3) for r in rs], ".", alpha=0.6,
               label=f"step {n}")
    betas = check.constants["betas"]
    med = check.constants["median_dwell"]
    a.plot(betas, [m if m else math.nan for m in med], "ko-", label="median")
    _exp_fit(a, betas, check.fit, "k--")
    a.set_yscale("log")
    _style(a, "beta (score scale / pretrained)", "dwell time", "network: longest multi-cluster "
           "plateau")
    a.legend(fontsize=6, ncol=2)
    ref = d.get("reference")
    if ref:
        rows = ref["rows"]
        xs = [r["beta"] for r in rows]
        b.plot(xs, [max(r["dwell"], 1e-3) for r in rows], "ko", label="dwell")
        _exp_fit(b, xs, ref["fit"], "k--")
        for r in rows:
            b.annotate(f"{r['first_metastable_clusters']} clusters (Gegenbauer "
                       f"{r['gegenbauer_mode']})", (r["beta"], max(r["dwell"], 1e-3)),
                       fontsize=6, xytext=(4, -10), textcoords="offset points")
        b.set_yscale("log")
        _style(b, "beta", "dwell time", "reference: Q = K = V = I on the circle")
        b.legend(fontsize=6)
    else:
        b.axis("off")
    return ("Left: the dwell time (longest plateau of 2 <= clusters < N) of each step's "
            "sphere run against beta, their median and the fit of log dwell against beta "
            "(log axis); right: the same for the reference system (Q = K = V = I on the "
            "circle), each point labelled with its first metastable cluster count and the "
            "Gegenbauer mode.")


def _scaling(check: Check, fig) -> str:
    rows = check.data["rows"]
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
    return ("The mean over the steps of the normalised attention entropy (left) and of the "
            "normalised effective rank (right) against the number of tokens, with the "
            "pretrained score scale and with the scores times log n / log n0.")


def _stochastic(check: Check, fig) -> str:
    d = check.data
    ax = fig.subplots()
    steps = d["steps"]
    width = 0.27
    for i, (key, label) in enumerate((("trained", "trained"), ("init", "initialisation"),
                                      ("matched", "matched noise"))):
        ax.bar([s + (i - 1) * width for s in steps], d[key], width, label=label)
    _style(ax, "step n", "mean |column sum - 1|", "column-sum deviation of the kernels")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    return ("The column-sum deviation of each step's attention kernels (mean over heads "
            "and keys): trained, at the operators' initialisation, and with matched "
            "Gaussian weights (log axis).")


# check name -> (figure size in inches, drawer)
_DRAWERS = {"rank_collapse": ((11.0, 3.8), _rank), "clustering": ((12.0, 3.8), _clustering),
            "metastability": ((12.0, 3.8), _metastability),
            "log_n_scaling": ((11.0, 3.8), _scaling),
            "doubly_stochastic": ((7.0, 3.8), _stochastic)}
