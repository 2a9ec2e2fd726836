"""The model under study and its inputs, as ``splitformer analyze`` (and every command that
takes MODEL) sees them: a ``Subject`` (``subjects.subject``) resolved from MODEL (a built-in
name, a ``splitformer.save`` or training-run folder, a local Hugging Face folder:
``subjects.resolve.load_subject``, ``subjects.hf``) and the inputs prepared for it
(``subjects.inputs.model_inputs``, images through ``subjects.images``).

This package sits above ``training`` (it reads run folders, checkpoints and data sets) and below
``commands``; the diagnostics in ``analysis`` see only a model and a tensor.
"""

from .inputs import model_inputs
from .resolve import BUILTINS, load_subject
from .subject import Encoded, ImageSpec, InputError, Notes, Subject, source_facts

__all__ = ["BUILTINS", "Encoded", "ImageSpec", "InputError", "Notes", "Subject", "load_subject",
           "model_inputs", "source_facts"]
