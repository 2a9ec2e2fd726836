"""splitformer: Transformers as operator-splitting discretisations of an integro-differential
equation in token index x, feature index y and depth t (Tai, Liu, Li, Chan 2026).

The public names are imported on first use (PEP 562), so that ``import splitformer.cli`` (the
command's entry point) does not import torch before the command can answer Ctrl-C on one line.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import pkgutil as _pkgutil
import typing as _typing

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    "load": "splitformer.compression.store",
    "from_hf": "splitformer.interop",
    "from_timm": "splitformer.interop",
    "from_torch": "splitformer.interop",
    "to_hf": "splitformer.interop",
    "to_timm": "splitformer.interop",
    "to_torch": "splitformer.interop",
    "CausalDecoderModel": "splitformer.models",
    "CausalLM": "splitformer.models",
    "CrossDecoder": "splitformer.models",
    "Encoder": "splitformer.models",
    "EncoderDecoderModel": "splitformer.models",
    "ViT": "splitformer.models",
    "network_encoder": "splitformer.models",
    "paper_encoder": "splitformer.models",
    "Context": "splitformer.operators",
    "Controls": "splitformer.time",
    "Evolution": "splitformer.time",
    "Scheme": "splitformer.time",
    "Stage": "splitformer.time",
    "TimeGrid": "splitformer.time",
    "Trajectory": "splitformer.time",
}
_RENAMED: dict[str, tuple[str, str]] = {
    "save": ("splitformer.training.checkpoints", "save_model"),
}
__all__ = [  # every key of _PUBLIC and _RENAMED (tests/test_cli.py)
    "CausalDecoderModel",
    "CausalLM",
    "Context",
    "Controls",
    "CrossDecoder",
    "Encoder",
    "EncoderDecoderModel",
    "Evolution",
    "Scheme",
    "Stage",
    "TimeGrid",
    "Trajectory",
    "ViT",
    "from_hf",
    "from_timm",
    "from_torch",
    "load",
    "network_encoder",
    "paper_encoder",
    "save",
    "to_hf",
    "to_timm",
    "to_torch",
]


def __getattr__(name: str):
    """The public name ``name``, imported from its module on first use and kept; a subpackage
    or module of splitformer (``splitformer.analysis``) is imported as ``import splitformer.X``
    would."""
    if name in _PUBLIC:
        value = getattr(_importlib.import_module(_PUBLIC[name]), name)
    elif name in _RENAMED:
        module, attribute = _RENAMED[name]
        value = getattr(_importlib.import_module(module), attribute)
    elif (name.isidentifier() and not name.startswith("_")
          and _importlib_util.find_spec(f"{__name__}.{name}")):
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'splitformer' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, and the package's modules that are not the command line."""
    modules = {m.name for m in _pkgutil.iter_modules(__path__)} - {"__main__", "cli", "commands"}
    return sorted({"__version__", *__all__, *modules})


if _typing.TYPE_CHECKING:  # what type checkers and IDEs read
    from .compression.store import load
    from .interop import from_hf, from_timm, from_torch, to_hf, to_timm, to_torch
    from .models import (
        CausalDecoderModel,
        CausalLM,
        CrossDecoder,
        Encoder,
        EncoderDecoderModel,
        ViT,
        network_encoder,
        paper_encoder,
    )
    from .operators import Context
    from .time import Controls, Evolution, Scheme, Stage, TimeGrid, Trajectory
    from .training.checkpoints import save_model as save
