"""Training is optimal control: data, model families, the fit loop, checkpoints
(docs/training.md)."""

from .config import ConfigError, TrainConfig
from .data import DATASETS, Dataset, DatasetError, Split, load_dataset
from .families import FAMILIES, build_model
from .loop import FitResult, TrainingError, fit

__all__ = [
    "DATASETS",
    "FAMILIES",
    "ConfigError",
    "Dataset",
    "DatasetError",
    "Split",
    "TrainConfig",
    "FitResult",
    "TrainingError",
    "build_model",
    "fit",
    "load_dataset",
]
