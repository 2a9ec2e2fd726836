"""The weight tables of every interop map, and the one routine that copies them both ways.

A table is a sequence of ``Row``s, each pairing their dotted name with ours (attribute paths
from the two model roots, e.g. ``encoder.layer.0.output.dense.weight`` and
``evolution.controls.sets.0.ffn.stages.1.weight``). A row is either

* a tensor row: a parameter or buffer, copied after checking that both sides have it (or
  neither) and that the shapes agree; optionally into a row block of a packed tensor of ours
  (``block``: transformers' separate W_Q, W_K, W_V are blocks of our ``qkv_weight``) or through
  a named ``transform`` (GPT-2's Conv1D weights are W^T, the paper form stores E + W_j, a
  scalar s2 is a LayerNorm gain with all entries equal); or
* an attribute row (``attr=True``): a value that is not in the state dict but changes what the
  model computes (a LayerNorm's eps, a dropout rate), assigned as is.

``copy_table(rows, theirs=..., ours=..., into="ours")`` is the forward map and
``into="theirs"`` the inverse: the same rows drive both directions. Every ``to_hf`` rebuilds the
transformers model from its source config, which fixes every eps and rate: it copies the
tensors and checks the attribute rows (``attributes="check"``), refusing, with the layer and
the config option, a value the config cannot represent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..models.base import keep_source

__all__ = [
    "TRANSFORMS",
    "Row",
    "check_covered",
    "check_no_hooks",
    "check_softmax",
    "copy_table",
    "copy_weight",
    "lookup",
    "network_scheme",
    "prefixed",
    "source_field",
]

_MISSING = object()


def _transpose(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return src.t()


def _minus_identity(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return src - torch.eye(*src.shape, dtype=src.dtype, device=src.device)


def _plus_identity(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return src + torch.eye(*src.shape, dtype=src.dtype, device=src.device)


def _to_scalar(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    first = src.reshape(-1)[0]
    if not torch.all(src == first):
        raise ValueError("needs a scalar (all entries equal)")
    return first.reshape(dst.shape)


def _from_scalar(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return src.reshape(()).expand(dst.shape)


# name -> (their value -> our value, our value -> their value); each takes (src, dst)
TRANSFORMS: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ...]] = {
    "transpose": (_transpose, _transpose),  # theirs = ours^T (GPT-2's Conv1D)
    "plus_identity": (_minus_identity, _plus_identity),  # theirs = E + ours (the paper's W_j)
    "scalar": (_to_scalar, _from_scalar),  # theirs = ours at every entry (the paper's s1, s2)
}


@dataclass(frozen=True)
class Row:
    """One line of a weight table: ``theirs`` (a path from the foreign model) <-> ``ours``.

    ``attr``: a plain attribute (eps, a dropout rate), not a tensor. ``block=(i, k)``: ``ours``
    is the i-th of k equal row blocks of the tensor at that path. ``transform``: a name of
    ``TRANSFORMS``. ``absent``: for an attribute row, the value an attribute missing on their
    side stands for (0.0 where a library puts ``nn.Identity`` for a zero rate); None: it must
    exist. ``option``: the configuration option the value comes from, named in messages.
    """

    theirs: str
    ours: str
    attr: bool = False
    block: tuple[int, int] | None = None
    transform: str | None = None
    absent: float | None = None
    option: str | None = None

    def __post_init__(self) -> None:
        if self.transform is not None and self.transform not in TRANSFORMS:
            raise ValueError(f"transform must be one of {sorted(TRANSFORMS)}, got "
                             f"{self.transform!r}")
        if self.attr and (self.block is not None or self.transform is not None):
            raise ValueError(f"attribute row {self.theirs!r}: block and transform are for "
                             "tensors")


def prefixed(rows: Iterable[Row], theirs: str, ours: str) -> list[Row]:
    """``rows`` with ``theirs`` and ``ours`` put in front of the two names (a layer's table
    placed in the whole model)."""
    return [replace(r, theirs=theirs + r.theirs, ours=ours + r.ours) for r in rows]


def lookup(root: Any, path: str, default: Any = None) -> Any:
    """The object at the dotted attribute path ``path`` from ``root`` (``default`` if a part
    is missing)."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return default
    return obj


def copy_weight(dst: torch.Tensor | None, src: torch.Tensor | None, what: str) -> None:
    """dst <- src (no autograd), after checking both exist (or neither) and shapes agree.

    ``what`` names the weight in the error message.
    """
    if dst is None and src is None:
        return
    if dst is None or src is None:
        raise ValueError(f"{what}: present on one side only (a bias on one side and not the "
                         "other?)")
    if dst.shape != src.shape:
        raise ValueError(f"{what}: shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def _block(t: torch.Tensor | None, block: tuple[int, int] | None) -> torch.Tensor | None:
    if t is None or block is None:
        return t
    i, k = block
    size = t.shape[0] // k
    return t[i * size:(i + 1) * size]


def _copy_tensor(row: Row, theirs: Any, ours: Any, into: str) -> None:
    t = lookup(theirs, row.theirs)
    o = _block(lookup(ours, row.ours), row.block)
    src, dst, what = (t, o, row.theirs) if into == "ours" else (o, t, row.ours)
    if row.transform is not None and src is not None and dst is not None:
        fn = TRANSFORMS[row.transform][0 if into == "ours" else 1]
        try:
            with torch.no_grad():
                src = fn(src.detach(), dst)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
    copy_weight(dst, src, what)


def _plain(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _set(root: Any, path: str, value: Any) -> None:
    parent, _, name = path.rpartition(".")
    setattr(lookup(root, parent) if parent else root, name, value)


# the attribute an attribute row reads -> the module class that holds it
_HOLDERS = {"p": "nn.Dropout", "eps": "a normalisation layer (nn.LayerNorm, nn.BatchNorm2d)",
            "momentum": "nn.BatchNorm2d", "drop_prob": "a stochastic-depth module"}


def _where(path: str) -> str:
    """'layer n: ' (or 'stage s, layer n: ') when ``path`` lies in a control set theta^n."""
    m = re.search(r"(?:stages\.(\d+)\.)?.*?sets\.(\d+)\.", path)
    if not m:
        return ""
    stage = f"stage {m[1]}, " if m[1] is not None else ""
    return f"{stage}layer {m[2]}: "


def _missing_on_their_side(row: Row, theirs: Any) -> ValueError:
    parent, _, name = row.theirs.rpartition(".")
    holder = lookup(theirs, parent, _MISSING) if parent else theirs
    if parent and holder is not _MISSING and name in _HOLDERS:
        return ValueError(f"{parent} must be {_HOLDERS[name]} (the map reads its .{name}), got "
                          f"{type(holder).__name__}")
    return ValueError(f"{row.theirs}: no such attribute on their side")


def _copy_attr(row: Row, theirs: Any, ours: Any, into: str, check: bool,
               written: dict[str, tuple[Any, str]]) -> None:
    t = lookup(theirs, row.theirs, _MISSING)
    o = lookup(ours, row.ours, _MISSING)
    if o is _MISSING:
        raise ValueError(f"{row.ours}: no such attribute on our side (the table does not fit "
                         "the model)")
    if t is _MISSING:
        if row.absent is None:
            raise _missing_on_their_side(row, theirs)
        if into == "ours":
            t = row.absent
        elif o == row.absent:
            return
        else:
            raise ValueError(f"{row.ours}={o!r} has no place in the target ({row.theirs} is "
                             f"absent there, which stands for {row.absent!r})")
    if into == "ours":
        _set(ours, row.ours, _plain(t))
        return
    label = f" ({row.option})" if row.option else ""
    if check:
        if t != o:
            option = f"config option {row.option}" if row.option else "the source config"
            raise ValueError(
                f"{_where(row.ours)}{row.ours}={o!r} differs from {option}: the model rebuilt "
                f"from model.source has {row.theirs}={t!r}, and its config holds one value for "
                "every layer, so save_pretrained / from_pretrained would lose this one; set it "
                f"back, or edit model.source's config to match")
        return
    if row.theirs in written and written[row.theirs][0] != o:
        val, other = written[row.theirs]
        raise ValueError(f"{other}={val!r} and {row.ours}={o!r} both map to {row.theirs}"
                         f"{label}, which holds one value: they must agree")
    written[row.theirs] = (o, row.ours)
    _set(theirs, row.theirs, _plain(o))


def copy_table(rows: Iterable[Row], *, theirs: Any, ours: Any, into: str,
               attributes: str = "copy") -> None:
    """Copy every row of ``rows`` between the two models.

    ``into="ours"``: their tensors and attributes are written into ours (the forward map);
    ``into="theirs"``: ours into theirs (the inverse map). ``attributes="check"`` (with
    ``into="theirs"``) compares the attribute rows instead of writing them, raising ValueError
    on a difference: for a target rebuilt from a config that fixes those values.
    """
    if into not in ("ours", "theirs"):
        raise ValueError(f"into must be 'ours' or 'theirs', got {into!r}")
    if attributes not in ("copy", "check") or (attributes == "check" and into != "theirs"):
        raise ValueError(f"attributes must be 'copy' or (with into='theirs') 'check', got "
                         f"{attributes!r}")
    written: dict[str, tuple[Any, str]] = {}
    for row in rows:
        if row.attr:
            _copy_attr(row, theirs, ours, into, attributes == "check", written)
        else:
            _copy_tensor(row, theirs, ours, into)


def check_covered(keys: Iterable[str], rows: Iterable[Row], what: str,
                  ignore: Callable[[str], bool] = lambda key: False) -> None:
    """Raise ValueError naming the state-dict ``keys`` of a foreign model that no tensor row
    maps (and ``ignore`` does not excuse): a weight the map would drop."""
    mapped = {r.theirs for r in rows if not r.attr}
    extra = [k for k in keys if k not in mapped and not ignore(k)]
    if extra:
        raise ValueError(f"the model has weights the {what} map does not know: {extra[:5]}")


def source_field(source: Any, name: str, default: Any = None) -> Any:
    """Field ``name`` of a model's ``source`` (deprecated: read ``model.source.field(name,
    default)``, the declared ``models.base.Source``); a dict or None is read as
    ``keep_source`` keeps it."""
    return keep_source(source).field(name, default)


def network_scheme(evolution, schemes: dict, target: str, where: str = "") -> str:
    """Check that ``evolution`` is a network the target library can hold, and say which one.

    A network is tau = 1 (one step per layer), controls constant in time, and a scheme whose
    stages equal one of ``schemes`` (name -> Scheme); returns that name. ``target`` names the
    library in the error ("to_hf", ...), ``where`` the part of the model ("stage 2", ...).
    """
    at = f" in {where}" if where else ""
    if evolution.tau != 1.0:
        raise ValueError(f"{target} needs tau = 1 (one step per layer){at}, got "
                         f"tau={evolution.tau:g}: a refined evolution is not a network")
    if evolution.controls.interpolation != "constant":
        raise ValueError(f"{target} needs controls constant in time (the network){at}, got "
                         f"interpolation={evolution.controls.interpolation!r}")
    for name, scheme in schemes.items():
        if evolution.scheme.stages == scheme.stages:
            return name
    wanted = ", ".join(f"{n!r} [{s}]" for n, s in schemes.items())
    raise ValueError(f"{target} needs the scheme {wanted}{at}, got {evolution.scheme.name!r} "
                     f"[{evolution.scheme}]")


def check_softmax(evolution, target: str, names: Sequence[str] = ("attention", "cross_attention"),
                  scales: Sequence[float | None] | None = None) -> None:
    """Every attention operator of ``evolution`` uses the softmax kernel with the scale the
    target computes (``scales[n]`` for step n, default None = 1/sqrt(d_h))."""
    from ..operators.kernels import SoftmaxKernel

    for n, theta in enumerate(evolution.controls):
        want = None if scales is None else scales[n]
        for name in names:
            if name not in theta:
                continue
            k = theta[name].kernel
            if type(k) is not SoftmaxKernel or k.scale != want:
                scale = k.scale if k.takes_scale else None
                raise ValueError(f"{target} needs the softmax kernel with scale "
                                 f"{'1/sqrt(d_h)' if want is None else want} in step {n} "
                                 f"{name}, got {k!r} with scale {scale}")


_HOOKS = {
    "_forward_pre_hooks": "forward pre-hook",
    "_forward_hooks": "forward hook",
    "_backward_pre_hooks": "backward pre-hook",
    "_backward_hooks": "backward hook",
    "_state_dict_pre_hooks": "state-dict pre-hook",
    "_state_dict_hooks": "state-dict hook",
}  # load-state-dict hooks only act when loading into the foreign module: not refused


def check_no_hooks(module: Any, target: str) -> None:
    """Refuse (ValueError) a foreign module tree with registered hooks that change what it
    computes or saves: splitformer never calls the foreign module, so they would be dropped.
    ``target`` ("from_torch", "from_hf", "from_timm") names the map in the error."""
    from torch.nn.modules import module as torch_module

    for attr, label in _HOOKS.items():  # global hooks (register_module_forward_hook, ...)
        if getattr(torch_module, f"_global{attr}", None):
            raise ValueError(f"{target} cannot carry global {label}s (registered for every "
                             "module with torch.nn.modules.module.register_module_*): "
                             "splitformer never calls the source module; remove them first")
    for path, mod in module.named_modules():
        if "parametrizations" in path.split("."):
            continue
        for attr, label in _HOOKS.items():
            hooks = getattr(mod, attr, None)
            if hooks:
                raise ValueError(f"{target} cannot carry the {label}s registered on "
                                 f"{path or 'the module'} ({type(mod).__name__}, {len(hooks)}): "
                                 "splitformer never calls the source module, so they would be "
                                 "dropped; remove them first")

