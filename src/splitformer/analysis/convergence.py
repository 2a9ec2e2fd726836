"""Convergence in tau: errors at t = T against a reference solution, and the observed order.

For a model (controls on [0, T]) and a scheme, run the evolution with tau = 2^-k, k in ``ks``,
from the same u(0), and compare u(T) with a reference u_ref(T):

    e(tau) = max |u_tau(T) - u_ref(T)|,     observed order p = slope of log e against log tau

(least squares over the taus whose error is above the round-off floor; the pairwise orders
log2(e(2 tau) / e(tau)) are reported too). The reference is, by default, the projected ODE
u_t = Pi_T(u) (A + G)(u) integrated unsplit with RK4 in the tangent form at tau = 2^-ref_k (the
common limit of the projected Lie, Strang and parallel schemes when all fields project onto the
same set, docs/math.md 3.4), or the same scheme at tau = 2^-ref_k when that is not available (pre-LN
layouts, distinct constraint sets).

``smooth_configuration`` is the documented smooth configuration of docs/convergence.md; the
variants replace one ingredient at a time (ReLU, real LayerNorm, trained weights).

Inputs are checked before any run, by the checks of ``analysis.checks`` that the command line
shares: a bad argument raises ``ArgumentError`` (a ValueError) naming it. A run whose numbers
are not finite (a reference or a u_tau(T) that blew up, errors that leave no order to fit)
raises ``NonFiniteError`` (``splitformer.time.NonFiniteError``) instead of returning a NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..files import save_figure
from ..models.encoder import Encoder
from ..operators import FeedForward, LayerNormProjection, NonlocalAttention, SphereProjection
from ..operators.base import Context
from ..time import Controls, Evolution, NonFiniteError, TimeGrid
from ..time.schemes import Scheme, lie, scheme_names
from .checks import (
    MAX_REF_K,
    ArgumentError,
    check_ks,
    check_model,
    check_ref_k,
    check_reference,
    check_seed,
    check_u0,
    check_u_ref,
    projected_ode_mismatch,
    refuse_merging,
    with_scheme_checked,
)

__all__ = [
    "ArgumentError",
    "ConvergenceResult",
    "CONFIGURATIONS",
    "MAX_REF_K",
    "REFERENCES",
    "configuration",
    "convergence",
    "fit_order",
    "has_common_projection",
    "NonFiniteError",
    "reference_solution",
    "smooth_configuration",
]


REFERENCES = ("auto", "projected-ode", "same-scheme")


@dataclass
class ConvergenceResult:
    scheme: str
    scheme_text: str
    integrator: str | None  # None: a scheme given as a string or Scheme (set per stage)
    form: str | None
    taus: list[float]
    errors: list[float]
    order: float
    pairwise_orders: list[float | None]  # None where an error is at the round-off floor
    reference: str
    configuration: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "scheme": self.scheme,
            "scheme_text": self.scheme_text,
            "integrator": self.integrator,
            "form": self.form,
            "order": self.order,
            "taus": self.taus,
            "errors": self.errors,
            "pairwise_orders": self.pairwise_orders,
            "reference": self.reference,
            "configuration": self.configuration,
            **self.extra,
        }


FLOOR = 1e-12  # errors at or below this are round-off: left out of the fitted order


def fit_order(taus: list[float], errors: list[float], floor: float = FLOOR) -> float:
    """Least-squares slope of log(error) against log(tau), errors above ``floor`` only (NaN
    when fewer than two distinct taus are left; ``convergence`` raises instead)."""
    pts = [(math.log(t), math.log(e)) for t, e in zip(taus, errors, strict=True) if e > floor]
    if len(pts) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    num = sum((x - mx) * (y - my) for x, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return num / den if den > 0 else float("nan")  # one tau repeated: no slope


# -- configurations -----------------------------------------------------------------------------

def smooth_configuration(
    *,
    seed: int = 0,
    dim: int = 16,
    heads: int = 2,
    hidden: int = 32,
    layers: int = 2,
    tokens: int = 6,
    batch: int = 2,
    activation: str = "tanh",
    real_layernorm: bool = False,
    dtype: torch.dtype = torch.float64,
) -> tuple[Encoder, torch.Tensor]:
    """The documented smooth configuration: post-LN layout, T = ``layers``, a smooth activation
    (tanh: smooth and a proximal map), both projections onto the same S1(0, 1) (eps = 0, scalar),
    random weights (default initialisations, seeded), u(0) on S1.

    ``activation="relu"`` and ``real_layernorm=True`` (eps = 1e-5, per-feature gain and bias
    drawn in [0.5, 1.5] x [-0.5, 0.5], different for the two norms) are the variants.
    """
    seed = check_seed(seed)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    sets = []
    for _ in range(layers):
        if real_layernorm:
            norms = []
            for _ in range(2):
                ln = LayerNormProjection(dim, eps=1e-5, dtype=dtype)
                with torch.no_grad():
                    ln.weight.copy_(0.5 + torch.rand(dim, generator=g, dtype=dtype))
                    ln.bias.copy_(torch.rand(dim, generator=g, dtype=dtype) - 0.5)
                norms.append(ln)
        else:
            norms = [SphereProjection(dim, 0.0, 1.0, dtype=dtype) for _ in range(2)]
        sets.append({
            "attention": NonlocalAttention(dim, heads, dtype=dtype),
            "norm1": norms[0],
            "ffn": FeedForward([dim, hidden, dim], activation=activation, dtype=dtype),
            "norm2": norms[1],
        })
    model = Encoder(Evolution(Controls(sets), lie(), TimeGrid(layers, layers)),
                    source={"kind": "encoder"}).eval()
    u0 = torch.randn(batch, tokens, dim, generator=g, dtype=dtype)
    u0 = SphereProjection(dim, 0.0, 1.0, dtype=dtype)(u0)
    return model, u0


def trained_configuration(*, seed: int = 0, steps: int = 150, train_projections: bool = False,
                          dtype: torch.dtype = torch.float64) -> tuple[Encoder, torch.Tensor]:
    """The smooth configuration after ``steps`` Adam steps on sklearn's digits (8x8 images read
    as 8 tokens of 8 pixels, lifted to 16 features; read-out: mean over tokens, linear).

    The projections' s1, s2 stay fixed (one constraint set S1(0, 1), so the projected ODE is
    still the limit) unless ``train_projections``: then every norm gets its own S1(s1, s2)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the 'trained' configuration needs scikit-learn, a dependency of "
                          "splitformer that does not import here (pip install scikit-learn)") \
            from e
    seed = check_seed(seed)
    model, _ = smooth_configuration(seed=seed, dtype=dtype)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=dtype).view(-1, 8, 8) / 16.0
    y = torch.tensor(digits.target)
    gen = torch.Generator().manual_seed(seed)
    lift = torch.nn.Linear(8, 16, dtype=dtype)
    head = torch.nn.Linear(16, 10, dtype=dtype)
    norm = SphereProjection(16, 0.0, 1.0, dtype=dtype)
    if not train_projections:
        for theta in model.evolution.controls:
            for name in ("norm1", "norm2"):
                theta[name].requires_grad_(False)
    params = [*model.parameters(), *lift.parameters(), *head.parameters()]
    opt = torch.optim.Adam([p for p in params if p.requires_grad], lr=3e-3)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (64,), generator=gen)
        u0 = norm(lift(x[idx]))
        loss = torch.nn.functional.cross_entropy(head(model(u0).mean(1)), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        u0 = norm(lift(x[:2]))
    return model, u0.detach()


CONFIGURATIONS = {
    "smooth": "post-LN layout, tanh, both projections onto S1(0,1) (eps = 0), random weights",
    "relu": "the smooth configuration with ReLU (Lipschitz, not smooth)",
    "layernorm": "the smooth configuration with real LayerNorm (eps 1e-5, per-feature gain/bias)",
    "trained": "the smooth configuration after 150 Adam steps on sklearn digits (s1, s2 fixed)",
    "trained-s": "as 'trained', with s1, s2 trained too (a different S1 for every projection)",
}


def configuration(name: str, *, seed: int = 0) -> tuple[Encoder, torch.Tensor]:
    """One of CONFIGURATIONS by name: (model, u0)."""
    check_seed(seed)
    if name == "smooth":
        return smooth_configuration(seed=seed)
    if name == "relu":
        return smooth_configuration(seed=seed, activation="relu")
    if name == "layernorm":
        return smooth_configuration(seed=seed, real_layernorm=True)
    if name == "trained":
        return trained_configuration(seed=seed)
    if name == "trained-s":
        return trained_configuration(seed=seed, train_projections=True)
    raise ValueError(f"configuration must be one of {sorted(CONFIGURATIONS)}, got {name!r}")


# -- the study ----------------------------------------------------------------------------------

def _run(evolution: Evolution, u0: torch.Tensor, context: Context | None = None
         ) -> torch.Tensor:
    # small tensors, many steps: one thread avoids thread hand-off costs (10x on 2 loaded cores)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return evolution(u0) if context is None else evolution(u0, context)
    finally:
        torch.set_num_threads(threads)


def reference_solution(evolution: Evolution | Encoder, u0: torch.Tensor, ref_k: int = 10,
                       scheme: str = "unsplit", context: Context | None = None
                       ) -> torch.Tensor:
    """u(T) by ``scheme`` (default: the projected ODE, unsplit RK4, tangent form) at
    tau = 2^-ref_k; ``context``: the inputs' masks and causal support (None: full support)."""
    ref_k = check_ref_k(ref_k)
    evo = evolution.evolution if isinstance(evolution, Encoder) else evolution
    if not isinstance(evo, Evolution):
        raise TypeError(f"evolution must be an Encoder or an Evolution, got "
                        f"{type(evolution).__name__}")
    check_model(evolution, evo)
    check_u0(u0, evolution, evo)
    if scheme == "unsplit":
        evo = evo.with_scheme("unsplit", integrator="rk4", form="tangent")
    T = int(round(evo.T))
    return _run(Evolution(evo.controls, evo.scheme, TimeGrid(T, T)).refine(2**ref_k), u0,
                context)


def has_common_projection(evo: Evolution) -> bool:
    """Every field of the scheme projects, raw, onto one and the same set in every control set
    (then the projected ODE is the common limit, and the reference;
    ``checks.projected_ode_mismatch`` says why not)."""
    return projected_ode_mismatch(evo) is None


def convergence(
    model: Encoder | Evolution,
    u0: torch.Tensor,
    *,
    scheme: str | Scheme = "lie",
    integrator: str | None = None,
    form: str | None = None,
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6),
    ref_k: int = 10,
    reference: str = "auto",
    configuration_name: str = "",
    u_ref: torch.Tensor | None = None,
    context: Context | None = None,
) -> ConvergenceResult:
    """Errors at t = T for tau = 2^-k, k in ``ks``, and the fitted order (see module docstring).

    scheme: a named scheme (built on the model's layout), a scheme string or a Scheme; it must
    advance every field operator of the model.
    integrator, form: options of a named scheme; None (the default) is the scheme's own default
    (``strang()`` is Heun, ``unsplit()`` RK4 in the tangent form, the others Euler, raw), as in
    ``model.with_scheme(name)``. A scheme string or Scheme sets them per stage.
    ks: at least two integers in [0, MAX_REF_K - 1], increasing, each below ``ref_k``.
    ref_k: an integer in [1, MAX_REF_K] (the reference runs T 2^ref_k steps).
    reference: "auto" (projected ODE by unsplit tangent RK4 when every field projects onto the
    same set, else the same scheme), "projected-ode" (refused where it is not the scheme's
    limit: pre-norm fields, distinct constraint sets), or "same-scheme"; at tau = 2^-ref_k.
    ``u_ref`` skips the reference run (e.g. from ``reference_solution``, shared by studies).
    context: the ``Context`` of u0's inputs (attention masks, the causal support of a decoder),
    as ``model.initial_condition`` returns it; None: full support.

    Raises ``ArgumentError`` (a ValueError naming the argument) before any run for a bad input
    (u0 not a finite (batch, tokens, d_model) tensor of the model's dtype, ...), and
    ``NonFiniteError`` when the reference or a run is not finite or no order can be fitted.
    """
    base = model.evolution if isinstance(model, Encoder) else model
    if not isinstance(base, Evolution):
        raise TypeError(f"model must be an Encoder or an Evolution, got {type(model).__name__}")
    if not isinstance(reference, str) or reference not in REFERENCES:
        raise ArgumentError("reference", f"expected one of {', '.join(REFERENCES)}, got "
                                         f"{reference!r}")
    ref_k = check_ref_k(ref_k)
    ks = check_ks(ks, ref_k)
    check_model(model, base)
    refuse_merging([base], "convergence in tau")
    check_u0(u0, model, base)
    evo, named = _scheme_checked(base, scheme, integrator, form)
    check_reference(evo, reference)
    if u_ref is not None:
        check_u_ref(u_ref, u0, base)
    meta = evo.scheme.meta if named else {}
    u_ref, ref_label = _reference(base, evo, u0, ref_k, reference, u_ref, context)
    taus, errors = _errors(base, evo, u0, u_ref, ks, context)
    order, pairwise = _orders(taus, errors, ks)
    return ConvergenceResult(
        scheme=scheme.strip() if isinstance(scheme, str) else evo.scheme.name,
        scheme_text=str(evo.scheme), integrator=meta.get("integrator"), form=meta.get("form"),
        taus=taus, errors=errors, order=order, pairwise_orders=pairwise,
        reference=ref_label, configuration=configuration_name,
    )


def _scheme_checked(base: Evolution, scheme: str | Scheme, integrator: str | None,
                    form: str | None) -> tuple[Evolution, bool]:
    """(``base`` under ``scheme``, whether it is a named scheme); integrator and form only
    with a named one."""
    options = {k: v for k, v in (("integrator", integrator), ("form", form)) if v is not None}
    named = isinstance(scheme, str) and scheme.strip() in scheme_names()
    if options and not named:
        raise ValueError(f"integrator and form are options of the named schemes "
                         f"{scheme_names()}; scheme {scheme!r} sets them per stage "
                         "(e.g. 'attention:heun~norm1 norm1:project')")
    return with_scheme_checked(base, scheme, **options), named


def _reference(base: Evolution, evo: Evolution, u0: torch.Tensor, ref_k: int, reference: str,
               u_ref: torch.Tensor | None, context: Context | None
               ) -> tuple[torch.Tensor, str]:
    """(u_ref, what it is): the given one, or the reference run (``reference``: "auto" is the
    projected ODE when the scheme has a common projection, else the same scheme)."""
    if reference == "auto":
        reference = "projected-ode" if has_common_projection(evo) else "same-scheme"
    if u_ref is not None:
        ref_label = "given"
    elif reference == "projected-ode":
        ref_label = f"projected ODE, unsplit RK4 tangent form, tau = 2^-{ref_k}"
        u_ref = reference_solution(base, u0, ref_k, context=context)
    else:
        ref_label = f"the same scheme at tau = 2^-{ref_k}"
        u_ref = reference_solution(evo, u0, ref_k, scheme="same", context=context)
    if not torch.isfinite(u_ref).all():
        raise NonFiniteError(f"the reference u(T) ({ref_label}) is not finite: the evolution "
                             "blew up (weights too large for this T?); no errors to measure")
    return u_ref, ref_label


def _errors(base: Evolution, evo: Evolution, u0: torch.Tensor, u_ref: torch.Tensor,
            ks: tuple[int, ...], context: Context | None) -> tuple[list[float], list[float]]:
    """(taus, max |u_tau(T) - u_ref(T)|) for tau = 2^-k, k in ``ks``."""
    # every tau = 2^-k must divide the unit control intervals: T stays, N_t = T 2^k
    T = int(round(base.T))
    unit = Evolution(evo.controls, evo.scheme, TimeGrid(T, T))
    taus, errors = [], []
    for k in ks:
        u = _run(unit.refine(2**k), u0, context)
        if u.shape != u_ref.shape:
            raise ArgumentError("u_ref", f"expected u(T) of shape {tuple(u.shape)}, got "
                                         f"{tuple(u_ref.shape)}")
        if not torch.isfinite(u).all():
            raise NonFiniteError(f"u(T) at tau = 2^-{k} is not finite: the scheme blew up at "
                                 f"this step size; start ks at a larger k")
        taus.append(2.0**-k)
        errors.append((u - u_ref).abs().max().item())
    return taus, errors


def _orders(taus: list[float], errors: list[float], ks: tuple[int, ...]
            ) -> tuple[float, list[float | None]]:
    """(the fitted order, the order between each pair of consecutive taus, None where an
    error is at the round-off floor)."""
    order = fit_order(taus, errors)
    if not math.isfinite(order):
        shown = ", ".join(f"{e:.1e}" for e in errors)
        raise NonFiniteError(f"no order to fit: fewer than two errors above the round-off "
                             f"floor {FLOOR:g} (errors {shown} at tau = 2^-k, k in "
                             f"{list(ks)}): the scheme meets the reference to round-off")
    pairwise = [math.log2(errors[i] / errors[i + 1])
                if errors[i] > FLOOR and errors[i + 1] > FLOOR else None
                for i in range(len(errors) - 1)]
    return order, pairwise


def plot(results: list[ConvergenceResult], path: str, title: str = "") -> None:
    """Log-log plot of error against tau, with slope-1 and slope-2 guides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in results:
        how = f" ({r.integrator}, {r.form})" if r.integrator else ""
        ax.loglog(r.taus, r.errors, "o-", label=f"{r.scheme}{how}: order {r.order:.2f}")
    t = results[0].taus
    e0 = max(r.errors[0] for r in results)
    for p, style in ((1, ":"), (2, "--")):
        ax.loglog(t, [e0 * (x / t[0]) ** p for x in t], "k" + style, lw=0.8, label=f"slope {p}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tau")
    ax.set_ylabel("max |u_tau(T) - u_ref(T)|")
    ax.set_title(title or "convergence in tau")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
