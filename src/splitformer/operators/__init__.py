"""Operators of the evolution equation: one module per mathematical object."""

from .attention import (
    AttentionOperator,
    CrossAttention,
    GroupedQueryAttention,
    NonlocalAttention,
)
from .base import Context, Operator
from .feature import FeatureIntegral, FeedForward, GatedFeedForward
from .kernels import Kernel, SoftmaxKernel
from .merging import MergeTrace, TokenMerging
from .projections import (
    Activation,
    LayerNormProjection,
    ProjectionS2,
    RMSNormProjection,
    SphereProjection,
)
from .scaling import DiagonalScaling, LayerScale
from .superposition import Superposition
from .token_grid import KernelGrid, TokenGrid

__all__ = [
    "AttentionOperator",
    "Activation",
    "Context",
    "DiagonalScaling",
    "LayerScale",
    "CrossAttention",
    "FeatureIntegral",
    "FeedForward",
    "GatedFeedForward",
    "GroupedQueryAttention",
    "Kernel",
    "KernelGrid",
    "LayerNormProjection",
    "MergeTrace",
    "NonlocalAttention",
    "Operator",
    "ProjectionS2",
    "RMSNormProjection",
    "SoftmaxKernel",
    "SphereProjection",
    "Superposition",
    "TokenGrid",
    "TokenMerging",
]
