"""What every operator of the evolution equation shares, and what a scheme may ask of it.

An operator is one term F of the right-hand side of

    u_t = A[u] + sum_j L_j[u] - dI_S1(u) - dI_S2(u)

or a projection P_S onto a constraint set S, or a pointwise map. It is a ``torch.nn.Module``
whose parameters are (part of) the controls theta^n of one time interval, and whose
``forward(u, context)`` returns F(u) for a vector field, P(u) for a projection, s(u) for a map.
``context`` carries what is not part of the state but shapes an operator: the attention mask
(the support of the kernel), the token grid (quadrature weights and node coordinates in x,
``operators.token_grid``) and, for cross-attention, a second field.

The protocol a scheme relies on (and nothing else; ``time.schemes`` checks it when an evolution
is built):

* ``kind``: ``"field"`` (advanced by an integrator, u + h F(u)), ``"projection"`` (applied
  exactly, independent of the step h) or ``"map"`` (a pointwise map applied as is, e.g. the
  affine part of a real LayerNorm, LayerScale, stochastic depth);
* ``tangent(v, w)``: for a projection, Pi_T(v) w, the orthogonal projection of w onto the
  tangent space of the constraint set at v (the projection method, docs/math.md 3.5);
  ``has_tangent`` says whether an operator provides it;
* ``changes_width`` and ``embed(u)``: a field whose output feature grid differs from its input
  one (the paper's literal FFN substeps, u + h(W u + b) with the rectangular identity E) says
  so, and ``embed`` is E;
* ``scale_(c)``: for a field F whose output is affine in its last parameters (an output
  projection W_O u + b_O), F <- c F in place by scaling them (a step size folded into the
  weights: u + tau F(u) = u + F_tau(u), how a step of tau != 1 becomes an ordinary layer,
  docs/math.md 3.13); ``has_scale`` says whether an operator provides it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.modules import module as _m

from .tape import KVTape
from .token_grid import TokenGrid, check_grid_tensor

__all__ = ["OPERATOR_KINDS", "Context", "Operator", "apply_dropout", "has_hooks",
           "returns_new", "tree_has_hooks"]

OPERATOR_KINDS = ("field", "projection", "map")


# keys of Context.extra that are declared fields now (extra key -> field)
_DECLARED = {"memory": "memory", "memory_mask": "memory_mask",
             "memory_weights": "memory_weights", "memory_coords": "memory_coords",
             "grid_shape": "grid_shape", "token_merging": "merge_trace"}


@dataclass
class Context:
    """Data an operator may read besides the state u.

    attn_mask: additive float mask or boolean mask in the convention of
        ``scaled_dot_product_attention`` (True = x' is in the support of the kernel at x),
        broadcastable to (B, H, N_x, N_x'); None for full support (TypeError otherwise).
    is_causal: a bool: the kernel is supported on x' <= x (a Volterra operator).
    token_weights: the quadrature weights w_j >= 0 of the token grid (docs/math.md 3.12),
        shape (N,) or (B, N); None = uniform (the network). 0 = a padding node.
    token_coords: the node coordinates x_j, shape (N,) or (B, N); None = the index 0 .. N-1.
        Relative-position kernels and causal supports read them.
    tape: the KV tape of a causal evolution (``operators.tape.KVTape``), or None: the past
        nodes' keys and values per attention evaluation; the self-attention operators read
        and extend it, and the field holds only the new nodes (docs/math.md 3.19).
    memory: the second field m(x', y) of a cross-attention (the encoder's u(T) in an
        encoder-decoder pair), (B, N_m, N_y), or None; ``memory_mask`` its kernel support
        (sdpa's convention), ``memory_weights`` / ``memory_coords`` its token grid ((N_m,) or
        (B, N_m); None = uniform / the index).
    rotary: the rotary angles of this forward (``operators.rope.RotaryAngles``): every
        named rotary positions' cos and sin at the nodes' coordinates (``token_coords``,
        else the position ids the model gives), computed once per forward and read by every
        attention operator whose ``rope`` names them (docs/math.md 3.18; Gemma3 has a local
        and a global one); None = no rotary positions.
    grid_shape: (H, W) of a 2-D token grid read by convolutions in x (CvT); None = square.
    saveat: what the evolution keeps along the path for the read-out (a ``time.SaveAt``;
        set by a family's initial condition, e.g. for ``output_hidden_states``), and
        ``trajectory`` what it kept (a ``time.Trajectory``), for the read-out.
    merge_trace: the ``operators.merging.MergeTrace`` of this forward (token merging).
    readout: a family's own values for its read-out (labels, logits to keep, the layout of
        the input, ...): written by its ``initial_condition``, read by its ``read_out``; no
        operator reads them.
    extra: a dict of free-form values for user-written operators (nothing of splitformer's
        own is kept there).
    """

    attn_mask: torch.Tensor | None = None
    is_causal: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    token_weights: torch.Tensor | None = None
    token_coords: torch.Tensor | None = None
    tape: KVTape | None = None
    memory: torch.Tensor | None = None
    memory_mask: torch.Tensor | None = None
    memory_weights: torch.Tensor | None = None
    memory_coords: torch.Tensor | None = None
    rotary: Any = None  # operators.rope.RotaryAngles (not imported here: rope imports nothing)
    grid_shape: tuple[int, int] | None = None
    saveat: Any = None
    trajectory: Any = None
    merge_trace: Any = None
    readout: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.attn_mask is not None and not isinstance(self.attn_mask, torch.Tensor):
            raise TypeError(f"Context.attn_mask must be None or a torch.Tensor (a mask in "
                            f"scaled_dot_product_attention's convention), got "
                            f"{type(self.attn_mask).__name__}")
        if not isinstance(self.is_causal, bool):
            raise TypeError(f"Context.is_causal must be a bool (True: the kernel is supported on "
                            f"x' <= x), got {type(self.is_causal).__name__} {self.is_causal!r}")
        if self.tape is not None and not isinstance(self.tape, KVTape):
            raise TypeError(f"Context.tape must be None or a KVTape, got "
                            f"{type(self.tape).__name__}")
        if not isinstance(self.extra, dict):
            raise TypeError(f"Context.extra must be a dict, got {type(self.extra).__name__}")
        moved = [k for k in _DECLARED if k in self.extra]
        if moved:  # values that were kept in extra before they became declared fields
            warnings.warn(f"Context.extra[{moved[0]!r}] is now the declared field "
                          f"Context.{_DECLARED[moved[0]]} (read from extra this time)",
                          DeprecationWarning, stacklevel=3)
            for key in moved:
                setattr(self, _DECLARED[key], self.extra.pop(key))
        if self.grid_shape is not None:
            self.grid_shape = tuple(self.grid_shape)  # type: ignore[assignment]
        # checked; an integer grid (torch.arange(N)) is kept cast to a floating dtype
        self.token_weights = check_grid_tensor(self.token_weights, "Context.token_weights",
                                               weights=True)
        self.token_coords = check_grid_tensor(self.token_coords, "Context.token_coords",
                                              weights=False)

    @property
    def token_grid(self) -> TokenGrid:
        """The token grid (weights, coordinates) of the field the operators act on."""
        return TokenGrid(self.token_weights, self.token_coords)


class Operator(nn.Module):
    """Base class: a term of the evolution equation, a projection or a pointwise map.

    Subclasses set ``kind`` (one of ``OPERATOR_KINDS``) and implement ``forward``; a projection
    with a known tangent space overrides ``tangent``; a width-changing field sets
    ``changes_width`` and overrides ``embed``; a class whose ``forward`` returns a new tensor may
    say so with ``returns_new = True`` (default False; see ``returns_new``).
    """

    kind: ClassVar[str] = "field"
    changes_width: bool = False
    # the operator needs the regular token grid (convolutions in x: CvT's Q/K/V), so the grid
    # cannot be coarsened under it (token merging) and only constant weights are meaningful
    needs_regular_grid: ClassVar[bool] = False
    # the class's promise that forward returns a new tensor nothing else holds (``returns_new``)
    returns_new: ClassVar[bool] = False
    # a map that is linear in u (LayerScale's diag(gamma) u, stochastic depth's per-sample
    # factor): c M(u) = M(c u), so a step size folds through it (``Evolution.as_network``)
    is_linear: ClassVar[bool] = False

    def forward(self, u: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        raise NotImplementedError

    def embed(self, u: torch.Tensor) -> torch.Tensor:
        """Identity from the input feature domain to the output one (u itself when equal)."""
        return u

    def tangent(self, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Pi_T(v) w: the part of w tangent to the constraint set at v (projections only)."""
        raise NotImplementedError(f"{type(self).__name__} has no tangent space projection")

    @property
    def has_tangent(self) -> bool:
        """Whether ``tangent`` is implemented (a projection usable as a Stage's tangent)."""
        return type(self).tangent is not Operator.tangent

    def scale_(self, c: float) -> None:
        """F <- c F in place (fields whose output is W_O h + b_O: both scaled by c)."""
        raise NotImplementedError(f"{type(self).__name__} cannot fold a constant into its "
                                  "output (it declares no scale_)")

    @property
    def has_scale(self) -> bool:
        """Whether ``scale_`` is implemented (a field whose step size folds into weights)."""
        return type(self).scale_ is not Operator.scale_

    def compose_(self, m: torch.Tensor) -> None:
        """F <- M F in place, for a (N_y, N_y) matrix M acting on the output features (fields
        whose output is W_O h + b_O: W_O <- M W_O, b_O <- M b_O). A fitted linear map after
        the field folds into its weights exactly (docs/math.md 3.20: ReplaceMe's map)."""
        raise NotImplementedError(f"{type(self).__name__} cannot fold a linear map into its "
                                  "output (it declares no compose_)")

    @property
    def has_compose(self) -> bool:
        """Whether ``compose_`` is implemented."""
        return type(self).compose_ is not Operator.compose_


def _global_hooks() -> bool:
    return bool(_m._global_forward_hooks or _m._global_forward_pre_hooks
                or _m._global_backward_hooks or _m._global_backward_pre_hooks)


def _own_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks or module._backward_pre_hooks)


def has_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` would run a hook, forward or backward, its own or a global
    one (then it must be called as a module, never bypassed)."""
    return _own_hooks(module) or _global_hooks()


def tree_has_hooks(module: nn.Module) -> bool:
    """Whether ``module`` or any module inside it has a hook (or a global hook is set): a hook
    may keep a tensor the module makes, which must then not be written into."""
    return _global_hooks() or any(_own_hooks(m) for m in module.modules())


def apply_dropout(dropout: nn.Module, u: torch.Tensor) -> torch.Tensor:
    """``dropout(u)``, skipping the module call where it is the identity (an ``nn.Dropout`` of
    rate 0, or in eval mode, with no hook): the same value, less Python per substep."""
    if type(dropout) is nn.Dropout and (dropout.p == 0.0 or not dropout.training) \
            and not has_hooks(dropout):
        return u
    return dropout(u)


def returns_new(op: nn.Module) -> bool:
    """Whether the class of ``op`` promises that ``op(u, context)`` returns a new tensor that
    nothing else holds, so that a scheme may write the update into it (u + tau F(u) computed
    in F(u)'s memory when no gradient is recorded). The class that defines ``forward`` says so
    with ``returns_new = True`` (a subclass that overrides ``forward`` must say it again, and
    one that sets it False is believed). A promise of the class only: with a hook on ``op`` or
    inside it (``tree_has_hooks``, checked when the update is made) nothing is written. A
    module that is not an ``Operator`` promises nothing."""
    if not isinstance(op, Operator) or type(op).returns_new is not True:
        return False
    for klass in type(op).__mro__:
        if "forward" in vars(klass):
            return vars(klass).get("returns_new", False) is True
    return False
