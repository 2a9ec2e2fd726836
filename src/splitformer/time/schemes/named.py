"""The named schemes: builders ``(layout, integrator, form) -> Scheme`` on a family's layout.

    lie        each field over the full step, each followed by its projection     order 1
    prenorm    Lie on ``pre_norm_layout(layout)`` (projections inside the fields) order 1
    strang     the last fields over tau/2, the first over tau, the last over tau/2 order 2
    parallel   the average of the fields, each over m tau, then the projection    order 1
    unsplit    the sum of the fields in one stage, then the projection
    paper      the paper's literal Lie scheme, M = 4 + J substeps (its own operators)

Each builder makes its stages with ``_field_stage`` over the layout's fields and returns
``_named(...)``, so that the scheme remembers its layout (``Scheme.layout``). The registry of
names is ``time.schemes.registry.SCHEMES``.
"""

from __future__ import annotations

from ..integrators import INTEGRATORS
from .layouts import POST_LN, Field, Layout, pre_norm_layout
from .stages import FORMS, Scheme, Stage

__all__ = ["lie", "paper_lie", "parallel", "prenorm", "strang", "unsplit"]


def _field_stage(f: Field, integrator: str, fraction: float, form: str) -> list[Stage]:
    if form == "tangent" and f.projection is None:
        raise ValueError(f"form='tangent' needs a projection after field {f.operator!r}; this "
                         "layout has the projection inside the field (pre-norm)")
    out = [Stage(f.operator, "field", integrator, fraction, pre=f.pre, post=f.post,
                 tangent=f.projection if form == "tangent" else None)]
    if f.projection:
        out.append(Stage(f.projection, "project"))
    return out


def _check_options(integrator: str, form: str) -> None:
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator must be one of {tuple(INTEGRATORS)}, got {integrator!r}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")


def _named(stages, name, description, order, integrator, form, layout) -> Scheme:
    return Scheme(tuple(stages), name=name, description=description, order=order,
                  meta={"integrator": integrator, "form": form, "layout": tuple(layout)})


def lie(layout: Layout = POST_LN, integrator: str = "euler", form: str = "raw") -> Scheme:
    """Lie splitting: each field in turn over the full step, each followed by its projection.

    Post-LN layout, explicit Euler, raw form: u += tau A(u); P1; u += tau G(u); P2 (the post-LN
    encoder at tau = 1). First order.
    """
    _check_options(integrator, form)
    stages = [st for f in layout for st in _field_stage(f, integrator, 1.0, form)]
    return _named(stages, "lie", "Lie splitting: fields in turn, each over the full step", 1,
                  integrator, form, layout)


def prenorm(layout: Layout = POST_LN, integrator: str = "euler", form: str = "raw") -> Scheme:
    """Pre-norm: Lie on ``pre_norm_layout(layout)``, explicit Euler for u_t = A(P1 u) + G(P2 u)
    split in two on the default layout (docs/math.md 3.2). No projection substeps, so the only
    form is "raw"."""
    if form != "raw":
        raise ValueError("prenorm has no projection substeps: form must be 'raw'")
    s = lie(pre_norm_layout(layout), integrator)
    return _named(s.stages, "prenorm", "Lie splitting with each projection inside its field: "
                  "u += tau F(P u)", 1, integrator, form, s.meta["layout"])


def strang(layout: Layout = POST_LN, integrator: str = "heun", form: str = "raw") -> Scheme:
    """Strang (symmetric) splitting: the last field over tau/2, ..., the first over tau, ...,
    the last over tau/2. Two fields (attention A, FFN G): G/2, A, G/2 -- Macaron's layout.
    Second order for the unprojected ODE with second-order substeps; with projections, second
    order only in the tangent form (docs/math.md 3.5)."""
    _check_options(integrator, form)
    first, rest = layout[0], list(layout[1:])
    stages: list[Stage] = []
    for f in reversed(rest):
        stages += _field_stage(f, integrator, 0.5, form)
    stages += _field_stage(first, integrator, 1.0, form)
    for f in rest:
        stages += _field_stage(f, integrator, 0.5, form)
    return _named(stages, "strang", "Strang splitting: symmetric half steps around the first "
                  "field", 2, integrator, form, layout)


def parallel(layout: Layout = POST_LN, integrator: str = "euler", form: str = "raw") -> Scheme:
    """Parallel (additive) splitting, Tai-Glowinski: with m fields,

        u <- P( (1/m) sum_i Phi_i(u) ),   Phi_i = field i over m tau (then its projection),

    P the last field's projection (post-LN layouts). First order; the branches are independent.
    """
    _check_options(integrator, form)
    m = len(layout)
    branches = tuple(tuple(_field_stage(f, integrator, float(m), form)) for f in layout)
    stages = [Stage("parallel", "parallel", branches=branches)]
    if layout[-1].projection:
        stages.append(Stage(layout[-1].projection, "project"))
    return _named(stages, "parallel", "parallel splitting: average of the fields over m tau "
                  "each", 1, integrator, form, layout)


def unsplit(layout: Layout = POST_LN, integrator: str = "rk4", form: str = "tangent") -> Scheme:
    """No splitting: the sum of all fields in one stage, then the (common) projection.

    With form="tangent" and RK4 this integrates the projected ODE u_t = Pi_T(u)(A + G)(u) to
    fourth order (used as the reference of convergence studies). Needs fields without pre/post
    operators, so pre-norm layouts (ViT, GPT-2, pre-LN encoders) are refused.
    """
    _check_options(integrator, form)
    if any(f.pre or f.post for f in layout):
        raise ValueError("unsplit needs fields without pre/post operators (a pre-norm layout "
                         "puts its projections inside the fields)")
    proj = layout[-1].projection
    if form == "tangent" and proj is None:
        raise ValueError("unsplit with form='tangent' needs a projection after the last field")
    ops = "+".join(f.operator for f in layout)
    stages = [Stage(ops, "field", integrator, tangent=proj if form == "tangent" else None)]
    if proj:
        stages.append(Stage(proj, "project"))
    return _named(stages, "unsplit", "the full field in one stage", None, integrator, form,
                  layout)


def paper_lie(num_ffn_stages: int = 2) -> Scheme:
    """The paper's literal Lie scheme with M = 4 + J substeps (docs/math.md section 2).

    Operators: attention, norm1, ffn1..ffnJ (weights in the (I + W_j) form), relu, norm2.
    """
    J = num_ffn_stages
    if isinstance(J, bool) or not isinstance(J, int) or J < 1:
        raise ValueError(f"num_ffn_stages must be an int >= 1, got {J!r}")
    stages: list[Stage] = [Stage("attention"), Stage("norm1", "project", save="U2")]
    for j in range(1, J):
        stages.append(Stage(f"ffn{j}", then=("relu",)))
    stages += [Stage(f"ffn{J}"), Stage("U2", "relax", weight=0.5), Stage("norm2", "project")]
    return Scheme(
        tuple(stages),
        name="paper",
        description=f"the paper's literal Lie scheme, M = {4 + J} substeps (exact at tau = 1)",
        order=None,
    )


def _paper(layout: Layout | None = None, num_ffn_stages: int = 2) -> Scheme:
    """Registry entry of "paper": its own operators (ffn1..ffnJ, relu), no layout."""
    return paper_lie(num_ffn_stages)

