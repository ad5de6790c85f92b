"""Metrics of the privacy–utility evaluation, as defined in Bozkir et al. 2021 (eqs 4–6).

Everything here is plain numpy on small arrays, so the definitions can be checked by hand:

* :func:`nmse` — normalised mean square error of a privatized signal (eq. 4, 5), and
  :func:`utility` — its multiplicative inverse ``1/|NMSE|`` (eq. 6);
* :func:`accuracy` and :func:`majority_vote_accuracy` — per-window and per-recording accuracy;
* :func:`lopo_splits` — leave-one-person-out folds (task recognition);
* :func:`half_split` — first half of each recording trains, second half tests (re-identification);
* :func:`user_level_epsilon` — the honest ε of a whole released recording.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


def nmse(x: npt.ArrayLike, y: npt.ArrayLike) -> FloatArray:
    """Normalised mean square error of ``y`` against ``x`` along the last axis (paper eq. 4).

    ``NMSE = (1/n) Σ_i (x_i − y_i)² / (x̄ · ȳ)`` with ``x̄``, ``ȳ`` the means of the clean and the
    noisy signal (eq. 5). The value is signed (``x̄ · ȳ`` can be negative) and is NaN where
    ``x̄ · ȳ = 0`` (undefined; e.g. a feature that is identically zero in a recording).

    Args:
        x: clean signal(s), shape (..., n), in the feature's unit.
        y: privatized signal(s), same shape and unit.

    Returns:
        NMSE per signal, shape (...), dimensionless.
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.shape != ya.shape:
        msg = f"nmse: clean shape {xa.shape} differs from privatized shape {ya.shape}"
        raise ValueError(msg)
    mse = np.mean((xa - ya) ** 2, axis=-1)
    denom = np.mean(xa, axis=-1) * np.mean(ya, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(denom != 0.0, mse / np.where(denom != 0.0, denom, 1.0), np.nan)
    return np.asarray(out, dtype=np.float64)


def utility(nmse_values: npt.ArrayLike) -> FloatArray:
    """``1/|NMSE|`` (paper eq. 6); +inf where NMSE is exactly 0, NaN where NMSE is NaN."""
    v = np.abs(np.asarray(nmse_values, dtype=np.float64))
    with np.errstate(divide="ignore"):
        return np.asarray(1.0 / v, dtype=np.float64)


def accuracy(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> float:
    """Fraction of equal labels; NaN for empty input."""
    t = np.asarray(y_true)
    p = np.asarray(y_pred)
    if t.shape != p.shape:
        msg = f"accuracy: {t.shape[0]} true labels but {p.shape[0]} predictions"
        raise ValueError(msg)
    return float(np.mean(t == p)) if t.size else float("nan")


def majority_vote_accuracy(
    y_true: npt.ArrayLike, y_pred: npt.ArrayLike, groups: npt.ArrayLike
) -> float:
    """Accuracy after a majority vote over the windows of each group (recording).

    Each group must carry one true label. The group's prediction is its most frequent predicted
    label; a tie between m labels that includes the true one scores 1/m — the expected score of
    a uniformly random tie-break, so the result is deterministic and unbiased.

    Args:
        y_true: true label per window, shape (N,).
        y_pred: predicted label per window, shape (N,).
        groups: group (recording) id per window, shape (N,).

    Returns:
        Mean score over groups, in [0, 1]; NaN for empty input.
    """
    t = np.asarray(y_true)
    p = np.asarray(y_pred)
    g = np.asarray(groups)
    if not (t.shape == p.shape == g.shape):
        msg = f"majority_vote_accuracy: shapes differ: {t.shape}, {p.shape}, {g.shape}"
        raise ValueError(msg)
    if t.size == 0:
        return float("nan")
    scores: list[float] = []
    for gid in np.unique(g):
        mask = g == gid
        truths = np.unique(t[mask])
        if truths.size != 1:
            msg = f"group {str(gid)!r} has {truths.size} different true labels; it must have one"
            raise ValueError(msg)
        counts = Counter(p[mask].tolist())
        top = max(counts.values())
        winners = [label for label, c in counts.items() if c == top]
        scores.append(1.0 / len(winners) if truths[0] in winners else 0.0)
    return float(np.mean(scores))


def lopo_splits(person: npt.ArrayLike) -> Iterator[tuple[str, IntArray, IntArray]]:
    """Leave-one-person-out folds: ``(held-out person, train rows, test rows)`` per person.

    Persons are visited in sorted order; rows are indices into ``person`` (shape (N,)).
    """
    p = np.asarray(person).astype(str)
    for who in np.unique(p):
        test = np.flatnonzero(p == who)
        train = np.flatnonzero(p != who)
        yield str(who), train, test


def split_point(m: int, block: int = 1) -> int:
    """Where to cut a recording of ``m`` rows into a training and a test half.

    The cut is the multiple of ``block`` nearest to ``m/2`` (halves rounded up), so that a
    released chunk of ``block`` rows never lies on both sides: otherwise one noise draw would be
    in training and test alike, and "re-identification" would only link two halves of the same
    noisy chunk. When that is impossible (``m < 2·block``, e.g. FPA's single whole-recording
    release) the cut falls back to ``m // 2``.
    """
    if block > 1 and m >= 2 * block:
        return block * int(m / (2 * block) + 0.5)
    return m // 2


def half_split(recording: npt.ArrayLike, block: int = 1) -> tuple[IntArray, IntArray]:
    """Split every recording's rows in time order: first half trains, second half tests.

    Rows of one recording must be consecutive and in time order (as in a
    :class:`~gazeguard.signal.dataset.FeatureTable`); each is cut at :func:`split_point` (with
    ``block=1``, ``m // 2`` rows train and the rest test).

    Returns:
        (train row indices, test row indices), each sorted.
    """
    rec = np.asarray(recording).astype(str)
    train: list[IntArray] = []
    test: list[IntArray] = []
    for rid in np.unique(rec):
        rows = np.flatnonzero(rec == rid)
        cut = split_point(rows.size, block)
        train.append(rows[:cut])
        test.append(rows[cut:])
    if not train:
        return np.empty(0, np.intp), np.empty(0, np.intp)
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def user_level_epsilon(epsilon: float, n_features: int, n_chunks: int) -> float:
    """Honest ε of one whole released recording: sequential composition over features and chunks.

    Each feature of each chunk is released with ``epsilon``; all belong to the same person, so
    the recording as a whole is ``epsilon · n_features · n_chunks``-DP (for FPA over the whole
    recording, ``n_chunks = 1``). This is the figure to compare across mechanisms; the paper's
    per-chunk ε (parallel composition) assumes chunks belong to different people.
    """
    return float(epsilon) * int(n_features) * int(n_chunks)
