"""The measurements of docs/depth-llm.md: SmolLM2-135M (30 steps) coarsened to N = 26, 22, 15
steps by every method, training-free and healed, and which diagnostic of the evolution
predicts what a step is worth.

    python -m splitformer.experiments.depth_llm free   [--out results/depth-llm]
    python -m splitformer.experiments.depth_llm rank   [--out results/depth-llm]
    python -m splitformer.experiments.depth_llm speed  [--out results/depth-llm] [--repeats 3]
    python -m splitformer.experiments.depth_llm table  [--out results/depth-llm]

``free`` evaluates every (method, absorb) of ``CONFIGS`` at every N (``compression``: the grid
of ``coarsenings.plan``, the absorbing steps of ``fitting.fit``) with ``lm_eval.LMEvaluation``
(32 held-out windows of 512 tokens from the end of gensim's Wikipedia extract; KL and top-1 on
the first 8; 20 greedy continuations) and appends one JSON row per model to
OUT/training-free.jsonl as it goes; a row already there is not recomputed (kill and rerun
resumes). SLEB's order is computed once for the largest removal and kept in
OUT/sleb-order.json (with the probe's SHA-256); its prefixes give every N's grid, and a rerun
reads the file.
``rank`` writes OUT/rankings.json: per step, the measured perplexity of the model without that
step alone (on the first 4 held-out windows) beside block influence, angular distance, the
local removal error and the merge error (on 4 calibration windows, ``compression.rankings``),
and the Spearman correlation of each diagnostic with the measured worth (scipy.stats).
``speed`` writes OUT/speed.json: prefill (512 tokens) and decode (64 new) tokens per second of
the coarse models against the 30-step one (``lm_eval.speed``, ``--repeats`` interleaved
rounds). ``table`` prints the tables the docs quote: the healed runs (from the compress.json
of each ``splitformer compress`` run, docs/depth-llm.md) and, for a command run at several
``--seed``s, their mean and sample standard deviation; the training-free rows; the rankings;
the speed ratios with the range of their rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from ..files import write_atomic
from ..usage import Parser, int_list
from .rows import answered, append_row, read_rows, say

__all__ = ["CONFIGS", "STEPS", "main"]

STEPS = (22, 15, 26)  # in the order they are computed (the goals are at 22 and 15)
CONFIGS = (("drop", "keep"), ("angular", "keep"), ("keep-first", "keep"), ("sleb", "keep"),
           ("pairs", "average"), ("drop", "linear"), ("angular", "linear"),
           ("sleb", "linear"))
"""(method, absorb) pairs of the training-free table: ShortGPT, Gromov, reverse order, SLEB,
merged pairs, and ReplaceMe's least-squares map on three of the grids."""

PROBE = (4, 256)  # SLEB's and the data-driven grids' probe: 4 calibration windows of 256
FIT_WINDOWS = 32  # calibration windows (of 512) the least-squares maps are fitted on
RANK_WINDOWS = 4  # windows (of 512) of the single-step removals and of the diagnostics


def _setup(threads: int | None):
    from ..interop import from_hf
    from . import lm_eval

    if threads:
        torch.set_num_threads(threads)
    say("loading SmolLM2")
    teacher = from_hf("smollm2").eval()
    text = lm_eval.lm_text(teacher.tokenizer)
    return teacher, text


def _sleb_order(out: Path, teacher, probe: torch.Tensor, removals: int) -> dict:
    """SLEB's greedy order on the probe, kept in OUT/sleb-order.json: the greedy removals of a
    smaller N are a prefix of a larger one's, so one order serves every N and a rerun (another
    N, a killed sweep) reads it instead of repeating its removals x steps candidate runs."""
    from ..compression.heal import fingerprint
    from ..compression.rankings import sleb_order

    path = out / "sleb-order.json"
    probe_text = f"lm_eval calibration windows 0..{PROBE[0] - 1}, first {PROBE[1]} tokens"
    sha = fingerprint(probe)
    try:
        found = json.loads(path.read_text())
        if (found.get("probe_sha256") == sha and len(found["order"]) >= removals
                and len(found["losses"]) >= removals):
            say(f"SLEB's order from {path}: {found['order'][:removals]}")
            return found
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no file, or one that is not a whole order: computed again
    found = sleb_order(teacher, probe, removals, say=say)
    record = {"probe": probe_text, "probe_sha256": sha,
              "order": [int(n) for n in found["order"]],
              "loss": float(found["loss"]), "losses": [float(x) for x in found["losses"]]}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    return record


def _grids(out: Path, teacher, text, steps: Sequence[int], method: str):
    """{N: Coarsening} for ``method`` (SLEB's order computed once for the largest removal)."""
    from ..compression.coarsenings import _dropped, plan

    probe = {"input_ids": text.calibration[:PROBE[0], :PROBE[1]]}
    L = teacher.evolution.num_steps
    if method != "sleb":
        return {n: plan(method, teacher, n, probe) for n in steps}
    found = _sleb_order(out, teacher, probe["input_ids"], L - min(steps))
    losses = [round(x, 6) for x in [found["loss"], *found["losses"]]]
    return {n: _dropped("sleb", teacher, sorted(found["order"][:L - n]),
                        {"order": found["order"][:L - n], "losses": losses[:L - n + 1]})
            for n in steps}


def free(out: Path, steps: Sequence[int], configs: Sequence[tuple[str, str]],
         threads: int | None) -> None:
    from ..compression.fitting import FitConfig, fit
    from ..compression.heal import healed_copy
    from . import lm_eval

    path = out / "training-free.jsonl"
    done = {(r["steps"], r["method"], r["absorb"]) for r in read_rows(path)}
    todo = [(n, m, a) for n in steps for m, a in configs if (n, m, a) not in done]
    if not todo:
        say(f"{path}: every row is there")
        return
    teacher, text = _setup(threads)
    say("evaluating the teacher")
    evaluation = lm_eval.LMEvaluation(teacher, text, say=None)
    if ("teacher",) not in {(r.get("method"),) for r in read_rows(path)}:
        # the teacher against itself: kl 0, top-1 1, every continuation whole (by definition)
        append_row(path, {"steps": teacher.evolution.num_steps, "method": "teacher",
                       "absorb": "keep", **evaluation.teacher, "perplexity_ratio": 1.0,
                       "kl": 0.0, "top1": 1.0, "match_tokens": float(lm_eval.NEW_TOKENS),
                       "match_full": lm_eval.PROMPTS}, key=("method",))
    grids: dict[str, dict] = {}
    for n, method, absorb in todo:
        if method not in grids:
            say(f"choosing the grids of {method}")
            grids[method] = _grids(out, teacher, text, steps, method)
        coarsening = grids[method][n]
        say(f"N={n} {method} / {absorb}: {coarsening}")
        start = time.perf_counter()
        base = healed_copy(teacher)
        report = fit(base, coarsening, FitConfig(absorb=absorb), teacher=teacher,
                     calibration=text.calibration[:FIT_WINDOWS], say=say)
        student = coarsening.apply(base).eval()
        fitted = time.perf_counter() - start
        result = evaluation(student)
        say(f"  perplexity {result['perplexity']:.2f} ({result['perplexity_ratio']:.2f}x), "
             f"kl {result['kl']:.3f}, top1 {result['top1']:.3f}, match "
             f"{result.get('match_tokens', 0):.1f}")
        append_row(path, {"steps": n, "method": method, "absorb": absorb,
                       "grid": coarsening.to_dict(), "fit": report,
                       "fit_seconds": round(fitted, 1), **result},
                   key=("steps", "method", "absorb"))
        del base, student


def rank(out: Path, threads: int | None) -> None:
    from scipy.stats import spearmanr

    from ..compression.rankings import removal_losses, step_diagnostics

    path = out / "rankings.json"
    if path.is_file():
        say(f"{path} is there")
        return
    teacher, text = _setup(threads)
    say(f"measured: perplexity without each single step ({RANK_WINDOWS} held-out windows)")
    measured = removal_losses(teacher, text.evaluation[:RANK_WINDOWS], say=say)
    say(f"diagnostics from u(t) on {RANK_WINDOWS} calibration windows")
    diag = step_diagnostics(teacher, text.calibration[:RANK_WINDOWS], say=say)
    worth = [math.exp(x) for x in measured["removal"]]
    rho = {}
    for key in ("block_influence", "angular", "removal_error", "merge_error"):
        r = spearmanr(diag[key], worth)
        rho[key] = {"spearman": float(r.statistic), "p_value": float(r.pvalue)}
    record = {"perplexity": math.exp(measured["loss"]), "removal_perplexity": worth,
              **diag, "spearman": rho,
              "text": {"measured": f"lm_eval evaluation windows 0..{RANK_WINDOWS - 1} "
                                   f"({RANK_WINDOWS} x 512)",
                       "diagnostics": f"lm_eval calibration windows 0..{RANK_WINDOWS - 1} "
                                      f"({RANK_WINDOWS} x 512)"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    say(f"wrote {path}: " + ", ".join(f"{k} {v['spearman']:.3f}" for k, v in rho.items()))


def speed(out: Path, steps: Sequence[int], threads: int | None, repeats: int = 3) -> None:
    from . import lm_eval

    path = out / "speed.json"
    teacher, text = _setup(threads)
    rows = {}
    for n in steps:
        student = teacher.drop_steps(list(range(n, teacher.evolution.num_steps))).eval()
        say(f"speed: N={n} against 30 steps")
        rows[str(n)] = lm_eval.speed(student, teacher, text, prompt=512, new=64,
                                    repeats=repeats)
        say(f"  prefill {rows[str(n)]['prefill_ratio']:.3f}x, decode "
             f"{rows[str(n)]['decode_ratio']:.3f}x")
    write_atomic(path, json.dumps({"threads": torch.get_num_threads(), "repeats": repeats,
                                  "rows": rows}, indent=1) + "\n")


def healed_rows(out: Path) -> list[dict]:
    """The healed runs' measures, from the compress.json of each ``splitformer compress`` run
    copied into OUT/healed/ (docs/depth-llm.md quotes the command of each)."""
    rows = []
    for path in sorted((out / "healed").glob("*.json")):
        record = json.loads(path.read_text())
        heal = record["heal"]
        for n, measures in (record.get("fidelity") or {}).items():
            rows.append({"run": path.stem, "steps": int(n), "method": record["method"],
                         "fit": heal.get("fit", "keep"),
                         "fit_init": heal.get("fit_init", "keep"), "heal": record["objective"],
                         "shooting": heal.get("shooting", 0.0),
                         "fit_seconds": (record["metrics"].get("fit") or {}).get("seconds"),
                         "heal_steps": record["metrics"]["steps_taken"],
                         "heal_seconds": record["metrics"]["seconds"],
                         "fits": (record["metrics"].get("fit") or {}).get("fits"), **measures})
    return rows


def seed_groups(rows: Sequence[dict]) -> dict[tuple[str, int], list[dict]]:
    """Healed rows of the same command at several ``--seed``s: grouped by (the run's name
    without its ``-s<seed>`` suffix, N), only the groups of more than one run."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((re.sub(r"-s\d+$", "", r["run"]), r["steps"]), []).append(r)
    return {k: v for k, v in groups.items() if len({r["run"] for r in v}) > 1}


def _compare_seed_groups(groups: dict) -> None:
    """Every two seed groups at one N: the difference of their mean perplexity ratios and
    Welch's t-test on it (scipy.stats.ttest_ind, unequal variances)."""
    from scipy import stats

    keys = sorted(groups)
    for i, (a, n) in enumerate(keys):
        for b, m in keys[i + 1:]:
            if m != n:
                continue
            x = [r["perplexity_ratio"] for r in groups[(a, n)]]
            y = [r["perplexity_ratio"] for r in groups[(b, m)]]
            t = stats.ttest_ind(x, y, equal_var=False)
            print(f"{a} - {b} at N={n}: perplexity ratio {sum(x) / len(x) - sum(y) / len(y):+.4f}"
                  f" (Welch's t {t.statistic:.2f}, p {t.pvalue:.2g}, {len(x)} and {len(y)} "
                  "seeds)")


def table(out: Path) -> None:
    from .sweep import mean_std

    healed = healed_rows(out)
    for r in healed:
        print(f"healed {r['run']}: N={r['steps']} {r['method']} fit {r['fit']}"
              + (f" from {r['fit_init']}" if r["fit"] == "step" else "")
              + (" (nothing fitted)" if r["fit_seconds"] is None else f" ({r['fit_seconds']} s)")
              + f" + {r['heal']}"
              + (f" + shooting {r['shooting']:g}" if r["shooting"] and r["heal"] == "kl" else "")
              + f" ({r['heal_steps']} steps, "
              f"{r['heal_seconds']:.0f} s): perplexity {r['perplexity']:.2f} "
              f"({r['perplexity_ratio']:.2f}x), bpb {r['bits_per_byte']:.3f}, KL "
              f"{r['kl']:.3f}, top1 {r['top1']:.3f}, match {r.get('match_tokens', 0):.1f} "
              f"({r.get('match_full', 0)} whole)")
        for step, f in sorted((r.get("fits") or {}).items(), key=lambda kv: int(kv[0])):
            print(f"  absorbing step {step}: " + ", ".join(
                f"{k} {v:.4g}" for k, v in f.items() if isinstance(v, (int, float))))
    for (name, n), group in seed_groups(healed).items():
        stats = {key: mean_std([r[key] for r in group])
                 for key in ("perplexity", "perplexity_ratio", "bits_per_byte", "kl", "top1")}
        print(f"seeds of {name} at N={n} ({len(group)} runs): "
              + ", ".join(f"{k} {m:.4g} +- {s:.2g}" for k, (m, s) in stats.items())
              + " (mean +- sample standard deviation)")
    _compare_seed_groups(seed_groups(healed))
    rows = read_rows(out / "training-free.jsonl")
    print(f"{'N':>3} {'method':<11} {'absorb':<8} {'ppl':>8} {'x':>6} {'bpb':>6} {'KL':>6} "
          f"{'top1':>6} {'match':>6}")
    for r in sorted(rows, key=lambda r: (-r["steps"], r["perplexity"])):
        print(f"{r['steps']:>3} {r['method']:<11} {r['absorb']:<8} {r['perplexity']:>8.2f} "
              f"{r['perplexity_ratio']:>6.2f} {r['bits_per_byte']:>6.3f} {r['kl']:>6.3f} "
              f"{r['top1']:>6.3f} {r.get('match_tokens', float('nan')):>6.1f}")
    ranks = out / "rankings.json"
    if ranks.is_file():
        record = json.loads(ranks.read_text())
        worth = record["removal_perplexity"]
        order = sorted(range(len(worth)), key=lambda n: worth[n])
        print(f"rankings ({record['text']['measured']}; teacher {record['perplexity']:.2f}): "
              "perplexity without one step, least first: "
              + ", ".join(f"{n}: {worth[n]:.1f}" for n in order))
        for key, v in record["spearman"].items():
            print(f"  Spearman({key}, perplexity without the step) = {v['spearman']:+.3f} "
                  f"(p = {v['p_value']:.2g})")
    speed_file = out / "speed.json"
    if speed_file.is_file():
        record = json.loads(speed_file.read_text())
        for n, row in record["rows"].items():
            paired = [r / m for m, r in zip(row["model"]["times_prefill_s"],
                                             row["reference"]["times_prefill_s"], strict=True)]
            print(f"speed N={n} against 30 steps ({record['threads']} threads, "
                  f"{len(paired)} rounds): prefill {row['prefill_ratio']:.3f}x (rounds "
                  f"{min(paired):.3f}-{max(paired):.3f}; "
                  f"{row['model']['prefill_tokens_per_s']:.0f} tokens/s), decode "
                  f"{row['decode_ratio']:.3f}x ({row['model']['decode_tokens_per_s']:.1f} "
                  "tokens/s)")


def _configs(text: str) -> tuple[tuple[str, str], ...]:
    """--configs: method/absorb pairs separated by commas, each among ``CONFIGS``' methods
    and absorbs."""
    methods = dict.fromkeys(m for m, _ in CONFIGS)
    absorbs = ("keep", "average", "linear")
    pairs = [tuple(c.strip().split("/")) for c in text.split(",")]
    if not all(len(c) == 2 and c[0] in methods and c[1] in absorbs for c in pairs):
        raise argparse.ArgumentTypeError(
            f"expected method/absorb pairs separated by commas, methods among "
            f"{', '.join(methods)} and absorbs among {', '.join(absorbs)}, got {text!r}")
    return tuple(pairs)


def _rounds(text: str) -> int:
    """--repeats: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    p = Parser(prog="python -m splitformer.experiments.depth_llm",
               description=__doc__.split("\n\n")[0])
    p.add_argument("phase", choices=("free", "rank", "speed", "table"))
    p.add_argument("--out", type=Path, default=Path("results/depth-llm"),
                   help="folder of the rows and records (default results/depth-llm)")
    p.add_argument("--steps", type=int_list(1, 29, "(coarse steps of SmolLM2's 30)"),
                   default=STEPS,
                   help=f"coarse numbers of steps, comma-separated (default "
                        f"{','.join(map(str, STEPS))})")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice)")
    p.add_argument("--repeats", type=_rounds, default=3,
                   help="speed: interleaved timing rounds per model, medians taken (default 3)")
    p.add_argument("--configs", type=_configs, default=None,
                   help="method/absorb pairs, comma-separated (default: "
                        + ",".join(f"{m}/{a}" for m, a in CONFIGS) + ")")
    args = p.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        p.error(f"argument --out: expected a folder, got the file {str(args.out)!r}")
    if args.phase == "table" and not args.out.is_dir():
        p.error(f"argument --out: no folder {str(args.out)!r} (run free, rank or speed first)")
    steps = args.steps
    configs = CONFIGS if args.configs is None else args.configs
    work = {"free": lambda: free(args.out, steps, configs, args.threads),
            "rank": lambda: rank(args.out, args.threads),
            "speed": lambda: speed(args.out, steps, args.threads, args.repeats),
            "table": lambda: table(args.out)}
    # free appends rows as it goes; rank and speed write their records at the end
    answered(p.prog, work[args.phase],
             kept=args.out / "training-free.jsonl" if args.phase == "free" else None)


if __name__ == "__main__":
    main()
