"""Depth as a choice on all-MiniLM-L6-v2 (issue 18, docs/depth.md): training-free coarse grids,
healed ones, throughput, beside the 6-step original and paraphrase-MiniLM-L3-v2.

    python benchmarks/depth_minilm.py [--out results/depth-minilm] [--free] [--speed]
        [--heal SPEC ...] [--budget 600] [--threads 2] [--background LOG]

Every row is one JSON line appended to ``--out``/rows.jsonl as it is measured; rows already
there are skipped (resumable; a healing run resumes from its checkpoints in
``--out``/runs/<id>/heal). Rows:

* ``reference``: the 6-step model scored against itself (its human Lee-50, probe, word
  pairs) and paraphrase-MiniLM-L3-v2 (ONNX, onnxruntime), ``experiments.depth_eval``;
* ``--free``: every method of ``compression.coarsenings`` at N_t = 4, 3, 2, training-free;
* ``--heal SPEC``: SPEC = method:steps:objective[:key=value...], e.g. ``drop:3:distill``
  (the plain recipe: ShortGPT's drop, u(T) only), ``drop:3:shoot``, ``coarsen-linear:6,3,2:
  shoot`` (random-tau healing: one network for N_t = 6, 3 and 2), ``drop:3:shoot:merge=16``;
  keys: seed, shooting, embedding, relation, merge, lr, budget, length, batch_size,
  max_steps, news (the fraction of healing windows from the Lee background news; default:
  uniform over the stream), precision (float32 or bfloat16: ``HealConfig.precision``),
  min_length (each step's windows cut to a length drawn in [min_length, length]), aligned (1:
  the news windows start at a background document's start), windows (how many healing windows:
  default ``--windows``), healed (all or controls: ``HealConfig.healed``), wiki (the fraction
  of healing windows from gensim's shortened English Wikipedia, in place of as many others),
  probe (how many of the first windows the data-driven methods read: ``HealConfig.probe``,
  default 32). Each healed N_t is one row;
* ``--free-merged``: the 6-step model with training-free merging (metric state, at the start
  of each step) at r = 16, 24, 32, 40;
* ``--merged SPEC``: the healed model of SPEC with training-free token merging (metric state,
  at the start of each step) at r = 16, 32, 40: x and t coarsening combined;
* ``--exported SPEC``: the healed model of SPEC exported by ``to_hf`` and scored as the
  transformers BertModel it is (and its largest difference from splitformer's model);
* ``--speed``: forward throughput (no_grad, 8 held-out passages, interleaved medians) at 128
  and 256 tokens of the 6-step model, the drop grids at 4, 3, 2 steps, with merging, and L3;
  ``--speed-parallel``: the same for the parallel grids at 4 and 3 steps beside drop's;
  ``--speed-merge``: for merging at r = 24, 32, 40 (6 steps) and 32, 40 (drop 3).

The fidelity keys are ``depth_eval.Evaluation``'s (mean cosine to the 6-step embeddings on the
130 held-out texts, Lee-50 pair-cosine Spearman against the 6-step model's, human Lee-50, the
polarity probe, WordSim-353, SimLex-999). ``--table`` prints the markdown tables of rows.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from splitformer.compression.coarsenings import method_names, plan
from splitformer.compression.heal import HealConfig, heal
from splitformer.experiments import depth_eval
from splitformer.experiments.text_benchmarks import load_minilm
from splitformer.files import append_line, read_jsonl
from splitformer.interop import from_hf

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # the sibling module background.py, run or imported
    sys.path.insert(0, _HERE)
from background import relaunch  # noqa: E402  (--background LOG)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/depth-minilm")
    p.add_argument("--free", action="store_true", help="the training-free rows")
    p.add_argument("--speed", action="store_true", help="the throughput rows")
    p.add_argument("--speed-merge", action="store_true",
                   help="merging's throughput at r = 24 .. 40 beside 6 steps")
    p.add_argument("--free-merged", action="store_true",
                   help="the 6-step model with training-free merging at r = 16 .. 40")
    p.add_argument("--speed-parallel", action="store_true",
                   help="the parallel grids' throughput beside 6 steps and drop")
    p.add_argument("--heal", action="append", default=[], metavar="SPEC")
    p.add_argument("--merged", action="append", default=[], metavar="SPEC")
    p.add_argument("--exported", action="append", default=[], metavar="SPEC")
    p.add_argument("--budget", type=float, default=600.0, help="healing seconds (600)")
    p.add_argument("--windows", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--table", action="store_true", help="print the tables and exit")
    p.add_argument("--background", default=None, metavar="LOG")
    return p.parse_args(argv)


def _say(text: str) -> None:
    print(f"[depth] {text}", file=sys.stderr, flush=True)


def parse_spec(spec: str, budget: float
               ) -> tuple[str, HealConfig, tuple[float | None, bool, int | None, float]]:
    """SPEC (module doc) -> (row id, HealConfig, (news, aligned, windows, wiki): the healing
    windows' news fraction (None: uniform over the stream), whether its windows start at
    documents, their count (None: --windows) and their Wikipedia fraction,
    ``depth_eval.healing_windows``)."""
    parts = spec.split(":")
    if len(parts) < 3:
        raise SystemExit(f"--heal {spec!r}: expected method:steps:objective[:key=value...]")
    method, steps, objective = parts[0], parts[1], parts[2]
    if method not in method_names():
        raise SystemExit(f"--heal {spec!r}: method must be one of {method_names()}")
    if objective not in ("distill", "shoot"):
        raise SystemExit(f"--heal {spec!r}: objective must be distill or shoot")
    options: dict[str, Any] = {"seed": 0, "shooting": 1.0 if objective == "shoot" else 0.0,
                               "embedding": 0.0, "merge": 0, "lr": 1e-4, "budget": budget,
                               "length": 128, "batch_size": 16, "max_steps": 0,
                               "relation": 0.0, "news": -1.0, "precision": "float32",
                               "min_length": 0, "aligned": 0, "windows": 0, "healed": "all",
                               "wiki": 0.0, "probe": 32}
    seen: set[str] = set()
    for kv in parts[3:]:
        key, _, value = kv.partition("=")
        if key not in options:
            raise SystemExit(f"--heal {spec!r}: unknown key {key!r} ({sorted(options)})")
        if key in seen:
            raise SystemExit(f"--heal {spec!r}: {key} given twice")
        seen.add(key)
        options[key] = type(options[key])(value)
    cfg = HealConfig(method=method, steps=tuple(int(s) for s in steps.split(",")),
                     budget=options["budget"], lr=options["lr"], seed=options["seed"],
                     shooting=options["shooting"], embedding=options["embedding"],
                     merge=options["merge"], length=options["length"],
                     batch_size=options["batch_size"],
                     max_steps=options["max_steps"] or None, relation=options["relation"],
                     precision=options["precision"], healed=options["healed"],
                     probe=options["probe"],
                     min_length=options["min_length"] or None)
    if options["aligned"] and options["news"] < 0:
        raise SystemExit(f"--heal {spec!r}: aligned aligns the news windows; give news")
    return spec, cfg, (None if options["news"] < 0 else options["news"], bool(options["aligned"]),
                       options["windows"] or None, options["wiki"])


class Study:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.out / "rows.jsonl"
        self.rows = read_jsonl(self.rows_path, repair=True) if self.rows_path.exists() else []
        self.done = {r["id"] for r in self.rows}
        torch.set_num_threads(args.threads)
        self.minilm = load_minilm()
        self.teacher = from_hf(self.minilm.model).eval()
        self.evaluation = depth_eval.Evaluation(self.minilm)
        self._windows: dict[tuple[int, float | None, bool, int, float], torch.Tensor] = {}

    def run_folder(self, rid: str) -> Path:
        """The healing folder of the row id ``rid``."""
        return self.out / "runs" / rid.replace(":", "_").replace(",", "-") / "heal"

    def windows(self, length: int = 128, news: float | None = None,
                aligned: bool = False, count: int | None = None, wiki: float = 0.0
                ) -> torch.Tensor:
        key = (length, news, aligned, count or self.args.windows, wiki)
        if key not in self._windows:
            self._windows[key] = depth_eval.healing_windows(
                self.minilm.tokenizer, length, key[3], 0, news, aligned, wiki)
        return self._windows[key]

    def add(self, row: dict[str, Any]) -> None:
        append_line(self.rows_path, json.dumps(row))
        self.rows.append(row)
        self.done.add(row["id"])
        keys = ("mean_cosine", "lee_fidelity_spearman", "lee_human_spearman")
        _say(f"{row['id']}: " + ", ".join(f"{k} {row[k]:.4f}" for k in keys if k in row))

    def score(self, model) -> dict[str, float]:
        return self.evaluation(depth_eval.minilm_embed(model.eval()), full=True)

    def references(self) -> None:
        if "reference/6" not in self.done:
            self.add({"id": "reference/6", "kind": "reference", "steps": 6,
                      **self.score(self.teacher)})
        if "reference/paraphrase-L3" not in self.done:
            try:
                l3 = depth_eval.paraphrase_l3(threads=self.args.threads)
            except Exception as e:  # noqa: BLE001 - the reference is optional data
                _say(f"paraphrase-MiniLM-L3-v2 skipped: {e}")
                return
            self.add({"id": "reference/paraphrase-L3", "kind": "reference", "steps": 3,
                      **self.evaluation(l3.embed, full=True)})

    def probe(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows(128)[:32]}

    def free(self) -> None:
        for method in method_names():
            for n in (4, 3, 2):
                rid = f"free/{method}/{n}"
                if rid in self.done:
                    continue
                try:
                    c = plan(method, self.teacher, n, self.probe())
                except ValueError as e:
                    _say(f"{rid}: {e}")
                    continue
                self.add({"id": rid, "kind": "free", "method": method, "steps": n,
                          "grid": str(c), **self.evaluation(
                              depth_eval.minilm_embed(c.apply(self.teacher).eval()),
                              full=False)})

    def healed(self, spec: str) -> None:
        rid, cfg, text = parse_spec(spec, self.args.budget)
        ids = [f"heal/{rid}/{n}" for n in cfg.steps]
        if all(i in self.done for i in ids):
            return
        folder = self.run_folder(rid)
        _say(f"healing {rid} ({cfg.budget:g} s, {self.args.threads} threads) in {folder}")
        t0 = time.perf_counter()
        result = heal(cfg, teacher=self.teacher, windows=self.windows(cfg.length, *text),
                      out=folder)
        for n, i in zip(cfg.steps, ids, strict=True):
            if i in self.done:
                continue
            self.add({"id": i, "kind": "healed", "spec": rid, "method": cfg.method,
                      "steps": n, "healed_for": list(cfg.steps), "heal": cfg.to_dict(),
                      "grid": str(result.coarsenings[n]), "metrics": result.metrics,
                      "wall_s": round(time.perf_counter() - t0, 1),
                      **self.score(result.student(n))})

    def merged(self, spec: str) -> None:
        """The healed model of ``spec`` (healed already: its run folder is read back) with
        training-free merging at r = 16, 32, 40."""
        rid, cfg, text = parse_spec(spec, self.args.budget)
        folder = self.run_folder(rid)
        todo = [r for r in (16, 32, 40) if f"merged/{rid}/r{r}" not in self.done]
        if not todo:
            return
        result = heal(cfg, teacher=self.teacher, windows=self.windows(cfg.length, *text),
                      out=folder)
        student = result.student(cfg.steps[0])
        for r in todo:
            m = student.with_token_merging(r, metric="state", where="step")
            self.add({"id": f"merged/{rid}/r{r}", "kind": "merged", "spec": rid,
                      "steps": cfg.steps[0], "merge": r, **self.score(m)})

    def free_merged(self) -> None:
        """The 6-step model with training-free merging (metric state, at the start of each
        step: what ``--merge`` heals) at r = 16, 24, 32, 40."""
        for r in (16, 24, 32, 40):
            rid = f"free-merged/6/r{r}"
            if rid not in self.done:
                m = self.teacher.with_token_merging(r, metric="state", where="step")
                self.add({"id": rid, "kind": "merged", "spec": "free", "steps": 6,
                          "merge": r, **self.score(m)})

    def exported(self, spec: str) -> None:
        """The healed model of ``spec`` exported by ``to_hf`` and scored as a transformers
        BertModel (its own forward), with the largest difference of its last hidden state
        from splitformer's on the held-out Lee documents."""
        from splitformer.interop import to_hf

        rid, cfg, text = parse_spec(spec, self.args.budget)
        if f"exported/{rid}" in self.done:
            return
        folder = self.run_folder(rid)
        result = heal(cfg, teacher=self.teacher, windows=self.windows(cfg.length, *text),
                      out=folder)
        student = result.student(cfg.steps[0])
        hf = to_hf(student).eval()
        diff = 0.0
        with torch.no_grad():
            for ids in self.evaluation.texts.lee:
                a = student(input_ids=ids[None]).last_hidden_state
                b = hf(input_ids=ids[None]).last_hidden_state
                diff = max(diff, float((a - b).abs().max()))
        self.add({"id": f"exported/{rid}", "kind": "exported", "spec": rid,
                  "steps": hf.config.num_hidden_layers, "max_abs_diff": diff, **self.score(hf)})

    def speed(self) -> None:
        if "speed" in self.done:
            return
        fns: dict[str, Any] = {"6 steps": self.teacher}
        for n in (4, 3, 2):
            fns[f"drop {n}"] = plan("drop", self.teacher, n, self.probe()).apply(self.teacher)
        for r in (32, 40):
            fns[f"6 steps, merge r={r}"] = self.teacher.with_token_merging(
                r, metric="state", where="step")
            fns[f"drop 3, merge r={r}"] = fns["drop 3"].with_token_merging(
                r, metric="state", where="step")
        fns["6 steps (transformers BertModel)"] = self.minilm.model
        try:
            fns["paraphrase-L3 (transformers BertModel)"] = depth_eval.paraphrase_l3_bert()
        except Exception as e:  # noqa: BLE001 - the reference is optional data
            _say(f"L3 (transformers) skipped: {e}")
        calls = {name: _call(m.eval()) for name, m in fns.items()}
        try:
            l3 = depth_eval.paraphrase_l3(threads=self.args.threads)
            calls["paraphrase-L3 (onnxruntime)"] = l3.forward
        except Exception as e:  # noqa: BLE001
            _say(f"L3 speed skipped: {e}")
        self._throughput("speed", calls)

    def speed_parallel(self) -> None:
        """The parallel grids' throughput beside the 6-step model and drop at the same N_t
        (a superposed step computes every field it sums: the FLOPs of the steps it stands
        for)."""
        if "speed/parallel" in self.done:
            return
        fns: dict[str, Any] = {"6 steps": self.teacher}
        for n in (4, 3):
            fns[f"drop {n}"] = plan("drop", self.teacher, n, self.probe()).apply(self.teacher)
            fns[f"parallel {n}"] = plan("parallel", self.teacher, n).apply(self.teacher)
        self._throughput("speed/parallel", {name: _call(m.eval()) for name, m in fns.items()})

    def speed_merge(self) -> None:
        """Merging's throughput (metric state, at each step's start) at r = 24, 32, 40 on the
        6-step model and at r = 32, 40 on drop's 3 steps, beside the 6-step model."""
        if "speed/merge" in self.done:
            return
        drop3 = plan("drop", self.teacher, 3, self.probe()).apply(self.teacher)
        fns: dict[str, Any] = {"6 steps": self.teacher}
        for r in (24, 32, 40):
            fns[f"6 steps, merge r={r}"] = self.teacher.with_token_merging(
                r, metric="state", where="step")
        for r in (32, 40):
            fns[f"drop 3, merge r={r}"] = drop3.with_token_merging(r, metric="state",
                                                                   where="step")
        self._throughput("speed/merge", {name: _call(m.eval()) for name, m in fns.items()})

    def _throughput(self, row_id: str, calls: dict[str, Any]) -> None:
        result = depth_eval.throughput(calls, (128, 256), repeats=self.args.repeats,
                                       threads=self.args.threads,
                                       tokenizer=self.minilm.tokenizer)
        self.add({"id": row_id, "kind": "speed", "threads": self.args.threads,
                  "repeats": self.args.repeats,
                  "results": {name: {str(n): v for n, v in r.items()}
                              for name, r in result.items()}})


def finished_row(argv: list[str] | None, description: str, threads: int, **more: Any):
    """The command line of a script that reads back a finished row (SPEC, --out, --threads,
    --budget and ``more``: flag -> default) -> (args, Study, HealConfig, windows, HealResult):
    the row's run in --out/runs read back, not healed again."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("spec")
    p.add_argument("--out", default="results/depth-minilm")
    p.add_argument("--threads", type=int, default=threads)
    p.add_argument("--budget", type=float, default=7200.0,
                   help="the depth_minilm.py --budget the row was healed with")
    for flag, default in more.items():
        p.add_argument(flag, type=type(default), default=default)
    args = p.parse_args(argv)
    study = Study(arguments(["--out", args.out, "--threads", str(args.threads)]))
    rid, cfg, text = parse_spec(args.spec, args.budget)
    folder = study.run_folder(rid)
    if not (folder / "final.json").is_file():
        raise SystemExit(f"{args.spec!r}: no finished run in {folder}")
    windows = study.windows(cfg.length, *text)
    return args, study, cfg, windows, heal(cfg, teacher=study.teacher, windows=windows,
                                           out=folder)


def _call(model):
    return lambda ids, mask: model(input_ids=ids, attention_mask=mask)


def table(rows: list[dict[str, Any]]) -> str:
    keys = [("mean_cosine", "cos"), ("kjv256_mean_cosine", "cos 256"),
            ("lee_fidelity_spearman", "Lee fid."),
            ("lee_human_spearman", "Lee human"), ("probe_accuracy", "probe"),
            ("wordsim353", "WS353"), ("simlex999", "SL999")]
    lines = ["| row | N_t | " + " | ".join(h for _, h in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for r in rows:
        if r["kind"] == "speed":
            continue
        cells = []
        for k, _ in keys:
            v = r.get(k)
            cells.append("-" if v is None else f"{v:.3f}" + (
                f" +- {r['probe_std']:.3f}" if k == "probe_accuracy" else ""))
        lines.append(f"| {r['id']} | {r['steps']} | " + " | ".join(cells) + " |")
    for r in rows:
        if r["kind"] != "speed":
            continue
        what = "" if r["id"] == "speed" else f" ({r['id']})"
        lines += ["", f"throughput{what} ({r['threads']} threads, {r['repeats']} repeats, medians)",
                  "", "| model | 128 tokens | 256 tokens |", "|---|---|---|"]
        for name, by in r["results"].items():
            lines.append(f"| {name} | " + " | ".join(
                f"{by[n]['speedup']:.2f}x ({by[n]['median_s'] * 1e3:.0f} ms)"
                for n in ("128", "256")) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.background:
        return relaunch(__file__, args.background, argv)
    if args.table:
        path = Path(args.out) / "rows.jsonl"
        print(table(read_jsonl(path, repair=True)))
        return 0
    study = Study(args)
    study.references()
    if args.free:
        study.free()
    for spec in args.heal:
        study.healed(spec)
    for spec in args.merged:
        study.merged(spec)
    for spec in args.exported:
        study.exported(spec)
    if args.free_merged:
        study.free_merged()
    if args.speed:
        study.speed()
    if args.speed_parallel:
        study.speed_parallel()
    if args.speed_merge:
        study.speed_merge()
    print(table(study.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
