"""Running a model once to find its evolutions: ``capture`` records u(0) and the context of
every call of one of its ``Evolution``s (CvT's stages, an encoder and a decoder, or the one
evolution of the other families), after the input checks of ``analyze``: inputs as a tuple or
a dict (``check_inputs``), finite parameters and inputs (``check_finite``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..models.base import EvolutionModel
from ..operators.base import Context
from ..time import Evolution
from .checks import ArgumentError

__all__ = ["Call", "capture", "check_finite", "check_inputs", "family_of", "nonfinite"]


def check_inputs(inputs) -> tuple[tuple, dict]:
    if isinstance(inputs, Mapping):
        bad = [k for k in inputs if not isinstance(k, str)]
        if bad:
            raise ArgumentError("inputs", f"expected a dict of keyword inputs with str keys, got "
                                          f"the key {bad[0]!r}")
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    hint = " (wrap one tensor as a tuple: (x,))" if isinstance(inputs, torch.Tensor) else ""
    raise ArgumentError("inputs", f"expected a tuple of positional inputs or a dict of keyword "
                                  f"inputs, as model(...) takes them, got "
                                  f"{type(inputs).__name__}{hint}")


def _tensors(value, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in ``value`` (nested tuples, lists and dicts), with where each is."""
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _tensors(v, f"{where}[{k!r}]")
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{where}[{i}]")


def nonfinite(t: torch.Tensor) -> str | None:
    """How a floating tensor is not finite ("NaN", "infinite", "NaN and infinite"), or None."""
    if not (t.is_floating_point() or t.is_complex()):
        return None
    nan = bool(torch.isnan(t).any())
    inf = bool(torch.isinf(t).any())
    return " and ".join(w for w, f in (("NaN", nan), ("infinite", inf)) if f) or None


def check_finite(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Every parameter of the model and every floating input tensor is finite, or
    ArgumentError("model") / ArgumentError("inputs") naming the first that is not."""
    for name, param in model.named_parameters():
        bad = nonfinite(param.detach())
        if bad:
            raise ArgumentError("model", f"parameter {name!r} holds {bad} values: the "
                                         "weights are not finite")
    for where, t in [*_tensors(args, "inputs"), *_tensors(kwargs, "inputs")]:
        bad = nonfinite(t.detach())
        if bad:
            raise ArgumentError("inputs", f"{where} holds {bad} values: the input is not "
                                          "finite")


@dataclass
class Call:
    evolution: Evolution
    name: str
    u0: torch.Tensor
    context: Context | None


class _Refused(Exception):
    """A TypeError or ValueError raised by a model's own input checks (initial_condition)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def capture(model: EvolutionModel, args: tuple, kwargs: dict) -> list[Call]:
    """Run the model once, recording (u0, context) of every call of one of its evolutions.

    Inputs that ``model.forward`` does not take, and a TypeError or ValueError raised by the
    model's own input checks (the ``initial_condition`` of the model or of one of its parts),
    raise ArgumentError("inputs"); any other exception of the run propagates as it is."""
    try:
        inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as e:
        raise ArgumentError("inputs", f"model(...) does not take them: {e}") from None
    except ValueError:  # no signature to read: let the call say
        pass
    names = {id(m): n for n, m in model.named_modules() if isinstance(m, Evolution)}
    calls: list[Call] = []
    seen: dict[str, int] = {}

    def hook(module, hargs, hkwargs):
        u0 = hargs[0] if hargs else hkwargs.get("u0")
        ctx = hargs[1] if len(hargs) > 1 else hkwargs.get("context")
        path = names.get(id(module), "evolution")
        label = path[: -len(".evolution")] if path.endswith(".evolution") else path
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label}#{seen[label]}"
        calls.append(Call(module, label, u0.detach(), ctx))

    def checked(method):
        def initial_condition(*a, **k):
            try:
                return method(*a, **k)
            except _Refused:
                raise
            except (TypeError, ValueError) as e:
                raise _Refused(e) from e
        return initial_condition

    owners = [m for m in model.modules() if isinstance(m, EvolutionModel)]
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True)
               for m in model.modules() if isinstance(m, Evolution)]
    for m in owners:
        object.__setattr__(m, "initial_condition", checked(m.initial_condition))
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except _Refused as e:
        raise ArgumentError("inputs", f"model(...) refused them: {type(e.error).__name__}: "
                                      f"{e.error}") from e.error
    finally:
        for m in owners:
            m.__dict__.pop("initial_condition", None)
        for h in handles:
            h.remove()
    return calls


def family_of(model: nn.Module) -> str | None:
    mod = type(model).__module__
    if mod.startswith("splitformer.models."):
        return mod.rsplit(".", 1)[-1]
    return None
