"""The schemes and layouts of particular families, next to the other schemes (the family
modules of ``splitformer.models`` import them from here):

    DECODER_POST_LN / DECODER_PRE_LN   the decoder's three fields: attention A, cross-attention
                                       C(u; M), FFN G (torch.nn's TransformerDecoderLayer)
    decoder_lie, decoder_prenorm       its post-LN and pre-LN steps
    LAYERSCALE_LAYOUT                  pre-LN with LayerScale D = diag(gamma(y)) after each field
    prenorm_layerscale, vit_scheme     the ViT block with and without LayerScale (timm)
    STOCHASTIC_DEPTH_LAYOUT            pre-LN with stochastic depth D after each field
    cvt_scheme                         the CvT layer, with Hugging Face's drop_path placement
    SANDWICH_LAYOUT, prenorm_sandwich  pre-norm with a norm after each field too (Gemma2/3)
"""

from __future__ import annotations

from .layouts import Field, Layout, pre_norm_layout
from .named import lie, prenorm
from .stages import Scheme, Stage

__all__ = [
    "DECODER_POST_LN",
    "DECODER_PRE_LN",
    "LAYERSCALE_LAYOUT",
    "SANDWICH_LAYOUT",
    "STOCHASTIC_DEPTH_LAYOUT",
    "cvt_scheme",
    "decoder_lie",
    "decoder_prenorm",
    "prenorm_layerscale",
    "prenorm_sandwich",
    "vit_scheme",
]


# -- the encoder-decoder pair's decoder (models/seq2seq.py) ---------------------------------
DECODER_POST_LN: Layout = (
    Field("attention", projection="norm1"),
    Field("cross_attention", projection="norm2"),
    Field("ffn", projection="norm3"),
)
DECODER_PRE_LN: Layout = pre_norm_layout(DECODER_POST_LN)


def decoder_lie(integrator: str = "euler", form: str = "raw") -> Scheme:
    """Post-LN decoder step: u <- P1(u + tau A u); P2(u + tau C(u; M)); P3(u + tau G u)."""
    return lie(DECODER_POST_LN, integrator, form)


def decoder_prenorm(integrator: str = "euler", form: str = "raw") -> Scheme:
    """Pre-LN decoder step: u += tau A(P1 u); u += tau C(P2 u; M); u += tau G(P3 u)."""
    return prenorm(DECODER_POST_LN, integrator, form)


# -- ViT with LayerScale (models/vit.py) ------------------------------------------------------
LAYERSCALE_LAYOUT: Layout = (
    Field("attention", pre=("norm1",), post=("ls1",)),
    Field("ffn", pre=("norm2",), post=("ls2",)),
)


def prenorm_layerscale() -> Scheme:
    """Pre-LN with LayerScale: u += tau gamma_1 A(P1 u); u += tau gamma_2 G(P2 u)."""
    s = lie(LAYERSCALE_LAYOUT)
    return Scheme(s.stages, name="prenorm_layerscale",
                  description="explicit Euler for u_t = A(P1 u) + G(P2 u) with per-feature "
                              "steps tau(y) = tau gamma(y) (LayerScale as post operators)",
                  order=1, meta=s.meta)


def vit_scheme(layer_scale: bool) -> Scheme:
    """The scheme of a pre-LN ViT block: ``prenorm`` or ``prenorm_layerscale``."""
    return prenorm_layerscale() if layer_scale else prenorm()


# -- CvT with stochastic depth (models/cvt.py) ------------------------------------------------
# The layout named schemes are built on when a stage has stochastic depth: D after each field
# (the usual reading of drop_path, e.g. timm's). Hugging Face's second drop_path on the whole
# state is a map stage, not a field, and is kept only by the scheme the model came with.
STOCHASTIC_DEPTH_LAYOUT: Layout = (
    Field("attention", pre=("norm1",), post=("drop_path",)),
    Field("ffn", pre=("norm2",), post=("drop_path",)),
)


def cvt_scheme(drop_path: bool) -> Scheme:
    """The CvT layer as a scheme: ``prenorm`` when there is no stochastic depth, otherwise
    pre-LN with D after the attention field and D on the state after the FFN step."""
    if not drop_path:
        return prenorm()
    return Scheme(
        (
            Stage("attention", pre=("norm1",), post=("drop_path",)),
            Stage("ffn", pre=("norm2",)),
            Stage("drop_path", "map"),
        ),
        name="cvt_drop_path",
        description="pre-LN with stochastic depth D: u += D(A(P1 u)); u = D(u + G(P2 u))",
        order=1,
        # named schemes rebuilt on this one put D after each field (ordinary stochastic depth)
        meta={"layout": STOCHASTIC_DEPTH_LAYOUT},
    )


# -- Gemma2 / Gemma3's sandwich norms (models/llama.py) -------------------------------------
SANDWICH_LAYOUT: Layout = (
    Field("attention", pre=("norm1",), post=("post_norm1",)),
    Field("ffn", pre=("norm2",), post=("post_norm2",)),
)


def prenorm_sandwich() -> Scheme:
    """Pre-norm with a projection after each field as well: u += tau Q1(A(P1 u));
    u += tau Q2(G(P2 u)) (Gemma2's and Gemma3's four RMSNorms per layer)."""
    s = lie(SANDWICH_LAYOUT)
    return Scheme(s.stages, name="prenorm_sandwich",
                  description="explicit Euler for u_t = Q1(A(P1 u)) + Q2(G(P2 u)): each field "
                              "between two projections (sandwich norms)",
                  order=1, meta=s.meta)
