"""`splitformer convergence`: errors at t = T for tau = 2^-k, the observed order, a plot.

Every input is checked before the reference run and the refined runs (the long part): the flags
by argparse (``type=`` functions below), then what needs two flags or the model (``_check``).
Both use the checks of ``splitformer.analysis.checks`` that the Python API
``analysis.convergence`` runs too, so the two refuse the same things; an ``ArgumentError`` of
the API becomes ``argument --flag: ...`` (``FLAGS``). The choices come from the registries:
``scheme_names()``, ``INTEGRATORS``, ``FORMS``, ``CONFIGURATIONS``, ``REFERENCES``.

Exit status (``EPILOG``): 0 done; 2 a usage error (one line on stderr, before the run); 1 the
run's numbers are not finite (``NonFiniteError``: a blow-up, or errors at round-off that leave
no order to fit) or the plot could not be written (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
import warnings
from collections import Counter
from collections.abc import Mapping

import torch
from torch import nn

from ..analysis.checks import (
    MAX_REF_K,
    SEED_RANGE_TEXT,
    ArgumentError,
    check_k,
    check_ks,
    check_ref_k,
    check_reference,
    check_seed,
    with_scheme_checked,
)
from ..analysis.convergence import (
    CONFIGURATIONS,
    REFERENCES,
    configuration,
    convergence,
    plot,
    smooth_configuration,
)
from ..time import NonFiniteError
from ..time.integrators import INTEGRATORS
from ..time.schemes import FORMS, resolve, scheme_names
from . import UsageError, stripped
from .progress import Progress

HELP = "measure the order of convergence in tau of a scheme (a table, --json, --plot)"
EPILOG = ("exit status: 0 done; 2 a usage error (one line on stderr, found before the run); 1 "
          "the run's numbers are not finite (a blow-up, or errors at round-off that leave no "
          "order to fit) or the plot could not be written (one line on stderr)")
# the Python API's argument names (analysis.checks.ArgumentError.argument) -> the flags
FLAGS = {"scheme": "--scheme", "integrator": "--integrator", "form": "--substep-form",
         "ks": "--ks", "ref_k": "--ref-k", "reference": "--reference", "seed": "--seed",
         "model": "--model", "u0": "--model"}

EXAMPLE = "attention norm1:project ffn norm2:project"  # the post-LN Lie scheme as a string
WIDTH = 100  # the text output fits this many columns
_MODEL_KINDS = ("a torch.save'd nn.TransformerEncoder, nn.TransformerEncoderLayer or "
                "splitformer Encoder")


# -- registries -----------------------------------------------------------------------------

def _canonical(integrator: str) -> str:
    """The first registry name of the same integrator (rk2 -> heun)."""
    fn = INTEGRATORS[integrator]
    return next(name for name, f in INTEGRATORS.items() if f is fn)


def _own_defaults(option: str) -> str:
    """'strang: heun, unsplit: rk4, others: euler', read off the named schemes themselves."""
    own = {}
    for name in scheme_names():
        try:
            value = resolve(name).meta.get(option)
        except ValueError:
            continue
        if value is not None:
            own[name] = value
    if not own:
        return "the scheme's own"
    common = Counter(own.values()).most_common(1)[0][0]
    parts = [f"{n}: {v}" for n, v in own.items() if v != common]
    return ", ".join([*parts, f"others: {common}"])


def _usage(e: ArgumentError) -> UsageError:
    """The API's ArgumentError as the command's usage error, naming the flag."""
    flag = FLAGS.get(e.argument)
    return UsageError(f"argument {flag}: {e.detail}" if flag else str(e))


# -- argument types (argparse reports their errors as 'argument --flag: ...') ---------------

def _shared(check, value):
    """A check of analysis.checks as an argparse type: its detail, without the API's name."""
    try:
        return check(value)
    except ArgumentError as e:
        raise argparse.ArgumentTypeError(e.detail) from None


def _int_or_text(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text  # the check says what was expected, got 'text'


def _ref_k_arg(text: str) -> int:
    return _shared(check_ref_k, _int_or_text(text))


def _seed_arg(text: str) -> int:
    return _shared(check_seed, _int_or_text(text))


def _model_arg(text: str) -> str:
    t = text.strip()
    return t if t in CONFIGURATIONS else text  # a path is taken as written


def _scheme_arg(text: str) -> str:
    t = text.strip()
    if t in scheme_names():
        return t
    if re.fullmatch(r"[\w.-]*", t):  # one word: meant as a name
        raise argparse.ArgumentTypeError(
            f"unknown scheme {text!r}: expected one of {', '.join(scheme_names())} or a scheme "
            f"string such as '{EXAMPLE}'")
    try:
        resolve(t)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"cannot read scheme string {text!r}: {e}") from None
    return t


def _ks_arg(text: str) -> tuple[int, ...]:
    t = text.strip()
    expected = (f"expected 'a-b' (e.g. 1-6) or 'a,b,c' (e.g. 2,3,5): integers k >= 0, "
                f"tau = 2^-k, got {text!r}")
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", t)
    if m:
        a, b = int(m[1]), int(m[2])
        if a >= b:
            raise argparse.ArgumentTypeError(f"range {text!r} must go up (a < b)")
        _shared(check_k, b)  # before the range is built: '1-1000000000' is refused, not listed
        ks = tuple(range(a, b + 1))
    else:
        parts = [p.strip() for p in t.split(",")]
        if not all(re.fullmatch(r"\d+", p) for p in parts):
            raise argparse.ArgumentTypeError(expected)
        ks = tuple(int(p) for p in parts)
    return _shared(check_ks, ks)  # two or more, increasing, each in [0, MAX_REF_K - 1]


def _plot_formats() -> list[str]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise argparse.ArgumentTypeError(
            "needs matplotlib, a dependency of splitformer that does not import here "
            "(pip install matplotlib)") from None
    return sorted(FigureCanvasAgg.get_supported_filetypes())


def _plot_arg(path: str) -> str:
    formats = _plot_formats()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        got = f"extension '.{ext}'" if ext else "no extension"
        raise argparse.ArgumentTypeError(
            f"{path!r} has {got}: expected a file name ending in one of "
            f"{', '.join('.' + f for f in formats)}")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} of {path!r} does not exist "
                                         "(create it first)")
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path!r} is a folder: expected a file name")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {folder!r} of {path!r} is not writable")
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    aliases = [f"{a} = {_canonical(a)}" for a in INTEGRATORS if _canonical(a) != a]
    p.add_argument("--scheme", default="lie", type=_scheme_arg, metavar="SCHEME",
                   help=f"a named scheme ({', '.join(scheme_names())}) or a scheme string in "
                        f"the short form of splitformer.time.schemes, e.g. '{EXAMPLE}', that "
                        "advances every field of the model (default: lie). 'paper', the "
                        "literal scheme, has no limit as tau -> 0 and is refused")
    p.add_argument("--integrator", default=None, choices=list(INTEGRATORS), type=stripped,
                   help=f"substep integrator of a named scheme ({'; '.join(aliases)}); "
                        f"default: the scheme's own ({_own_defaults('integrator')}), as "
                        "model.with_scheme(name) in Python. A scheme string sets it per stage")
    p.add_argument("--substep-form", default=None, choices=list(FORMS), type=stripped,
                   help="raw: field then projection (the network at tau = 1); tangent: "
                        "tangential field then projection (the projection method); default: "
                        f"the scheme's own ({_own_defaults('form')})")
    p.add_argument("--model", default="smooth", type=_model_arg,
                   help=f"a configuration ({', '.join(CONFIGURATIONS)}) or a path to "
                        f"{_MODEL_KINDS} (unpickled: only files you trust; default: smooth)")
    p.add_argument("--controls", default="constant", choices=["constant", "linear"],
                   type=stripped,
                   help="controls in time: piecewise constant (the network) or linear")
    p.add_argument("--ks", default="1-6", type=_ks_arg,
                   help=f"k values, tau = 2^-k: at least two, increasing, each from 0 to "
                        f"{MAX_REF_K - 1} and below --ref-k: 'a-b' or 'a,b,c' (default: 1-6)")
    p.add_argument("--ref-k", type=_ref_k_arg, default=10,
                   help=f"reference at tau = 2^-ref_k, an integer from 1 to {MAX_REF_K}: it "
                        f"runs T 2^ref_k steps, about a minute at {MAX_REF_K} on the "
                        "configurations, and each k more doubles that (default: 10)")
    p.add_argument("--reference", default="auto", choices=list(REFERENCES), type=stripped,
                   help="auto: the projected ODE when every field projects onto one set, else "
                        "the same scheme (default: auto). projected-ode is refused where it is "
                        "not the scheme's limit (pre-norm fields, distinct constraint sets)")
    p.add_argument("--seed", type=_seed_arg, default=0,
                   help=f"seed of the weights and u(0): an integer in {SEED_RANGE_TEXT}; "
                        "default: 0")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="OUT.png", default=None, type=_plot_arg,
                   help="write a log-log plot (the folder must exist; the extension picks the "
                        "format)")


# -- checks that need more than one flag, or the model --------------------------------------

def _options(args: argparse.Namespace) -> dict[str, str]:
    """integrator / form for a named scheme; none (the scheme's own) where not given."""
    named = args.scheme in scheme_names()
    out = {}
    if args.integrator is not None:
        if not named:
            raise UsageError(
                f"argument --integrator: applies to the named schemes ({', '.join(scheme_names())})"
                f"; in a scheme string give each field stage its integrator, e.g. "
                f"'attention:heun norm1:project'")
        out["integrator"] = _canonical(args.integrator)
    if args.substep_form is not None:
        if not named:
            raise UsageError(
                f"argument --substep-form: applies to the named schemes "
                f"({', '.join(scheme_names())}); in a scheme string write the tangent form per "
                f"stage, e.g. 'attention~norm1 norm1:project'")
        out["form"] = args.substep_form
    return out


def _check_scheme(model, args: argparse.Namespace, options: dict[str, str], what: str) -> None:
    """The scheme with its options builds on the model's layout and operators, advances every
    field of the model, and has the projected ODE as its limit if --reference says so; or
    UsageError naming the flag at fault."""
    evo = model.evolution

    def build(opts):
        with warnings.catch_warnings():  # the probes' warnings: the error below says it
            warnings.simplefilter("ignore")
            return evo.with_scheme(args.scheme, **opts)

    try:
        built = with_scheme_checked(evo, args.scheme, **options)
        check_reference(built, args.reference)
    except ArgumentError as e:
        raise _usage(e) from None
    except ValueError as e:
        flag = "--scheme"
        for key, name in (("form", "--substep-form"), ("integrator", "--integrator")):
            if key in options:
                try:
                    build({k: v for k, v in options.items() if k != key})
                    flag = name
                    break
                except ValueError:
                    pass
        raise UsageError(f"argument {flag}: {args.scheme!r} does not fit {what}: {e}") from None


def _load_file(path: str, seed: int):
    try:
        # a local file the user names (unpickling: documented in --help)
        obj = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as e:  # anything: not a torch.save file, a class that is gone, ...
        why = (str(e).splitlines() or [""])[0][:200]
        raise UsageError(f"argument --model: cannot read {path!r} as {_MODEL_KINDS} "
                         f"({type(e).__name__}: {why})") from None
    from ..interop.torch_nn import from_torch
    from ..models.encoder import Encoder

    if isinstance(obj, Encoder):
        model = obj.double().eval()
    elif isinstance(obj, (nn.TransformerEncoder, nn.TransformerEncoderLayer)):
        try:
            model = from_torch(obj.double()).eval()
        except ValueError as e:  # a layout from_torch documents it cannot map
            raise UsageError(f"argument --model: {path!r} does not map onto a splitformer "
                             f"encoder: {e}") from None
    elif isinstance(obj, Mapping):
        raise UsageError(f"argument --model: {path!r} holds a mapping ({type(obj).__name__}: "
                         f"a state dict?), not a module: expected {_MODEL_KINDS}; save the "
                         "module itself, torch.save(encoder, path)")
    else:
        kind = type(obj)
        raise UsageError(f"argument --model: {path!r} holds a {kind.__module__}."
                         f"{kind.__qualname__}: expected {_MODEL_KINDS}")
    g = torch.Generator().manual_seed(seed)
    u0 = torch.randn(2, 6, model.d_model, generator=g, dtype=torch.float64)
    return model, u0


def _check(args: argparse.Namespace) -> dict[str, str]:
    """Everything that does not need the model, then the scheme against the model (or, for a
    configuration, against the smooth one: every configuration has its layout and operators).
    Returns the options of a named scheme."""
    try:
        check_ks(args.ks, args.ref_k, ref_argument="--ref-k")
    except ArgumentError as e:
        raise _usage(e) from None
    if args.scheme == "paper":
        raise UsageError("argument --scheme: 'paper', the paper's literal scheme, projects the "
                         "state inside its FFN substeps and has no limit as tau -> 0 "
                         "(docs/math.md 3.4): nothing to measure; try 'lie'")
    options = _options(args)
    if args.model in CONFIGURATIONS:
        probe, _ = smooth_configuration(seed=args.seed)
        _check_scheme(probe, args, options, f"the configurations' layout ({EXAMPLE})")
    elif not os.path.isfile(args.model):
        raise UsageError(f"argument --model: expected one of {', '.join(CONFIGURATIONS)} or a "
                         f"file, got {args.model!r}")
    return options


def run(args: argparse.Namespace) -> int:
    options = _check(args)
    progress = Progress(enabled=not args.json)
    if args.model in CONFIGURATIONS:
        progress(f"building model {args.model}")
        try:
            model, u0 = configuration(args.model, seed=args.seed)
        except ImportError as e:  # 'trained' needs scikit-learn
            progress.close()
            raise UsageError(f"argument --model: {args.model!r}: {e}") from None
    else:  # quick: checked before anything is shown
        model, u0 = _load_file(args.model, args.seed)
        _check_scheme(model, args, options, f"the model in {args.model!r}")
    if args.controls == "linear":
        model = model.with_controls_in_time("linear")
    progress(f"reference at tau = 2^-{args.ref_k} and {len(args.ks)} runs")
    try:
        res = convergence(model, u0, scheme=args.scheme, ks=args.ks, ref_k=args.ref_k,
                          reference=args.reference, configuration_name=args.model, **options)
    except ArgumentError as e:  # found before the runs (e.g. distinct sets of trained-s)
        raise _usage(e) from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    except NonFiniteError as e:  # the run's numbers: not a usage error, exit status 1
        progress.close()
        print(f"splitformer convergence: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    finally:
        progress.close()
    plot_error = None
    if args.plot:
        try:
            plot([res], args.plot, title=f"{args.scheme} on '{args.model}'")
        except Exception as e:  # after the run: report, keep the results
            plot_error = f"argument --plot: could not write {args.plot!r}: {e}"
    _print_result(res, args, plot_error)
    if plot_error:
        print(f"splitformer convergence: error: {' '.join(plot_error.split())}", file=sys.stderr)
        return 1
    return 0


def _print_result(res, args: argparse.Namespace, plot_error: str | None) -> None:
    """The result: one JSON object (--json), or the table of tau, error and order."""
    if args.json:
        out = res.as_dict()
        out["controls"] = args.controls
        if args.plot and not plot_error:
            out["plot"] = args.plot
        print(json.dumps(out, indent=2))
    else:
        name = res.scheme if args.scheme in scheme_names() else "custom"
        desc = CONFIGURATIONS.get(args.model, "from file")
        for line in (f"scheme     {name}: {res.scheme_text}",
                     f"model      {args.model} ({desc}), controls {args.controls}",
                     f"reference  {res.reference}"):
            print(textwrap.fill(line, WIDTH, subsequent_indent=" " * 11,
                                break_on_hyphens=False))
        print(f"{'tau':>10} {'error':>12} {'order':>7}")
        for i, (t, e) in enumerate(zip(res.taus, res.errors, strict=True)):
            p = res.pairwise_orders[i - 1] if i else None  # None: an error at round-off
            o = "      -" if p is None else f"{p:7.3f}"
            print(f"{t:10.6f} {e:12.4e} {o}")
        print(f"observed order (least squares): {res.order:.3f}")
        if args.plot and not plot_error:
            print(f"plot written to {args.plot}")
