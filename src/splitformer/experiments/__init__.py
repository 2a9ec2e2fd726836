"""Experiments: sweeps of training runs, their tables and figures (docs/results.md).

    sweep = Sweep.from_toml("experiments/a-schemes-digits.toml")
    results = run_sweep(sweep, "results/a-schemes-digits")     # resumable; results.jsonl
    rows = summarise(results)                                   # mean +- std over seeds
    print(markdown(rows))
"""

from .evaluation import Evaluation
from .sweep import Run, Sweep, SweepError, read_results, run_sweep, train_command
from .table import markdown, summarise, tie

__all__ = [
    "Evaluation",
    "Run",
    "Sweep",
    "SweepError",
    "markdown",
    "read_results",
    "run_sweep",
    "summarise",
    "tie",
    "train_command",
]
