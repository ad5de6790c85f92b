"""Privacy–utility evaluation of gazeguard's mechanisms (``gazeguard eval``).

Read in data-flow order: :mod:`~gazeguard.eval.datasets` (recordings → cached feature tables),
:mod:`~gazeguard.eval.grid` (mechanisms and ε), :mod:`~gazeguard.eval.harness` (per-recording
release, utility, one configuration), :mod:`~gazeguard.eval.releases` (dataset-release rows),
:mod:`~gazeguard.eval.attacks` (classifiers and protocols), :mod:`~gazeguard.eval.metrics`,
:mod:`~gazeguard.eval.correlation`, :mod:`~gazeguard.eval.runner` (the grid, in parallel) and
:mod:`~gazeguard.eval.report` (JSON, Markdown, PNG).
"""

from gazeguard.eval.attacks import CLASSIFIERS, Scores, reidentification, task_recognition
from gazeguard.eval.datasets import (
    CsvGaze,
    Dataset,
    GazeGraph,
    Irf,
    Recording,
    Synthetic,
    TableDataset,
    open_dataset,
)
from gazeguard.eval.grid import MechanismSpec, parse_mechanism
from gazeguard.eval.harness import (
    EvalSettings,
    FeatureBounds,
    evaluate_configuration,
    release_table,
)
from gazeguard.eval.metrics import majority_vote_accuracy, nmse, user_level_epsilon, utility
from gazeguard.eval.runner import GridConfig, best_configuration, evaluate_dataset

__all__ = [
    "CLASSIFIERS",
    "CsvGaze",
    "Dataset",
    "EvalSettings",
    "FeatureBounds",
    "GazeGraph",
    "GridConfig",
    "Irf",
    "MechanismSpec",
    "Recording",
    "Scores",
    "Synthetic",
    "TableDataset",
    "best_configuration",
    "evaluate_configuration",
    "evaluate_dataset",
    "majority_vote_accuracy",
    "nmse",
    "open_dataset",
    "parse_mechanism",
    "reidentification",
    "release_table",
    "task_recognition",
    "user_level_epsilon",
    "utility",
]
