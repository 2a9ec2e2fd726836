"""Splitting schemes as data: an ordered list of stages applied once per time step.

    stages      Stage, Scheme (what a scheme declares: lift, read, plan, step, layout,
                unused_fields), the string form ``scheme_from_string``, ``layout_of``
    layouts     Field, the layouts POST_LN / PRE_LN, ``pre_norm_layout``
    named       the named schemes on a layout: lie, prenorm, strang, parallel, unsplit, paper
    reversible  the reversible scheme on the doubled state (u, v), its own lift/read/plan
    families    the schemes and layouts of particular families (ViT's LayerScale, CvT's
                stochastic depth, the decoder's three fields)
    registry    SCHEMES (every name -> its builder), ``scheme_names``, ``resolve``

Named schemes are built on a *layout*: the fields of a family, each with the operators around
it and the projection after it (``Field``). A family declares its layout once, next to its
controls; ``SCHEMES`` maps every name to a builder ``(layout, **options) -> Scheme``, and
``resolve`` is the one way in. "prenorm" is a layout transform (each field's projection moves
inside it) followed by Lie.
"""

from .families import DECODER_POST_LN as DECODER_POST_LN
from .families import DECODER_PRE_LN as DECODER_PRE_LN
from .families import LAYERSCALE_LAYOUT as LAYERSCALE_LAYOUT
from .families import SANDWICH_LAYOUT as SANDWICH_LAYOUT
from .families import STOCHASTIC_DEPTH_LAYOUT as STOCHASTIC_DEPTH_LAYOUT
from .families import cvt_scheme as cvt_scheme
from .families import decoder_lie as decoder_lie
from .families import decoder_prenorm as decoder_prenorm
from .families import prenorm_layerscale as prenorm_layerscale
from .families import prenorm_sandwich as prenorm_sandwich
from .families import vit_scheme as vit_scheme
from .layouts import POST_LN, PRE_LN, Field, pre_norm_layout
from .layouts import Layout as Layout
from .named import lie, paper_lie, parallel, prenorm, strang, unsplit
from .registry import SCHEMES, resolve, scheme_names
from .reversible import ReversiblePlan as ReversiblePlan
from .reversible import ReversibleScheme as ReversibleScheme
from .reversible import reversible as reversible
from .stages import (
    FORMS,
    KINDS,
    MAX_FRACTION,
    SUFFIXES,
    Scheme,
    Stage,
    layout_of,
    scheme_from_string,
)

__all__ = [
    "FORMS",
    "Field",
    "KINDS",
    "MAX_FRACTION",
    "POST_LN",
    "PRE_LN",
    "SCHEMES",
    "SUFFIXES",
    "Scheme",
    "Stage",
    "layout_of",
    "lie",
    "paper_lie",
    "parallel",
    "pre_norm_layout",
    "prenorm",
    "resolve",
    "scheme_from_string",
    "scheme_names",
    "strang",
    "unsplit",
]
