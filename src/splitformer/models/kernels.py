"""A kernel in every attention operator of a model: the walk over a model's modules.

The kernels themselves (``operators.kernels``: softmax, Sinkhorn, Gaussian, linear, ALiBi,
rotary, the registry ``KERNELS``) and the one-operator ``AttentionOperator.set_kernel`` live on
the operators floor; walking a whole model to find its attention operators is a model's
business, so it lives here (``EvolutionModel.with_kernel`` is ``set_kernel`` on a shared copy).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..operators.attention import AttentionOperator
from ..operators.kernels import KERNEL_NAMES, Kernel, kernel_class, warn_about_instance

__all__ = ["set_kernel"]


def set_kernel(model: nn.Module, kernel: Kernel | str, **options: Any) -> nn.Module:
    """Put ``kernel`` into every attention operator of ``model`` (every ``AttentionOperator``:
    NonlocalAttention, CrossAttention, CvT's ConvolutionalAttention, ...); in place, returns
    ``model``.

    * A name (one of ``KERNEL_NAMES``, validated first) builds a fresh kernel per operator with
      ``options`` (``Kernel.for_operator``: ALiBi takes the operator's heads, rotary its head
      size). A kernel with a score scale inherits the operator's current scale unless
      ``options`` give ``scale``, so ``set_kernel(model, "softmax")`` never changes a model
      whose kernel is softmax (GPT-2's scale by layer, CvT's dim^-1/2). A kernel without a
      scale (linear) is refused where the operator's scale is not 1/sqrt(d_h).
    * A ``Kernel`` instance is used as given, without options: the same module is shared by
      every operator (kernels are stateless values; a kernel with trainable parameters would be
      tied across the operators). Its compatibility (heads, head size, grids) is still checked.

    Every operator is checked before any is changed (all or nothing). ValueError, naming the
    model's class, the kernel and the operator, when a name is unknown, the model has no
    attention operator, or an operator cannot take the kernel. A Kernel instance of a class
    that is not built in is probed for causality, and an instance whose scale replaces an
    operator's own non-default scale is named: both warn (``warn_about_instance``).
    """
    if isinstance(kernel, str):
        kernel_class(kernel)
        label = repr(kernel)
    elif isinstance(kernel, Kernel):
        if options:
            raise ValueError(f"options {sorted(options)} are for a kernel built from a name; "
                             f"{type(kernel).__name__} is used as given")
        label = f"{type(kernel).__name__} ({kernel.name!r})"
    else:
        raise TypeError(f"kernel must be a Kernel or one of {sorted(KERNEL_NAMES)}, "
                        f"got {type(kernel).__name__}")
    ops = [(path or type(model).__name__, m) for path, m in model.named_modules()
           if isinstance(m, AttentionOperator)]
    if not ops:
        raise ValueError(f"{type(model).__name__} has no attention operator to take the kernel "
                         f"{label}")
    plans = []
    for path, op in ops:
        try:
            plans.append((op, op.kernel_for(kernel, **options)))
        except ValueError as e:
            raise ValueError(f"set_kernel({type(model).__name__}, {label}): {path} "
                             f"({type(op).__name__}): {e}") from e
    if isinstance(kernel, Kernel):
        warn_about_instance(kernel, ops, f"set_kernel({type(model).__name__}, {label})")
    for op, k in plans:
        op.install_kernel(k)
    return model
