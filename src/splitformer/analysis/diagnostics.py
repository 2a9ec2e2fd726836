"""Diagnostics of the evolution u(x, y, t) along the discrete path of a model.

``analyze(model, inputs)`` runs the model once (eval mode, no gradient), finds every evolution
it calls (CvT's stages, the encoder and the decoder of the pair, or the one evolution of the
other families), reruns each from the same u(0) and context keeping every grid point and every
substep (``SaveAt(steps=True, substeps=True)``), and measures the quantities below. States are
(B, N_x, N_y) tensors (batch, tokens, features); ||.|| is the Frobenius norm over the tokens x
features of one input; "mean over batch" is the mean of a per-input value over the B inputs.

Per step n = 0 .. N_t - 1 (u^n = u(t_n), tau the step; a step's record holds t = t_n and
t_end = t_{n+1}):

    norm            mean_b ||u^{n+1}_b||
    velocity        mean_b ||u^{n+1}_b - u^n_b|| / tau
    lipschitz       an estimate of sigma_max(J_n), J_n = d u^{n+1} / d u^n of the step map
                    S_tau(theta(t_n + tau/2)) at the state of input ``kernel_input`` (the other
                    inputs held fixed; the step runs in eval mode), by the Lanczos iteration on
                    J^T J with torch.func.jvp and torch.func.vjp (``step_lipschitz``): v_1 a
                    seeded random unit vector, each iteration one product J^T J v_k (one jvp and
                    one vjp), the next vector that product orthogonalised against v_1 .. v_k;
                    the estimate after k iterations is sqrt(theta_k), theta_k the largest
                    eigenvalue of the k x k tridiagonal matrix of the iteration (the largest
                    Ritz value). It never exceeds sigma_max and increases with k. The
                    iteration stops when the estimate changes by less than ``lipschitz_tol``
                    (relative) from one iteration to the next, or at the cap
                    ``lipschitz_iterations`` (a note says so; the estimate is then a lower
                    estimate that may be well below sigma_max), or when the Krylov space is
                    invariant (exact). The softmax runs through the math backend of
                    scaled_dot_product_attention, whose forward-mode derivative exists.
    lipschitz_iterations, lipschitz_converged, lipschitz_change
                    the iterations used, whether the stopping rule was met before the cap, and
                    the relative change of the estimate at the last iteration
    cosine_similarity  mean_b of  1/(N (N-1)) sum_{x != x'} <u(x), u(x')> / (|u(x)| |u(x')|)
                    over the tokens of u^{n+1}_b (a zero token has cosine 0 with every token;
                    ``cosine_similarity``)
    effective_rank  mean_b of exp(H(p)), p_i = s_i / sum_j s_j, s the singular values of the
                    N_x x N_y matrix u^{n+1}_b, H(p) = -sum_i p_i log p_i (Roy & Vetterli 2007;
                    ``effective_rank``): 1 for a rank-one state, min(N_x, N_y) at most (the
                    singular values in the state's dtype, the entropy in float64)
    attention       one record per attention substep of the step (self-attention,
                    cross-attention, ...; an attention field, or the first stage of a branch of
                    a parallel substep): "substep" (its index), "operator" (its label),
                    "entropy": per head h the mean over the batch and the query tokens x of
                    -sum_x' g_h(x, x') log g_h(x, x') (0 log 0 = 0; ``attention_entropy``), g
                    the substep's kernel, and "entropy_uniform": the same for the kernel that
                    is uniform over g's support (log N_x' without a mask; for a causal kernel
                    the mean over x of log(x + 1))
                    and "first_token_mass" (with "first_token_mass_heads" per head and
                    "first_token_mass_uniform" for the uniform kernel on g's support): the mass
                    g puts on the first key token, mean over the batch, heads and queries
                    x >= 1 (``geometry.first_token_mass``; query 0 of a causal kernel sees only
                    key 0): the attention sink of trained decoders (docs/math.md 3.19)
    attention_operator, attention_entropy, attention_sink
                    the label, the entropies and the first-token mass of the step's first
                    attention substep (the first record of "attention")
    gated_field     for a step whose field substep holds a gated feature field G (SwiGLU,
                    GeGLU; ``GatedFeedForward``) behind a pre-norm with a radius
                    (``RMSNormProjection``): G's Lipschitz bound on the ball |v| <= R the
                    pre-norm projects into beside the measured local estimates (the largest
                    difference quotient over the tokens, the largest Jacobian norm at a few
                    tokens) and the reading "not a projection; Lipschitz on the sphere with
                    this bound" (docs/math.md 3.16; ``analysis.gated``); None otherwise

and per substep j of the step (the scheme's top-level stages; the state before substep 0 is
u^n, before substep j > 0 the state after substep j - 1):

    increment       mean_b ||after_b - before_b|| (a substep that changes the feature width,
                    the paper's literal FFN, is compared with zero padding of the narrower one)
    share           increment / sum of the step's increments
    constraint      kind "project" onto S1 (``SphereProjection`` with s1, s2, or a real
                    ``LayerNormProjection`` with gain gamma, bias beta and eps):
                      S1:  mean_residual = max |mean_y u - s1|, var_residual = max |var_y u - s2^2|
                      LN:  z = (u - beta) / gamma, mean_residual = max |mean_y z|,
                           var_residual = max |var_y z - var_y v / (var_y v + eps)|, v the state
                           before the substep (the ghost-point reading of docs/math.md 3.1: the
                           image of LN has var_y z = 1 - eps / (var_y v + eps), not 1), and
                           var_residual_eps0 = max |var_y z - 1| (against the eps = 0 set)
                    (max over the inputs and the tokens, var the population variance over y);
                    kind "project" onto S2 = {u >= 0} (``ProjectionS2``): residual = max(0,
                    -min u). A pre-norm field u + tau F(P u) has no projection substep: for a
                    field substep with an S1 projection P in ``pre`` the entry is the same
                    residuals of the state u entering the field (how far the state is from the
                    set; LN against the eps = 0 set, var_residual = max |var_y z - 1|), with
                    "set": "S1 (state, pre-norm)". Other substeps: None.
    relu_active     the fraction of active constraints, for activations that are constraints:
                    for a field substep whose field holds a ``FeedForward`` with activation relu
                    (the projection onto S2: active where the pre-activation p = W_j h + b_j is
                    < 0) or hardtanh (the projection onto [-1, 1]: active where |p| > 1), the
                    fraction of its hidden units (every hidden layer, token and input) where
                    the constraint is active; for a field with a ReLU projection in ``then``
                    (the paper's literal FFN substeps) the fraction of the substep's output
                    entries that are <= 0 (clipped). None for the other activations (GELU,
                    SiLU, leaky ReLU, tanh, identity: no constraint to be active; a note says
                    so) and for substeps without an FFN or ReLU projection.
    negative_preactivation
                    for a field substep whose field holds a ``FeedForward`` (any activation):
                    the fraction of its hidden units where the pre-activation is < 0, a sign
                    statistic (for relu it equals relu_active; for GELU or SiLU it is not an
                    active set). None for other substeps.

A parallel substep (``parallel(...)``) runs its branches on copies of the state entering it:
the attention and FFN of the first stage of each branch are measured from that state; a stage
later in a branch sees a state the trajectory does not keep, and is not measured (a note says
so).

Per evolution: kinetic_energy = ``control.KineticEnergy(1.0).value`` of the path (mean_b sum_n
tau ||(u^{n+1}_b - u^n_b) / tau||^2), lipschitz_product = prod_n lipschitz_n, and "initial":
norm, cosine similarity and effective rank of u(0). By the chain rule the Jacobian of u(0) ->
u(T) at this u(0) is the product J_{N-1} ... J_0, so the product of the exact sigma_max(J_n)
bounds its norm ||D(u(0) -> u(T))|| at this u(0) (of input ``kernel_input``): a local bound
along this one path, not a Lipschitz constant of the evolution over all inputs. The factors
here are iterative estimates that never exceed the sigma_max they estimate, so the product is
an estimate of that bound, not a guaranteed bound (None if a step has no estimate).

The attention kernel g_h(x, x') of an attention substep (``Diagnostics.attention_kernels``, per
head for input ``kernel_input``; ``Diagnostics.kernels`` keeps the step's first one) is
computed from the state entering the substep (with its ``pre`` projection applied, as the field
sees it; for a Heun or RK4 substep, the first evaluation), by the operator's own Q and K maps,
support (mask, causal) and kernel: g = kernel(Q, K, I), the kernel applied to the identity as
values. Every kernel of ``operators.kernels`` returns int g(x, x') V(x') dx', linear in V, so
V = I gives g itself: the softmax with its mask or causal support, Sinkhorn's plan, the linear
kernel's normalised feature-map weights (an N_x x N_x' matrix that its O(N) path never forms).
Its support is where the kernel at zero queries and keys, kernel(0, 0, I), is positive.
Kernels, Lipschitz estimates, FFN and pre-norm readings are None for a scheme with its own
doubled state (``reversible``), whose fields act on one component of it (a note says so).

The quantities live in small modules, each a function of tensors or of one substep, so that
other analyses along a trajectory reuse them: ``analysis.geometry`` (cosine similarity,
effective rank, attention entropy: the token geometry of a state), ``analysis.lipschitz``
(``step_lipschitz``), ``analysis.readings`` (attention kernels, constraint residuals, FFN
active sets, the activation's reading) and ``analysis.capture`` (running the model once to find
its evolutions). This module walks each evolution's path and gathers them.

Every number of ``as_dict()`` is a finite float, an int, a bool, a str or None; a None that
stands for a missing measurement carries its reason in ``notes`` (a quantity that does not
apply to a substep, such as the constraint of a field substep, is None by definition). Bad
arguments raise ``ArgumentError`` naming them, non-finite values (NaN, infinities) included:
in a parameter of the model ("model"), in an input tensor or in the u(0) made of it
("inputs").
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..control import KineticEnergy
from ..models.base import EvolutionModel
from ..operators.base import Context
from ..time import Evolution, SaveAt, Trajectory
from ..time.saveat import Substep
from .capture import Call, capture, check_finite, check_inputs, family_of, nonfinite
from .capture import capture as _capture  # noqa: F401 (moved to analysis.capture)
from .checks import ArgumentError, check_seed, refuse_merging
from .gated import decoder_lines, gated_fields, gated_record
from .geometry import (
    attention_entropy,
    cosine_similarity,
    difference,
    effective_rank,
    first_token_mass,
    frob,
)
from .lipschitz import (
    LIPSCHITZ_ITERATIONS,
    LIPSCHITZ_TOL,
    LipschitzEstimate,
    check_int,
    check_real,
    step_lipschitz,
)
from .readings import (
    activation_of,
    attentions,
    clipped,
    compose,
    constraint_residual,
    entered,
    ffn_readings,
    ffn_readings_possible,
    has_own_state,
    is_s1,
    kernel_and_support,
    kernel_matrix,
)

__all__ = [
    "DEFINITIONS",
    "LIPSCHITZ_ITERATIONS",
    "LIPSCHITZ_TOL",
    "Diagnostics",
    "LipschitzEstimate",
    "analyze",
    "attention_entropy",
    "constraint_residual",
    "cosine_similarity",
    "effective_rank",
    "kernel_matrix",
    "step_lipschitz",
    "summary_text",
]

DEFINITIONS = {
    "norm": "mean over the batch of ||u^{n+1}||_F (tokens x features)",
    "velocity": "mean over the batch of ||u^{n+1} - u^n||_F / tau",
    "lipschitz": "estimate of the largest singular value of the Jacobian J of the step map "
                 "u^n -> u^{n+1} at the state of input kernel_input (eval mode): the largest "
                 "Ritz value of the Lanczos iteration on J^T J (one torch.func.jvp and one vjp "
                 "per iteration), square-rooted; it never exceeds sigma_max(J) and increases "
                 "with the iterations, which stop when it changes by less than lipschitz_tol "
                 "(relative) or at the cap lipschitz_iterations",
    "lipschitz_iterations": "Lanczos iterations (jvp + vjp pairs) the step's estimate used",
    "lipschitz_converged": "whether the estimate's relative change fell below lipschitz_tol "
                           "before the cap (or the Krylov space became invariant: exact); "
                           "false: a lower estimate, possibly well below sigma_max",
    "lipschitz_change": "relative change of the estimate at its last iteration",
    "cosine_similarity": "mean over the batch of the mean cosine of the angle between two "
                         "distinct tokens of u^{n+1}",
    "effective_rank": "mean over the batch of exp(-sum_i p_i log p_i), p_i = s_i / sum_j s_j, "
                      "s the singular values of the tokens x features matrix of u^{n+1} "
                      "(Roy & Vetterli 2007)",
    "attention": "one record per attention substep of the step (self- and cross-attention "
                 "alike): its substep index, its operator label, its per-head entropy and the "
                 "entropy of the kernel uniform over its support",
    "entropy": "per head: mean over the batch and the query tokens x of -sum_x' g(x, x') "
               "log g(x, x') of the substep's attention kernel g",
    "entropy_uniform": "mean over the batch, heads and query tokens x of log |supp g(x, .)|: "
                       "the entropy of the kernel uniform over the support of g (log N_x' "
                       "without a mask; for a causal kernel the mean of log(x + 1))",
    "attention_operator": "the label of the step's first attention substep",
    "attention_entropy": "per head: the entropy of the step's first attention substep (the "
                         "first record of attention)",
    "attention_sink": "first_token_mass of the step's first attention substep",
    "first_token_mass": "the mass the kernel puts on the first key token, mean over the batch, "
                        "the heads and the query tokens x >= 1 (query 0 of a causal kernel sees "
                        "only key 0); a point mass there is the attention sink of trained "
                        "decoders (docs/math.md 3.19)",
    "first_token_mass_heads": "first_token_mass per head (mean over the batch and queries "
                              "x >= 1)",
    "first_token_mass_uniform": "first_token_mass of the kernel uniform over g's support (a "
                                "causal kernel: the mean over x >= 1 of 1 / (x + 1))",
    "gated_field": "the step's gated feature field G (SwiGLU, GeGLU) read on the ball its "
                   "pre-norm P projects into (analysis.gated): radius R = sqrt(N) max |gain| "
                   "bounds |P v|; bound = G.lipschitz_bound(R), an upper bound of Lip(G) on "
                   "that ball; quotient = the largest |G(v_x) - G(v_x')| / |v_x - v_x'| over "
                   "pairs of the tokens' v = P u (quotient_pairs pairs of quotient_tokens "
                   "tokens, every input); jacobian = the largest spectral norm of DG(v_x) over "
                   "the tokens jacobian_tokens of input kernel_input; measured = max(quotient, "
                   "jacobian), a lower estimate of Lip(G) on the ball; ratio = measured / "
                   "bound; state_norm_max = max |v_x|; float64; None for a step without one",
    "increment": "mean over the batch of ||after - before||_F of the substep",
    "share": "increment / sum of the step's increments",
    "constraint": "residuals of the state after a projection substep (or of the state entering "
                  "a pre-norm field) against the constraint set S1 (mean, variance over the "
                  "features; max over inputs and tokens) or S2 (max negative part)",
    "relu_active": "fraction of active constraints of an FFN whose activation is a projection: "
                   "ReLU (pre-activation < 0) or hardtanh (|pre-activation| > 1); or the "
                   "fraction of entries clipped by a ReLU projection after a field; None for "
                   "other activations (GELU, SiLU, leaky ReLU, tanh: no active constraint)",
    "negative_preactivation": "fraction of the FFN's hidden units whose pre-activation is < 0, "
                              "for any activation: a sign statistic, which is an active set "
                              "only for ReLU",
    "kinetic_energy": "mean over the batch of sum_n tau ||(u^{n+1} - u^n) / tau||_F^2 "
                      "(control.KineticEnergy with weight 1)",
    "lipschitz_product": "product over the steps of the per-step Lipschitz estimates: an "
                         "estimate of the bound prod_n sigma_max(J_n) on ||D(u(0) -> u(T))|| "
                         "at this u(0) (chain rule; a local bound along this path, not a "
                         "Lipschitz constant over all inputs); each factor estimates its "
                         "sigma_max from below, so the product is an estimate, not a bound",
}


@dataclass
class Diagnostics:
    """What ``analyze`` measured. ``evolutions`` holds the JSON-friendly records (``as_dict``);
    ``states[e]`` the Trajectory of evolution e (every grid point and substep),
    ``attention_kernels[e][n]`` the kernel (heads, N_x, N_x') of input ``kernel_input`` of each
    attention substep of step n, keyed by its label (the "operator" of its attention record),
    ``kernels[e][n]`` the step's first one or None, ``grids[e]`` the token grid (rows, cols) a
    family reports (CvT) or None, ``names[e]`` its label."""

    model: dict[str, Any]
    batch: int
    activation: dict[str, str]
    evolutions: list[dict[str, Any]]
    states: list[Trajectory]
    kernels: list[list[torch.Tensor | None]]
    names: list[str]
    grids: list[tuple[int, int] | None]
    kernel_input: int
    notes: list[str] = field(default_factory=list)
    attention_kernels: list[list[dict[str, torch.Tensor]]] = field(default_factory=list)
    lipschitz_settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Every number, JSON-friendly (floats, ints, bools, strings, lists, dicts, None; no
        NaN)."""
        return {"model": self.model, "batch": self.batch, "activation": self.activation,
                "kernel_input": self.kernel_input,
                "lipschitz_settings": dict(self.lipschitz_settings),
                "evolutions": self.evolutions, "definitions": dict(DEFINITIONS),
                "notes": list(self.notes)}

    def summary(self) -> str:
        """A few lines of text (``summary_text`` of ``as_dict()``): per evolution its scheme,
        N_t, tau, the final norm, the kinetic energy, the product of the Lipschitz estimates,
        cosine similarity and effective rank from u(0) to u(T); and the reading of the
        activation."""
        return summary_text(self.as_dict())


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, in the plural (``many``, default word + "s") unless n is 1: "1 input",
    "2 inputs"."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _count(n, word: str) -> str:
    """``plural`` of a number of the data, shown as ``_fmt`` shows it."""
    return f"{_fmt(n)} {word}" if n == 1 else f"{_fmt(n)} {word}s"


def _fmt(x) -> str:
    """A number as the report shows it: an int as is, a float to 4 significant digits."""
    if x is None:
        return "n/a"
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return str(int(x))
    return f"{x:.4g}"


def summary_text(data: Mapping[str, Any]) -> str:
    """The summary of ``Diagnostics.as_dict()`` (or of the JSON that ``splitformer analyze``
    writes): every number in it is a number of ``data``, as ``_fmt`` shows it."""
    m = data["model"]
    lines = [f"{m['class']} ({m['family'] or 'family unknown'}), batch {_fmt(data['batch'])}"]
    for info, ev in zip(m["evolutions"], data["evolutions"], strict=True):
        steps = ev["steps"]
        last = steps[-1] if steps else {}
        lines.append(f"{info['name']}: scheme {info['scheme']} [{info['scheme_text']}], "
                     f"N_t = {_fmt(info['num_steps'])}, tau = {_fmt(info['tau'])}, "
                     f"T = {_fmt(info['T'])}, {_count(info['tokens'], 'token')} x "
                     f"{_count(info['width'], 'feature')}")
        lips = [s["lipschitz"] for s in steps if s.get("lipschitz") is not None]
        lip_range = f" (per step {_fmt(min(lips))} .. {_fmt(max(lips))})" if lips else ""
        unconverged = [s for s in steps if s.get("lipschitz") is not None
                       and s.get("lipschitz_converged") is False]
        if unconverged:
            lip_range += (f", not converged at step{'s' if len(unconverged) > 1 else ''} "
                          + ", ".join(_fmt(s["step"]) for s in unconverged))
        lines.append(f"  final norm {_fmt(last.get('norm'))}, kinetic energy "
                     f"{_fmt(ev['kinetic_energy'])}, product of the Lipschitz estimates "
                     f"{_fmt(ev['lipschitz_product'])}{lip_range}")
        first = ev["initial"]
        lines.append(f"  cosine similarity {_fmt(first['cosine_similarity'])} -> "
                     f"{_fmt(last.get('cosine_similarity'))}, effective rank "
                     f"{_fmt(first['effective_rank'])} -> {_fmt(last.get('effective_rank'))}")
        lines += decoder_lines(steps, _fmt)
    a = data["activation"]
    lines.append(f"activation {a['name']}: {a['reading']} ({a['why']})")
    return "\n".join(lines)


class _Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        if line not in self.lines:
            self.lines.append(line)

    def num(self, x, where: str, what: str, why: str = "") -> float | None:
        """A finite float, or None with a note."""
        if x is None:
            if why:
                self.add(f"{where}: {what} is None: {why}")
            return None
        v = float(x)
        if math.isfinite(v):
            return v
        self.add(f"{where}: {what} is None: {why or 'the value is not finite'} ({v})")
        return None


def _attention_record(j: int, label: str, op, state: torch.Tensor, context, index: int,
                      where: str, notes: _Notes) -> tuple[dict[str, Any], torch.Tensor | None]:
    rec: dict[str, Any] = {"substep": j, "operator": label, "entropy": None,
                           "entropy_uniform": None, "first_token_mass": None,
                           "first_token_mass_heads": None, "first_token_mass_uniform": None}
    try:
        g, support = kernel_and_support(op, state, context)
    except Exception as e:  # noqa: BLE001 - a kernel without a matrix form
        notes.add(f"{where}: the kernel and entropies of '{label}' are None: its kernel gave "
                  f"no matrix ({type(e).__name__}: {e})")
        return rec, None
    ent = attention_entropy(g).mean(dim=(0, 2))
    rec["entropy"] = [notes.num(e, where, f"entropy[{h}] of '{label}'")
                      for h, e in enumerate(ent.tolist())]
    count = support.sum(-1).double()
    uniform = torch.log(torch.where(count > 0, count, torch.ones_like(count))).mean()
    rec["entropy_uniform"] = notes.num(uniform, where, f"entropy_uniform of '{label}'")
    _sink(rec, g, support, label, where, notes)
    return rec, g[index].detach()


def _sink(rec: dict[str, Any], g: torch.Tensor, support: torch.Tensor, label: str, where: str,
          notes: _Notes) -> None:
    """The attention sink of a kernel g (B, H, N_x, N_x'): the mass on the first key token per
    head and on average (over the batch and the queries x >= 1), and that of the kernel uniform
    over g's support."""
    why = "a single query token (query 0 is left out: a causal kernel gives it mass 1)"
    heads = first_token_mass(g).mean(0)
    rec["first_token_mass_heads"] = [notes.num(m, where, f"first_token_mass[{h}] of '{label}'",
                                               why) for h, m in enumerate(heads.tolist())]
    rec["first_token_mass"] = notes.num(heads.mean(), where, f"first_token_mass of '{label}'",
                                        why)
    count = support.sum(-1, keepdim=True).double()  # the uniform kernel: 1 / |supp g(x, .)|
    uniform = support.double() / torch.where(count > 0, count, torch.ones_like(count))
    rec["first_token_mass_uniform"] = notes.num(first_token_mass(uniform).mean(), where,
                                                f"first_token_mass_uniform of '{label}'", why)


@dataclass
class _Walk:
    """One evolution's path being measured: what the measures of its steps share."""

    evolution: Evolution
    context: Any
    name: str
    index: int  # kernel_input
    iterations: int
    tol: float
    seed: int
    notes: _Notes
    own_state: bool = False  # the scheme steps its own doubled state (reversible)
    free: set[str] = field(default_factory=set)  # activations that are not a projection


def _analyze_evolution(call: Call, kernel_input: int, iterations: int, tol: float, seed: int,
                       notes: _Notes) -> tuple[dict, Trajectory, list, list, tuple | None]:
    """(the evolution's record, its trajectory, each step's first kernel, each step's kernels
    by label, its token grid) of one captured call."""
    evo, name = call.evolution, call.name
    walk = _Walk(evo, call.context, name, kernel_input, iterations, tol, seed, notes,
                 own_state=has_own_state(evo.scheme))
    traj = evo(call.u0, call.context, SaveAt(steps=True, substeps=True))
    by_step: dict[int, list[Substep]] = {}
    for sub in traj.substeps:
        by_step.setdefault(sub.step, []).append(sub)
    if walk.own_state:
        notes.add(f"{name}: the Lipschitz estimates, attention kernels and entropies, and the "
                  "constraint, relu_active and negative_preactivation of the field substeps "
                  f"are None: the scheme {evo.scheme.name!r} steps its own doubled state (u, v) "
                  "and its fields act on one component of it")
    steps_out, kernels, all_kernels = [], [], []
    for n in range(evo.num_steps):
        record, kernel, step_kernels = _step_record(walk, n, traj.state_list,
                                                    by_step.get(n, []))
        steps_out.append(record)
        kernels.append(kernel)
        all_kernels.append(step_kernels)
    for act in sorted(walk.free):
        notes.add(f"{name}: relu_active is None on the FFN substeps: activation {act} is not a "
                  "projection, so no constraint is active; negative_preactivation gives the "
                  "fraction of pre-activations < 0 (a sign statistic)")
    return (_evolution_record(walk, traj, steps_out), traj, kernels, all_kernels,
            _token_grid(call.context))


def _step_record(walk: _Walk, n: int, states: list[torch.Tensor], substeps: list[Substep]
                 ) -> tuple[dict[str, Any], torch.Tensor | None, dict[str, torch.Tensor]]:
    """(the record of step n, its first attention kernel, its kernels by label)."""
    evo, notes = walk.evolution, walk.notes
    where = f"{walk.name} step {n}"
    u_n, u_next = states[n], states[n + 1]
    theta = evo.theta(n)
    diff = frob(u_next - u_n)
    lip, est = _lipschitz(walk, n, u_n, where)
    subs_out: list[dict[str, Any]] = []
    attention: list[dict[str, Any]] = []
    step_kernels: dict[str, torch.Tensor] = {}
    gated: list[dict[str, Any]] = []
    before = u_n
    for sub in substeps:
        subs_out.append(_substep_record(walk, sub, theta, before, where, attention,
                                        step_kernels))
        gated += _gated_records(walk, sub, theta, before, where)
        before = sub.state
    _shares(subs_out, notes, where)
    if not attention:
        why_att = ("the reversible scheme's fields act on one component of the doubled "
                   "state" if walk.own_state else "the step has no attention substep")
        notes.add(f"{where}: attention_operator and attention_entropy are None: {why_att}")
    first = attention[0] if attention else None
    record = {
        "step": n, "t": float(evo.grid.time(n)), "t_end": float(evo.grid.time(n + 1)),
        "norm": notes.num(frob(u_next).mean(), where, "norm"),
        "velocity": notes.num(diff.mean() / evo.tau, where, "velocity"),
        **_lipschitz_fields(lip, est, notes, where),
        "cosine_similarity": notes.num(cosine_similarity(u_next).mean(), where,
                                       "cosine_similarity", "a single token has no pairs"),
        "effective_rank": notes.num(effective_rank(u_next).mean(), where, "effective_rank",
                                    "the state is zero"),
        "attention_operator": first["operator"] if first is not None else None,
        "attention_entropy": first["entropy"] if first is not None else None,
        "attention_sink": first["first_token_mass"] if first is not None else None,
        "gated_field": gated[0] if gated else None,
        "attention": attention,
        "substeps": subs_out,
    }
    kernel = step_kernels.get(first["operator"]) if first is not None else None
    return record, kernel, step_kernels


def _gated_records(walk: _Walk, sub: Substep, theta, before: torch.Tensor, where: str
                   ) -> list[dict[str, Any]]:
    """The records (``analysis.gated``) of the gated feature fields that see the state entering
    substep ``sub`` (none for a scheme with its own doubled state)."""
    if walk.own_state:
        return []
    seen, _ = entered(walk.evolution.scheme.stages[sub.stage])
    return [gated_record(st, name, op, theta, before, walk.context, walk.index, walk.notes,
                         f"{where} substep {sub.stage}")
            for st, name, op in gated_fields(seen, theta)]


def _lipschitz(walk: _Walk, n: int, u_n: torch.Tensor, where: str
               ) -> tuple[float | None, LipschitzEstimate | None]:
    """(the finite Lipschitz estimate of step n or None, the estimate); a note says why it is
    None, or that it did not converge."""
    est, why = None, ""
    if walk.own_state:
        why = "the reversible scheme's step acts on the doubled state (u, v)"
    else:
        try:
            est = step_lipschitz(walk.evolution, n, u_n, walk.context, index=walk.index,
                                 iterations=walk.iterations, tol=walk.tol, seed=walk.seed)
        except (RuntimeError, NotImplementedError) as e:
            why = f"jvp/vjp failed: {str(e).splitlines()[0]}"
    lip = None
    if est is not None and math.isfinite(est.value):
        lip = float(est.value)
    elif est is not None:
        why = f"the estimate is not finite ({est.value})"
    if lip is None:
        walk.notes.add(f"{where}: lipschitz, lipschitz_iterations, lipschitz_converged and "
                       f"lipschitz_change are None: {why}")
    elif not est.converged:
        last = (f"the relative change of the last iteration is {est.change:.2g}"
                if est.change is not None else "a single iteration measures no change")
        walk.notes.add(f"{where}: the Lipschitz estimate did not converge: it stopped at the "
                       f"cap of {plural(est.iterations, 'iteration')} (lipschitz_iterations) "
                       f"and {last}, not below lipschitz_tol = {walk.tol:g}; it is a lower "
                       "estimate of sigma_max")
    return lip, est


def _lipschitz_fields(lip: float | None, est: LipschitzEstimate | None, notes: _Notes,
                      where: str) -> dict[str, Any]:
    known = lip is not None
    return {
        "lipschitz": lip,
        "lipschitz_iterations": est.iterations if known else None,
        "lipschitz_converged": bool(est.converged) if known else None,
        "lipschitz_change": (notes.num(est.change, where, "lipschitz_change",
                                       "a single iteration measures no change")
                             if known else None),
    }


def _substep_record(walk: _Walk, sub: Substep, theta, before: torch.Tensor, where: str,
                    attention: list[dict[str, Any]], step_kernels: dict[str, torch.Tensor]
                    ) -> dict[str, Any]:
    """The record of one substep (its attention records go to ``attention``, their kernels
    to ``step_kernels``)."""
    notes = walk.notes
    st = walk.evolution.scheme.stages[sub.stage]
    after = sub.state
    inc = float(frob(difference(after, before)).mean())
    sub_where = f"{where} substep {sub.stage} '{sub.label}'"
    constraint = _constraint(walk, st, theta, before, after)
    relu, negative = None, None
    seen, unseen = entered(st)
    if seen and not walk.own_state:
        relu, negative = _ffn_fields(walk, st, seen, unseen, theta, before, after, sub_where)
        for rec, label, g in _attention_records(walk, sub, seen, theta, before, where,
                                                attention):
            attention.append(rec)
            if g is not None:
                step_kernels[label] = g
    relu = notes.num(relu, sub_where, "relu_active")
    negative = notes.num(negative, sub_where, "negative_preactivation")
    return {"label": sub.label, "stage": sub.stage, "kind": st.kind,
            "increment": notes.num(inc, where, f"increment of '{sub.label}'"),
            "share": None, "constraint": constraint, "relu_active": relu,
            "negative_preactivation": negative}


def _constraint(walk: _Walk, st, theta, before: torch.Tensor, after: torch.Tensor
                ) -> dict[str, Any] | None:
    """The constraint residuals of a projection substep, or of the state entering a pre-norm
    field (its S1 projection in ``pre``); None for the other substeps."""
    if st.kind == "project":
        return constraint_residual(theta[st.operator], after, before)
    if st.kind == "field" and not walk.own_state:
        pre_s1 = [p for p in st.pre if is_s1(theta[p])]
        if pre_s1:
            return constraint_residual(theta[pre_s1[0]], before, state=True)
    return None


def _ffn_fields(walk: _Walk, st, seen: list, unseen: list, theta, before: torch.Tensor,
                after: torch.Tensor, sub_where: str) -> tuple[float | None, float | None]:
    """(relu_active, negative_preactivation) of a substep's FFNs (or of the ReLU projection
    after its field), with the notes on what is not measured."""
    notes = walk.notes
    has_ffn, relu, negative, no_set = ffn_readings(seen, theta, before, walk.context)
    walk.free |= no_set
    if has_ffn and negative is None:
        notes.add(f"{sub_where}: relu_active and negative_preactivation are None: "
                  "the FFN has no hidden layer")
    if not has_ffn and clipped(seen, theta):
        if st.kind == "field":
            relu = float((after <= 0).double().mean())
        else:
            notes.add(f"{sub_where}: relu_active is None: the ReLU projection "
                      "after a field inside a parallel branch acts on a state the "
                      "trajectory does not keep")
    unmeasured = [str(s) for s in unseen
                  if attentions([s], theta) or ffn_readings_possible(s, theta)]
    if unmeasured:
        notes.add(f"{sub_where}: the attention kernels and FFN readings of "
                  f"{', '.join(repr(u) for u in unmeasured)} are not measured: "
                  "later stages of a parallel branch see states the trajectory "
                  "does not keep")
    return relu, negative


def _attention_records(walk: _Walk, sub: Substep, seen: list, theta, before: torch.Tensor,
                       where: str, attention: list[dict[str, Any]]):
    """(record, label, kernel or None) of each attention field among ``seen``; a label
    already used in the step (``attention``) gets ``#substep``."""
    labels = [a["operator"] for a in attention]
    for ast, op_name, op in attentions(seen, theta):
        label = str(ast) if len(ast.fields()) == 1 else f"{ast}:{op_name}"
        if label in labels:
            label = f"{label}#{sub.stage}"
        rec, g = _attention_record(sub.stage, label, op,
                                   compose(ast.pre, before, theta, walk.context),
                                   walk.context, walk.index, where, walk.notes)
        labels.append(label)
        yield rec, label, g


def _shares(subs_out: list[dict[str, Any]], notes: _Notes, where: str) -> None:
    """Each substep's share of the step's increments (None when they sum to 0: a note)."""
    total = sum(s["increment"] or 0.0 for s in subs_out)
    for s in subs_out:
        if total > 0 and s["increment"] is not None:
            s["share"] = s["increment"] / total
    if subs_out and not total > 0:
        notes.add(f"{where}: shares are None: the step's increments sum to 0")


def _evolution_record(walk: _Walk, traj: Trajectory, steps_out: list[dict[str, Any]]
                      ) -> dict[str, Any]:
    evo, name, notes = walk.evolution, walk.name, walk.notes
    lips = [s["lipschitz"] for s in steps_out]
    product = math.prod(lips) if lips and all(x is not None for x in lips) else None
    u0 = traj.state_list[0]
    kinetic = KineticEnergy(1.0).value(evo, traj) if len(traj) > 1 else None
    return {
        "name": name,
        "times": [float(t) for t in evo.grid.times(dtype=torch.float64).tolist()],
        "initial": {
            "t": 0.0,
            "norm": notes.num(frob(u0).mean(), f"{name} u(0)", "norm"),
            "cosine_similarity": notes.num(cosine_similarity(u0).mean(), f"{name} u(0)",
                                           "cosine_similarity", "a single token has no pairs"),
            "effective_rank": notes.num(effective_rank(u0).mean(), f"{name} u(0)",
                                        "effective_rank", "the state is zero"),
        },
        "steps": steps_out,
        "kinetic_energy": notes.num(kinetic, name, "kinetic_energy", "no steps"),
        "lipschitz_product": notes.num(product, name, "lipschitz_product",
                                       "a step has no Lipschitz estimate" if lips else
                                       "no steps"),
    }


def _token_grid(ctx) -> tuple[int, int] | None:
    """The token grid (rows, columns) a family reports in its context (CvT), or None."""
    if isinstance(ctx, Context):
        gs = ctx.grid_shape
        if isinstance(gs, (tuple, list)) and len(gs) == 2:
            return int(gs[0]), int(gs[1])
    return None


def analyze(model: EvolutionModel, inputs: tuple | list | Mapping[str, Any], *,
            lipschitz_iterations: int = LIPSCHITZ_ITERATIONS,
            lipschitz_tol: float = LIPSCHITZ_TOL, kernel_input: int = 0, seed: int = 0
            ) -> Diagnostics:
    """The diagnostics of ``model`` on ``inputs`` along the path of every evolution it runs
    (module docstring). ``inputs``: a tuple of positional inputs or a dict of keyword inputs,
    as ``model(...)`` takes them. Each step's Lipschitz estimate iterates until its relative
    change is below ``lipschitz_tol`` (a number in [0, 1)), at most ``lipschitz_iterations``
    (>= 1) times, from a random vector seeded by ``seed``, at input ``kernel_input`` (also the
    input whose kernels are kept). The model runs in eval mode (each module's own mode is
    restored after) and without gradients; ArgumentError names a bad argument, and inputs
    that the model's own input checks refuse are ArgumentError("inputs"). Non-finite values
    (NaN, infinities) are refused before the run: in a parameter of the model
    (ArgumentError("model")), in a floating input tensor or in the u(0) the model makes of the
    inputs (ArgumentError("inputs"))."""
    if not isinstance(model, EvolutionModel):
        raise ArgumentError("model", f"expected a splitformer EvolutionModel (from_torch, "
                                     f"from_hf, build_vit, ...), got {type(model).__name__}")
    refuse_merging([o.evolution for o in model.evolution_owners()], "analyze")
    args, kwargs = check_inputs(inputs)
    iterations = check_int(lipschitz_iterations, "lipschitz_iterations", 1)
    tol = check_real(lipschitz_tol, "lipschitz_tol", 0.0, 1.0)
    index = check_int(kernel_input, "kernel_input", 0)
    seed = check_seed(seed)
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        calls = _calls(model, args, kwargs, index, kernel_input)
        batch = int(calls[0].u0.shape[0])
        notes = _Notes()
        records, trajs, kernels, every, grids = [], [], [], [], []
        for call in calls:
            with torch.no_grad():
                rec, traj, ks, all_ks, grid = _analyze_evolution(call, index, iterations, tol,
                                                                 seed, notes)
            records.append(rec)
            trajs.append(traj)
            kernels.append(ks)
            every.append(all_ks)
            grids.append(grid)
        infos = [_evolution_info(call) for call in calls]
    finally:
        for m, mode in modes.items():
            m.training = mode
    return Diagnostics(
        model={"class": type(model).__name__, "family": family_of(model), "evolutions": infos},
        batch=batch,
        activation=activation_of([c.evolution for c in calls]),
        evolutions=records, states=trajs, kernels=kernels,
        names=[c.name for c in calls], grids=grids, kernel_input=index, notes=notes.lines,
        attention_kernels=every,
        lipschitz_settings={"method": "Lanczos iteration on J^T J (torch.func.jvp and vjp)",
                            "lipschitz_iterations": iterations, "lipschitz_tol": tol,
                            "seed": seed},
    )


def _calls(model: EvolutionModel, args: tuple, kwargs: dict, index: int, kernel_input: Any
           ) -> list[Call]:
    """The model's evolution calls on these inputs, after checking that parameters, inputs
    and each u(0) are finite and that input ``index`` exists."""
    check_finite(model, args, kwargs)
    calls = capture(model, args, kwargs)
    if not calls:
        raise ArgumentError("model", f"running {type(model).__name__} called no evolution")
    for call in calls:
        bad = nonfinite(call.u0)
        if bad:
            raise ArgumentError("inputs", f"u(0) of evolution {call.name!r} holds {bad} "
                                          "values: the input is not finite as the model "
                                          "embeds it")
    batch = int(calls[0].u0.shape[0])
    if index >= batch:
        raise ArgumentError("kernel_input", f"expected an input index in [0, {batch - 1}] "
                                            f"(the batch has {batch}), got {kernel_input!r}")
    return calls


def _evolution_info(call: Call) -> dict[str, Any]:
    evo = call.evolution
    return {"name": call.name, "scheme": evo.scheme.name, "scheme_text": str(evo.scheme),
            "T": float(evo.T), "tau": float(evo.tau), "num_steps": int(evo.num_steps),
            "tokens": int(call.u0.shape[1]), "width": int(call.u0.shape[-1])}
