"""Privacy–utility evaluation of gazeguard's mechanisms (``gazeguard eval``).

Read in data-flow order: :mod:`~gazeguard.offline.eval.datasets` (recordings → cached feature
tables),
:mod:`~gazeguard.offline.eval.grid` (mechanisms and ε), :mod:`~gazeguard.offline.eval.harness`
(per-recording
release, utility, one configuration), :mod:`~gazeguard.offline.eval.releases` (dataset-release
rows),
:mod:`~gazeguard.offline.eval.attacks` (classifiers and protocols),
:mod:`~gazeguard.offline.eval.metrics`,
:mod:`~gazeguard.offline.eval.correlation`, :mod:`~gazeguard.offline.eval.runner` (the grid, in
parallel) and
:mod:`~gazeguard.offline.eval.report` (JSON, Markdown, PNG).
"""

from gazeguard.offline.eval.attacks import CLASSIFIERS, Scores, reidentification, task_recognition
from gazeguard.offline.eval.datasets import (
    CsvGaze,
    Dataset,
    GazeGraph,
    Irf,
    Recording,
    Synthetic,
    TableDataset,
    open_dataset,
)
from gazeguard.offline.eval.grid import MechanismSpec, parse_mechanism
from gazeguard.offline.eval.harness import (
    EvalSettings,
    FeatureBounds,
    evaluate_configuration,
    release_table,
)
from gazeguard.offline.eval.metrics import majority_vote_accuracy, nmse, user_level_epsilon, utility
from gazeguard.offline.eval.runner import GridConfig, best_configuration, evaluate_dataset

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
