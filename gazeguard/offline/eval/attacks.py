"""Classifiers and the two classification protocols of the evaluation.

The four classifiers are those of Bozkir et al. 2021: k-NN (k = 11), SVM (RBF kernel, C = 1,
``gamma="scale"`` — scikit-learn's counterpart of MATLAB's automatic kernel scale), a decision
tree and a random forest of 10 trees. Features are standardised to zero mean and unit variance on
the training rows only (a :class:`~sklearn.pipeline.Pipeline`), and the same transform is
applied to the test rows.

Protocols (rows are windows of a :class:`~gazeguard.signal.dataset.FeatureTable`):

* **Task recognition** (utility): leave one person out — train on every other person, test on
  the held-out person, over all persons (:func:`task_recognition`).
* **Person re-identification** (the attack): train on the first half of every recording, test
  on the second half (:func:`reidentification`). This is the adversary's best case: it has
  already seen each person in the same task.
* **Task recognition across halves** (David-John et al.'s utility protocol): the same split with
  task labels (:func:`half_split_protocol`).

Both score per window and after a majority vote over each recording's test windows. Both take
the training values and one or more *test views* of the same rows: ``"release"`` (the
privatized values — Bozkir et al.'s protocol: the adversary only ever sees privatized data) and
``"raw"`` (David-John et al. 2022's protocol: the adversary trains on the privatized release
and attacks clean data it obtains elsewhere). One fit serves every view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sklearn.ensemble import RandomForestClassifier
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from sklearn.tree import DecisionTreeClassifier

from gazeguard.offline.eval.metrics import (
    accuracy,
    half_split,
    lopo_splits,
    majority_vote_accuracy,
)
from gazeguard.signal.dataset import subsample

FloatArray = npt.NDArray[np.float64]

#: Classifier keys in the paper's column order (k-NN | SVM | DT | RF).
CLASSIFIERS: tuple[str, ...] = ("knn", "svm", "dt", "rf")
CLASSIFIER_LABELS: dict[str, str] = {"knn": "k-NN", "svm": "SVM", "dt": "DT", "rf": "RF"}


def make_classifier(name: str, seed: int) -> Pipeline:
    """A fresh ``StandardScaler → classifier`` pipeline.

    Args:
        name: one of :data:`CLASSIFIERS`.
        seed: random state of the tree-based classifiers (k-NN and SVM are deterministic).
    """
    if name == "knn":
        clf: object = KNeighborsClassifier(n_neighbors=11)
    elif name == "svm":
        clf = SVC(kernel="rbf", C=1.0, gamma="scale")
    elif name == "dt":
        clf = DecisionTreeClassifier(random_state=seed)
    elif name == "rf":
        clf = RandomForestClassifier(n_estimators=10, random_state=seed, n_jobs=1)
    else:
        msg = f"unknown classifier {name!r}; choose from {', '.join(CLASSIFIERS)}"
        raise ValueError(msg)
    return make_pipeline(StandardScaler(), clf)


@dataclass(frozen=True, slots=True)
class Scores:
    """Accuracy of one classifier on one test view, in [0, 1].

    Attributes:
        window: fraction of test windows classified correctly.
        vote: mean per-recording score after a majority vote over its test windows.
        n_windows: number of test windows.
        n_recordings: number of test recordings (votes).
    """

    window: float
    vote: float
    n_windows: int
    n_recordings: int


def _scores(
    truth: npt.NDArray[np.str_], pred: npt.NDArray[np.str_], rec: npt.NDArray[np.str_]
) -> Scores:
    return Scores(
        window=accuracy(truth, pred),
        vote=majority_vote_accuracy(truth, pred, rec),
        n_windows=int(truth.size),
        n_recordings=int(np.unique(rec).size),
    )


def _check_views(train: FloatArray, views: Mapping[str, FloatArray]) -> None:
    for name, v in views.items():
        if v.shape != train.shape:
            msg = f"test view {name!r} has shape {v.shape}, expected {train.shape}"
            raise ValueError(msg)


def task_recognition(
    X_train: FloatArray,
    views: Mapping[str, FloatArray],
    task: npt.ArrayLike,
    person: npt.ArrayLike,
    recording: npt.ArrayLike,
    *,
    classifiers: Sequence[str] = CLASSIFIERS,
    every: int = 10,
    seed: int = 0,
) -> dict[str, dict[str, Scores]]:
    """Leave-one-person-out task recognition.

    Args:
        X_train: (N, F) values the models are trained on (the release).
        views: test views, each (N, F) values of the same rows (e.g. ``{"release": …,
            "raw": …}``); predictions of the held-out person's rows are scored per view.
        task: (N,) task label per row — the class to predict.
        person: (N,) person per row — the fold key.
        recording: (N,) recording per row — the majority-vote group.
        classifiers: keys of :data:`CLASSIFIERS` to run.
        every: train and test on every ``every``-th window of each recording (paper: 10).
        seed: random state of tree-based classifiers.

    Returns:
        ``{view: {classifier: Scores}}``; empty if fewer than two persons or tasks.
    """
    _check_views(X_train, views)
    y = np.asarray(task).astype(str)
    who = np.asarray(person).astype(str)
    rec = np.asarray(recording).astype(str)
    if np.unique(who).size < 2 or np.unique(y).size < 2:
        return {}
    preds = {v: {c: np.empty(y.shape, dtype=y.dtype) for c in classifiers} for v in views}
    scored = np.zeros(y.shape, dtype=bool)
    for _, train, test in lopo_splits(who):
        tr = subsample(train, rec, every)
        te = subsample(test, rec, every)
        if np.unique(y[tr]).size < 2:
            continue
        scored[te] = True
        for c in classifiers:
            model = make_classifier(c, seed).fit(X_train[tr], y[tr])
            for v, Xv in views.items():
                preds[v][c][te] = model.predict(Xv[te])
    idx = np.flatnonzero(scored)
    return {v: {c: _scores(y[idx], preds[v][c][idx], rec[idx]) for c in classifiers} for v in views}


def fit_and_score(
    X_train: FloatArray,
    y_train: npt.ArrayLike,
    tests: Mapping[str, tuple[FloatArray, npt.ArrayLike, npt.ArrayLike]],
    *,
    classifiers: Sequence[str] = CLASSIFIERS,
    seed: int = 0,
) -> dict[str, dict[str, Scores]]:
    """Fit each classifier once on ``(X_train, y_train)`` and score it on every test set.

    Args:
        X_train: (N, F) training rows.
        y_train: (N,) labels.
        tests: ``{view: (X (M, F), y (M,), recording (M,))}``; votes are per recording.
        classifiers: keys of :data:`CLASSIFIERS`.
        seed: random state of tree-based classifiers.

    Returns:
        ``{view: {classifier: Scores}}``.
    """
    y = np.asarray(y_train).astype(str)
    out: dict[str, dict[str, Scores]] = {v: {} for v in tests}
    for c in classifiers:
        model = make_classifier(c, seed).fit(X_train, y)
        for v, (Xv, yv, gv) in tests.items():
            pred = np.asarray(model.predict(Xv)).astype(str)
            out[v][c] = _scores(np.asarray(yv).astype(str), pred, np.asarray(gv).astype(str))
    return out


def half_split_protocol(
    X_train: FloatArray,
    views: Mapping[str, FloatArray],
    labels: npt.ArrayLike,
    recording: npt.ArrayLike,
    *,
    classifiers: Sequence[str] = CLASSIFIERS,
    every: int = 5,
    seed: int = 0,
    block: int = 1,
) -> dict[str, dict[str, Scores]]:
    """Train on the first half of every recording, test on the second half.

    With ``labels`` = person this is the re-identification attack (:func:`reidentification`);
    with ``labels`` = task it is David-John et al.'s utility protocol (the same people appear in
    training and test, unlike leave-one-person-out).

    Args:
        X_train: (N, F) values trained on (the release); rows of its first halves are used.
        views: test views of the same rows, each (N, F); rows of the second halves are scored.
        labels: (N,) the class to predict.
        recording: (N,) recording per row: halves are taken per recording, votes per recording.
        classifiers: keys of :data:`CLASSIFIERS`.
        every: train and test on every ``every``-th window of each recording.
        seed: random state of tree-based classifiers.
        block: cut each recording at a multiple of ``block`` rows (the chunk length), see
            :func:`~gazeguard.offline.eval.metrics.split_point`.
    """
    _check_views(X_train, views)
    y = np.asarray(labels).astype(str)
    rec = np.asarray(recording).astype(str)
    train, test = half_split(rec, block)
    tr = subsample(train, rec, every)
    te = subsample(test, rec, every)
    tests = {v: (Xv[te], y[te], rec[te]) for v, Xv in views.items()}
    return fit_and_score(X_train[tr], y[tr], tests, classifiers=classifiers, seed=seed)


#: Person re-identification: :func:`half_split_protocol` with ``labels`` = person, (N,) per row
#: (paper: every 5th window). Chance level is 1/(number of persons).
reidentification = half_split_protocol
