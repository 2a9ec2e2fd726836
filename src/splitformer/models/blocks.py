"""One builder of the per-step control sets theta^1..theta^L of every family.

A control set names the operators a scheme's stages refer to. Every family's step has the same
skeleton: the fields in layout order, each followed by its projection,

    attention, norm1, [cross_attention, norm2,] ffn, norm(last)

plus family extras (LayerScale's ls1/ls2, stochastic depth, the paper's ffn1..ffnJ and relu).
``block_controls`` builds them from factories, one call per step n (timm's ``block_fn`` /
``attn_layer`` idea applied to controls): a family passes what makes its attention, its FFN
and its norm, and nothing else differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn

from ..time import Controls

__all__ = ["Factory", "block_controls"]

Factory = Callable[[int], nn.Module]  # step index n (0-based) -> a new operator


def block_controls(
    num_steps: int,
    *,
    attention: Factory,
    norm: Factory,
    ffn: Factory | None,
    cross_attention: Factory | None = None,
    extra: Callable[[int], Mapping[str, nn.Module]] | None = None,
) -> Controls:
    """theta^n for n = 0..num_steps-1: "attention", "norm1", then "cross_attention", "norm2"
    when given, then "ffn" and the next norm when given, then ``extra(n)``.

    Every factory is called once per step, so no two steps share an operator (the controls
    are piecewise constant in t with independent values per interval).
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1 (the number of layers), got "
                         f"{num_steps!r}")
    fields = [("attention", attention), ("cross_attention", cross_attention), ("ffn", ffn)]
    sets = []
    for n in range(num_steps):
        theta: dict[str, nn.Module] = {}
        k = 0
        for name, make in fields:
            if make is None:
                continue
            k += 1
            theta[name] = make(n)
            theta[f"norm{k}"] = norm(n)
        if extra is not None:
            for name, op in extra(n).items():
                if name in theta:
                    raise ValueError(f"extra operator {name!r} of step {n} clashes with a "
                                     "field or norm of the same name")
                theta[name] = op
        sets.append(theta)
    return Controls(sets)
