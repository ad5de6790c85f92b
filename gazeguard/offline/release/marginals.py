"""Task-based Marginals with the (k, γ) plausible-deniability test (David-John et al., ETRA 2022,
Sec. 3.3, after Bindschaedler, Shokri and Gunter, VLDB 2017).

Model. Every feature j is cut into ``B`` (default 30) equal bins over its range ``[lo_j, hi_j]``
(public bounds by default, the data's own min/max with ``range="data"`` as in the paper). For
each task separately the model is the product of the per-feature bin distributions ``P_j`` of
that task's records (its marginals).

Synthesis. A candidate is made from a *seed* record d of the task (Bindschaedler's seed-based
synthesis): ``omega`` features chosen uniformly at random are re-drawn from their task marginal,
the other ``F − omega`` keep the seed's bins. With ``omega = F`` (the default, the paper's
"randomly sampling each feature independently") the seed has no influence at all. The released
table is stratified like the input: one synthetic vector per input row, carrying that row's
person, task, recording and time labels; bins are mapped back to continuous values by a uniform
draw inside the bin.

Probability of a candidate. For a seed d let A(d) be the features where the candidate y differs
from d (a = |A|) and M(d) the rest, p_j = P_j(y_j). y arises from d iff the resampled set S
contains A, so

    Pr{y = M(d)} = C(F, ω)^-1 · Σ_{S ⊇ A, |S| = ω} Π_{j∈S} p_j
                 = C(F, ω)^-1 · Π_{j∈A} p_j · e_{ω−a}(p_j : j ∈ M(d)),

with ``e_r`` the elementary symmetric polynomial (0 when a > ω). Equivalently
``C(F, ω)^-1 · Π_j p_j · e_{F−ω}(1/p_j : j ∈ M(d))``; whichever order is smaller is computed.

Privacy test (Bindschaedler et al.'s deterministic Privacy Test 1). A candidate y made from seed
d is released only if at least k records d_a of the task — the seed included — could have
produced it with probability in the same γ-bucket as the seed:

    i = ⌊−log_γ Pr{y = M(d)}⌋,  k' = |{d_a : Pr{y = M(d_a)} > 0, ⌊−log_γ Pr{y = M(d_a)}⌋ = i}|,
    release y  ⇔  k' ≥ k.

All k' records then have pairwise probability ratios within a factor γ, so y is (k, γ)-plausibly
deniable: its seed hides among at least k−1 other inputs that would have produced it about as
likely. A candidate that fails is discarded and a new one drawn from the same seed, up to
``max_attempts`` times; a row whose attempts all fail is not released (counted in the manifest).
The deterministic test gives plausible deniability, not differential privacy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.offline.release._common import (
    RANGE_SOURCES,
    FloatArray,
    IndexArray,
    Params,
    Progress,
    Release,
    ReleaseRandom,
    feature_ranges,
    no_progress,
    require_finite,
    task_sequences,
)
from gazeguard.signal.dataset import FeatureTable

NAME = "marginals"
BinArray = npt.NDArray[np.int32]
#: Tolerance when flooring −log_γ Pr: probabilities equal up to rounding share a bucket.
_BUCKET_TOL = 1e-9


def to_bins(X: FloatArray, lo: FloatArray, hi: FloatArray, n_bins: int) -> BinArray:
    """Bin index 0..B−1 of each value, (N, F); values outside [lo, hi] go to the edge bins."""
    width = hi - lo
    scaled = np.divide(X - lo, width, out=np.zeros_like(X), where=width > 0)
    bins: BinArray = np.clip(np.floor(scaled * n_bins), 0, n_bins - 1).astype(np.int32)
    return bins


def from_bins(
    bins: BinArray, lo: FloatArray, hi: FloatArray, n_bins: int, rng: ReleaseRandom
) -> FloatArray:
    """Continuous values, uniform inside each bin ``[lo + b·w, lo + (b+1)·w)``, w = (hi−lo)/B."""
    w = (hi - lo) / n_bins
    return lo + (bins + rng.uniform(bins.shape)) * w


def _log_elementary(weights: FloatArray, order: int) -> FloatArray:
    """log e_0..e_order of each row's non-negative weights, (n, order+1); −inf where e_r = 0.

    ``e_r`` only grows as features are added and lies between (min positive weight)^r and
    C(F, r)·(max weight)^r; when those bounds could leave float64's range the rows are rescaled
    after every feature, otherwise (the common case) not at all.
    """
    n, f = weights.shape
    W = np.ascontiguousarray(weights.T)  # (F, n): contiguous rows for the update below
    E = np.zeros((order + 1, n))
    E[0] = 1.0
    log_scale = np.zeros(n)
    positive = weights[weights > 0]
    top = math.log(max(float(positive.max()), 1.0)) if positive.size else 0.0
    bottom = math.log(min(float(positive.min()), 1.0)) if positive.size else 0.0
    rescale = order * top + math.log(math.comb(f, order)) > 600 or order * bottom < -600
    for j in range(f):
        E[1:] += W[j] * E[:-1]  # right side evaluated first: e_r += w_j · e_{r−1} (old values)
        if rescale:
            s = E.max(axis=0)
            E /= s
            log_scale += np.log(s)
    with np.errstate(divide="ignore"):
        return (np.log(E) + log_scale).T


@dataclass(frozen=True)
class TaskModel:
    """The Marginals model of one task.

    Attributes:
        bins: int32 (N, F), the task's records as bin indices (the possible seeds).
        probs: float64 (F, B), per-feature bin distributions ``P_j``.
        omega: features re-drawn per candidate, 1..F.
    """

    bins: BinArray
    probs: FloatArray
    omega: int

    @classmethod
    def fit(cls, bins: BinArray, n_bins: int, omega: int) -> TaskModel:
        """Count each feature's bins over the task's records."""
        n, f = bins.shape
        counts = np.zeros((f, n_bins))
        for j in range(f):
            counts[j] = np.bincount(bins[:, j], minlength=n_bins)
        return cls(bins, counts / n, omega)

    @property
    def n_features(self) -> int:
        """F."""
        return int(self.bins.shape[1])

    def candidates(self, seeds: IndexArray, rng: ReleaseRandom) -> BinArray:
        """One candidate per seed row index, (len(seeds), F)."""
        y = self.bins[seeds].copy()
        n, f = y.shape
        # omega distinct features per candidate: the omega smallest of F uniform keys.
        chosen = np.argsort(rng.uniform((n, f)), axis=1)[:, : self.omega]
        cdf = np.cumsum(self.probs, axis=1)
        u = rng.uniform((n, self.omega))
        for c in range(self.omega):
            j = chosen[:, c]
            drawn = (u[:, c, None] >= cdf[j]).sum(axis=1)  # inverse CDF, per row's feature
            y[np.arange(n), j] = np.minimum(drawn, self.probs.shape[1] - 1)
        return y

    def log_prob_pairs(self, Y: BinArray, ci: IndexArray, ni: IndexArray) -> FloatArray:
        """``ln Pr{Y[ci] = M(d_ni)}`` for pairs of candidate and seed row indices, (P,).

        −inf where the candidate cannot arise from that seed (more than omega mismatches).
        """
        f, omega = self.n_features, self.omega
        rows = np.arange(f)
        log_comb = math.log(math.comb(f, omega))
        out = np.empty(ci.size)
        step = max(1, (1 << 22) // f)  # bound the (pairs, F) temporaries to ~4M elements
        for s0 in range(0, ci.size, step):
            y = Y[ci[s0 : s0 + step]]
            p = self.probs[rows, y]  # (P, F); > 0 for any candidate the model made
            with np.errstate(divide="ignore"):
                log_p = np.log(p)
            match = self.bins[ni[s0 : s0 + step]] == y
            a = f - match.sum(axis=1)
            if omega == f:  # every seed is equally likely: C(F,F) = 1, Π_j p_j
                val = log_p.sum(axis=1)
            elif f - omega <= omega:  # Π_j p_j · e_{F−ω}(1/p_j : j ∈ M)
                inv = np.divide(1.0, p, out=np.zeros_like(p), where=p > 0)
                val = log_p.sum(axis=1) + _log_elementary(match * inv, f - omega)[:, f - omega]
            else:  # Π_{j∈A} p_j · e_{ω−a}(p_j : j ∈ M)
                log_e = _log_elementary(match * p, omega)
                picked = log_e[np.arange(a.size), np.clip(omega - a, 0, omega)]
                val = np.where(~match, log_p, 0.0).sum(axis=1) + picked
            out[s0 : s0 + step] = np.where(a <= omega, val - log_comb, -np.inf)
        return out

    def plausible_seeds(
        self, Y: BinArray, seeds: IndexArray, gamma: float, enough: int | None = None
    ) -> IndexArray:
        """k' for each candidate ``Y[c]`` made from seed row ``seeds[c]``, (C,).

        k' counts the task's records whose ``Pr{y = M(d_a)}`` is positive and falls in the
        seed's γ-bucket ``⌊−log_γ Pr{y = M(d)}⌋`` (the seed itself included); 0 if the seed
        cannot produce y. Records are visited in blocks; a candidate stops being counted once
        it has ``enough`` (the test needs no more), so its k' is then a lower bound ≥ enough.
        """
        n, f = self.bins.shape
        log_gamma = math.log(gamma)

        def bucket(log_pr: FloatArray) -> FloatArray:
            with np.errstate(invalid="ignore"):
                return np.floor(-log_pr / log_gamma + _BUCKET_TOL)

        c_all = np.arange(Y.shape[0], dtype=np.intp)
        own = self.log_prob_pairs(Y, c_all, seeds)
        if self.omega == f:  # seed-independent model: every record has the seed's probability
            return np.where(np.isfinite(own), n, 0).astype(np.intp)
        own_bucket = bucket(own)
        counts = np.zeros(Y.shape[0], dtype=np.intp)
        active = c_all[np.isfinite(own)]
        columns = np.ascontiguousarray(self.bins.T)  # (F, N)
        r0, block = 0, 4 * (enough or 8)  # small first blocks: most candidates pass early
        while r0 < n and active.size:
            cols = columns[:, r0 : r0 + block]
            chunk = max(1, (1 << 20) // cols.shape[1])  # bound the (chunk, block) matrices
            for c0 in range(0, active.size, chunk):
                cand = active[c0 : c0 + chunk]
                matches = np.zeros((cand.size, cols.shape[1]), dtype=np.int16)
                for j in range(f):
                    matches += cols[j][None, :] == Y[cand, j, None]
                ci, ni = np.nonzero(f - matches <= self.omega)
                ci = cand[ci]
                log_pr = self.log_prob_pairs(Y, ci, ni.astype(np.intp) + r0)
                hit = np.isfinite(log_pr)
                hit[hit] = bucket(log_pr[hit]) == own_bucket[ci[hit]]
                counts += np.bincount(ci[hit], minlength=counts.size)
            if enough is not None:
                active = active[counts[active] < enough]
            r0 += block
            block = min(2 * block, 1024)
        return counts


def pd_test(model: TaskModel, y: BinArray, seed: int, k: int, gamma: float) -> bool:
    """The (k, γ) privacy test for one candidate ``y`` (F,) made from seed row ``seed``: True
    iff at least k records (seed included) share the seed's γ-bucket of ``Pr{y = M(·)}``."""
    counts = model.plausible_seeds(y[None, :], np.array([seed], dtype=np.intp), gamma, k)
    return bool(counts[0] >= k)


def marginals_release(  # noqa: PLR0915 - numeric: the plausible-deniability synthesis loop
    table: FeatureTable,
    params: Mapping[str, object],
    seed: int | None = None,
    progress: Progress = no_progress,
) -> Release:
    """Release a synthetic, (k, γ)-plausibly-deniable version of ``table``.

    Args:
        table: N labelled feature vectors.
        params: ``k`` (int ≥ 1, default 2), ``gamma`` (> 1, default 2.0), ``bins`` (B ≥ 2,
            default 30), ``omega`` (features re-drawn per candidate, 1..F, default F),
            ``max_attempts`` (candidates per row, default 50), ``range`` (``"public"`` default
            or ``"data"``), ``bounds`` (``{name: (lo, hi[, max_step])}``).
        seed: ``None`` for the OS CSPRNG; an int only for reproducible experiments (insecure).
        progress: called as rows are synthesised.

    Raises:
        ConfigError: naming ``gamma`` (≤ 1), ``k`` (more than a task's records), ``omega``,
            ``bins``, ``max_attempts``, ``range`` or ``bounds``.
    """
    p = Params(NAME, params)
    k = p.integer("k", 2, minimum=1)
    gamma = p.number("gamma", 2.0, greater_than=1.0)
    n_bins = p.integer("bins", 30, minimum=2)
    f = len(table.feature_names)
    omega = p.integer("omega", f, minimum=1)
    if omega > f:
        raise p.error("omega", omega, f"cannot re-draw more features than the table has ({f})")
    max_attempts = p.integer("max_attempts", 50, minimum=1)
    range_source = p.choice("range", "public", RANGE_SOURCES)
    ranges = feature_ranges(table, range_source, p)
    effective = p.finish()
    effective.pop("bounds", None)
    require_finite(table, p)
    rng = ReleaseRandom(seed)

    sequences = task_sequences(table)
    task_rows = {task: np.concatenate(list(seqs.values())) for task, seqs in sequences.items()}
    for task, rows in task_rows.items():
        if rows.size < k:
            raise p.error(
                "k",
                k,
                f"task {task!r} has only {rows.size} records; no candidate can have k plausible "
                f"seeds. Choose k <= {rows.size}",
            )

    all_bins = to_bins(table.X, ranges.lo, ranges.hi, n_bins)
    keep_rows: list[IndexArray] = []
    keep_bins: list[BinArray] = []
    per_task: dict[str, dict[str, Any]] = {}
    total, done = table.n_rows, 0
    for task, rows in task_rows.items():
        model = TaskModel.fit(all_bins[rows], n_bins, omega)
        pending = np.arange(rows.size, dtype=np.intp)  # seeds (task-local) still without output
        released = np.empty((rows.size, f), dtype=np.int32)
        ok = np.zeros(rows.size, dtype=bool)
        tried = 0
        for _ in range(max_attempts):
            if pending.size == 0:
                break
            cand = model.candidates(pending, rng)
            tried += pending.size
            passed = model.plausible_seeds(cand, pending, gamma, k) >= k
            released[pending[passed]] = cand[passed]
            ok[pending[passed]] = True
            done += int(passed.sum())
            pending = pending[~passed]
            progress(done, total, f"task {task!r}: {int(ok.sum())}/{rows.size} rows released")
        keep_rows.append(rows[ok])
        keep_bins.append(released[ok])
        per_task[task] = {
            "records": int(rows.size),
            "candidates_tested": int(tried),
            "rows_released": int(ok.sum()),
            "rows_dropped": int(rows.size - ok.sum()),
        }

    kept = np.concatenate(keep_rows) if keep_rows else np.empty(0, dtype=np.intp)
    order = np.argsort(kept, kind="stable")  # back to input row order
    kept = kept[order]
    bins_out = (np.concatenate(keep_bins) if keep_bins else np.empty((0, f), np.int32))[order]
    values = from_bins(bins_out, ranges.lo, ranges.hi, n_bins, rng)
    out = table.take(kept).with_values(values)
    tested = sum(t["candidates_tested"] for t in per_task.values())
    dropped = sum(t["rows_dropped"] for t in per_task.values())
    statement = (
        f"({k}, {gamma:g})-plausible deniability (Bindschaedler et al. 2017): every released "
        f"vector is synthetic (per-task marginals over {n_bins} bins, {omega} of {f} features "
        f"re-drawn from the seed) and passed the privacy test — at least {k} records of its task "
        f"could have produced it with probabilities within a factor {gamma:g} of its seed's. "
        f"{dropped} rows whose candidates all failed were not released. Not differential privacy."
    )
    if range_source == "data":
        statement += " Bin ranges were taken from the data itself (the paper's convention)."
    return Release(
        out,
        {
            "mechanism": NAME,
            "parameters": effective,
            "guarantee": {
                "kind": "(k, gamma)-plausible deniability",
                "statement": statement,
                "numbers": {
                    "k": k,
                    "gamma": gamma,
                    "candidates_tested": int(tested),
                    "candidates_released": int(out.n_rows),
                    "rows_dropped": int(dropped),
                },
            },
            "seed_policy": rng.policy,
            "details": {"range_source": ranges.source, "tasks": per_task},
        },
    )
