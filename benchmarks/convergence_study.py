"""The convergence study of docs/convergence.md: every configuration x scheme, a markdown table
and log-log figures.

    python benchmarks/convergence_study.py [--ks 1-6] [--ref-k 10] [--figures docs/figures]

Configurations (splitformer.analysis.convergence.CONFIGURATIONS): smooth, relu, layernorm,
trained. Schemes: Lie (Euler, raw and tangent), Strang (RK2, raw and tangent; RK4 tangent),
parallel (Euler), pre-norm (Euler). The reference is the projected ODE (unsplit RK4, tangent
form, tau = 2^-ref_k) when every field projects onto the same set, else the same scheme at
tau = 2^-ref_k.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from splitformer.analysis.convergence import (
    CONFIGURATIONS,
    configuration,
    convergence,
    has_common_projection,
    plot,
    reference_solution,
)

SCHEMES = [
    ("lie", "euler", "raw"),
    ("lie", "euler", "tangent"),
    ("strang", "heun", "raw"),
    ("strang", "heun", "tangent"),
    ("strang", "rk4", "tangent"),
    ("parallel", "euler", "raw"),
    ("prenorm", "euler", "raw"),
]


def layernorm_limit(ks=(6, 8, 10)) -> None:
    """Real LayerNorm, post-LN Lie: distance between u_tau(T) and the state obtained by applying
    the projections alone (P2 o P1, N_t times): the fields' contribution vanishes as tau -> 0."""
    model, u0 = configuration("layernorm")
    evo = model.evolution
    print("\n| tau | max abs u_Lie(T) - u_projections-only(T) |\n|---|---|")
    with torch.no_grad():
        for k in ks:
            u = evo.refine(2**k)(u0)
            v = u0.clone()
            for i in range(int(evo.T) * 2**k):
                theta = evo.controls[i // 2**k]
                v = theta["norm2"](theta["norm1"](v))
            print(f"| 2^-{k} | {(u - v).abs().max().item():.2e} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ks", default="1-6")
    p.add_argument("--ref-k", type=int, default=10)
    p.add_argument("--configs", default=",".join(CONFIGURATIONS))
    p.add_argument("--figures", default=None, help="folder for PNG figures")
    p.add_argument("--json", default=None, help="write all results to this file")
    p.add_argument("--layernorm-limit", action="store_true",
                   help="only print the real-LayerNorm limit table (docs/convergence.md)")
    args = p.parse_args()
    if args.layernorm_limit:
        torch.set_num_threads(1)
        layernorm_limit()
        return
    a, b = args.ks.split("-")
    ks = tuple(range(int(a), int(b) + 1))
    torch.set_num_threads(1)
    results = []
    print("| configuration | scheme | integrator | form | observed order | errors (tau = "
          + ", ".join(f"2^-{k}" for k in ks) + ") | reference |")
    print("|---|---|---|---|---|---|---|")
    for cfg in args.configs.split(","):
        model, u0 = configuration(cfg)
        u_ref = None
        if has_common_projection(model.evolution):
            u_ref = reference_solution(model, u0, args.ref_k)
        per_cfg = []
        for scheme, integ, form in SCHEMES:
            t0 = time.time()
            try:
                evo = model.evolution.with_scheme(scheme, integrator=integ, form=form)
                shared = u_ref if has_common_projection(evo) else None
                r = convergence(model, u0, scheme=scheme, integrator=integ, form=form, ks=ks,
                                ref_k=args.ref_k, u_ref=shared, configuration_name=cfg)
                if shared is not None:
                    r.reference = f"projected ODE (unsplit RK4 tangent, tau = 2^-{args.ref_k})"
            except ValueError as e:
                print(f"| {cfg} | {scheme} | {integ} | {form} | n/a: {e} | | |")
                continue
            per_cfg.append(r)
            results.append(r.as_dict() | {"seconds": time.time() - t0})
            errs = ", ".join(f"{e:.1e}" for e in r.errors)
            print(f"| {cfg} | {scheme} | {integ} | {form} | {r.order:.2f} | {errs} | "
                  f"{r.reference} |", flush=True)
        if args.figures and per_cfg:
            os.makedirs(args.figures, exist_ok=True)
            plot(per_cfg, os.path.join(args.figures, f"convergence_{cfg}.png"),
                 title=f"configuration '{cfg}'")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
