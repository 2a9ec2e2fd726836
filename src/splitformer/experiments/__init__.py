"""Experiments: sweeps of training runs, their tables and figures (docs/results.md).

    sweep = Sweep.from_toml("experiments/schemes-digits.toml")
    results = run_sweep(sweep, "results/schemes-digits")       # resumable; results.jsonl
    rows = summarise(results)                                   # mean +- std over seeds
    print(markdown(rows))
"""

from .evaluation import Evaluation
from .sweep import (
    Run,
    RunError,
    Sweep,
    SweepError,
    finished,
    read_results,
    run_sweep,
    train_command,
)
from .table import markdown, summarise, tie

__all__ = [
    "Evaluation",
    "Run",
    "RunError",
    "Sweep",
    "SweepError",
    "finished",
    "markdown",
    "read_results",
    "run_sweep",
    "summarise",
    "tie",
    "train_command",
]
