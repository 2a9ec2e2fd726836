"""What a model made by ``from_hf`` is, as data: the record ``splitformer.save`` keeps in
model.json beside its parameters, and the model ``splitformer.load`` rebuilds from it.

A model read from transformers is its family's base model (``interop.families``: the record's
``store`` kind and ``stored()`` / ``rebuild()``, the typed config kept as ``model.source``)
with what was done to it since: another scheme, another time grid, fewer steps, smooth
controls, other kernels, token merging. Those are data, recorded as they are now (not as a
history of calls), each in a form that reads as it prints::

    "source":     {"kind": "hf-bert", "source": {...}}     the family's store record
    "evolutions": [                                        one per evolution (evolution_owners)
      {"owner": "",                                        the module that owns it ("" the model)
       "scheme": {"named": true, "name": "strang", "options": {"integrator": "heun",
                  "form": "raw"}, "text": "ffn:heun*0.5 norm2:project attention:heun ..."},
                 (or {"named": false, "name": ..., "text": ..., "description": ...,
                  "order": ..., "meta": ...}: a scheme string, parsed back)
       "grid": {"T": 6.0, "num_steps": 12, "tau": 0.5},
       "controls": {"interpolation": "linear", "sets": 5},
       "drop_steps": [3],                                  base steps it does not run
       "adjoint": "backprop", "validate": false,
       "merging": null or {"r": 2, "metric": "keys", "where": "attention",
                           "proportional": true, "protect": 1, "unmerge": true}}],
    "kernels":    [{"kernel": "gaussian", "options": {"scale": null},
                    "operators": ["evolution.controls.sets.0.attention", ...]}, ...]
    "rotary":     {"rope": {"dim": 64, "base": 100000.0, "rope_type": "bandwidth",  only when
                            "parameters": {"rope_type": "bandwidth", ...},          with_rope
                            "max_position_embeddings": 32768, "head_dim": 64}}     changed it

(the kernel of every attention operator, operators with one kernel grouped; a kernel without
a score scale, e.g. linear, also records the operator's own ``operator_scale``, which it keeps
for a softmax put back). ``drop_steps`` names base steps of the same structure as the ones left
out: which of several equal steps were dropped is not recoverable from the model, and need not
be, since every parameter is the saved one (and each kernel, with its scale, is recorded).

``record_of(model)`` makes the record and then proves it: it rebuilds the model from the
record (on the meta device: structure only, no memory) and compares the two module by module
(classes, every attribute, parameter and buffer names, shapes and dtypes, the values of the
buffers that are not saved); anything the record cannot hold exactly (a user-written kernel,
operator or scheme class, superposed steps, a replaced module, an edited eps) is refused with
a ValueError naming it. Never an approximation. ``rebuild(doc, path, dtype)`` is the inverse:
the base model from its source (random weights drawn under a forked RNG, nothing downloaded),
the evolutions and kernels applied; the caller loads the saved parameters and
``check(model, doc, path)`` compares what it rebuilt with the record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["check", "family_of", "rebuild", "record_of"]

_MODULE_INTERNALS = frozenset(nn.Module().__dict__) | {"training"}
# not the model's own: Evolution's compiled steps (rebuilt on demand), torch.compile's marks
_CACHES = frozenset({"_plans", "_is_torch_compile", "_compiled_call_impl",
                     "tokenizer"})  # the text's tokenizer (a GGUF's): saved beside, not a control


# -- which models ------------------------------------------------------------------------------
def family_of(model: Any):
    """The family record (``interop.families``, one with a ``store`` kind) whose typed source
    ``model.source`` is, or None."""
    from ..interop.families import stored

    source = getattr(model, "source", None)
    for record in stored():
        if isinstance(source, record.source_type()):
            return record
    return None


def stored_labels() -> str:
    """"BERT, ViT, CvT or GPT-2": the families whose models save records (for messages)."""
    from ..interop.families import stored

    labels = [f.label for f in stored()]
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} or {labels[-1]}"


# -- the record ----------------------------------------------------------------------------
def record_of(model: nn.Module) -> dict[str, Any]:
    """The record of a model of a stored family (module doc): the JSON parts of model.json
    ("source", "evolutions", "kernels"), with the source in the tagged JSON of the checkpoint
    format (non-str keys and tuples come back as they were). ValueError naming what cannot be
    recorded, or what the record would rebuild differently."""
    from .checkpoint_format import _encode

    family = family_of(model)
    if family is None:
        raise ValueError(f"model.source is a {type(model.source).__name__}, not the source of a "
                         f"family with a store record ({stored_labels()})")
    name = type(model).__name__
    base_record = family.stored(model.source)
    dtype = _single_dtype(model)
    base = _build(family, base_record, "meta", dtype)
    if type(base) is not type(model):
        raise ValueError(f"its source rebuilds a {type(base).__name__}, not a {name}")
    evolutions = _describe_evolutions(model, base)
    kernels = _describe_kernels(model)
    try:
        source = _encode(base_record, "model.source", [], None)
    except TypeError as e:
        raise ValueError(str(e)) from None
    doc = {"source": source, "evolutions": evolutions, "kernels": kernels}
    rotary = _describe_rotary(model, base)
    if rotary is not None:
        doc["rotary"] = rotary
    try:
        rebuilt = _applied(base, evolutions, kernels, rotary)
        meta = _has_meta_values(rebuilt)  # a buffer that is not saved: compare its values
    except Exception:  # noqa: BLE001 - what fails on the meta device is tried for real
        meta = True
    if meta:
        try:
            rebuilt = _applied(_build(family, base_record, "cpu", dtype), evolutions, kernels,
                               rotary)
        except Exception as e:  # noqa: BLE001 - named in the refusal
            raise ValueError(f"its record does not rebuild ({type(e).__name__}: {e})") from None
    differences = _differences(model, rebuilt)
    if not differences and not _runs(rebuilt, evolutions, kernels):
        differences = ["its evolutions or kernels do not rebuild as recorded"]
    if differences:
        raise ValueError(f"it differs from what its record rebuilds: "
                         f"{'; '.join(differences[:4])}"
                         f"{'; ...' if len(differences) > 4 else ''}. What model.json records "
                         "(the family's source, each evolution's scheme, grid, controls and "
                         "merging, the kernels) rebuilds a different model, so it was changed in "
                         "a way the record cannot hold (a replaced or user-written module, an "
                         "edited attribute); refused rather than saved approximately")
    return doc


def rebuild(doc: Mapping[str, Any], path: Path, dtype: torch.dtype | None = None) -> nn.Module:
    """The model ``doc`` (model.json's content) records, with random weights drawn under a
    forked RNG (the global one is untouched): the family's base model, then its evolutions
    and kernels. ``dtype``: the floating dtype to build in. ``CheckpointError`` naming
    ``path`` when the record does not rebuild."""
    from ..interop.families import family_of_store, stored
    from .checkpoint_format import CheckpointError, _decode

    source = _decode(doc["source"], {}, set(), path, None)
    kind = source.get("kind") if isinstance(source, dict) else None
    family = family_of_store(kind) if isinstance(kind, str) else None
    if family is None:
        kinds = ", ".join(repr(f.store) for f in stored())
        raise CheckpointError(f"{path}: 'source' kind {kind!r} is not a stored family's "
                              f"({kinds})")
    try:
        base = _build(family, source, "cpu", dtype)
        return _applied(base, doc["evolutions"], doc["kernels"], doc.get("rotary"))
    except Exception as e:
        raise CheckpointError(f"{path}: the model it records does not rebuild: "
                              f"{type(e).__name__}: {e}") from None


def check(model: nn.Module, doc: Mapping[str, Any], path: Path) -> None:
    """``CheckpointError`` naming ``path`` unless ``model`` (rebuilt from ``doc``) runs the
    schemes, grids, controls, merging and kernels ``doc`` records."""
    from .checkpoint_format import CheckpointError

    if not _runs(model, doc["evolutions"], doc["kernels"]):
        raise CheckpointError(f"{path}: the model rebuilt from it does not run what it records "
                              "(its evolutions or kernels differ: written by another version "
                              "of splitformer, or edited)")


def _runs(model: nn.Module, evolutions: list[dict], kernels: list[dict]) -> bool:
    """Whether ``model`` runs the recorded evolutions and kernels (``drop_steps`` aside: it
    says how the model was rebuilt, not what it runs)."""
    def plain(records):
        return [{k: v for k, v in e.items() if k != "drop_steps"} for e in records]

    return plain(_describe_evolutions(model, None)) == plain(evolutions) and \
        _describe_kernels(model) == kernels


# -- building --------------------------------------------------------------------------------
def _single_dtype(model: nn.Module) -> torch.dtype | None:
    floating = {t.dtype for t in model.state_dict().values()
                if isinstance(t, torch.Tensor) and t.is_floating_point()}
    return floating.pop() if len(floating) == 1 else None


def _build(family, record: Mapping[str, Any], device: str, dtype: torch.dtype | None):
    """The family's base model of ``record``: random weights under a forked RNG; on ``device``
    ("meta": structure only), in ``dtype``. Warnings are the caller's, seen when it was made."""
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return family.rebuild(record, device=device, dtype=dtype)
        except Exception:
            if device != "meta":
                raise
            return family.rebuild(record, device="cpu", dtype=dtype)


def _describe_rotary(model: nn.Module, base: nn.Module) -> dict[str, Any] | None:
    """The rotary kernels of a model whose ``with_rope`` changed them from its base's
    (``RotaryPositions.record``), else None."""
    rotary = vars(model).get("rotary")
    if not rotary or rotary == vars(base).get("rotary"):
        return None
    return {name: r.record() for name, r in rotary.items()}


def _applied(model: nn.Module, evolutions: list[dict], kernels: list[dict],
             rotary: Mapping[str, Any] | None = None) -> nn.Module:
    """``model`` (a base model, changed in place) running the recorded evolutions and
    kernels, and reading the recorded rotary kernels (``with_rope``) when there are some."""
    with warnings.catch_warnings():  # the saved model's own warnings were seen when it was made
        warnings.simplefilter("ignore")
        owners = model.evolution_owners()
        if len(owners) != len(evolutions):
            raise ValueError(f"the record has {len(evolutions)} evolutions, the model "
                             f"{len(owners)}")
        paths = _owner_paths(model)
        for owner, rec in zip(owners, evolutions, strict=True):
            if paths[id(owner)] != rec["owner"]:
                raise ValueError(f"evolution of {rec['owner']!r} recorded, the model's is "
                                 f"{paths[id(owner)]!r}")
            owner.evolution = _evolution_from(owner.evolution, rec)
        for entry in kernels:
            for path in entry["operators"]:
                _install(model.get_submodule(path), entry)
        if rotary is not None:
            from ..operators.rope import RotaryPositions

            if set(rotary) != set(vars(model).get("rotary") or {}):
                raise ValueError(f"the record's rotary kernels {sorted(rotary)} are not the "
                                 f"model's {sorted(vars(model).get('rotary') or {})}")
            model.rotary = {name: RotaryPositions.from_record(rec)
                            for name, rec in rotary.items()}
    return model


def _owner_paths(model: nn.Module) -> dict[int, str]:
    return {id(m): p for p, m in model.named_modules()}


def _evolution_from(evo, rec: Mapping[str, Any]):
    """The base evolution ``evo`` changed into the recorded one, by its own methods."""
    from ..operators.merging import TokenMerging

    if rec["drop_steps"]:
        evo = evo.drop_steps(list(rec["drop_steps"]))
    interpolation = rec["controls"]["interpolation"]
    if interpolation != evo.controls.interpolation:
        evo = evo.with_controls_in_time(interpolation)
    evo = evo.with_scheme(_scheme_from(rec["scheme"], evo))
    n, steps = len(evo.controls), int(rec["grid"]["num_steps"])
    g = math.gcd(n, steps)
    if steps // g > 1:
        evo = evo.refine(steps // g)
    if n // g > 1:
        evo = evo.coarsen(n // g)
    if rec["adjoint"] != evo.adjoint.name:
        evo = evo.with_adjoint(rec["adjoint"])
    if rec["merging"] is not None:
        merging = dict(rec["merging"])
        if isinstance(merging["r"], list):
            merging["r"] = tuple(merging["r"])
        evo = evo.with_token_merging(TokenMerging(**merging))
    evo.validate = bool(rec["validate"])
    return evo


# -- evolutions ------------------------------------------------------------------------------
def _describe_evolutions(model: nn.Module, base: nn.Module | None) -> list[dict[str, Any]]:
    """One record per evolution of ``model``; with ``base`` (its family's base model), the
    base steps each does not run (``drop_steps``)."""
    from ..time.adjoints import ADJOINTS

    owners = model.evolution_owners()
    paths = _owner_paths(model)
    base_owners = base.evolution_owners() if base is not None else [None] * len(owners)
    if len(base_owners) != len(owners):
        raise ValueError(f"{type(model).__name__} runs {len(owners)} evolutions, its source "
                         f"builds {len(base_owners)}")
    out = []
    for owner, base_owner in zip(owners, base_owners, strict=True):
        where = paths[id(owner)]
        evo = owner.evolution
        label = f"the evolution of {where!r}" if where else "the evolution"
        if evo.superposed_steps:
            raise ValueError(f"{label} superposes steps {evo.superposed_steps} "
                             "(parallel_steps), which splitformer.save does not record (a "
                             "compression folder of `splitformer compress --method parallel` "
                             "does); refused")
        rec: dict[str, Any] = {"owner": where}
        rec["scheme"] = _describe_scheme(evo.scheme, evo.layout, label)
        rec["grid"] = {"T": evo.grid.T, "num_steps": evo.grid.num_steps, "tau": evo.tau}
        rec["controls"] = {"interpolation": evo.controls.interpolation,
                           "sets": len(evo.controls)}
        if base_owner is not None:
            rec["drop_steps"] = _dropped(evo, base_owner.evolution, label, where)
        adjoint = evo.adjoint
        if type(adjoint) is not ADJOINTS.get(adjoint.name) or \
                ADJOINTS[adjoint.name]() != adjoint:
            raise ValueError(f"{label} computes gradients with a {type(adjoint).__name__}, "
                             f"not one of the named adjoints {sorted(ADJOINTS)}: a user-written "
                             "adjoint cannot be recorded; refused")
        rec["adjoint"] = adjoint.name
        rec["validate"] = evo.validate
        merging = evo.merging
        if merging is not None:
            merging = dataclasses.asdict(merging)
            if isinstance(merging["r"], tuple):
                merging["r"] = list(merging["r"])
        rec["merging"] = merging
        out.append(rec)
    return out


def _describe_scheme(scheme, layout, label: str) -> dict[str, Any]:
    """A scheme as data: a name with its options when it is that named scheme on the
    evolution's layout, else its string form (with its name, description, order and meta),
    which must parse back to the same scheme. ValueError naming it otherwise."""
    from ..time.schemes import SCHEMES, Scheme, resolve

    text = str(scheme)
    builder = SCHEMES.get(scheme.name)
    if builder is not None and layout is not None:
        keys = list(inspect.signature(builder).parameters)[1:]
        options = {k: scheme.meta[k] for k in keys if k in scheme.meta}
        try:
            named = resolve(scheme.name, layout, **options)
        except (TypeError, ValueError):
            named = None
        if named is not None and _same_scheme(named, scheme):
            return {"named": True, "name": scheme.name, "options": options, "text": text}
    if type(scheme) is not Scheme:
        raise ValueError(f"{label} runs a {type(scheme).__name__} ({scheme.name!r} [{text}]), "
                         "a scheme class with a step of its own that is not the named scheme "
                         "on this model's layout: only stage lists (and the named schemes) "
                         "are recorded; refused")
    meta = _meta_to_json(scheme.meta, label)
    rec = {"named": False, "name": scheme.name, "text": text,
           "description": scheme.description, "order": scheme.order, "meta": meta}
    try:
        back = _custom_scheme(rec)
    except (TypeError, ValueError) as e:
        back, why = None, str(e)
    else:
        why = "it parses back to another scheme"
    if back is None or not _same_scheme(back, scheme):
        raise ValueError(f"{label} runs the scheme {scheme.name!r} [{text}], whose printed "
                         f"form does not parse back to it exactly ({why}); refused")
    return rec


def _scheme_from(rec: Mapping[str, Any], evo):
    from ..time.schemes import resolve

    if rec["named"]:
        return resolve(rec["name"], evo.layout, **rec["options"])
    return _custom_scheme(rec)


def _custom_scheme(rec: Mapping[str, Any]):
    from ..time.schemes import Scheme, scheme_from_string

    parsed = scheme_from_string(rec["text"])
    return Scheme(parsed.stages, name=rec["name"], description=rec["description"],
                  order=rec["order"], meta=_meta_from_json(rec["meta"]))


def _same_scheme(a, b) -> bool:
    return type(a) is type(b) and a == b and a.meta == b.meta


def _meta_to_json(meta: Mapping[str, Any], label: str) -> dict[str, Any]:
    """A scheme's meta (integrator, form, the layout of Field values) as JSON."""
    from ..time.schemes import Field

    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "layout" and isinstance(value, tuple) and all(isinstance(f, Field)
                                                              for f in value):
            out[key] = [{"operator": f.operator, "pre": list(f.pre), "post": list(f.post),
                         "projection": f.projection} for f in value]
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            raise ValueError(f"{label}: its scheme's meta[{key!r}] is a "
                             f"{type(value).__name__}, which cannot be recorded; refused")
    return out


def _meta_from_json(meta: Mapping[str, Any]) -> dict[str, Any]:
    from ..time.schemes import Field

    out = dict(meta)
    if "layout" in out:
        out["layout"] = tuple(Field(f["operator"], tuple(f["pre"]), tuple(f["post"]),
                                    f["projection"]) for f in out["layout"])
    return out


def _dropped(evo, base_evo, label: str, where: str) -> list[int]:
    """The base steps whose control sets ``evo`` does not hold: ``evo``'s control sets matched
    in order to base sets of the same structure (kernels aside: they are recorded apart).
    ``where``: the path of the evolution's owner (for messages)."""
    ours = [repr(_structure(theta, kernels=False)) for theta in evo.controls]
    theirs = [repr(_structure(theta, kernels=False)) for theta in base_evo.controls]
    if len(ours) > len(theirs):
        raise ValueError(f"{label} holds {len(ours)} control sets, more than the "
                         f"{len(theirs)} of the base model its source builds (new control "
                         "sets, e.g. as_network of a refined model), which cannot be rebuilt "
                         "from it; refused")
    keep, i = [], 0
    for j, sig in enumerate(ours):
        while i < len(theirs) and theirs[i] != sig:
            i += 1
        if i == len(theirs):
            near = min(keep[-1] + 1 if keep else 0, len(theirs) - 1)
            prefix = f"{where}.evolution.controls.sets.{j}" if where else \
                f"evolution.controls.sets.{j}"
            diffs = _differences(evo.controls[j], base_evo.controls[near], kernels=False,
                                 prefix=prefix)
            raise ValueError(f"{label}: its control set {j} (of {len(ours)}) is like no "
                             f"remaining control set of the base model its source builds: "
                             f"{'; '.join(diffs[:3])}{'; ...' if len(diffs) > 3 else ''} "
                             "(a replaced or user-written module, an edited attribute); "
                             "refused")
        keep.append(i)
        i += 1
    return [i for i in range(len(theirs)) if i not in keep]


# -- kernels -----------------------------------------------------------------------------------
def _describe_kernels(model: nn.Module) -> list[dict[str, Any]]:
    """The kernel of every attention operator, operators with the same kernel grouped (in
    module order). ValueError naming an operator whose kernel cannot be recorded."""
    from ..operators.attention import AttentionOperator

    groups: list[dict[str, Any]] = []
    for path, op in model.named_modules():
        if not isinstance(op, AttentionOperator):
            continue
        entry = _kernel_entry(path, op)
        for g in groups:
            if {k: v for k, v in g.items() if k != "operators"} == entry:
                g["operators"].append(path)
                break
        else:
            groups.append({**entry, "operators": [path]})
    return groups


def _kernel_entry(path: str, op) -> dict[str, Any]:
    from ..operators.kernel import KernelSite
    from ..operators.kernels import KERNELS

    kernel = op.kernel
    cls = KERNELS.get(getattr(kernel, "name", None))
    if cls is None or type(kernel) is not cls:
        raise ValueError(f"the kernel of {path!r} is a {type(kernel).__qualname__}, not one of "
                         f"splitformer's kernels ({', '.join(sorted(KERNELS))}): a "
                         "user-written kernel cannot be recorded exactly; refused")
    site = set(getattr(KernelSite, "__annotations__", {}))  # what for_operator reads off op
    params = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self" and p.name not in site
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    options: dict[str, Any] = {}
    tensors: dict[str, list] = {}
    for p in params:
        if not hasattr(kernel, p.name):
            raise ValueError(f"the {kernel.name} kernel of {path!r} does not keep its option "
                             f"{p.name!r}, so it cannot be recorded; refused")
        value = getattr(kernel, p.name)
        if isinstance(value, torch.Tensor):
            tensors[p.name] = value.detach().to("cpu", torch.float64).tolist()
        elif value is None or isinstance(value, (bool, int, float, str)):
            options[p.name] = value
        else:
            raise ValueError(f"the {kernel.name} kernel of {path!r} has option {p.name!r} = "
                             f"{type(value).__name__}, which cannot be recorded; refused")
    if tensors:  # recorded only where they differ from what the kernel makes without them
        plain = cls.for_operator(op, **options)
        for name, values in tensors.items():
            mine = getattr(plain, name)
            if not (isinstance(mine, torch.Tensor)
                    and mine.to("cpu", torch.float64).tolist() == values):
                options[name] = values
    entry: dict[str, Any] = {"kernel": kernel.name, "options": options}
    if not cls.takes_scale:
        entry["operator_scale"] = op.scale
    rebuilt = _kernel_from(entry, op)
    if _attributes(rebuilt) != _attributes(kernel) or _buffer_values(rebuilt) != \
            _buffer_values(kernel):
        raise ValueError(f"the {kernel.name} kernel of {path!r} ({kernel!r}) does not rebuild "
                         "exactly from its options; refused")
    return entry


def _kernel_from(entry: Mapping[str, Any], op):
    from ..operators.kernels import KERNELS

    return KERNELS[entry["kernel"]].for_operator(op, **entry["options"])


def _install(op, entry: Mapping[str, Any]) -> None:
    kernel = _kernel_from(entry, op)
    kernel.check_operator(op)
    op.install_kernel(kernel)
    if "operator_scale" in entry:
        op.scale = entry["operator_scale"]


# -- comparing two models ----------------------------------------------------------------------
def _qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _value(v: Any) -> Any:
    """An attribute as a comparable value: tensors by dtype, shape and content, schemes with
    their meta, everything else by its repr (exact for floats; both models live here)."""
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), tuple(v.shape), _digest(v))
    return repr(v) + (repr(v.meta) if hasattr(v, "meta") and hasattr(v, "stages") else "")


def _digest(t: torch.Tensor) -> str:
    if t.device.type == "meta":
        return "meta"
    return hashlib.sha256(t.detach().to("cpu", torch.float64).contiguous().numpy().tobytes()
                          ).hexdigest()


def _attributes(m: nn.Module, skip: set[str] = frozenset()) -> dict[str, Any]:
    return {k: _value(v) for k, v in vars(m).items()
            if k not in _MODULE_INTERNALS and k not in _CACHES and k not in skip}


def _buffer_values(m: nn.Module) -> dict[str, Any]:
    return {n: _digest(b) for n, b in m.named_buffers() if b is not None}


def _has_meta_values(model: nn.Module) -> bool:
    return any(b is not None and b.device.type == "meta" for m in model.modules()
               for n, b in m.named_buffers(recurse=False) if n in m._non_persistent_buffers_set)


def _structure(model: nn.Module, kernels: bool = True) -> dict[str, tuple]:
    """Every module of ``model`` (shared ones at each of their paths): its class, attributes,
    parameters and buffers (names, shapes, dtypes; the values of buffers that are not saved).
    ``kernels=False``: without the kernels and the attention operators' scale (what a control
    set is apart from its kernels, which are recorded apart)."""
    from ..operators.attention import AttentionOperator
    from ..operators.kernel import Kernel

    out = {}
    under_kernel: list[str] = []
    for path, m in model.named_modules(remove_duplicate=False):
        if not kernels and (isinstance(m, Kernel) or any(
                path.startswith(k + ".") for k in under_kernel)):
            under_kernel.append(path)
            continue
        skip = {"scale"} if not kernels and isinstance(m, AttentionOperator) else set()
        params = {n: (tuple(t.shape), str(t.dtype)) for n, t in m.named_parameters(recurse=False)}
        buffers = {}
        for n, b in m.named_buffers(recurse=False):
            if b is None:
                continue
            if n in m._non_persistent_buffers_set:  # not in model.safetensors: the values count
                buffers[n] = ("not saved", tuple(b.shape), _digest(b))
            else:
                buffers[n] = (tuple(b.shape), str(b.dtype))
        out[path] = (_qualname(m), _attributes(m, skip), params, buffers)
    return out


def _differences(model: nn.Module, rebuilt: nn.Module, kernels: bool = True,
                 prefix: str = "") -> list[str]:
    """What differs between ``model`` and the model its record rebuilds, module by module
    (``kernels``: as ``_structure``; ``prefix``: the path of ``model`` in messages)."""
    ours, theirs = _structure(model, kernels), _structure(rebuilt, kernels)
    out = []
    for path in [*ours, *(p for p in theirs if p not in ours)]:
        where = repr(_dotted(prefix, path) if path else prefix)
        if path not in theirs:
            out.append(f"{where} ({ours[path][0].rsplit('.', 1)[-1]}) is not in what the "
                       "record rebuilds")
            continue
        if path not in ours:
            out.append(f"the record rebuilds {where} ({theirs[path][0].rsplit('.', 1)[-1]}), "
                       "which the model does not have")
            continue
        (cls, attrs, params, buffers), (cls2, attrs2, params2, buffers2) = ours[path], \
            theirs[path]
        if cls != cls2:
            out.append(f"{where} is a {cls.rsplit('.', 1)[-1]}, the record rebuilds a "
                       f"{cls2.rsplit('.', 1)[-1]}")
            continue
        full = _dotted(prefix, path)
        for key in sorted(set(attrs) | set(attrs2)):
            if attrs.get(key) != attrs2.get(key):
                out.append(f"{_dotted(full, key)!r} is {_short(attrs.get(key))}, the record "
                           f"rebuilds {_short(attrs2.get(key))}")
        for kind, a, b in (("parameter", params, params2), ("buffer", buffers, buffers2)):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    out.append(f"{kind} {_dotted(full, key)!r} is {a.get(key)}, the record "
                               f"rebuilds {b.get(key)}")
    return out


def _dotted(path: str, key: str) -> str:
    return f"{path}.{key}" if path and key else path or key


def _short(v: Any) -> str:
    text = str(v)
    return text if len(text) <= 80 else text[:77] + "..."
