"""`splitformer analyze`: diagnostics of a model's evolution on real inputs, as an HTML report.

The command is thin: its arguments and their checks, the progress line, the report folder and
the output. What MODEL is and how inputs reach it live on the analysis side: MODEL is resolved
by ``subjects.resolve.load_subject`` to a ``Subject`` (``subjects.subject``) and the input made
by ``subjects.inputs.model_inputs`` (images: ``subjects.images``); the diagnostics are
``analysis.diagnostics.analyze``, the figures ``analysis.figures.draw``, the page
``analysis.report.write_report``.

MODEL is one of

* a built-in model (``BUILTINS``: small random-weight models built in code, seeded with 0);
* a folder written by ``splitformer.save`` (``model.json`` + ``model.safetensors``);
* a ``splitformer train`` run folder (``config.json`` and a checkpoint: ``latest`` /
  ``ckpt-*``): its newest complete checkpoint, rebuilt from the recorded source;
* a ``splitformer compress`` folder (``compress.json``): the compressed model at its default
  number of steps, with the base folder's tokenizer;
* a local Hugging Face folder (``config.json`` with ``model_type`` bert, vit, cvt or gpt2, as
  ``save_pretrained`` writes it): ``splitformer.from_hf``; nothing is downloaded, ever.

The input is one of ``--text T`` (the checkpoint's own tokenizer for a Hugging Face text model,
characters of the model's vocabulary for the others; a text longer than the model takes is
truncated, with a one-line warning on stderr), ``--image FILE`` (PNG or JPEG, prepared as the
checkpoint's ``preprocessor_config.json`` says: ``do_resize`` with ``size`` and ``resample``
(the Pillow filter of that number: 0 nearest, 1 Lanczos, 2 bilinear, 3 bicubic, 4 box, 5
Hamming), ``crop_pct``, ``do_rescale`` with ``rescale_factor``, ``do_normalize`` with
``image_mean`` and ``image_std``; without one, resized bilinearly to the model's input shape)
``--sample N`` (the first N test examples of the model's data set, or of ``--data NAME``)
and ``--corpus`` (real running text that ships offline: the King James text's first 100 verses,
or gensim's Lee corpus, cut to ``--tokens N`` tokens, 256 by default;
``subjects.inputs.default_text``); without one, a model that knows its data set takes
``--sample 1`` and a causal language model that does not (a Llama-family decoder, a GGUF such as
``smollm2``) takes ``--corpus`` (a note says so).

For a decoder of the Llama family the diagnostics include, per step, the attention sink (the
mass the first token receives) and the gated field's Lipschitz bound on the pre-norm's ball
beside its measured local estimates (``analysis.diagnostics``, ``analysis.gated``).

Nothing is changed or assumed silently: each of the following is a note, one line on stderr
(``splitformer analyze: note: ...``) and a line of the data's ``"notes"``, with its facts in
``"input"``: characters outside a character model's vocabulary (analysed as its unknown mark;
``unknown_characters``) or unknown tokens a tokenizer made (``unknown_tokens``); a ``--text``
that is also the name of a file (the text is analysed as given); a 16-bit image (scaled to 8
bits, ``bits``); transparency (composited onto white, ``transparency``); a resize that changes
the aspect ratio or a centre crop (``aspect_ratio_changed``, ``cropped``); a colour image fed
to a one-channel model (luminance); the image-processor defaults used for settings a Hugging
Face folder's preprocessor_config.json does not give, or for all of them when it has none
(``processor_defaults``). Refused (exit 2, one line): a ``--text`` that is not valid UTF-8, an
image over Pillow's decompression-bomb limit, a model with non-finite weights, non-finite
inputs, a data set that does not fit the model (checked before the sample count).

``--out`` is checked before anything is loaded (a folder that exists or can be created, and is
writable). The report is written into a temporary folder (next to a fresh DIR, inside an
existing one) and moved into place at the end: the figures, then diagnostics.json, then
index.html, each replaced at once; Ctrl-C or a failure leaves DIR as it was.

Writes DIR/index.html (the report: figures inlined, no external asset), DIR/diagnostics.json
(what ``--json`` prints) and the figures (PNG and SVG); DIR defaults to
``analysis/<model name>``. Prints the summary and the report's path; ``--json`` prints one JSON
object: ``diagnostics.as_dict()`` with ``"source"`` (what MODEL was), ``"input"`` (what was
analysed, with its numbers), ``"figures"`` (name, title, caption and files of each figure
written) and ``"report"`` (the path of index.html as --out gave it: relative to the working
folder by default, never the absolute path of the machine it ran on). Every number of the
report, the summary included, is a number of that object. Figures that an earlier analysis listed in
DIR/diagnostics.json and this one does not draw are removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..subjects.images import fit_file_image as _fit_file_image  # noqa: F401 (moved there)
from ..subjects.images import read_image as _read_image  # noqa: F401 (moved there)
from ..subjects.inputs import check_utf8, model_inputs
from ..subjects.resolve import BUILTINS, HF_TYPES
from ..subjects.resolve import load_subject as _resolve
from ..subjects.subject import Encoded, ImageSpec, InputError, Notes, Subject, image_grid
from . import UsageError, bounded_int, check_out, stripped
from .progress import Progress
from .report import finish, staging

__all__ = ["BUILTINS", "Encoded", "ImageSpec", "Subject", "add_arguments", "load_subject",
           "model_inputs", "run", "summary"]

HELP = ("diagnose a model's evolution (norms, velocities, Lipschitz estimates, ranks, "
        "attention) on real inputs into a self-contained HTML report")

MAX_SAMPLES = 256
DEFAULT_TOKENS = 256  # as subjects.inputs.DEFAULT_TOKENS (the --corpus tokens)
LIPSCHITZ_ITERATIONS = 100  # as analysis.diagnostics (not imported here: torch loads late)
LIPSCHITZ_TOL = 1e-4


def _tolerance(text: str) -> float:
    """argparse type of --lipschitz-tol: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1) (a relative change), "
                                         f"got {text!r}")
    return value


EPILOG = ("built-in models: " + "; ".join(f"{k}: {v[0]}" for k, v in BUILTINS.items())
          + ". exit status: 0 done; 1 the analysis failed after its inputs were accepted; "
          "2 a bad input")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help=f"a built-in model ({', '.join(BUILTINS)}), a folder saved by "
                        "splitformer.save, a 'splitformer train' run folder, a "
                        "'splitformer compress' folder, or a local Hugging Face folder "
                        f"(model_type {', '.join(HF_TYPES)})")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, metavar="T",
                     help="a text input (the checkpoint's tokenizer, or the model's characters)")
    src.add_argument("--image", default=None, metavar="FILE",
                     help="a PNG or JPEG input, resized and normalised for the model")
    src.add_argument("--sample", default=None, metavar="N",
                     type=bounded_int(MAX_SAMPLES, "(samples)"),
                     help="the first N test examples of the model's data set (or --data); the "
                          "default for a model that knows its data is --sample 1")
    src.add_argument("--corpus", action="store_true",
                     help="offline running text (the King James text, or gensim's Lee corpus) "
                          "cut to --tokens tokens; the default of a causal language model that "
                          "knows no data set")
    p.add_argument("--tokens", default=None, metavar="N", type=bounded_int(8192, "(tokens)"),
                   help=f"tokens of --corpus (default {DEFAULT_TOKENS})")
    from ..training.data import DATASETS

    p.add_argument("--data", default=None, type=stripped, metavar="NAME",
                   help=f"data set of --sample: {', '.join(DATASETS)} (default: the model's)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder of the report (default: analysis/<model name>)")
    p.add_argument("--lipschitz-iterations", default=LIPSCHITZ_ITERATIONS, metavar="K",
                   type=bounded_int(1000, "(iterations)"),
                   help="the most iterations (one jvp and one vjp each) of each step's "
                        f"Lipschitz estimate (default {LIPSCHITZ_ITERATIONS}); a note says when "
                        "a step reaches it")
    p.add_argument("--lipschitz-tol", default=LIPSCHITZ_TOL, metavar="TOL", type=_tolerance,
                   help="stop a step's Lipschitz iteration when the estimate changes by less "
                        f"than TOL (relative; default {LIPSCHITZ_TOL:g})")
    p.add_argument("--json", action="store_true",
                   help="print the diagnostics (and the report's path) as one JSON object")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (by default a line per phase: rewritten in place "
                        "on a terminal, one line each otherwise)")
    p.set_defaults(_interrupted="; --out is left as it was")


def summary(data: dict[str, Any]) -> str:
    """The summary the command prints and the report shows, from the data alone (what
    ``--json`` prints): what MODEL was, the input, then ``analysis.diagnostics.summary_text``."""
    from ..analysis.diagnostics import summary_text

    return (f"model: {data['source']['description']}\ninput: {data['input']['description']}\n"
            f"{summary_text(data).rstrip()}")


def _sections(data: dict[str, Any], figs: list[Any]):
    from ..analysis.report import Section

    sections = [Section("Summary", summary(data) + "\n", pre=True, data="model"),
                Section("Model source", "What MODEL was.", data="source"),
                Section("Input", "What was analysed, with its numbers.", data="input")]
    if isinstance(data.get("activation"), dict):
        sections.append(Section("Activation", data="activation"))
    if figs:
        sections.append(Section("Figures", "Each figure's name, title, caption and files are "
                                "listed after the figures.", figures=figs, data="figures"))
    if "evolutions" in data:
        sections.append(Section("Evolutions", "Per step of each evolution: the state's norm, "
                                "its velocity, the Lipschitz estimate of the step map (with the "
                                "iterations it used and whether it converged), the mean cosine "
                                "similarity between its tokens and its effective rank; then "
                                "each attention substep's per-head entropy and the mass it "
                                "puts on the first token (the attention sink), the gated "
                                "field's Lipschitz bound beside its measured estimates (a "
                                "decoder of the Llama family), and each substep's increment, "
                                "share, constraint residuals and FFN reading (Definitions "
                                "below).", data="evolutions"))
    if isinstance(data.get("lipschitz_settings"), dict):
        sections.append(Section("Lipschitz estimates", "How each step's Lipschitz estimate was "
                                "computed. The product of the estimates over the steps "
                                "estimates a bound on the norm of the Jacobian of u(0) -> u(T) "
                                "at this input only (chain rule); each factor estimates its "
                                "largest singular value from below, so the product is an "
                                "estimate, not a guaranteed bound.",
                                data="lipschitz_settings"))
    if data.get("notes"):
        sections.append(Section("Notes", "What preparing the input changed or assumed, why a "
                                 "quantity is missing (None) where it is, and which estimates "
                                 "did not converge.", data="notes"))
    if isinstance(data.get("definitions"), dict):
        sections.append(Section("Definitions", "What each quantity of the tables is.",
                                data="definitions"))
    return sections


def _figure_records(figs: list[Any]) -> list[dict[str, Any]]:
    return [{"name": f.name, "title": f.title, "caption": f.caption, "png": f.png.name,
             "svg": f.svg.name} for f in figs]


def _stale(out: Path, figs: list[Any]) -> list[str]:
    """The figure files an earlier analysis in ``out`` listed (in its diagnostics.json) that
    this one did not write; files of other names are left alone."""
    old = out / "diagnostics.json"
    try:
        doc = json.loads(old.read_text(encoding="utf-8")) if old.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    listed = doc.get("figures") if isinstance(doc, dict) else None
    if not isinstance(listed, list):
        return []
    keep = {p.name for f in figs for p in (f.png, f.svg)}
    stale = []
    for rec in listed:
        if not isinstance(rec, dict):
            continue
        for key in ("png", "svg"):
            name = rec.get(key)
            if isinstance(name, str) and name not in keep and Path(name).name == name \
                    and name.endswith((".png", ".svg")):
                stale.append(name)
    return stale


def load_subject(spec: str) -> Subject:
    """MODEL -> its Subject (``subjects.resolve.load_subject``); a bad MODEL is a UsageError."""
    with _usage():
        return _resolve(spec)


@contextlib.contextmanager
def _usage() -> Iterator[None]:
    """An InputError of the analysis side (a bad MODEL or input) as the command's UsageError."""
    try:
        yield
    except InputError as e:
        raise UsageError(str(e)) from None


def _say(kind: str, line: str) -> None:
    """A note or a warning of the input's preparation: one line on stderr."""
    print(f"splitformer analyze: {kind}: {line}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    progress = Progress(total=4, enabled=not args.json and not args.no_progress, lines=True)
    try:
        return _run(args, progress)
    except (UsageError, KeyboardInterrupt):
        progress.close()  # a usage error (or Ctrl-C's line) starts at the beginning of a line
        raise


def _run(args: argparse.Namespace, progress: Progress) -> int:
    if args.image is not None and not Path(args.image).exists():  # before loading anything
        raise UsageError(f"argument --image: {args.image!r} does not exist")
    with _usage():
        if args.text is not None:
            check_utf8(args.text, "--text")
    if args.out is not None:
        check_out(args.out)
    progress(f"loading {args.model}")
    sub = load_subject(args.model)
    out = check_out(args.out if args.out is not None else str(Path("analysis") / sub.name))
    notes = Notes(say=_say)
    with _usage():
        inputs, record = model_inputs(sub, text=args.text, image=args.image,
                                      sample=args.sample, data=args.data, model=args.model,
                                      notes=notes, corpus=args.corpus, tokens=args.tokens)
    return finish("analyze", lambda: _analysis(args, sub, inputs, record, notes.lines, out,
                                               progress),
                  progress, args.json, summary)


def _diagnose(args: argparse.Namespace, sub: Subject, inputs: Any) -> Any:
    """``analysis.diagnostics.analyze`` of the subject; the arguments it refuses as usage
    errors naming MODEL or the input's flag."""
    from ..analysis.checks import ArgumentError
    from ..analysis.diagnostics import analyze

    try:
        return analyze(sub.model, inputs, lipschitz_iterations=args.lipschitz_iterations,
                       lipschitz_tol=args.lipschitz_tol, seed=0)
    except ArgumentError as e:
        if e.argument == "model":
            raise UsageError(f"argument MODEL: {sub.label}: "
                             f"{' '.join(e.detail.split())[:240]}") from None
        if e.argument != "inputs":
            raise
        flag = ("--text" if args.text is not None else "--image" if args.image is not None
                else "--sample" if args.sample is not None or args.data is not None
                else "--corpus")
        raise UsageError(f"argument {flag}: the model refuses this input: "
                         f"{' '.join(e.detail.split())[:240]}") from None


def _analysis(args: argparse.Namespace, sub: Subject, inputs: Any, record: dict[str, Any],
              notes: list[str], out: Path, progress: Progress) -> dict[str, Any]:
    """Diagnose, draw and write the report into ``out`` (staged: all or nothing); the data."""
    from ..analysis import report as page
    from ..analysis.figures import draw

    progress("analysing the evolution")
    diag = _diagnose(args, sub, inputs)
    progress("drawing figures")
    with staging(out) as stage:
        figs = draw(diag, stage.folder, image_grid=image_grid(sub))
        stale = _stale(out, figs)
        diag_data = diag.as_dict()
        data = {"source": sub.source, "input": record,
                **{**diag_data, "notes": [*notes, *diag_data["notes"]]},
                "figures": _figure_records(figs)}
        progress("writing the report")
        data["report"] = str(out / "index.html")
        page.write_report(stage.folder, f"splitformer analyze {args.model}",
                          _sections(data, figs), data)
        (stage.folder / "diagnostics.json").write_text(json.dumps(data, indent=1) + "\n")
        stage.commit([*(p.name for f in figs for p in (f.png, f.svg)), "diagnostics.json",
                      "index.html"])
    for name in stale:
        (out / name).unlink(missing_ok=True)
    return data
