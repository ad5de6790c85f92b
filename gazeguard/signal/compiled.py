"""Compiled per-block passes (optional, numba) for a process that serves many sessions: the
raw block's decode (:func:`gazeguard.signal.rawgaze.decode_many`), the event detector's pass
(:meth:`gazeguard.signal.events.EventDetector._classify` with its ``_runs`` and ``_close``) and the
feature extractor's sample binning
(:meth:`gazeguard.signal.features.FeatureExtractor._bin_samples`),
each sample by sample in one machine-code loop instead of a few dozen numpy calls and a
Python loop per run or bin; and per feature step, the window's event statistics
(:meth:`~gazeguard.signal.features.FeatureExtractor._event_values`: sums, means, variances, maxima)
and the clip of a vector whose values are all defined, one call each instead of ~15 numpy
calls.

Why: a fleet worker hands each session about a second of samples at a time, and for blocks
that small the numpy calls' fixed cost, not the arithmetic, is most of a pass
(``docs/design.md``). These passes are the one fast path; the per-session numpy code stays
the reference and the default: :func:`load_kernels` gives the passes, chosen once where a
fleet worker starts (``fleet.compiled``) and handed to what runs them (``kernels=`` of
:class:`~gazeguard.signal.events.EventDetector`,
:class:`~gazeguard.signal.features.FeatureExtractor` and
:func:`~gazeguard.signal.rawgaze.decode_many`), and the tests check that both give the same
events, bins and vectors bit for bit (``tests/signal/test_compiled.py``). Both passes only
use operations whose result does not depend on order (comparisons, min, max, integer sums)
or the reference's own order (a velocity's sums over the half-width), so they can follow the
samples one by one. The window statistics add
floats in numpy's own order: :func:`_pairwise_sum` is numpy's pairwise summation (what
``np.add.reduce`` does for a contiguous row), checked against it bit for bit.

Cost of using them: importing numba and loading the cached machine code takes ~0.7 s and
~100 MB of resident memory per process (measured here), which is why the single-headset
sidecar keeps numpy. The passes keep the GIL (no ``nogil``): each is ~10 µs, and a release
would let the worker's other threads (the ledger's prefetch) take the GIL from the event loop
for up to the switch interval (5 ms) at every call.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DECODED_FINITE",
    "DECODED_INCREASING",
    "RUN_F",
    "RUN_I",
    "Kernels",
    "load_kernels",
]

#: Integer fields of the packed open run (``ri``): has_open, cls, start (global index),
#: prev_cls, gap_before, n, sx, sy (1e-6 deg).
RUN_I = 8
#: Float fields of the packed open run (``rf``): t_start, t_last, x_before, y_before, xmin,
#: xmax, ymin, ymax, vmax, anchor.
RUN_F = 10
#: Flags of the compiled decode (:func:`_decode`): every timestamp finite; strictly increasing.
DECODED_FINITE, DECODED_INCREASING = 1, 2


class Kernels(NamedTuple):
    """The compiled passes (numba dispatchers; see the functions they compile)."""

    ivt_pass: Callable[..., Any]  # _ivt_pass
    bin_samples: Callable[..., Any]  # _bin_samples
    event_stats: Callable[..., Any]  # _event_stats
    clip: Callable[..., Any]  # _clip
    decode: Callable[..., Any]  # _decode


# The codes and scales of gazeguard.signal.events, for the compiled code (numba freezes module-level
# ints and floats as constants); tests/signal/test_compiled.py checks that they match.
_C_UNDEF, _C_SLOW, _C_FAST, _C_INVALID = 0, 1, 2, 3  # sample classes
_K_UNDEFINED, _K_FIXATION, _K_SACCADE, _K_BLINK, _K_LOSS = 0, 1, 2, 3, 4  # EventKind
_QUANTUM = 1e6  # positions summed as integers of 1e-6 deg
_CLIP_DEG = 1e5  # positions clipped to ±this before quantising
# Positions in the feature vector (gazeguard.signal.features.NAMES) of what _event_stats computes.
_V_FIX = (0, 1, 2, 3, 4)  # rate, duration mean, var, max, dispersion mean
_V_SAC = (5, 6, 7, 8, 9, 10, 11)  # rate, amplitude mean, var, max, peak velocity mean, max,
# duration mean
_V_SAC_FIX_RATIO = 19
_V_BLINK = (20, 21, 22)  # rate, duration mean, var
_PW_BLOCK = 128  # numpy's PW_BLOCKSIZE: pairwise summation adds up to this many in one loop


def load_kernels(on: bool = True) -> Kernels | None:
    """The compiled passes (``on``; needs numba), to hand to the detectors, extractors and
    decoder of a process that chose them: the same results as numpy bit for bit, less CPU per
    small block. The first call compiles the passes (or loads them from numba's cache next to
    this file); later calls return the same ones.

    Returns:
        The passes, or ``None`` (run numpy) for ``on=False``, where numba is not installed, or
        where the environment sets ``GAZEGUARD_COMPILED=0``.
    """
    if not on or os.environ.get("GAZEGUARD_COMPILED", "1") == "0":
        return None
    return _compile()


@functools.cache
def _compile() -> Kernels | None:
    """The passes compiled (once per process: numba's dispatchers), ``None`` without numba."""
    try:
        import numba  # noqa: PLC0415 - optional, heavy
    except ImportError:
        return None
    # Explicit signatures: compiled (or loaded from the cache) here, at startup, not at a
    # first call in the middle of serving (a stall of seconds). Arrays of any layout; the
    # inputs may be read-only (blocks decoded from the wire are).
    t = numba.types
    i64, f64 = t.int64, t.float64
    out = {dt: t.Array(dt, 1, "A") for dt in (i64, f64, t.boolean)}
    inp = {dt: t.Array(dt, 1, "A", readonly=True) for dt in (i64, f64, t.boolean)}
    ivt = t.Array(f64, 2, "A")(
        inp[f64], t.Array(f64, 2, "A", readonly=True), inp[t.boolean],
        i64, i64, i64, i64, f64, f64, i64, f64, f64, inp[f64], out[i64], out[f64], out[i64],
    )  # fmt: skip
    bins = i64(
        inp[f64], inp[t.boolean], inp[f64], f64, f64, f64, i64, f64, f64, f64,
        out[i64], out[i64], out[i64], out[i64], out[f64], out[f64],
    )  # fmt: skip
    ring = t.Array(f64, 2, "A")
    stats = t.void(ring, i64, i64, ring, i64, i64, ring, i64, i64, f64, out[f64])
    clip = i64(inp[f64], inp[f64], inp[f64], out[f64])
    decode = i64(t.Array(f64, 2, "A", readonly=True), ring, out[t.boolean])
    for helper in (_block_sum, _pairwise_sum, _mean_var, _maximum):  # _event_stats'
        numba.extending.register_jitable(helper)
    jit = functools.partial(numba.njit, cache=True)  # holding the GIL: see the docstring
    return Kernels(
        jit(ivt)(_ivt_pass),
        jit(bins)(_bin_samples),
        jit(stats)(_event_stats),
        jit(clip)(_clip),
        jit(decode)(_decode),
    )


def _bin_samples(  # noqa: PLR0917 - the bins' columns, as stored
    ts: np.ndarray,
    valid: np.ndarray,
    pupil: np.ndarray,
    t0: float,
    s: float,
    r: float,
    base: int,
    q: float,
    lo: float,
    hi: float,
    n_valid: np.ndarray,
    n_pupil: np.ndarray,
    s1: np.ndarray,
    s2: np.ndarray,
    b_min: np.ndarray,
    b_max: np.ndarray,
) -> int:
    """Add samples (``ts`` s, ``valid``, ``pupil`` mm; shape (N,)) to their bins: bin id
    ``2 j + sub`` of step interval ``j`` from ``t0`` (step ``s``, sub-interval from ``r`` s on),
    at position ``id - base`` of the columns (which must reach the last sample's bin). Counts
    valid samples; pupils in ``[lo, hi]`` mm are counted, summed as integers of ``1 / q`` mm
    (and squared) and give the bins' min and max. Returns the number of finite pupils out of
    range (ignored)."""
    out_of_range = 0
    for i in range(ts.shape[0]):
        t = ts[i]
        j = math.floor((t - t0) / s)  # as FeatureExtractor._bin_id: the same float operations
        if t < t0 + j * s:
            j -= 1
        if t >= t0 + (j + 1) * s:
            j += 1
        b = 2 * j - base
        if t >= t0 + j * s + r:
            b += 1
        if valid[i]:
            n_valid[b] += 1
        p = pupil[i]
        if lo <= p <= hi:
            n_pupil[b] += 1
            pq = int(np.rint(p * q))
            s1[b] += pq
            s2[b] += pq * pq
            b_min[b] = min(b_min[b], p)
            b_max[b] = max(b_max[b], p)
        elif math.isfinite(p):
            out_of_range += 1
    return out_of_range


def _ivt_pass(  # noqa: PLR0912, PLR0915, PLR0917 - one numeric loop, compiled
    t: np.ndarray,
    xy: np.ndarray,
    ok: np.ndarray,
    n: int,
    a: int,
    stop: int,
    h: int,
    thr: float,
    g: float,
    g0: int,
    dt: float,
    grid: float,
    limits: np.ndarray,
    ri: np.ndarray,
    rf: np.ndarray,
    counts: np.ndarray,
) -> np.ndarray:
    """Classify buffer samples ``[a, stop)`` (``a < stop <= n``) and close the runs they
    complete; returns the completed events, float64 (k, 13).

    Args:
        t, xy, ok: the detector's buffer (s; deg, (cap, 2); valid), first ``n`` rows in use.
        h: velocity half-width, samples; thr: saccade threshold, deg/s; g: max gap, s.
        g0: global index of buffer row 0; dt: nominal interval, s; grid: the grid long runs are
            cut at, s (``gazeguard.signal.events.SPLIT_GRID_S``).
        limits: min_fixation_s, min_saccade_s, min_blink_s, max_blink_s.
        ri, rf: the open run, packed (:data:`RUN_I`, :data:`RUN_F`); updated in place.
        counts: gaps, then events per kind (5); incremented in place.
    """
    inf = np.inf
    nan = np.nan
    r0 = max(0, a - h)
    r1 = min(n, stop + h)
    i0 = max(a, r0 + h)
    i1 = min(stop, r1 - h)
    rows = np.empty((stop - a + 1, 13))
    k = 0
    # the open run
    has = ri[0] != 0
    rcls, rstart, rprev, rgap, rn, rsx, rsy = ri[1], ri[2], ri[3], ri[4] != 0, ri[5], ri[6], ri[7]
    rts, rtl, rxb, ryb = rf[0], rf[1], rf[2], rf[3]
    rxmin, rxmax, rymin, rymax, rvmax, ranchor = rf[4], rf[5], rf[6], rf[7], rf[8], rf[9]
    # the segment being gathered (a run of equal class, split at gaps and grid points)
    s0 = a
    scls = _C_UNDEF
    sgap = False
    scut = nan
    ssx = ssy = 0
    sxmin = symin = inf
    sxmax = symax = -inf
    svmax = -inf
    for i in range(a, stop + 1):
        if i < stop:
            gap = i > 0 and t[i] - t[i - 1] > g
            if gap:
                counts[0] += 1
            cut = nan  # the grid point crossed since the previous sample, if any
            if i > 0:
                cell = np.floor(t[i] / grid)
                if cell != np.floor(t[i - 1] / grid):
                    cut = cell * grid
            if not ok[i]:
                c = _C_INVALID
                v = nan
            elif i0 <= i < i1:
                clean = True
                for j in range(i - h, i + h + 1):
                    if not ok[j] or (j > i - h and t[j] - t[j - 1] > g):
                        clean = False
                        break
                if clean:
                    dx = xy[i + 1, 0] - xy[i - 1, 0]
                    dy = xy[i + 1, 1] - xy[i - 1, 1]
                    dd = t[i + 1] - t[i - 1]
                    for j in range(2, h + 1):
                        dx += xy[i + j, 0] - xy[i - j, 0]
                        dy += xy[i + j, 1] - xy[i - j, 1]
                        dd += t[i + j] - t[i - j]
                    v = np.hypot(dx, dy) / dd
                    c = _C_FAST if v >= thr else _C_UNDEF if np.isnan(v) else _C_SLOW
                else:
                    c = _C_UNDEF
                    v = nan
            else:
                c = _C_UNDEF
                v = nan
            if i > a and c == scls and not gap and np.isnan(cut):  # the segment goes on
                if c in (_C_SLOW, _C_FAST):  # valid samples only
                    x = min(max(xy[i, 0], -_CLIP_DEG), _CLIP_DEG)
                    y = min(max(xy[i, 1], -_CLIP_DEG), _CLIP_DEG)
                    ssx += int(np.rint(x * _QUANTUM))
                    ssy += int(np.rint(y * _QUANTUM))
                    sxmin = min(sxmin, xy[i, 0])
                    sxmax = max(sxmax, xy[i, 0])
                    symin = min(symin, xy[i, 1])
                    symax = max(symax, xy[i, 1])
                    svmax = max(svmax, v)
                continue
        if i > a:  # the segment [s0, i) is complete: extend the open run or close it
            e = i
            moving = scls in (_C_SLOW, _C_FAST)
            same = has and rcls == scls and not sgap
            if same and not scut - ranchor >= grid:  # the run goes on (NaN: no cut)
                rn += e - s0
                rtl = t[e - 1]
                if moving:
                    rsx += ssx
                    rsy += ssy
                    rxmin = sxmin if sxmin < rxmin else rxmin
                    rymin = symin if symin < rymin else rymin
                    rxmax = sxmax if sxmax > rxmax else rxmax
                    rymax = symax if symax > rymax else rymax
                    rvmax = svmax if svmax > rvmax else rvmax
            else:
                tb = t[s0]
                ngap = sgap or same  # a cut run counts as followed by a gap
                if has:  # close the open run, followed by this segment (or cut)
                    t_end = scut if same else rtl + dt if sgap else tb
                    dur = t_end - rts
                    ex = ey = edx = edy = eamp = evpk = edisp = nan
                    kind = _K_UNDEFINED
                    if rcls == _C_SLOW:
                        if dur >= limits[0]:
                            kind = _K_FIXATION
                            ex = rsx / _QUANTUM / rn
                            ey = rsy / _QUANTUM / rn
                            evpk = rvmax
                            edisp = (rxmax - rxmin) + (rymax - rymin)
                    elif rcls == _C_FAST:
                        flanked = rprev == _C_SLOW and not rgap and scls == _C_SLOW and not ngap
                        if flanked and dur >= limits[1]:
                            kind = _K_SACCADE
                            ex = xy[s0, 0]
                            ey = xy[s0, 1]
                            edx = ex - rxb
                            edy = ey - ryb
                            eamp = np.hypot(edx, edy)
                            evpk = rvmax
                    elif rcls == _C_INVALID:
                        kind = _K_LOSS
                        bounded = rprev >= 0 and not rgap and not ngap
                        if bounded and limits[2] <= dur <= limits[3]:
                            kind = _K_BLINK
                    counts[1 + kind] += 1
                    row = rows[k]
                    row[0] = kind
                    row[1] = rstart
                    row[2] = rstart + rn
                    row[3] = rts
                    row[4] = t_end
                    row[5] = dur
                    row[6] = ex
                    row[7] = ey
                    row[8] = edx
                    row[9] = edy
                    row[10] = eamp
                    row[11] = evpk
                    row[12] = edisp
                    k += 1
                rprev = rcls if has else -1
                rgap = ngap or not has
                ranchor = scut if same else tb
                has = True
                rcls = scls
                rstart = g0 + s0
                rts = tb
                rtl = t[e - 1]
                rxb = xy[s0 - 1, 0] if s0 > 0 else nan
                ryb = xy[s0 - 1, 1] if s0 > 0 else nan
                rn = e - s0
                if moving:
                    rsx, rsy = ssx, ssy
                    rxmin, rxmax, rymin, rymax, rvmax = sxmin, sxmax, symin, symax, svmax
                else:
                    rsx = rsy = 0
                    rxmin = rymin = inf
                    rxmax = rymax = rvmax = -inf
        if i == stop:
            break
        # a new segment starts at i
        s0 = i
        scls = c
        sgap = gap
        scut = cut
        if c in (_C_SLOW, _C_FAST):  # valid samples only
            x = min(max(xy[i, 0], -_CLIP_DEG), _CLIP_DEG)
            y = min(max(xy[i, 1], -_CLIP_DEG), _CLIP_DEG)
            ssx = int(np.rint(x * _QUANTUM))
            ssy = int(np.rint(y * _QUANTUM))
            sxmin = sxmax = xy[i, 0]
            symin = symax = xy[i, 1]
            svmax = v
    ri[0] = 1 if has else 0
    ri[1], ri[2], ri[3], ri[4], ri[5], ri[6], ri[7] = rcls, rstart, rprev, rgap, rn, rsx, rsy
    rf[0], rf[1], rf[2], rf[3] = rts, rtl, rxb, ryb
    rf[4], rf[5], rf[6], rf[7], rf[8], rf[9] = rxmin, rxmax, rymin, rymax, rvmax, ranchor
    return rows[:k]


def _pairwise_sum(a: np.ndarray, lo: int, n: int) -> float:
    """``np.add.reduce(a[lo : lo + n])`` for float64 ``a`` (1-D, or a row of a 2-D array
    reduced along it), bit for bit: ``0.0 +`` numpy's pairwise summation, which adds up to
    :data:`_PW_BLOCK` values in eight interleaved partial sums and splits longer ranges in two
    halves (cut at a multiple of 8), summed separately and then added. The halving is done
    here with a stack of pending ranges instead of recursion (one ``-1`` entry: add the last
    two sums)."""
    if n <= _PW_BLOCK:
        return 0.0 + _block_sum(a, lo, n)
    todo_lo = np.empty(128, dtype=np.int64)  # ranges to sum (n = -1: add the last two sums)
    todo_n = np.empty(128, dtype=np.int64)
    sums = np.empty(64)
    todo_lo[0], todo_n[0] = lo, n
    k, m = 1, 0
    while k:
        k -= 1
        lo_k, n_k = todo_lo[k], todo_n[k]
        if n_k < 0:
            m -= 1
            sums[m - 1] += sums[m]
        elif n_k <= _PW_BLOCK:
            sums[m] = _block_sum(a, lo_k, n_k)
            m += 1
        else:
            half = n_k // 2
            half -= half % 8
            todo_n[k] = -1  # then add them: left + right
            todo_lo[k + 1], todo_n[k + 1] = lo_k + half, n_k - half  # then the right half
            todo_lo[k + 2], todo_n[k + 2] = lo_k, half  # the left half first
            k += 3
    return float(0.0 + sums[0])


def _block_sum(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise summation of ``a[lo : lo + n]``, ``n <= 128``: one by one (from
    ``-0.0``) below 8 values, else eight interleaved partial sums, added pairwise, then the
    last ``n % 8`` values."""
    if n < 8:
        res = -0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = lo + 8
    end = lo + n - n % 8
    while i < end:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < lo + n:
        res += a[i]
        i += 1
    return float(res)


def _event_stats(  # noqa: PLR0917 - the three event rings, as stored
    fix: np.ndarray,
    f0: int,
    f1: int,
    sac: np.ndarray,
    s0: int,
    s1: int,
    blink: np.ndarray,
    b0: int,
    b1: int,
    w: float,
    v: np.ndarray,
) -> None:
    """The event statistics of a window of ``w`` s into the feature vector ``v`` (float64
    (F,), features in :data:`gazeguard.signal.features.NAMES` order; every other entry set to NaN):
    the rates, means, variances and maxima of
    :meth:`gazeguard.signal.features.FeatureExtractor._event_values`, computed as it computes them
    (numpy's sums, ``sum / n``, the mean of squared deviations), from the window's events
    ``[f0, f1)`` of ``fix`` (rows: duration, dispersion), ``[s0, s1)`` of ``sac`` (amplitude,
    peak velocity, duration) and ``[b0, b1)`` of ``blink`` (duration)."""
    v[:] = np.nan
    nf, ns, nb = f1 - f0, s1 - s0, b1 - b0
    v[_V_FIX[0]], v[_V_SAC[0]], v[_V_BLINK[0]] = nf / w, ns / w, nb / w
    if nf:
        _mean_var(fix[0], f0, nf, v, _V_FIX[1], _V_FIX[2])
        v[_V_FIX[3]] = _maximum(fix[0], f0, nf)
        v[_V_FIX[4]] = _pairwise_sum(fix[1], f0, nf) / nf
        v[_V_SAC_FIX_RATIO] = ns / nf
    if ns:
        _mean_var(sac[0], s0, ns, v, _V_SAC[1], _V_SAC[2])
        v[_V_SAC[3]] = _maximum(sac[0], s0, ns)
        v[_V_SAC[4]] = _pairwise_sum(sac[1], s0, ns) / ns
        v[_V_SAC[5]] = _maximum(sac[1], s0, ns)
        v[_V_SAC[6]] = _pairwise_sum(sac[2], s0, ns) / ns
    if nb:
        _mean_var(blink[0], b0, nb, v, _V_BLINK[1], _V_BLINK[2])


def _mean_var(  # noqa: PLR0917 - a row's range and where its two values go
    a: np.ndarray, lo: int, n: int, v: np.ndarray, at_mean: int, at_var: int
) -> None:
    """``v[at_mean]``, ``v[at_var]`` = the mean and variance of ``a[lo : lo + n]`` (``n >= 1``)
    as ``ndarray.mean`` and ``ndarray.var`` compute them, bit for bit: numpy's sum over ``n``;
    numpy's sum of the squared deviations (``d * d``) over ``n``."""
    mean = _pairwise_sum(a, lo, n) / n
    d = np.empty(n)
    for i in range(n):
        x = a[lo + i] - mean
        d[i] = x * x
    v[at_mean] = mean
    v[at_var] = _pairwise_sum(d, 0, n) / n


def _maximum(a: np.ndarray, lo: int, n: int) -> float:
    """``np.maximum.reduce(a[lo : lo + n])`` (``n >= 1``): NaN if any value is NaN."""
    m = a[lo]
    for i in range(lo + 1, lo + n):
        x = a[i]
        if not x <= m:  # larger, or NaN
            if math.isnan(m):
                break
            m = x
    return float(m)


def _clip(raw: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: np.ndarray) -> int:
    """``out = np.minimum(np.maximum(raw, lo), hi)`` (float64 (F,)) where no value of ``raw``
    is NaN; returns how many values the clip changed, or -1 (``out`` undefined) at the first
    NaN."""
    clipped = 0
    for i in range(raw.shape[0]):
        x = raw[i]
        if math.isnan(x):
            return -1
        y = x if x > lo[i] else lo[i]  # a tie gives the bound, as numpy does (-0.0 vs 0.0)
        y = y if y < hi[i] else hi[i]
        out[i] = y
        if y != x:
            clipped += 1
    return clipped


def _decode(a: np.ndarray, xyp: np.ndarray, valid: np.ndarray) -> int:
    """A raw gaze block's arrays (:mod:`gazeguard.signal.rawgaze`), as
    :meth:`gazeguard.core.samples.GazeSamples.from_arrays` makes them: ``a`` float64 (4, N) as sent
    (timestamps s, x deg, y deg, pupil mm); ``valid`` (N,) = x and y finite; ``xyp`` (3, N)
    = x, y and pupil, NaN where not valid. Returns flags: :data:`DECODED_FINITE` (every
    timestamp finite), :data:`DECODED_INCREASING` (timestamps strictly increasing)."""
    n = a.shape[1]
    finite = True
    increasing = True
    for i in range(n):
        t = a[0, i]
        if not math.isfinite(t):
            finite = False
        if i and not t > a[0, i - 1]:
            increasing = False
        x, y = a[1, i], a[2, i]
        ok = math.isfinite(x) and math.isfinite(y)
        valid[i] = ok
        if ok:
            xyp[0, i], xyp[1, i], xyp[2, i] = x, y, a[3, i]
        else:
            xyp[0, i] = xyp[1, i] = xyp[2, i] = np.nan
    return (DECODED_FINITE if finite else 0) | (DECODED_INCREASING if increasing else 0)
