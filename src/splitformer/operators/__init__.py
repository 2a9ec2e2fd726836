"""Operators of the evolution equation: one module per mathematical object."""

from .attention import AttentionOperator, CrossAttention, NonlocalAttention
from .base import Context, Operator
from .feature import FeatureIntegral, FeedForward
from .kernels import Kernel, SoftmaxKernel
from .projections import Activation, LayerNormProjection, ProjectionS2, SphereProjection
from .scaling import DiagonalScaling, LayerScale

__all__ = [
    "AttentionOperator",
    "Activation",
    "Context",
    "DiagonalScaling",
    "LayerScale",
    "CrossAttention",
    "FeatureIntegral",
    "FeedForward",
    "Kernel",
    "LayerNormProjection",
    "NonlocalAttention",
    "Operator",
    "ProjectionS2",
    "SoftmaxKernel",
    "SphereProjection",
]
