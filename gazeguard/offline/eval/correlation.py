"""Temporal correlation of feature signals, raw versus first difference (paper Figs 3–6).

Sliding-window features (W = 30 s, step 0.5 s) share 59/60 of their samples between consecutive
steps, so the raw signals are strongly correlated over time; the DCFPA works on the first
differences ``x_t − x_{t−1}``, which are much less correlated. Two views are computed:

* :func:`autocorrelation` — the within-recording autocorrelation function averaged over
  recordings (how similar a signal is to itself ``lag`` steps later);
* :func:`reference_correlation` — the paper's figure: per task, the Pearson correlation *across
  recordings* between the value at a reference step (the fifth, index 4) and the value
  ``Δt`` steps later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.signal.dataset import FeatureTable

FloatArray = npt.NDArray[np.float64]


def autocorrelation(signals: Sequence[npt.ArrayLike], max_lag: int) -> FloatArray:
    """Mean within-signal autocorrelation for lags ``0..max_lag``.

    Each signal's ACF is the biased estimator ``r(ℓ) = Σ_t (x_t − x̄)(x_{t+ℓ} − x̄) / Σ_t (x_t − x̄)²``
    (so ``r(0) = 1``); constant signals and signals shorter than ``max_lag + 2`` are skipped, and
    the result averages over the rest.

    Args:
        signals: 1-D signals (e.g. one feature in each recording), possibly of different lengths.
        max_lag: largest lag, in steps.

    Returns:
        (max_lag + 1,) mean ACF; NaN where no signal qualified.
    """
    acc = np.zeros(max_lag + 1)
    count = 0
    for s in signals:
        x = np.asarray(s, dtype=np.float64)
        x = x[np.isfinite(x)]
        if x.size < max_lag + 2:
            continue
        d = x - x.mean()
        var = float(d @ d)
        if var <= 0.0:
            continue
        acc += np.array([float(d[: d.size - lag] @ d[lag:]) / var for lag in range(max_lag + 1)])
        count += 1
    return acc / count if count else np.full(max_lag + 1, np.nan)


def reference_correlation(values: FloatArray, ref_index: int = 4, max_lag: int = 40) -> FloatArray:
    """Pearson correlation across recordings between step ``ref_index`` and ``ref_index + Δt``.

    Args:
        values: (R, T) one feature in R recordings of the same task, aligned at step 0.
        ref_index: the reference step (the paper uses the fifth time instance, index 4).
        max_lag: largest Δt, steps.

    Returns:
        (max_lag + 1,) correlation coefficients (1 at Δt = 0); NaN where undefined (fewer than
        three recordings, a lag beyond the shortest recording, or zero variance).
    """
    out = np.full(max_lag + 1, np.nan)
    if values.shape[0] < 3:
        return out
    ref = values[:, ref_index]
    for lag in range(max_lag + 1):
        j = ref_index + lag
        if j >= values.shape[1]:
            break
        other = values[:, j]
        if np.std(ref) > 0 and np.std(other) > 0:
            out[lag] = float(np.corrcoef(ref, other)[0, 1])
    return out


def _mean_abs(x: FloatArray) -> float:
    finite = x[np.isfinite(x)]
    return float(np.mean(np.abs(finite))) if finite.size else float("nan")


def _difference(x: FloatArray) -> FloatArray:
    return np.diff(x, axis=0)


def correlation_analysis(
    table: FeatureTable, features: Sequence[int], max_lag: int = 40, ref_index: int = 4
) -> dict[str, Any]:
    """Raw-versus-difference correlation summary for ``features`` of ``table``.

    Returns a JSON-ready dict::

        {"max_lag": L, "step_s": s, "features": {name: {
            "acf_raw": [L+1], "acf_diff": [L+1],
            "mean_abs_acf_raw": float, "mean_abs_acf_diff": float,   # mean |r| over lags 1..L
            "reference": {task: {"raw": [L+1], "diff": [L+1]}}}}}

    Feature signals are taken per recording (rows of one recording are consecutive). The
    difference signal of a recording is ``x_t − x_{t−1}`` over its whole length.
    """
    recs = list(table.recordings())
    step = float(np.median(np.diff(table.t[recs[0][1]]))) if recs and recs[0][1].size > 1 else 0.0
    result: dict[str, Any] = {"max_lag": max_lag, "step_s": step, "features": {}}
    tasks = sorted(set(table.task.tolist()))
    for j in features:
        raw = [table.X[rows, j] for _, rows in recs]
        diff = [_difference(r) for r in raw]
        acf_r = autocorrelation(raw, max_lag)
        acf_d = autocorrelation(diff, max_lag)
        ref: dict[str, dict[str, list[float]]] = {}
        for task in tasks:
            sel = [r for (_, rows), r in zip(recs, raw, strict=True) if table.task[rows[0]] == task]
            if len(sel) < 3:
                continue
            length = min(len(r) for r in sel)
            stack = np.stack([r[:length] for r in sel])
            ref[task] = {
                "raw": reference_correlation(stack, ref_index, max_lag).tolist(),
                "diff": reference_correlation(_difference(stack.T).T, ref_index, max_lag).tolist(),
            }
        result["features"][table.feature_names[j]] = {
            "acf_raw": acf_r.tolist(),
            "acf_diff": acf_d.tolist(),
            "mean_abs_acf_raw": _mean_abs(acf_r[1:]),
            "mean_abs_acf_diff": _mean_abs(acf_d[1:]),
            "reference": ref,
        }
    return result
