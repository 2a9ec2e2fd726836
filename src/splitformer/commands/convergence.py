"""`splitformer convergence`: errors at t = T for tau = 2^-k, the observed order, a plot."""

from __future__ import annotations

import argparse
import json
import os

import torch

from ..analysis.convergence import CONFIGURATIONS, configuration, convergence, plot
from .progress import Progress

HELP = "measure the order of convergence in tau of a scheme (a table, --json, --plot)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheme", default="lie",
                   help="lie, prenorm, strang, parallel, unsplit, or a scheme string "
                        "(default: lie)")
    p.add_argument("--integrator", default="euler", choices=["euler", "rk2", "heun", "rk4"],
                   help="substep integrator (rk2 = heun; default: euler)")
    p.add_argument("--substep-form", default="raw", choices=["raw", "tangent"],
                   help="raw: field then projection (the network at tau = 1); tangent: "
                        "tangential field then projection (the projection method)")
    p.add_argument("--model", default="smooth",
                   help=f"a configuration ({', '.join(CONFIGURATIONS)}) or a path to a "
                        "torch.save'd nn.TransformerEncoder (unpickled: only files you trust; "
                        "default: smooth)")
    p.add_argument("--controls", default="constant", choices=["constant", "linear"],
                   help="controls in time: piecewise constant (the network) or linear")
    p.add_argument("--ks", default="1-6", help="k values, tau = 2^-k: 'a-b' or 'a,b,c'")
    p.add_argument("--ref-k", type=int, default=10, help="reference at tau = 2^-ref_k")
    p.add_argument("--reference", default="auto",
                   choices=["auto", "projected-ode", "same-scheme"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="write a log-log plot")


def _ks(text: str) -> tuple[int, ...]:
    try:
        if "-" in text:
            a, b = text.split("-")
            return tuple(range(int(a), int(b) + 1))
        return tuple(int(k) for k in text.split(","))
    except ValueError:
        raise SystemExit(f"--ks must look like '1-6' or '1,2,3', got {text!r}") from None


def _load_model(spec: str, seed: int):
    if spec in CONFIGURATIONS:
        return configuration(spec, seed=seed)
    if not os.path.isfile(spec):
        raise SystemExit(f"--model must be one of {sorted(CONFIGURATIONS)} or a file, got "
                         f"{spec!r}")
    from ..interop.torch_nn import from_torch

    module = torch.load(spec, weights_only=False, map_location="cpu")  # a local file the user names
    model = from_torch(module.double()).eval()
    g = torch.Generator().manual_seed(seed)
    u0 = torch.randn(2, 6, model.d_model, generator=g, dtype=torch.float64)
    return model, u0


def run(args: argparse.Namespace) -> int:
    integrator = "heun" if args.integrator == "rk2" else args.integrator
    ks = _ks(args.ks)
    progress = Progress(enabled=not args.json)
    progress(f"building model {args.model}")
    model, u0 = _load_model(args.model, args.seed)
    if args.controls == "linear":
        model = model.with_controls_in_time("linear")
    progress(f"reference at tau = 2^-{args.ref_k} and {len(ks)} runs")
    try:
        res = convergence(model, u0, scheme=args.scheme, integrator=integrator,
                          form=args.substep_form, ks=ks, ref_k=args.ref_k,
                          reference=args.reference, configuration_name=args.model)
    except ValueError as e:
        progress.close()
        raise SystemExit(f"splitformer convergence: {e}") from None
    progress.close()
    if args.plot:
        plot([res], args.plot, title=f"{args.scheme} on '{args.model}'")
    if args.json:
        out = res.as_dict()
        out["controls"] = args.controls
        if args.plot:
            out["plot"] = args.plot
        print(json.dumps(out, indent=2))
        return 0
    print(f"scheme     {res.scheme}: {res.scheme_text}")
    print(f"model      {args.model} ({CONFIGURATIONS.get(args.model, 'from file')}), "
          f"controls {args.controls}")
    print(f"reference  {res.reference}")
    print(f"{'tau':>10} {'error':>12} {'order':>7}")
    for i, (t, e) in enumerate(zip(res.taus, res.errors, strict=True)):
        o = f"{res.pairwise_orders[i - 1]:7.3f}" if i else "      -"
        print(f"{t:10.6f} {e:12.4e} {o}")
    print(f"observed order (least squares): {res.order:.3f}")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0
