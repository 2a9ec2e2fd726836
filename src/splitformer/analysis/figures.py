"""Figures of the diagnostics (``analysis.diagnostics``): ``draw(diag, folder)`` writes each as
PNG and SVG (matplotlib's Agg canvas, 100 dpi, no pyplot state) and returns ``Figure`` records
(name, title, one-sentence caption, the two paths). Per evolution (names suffixed with the
evolution's label when the model has several, e.g. CvT's stages):

* ``heatmaps``: u(x, y, t) of input ``example`` at chosen times (default t_0, the grid point
  nearest T/2, and T; a time is taken at the nearest grid point), tokens x down, features y
  across, one panel per time, one colour scale (symmetric, max |u| over the panels);
* ``kernels``: g_h(x, x') of an attention substep for the input the diagnostics kept
  (``kernel_input``), rows = steps, columns = heads: at most 12 steps (evenly spaced, first and
  last included) and the first 8 heads, colour scale [0, max g] over the panels; one figure
  per attention substep of the step (``kernels`` for the first, the self-attention; e.g.
  ``kernels_cross-attention`` for the cross-attention of a decoder);
* ``curves``: the per-step diagnostics against t: norm, cosine similarity and effective rank at
  the grid points t_n (u(0) included), and at the step midpoints t_n + tau/2 the velocity, the
  Lipschitz estimate (a log axis when the estimates span more than a factor 10; an unconverged
  estimate drawn as an open marker), the attention entropy of each attention substep (mean over
  heads, with dashed the entropy of the kernel uniform over its support: log N_x' for a full
  kernel, the mean over x of log(x + 1) for a causal one), the substep shares stacked, and the
  FFN reading: the fraction of active ReLU (or hardtanh) constraints when the activation is a
  projection, else the fraction of pre-activations < 0;
* ``pca``: the tokens of input ``example`` at each grid point in the first two principal
  components of all grid points together (centred on their common mean; at most 12 panels,
  evenly spaced), shared axes, colour = token index;
* ``patches``: for images, ||u(x, ., t)|| per token on the patch grid (rows, cols) at each grid
  point (at most 12 panels), one colour scale. The grid is ``image_grid`` (ViT: e.g. (2, 2) for
  8 x 8 pixels in 4 x 4 patches) with the first ``skip_tokens`` tokens left out (class and
  register tokens; default: tokens - rows cols), for every evolution whose token count fits;
  without ``image_grid``, the grid a family reports (CvT's stages).

Bad arguments raise ``ArgumentError`` naming them.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .checks import ArgumentError
from .diagnostics import Diagnostics, plural

__all__ = ["MAX_HEADS", "MAX_PANELS", "MAX_STEPS", "Figure", "draw"]

MAX_HEADS = 8  # heads shown in the kernel grid
MAX_STEPS = 12  # steps (rows) of the kernel grid
MAX_PANELS = 12  # grid points of the PCA and patch figures
DPI = 100


@dataclass(frozen=True)
class Figure:
    """One figure written by ``draw``: ``name`` (the file stem), ``title``, a one-sentence
    ``caption`` saying what is shown, and the paths of its PNG and SVG files."""

    name: str
    title: str
    caption: str
    png: Path
    svg: Path


def _new(width: float, height: float):
    from matplotlib.figure import Figure as MplFigure

    return MplFigure(figsize=(min(width, 16.0), min(height, 20.0)), dpi=DPI,
                     layout="constrained")


def _save(fig, folder: Path, name: str, title: str, caption: str) -> Figure:
    fig.suptitle(title, fontsize=10)
    png, svg = folder / f"{name}.png", folder / f"{name}.svg"
    fig.savefig(png, dpi=DPI)
    fig.savefig(svg)
    return Figure(name, title, caption, png, svg)


def _spread(n: int, cap: int) -> list[int]:
    """At most ``cap`` indices of range(n), evenly spaced, first and last included."""
    if n <= cap:
        return list(range(n))
    return sorted({round(i * (n - 1) / (cap - 1)) for i in range(cap)})


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "evolution"


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


# -- the figures -------------------------------------------------------------------------------
def _heatmaps(diag, e, folder, name, label, times, example) -> Figure:
    traj = diag.states[e]
    grid = diag.evolutions[e]["times"]
    T = grid[-1]
    wanted = times if times is not None else [0.0, T / 2, T]
    idx = sorted({min(range(len(grid)), key=lambda i: abs(grid[i] - min(t, T)))
                  for t in wanted})
    panels = [traj.state_list[i][example].detach().double().cpu() for i in idx]
    vmax = max(float(p.abs().max()) for p in panels) or 1.0
    n_x, n_y = panels[0].shape
    fig = _new(1.0 + 3.2 * len(panels), 3.4)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    im = None
    for ax, i, p in zip(axes, idx, panels, strict=True):
        im = ax.imshow(p.numpy(), aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax,
                       interpolation="nearest")
        ax.set_title(f"t = {grid[i]:g}", fontsize=9)
        ax.set_xlabel("feature y", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("token x", fontsize=8)
    fig.colorbar(im, ax=list(axes), shrink=0.9, label="u")
    times_text = ", ".join(f"{grid[i]:g}" for i in idx)
    return _save(fig, folder, name, f"u(x, y, t){label}",
                 f"Heat maps of the state u(x, y, t) of input {example} ({plural(n_x, 'token')} x "
                 f"{plural(n_y, 'feature')}) at t = {times_text}, on one symmetric colour "
                 "scale.")


def _kernel_labels(diag, e) -> list[str]:
    """The attention substeps of evolution e that have a kernel, in order of first use."""
    labels: list[str] = []
    for ks in (diag.attention_kernels[e] if diag.attention_kernels else []):
        for lab in ks:
            if lab not in labels:
                labels.append(lab)
    return labels


def _kernels(diag, e, folder, name, label, op: str, first: bool) -> Figure | None:
    ks = [k.get(op) for k in diag.attention_kernels[e]]
    have = [n for n, k in enumerate(ks) if k is not None]
    if not have:
        return None
    rows = [have[i] for i in _spread(len(have), MAX_STEPS)]
    heads = ks[have[0]].shape[0]
    cols = min(heads, MAX_HEADS)
    vmax = max(float(ks[n][:cols].max()) for n in rows) or 1.0
    title = f"attention kernel g_h(x, x') of '{op}'{label}"
    fig = _new(max(1.0 + 1.35 * cols, 0.5 + 0.08 * len(title)), 0.8 + 1.35 * len(rows))
    axes = fig.subplots(len(rows), cols, squeeze=False)
    im = None
    for r, n in enumerate(rows):
        g = ks[n].detach().double().cpu()
        for h in range(cols):
            ax = axes[r][h]
            im = ax.imshow(g[h].numpy(), cmap="viridis", vmin=0.0, vmax=vmax,
                           interpolation="nearest", aspect="auto")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"step {n}", fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="g(x, x')")
    nsteps = len(ks)
    which = ("the step's first attention substep" if first else "an attention substep after "
             "the step's first")
    return _save(fig, folder, name, title,
                 f"The kernel g_h(x, x') (query x down, key x' across) of the substep '{op}' "
                 f"({which}) for input {diag.kernel_input}, one row per step and one column "
                 f"per head, showing {len(rows)} of {plural(nsteps, 'step')} and {cols} of "
                 f"{plural(heads, 'head')} "
                 f"(at most {MAX_STEPS} steps and {MAX_HEADS} heads are drawn).")


def _plot(ax, xs, ys, **kw) -> bool:
    """A curve through the points whose value is not None; a near-constant curve (a post-LN
    norm) gets a readable y range instead of an offset axis."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    if pts:
        vals = [p[1] for p in pts]
        ax.plot([p[0] for p in pts], vals, "o-", ms=3, **kw)
        ax.ticklabel_format(axis="y", useOffset=False)
        lo, hi = min(vals), max(vals)
        if hi - lo <= 1e-6 * max(abs(hi), abs(lo), 1e-12):
            pad = 0.05 * abs(hi) or 1.0
            ax.set_ylim(lo - pad, hi + pad)
    return bool(pts)


def _curves(diag, e, folder, name, label) -> Figure:
    ev = diag.evolutions[e]
    steps, first = ev["steps"], ev["initial"]
    times = ev["times"]
    tau = diag.model["evolutions"][e]["tau"]
    mid = [times[s["step"]] + tau / 2 for s in steps]
    fig = _new(13.0, 6.2)
    axes = fig.subplots(2, 4, squeeze=False).ravel()
    for key, ax, title in (("norm", axes[0], "norm ||u||"),
                           ("cosine_similarity", axes[3], "cosine similarity of tokens"),
                           ("effective_rank", axes[4], "effective rank")):
        _plot(ax, times, [first[key]] + [s[key] for s in steps])
        ax.set_title(title, fontsize=9)
    _plot(axes[1], mid, [s["velocity"] for s in steps])
    axes[1].set_title("velocity ||u^{n+1} - u^n|| / tau", fontsize=9)
    _lipschitz_panel(axes[2], mid, steps)
    _entropy_panel(axes[5], mid, steps)
    _shares_panel(axes[6], mid, steps, tau)
    relu = _substep_mean(steps, "relu_active")
    if any(x is not None for x in relu):
        _plot(axes[7], mid, relu)
        axes[7].set_title("FFN: active ReLU constraints", fontsize=9)
    else:
        _plot(axes[7], mid, _substep_mean(steps, "negative_preactivation"))
        axes[7].set_title("FFN: pre-activations < 0", fontsize=9)
    for ax in axes:
        ax.set_xlabel("t", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    ffn = ("the fraction of active ReLU constraints of the FFN"
           if any(x is not None for x in relu) else
           "the fraction of the FFN's pre-activations below 0 (a sign statistic: its "
           "activation is not a projection, so no constraint is active)")
    return _save(fig, folder, name, f"diagnostics along the path{label}",
                 "The per-step diagnostics against depth t: norm, cosine similarity and "
                 "effective rank at the grid points; at the step midpoints the velocity, the "
                 "Lipschitz estimate of the step map (a lower estimate of its largest singular "
                 "value at this path's state), the attention entropy of each attention substep "
                 "with the entropy of the kernel uniform over its support dashed, the substep "
                 f"shares, and {ffn}.")


def _lipschitz_panel(ax, mid: list[float], steps) -> None:
    """The Lipschitz estimates at the step midpoints (log scale over a decade), the ones that
    did not converge ringed."""
    lips = [s["lipschitz"] for s in steps]
    known = [x for x in lips if x is not None]
    if _plot(ax, mid, lips) and min(known) > 0 and max(known) > 10 * min(known):
        ax.set_yscale("log")
    loose = [(m, s["lipschitz"]) for m, s in zip(mid, steps, strict=True)
             if s["lipschitz"] is not None and s.get("lipschitz_converged") is False]
    if loose:
        ax.plot([p[0] for p in loose], [p[1] for p in loose], "o", ms=7, mfc="white",
                color="C3", label="not converged")
        ax.legend(fontsize=7)
    ax.set_title("Lipschitz estimate of the step", fontsize=9)


def _entropy_panel(ax, mid: list[float], steps) -> None:
    """Each attention operator's entropy (mean over heads), its uniform entropy dashed."""
    ops: list[str] = []
    for s in steps:
        for a in s.get("attention") or []:
            if a["operator"] not in ops:
                ops.append(a["operator"])
    drawn = False
    for i, op in enumerate(ops):
        recs = [next((a for a in s.get("attention") or [] if a["operator"] == op), None)
                for s in steps]
        ent = [None if r is None or r["entropy"] is None or None in r["entropy"]
               else sum(r["entropy"]) / len(r["entropy"]) for r in recs]
        colour = f"C{i % 10}"
        if _plot(ax, mid, ent, label=f"{op} (mean over heads)", color=colour):
            drawn = True
            uni = [None if r is None else r["entropy_uniform"] for r in recs]
            pts = [(m, u) for m, u in zip(mid, uni, strict=True) if u is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "--", color=colour,
                        lw=1, label=f"{op}: uniform over its support")
    if drawn:
        ax.legend(fontsize=6)
    ax.set_title("attention entropy", fontsize=9)


def _shares_panel(ax, mid: list[float], steps, tau: float) -> None:
    """The substeps' shares of each step's increments, stacked."""
    labels: list[str] = []
    for s in steps:
        for sub in s["substeps"]:
            if sub["label"] not in labels:
                labels.append(sub["label"])
    bottom = [0.0] * len(steps)
    for lab in labels:
        vals = [sum(sub["share"] or 0.0 for sub in s["substeps"] if sub["label"] == lab)
                for s in steps]
        ax.bar(mid, vals, width=0.8 * tau, bottom=bottom, label=lab)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    if labels:
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.18),
                  ncol=min(len(labels), 3), frameon=False)
    ax.set_title("substep shares of the step's increments", fontsize=9)
    ax.set_ylim(0, 1.05)


def _substep_mean(steps, key: str) -> list[float | None]:
    """Per step, the mean of ``key`` over the substeps that have it (None if none has)."""
    out: list[float | None] = []
    for s in steps:
        vals = [sub[key] for sub in s["substeps"] if sub.get(key) is not None]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


def _panel_grid(fig, n: int):
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return axes[:n]


def _pca(diag, e, folder, name, label, example) -> Figure:
    traj = diag.states[e]
    times = diag.evolutions[e]["times"]
    states = torch.stack([s[example].detach().double().cpu() for s in traj.state_list])
    k, n, d = states.shape
    flat = states.reshape(k * n, d)
    centred = flat - flat.mean(0, keepdim=True)
    # float32 is plenty for a picture (and multithreaded float64 LAPACK can be slow on CPU)
    _, _, vh = torch.linalg.svd(centred.float(), full_matrices=False)
    comps = vh[:2].double()
    if comps.shape[0] < 2:
        comps = torch.cat([comps, torch.zeros(2 - comps.shape[0], d, dtype=comps.dtype)])
    proj = (centred @ comps.T).reshape(k, n, 2)
    shown = _spread(k, MAX_PANELS)
    cols = min(len(shown), 4)
    fig = _new(0.8 + 2.6 * cols, 0.6 + 2.5 * math.ceil(len(shown) / cols))
    axes = _panel_grid(fig, len(shown))
    sc = None
    for ax, i in zip(axes, shown, strict=True):
        sc = ax.scatter(proj[i, :, 0].numpy(), proj[i, :, 1].numpy(), c=range(n), s=12,
                        cmap="viridis", vmin=0, vmax=max(n - 1, 1))
        ax.set_title(f"t = {times[i]:g}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.colorbar(sc, ax=list(axes), shrink=0.8, label="token index x")
    return _save(fig, folder, name, f"token cloud in two principal components{label}",
                 f"The {plural(n, 'token')} of input {example} at {len(shown)} of "
                 f"{plural(k, 'grid point')}, in the "
                 f"first two principal components of all grid points together, on shared "
                 f"axes.")


def _patches(diag, e, folder, name, label, grid, skip, example) -> Figure:
    traj = diag.states[e]
    times = diag.evolutions[e]["times"]
    rows, cols = grid
    norms = torch.stack([s[example, skip:].detach().double().cpu().norm(dim=-1)
                         for s in traj.state_list]).reshape(-1, rows, cols)
    shown = _spread(norms.shape[0], MAX_PANELS)
    lo, hi = float(norms.min()), float(norms.max())
    pc = min(len(shown), 4)
    fig = _new(0.8 + 2.6 * pc, 0.6 + 2.5 * math.ceil(len(shown) / pc))
    axes = _panel_grid(fig, len(shown))
    im = None
    for ax, i in zip(axes, shown, strict=True):
        im = ax.imshow(norms[i].numpy(), cmap="magma", vmin=lo, vmax=hi if hi > lo else lo + 1,
                       interpolation="nearest")
        ax.set_title(f"t = {times[i]:g}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="||u(x, ., t)||")
    skipped = f", leaving out the first {skip} token{'s' if skip != 1 else ''}" if skip else ""
    return _save(fig, folder, name, f"norm of u per patch{label}",
                 f"The norm of u over the features at each patch of the {rows} x {cols} grid "
                 f"of input {example}{skipped}, at {len(shown)} of {norms.shape[0]} grid "
                 f"points, on one colour scale.")


# -- the entry point ---------------------------------------------------------------------------
def _check_grid(image_grid, skip_tokens) -> tuple[tuple[int, int] | None, int | None]:
    grid = None
    if image_grid is not None:
        ok = (isinstance(image_grid, (tuple, list)) and len(image_grid) == 2 and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
            for v in image_grid))
        if not ok:
            raise ArgumentError("image_grid", f"expected (rows, cols), two positive integers "
                                              f"(the patch grid), got {image_grid!r}")
        grid = (int(image_grid[0]), int(image_grid[1]))
    if skip_tokens is not None:
        if grid is None:
            raise ArgumentError("skip_tokens", "given without image_grid: it says which tokens "
                                               "precede the patch grid")
        if not isinstance(skip_tokens, numbers.Integral) or isinstance(skip_tokens, bool) or \
                skip_tokens < 0:
            raise ArgumentError("skip_tokens", f"expected an integer >= 0 (the class and "
                                               f"register tokens before the patches), got "
                                               f"{skip_tokens!r}")
        skip_tokens = int(skip_tokens)
    return grid, skip_tokens


def _checked_draw(diag, folder, times, image_grid, skip_tokens, example):
    """draw's arguments checked (ArgumentError naming the first bad one): (the folder as a
    Path, the heat maps' times or None, the example, the patch plan: evolution -> (grid,
    skipped tokens))."""
    if not isinstance(diag, Diagnostics):
        raise ArgumentError("diag", f"expected the Diagnostics that analyze() returns, got "
                                    f"{type(diag).__name__}")
    if not isinstance(folder, (str, os.PathLike)):
        raise ArgumentError("folder", f"expected a path (str or os.PathLike), got "
                                      f"{type(folder).__name__}")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ArgumentError("folder", f"expected a directory, got the file {str(folder)!r}")
    max_t = max(ev["times"][-1] for ev in diag.evolutions)
    if times is not None:
        if isinstance(times, (str, bytes)) or not isinstance(times, Sequence) or not times:
            raise ArgumentError("times", f"expected a non-empty sequence of times in [0, "
                                         f"{max_t:g}], got {times!r}")
        bad = [t for t in times if not _real(t) or not -1e-9 <= float(t) <= max_t + 1e-9]
        if bad:
            raise ArgumentError("times", f"expected times in [0, {max_t:g}] (T), got {bad[0]!r}")
        times = [float(t) for t in times]
    grid, skip_tokens = _check_grid(image_grid, skip_tokens)
    if not isinstance(example, numbers.Integral) or isinstance(example, bool) or not (
            0 <= example < diag.batch):
        raise ArgumentError("example", f"expected an input index in [0, {diag.batch - 1}], got "
                                       f"{example!r}")
    return folder, times, example, _patch_plan(diag, grid, skip_tokens)


def _patch_plan(diag, grid, skip_tokens) -> dict[int, tuple[tuple[int, int], int]]:
    """The evolutions whose tokens hold the patch grid: evolution -> (grid, tokens before it);
    a given grid that fits none is an ArgumentError."""
    patch_plan: dict[int, tuple[tuple[int, int], int]] = {}
    for e, info in enumerate(diag.model["evolutions"]):
        n = info["tokens"]
        if grid is not None:
            skip = skip_tokens if skip_tokens is not None else n - grid[0] * grid[1]
            if skip >= 0 and n - skip == grid[0] * grid[1]:
                patch_plan[e] = (grid, skip)
        elif diag.grids[e] is not None:
            h, w = diag.grids[e]
            if 0 <= n - h * w:
                patch_plan[e] = ((h, w), n - h * w)
    if grid is not None and not patch_plan:
        counts = sorted({info["tokens"] for info in diag.model["evolutions"]})
        extra = f" after {plural(skip_tokens, 'skipped token')}" if skip_tokens is not None else ""
        raise ArgumentError("image_grid", f"{grid[0]} x {grid[1]} = {grid[0] * grid[1]} patches"
                                          f"{extra} fit no evolution (token counts {counts})")
    return patch_plan


def draw(diag: Diagnostics, folder: str | os.PathLike, *, times: Sequence[float] | None = None,
         image_grid: tuple[int, int] | None = None, skip_tokens: int | None = None,
         example: int = 0) -> list[Figure]:
    """Write the figures of ``diag`` (module docstring) into ``folder`` (created if needed),
    each as ``<name>.png`` and ``<name>.svg``; returns them in order. ``times``: the times of
    the heat maps (numbers in [0, T], each drawn at the nearest grid point; default t_0, T/2,
    T). ``image_grid`` (rows, cols) and ``skip_tokens``: the patch grid of the tokens (see the
    module docstring). ``example``: the input drawn in the heat maps, PCA and patch figures."""
    folder, times, example, patch_plan = _checked_draw(diag, folder, times, image_grid,
                                                       skip_tokens, example)
    folder.mkdir(parents=True, exist_ok=True)
    several = len(diag.evolutions) > 1
    out: list[Figure] = []
    for e, ev_name in enumerate(diag.names):
        suffix = f"_{_slug(ev_name)}" if several else ""
        label = f" ({ev_name})" if several else ""
        out.append(_heatmaps(diag, e, folder, f"heatmaps{suffix}", label, times, example))
        for i, op in enumerate(_kernel_labels(diag, e)):
            stem = "kernels" if i == 0 else f"kernels_{_slug(op)}"
            k = _kernels(diag, e, folder, f"{stem}{suffix}", label, op, i == 0)
            if k is not None:
                out.append(k)
        out.append(_curves(diag, e, folder, f"curves{suffix}", label))
        out.append(_pca(diag, e, folder, f"pca{suffix}", label, example))
        if e in patch_plan:
            g, skip = patch_plan[e]
            out.append(_patches(diag, e, folder, f"patches{suffix}", label, g, skip, example))
    return out
