"""`splitformer theory`: what the particle theory of attention predicts, tested on a real model.

The command is thin: its arguments and their checks, the input, the progress line, the report
folder and the output. The checks are values of ``splitformer.analysis.theory`` (each with its
claim, citation, what was run, criterion, assumptions, verdict, constants and fit; their
figures ``analysis.theory.draw``); the page is ``analysis.report.write_report``, as for
``splitformer analyze``; MODEL is resolved by ``subjects.resolve.load_subject`` (a built-in
model, a ``splitformer.save`` or training-run folder, a local Hugging Face folder), and
defaults to the packaged all-MiniLM-L6-v2 (``experiments.text_benchmarks.minilm_folder``).

The input: for a text model, ``--text T``, or by default real text that ships offline: the King
James text (``text_benchmarks.kjv_verses``: its first 100 verses joined) or, without it,
gensim's Lee corpus (``lee_documents``), cut to ``--tokens`` tokens (the checks a, b, c, e) and
to each of ``--lengths`` (check d); for the other models the first ``--sample N`` test
examples of their data set (or ``--data``; default 1). The dynamics checks (b, c) run on the
first input.

Writes DIR/index.html (figures inlined), DIR/theory.json (what ``--json`` prints) and one
figure per check (PNG and SVG); DIR defaults to ``theory/<model name>``, is checked before
anything is loaded, and is written through a staging folder (all or nothing). ``--json`` prints
one object on the last line of stdout: ``{"checks": [{"name", "claim", "verdict", "constants",
"fit": {..., "r2"}, "figure", ...}], "model", "input", "settings", "report"}``. Deterministic
for a ``--seed`` (an integer in [0, 2^31 - 1], as for ``compress``). A verdict is "pass",
"fail", "inconclusive" (the effect is within what the measurement resolves) or "not
applicable".

A model that merges tokens (a ``compress --merge`` folder) is checked with merging off (the
checks read frozen steps on a fixed token grid; ``analysis.theory.Probe``): the summary says
so, and ``model.scheme`` prints the scheme with its merge stage (``model.merging``). Progress
goes to stderr, one line per phase (rewritten in place on a terminal), unless ``--json`` or
``--no-progress``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from . import UsageError, bounded_int, check_out, int_list, stripped
from .progress import Progress
from .report import finish, staging

__all__ = ["add_arguments", "run", "summary"]

HELP = ("test the particle theory of attention on a model (rank collapse, clustering, "
        "metastability, log n scaling, doubly stochastic drift) into an HTML report")
EPILOG = ("checks: a rank_collapse, b clustering, c metastability, d log_n_scaling, "
          "e doubly_stochastic. MODEL defaults to the packaged all-MiniLM-L6-v2. exit status: "
          "0 done (whatever the verdicts); 1 a check failed to run after its inputs were "
          "accepted; 2 a bad input")

CHECK_NAMES = ("rank_collapse", "clustering", "metastability", "log_n_scaling",
               "doubly_stochastic")  # as analysis.theory.CHECKS (not imported: torch loads late)
VERSES = 100  # King James verses joined into the default text
_DEFAULT_TOKENS = 64  # --tokens
_DEFAULT_LENGTHS = (32, 64, 128, 256, 512)  # --lengths (those the text and the model take)


def _betas(text: str) -> tuple[float, ...]:
    """argparse type of --betas: at least four distinct numbers > 0, separated by commas."""
    try:
        values = tuple(dict.fromkeys(float(t) for t in text.split(",") if t.strip()))
    except ValueError:
        values = ()
    if len(values) < 4 or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected at least four distinct numbers > 0 "
                                         f"separated by commas, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                   help="a built-in model, a folder saved by splitformer.save, a 'splitformer "
                        "train' run folder, a 'splitformer compress' result folder or a local "
                        "Hugging Face folder (default: the packaged all-MiniLM-L6-v2)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, metavar="T",
                     help="a text input (default: the King James text, or gensim's Lee corpus)")
    src.add_argument("--sample", default=None, metavar="N", type=bounded_int(64, "(samples)"),
                     help="the first N test examples of the model's data set (or --data)")
    p.add_argument("--data", default=None, type=stripped, metavar="NAME",
                   help="data set of --sample (default: the model's)")
    p.add_argument("--tokens", default=None, metavar="N", type=bounded_int(4096, "(tokens)"),
                   help="tokens of the text (--text or the default) for checks a, b, c, e "
                        "(default 64, or the text's tokens if fewer)")
    p.add_argument("--lengths", default=None, metavar="N,N,...",
                   type=int_list(4, 4096, "(tokens)"),
                   help="token counts of check d (default 32,64,128,256,512; those the model "
                        "takes)")
    p.add_argument("--check", action="append", default=None, choices=CHECK_NAMES,
                   type=stripped, metavar="NAME",
                   help=f"run only this check (repeatable): {', '.join(CHECK_NAMES)}")
    p.add_argument("--t-max", default=100, metavar="T", type=bounded_int(10000, "(time)"),
                   help="check b: how far each frozen step is continued (default 100)")
    p.add_argument("--meta-t-max", default=30, metavar="T", type=bounded_int(10000, "(time)"),
                   help="check c: how far each frozen step is continued (default 30)")
    p.add_argument("--reference-t-max", default=2500, metavar="T", type=int,
                   help="check c: how far its reference system (Q = K = V = I on the circle) "
                        "runs (default 2500; 0 skips it)")
    p.add_argument("--refine", default=10, metavar="K", type=bounded_int(1000, "(substeps)"),
                   help="checks b, c: steps per unit of time, tau = 1/K (default 10)")
    p.add_argument("--betas", default=(0.5, 1.0, 2.0, 4.0), metavar="B,B,B,B", type=_betas,
                   help="check c: the score multipliers, at least four (default 0.5,1,2,4)")
    p.add_argument("--seed", default=0, metavar="S",
                   type=bounded_int(2**31 - 1, "(a seed)", minimum=0),
                   help="seed of the random weights of check e and the reference of check c "
                        "(default 0; 0 .. 2^31 - 1)")
    p.add_argument("--threads", default=None, metavar="N", type=bounded_int(256, "(threads)"),
                   help="torch threads (default: torch's)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder of the report (default: theory/<model name>)")
    p.add_argument("--json", action="store_true",
                   help="print the results as one JSON object on the last line")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (by default a line per phase: rewritten in place "
                        "on a terminal, one line each otherwise)")
    p.set_defaults(_interrupted="; --out is left as it was")


def summary(data: dict[str, Any]) -> str:
    """The summary the command prints and the page shows, from the data alone."""
    lines = [f"model: {data['model']['description']}"]
    if data["model"].get("merging"):
        lines.append(f"merging: the model merges tokens ({data['model']['merging']}, a stage of "
                     f"its scheme [{data['model']['scheme']}]); the checks ran with merging "
                     "off, on the full token grid (each reads a frozen step as one attention "
                     "field on fixed tokens)")
    lines.append(f"input: {data['input']['description']}")
    for c in data["checks"]:
        lines.append(f"{c['letter']} {c['name']}: {c['verdict']} ({c['reason']})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    checks = list(dict.fromkeys(args.check or CHECK_NAMES))
    progress = Progress(total=len(checks) + 3, enabled=not args.json and not args.no_progress,
                        lines=True)  # off a terminal too: one line per phase
    try:
        return _run(args, checks, progress)
    except (UsageError, KeyboardInterrupt):
        progress.close()
        raise


def _model_spec(args: argparse.Namespace) -> str:
    if args.model is not None:
        return args.model
    from ..experiments.text_benchmarks import minilm_folder
    from ..training.data import DatasetError

    try:
        return str(minilm_folder())
    except DatasetError as e:
        raise UsageError(f"argument MODEL: no MODEL given and the default is missing: "
                         f"{' '.join(str(e).split())}") from None


def _run(args: argparse.Namespace, checks: list[str], progress: Progress) -> int:
    from ..subjects.inputs import check_utf8
    from ..subjects.subject import InputError

    if not 0 <= args.reference_t_max <= 100000:
        raise UsageError(f"argument --reference-t-max: expected an integer in [0, 100000], "
                         f"got {args.reference_t_max}")
    if args.data is not None and args.sample is None:
        raise UsageError("argument --data: only with --sample")
    if args.text is not None:
        try:
            check_utf8(args.text, "--text")
        except InputError as e:
            raise UsageError(str(e)) from None
        if not args.text.strip():
            raise UsageError("argument --text: the text is empty")
    if args.out is not None:
        check_out(args.out)
    progress("loading the model")
    from ..commands.analyze import load_subject

    spec = _model_spec(args)
    sub = load_subject(spec)
    out = check_out(args.out if args.out is not None else str(Path("theory") / sub.name))
    inputs, lengths, record = _inputs(args, sub, spec)
    if args.lengths is None:
        args.lengths = _DEFAULT_LENGTHS
    import torch

    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return finish("theory", lambda: _theory(args, sub, inputs, lengths, record, checks, out,
                                                progress),
                      progress, args.json, summary)
    finally:
        torch.set_num_threads(threads)  # as it was (the command may run in-process)


# -- the input --------------------------------------------------------------------------------
def _corpus() -> tuple[str, str]:
    """(text, what it is): the King James text's first verses, else gensim's Lee corpus."""
    from ..experiments import text_benchmarks as tb
    from ..training.data import DatasetError

    try:
        return " ".join(tb.kjv_verses()[:VERSES]), f"the King James text (verses 1-{VERSES})"
    except DatasetError:
        pass
    try:
        return " ".join(tb.lee_documents()), "gensim's Lee corpus (50 documents)"
    except DatasetError:
        raise UsageError("argument --text: the default text needs the King James text or "
                         "gensim's test data (`make data`); give --text T") from None


def _inputs(args: argparse.Namespace, sub: Any, spec: str):
    """(inputs, lengths(n) or None, the input record)."""
    from ..subjects.inputs import model_inputs
    from ..subjects.subject import InputError, Notes

    try:
        if sub.takes == "text" and args.sample is None:
            text, what = (args.text, "--text") if args.text is not None else _corpus()
            return _text_inputs(sub, text, what, args)
        if args.text is not None:
            raise UsageError(f"argument --text: {sub.label} takes {sub.takes}; use --sample N")
        inputs, record = model_inputs(sub, sample=args.sample or 1, data=args.data, model=spec,
                                      notes=Notes())
        return inputs, None, record
    except InputError as e:
        raise UsageError(str(e)) from None


def _text_inputs(sub: Any, text: str, what: str, args: argparse.Namespace):
    """The text's inputs cut to --tokens, the cut, the record. A --tokens, or a --lengths
    when check d runs, given that is more than the text's tokens (at most the model's length)
    is refused; the defaults are cut to them."""
    import torch

    enc = sub.encode([text], "--text")
    full = enc.inputs
    ids = full["input_ids"] if isinstance(full, dict) else full[0]
    length = int(ids.shape[-1])
    has = (f"the text has {length} tokens" + (f" (the model reads at most {sub.max_len})"
                                              if length == sub.max_len else ""))
    if args.tokens is not None and args.tokens > length:
        raise UsageError(f"argument --tokens: {has}, got {args.tokens}")
    lengths_read = args.check is None or "log_n_scaling" in args.check  # check d's
    if args.lengths is not None and lengths_read and max(args.lengths) > length:
        raise UsageError(f"argument --lengths: {has}, got {max(args.lengths)}")
    tokens = _DEFAULT_TOKENS if args.tokens is None else args.tokens
    # a shared last token of two one-word texts is a special suffix ([SEP]): kept at the end
    a = sub.encode(["a"], "--text").inputs
    b = sub.encode(["b"], "--text").inputs
    a_ids = (a["input_ids"] if isinstance(a, dict) else a[0])[0]
    b_ids = (b["input_ids"] if isinstance(b, dict) else b[0])[0]
    suffix = len(a_ids) >= 2 and int(a_ids[-1]) == int(b_ids[-1])

    def cut(n: int):
        n = min(int(n), length)

        def one(v):
            if not isinstance(v, torch.Tensor) or v.dim() != 2 or v.shape[-1] != length:
                return v
            return torch.cat([v[:, :n - 1], v[:, -1:]], dim=1) if suffix else v[:, :n]

        if isinstance(full, dict):
            return {k: one(v) for k, v in full.items()}
        return tuple(one(v) for v in full)

    n = min(tokens, length)
    record = {"kind": "text", "source": what, "tokens": n, "available_tokens": length,
              "max_tokens": sub.max_len, "special_suffix": suffix,
              "description": f"{what}, {n} tokens (checks a, b, c, e); up to {length} tokens "
                             "for check d"}
    return cut(n), cut, record


# -- the checks and the page ------------------------------------------------------------------
def _theory(args, sub, inputs, lengths, record, checks, out: Path, progress) -> dict[str, Any]:
    from ..analysis import report as page
    from ..analysis.checks import ArgumentError
    from ..analysis.report import FigureFile
    from ..analysis.theory import CHECKS, Probe, draw, run_checks

    progress("preparing the model")
    try:
        probe = Probe.from_model(sub.model, inputs, lengths=lengths,
                                 max_tokens=record.get("available_tokens") if lengths else None,
                                 trained=(sub.source or {}).get("kind") != "builtin")
    except ArgumentError as e:
        flag = "MODEL" if e.argument == "model" else ("--text" if sub.takes == "text"
                                                      else "--sample")
        raise UsageError(f"argument {flag}: {' '.join(e.detail.split())[:240]}") from None
    results = run_checks(probe, checks, seed=args.seed, t_max=args.t_max, refine=args.refine,
                         meta_t_max=args.meta_t_max, betas=args.betas, lengths=args.lengths,
                         reference_t_max=args.reference_t_max, progress=progress)
    progress("writing the report")
    evo = probe.evolution
    model = {"description": sub.what, "source": sub.source, "evolution": probe.label,
             "evolutions": probe.evolutions, "scheme": probe.scheme_text(),
             "merging": None if probe.merging is None else str(probe.merging),
             "steps": probe.steps,
             "tau": evo.tau, "tokens": int(probe.u0.shape[1]),
             "features": int(probe.u0.shape[-1])}
    settings = {"seed": args.seed, "t_max": args.t_max, "meta_t_max": args.meta_t_max,
                "reference_t_max": args.reference_t_max,
                "refine": args.refine, "betas": list(args.betas), "lengths": list(args.lengths),
                "checks": checks, "dtype": "float64"}
    with staging(out) as stage:
        figs = []
        for c in results:
            f = draw(c, stage.folder)
            figs.append(FigureFile(f.name, f.title, f.caption, f.png, f.svg))
        records = [{"name": c.name, "letter": CHECKS[c.name][0], **c.as_dict()}
                   for c in results]
        for r in records:
            r["figure"] = {**r["figure"]}
        data = {"model": model, "input": record, "settings": settings, "checks": records,
                "report": str(out / "index.html")}
        page.write_report(stage.folder, f"splitformer theory {args.model or sub.name}",
                          _sections(data, figs), data)
        (stage.folder / "theory.json").write_text(json.dumps(data, indent=1) + "\n")
        stage.commit([*(p.name for f in figs for p in (f.png, f.svg)), "theory.json",
                      "index.html"])
    return data


def _sections(data: dict[str, Any], figs: list[Any]):
    from ..analysis.report import Section

    sections = [Section("Summary", summary(data) + "\n", pre=True),
                Section("Model", "The model and the evolution the checks run.", data="model"),
                Section("Input", "What the checks ran on.", data="input"),
                Section("Settings", "The options of the run.", data="settings")]
    for c, f in zip(data["checks"], figs, strict=True):
        text = (f"Claim. {c['claim']}\n\nSource: {c['citation']}\n\nWhat was run. {c['run']}"
                f"\n\nCriterion: {c['criterion']}.\n\nVerdict: {c['verdict']} ({c['reason']}).")
        failed = [a["name"] for a in c["assumptions"] if not a["holds"]]
        if failed:
            text += "\n\nAssumptions the model does not meet: " + "; ".join(failed) + "."
        sections.append(Section(f"{c['letter']}. {c['title']}: {c['verdict']}", text,
                                figures=[f]))
    sections.append(Section("Checks", "Every check's claim, assumptions, verdict, constants, "
                            "fit and measured data (the same as theory.json).", data="checks"))
    return sections
