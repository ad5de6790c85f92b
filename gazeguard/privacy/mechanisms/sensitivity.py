"""Tight sensitivities of the kept coefficients: the exact worst case over the clipped input box.

The mechanisms noise ``c = B_m s``, the first ``m`` orthonormal coefficients (``transforms``) of
the signal ``s``: the raw chunk shifted by ``lo`` (FPA, CFPA) or the clipped difference chunk
(DCFPA). Two chunks are neighbours when both respect the public bounds, so the sensitivities are
suprema over pairs of inputs in the box. ``fpa.py`` uses ``Δ1 ≤ √m·Δ2``, valid for any vector in
ℝ^m; here we compute the exact supremum of ``‖B_m(s − s')‖₁`` instead, which is smaller, often by
half, because ``B_m(s − s')`` cannot be spread evenly over the m coordinates.

Reduction to a maximum over sign vectors
    ``‖v‖₁ = max_{σ ∈ {±1}^m} σᵀv``, so with ``w_σ = B_mᵀσ ∈ ℝ^n``::

        sup_{s,s'} ‖B_m(s − s')‖₁ = max_σ [max_s w_σᵀs − min_s w_σᵀs] = max_σ [M(w_σ) + M(−w_σ)]

    where ``M(w) = max_s wᵀs`` over the set of signals. σ and −σ give the same bracket, so
    ``2^(m−1)`` sign vectors suffice (σ_1 = +1).

Raw chunk (FPA, CFPA): ``s = x − lo ∈ [0, R]^n``
    The inner maximum is separable: ``M(w) + M(−w) = R·Σ_t |w_t| = R·‖B_mᵀσ‖₁``.

Difference chunk (DCFPA): ``D_1 = x_1 − lo``, ``D_t = clip(x_t − x_{t−1}, −d, d)``
    (``x ∈ [lo, hi]^n``, ``d = min(max_step, R)``, :meth:`Bounds.effective_step`; the mechanism
    clips ``x`` to the box before differencing, so ``x`` ranges over exactly the box.) In units
    of ``d``, with ``y = (x − lo)/d ∈ [0, q]^n`` and ``q = R/d ≥ 1``::

        M(w)/d = max_y f(y),   f(y) = w_1·y_1 + Σ_{t≥2} w_t·clip(y_t − y_{t−1}, −1, 1).

    *Lemma (finite grid).* ``f`` attains its maximum over the box at a point whose every
    coordinate lies in ``V = {j : 0 ≤ j ≤ J} ∪ {q − j : 0 ≤ j ≤ J}``, ``J = min(⌊q⌋, n − 1)``.
    *Proof.* The hyperplanes ``y_t − y_{t−1} = ±1`` cut the box into finitely many closed convex
    polytopes (cells) on each of which every clip is one fixed affine piece, so ``f`` is affine
    on each cell and attains its maximum over a cell at one of the cell's vertices. A vertex is
    the unique solution of n linearly independent active constraints, each of the form
    ``y_t = 0``, ``y_t = q`` (box) or ``y_t − y_{t−1} = ±1`` (cell walls). Consider the path
    graph whose edges are the active difference constraints: on each connected run of
    coordinates the difference constraints fix all values relative to one another, leaving one
    degree of freedom, which linear independence forces to be removed by an active box
    constraint inside the run. Hence every ``y_t`` equals ``0 + j`` or ``q + j`` for an integer
    ``j`` with ``|j| ≤ n − 1`` (the number of ±1 steps along the run), and ``0 ≤ y_t ≤ q``
    leaves exactly ``V``. The box is the union of the cells, so its maximum is among these
    vertices. ∎

    *Dynamic programme.* ``f`` is a chain, so ``max_{y ∈ V^n} f`` is exact by dynamic
    programming over ``t``: ``F_1(v) = w_1·v``, ``F_t(v) = max_{v'∈V} F_{t−1}(v') +
    w_t·clip(v − v', −1, 1)``, ``M = max_v F_n(v)``. With ``V`` sorted, the ``v'`` with
    ``v − v' ≥ 1`` form a prefix (term ``+w_t``: a prefix maximum), those with ``v − v' ≤ −1`` a
    suffix (``−w_t``: a suffix maximum), and fewer than five lie strictly within distance 1
    (both halves of ``V`` have spacing 1): O(n·|V|) per sign vector, vectorised over all sign
    vectors and both signs of ``w`` at once.

Floating point
    ``B_m`` is built from exactly reduced integer angles (error ≤ 2^-50 per entry), grid points
    ``q − j`` round to feasible points, and every sum has fewer than ``n + m + 8`` roundings.
    We add to each bracket a margin ``(n + m + 8)·2^-47·A_σ + 2^-51·q·‖w_σ‖₁`` with
    ``A_σ = q|w_1| + 2Σ_{t≥2}|w_t|`` (raw: ``‖w_σ‖₁``), which dominates those errors: the result
    is never below the true supremum (and above it by 2^-40 relative for raw chunks, at most
    ~1e-9 relative for difference chunks whose supremum is far below ``A_σ``).

Cost and fallback
    Computed once per ``(n, m, transform, q)`` and cached (R and d scale out; ``lo`` shifts out).
    When ``2^(m−1)`` sign vectors are too many (raw: m > 16; difference: more than
    :data:`MAX_DP_WORK` grid-steps), :func:`kept_coefficient_sensitivity` falls back to a valid
    upper bound and reports ``exact=False``: the rows of ``B_m`` are split into consecutive blocks
    small enough to enumerate, and ``Σ_blocks sup‖B_block(s − s')‖₁`` bounds the supremum because
    ``‖v‖₁`` is the sum of the blocks' L1 norms (blocks of one row are the per-coefficient
    ranges); the result is ``min(√m·Δ2, that sum)``.

L2
    The Gaussian needs an L2 sensitivity: ``min(Δ2, L1)`` is one (``‖v‖₂ ≤ ‖v‖₁``; ``Δ2`` bounds
    the whole signal, Bessel), and it is exact for ``m = 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.bounds import (
    Bounds,
    difference_sensitivity_l2,
    raw_sensitivity_l2,
)
from gazeguard.privacy.mechanisms.registry import (
    TIGHT_MAX_M,
    TRANSFORMS,
    MechanismKind,
    Sensitivity,
    kept_coefficients,
    max_k,
    mechanism_kind,
)

FloatArray = npt.NDArray[np.float64]

#: Largest number of sign vectors enumerated for the raw chunk (m ≤ 16).
MAX_SIGN_VECTORS = 2**15
#: Largest ``2^(m−1)·|V|·n`` (sign vectors × grid points × steps) for the difference chunk's
#: exact dynamic programme (at most about a second of numpy on one core).
MAX_DP_WORK = 2**24
#: Sign vectors per batch (bounds memory: batch × max(n, |V|) doubles, a few MB).
_BATCH = 2048


def coefficient_basis(transform: str, n: int, m: int) -> FloatArray:
    """``B_m``: the first ``m`` rows (m, n) of the orthonormal basis ``transforms`` uses.

    dft: row 0 ``1/√n``; rows ``2j−1``, ``2j`` (``1 ≤ j < n/2``) are ``√(2/n)·cos(2πjt/n)`` and
    ``−√(2/n)·sin(2πjt/n)`` (``a_j``, ``b_j``); for ``m = n`` (even n) the last row is the
    Nyquist ``(−1)^t/√n``. dct: row 0 ``1/√n``, row j ``√(2/n)·cos(πj(2t+1)/(2n))``. Angles are
    reduced exactly in integers before scaling, so each entry is within a few ulps.

    Raises:
        ConfigError: unknown transform or m outside 1..n.
    """
    if transform not in TRANSFORMS:
        raise ConfigError("transform", transform, f"must be one of {TRANSFORMS}")
    if not 1 <= m <= n:
        raise ConfigError("m", m, f"kept coefficients must be in 1..{n}")
    t = np.arange(n, dtype=np.int64)
    out = np.empty((m, n))
    out[0] = 1.0 / math.sqrt(n)
    scale = math.sqrt(2.0 / n)
    if transform == "dct":
        for j in range(1, m):
            phase = (j * (2 * t + 1)) % (4 * n)  # angle = π·phase/(2n), exact reduction
            out[j] = scale * np.cos(np.pi * (phase / (2.0 * n)))
        return out
    for row in range(1, m):
        j = (row + 1) // 2
        if n % 2 == 0 and j == n // 2:  # only reached for m = n: the real Nyquist row
            out[row] = np.where(t % 2 == 0, 1.0, -1.0) / math.sqrt(n)
            continue
        angle = 2.0 * np.pi * (((j * t) % n) / n)
        out[row] = scale * np.cos(angle) if row % 2 == 1 else -scale * np.sin(angle)
    return out


def _sign_vectors(m: int, start: int, stop: int) -> FloatArray:
    """Rows ``start..stop−1`` of the ``2^(m−1)`` sign vectors with σ_1 = +1, (rows, m)."""
    idx = np.arange(start, stop, dtype=np.int64)[:, None]
    bits = (idx >> np.arange(m - 1, dtype=np.int64)[None, :]) & 1
    return np.concatenate([np.ones((idx.size, 1)), 1.0 - 2.0 * bits], axis=1)


def _grid(q: float, n: int) -> FloatArray:
    """``V`` of the lemma in units of d, sorted, without duplicates."""
    top = min(math.floor(q), n - 1)
    j = np.arange(top + 1, dtype=np.float64)
    return np.unique(np.concatenate([j, q - j]))


@dataclass(frozen=True)
class _Transitions:
    """Index tables of one DP step over the sorted grid (see module docstring)."""

    before: npt.NDArray[np.intp]  # last index with V ≤ v − 1, or −1
    after: npt.NDArray[np.intp]  # first index with V ≥ v + 1, or |V|
    window: npt.NDArray[np.intp]  # (|V|, K) indices with |v − v'| < 1 (padded with |V|)
    offset: FloatArray  # (|V|, K) clip(v − v', −1, 1) for the window entries


def _transitions(v: FloatArray) -> _Transitions:
    size = v.size
    before = np.searchsorted(v, v - 1.0, side="right") - 1
    after = np.searchsorted(v, v + 1.0, side="left")
    width = int(np.max(after - before - 1)) if size else 0
    window = np.full((size, max(width, 1)), size, dtype=np.intp)
    offset = np.zeros((size, max(width, 1)))
    for i in range(size):
        ids = np.arange(before[i] + 1, after[i])
        window[i, : ids.size] = ids
        offset[i, : ids.size] = np.clip(v[i] - v[ids], -1.0, 1.0)
    return _Transitions(before=before, after=after, window=window, offset=offset)


def _chain_maximum(w: FloatArray, v: FloatArray, steps: _Transitions) -> FloatArray:
    """``max_{y ∈ V^n} w_1·y_1 + Σ_t w_t·clip(y_t − y_{t−1}, −1, 1)`` for each row of ``w``
    (rows, n): the dynamic programme of the module docstring, vectorised over rows."""
    rows, n = w.shape
    size = v.size
    value = np.empty((rows, size + 1))
    value[:, :size] = w[:, :1] * v[None, :]
    value[:, size] = -np.inf  # padding column for empty prefixes/suffixes/windows
    pre = np.empty((rows, size + 1))
    suf = np.empty((rows, size + 1))
    pre[:, size] = -np.inf
    suf[:, size] = -np.inf
    before = np.where(steps.before < 0, size, steps.before)
    after = steps.after  # == size when empty: the −inf column
    for t in range(1, n):
        g = w[:, t : t + 1]
        np.maximum.accumulate(value[:, :size], axis=1, out=pre[:, :size])
        np.maximum.accumulate(value[:, size - 1 :: -1], axis=1, out=suf[:, size - 1 :: -1])
        new = pre[:, before] + g
        np.maximum(new, suf[:, after] - g, out=new)
        for k in range(steps.window.shape[1]):
            np.maximum(new, value[:, steps.window[:, k]] + g * steps.offset[None, :, k], out=new)
        value[:, :size] = new
    result: FloatArray = value[:, :size].max(axis=1)
    return result


def _margin(w: FloatArray, q: float, n: int, m: int) -> FloatArray:
    """Rounding margin per row of ``w`` (see module docstring)."""
    absw = np.abs(w)
    a = q * absw[:, 0] + 2.0 * absw[:, 1:].sum(axis=1)
    margin: FloatArray = (n + m + 8) * 2.0**-47 * a + 2.0**-51 * q * absw.sum(axis=1)
    return margin


def _enumerated_sup(
    basis: FloatArray, q: float | None, v: FloatArray | None, steps: _Transitions | None
) -> float:
    """``sup ‖basis·(s − s')‖₁`` over the signals (raw: ``[0, 1]^n`` when ``q`` is None;
    difference: ``d = 1``, ``R = q``), enumerating all ``2^(rows−1)`` sign vectors, rounding
    margin included."""
    rows, n = basis.shape
    count = 2 ** (rows - 1)
    best = 0.0
    for start in range(0, count, _BATCH):
        w = _sign_vectors(rows, start, min(count, start + _BATCH)) @ basis
        if q is None:
            bracket = np.abs(w).sum(axis=1) * (1.0 + (n + rows + 8) * 2.0**-47)
        else:
            assert v is not None
            assert steps is not None
            both = np.concatenate([w, -w])
            top = _chain_maximum(both, v, steps) + _margin(both, q, n, rows)
            bracket = top[: w.shape[0]] + top[w.shape[0] :]
        best = max(best, float(np.max(bracket)))
    return best


def _blocked_sup(
    basis: FloatArray,
    budget: int,
    unit_cost: int,
    *,
    q: float | None,
    v: FloatArray | None = None,
    steps: _Transitions | None = None,
) -> tuple[float, bool]:
    """The exact supremum when ``2^(m−1)·unit_cost ≤ budget``; otherwise the valid upper bound
    ``Σ_blocks sup ‖B_block(s − s')‖₁`` over consecutive blocks of rows (``‖v‖₁`` is the sum of
    the blocks' L1 norms, and each block's is at most its own supremum), with the largest block
    size whose total enumeration fits the budget (down to single rows: per-coefficient ranges)."""
    m = basis.shape[0]
    if 2 ** (m - 1) * unit_cost <= budget:
        return _enumerated_sup(basis, q, v, steps), True
    size = m - 1
    while size > 1 and math.ceil(m / size) * 2 ** (size - 1) * unit_cost > budget:
        size -= 1
    total = sum(_enumerated_sup(basis[i : i + size], q, v, steps) for i in range(0, m, size))
    return total, False


@lru_cache(maxsize=512)
def _unit_raw(transform: str, n: int, m: int) -> tuple[float, bool]:
    """``sup ‖B_m(s − s')‖₁`` over ``s, s' ∈ [0, 1]^n`` (exact) or an upper bound."""
    return _blocked_sup(coefficient_basis(transform, n, m), MAX_SIGN_VECTORS, 1, q=None)


@lru_cache(maxsize=512)
def _unit_difference(transform: str, n: int, m: int, q: float) -> tuple[float, bool]:
    """``sup ‖B_m(D − D')‖₁`` over difference chunks with ``d = 1``, ``R = q`` (exact) or an
    upper bound (blocks of coefficients) when the sign enumeration is too much work."""
    v = _grid(q, n)
    return _blocked_sup(
        coefficient_basis(transform, n, m), MAX_DP_WORK, v.size * n, q=q, v=v, steps=_transitions(v)
    )


@dataclass(frozen=True)
class TightSensitivity:
    """Sensitivities of the ``m`` kept coefficients per feature, in coefficient units.

    Attributes:
        l1: float64 (F,) the exact worst-case L1 distance of the kept coefficients over all pairs
            of inputs in the box (``exact``), else a valid upper bound; never above ``l1_loose``.
        l2: float64 (F,) an L2 sensitivity for Gaussian noise: ``min(l2_loose, l1)``.
        l1_loose: float64 (F,) ``√m·Δ2``, the bound the mechanisms use today.
        l2_loose: float64 (F,) ``Δ2`` of the signal (``bounds``).
        exact: True when every feature's ``l1`` is the exact supremum.
        m: kept coefficients.
    """

    l1: FloatArray
    l2: FloatArray
    l1_loose: FloatArray
    l2_loose: FloatArray
    exact: bool
    m: int

    @property
    def ratio(self) -> FloatArray:
        """``l1 / l1_loose`` per feature: the fraction of the Laplace noise the tight bound
        needs."""
        return np.asarray(self.l1 / self.l1_loose, dtype=np.float64)


def lpa_l1_sensitivity(bounds: Bounds, n: int) -> FloatArray:
    """LPA's exact L1 sensitivity ``Δ1 = n·R`` (every one of the n values may move by R; reached
    by all-lo against all-hi), float64 of the bounds' shape."""
    return np.asarray(n * bounds.range, dtype=np.float64)


def kept_coefficient_sensitivity(
    name: str,
    bounds: Bounds,
    n: int,
    k: int,
    transform: str,
    *,
    n_features: int | None = None,
) -> TightSensitivity:
    """Exact worst-case L1 (and an L2 bound) of the kept coefficients, per feature.

    Args:
        name: ``"fpa"`` or ``"cfpa"`` (raw chunk), ``"dcfpa"`` (difference chunk), or ``"lpa"``
            (every value: ``l1 = n·R``, ``l2 = √n·R``, exact).
        bounds: public bounds (``max_step`` required for dcfpa).
        n: values per feature per release (a power of two for cfpa and dcfpa).
        k: kept frequencies (``m = 2k − 1`` for dft, ``k`` for dct).
        transform: ``"dft"`` or ``"dct"``.
        n_features: F when the bounds are scalars (default 1).

    Raises:
        ConfigError: naming an invalid argument.
    """
    kind = mechanism_kind(name)
    n = kind.check_n(n)
    f = bounds.n_features or (1 if n_features is None else int(n_features))
    b = bounds.broadcast(f)
    if not kind.transformed:
        l1 = lpa_l1_sensitivity(b, n)
        l2 = raw_sensitivity_l2(b, n)
        return TightSensitivity(l1=l1, l2=l2, l1_loose=l1, l2_loose=l2, exact=True, m=n)
    if transform not in TRANSFORMS:
        raise ConfigError("transform", transform, f"must be one of {TRANSFORMS}")
    top = max_k(transform, n)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= top:
        raise ConfigError("k", k, f"must be an integer in 1..{top} ({transform}, n = {n})")
    m = kept_coefficients(transform, int(k))
    if kind.difference:
        delta2 = difference_sensitivity_l2(b, n)
        d = b.effective_step()
        l1 = np.empty(f)
        exact = True
        for i in range(f):
            q = float(b.range[i] / d[i])
            unit, ok = _unit_difference(transform, n, m, q)
            l1[i] = unit * float(d[i])
            exact &= ok
    else:
        delta2 = raw_sensitivity_l2(b, n)
        unit, exact = _unit_raw(transform, n, m)
        l1 = unit * b.range
    l1 = l1 * (1.0 + 2.0**-50)  # the final scaling's rounding, in the safe direction
    loose = math.sqrt(m) * delta2
    l1 = np.minimum(l1, loose)
    return TightSensitivity(
        l1=np.asarray(l1, dtype=np.float64),
        l2=np.minimum(delta2, l1),
        l1_loose=np.asarray(loose, dtype=np.float64),
        l2_loose=np.asarray(delta2, dtype=np.float64),
        exact=bool(exact),
        m=m,
    )


def sensitivity_of(
    kind: MechanismKind, bounds: Bounds, n: int, k: int, transform: str
) -> Sensitivity:
    """Sensitivities of the ``m`` noised coefficients of ``kind`` from the public bounds (per
    feature).

    Loose (always valid): an orthonormal projection never increases L2 distances, so the
    signal's ``Δ2`` bounds the kept coefficients' (raw chunk ``√n·R``; difference chunk
    ``√(R² + (n−1)(2d)²)``); L1 by Cauchy–Schwarz, ``‖v‖₁ ≤ √m·‖v‖₂``; LPA exactly ``n·R``.
    Tight (``m ≤`` :data:`~gazeguard.privacy.mechanisms.registry.TIGHT_MAX_M`): the exact worst
    case of ``‖c − c'‖₁`` over every pair of inputs in the clipped box
    (:func:`kept_coefficient_sensitivity`), and ``L2 = min(Δ2, L1)``; 0.37–0.55 of the loose L1
    for DCFPA at the shipped bounds.
    """
    m = kind.kept(transform, k, n)
    if kind.difference:
        l2 = difference_sensitivity_l2(bounds, n)
        d = bounds.effective_step()
        norm = np.sqrt(bounds.range**2 + (n - 1) * d**2)
    else:
        l2 = raw_sensitivity_l2(bounds, n)
        norm = l2
    l1 = float(n) * bounds.range if not kind.transformed else np.sqrt(m) * l2
    if kind.transformed and m <= TIGHT_MAX_M:
        tight = kept_coefficient_sensitivity(kind.name, bounds, n, k, transform)
        l1, l2 = tight.l1, tight.l2
    as64 = np.asarray
    return Sensitivity(as64(l1, np.float64), as64(l2, np.float64), as64(norm, np.float64))
