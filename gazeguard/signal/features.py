"""Sliding-window eye-movement features: one vector every ``step_s`` over the last ``window_s``.

The feature set follows Bulling et al. 2011 and Steil et al. 2019 (MPIIDPEye): fixation, saccade,
blink, pupil and saccade-direction wordbook (n-gram) statistics, plus the data quality. Every
feature is declared once in :data:`FEATURES` with its name, unit, description and its **public
bounds** ``lo``, ``hi`` and ``max_step`` and the reasoning behind them. The bounds ship with the
package and define the mechanisms' sensitivities; they never come from the user's data.

Timing (``t0`` = the grid's start, ``W = window_s``, ``s = step_s``):

- ``t0`` is public: the extractor's ``start_s`` (a live session passes the chunk grid point at
  or after its declared open), else the multiple of ``s`` at or before the first sample (offline
  use). Samples before it are dropped. Step ``k >= 0`` covers the window ``[t0 + k*s, t0 + k*s +
  W)`` and is stamped with its end time ``T_k = t0 + k*s + W``: nothing is anchored at a sample.
- Step ``k`` is emitted by the first :meth:`FeatureExtractor.push` after which the event detector
  has classified a sample at or after ``T_k`` (a few samples of velocity look-ahead), or by
  :meth:`FeatureExtractor.advance` once the clock says no earlier sample will come. At a gap in
  the samples the detector is finished and resumed, so what lies before a gap is final at once.
  A vector never depends on how the stream was cut into blocks or when it was advanced:
  recorded and live data give identical vectors, and a pause's windows (held values, then
  defaults) are emitted like any other.
- An event belongs to the window when its end time ``t_end`` lies in it; sample statistics
  (pupil, valid fraction) use the samples whose timestamps lie in it.

Always finite (documented, deterministic treatment, counted in :attr:`FeatureExtractor.stats`):

- A window whose valid fraction is below ``min_valid_fraction`` (default 0.5) is *low quality*:
  every feature except ``valid_fraction`` is *held*.
- A value undefined in a window (a mean over no events, pupil covering < 50% of the window, a
  ratio over no saccades) is held.
- A held value repeats the previous value for at most ``hold_limit_s`` (default ``W``; the last
  repeat is at most ``hold_limit_s`` after the step that defined it); after that, and before a
  feature's first defined value, the feature takes its **public default**
  (:meth:`Feature.default`: the typical rate for the rate features, 0 for the wordbook
  statistics, the midpoint of ``[lo, hi]`` otherwise; declared in the registry, never from data).
- Finally every value is clipped to ``[lo, hi]`` (per-event values are clipped to their plausible
  range before aggregation, so means, variances and maxima stay within bounds by construction).

**How far one gaze sample reaches** (the unit of privacy at the raw-gaze level). A sample at
time τ enters the vectors whose window contains it (stamped in ``(τ, τ + W]``) and, through the
fixation, saccade or blink that contains it, the vectors whose window contains that event's end
(``E`` = how long after τ that event ends: events end at invalid data and gaps; a long fixation
extends ``E``); a held value carries it at most ``hold_limit_s = H`` further. Everything is
causal, so the vectors it can change are stamped in ``(τ, τ + E + W + H]``, which meets at most
``⌈(W + H + E)/(n·s)⌉ + 1`` chunks of ``n`` steps of ``s`` seconds: 5 at the defaults (W = H =
30 s, n = 32, s = 0.5 s) for ``E`` up to 4 s; a changed stretch of ``d`` seconds adds ``d`` to
the numerator. Without the hold limit, invalid data after a change carried it into every later
chunk. ``tests/signal/test_features.py`` measures it on simulated gaze.

Bounds: ``lo``/``hi`` follow from physiology and the detector's definitions; ``max_step`` from
how many events can enter and leave the window in one step (``W``/``s`` enter every rule, so
:func:`feature_bounds` takes them). Some step bounds are exact (``valid_fraction``, pupil mean,
wordbook ``distinct``/``max`` given the event-rate ceiling); the others hold for plausible data
(e.g. a window with at least ``W`` fixations). A larger change between two steps is clipped in
the difference domain by DCFPA, which keeps the privacy guarantee and costs utility only at that
step. ``bench/validate_events.py`` measures how often that happens on real recordings: at most
2% of steps, for ``saccade_rate`` and the wordbook ``distinct`` counts (I-VT saccade bursts).

Cost: the window slides by one step at a time, so per step only the events entering and
leaving it are touched: event counts, the saccade property counts (the ratio features) and the
wordbook n-gram counts (with counts of counts for their max and min) are updated in place. Means,
variances and maxima are one numpy reduction each over the window's events of one kind, which
are kept per kind in contiguous rows (a 30 s window holds about a hundred per kind): the same
pairwise sums over the same values in the same order as a per-window recomputation, so the
vectors are bit-identical to it (``tests/signal/test_feature_equivalence.py`` compares them
with the frozen recomputation in ``tests/_reference_extraction.py``). Sample statistics come
from per-step sample bins (integer sums, min, max; a step is split in two where a window edge
falls inside it), never from the window's raw samples: the window's counts and sums are sliding
integer sums (exact), its pupil extremes a min and max over its bins.

In a live stream of small blocks, a block that cannot complete a step is only validated and
copied (coalescing), so the detector, bins and events run once per step interval, on about
``s`` seconds of samples; what that pass costs is mostly per-call overhead (Python and a few
dozen numpy calls on ~60 samples), not arithmetic. A worker that holds many sessions runs
the same passes compiled instead (``kernels``, :mod:`gazeguard.signal.compiled`), with the
same vectors bit for bit. ``bench/bench_features_cpu.py`` measures the numpy passes in the
fleet's access pattern (hundreds of sessions fed 100 ms blocks in turn).
"""

from __future__ import annotations

import bisect
import itertools
import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError, StreamError
from gazeguard.core.samples import FloatArray, GazeSamples
from gazeguard.signal import compiled
from gazeguard.signal.events import EventDetector, EventKind, Row, check_timestamps

__all__ = [
    "FEATURES",
    "Feature",
    "FeatureExtractor",
    "FeatureStats",
    "extract_features",
    "feature_bounds",
    "feature_defaults",
]

# --- Physiological constants: the public assumptions behind every bound ----------------------
# Event rates (events/s): (fewest in a usable window, most that end per second even in bursts).
# Humans make about 3 saccades/s in reading and scene viewing, rarely above 4-5/s; the minimum
# bounds how many events a usable window holds, which bounds how far a mean over them can move.
# The maximum bounds the events entering or leaving the window per step and the rate features.
FIXATION_RATE = (1.0, 5.0)
SACCADE_RATE = (1.0, 5.0)
BLINK_RATE = (0.1, 2.0)  # spontaneous blinking is 6-30/min; double blinks end 0.2-0.5 s apart
# Typical rates (the public default of the rate features, see Feature.default): about 3
# fixations and saccades per second in reading and scene viewing; 17 blinks/min is the mean
# spontaneous blink rate at rest (Bentivoglio et al. 1997), inside the 6-30/min range above.
TYPICAL_FIXATION_RATE = 3.0
TYPICAL_SACCADE_RATE = 3.0
TYPICAL_BLINK_RATE = 17.0 / 60.0
FIXATION_DURATION_MAX_S = 2.0  # longer I-VT fixations (staring) count as 2 s
FIXATION_DISPERSION_MAX_DEG = 5.0  # drift + microsaccades stay within ~2 deg; more is pursuit
SACCADE_AMPLITUDE_MAX_DEG = 30.0  # in headsets gaze shifts beyond ~20 deg recruit the head
SACCADE_PEAK_VELOCITY_MAX = 1000.0  # deg/s; the main sequence saturates at 500-700 deg/s
SACCADE_DURATION_MAX_S = 0.2  # saccades last 20-100 ms; one sample at 30 Hz is 33 ms
BLINK_DURATION_S = (0.05, 0.5)  # the detector's blink definition
PUPIL_MM = (1.5, 9.0)  # human pupil diameter range; samples outside are ignored as artefacts
PUPIL_SPEED_MAX = 4.0  # mm/s: peak constriction velocity of the light reflex
PUPIL_MIN_COVERAGE = 0.5  # pupil features need pupil samples over half the window
SAMPLE_INTERVAL_MAX_S = 1 / 30  # slowest supported tracker: 30 Hz
SMALL_SACCADE_DEG = 2.0  # "small" saccades: < 2 deg (reading-size and corrective)
LARGE_SACCADE_DEG = 8.0  # "large" saccades: >= 8 deg
WORD_SPLIT_DEG = 4.0  # wordbook letters: 8 directions x (amplitude < 4 deg, >= 4 deg)
WORDBOOK_LETTERS = 16
WORDBOOK_NS = (1, 2, 3, 4)
_WORD_STATS = ("distinct", "max", "min", "range", "mean")

Rule = Callable[[float, float], float]  # (window_s, step_s) -> value


def _ending_per_step(rate: tuple[float, float], s: float) -> int:
    """Most events of one kind that can end within one step: ``floor(max_rate * s) + 1``."""
    return math.floor(rate[1] * s) + 1


def _in_window(rate: tuple[float, float], w: float) -> int:
    """Fewest events of one kind in a usable window: ``max(1, floor(min_rate * W))``."""
    return max(1, math.floor(rate[0] * w))


@dataclass(frozen=True)
class Feature:
    """One feature of the vector.

    Attributes:
        name, unit, description: what it is.
        rationale: why its bounds are what they are.
        lo, hi: public range at the default W = 30 s, s = 0.5 s (values are clipped to it).
        max_step: largest plausible change between consecutive steps at the defaults; larger
            changes are clipped in the difference domain by the mechanism (DCFPA).
        default: the public value released when no value of the user may be (before the first
            defined value, and once a held value has repeated for the hold limit); fixed by
            ``default_rule``, never from data. The rule: rates take their typical rate, wordbook
            statistics 0 (the value of an empty wordbook), every other feature the midpoint
            ``(lo + hi) / 2`` of its public range (the minimax choice: no value of the feature
            is further than ``R/2`` from it, and it assumes nothing beyond the declared bounds).
    """

    name: str
    unit: str
    description: str
    rationale: str
    lo_rule: Rule
    hi_rule: Rule
    step_rule: Rule
    behaviour: bool = True  # False: data-quality feature, computed even in low-quality windows
    default_rule: Rule | None = None  # None: the midpoint of [lo, hi]

    def default(self, window_s: float = 30.0, step_s: float = 0.5) -> float:
        """The public default for window ``window_s`` s and step ``step_s`` s, in ``[lo, hi]``."""
        lo, hi = self.lo_rule(window_s, step_s), self.hi_rule(window_s, step_s)
        if self.default_rule is None:
            return (lo + hi) / 2
        return min(max(self.default_rule(window_s, step_s), lo), hi)

    def bounds(self, window_s: float = 30.0, step_s: float = 0.5) -> tuple[float, float, float]:
        """``(lo, hi, max_step)`` for a window of ``window_s`` s advanced by ``step_s`` s; no step
        exceeds the range."""
        lo, hi = self.lo_rule(window_s, step_s), self.hi_rule(window_s, step_s)
        return lo, hi, min(self.step_rule(window_s, step_s), hi - lo)

    @property
    def lo(self) -> float:
        return self.bounds()[0]

    @property
    def hi(self) -> float:
        return self.bounds()[1]

    @property
    def max_step(self) -> float:
        return self.bounds()[2]


def _c(v: float) -> Rule:
    return lambda w, s: v


# --- Bound rules, one per kind of statistic (the reasoning lives here) ----------------------
def _rate(name: str, desc: str, rate: tuple[float, float], typical: float) -> Feature:
    """Events ending in the window per second. In one step at most ``m = floor(max_rate*s)+1``
    events enter and at most ``m`` leave, so the count changes by at most ``m`` and the rate by
    at most ``m / W`` (exact bound, given the rate ceiling). Default: the ``typical`` rate."""
    return Feature(
        name,
        "1/s",
        desc,
        f"0 .. {rate[1]}/s (plausible ceiling); step m/W with m = floor({rate[1]}*s)+1 events "
        f"ending per step; default {typical:.3g}/s (typical)",
        _c(0.0),
        _c(rate[1]),
        lambda w, s: _ending_per_step(rate, s) / w,
        default_rule=_c(typical),
    )


def _mean(name: str, unit: str, desc: str, rate: tuple[float, float], r: float) -> Feature:
    """Mean of per-event values clipped to ``[0, R]``. With ``N`` events in the new window and at
    most ``m`` entering and ``m`` leaving, each changed event moves the mean by at most ``R/N``:
    ``|Δ| <= 2 m R / N``, with ``N >= floor(min_rate * W)`` in a usable window (fewer: larger
    steps are clipped by the mechanism)."""
    return Feature(
        name,
        unit,
        desc,
        f"per-event values clipped to 0..{r} {unit}; step 2mR/N with N >= {rate[0]}*W events",
        _c(0.0),
        _c(r),
        lambda w, s: min(r, 2 * _ending_per_step(rate, s) * r / _in_window(rate, w)),
    )


def _var(name: str, unit: str, desc: str, rate: tuple[float, float], r: float) -> Feature:
    """Population variance of per-event values in ``[0, R]``: at most ``R²/4``. Adding or
    removing one of N values changes it by at most ``R²/N``: ``|Δ| <= 2 m R² / N``."""
    return Feature(
        name,
        unit,
        desc,
        f"values in 0..{r}: variance <= R²/4; step 2mR²/N with N >= {rate[0]}*W events",
        _c(0.0),
        _c(r * r / 4),
        lambda w, s: min(r * r / 4, 2 * _ending_per_step(rate, s) * r * r / _in_window(rate, w)),
    )


def _max(name: str, unit: str, desc: str, r: float) -> Feature:
    """Largest per-event value in ``[0, R]``: the largest event may leave the window in any step,
    so no bound below ``R`` holds."""
    return Feature(
        name, unit, desc, f"0..{r} {unit}; the maximum can leave the window: step R", _c(0.0),
        _c(r), _c(r),
    )  # fmt: skip


def _ratio(name: str, desc: str, rate: tuple[float, float]) -> Feature:
    """Fraction of events with a property: a mean of 0/1 indicators, so ``|Δ| <= 2m / N``."""
    return Feature(
        name,
        "1",
        desc,
        f"fraction 0..1; step 2m/N with N >= {rate[0]}*W saccades",
        _c(0.0),
        _c(1.0),
        lambda w, s: min(1.0, 2 * _ending_per_step(rate, s) / _in_window(rate, w)),
    )


def _wordbook(n: int) -> list[Feature]:
    """Saccade-direction wordbook of n-grams (Bulling et al. 2011): saccades in the window are
    letters (8 directions x 2 amplitude classes); the wordbook counts each distinct n-gram of
    consecutive letters. With S saccades there are S-n+1 n-grams and S <= floor(5*W)+1. In one
    step each entering saccade adds one n-gram and each leaving one removes one (at most m each):
    ``distinct`` and ``max`` change by at most m (exact). ``min``, ``range`` and ``mean`` are over
    the occurring n-grams (Bulling's statistics over all 16^n entries are constant 0 for the
    minimum and redundant for the mean); when they move by more than the plausible steps given
    here (a rare n-gram leaving, a new letter in a very repetitive window), the mechanism clips
    the difference. The variance of the counts is left out: no useful step bound holds for it.
    Empty wordbook: all five are 0, which is also their public default (no saccade observed)."""

    def total(w: float, s: float) -> float:
        return float(max(1, math.floor(SACCADE_RATE[1] * w) + 1 - n + 1))

    def m(w: float, s: float) -> float:
        return float(_ending_per_step(SACCADE_RATE, s))

    def distinct_hi(w: float, s: float) -> float:
        return min(float(WORDBOOK_LETTERS**n), total(w, s))

    p = f"wordbook{n}"
    what = f"{n}-gram" if n > 1 else "letter"
    stats = [
        Feature(f"{p}_distinct", "count", f"distinct {what}s of saccade directions in the window",
                "<= min(16^n, S_max-n+1); step m (exact)", _c(0.0), distinct_hi, m),
        Feature(f"{p}_max", "count", f"count of the most frequent {what}",
                "<= S_max-n+1; step m (exact)", _c(0.0), total, m),
        Feature(f"{p}_min", "count", f"count of the least frequent occurring {what}",
                "<= S_max-n+1; plausible step m (clipped beyond)", _c(0.0), total, m),
        Feature(f"{p}_range", "count", f"max minus min {what} count",
                "<= S_max-n+1; plausible step 2m (clipped beyond)", _c(0.0), total,
                lambda w, s: 2 * m(w, s)),
        Feature(f"{p}_mean", "count", f"mean count of the occurring {what}s",
                "<= S_max-n+1; plausible step m (clipped beyond)", _c(0.0), total, m),
    ]  # fmt: skip
    return [replace(f, default_rule=_c(0.0)) for f in stats]


def _pupil_stats() -> list[Feature]:
    """Pupil diameter over the window's samples (samples outside 1.5..9 mm ignored), defined when
    pupil samples cover >= 50% of the window (N >= W/(2 dt) samples). Mean: at most s/dt + 1
    samples enter and leave per step, each moving the mean by at most R/N: ``|Δ| <= 4 s R / W``
    (+ one sample). Variance likewise ``<= 4 s R² / W``. Min/max: if the pupil moves at most
    4 mm/s, the extreme of a window shifted by s changes by at most ``4 mm/s * s``."""
    lo, hi = PUPIL_MM
    r = hi - lo

    def mean_step(w: float, s: float) -> float:
        return min(r, 2 * (s + SAMPLE_INTERVAL_MAX_S) * r / (PUPIL_MIN_COVERAGE * w))

    def var_step(w: float, s: float) -> float:
        return min(r * r / 4, 2 * (s + SAMPLE_INTERVAL_MAX_S) * r * r / (PUPIL_MIN_COVERAGE * w))

    def extreme_step(w: float, s: float) -> float:
        return min(r, PUPIL_SPEED_MAX * s)

    why = "pupil 1.5..9 mm; windows with >= 50% pupil coverage"
    return [
        Feature("pupil_mean", "mm", "mean pupil diameter", f"{why}; step 2(s+dt)R/(W/2)",
                _c(lo), _c(hi), mean_step),
        Feature("pupil_var", "mm²", "variance of the pupil diameter",
                f"{why}; <= R²/4; step 2(s+dt)R²/(W/2)", _c(0.0), _c(r * r / 4), var_step),
        Feature("pupil_min", "mm", "smallest pupil diameter", f"{why}; step 4 mm/s * s",
                _c(lo), _c(hi), extreme_step),
        Feature("pupil_max", "mm", "largest pupil diameter", f"{why}; step 4 mm/s * s",
                _c(lo), _c(hi), extreme_step),
    ]  # fmt: skip


_SR, _FR, _BR = SACCADE_RATE, FIXATION_RATE, BLINK_RATE
_BLINK_R = BLINK_DURATION_S[1]

FEATURES: tuple[Feature, ...] = (
    _rate("fixation_rate", "fixations ending in the window, per second", _FR,
          TYPICAL_FIXATION_RATE),
    _mean("fixation_duration_mean", "s", "mean fixation duration", _FR, FIXATION_DURATION_MAX_S),
    _var("fixation_duration_var", "s²", "variance of fixation durations", _FR,
         FIXATION_DURATION_MAX_S),
    _max("fixation_duration_max", "s", "longest fixation", FIXATION_DURATION_MAX_S),
    _mean("fixation_dispersion_mean", "deg", "mean fixation dispersion (x range + y range)", _FR,
          FIXATION_DISPERSION_MAX_DEG),
    _rate("saccade_rate", "saccades ending in the window, per second", _SR,
          TYPICAL_SACCADE_RATE),
    _mean("saccade_amplitude_mean", "deg", "mean saccade amplitude", _SR,
          SACCADE_AMPLITUDE_MAX_DEG),
    _var("saccade_amplitude_var", "deg²", "variance of saccade amplitudes", _SR,
         SACCADE_AMPLITUDE_MAX_DEG),
    _max("saccade_amplitude_max", "deg", "largest saccade amplitude", SACCADE_AMPLITUDE_MAX_DEG),
    _mean("saccade_peak_velocity_mean", "deg/s", "mean saccade peak velocity", _SR,
          SACCADE_PEAK_VELOCITY_MAX),
    _max("saccade_peak_velocity_max", "deg/s", "highest saccade peak velocity",
         SACCADE_PEAK_VELOCITY_MAX),
    _mean("saccade_duration_mean", "s", "mean saccade duration", _SR, SACCADE_DURATION_MAX_S),
    _ratio("saccade_small_ratio", "fraction of saccades smaller than 2 deg", _SR),
    _ratio("saccade_large_ratio", "fraction of saccades of 8 deg or more", _SR),
    _ratio("saccade_right_ratio", "fraction of saccades within 45 deg of rightward", _SR),
    _ratio("saccade_left_ratio", "fraction of saccades within 45 deg of leftward", _SR),
    _ratio("saccade_up_ratio", "fraction of saccades within 45 deg of upward", _SR),
    _ratio("saccade_down_ratio", "fraction of saccades within 45 deg of downward", _SR),
    _ratio("saccade_diagonal_ratio", "fraction of saccades within 22.5 deg of a diagonal", _SR),
    Feature("saccade_fixation_ratio", "1", "saccades per fixation in the window",
            "0..4 (I-VT splits glissades); step m(1+4)/N with N >= 1/s*W fixations",
            _c(0.0), _c(4.0),
            lambda w, s: min(4.0, _ending_per_step(_SR, s) * 5.0 / _in_window(_FR, w))),
    _rate("blink_rate", "blinks ending in the window, per second", _BR, TYPICAL_BLINK_RATE),
    Feature("blink_duration_mean", "s", "mean blink duration",
            "blinks last 0.05..0.5 s by definition; step 2mR/N with N >= 0.1/s*W blinks",
            _c(BLINK_DURATION_S[0]), _c(_BLINK_R),
            lambda w, s: min(_BLINK_R - BLINK_DURATION_S[0], 2 * _ending_per_step(_BR, s)
                             * (_BLINK_R - BLINK_DURATION_S[0]) / _in_window(_BR, w))),
    _var("blink_duration_var", "s²", "variance of blink durations", _BR,
         _BLINK_R - BLINK_DURATION_S[0]),
    *_pupil_stats(),
    Feature("valid_fraction", "1", "valid samples x nominal interval / W (data quality)",
            "fraction 0..1; at most s/dt + 1 samples enter or leave: step (s + dt)/W",
            _c(0.0), _c(1.0), lambda w, s: min(1.0, (s + SAMPLE_INTERVAL_MAX_S) / w),
            behaviour=False),
    *(f for n in WORDBOOK_NS for f in _wordbook(n)),
)  # fmt: skip

NAMES: tuple[str, ...] = tuple(f.name for f in FEATURES)
_INDEX = {name: i for i, name in enumerate(NAMES)}
assert len(_INDEX) == len(FEATURES), "feature names must be unique"


def feature_bounds(
    names: Sequence[str] | None = None, window_s: float = 30.0, step_s: float = 0.5
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Public bounds ``(lo, hi, max_step)``, float64 (F,) each, for ``names`` (None: all, in
    :data:`FEATURES` order) at window ``window_s`` s and step ``step_s`` s.

    Raises:
        ConfigError: an unknown feature name (the message lists the known ones).
    """
    chosen = NAMES if names is None else tuple(names)
    rows = []
    for name in chosen:
        if name not in _INDEX:
            raise ConfigError(
                "mechanism.features", name, f"unknown feature; known: {', '.join(NAMES)}"
            )
        rows.append(FEATURES[_INDEX[name]].bounds(window_s, step_s))
    a = np.array(rows, dtype=np.float64).reshape(len(chosen), 3)
    return a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy()


def feature_defaults(
    names: Sequence[str] | None = None, window_s: float = 30.0, step_s: float = 0.5
) -> FloatArray:
    """Public defaults (:meth:`Feature.default`), float64 (F,), for ``names`` (None: all, in
    :data:`FEATURES` order) at window ``window_s`` s and step ``step_s`` s.

    Raises:
        ConfigError: an unknown feature name (the message lists the known ones).
    """
    chosen = NAMES if names is None else tuple(names)
    feature_bounds(chosen, window_s, step_s)  # names checked once, in one place
    return np.array([FEATURES[_INDEX[n]].default(window_s, step_s) for n in chosen], np.float64)


# --- Extraction --------------------------------------------------------------------------------
_BEHAVIOUR = np.array([f.behaviour for f in FEATURES])
_FIX, _SAC, _BLINK = int(EventKind.FIXATION), int(EventKind.SACCADE), int(EventKind.BLINK)
_PUPIL_Q = 1e4  # pupil summed as integers of 0.1 µm: exact, order-independent window sums
_PUPIL_LO, _PUPIL_HI = PUPIL_MM
# Saccade properties counted over the current window (the ratio features).
_SMALL, _LARGE, _RIGHT, _UP, _LEFT, _DOWN, _DIAG = range(7)
_MAX_INTERVALS = 16  # a long block is walked in pieces of at most this many step intervals
_STAGING_CAP = 256  # samples held (held blocks are copied into buffers of this size or more)
_I = _INDEX
_F = len(FEATURES)
# Feature positions used per step (module constants: no dict lookups in the step).
_I_BLINK_DURATION_MEAN = _I["blink_duration_mean"]
_I_BLINK_DURATION_VAR = _I["blink_duration_var"]
_I_BLINK_RATE = _I["blink_rate"]
_I_FIXATION_DISPERSION_MEAN = _I["fixation_dispersion_mean"]
_I_FIXATION_DURATION_MAX = _I["fixation_duration_max"]
_I_FIXATION_DURATION_MEAN = _I["fixation_duration_mean"]
_I_FIXATION_DURATION_VAR = _I["fixation_duration_var"]
_I_FIXATION_RATE = _I["fixation_rate"]
_I_PUPIL_MAX = _I["pupil_max"]
_I_PUPIL_MEAN = _I["pupil_mean"]
_I_PUPIL_MIN = _I["pupil_min"]
_I_PUPIL_VAR = _I["pupil_var"]
_I_SACCADE_AMPLITUDE_MAX = _I["saccade_amplitude_max"]
_I_SACCADE_AMPLITUDE_MEAN = _I["saccade_amplitude_mean"]
_I_SACCADE_AMPLITUDE_VAR = _I["saccade_amplitude_var"]
_I_SACCADE_DURATION_MEAN = _I["saccade_duration_mean"]
_I_SACCADE_FIXATION_RATIO = _I["saccade_fixation_ratio"]
_I_SACCADE_PEAK_VELOCITY_MAX = _I["saccade_peak_velocity_max"]
_I_SACCADE_PEAK_VELOCITY_MEAN = _I["saccade_peak_velocity_mean"]
_I_SACCADE_RATE = _I["saccade_rate"]
_I_VALID_FRACTION = _I["valid_fraction"]
_RATIOS = tuple(
    (_I[f"saccade_{name}_ratio"], c)
    for name, c in (("small", _SMALL), ("large", _LARGE), ("right", _RIGHT), ("up", _UP),
                    ("left", _LEFT), ("down", _DOWN), ("diagonal", _DIAG))
)  # fmt: skip
_WORDBOOK_AT = tuple(_I[f"wordbook{n}_distinct"] for n in WORDBOOK_NS)  # + max, min, range, mean
assert all(
    NAMES[i : i + len(_WORD_STATS)] == tuple(f"wordbook{n}_{st}" for st in _WORD_STATS)
    for i, n in zip(_WORDBOOK_AT, WORDBOOK_NS, strict=True)
)
# The ratios and the wordbook statistics each fill one run of NAMES (one slice assignment a step).
_RATIO_AT = min(i for i, _ in _RATIOS)
_RATIO_COUNTERS = tuple(c for _, c in sorted(_RATIOS))
assert [i for i, _ in sorted(_RATIOS)] == list(range(_RATIO_AT, _RATIO_AT + len(_RATIOS)))
_WORDBOOKS_AT = _WORDBOOK_AT[0]
assert tuple(range(_WORDBOOKS_AT, len(NAMES), len(_WORD_STATS))) == _WORDBOOK_AT  # the last ones
# Detector row fields (EventDetector rows, the order of Events.from_rows).
_R_KIND, _R_TEND, _R_DUR, _R_DX, _R_DY, _R_AMP, _R_VPK, _R_DISP = 0, 4, 5, 8, 9, 10, 11, 12


@dataclass(slots=True)
class FeatureStats:
    """Counters of a :class:`FeatureExtractor` (read them, don't write them)."""

    steps: int = 0  # vectors emitted
    low_quality_windows: int = 0  # valid fraction < min_valid_fraction: behaviour features held
    held_values: int = 0  # values repeated from the previous step (undefined or low quality)
    defaulted_values: int = 0  # public defaults released: no defined value within the hold limit
    clipped_values: int = 0  # values clipped to [lo, hi]
    pupil_out_of_range: int = 0  # pupil samples outside 1.5..9 mm, ignored
    late_samples: int = 0  # dropped: behind the watermark (they came after their windows)
    early_samples: int = 0  # dropped: before the grid's start (the session's open)


def _cap(value: float, hi: float) -> float:
    """``min(value, hi)`` as ``np.minimum`` computes it (NaN stays NaN)."""
    return hi if value > hi else value


class _Ring:
    """Per-event values of one event kind, in time order: end times ``tend`` (a list, searched
    with bisect) and value columns ``vals[c, i]`` (one row per value, so a window's values of
    one kind are a contiguous slice of each row). Events ``[lo, hi)`` are in the current window;
    events before ``lo`` are dropped when the ring is full; events from ``hi`` on have ended
    after the window (the detector runs ahead of the windows by up to a block)."""

    __slots__ = ("extra", "hi", "lo", "tend", "vals")

    def __init__(self, rows: int) -> None:
        self.vals = np.empty((rows, 128))
        self.tend: array[float] = array("d")  # (not a list: see _Saccade)
        self.extra: list[_Saccade] = []  # saccades only: properties per event
        self.lo = self.hi = 0

    def slot(self) -> int:
        """Column index for one more event (its ``tend`` is appended by the caller)."""
        n = len(self.tend)
        cap = self.vals.shape[1]
        if n < cap:
            return n
        lo = self.lo
        if lo:  # drop the events before the window
            self.vals[:, : n - lo] = self.vals[:, lo:n]
            del self.tend[:lo]
            del self.extra[:lo]
            self.lo, self.hi, n = 0, self.hi - lo, n - lo
        if 2 * n > cap:
            vals = np.empty((self.vals.shape[0], 2 * cap))
            vals[:, :n] = self.vals[:, :n]
            self.vals = vals
        return n


#: A saccade's ``(flags, codes)``: the counters (_SMALL ... _DIAG) it adds to, and the codes of
#: the n-grams (n = 1..4) of letters ending with it. Plain tuples of ints, not a NamedTuple: the
#: garbage collector stops tracking those (a fleet worker holds ~100 per session; as NamedTuples
#: they were 60 % of its tracked objects and every full collection walked them).
_Saccade = tuple[tuple[int, ...], tuple[int, ...]]


class _Wordbook:
    """Counts of the n-gram codes in the window, and counts of those counts, so that the
    number of distinct n-grams and the largest and smallest count follow each n-gram entering
    or leaving in O(1) (amortised) instead of a ``np.unique`` over the window per step."""

    __slots__ = ("counts", "hi", "lo", "of_count")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}  # code -> occurrences (> 0) in the window
        self.of_count = [0, 0]  # of_count[c]: codes occurring c times
        self.hi = self.lo = 0  # largest and smallest occurring count (0: empty)

    def add(self, code: int) -> None:
        counts, of_count = self.counts, self.of_count
        c = counts.get(code, 0) + 1
        counts[code] = c
        if c == len(of_count):
            of_count.append(0)
        of_count[c] += 1
        if c > 1:
            of_count[c - 1] -= 1
            if c - 1 == self.lo and of_count[c - 1] == 0:
                self.lo = c
        else:
            self.lo = 1
        self.hi = max(self.hi, c)

    def remove(self, code: int) -> None:
        counts, of_count = self.counts, self.of_count
        c = counts[code]
        of_count[c] -= 1
        if c > 1:
            counts[code] = c - 1
            of_count[c - 1] += 1
            self.lo = min(self.lo, c - 1)
        else:
            del counts[code]
            if of_count[1] == 0:  # the rarest code left: the next occurring count, if any
                self.lo = next((k for k in range(2, self.hi + 1) if of_count[k]), 0)
        if c == self.hi and of_count[c] == 0:
            self.hi = c - 1


def _detector(
    rate_hz: float | None, detector: EventDetector | None, kernels: compiled.Kernels | None
) -> EventDetector:
    """``detector``, or a default one at the declared ``rate_hz`` running ``kernels``.

    Raises:
        ConfigError: neither given, or a detector at another rate than ``rate_hz``.
    """
    if detector is None:
        if rate_hz is None:
            raise ConfigError(
                "rate_hz",
                None,
                "the stream's declared sampling rate is needed (the event detector's parameters "
                "come from it, never from measured timestamps): pass rate_hz=..., e.g. the LSL "
                "stream's nominal_srate",
                "argument",
            )
        return EventDetector(rate_hz=rate_hz, kernels=kernels)
    if rate_hz is not None and float(rate_hz) != detector.rate_hz:
        raise ConfigError(
            "rate_hz", rate_hz, f"differs from the detector's rate {detector.rate_hz:g} Hz",
            "argument",
        )  # fmt: skip
    return detector


class FeatureExtractor:
    """Turns gaze blocks into feature vectors, incrementally (see the module docstring).

    Args:
        window_s: window length W, s.
        step_s: step s between vectors, s (<= W).
        min_valid_fraction: windows with less valid data hold their behaviour features.
        hold_limit_s: a held value repeats for at most this long (s; None: ``window_s``); after
            that, and before a feature's first defined value, its public default is released.
        rate_hz: the stream's declared sampling rate, Hz (for the default detector; never
            measured from the samples).
        detector: the event detector to use (default: ``EventDetector(rate_hz=rate_hz,
            kernels=kernels)``), owned afterwards.
        coalesce: hold (copies of) blocks that cannot complete a step and process them with
            the next block that can, or that enters a new step interval: the same vectors,
            returned by the same :meth:`push` calls, for fewer detector passes (small blocks).
        kernels: the compiled passes to bin samples and compute window statistics with (and
            the default detector's; :func:`gazeguard.signal.compiled.load_kernels`): the same
            vectors bit for bit, less CPU per small block; ``None``: numpy, the reference.
        start_s: where the feature grid starts on the stream's clock, s: the first window is
            ``[start_s, start_s + W)``; samples before it are dropped. A live session passes a
            public time (its declared open, on the grid of its chunks); ``None``: the multiple
            of ``step_s`` at or before the first sample (offline use: the grid is then chosen
            by that sample, to within a step).
    """

    def __init__(
        self,
        window_s: float = 30.0,
        step_s: float = 0.5,
        *,
        min_valid_fraction: float = 0.5,
        hold_limit_s: float | None = None,
        rate_hz: float | None = None,
        detector: EventDetector | None = None,
        coalesce: bool = True,
        kernels: compiled.Kernels | None = None,
        start_s: float | None = None,
    ) -> None:
        if start_s is not None and not math.isfinite(start_s):
            raise ConfigError("start_s", start_s, "must be a finite time on the stream's clock")
        if not (math.isfinite(window_s) and window_s > 0):
            raise ConfigError("features.window_s", window_s, "must be a finite number > 0")
        if not (math.isfinite(step_s) and 0 < step_s <= window_s):
            raise ConfigError("features.step_s", step_s, f"must be > 0 and <= window_s={window_s}")
        if not 0.0 <= min_valid_fraction <= 1.0:
            raise ConfigError("min_valid_fraction", min_valid_fraction, "must be in [0, 1]")
        hold = window_s if hold_limit_s is None else hold_limit_s
        if not (math.isfinite(hold) and hold >= 0):
            raise ConfigError(
                "features.hold_limit_s", hold_limit_s, "must be a finite number >= 0 (or unset)"
            )
        self.window_s = float(window_s)
        self.step_s = float(step_s)
        self.min_valid_fraction = float(min_valid_fraction)
        self.detector = _detector(rate_hz, detector, kernels)
        self.kernels = kernels  # the compiled passes (None: numpy)
        self.names = NAMES
        self.lo, self.hi, self.max_step = feature_bounds(None, self.window_s, self.step_s)
        self.default = feature_defaults(None, self.window_s, self.step_s)
        self.hold_limit_s = float(hold)
        self.stats = FeatureStats()
        self._last = self.default.copy()  # the previous vector (what a held value repeats)
        # A value may be repeated by this many consecutive steps (the last one at most
        # hold_limit_s after the step that defined it); _repeats counts the current repeats and
        # starts past the limit, so a feature without any defined value yet takes its default.
        self._max_repeats = math.floor(self.hold_limit_s / self.step_s + 1e-9)
        self._repeats = np.full(len(FEATURES), self._max_repeats + 1, dtype=np.int64)
        self._repeating = True  # _repeats may be nonzero
        # Window = whole step intervals [k, k+q) plus the first r seconds of interval k+q.
        q = math.floor(self.window_s / self.step_s + 1e-9)
        r = self.window_s - q * self.step_s
        self._q = q
        self._r = r if r > 1e-9 * self.step_s else 0.0
        self._t0: float | None = None if start_s is None else float(start_s)
        self._k = 0  # next step to emit
        # No sample before this will come (advance): later arrivals before it are dropped.
        self._watermark = -math.inf
        # Events by kind; the window's counters and wordbooks follow the saccades in it.
        self._fix = _Ring(2)  # duration, dispersion
        self._sac = _Ring(3)  # amplitude, peak velocity, duration
        self._blink = _Ring(1)  # duration
        self._sac_count = [0] * 7  # window saccades per property (_SMALL ... _DIAG)
        self._books = [_Wordbook() for _ in WORDBOOK_NS]
        self._ns_books = tuple(zip(WORDBOOK_NS, self._books, strict=True))
        self._letters: list[int] = []  # the last (up to 3) saccade letters, oldest first
        # Sample bins (arrays, one entry per bin id from _bin_base on): counts (valid samples,
        # pupil samples, Σ pupil and Σ pupil², pupil in 0.1 µm: exact integer sums, far below
        # 2**63), pupil min and max (mm; ±inf while a bin has no pupil sample). array.array,
        # not lists: the garbage collector does not walk them (see _Saccade).
        self._b_counts: tuple[array[int], ...] = tuple(array("q") for _ in range(4))
        self._b_min: array[float] = array("d")
        self._b_max: array[float] = array("d")
        # Numpy views of these six columns (_views), dropped before the columns are resized
        # (an exported buffer cannot be).
        self._b_views: tuple[npt.NDArray[Any], ...] | None = None
        self._bin_base = 0  # bin id of entry 0
        # The counts summed over the bins [2 k, _sums_to) (integers: sliding sums are exact).
        self._sums = [0, 0, 0, 0]
        self._sums_to = 0
        # Coalescing: blocks that cannot complete a step are copied here until one can.
        self._coalesce = coalesce
        self._held = _Staging()
        self._held_until = -math.inf  # a block whose last sample is at or after this is processed
        self._last_t: float | None = None  # newest timestamp accepted, s

    def push(self, block: GazeSamples) -> tuple[FloatArray, FloatArray]:
        """Feed a block; return ``X`` float64 (k, F) and ``t`` float64 (k,) for the k steps it
        completed (k may be 0). Blocks of any size give the same vectors.

        Raises:
            StreamError: timestamps not finite or not strictly increasing (within the block or
                after the last).
        """
        work = self._take(block)
        if work is None:
            return np.empty((0, _F)), np.empty(0)
        try:
            return self._process(work)
        finally:
            self._release()

    def _take(self, block: GazeSamples) -> GazeSamples | None:
        """The first half of :meth:`push`: validate ``block``; hold it (None) or return what
        to process: the held samples and ``block``. :meth:`_release` must follow."""
        ts = block.timestamps
        if ts.shape[0] == 0:
            return None
        if self._t0 is None:
            if not math.isfinite(ts[0]):
                raise StreamError(f"first gaze timestamp is {ts[0]!r}; timestamps must be finite")
            self._t0 = math.floor(float(ts[0]) / self.step_s) * self.step_s
        check_timestamps(ts, self._last_t)
        floor = max(self._t0, self._watermark)
        if ts[0] < floor:  # before the grid or behind the watermark: never part of a window
            first = int(np.searchsorted(ts, floor))
            early = int(np.searchsorted(ts[:first], self._t0))
            self.stats.early_samples += early
            self.stats.late_samples += first - early
            if first == ts.shape[0]:
                return None
            block = block.slice(first, ts.shape[0])
            ts = block.timestamps
        if self.detector.finished:  # flushed at a gap (advance): continue after it
            self.detector = self.detector.resumed(float(ts[0]))
        # Coalesce: a block that ends before the next possible vector and inside the step
        # interval of the held samples is only validated and held (no vector can depend on it
        # yet), so a stream of small blocks costs one detector pass per step interval or so.
        self._last_t = float(ts[-1])
        if self._last_t < self._held_until:
            self._held.append(block)  # a copy: blocks may be borrowed
            return None
        if self._held.n:
            self._held.append(block)
            return self._held.view()
        return block

    def advance(self, until_s: float) -> tuple[FloatArray, FloatArray]:
        """Declare that no sample before ``until_s`` (stream clock, s) will come; return ``X``
        (k, F) and ``t`` (k,) of the steps that completes: every window ending at or before
        it, samples or not. Samples that arrive later with earlier timestamps are dropped
        (``stats.late_samples``).

        When the newest sample lies more than the detector's gap threshold before ``until_s``,
        a gap follows it for certain: the detector is finished there (its open event closed as
        the next sample would close it) and resumed by the next sample, so the windows of a
        pause are emitted on time with the same values as when the pause ends. Otherwise the
        steps the classified samples complete are emitted, as :meth:`push` emits them.
        """
        if not math.isfinite(until_s):
            raise ConfigError("until_s", until_s, "must be a finite time on the stream's clock")
        if until_s <= self._watermark:
            return np.empty((0, _F)), np.empty(0)
        self._watermark = until_s
        if self._t0 is None:  # no grid yet: no start was declared and no sample came
            return np.empty((0, _F)), np.empty(0)
        parts: list[tuple[FloatArray, FloatArray]] = []
        if self._held.n:  # coalesced samples: their steps may complete now
            try:
                parts.append(self._process(self._held.view()))
            finally:
                self._release()
        det = self.detector
        newest = det.newest_t
        done: float | None = until_s
        if newest is not None and not det.finished:
            if newest + det.max_gap_s < until_s:
                rows = det._finish_rows()
                if rows:
                    self._add_events(rows)
            else:
                done = None
        xs: list[FloatArray] = []
        times: list[float] = []
        self._emit(xs, times, done)
        parts.append(_stack(xs, times))
        if len(parts) == 1:
            return parts[0]
        return np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _release(self) -> None:
        """The end of :meth:`push` after processing: drop the held samples, set the next hold."""
        self._held.clear()
        if self._coalesce:
            assert self._t0 is not None
            assert self._last_t is not None
            step = math.floor((self._last_t - self._t0) / self.step_s)
            self._held_until = min(self._edge(step + 1), self._edge(self._k + self._q, sub=True))

    def _process(self, block: GazeSamples) -> tuple[FloatArray, FloatArray]:
        """Detector, bins, events and vectors for ``block`` (validated, not held)."""
        assert self._t0 is not None
        ts = block.timestamps
        # A long block (a recording) is walked a few step intervals at a time so that buffers
        # stay bounded; the vectors do not depend on where it is cut.
        # At a gap (an interval longer than the detector's gap threshold) the detector is
        # finished and resumed: nothing crosses a gap, so the events are the same, and what
        # lies before the gap is classified now rather than when look-ahead samples come.
        t0, s, n = self._t0, self.step_s, len(block)
        gaps: list[int] = []
        if not self._single_piece(block):
            j = np.floor((ts - t0) / s) // _MAX_INTERVALS
            gaps = (np.flatnonzero(np.diff(ts) > self.detector.max_gap_s) + 1).tolist()
            cuts = {0, n, *(np.flatnonzero(j[1:] != j[:-1]) + 1).tolist(), *gaps}
            bounds = sorted(cuts)
        else:
            bounds = [0, n]
        newest = self.detector.newest_t
        if newest is not None and float(ts[0]) - newest > self.detector.max_gap_s:
            gaps.append(0)
        xs: list[FloatArray] = []
        times: list[float] = []
        for a, b in itertools.pairwise(bounds):
            piece = block if b - a == n else block.slice(a, b)
            if a in gaps:
                self._gap(float(ts[a]))
            self._after_rows(piece, self.detector._push_rows(piece, checked=True), xs, times)
        return _stack(xs, times)

    def _gap(self, next_t: float) -> None:
        """A gap ends the detector's samples; the next one is at ``next_t`` (s)."""
        rows = self.detector._finish_rows()
        if rows:
            self._add_events(rows)
        self.detector = self.detector.resumed(next_t)

    def _single_piece(self, block: GazeSamples) -> bool:
        """:meth:`_process` walks ``block`` in one piece (not a long block, no gap in it or
        before it)."""
        assert self._t0 is not None
        t0, s, ts = self._t0, self.step_s, block.timestamps
        if math.floor((float(ts[-1]) - t0) / s) - math.floor((float(ts[0]) - t0) / s) >= (
            _MAX_INTERVALS
        ):
            return False
        gap = self.detector.max_gap_s
        newest = self.detector.newest_t
        if newest is not None and float(ts[0]) - newest > gap:
            return False
        return len(ts) < 2 or float(np.maximum.reduce(ts[1:] - ts[:-1])) <= gap

    def _after_rows(
        self, piece: GazeSamples, rows: list[Row], xs: list[FloatArray], times: list[float]
    ) -> None:
        """Bins, events and vectors for ``piece``, whose detector rows are ``rows``."""
        det = self.detector
        # The piece's samples are all valid iff the detector's newest invalid one is older.
        self._bin_samples(piece, det._last_invalid < det.stats.samples - len(piece))
        if rows:
            self._add_events(rows)
        self._emit(xs, times)

    # --- sample bins ---------------------------------------------------------------------------
    def _edge(self, j: float, sub: bool = False) -> float:
        """Bin edge: start of step interval ``j`` (+ r for its second half). Window k spans
        ``[edge(k), edge(k + q, sub=True))``; samples and events are compared against these
        same floats, so nothing at an edge can fall into two windows or none."""
        assert self._t0 is not None
        return self._t0 + j * self.step_s + (self._r if sub else 0.0)

    def _bin_ids(self, ts: FloatArray) -> npt.NDArray[np.int64]:
        assert self._t0 is not None
        t0, s = self._t0, self.step_s
        j = np.floor((ts - t0) / s)
        j -= ts < t0 + j * s  # the division may round across an edge: compare with the edge
        j += ts >= t0 + (j + 1) * s
        sub = ts >= t0 + j * s + self._r  # False: the first r s of the interval
        return (2 * j + sub).astype(np.int64)

    def _bin_id(self, t: float) -> int:
        """:meth:`_bin_ids` of one timestamp (the same float operations)."""
        assert self._t0 is not None
        t0, s = self._t0, self.step_s
        j = math.floor((t - t0) / s)
        if t < t0 + j * s:
            j -= 1
        if t >= t0 + (j + 1) * s:
            j += 1
        return 2 * j + (t >= t0 + j * s + self._r)

    def _bin_cuts(self, ts: FloatArray, first: int, top: int) -> tuple[list[int], list[int]]:
        """The bin ids of the samples ``ts`` (first ``first``, last ``top``) as runs: ids
        ``[i_0, ...]`` and cuts ``[0, c_1, ..., len(ts)]`` (run ``j`` is ``ts[c_j : c_(j+1)]``)."""
        n = len(ts)
        # Cut the piece where its bins change. One bin (the common case): no per-sample ids.
        # Without a sub-interval (r = 0: every sample has an odd id 2j + 1) the cuts are where
        # the timestamps pass the edges t0 + j*s, the same comparisons _bin_ids makes.
        if first == top:
            return [first], [0, n]
        if self._r == 0.0 and top - first <= 16:
            ids = list(range(first, top + 1, 2))
            edges = [self._edge(b // 2) for b in ids[1:]]
            cuts = [0, *np.searchsorted(ts, edges).tolist(), n]
            nonempty = [i for i in range(len(ids)) if cuts[i + 1] > cuts[i]]
            return [ids[i] for i in nonempty], [*(cuts[i] for i in nonempty), n]
        all_ids = self._bin_ids(ts)
        run_starts = _run_starts(all_ids)
        return all_ids[run_starts].tolist(), [*run_starts.tolist(), n]

    def _bin_samples(self, piece: GazeSamples, all_valid: bool) -> None:
        """Add the samples of ``piece`` to their bins; ``all_valid``: every sample is valid."""
        if self.kernels is not None:
            self._bin_compiled(self.kernels.bin_samples, piece)
            return
        rows, cuts = self._bin_valid(piece, all_valid)
        p = piece.pupil_mm
        starts = np.array(cuts[:-1], dtype=np.intp)
        lo = np.minimum.reduceat(p, starts).tolist()
        hi = np.maximum.reduceat(p, starts).tolist()
        if _in_range(lo, hi):
            pq = np.rint(p * _PUPIL_Q).astype(np.int64)
            s1 = np.add.reduceat(pq, starts).tolist()
            s2 = np.add.reduceat(pq * pq, starts).tolist()
            self._add_pupil(rows, _lengths(cuts), s1, s2, lo, hi)
        else:
            self._bin_pupil(p, starts, rows)

    def _bin_compiled(self, kernel: Callable[..., Any], piece: GazeSamples) -> None:
        """:meth:`_bin_samples` by the compiled pass (:mod:`gazeguard.signal.compiled`), on the bin
        columns themselves (numpy views of them, ``_b_views``)."""
        assert self._t0 is not None
        ts = piece.timestamps
        top = self._bin_id(float(ts[-1]))
        if top - self._bin_base >= len(self._b_counts[0]):
            self._ensure_bins(top)
        self.stats.pupil_out_of_range += kernel(
            ts, piece.valid, piece.pupil_mm, self._t0, self.step_s, self._r, self._bin_base,
            _PUPIL_Q, _PUPIL_LO, _PUPIL_HI, *self._views(),
        )  # fmt: skip

    def _views(self) -> tuple[npt.NDArray[Any], ...]:
        """Numpy views of the bin columns (the four counts, pupil min, pupil max), made once
        and dropped before the columns are resized (:meth:`_ensure_bins`)."""
        views = self._b_views
        if views is None:
            views = self._b_views = (
                *(np.frombuffer(c, dtype=np.int64) for c in self._b_counts),
                np.frombuffer(self._b_min),
                np.frombuffer(self._b_max),
            )
        return views

    def _bin_valid(self, piece: GazeSamples, all_valid: bool) -> tuple[list[int], list[int]]:
        """Make the bins of ``piece`` and count its valid samples in them; return their list
        positions and the cuts ``[0, ..., len(piece)]`` of the piece at bin changes."""
        ts = piece.timestamps
        first, top = self._bin_id(float(ts[0])), self._bin_id(float(ts[-1]))
        b_nv = self._b_counts[0]
        if top - self._bin_base >= len(b_nv):
            self._ensure_bins(top)
        ids, cuts = self._bin_cuts(ts, first, top)
        base = self._bin_base
        rows = [i - base for i in ids]
        if all_valid:
            n_valid = _lengths(cuts)
        else:
            starts = np.array(cuts[:-1], dtype=np.intp)
            n_valid = np.add.reduceat(piece.valid, starts, dtype=np.int64).tolist()
        for r, nv in zip(rows, n_valid, strict=True):
            b_nv[r] += nv
        return rows, cuts

    def _bin_pupil(self, p: FloatArray, starts: npt.NDArray[np.intp], rows: list[int]) -> None:
        """Add the pupil samples ``p`` (mm, some out of range or missing) to the bins at list
        positions ``rows``, which start at ``starts`` in ``p``."""
        in_range = (p >= _PUPIL_LO) & (p <= _PUPIL_HI)  # False for NaN and inf
        n_pupil = int(np.count_nonzero(in_range))
        self.stats.pupil_out_of_range += int(np.count_nonzero(np.isfinite(p))) - n_pupil
        if n_pupil == 0:
            return
        counts = np.add.reduceat(in_range, starts, dtype=np.int64).tolist()
        pn = np.where(in_range, p, np.nan)
        pq = np.rint(np.where(in_range, p, 0.0) * _PUPIL_Q).astype(np.int64)
        lo = np.fmin.reduceat(pn, starts).tolist()
        hi = np.fmax.reduceat(pn, starts).tolist()
        s1 = np.add.reduceat(pq, starts).tolist()
        s2 = np.add.reduceat(pq * pq, starts).tolist()
        self._add_pupil(rows, counts, s1, s2, lo, hi)

    def _add_pupil(  # noqa: PLR0917 - the per-bin columns, as computed
        self,
        rows: list[int],
        counts: list[int],
        s1: list[int],
        s2: list[int],
        lo: list[float],
        hi: list[float],
    ) -> None:
        """Add per-bin pupil counts, sums (0.1 µm), min and max (mm) to the bins ``rows``."""
        _, b_np, b_s1, b_s2 = self._b_counts
        b_min, b_max = self._b_min, self._b_max
        for i, r in enumerate(rows):
            if counts[i]:
                b_np[r] += counts[i]
                b_s1[r] += s1[i]
                b_s2[r] += s2[i]
                b_min[r] = min(b_min[r], lo[i])
                b_max[r] = max(b_max[r], hi[i])

    def _ensure_bins(self, top: int) -> None:
        """Make bins up to id ``top`` and 32 more (so that most passes make none); first drop
        the bins older than the next window (bin id ``2 k``; no later sample can fall in them)
        once there are 64 of them."""
        self._b_views = None  # (the columns are resized below)
        drop = 2 * self._k - self._bin_base
        counts = self._b_counts
        if drop >= 64:
            for count in counts:
                del count[:drop]
            del self._b_min[:drop], self._b_max[:drop]
            self._bin_base += drop
        grow = top - self._bin_base + 33 - len(counts[0])
        for count in counts:
            count.extend([0] * grow)
        self._b_min.extend([math.inf] * grow)
        self._b_max.extend([-math.inf] * grow)

    # --- events --------------------------------------------------------------------------------
    def _add_events(self, rows: list[Row]) -> None:
        """File the detector's new events by kind, per-event values clipped to their plausible
        ranges (as ``np.minimum`` would) before any aggregation."""
        saccades = []
        for row in rows:
            kind = row[_R_KIND]
            if kind == _FIX:
                ring = self._fix
                i = ring.slot()
                ring.vals[0, i] = _cap(row[_R_DUR], FIXATION_DURATION_MAX_S)
                ring.vals[1, i] = _cap(row[_R_DISP], FIXATION_DISPERSION_MAX_DEG)
                ring.tend.append(row[_R_TEND])
            elif kind == _SAC:
                saccades.append(row)
            elif kind == _BLINK:
                ring = self._blink
                i = ring.slot()
                ring.vals[0, i] = _cap(row[_R_DUR], BLINK_DURATION_S[1])
                ring.tend.append(row[_R_TEND])
        if saccades:
            self._add_saccades(saccades)

    def _add_saccades(self, rows: list[Row]) -> None:
        ring, letters = self._sac, self._letters
        # Direction, deg in (-180, 180], 0 = right. numpy's arctan2, not math.atan2: on
        # AVX-512 machines numpy's SIMD arctan2 and libm's differ in the last bit, which
        # could move a saccade across a sector edge; numpy gives the same result for a
        # scalar as for any element of an array. degrees() is x * (180 / pi) in both.
        radians = np.arctan2([r[_R_DY] for r in rows], [r[_R_DX] for r in rows]).tolist()
        for row, rad in zip(rows, radians, strict=True):
            theta = math.degrees(rad)
            amp = _cap(row[_R_AMP], SACCADE_AMPLITUDE_MAX_DEG)
            i = ring.slot()
            ring.vals[0, i] = amp
            ring.vals[1, i] = _cap(row[_R_VPK], SACCADE_PEAK_VELOCITY_MAX)
            ring.vals[2, i] = _cap(row[_R_DUR], SACCADE_DURATION_MAX_S)
            ring.tend.append(row[_R_TEND])
            # Letter: 8 direction sectors of 45 deg centred on right, up-right, ...; x 2 sizes.
            # (A detector saccade lies between valid samples, so dx, dy and theta are finite;
            # a NaN theta would count in no direction and take sector 0.)
            sector = math.floor((theta + 22.5) / 45.0) % 8 if not math.isnan(theta) else 0
            letter = sector + 8 * (amp >= WORD_SPLIT_DEG)
            flags = (
                [_RIGHT] if -45 < theta <= 45
                else [_UP] if 45 < theta <= 135
                else [_DOWN] if -135 < theta <= -45
                else [_LEFT] if theta > 135 or theta <= -135
                else []
            )  # fmt: skip
            if amp < SMALL_SACCADE_DEG:
                flags.append(_SMALL)
            if amp >= LARGE_SACCADE_DEG:
                flags.append(_LARGE)
            if sector % 2 == 1:
                flags.append(_DIAG)
            codes = [letter]
            for prev in reversed(letters):  # n-gram code: base-16 digits, oldest first
                codes.append(prev * WORDBOOK_LETTERS ** len(codes) + codes[-1])
            letters.append(letter)
            if len(letters) == WORDBOOK_NS[-1]:
                del letters[0]
            ring.extra.append((tuple(flags), tuple(codes)))

    def _slide(self, start: float, end: float) -> None:
        """Move the window to ``[start, end)``: events ending in it, by kind; the saccade
        counters and wordbooks follow the saccades entering (first) and leaving it."""
        for ring in (self._fix, self._blink):
            ring.hi = bisect.bisect_left(ring.tend, end, ring.hi)
            ring.lo = bisect.bisect_left(ring.tend, start, ring.lo, ring.hi)
        sac = self._sac
        hi = bisect.bisect_left(sac.tend, end, sac.hi)
        lo = bisect.bisect_left(sac.tend, start, sac.lo, hi)
        if hi == sac.hi and lo == sac.lo:
            return
        count, books, extra, lo0 = self._sac_count, self._ns_books, sac.extra, sac.lo
        for j in range(sac.hi, hi):  # saccade j enters, with the n-grams it ends
            flags, codes = extra[j]
            for c in flags:
                count[c] += 1
            for n, book in books:
                if j - n + 1 >= lo0:
                    book.add(codes[n - 1])
        for j in range(lo0, lo):  # saccade j leaves, with the n-grams it starts
            for c in extra[j][0]:  # its flags
                count[c] -= 1
            for n, book in books:
                if j + n - 1 < hi:
                    book.remove(extra[j + n - 1][1][n - 1])  # (codes)
        sac.lo, sac.hi = lo, hi

    # --- steps ---------------------------------------------------------------------------------
    def _emit(self, xs: list[FloatArray], times: list[float], done: float | None = None) -> None:
        """Append the vectors of the steps whose windows end at or before what the detector
        classified (or ``done``, when nothing before it is still to come)."""
        t_done = self.detector.last_classified_t
        if done is not None:
            t_done = done if t_done is None else max(t_done, done)
        if t_done is None or self._t0 is None:
            return
        while True:
            start = self._edge(self._k)
            end = self._edge(self._k + self._q, sub=True)
            if t_done < end:
                return
            xs.append(self._vector(start, end)[None, :])
            times.append(end)
            self._k += 1

    def _vector(self, start: float, end: float) -> FloatArray:
        """The clipped, hold-filled feature vector of window [start, end)."""
        dt = self.detector.dt
        assert dt is not None
        w = self.window_s
        self._slide(start, end)
        # The window's bins [b0, b1) (list positions): the sums gain the bins entering it.
        b0 = 2 * self._k - self._bin_base
        b1 = b0 + 2 * self._q + (1 if self._r > 0 else 0)
        sums, a = self._sums, self._sums_to - self._bin_base
        for i, col in enumerate(self._b_counts):
            sums[i] += sum(col[a:b1])
        self._sums_to = b1 + self._bin_base
        n_valid, n_pupil, s1_int, s2_int = sums
        valid_fraction = min(1.0, float(n_valid) * dt / w)
        kernels = self.kernels
        v = self._event_values(w) if kernels is None else self._event_values_compiled(kernels, w)
        if n_pupil * dt >= PUPIL_MIN_COVERAGE * w:
            n = float(n_pupil)
            s1, s2 = float(s1_int), float(s2_int)  # exact: below 2**53
            v[_I_PUPIL_MEAN] = s1 / n / _PUPIL_Q
            v[_I_PUPIL_VAR] = max(0.0, (s2 - s1 * s1 / n) / n) / _PUPIL_Q**2
            *_, b_min, b_max = self._views()  # no NaN: a bin's min is inf or in range
            v[_I_PUPIL_MIN] = float(np.minimum.reduce(b_min[b0:b1]))
            v[_I_PUPIL_MAX] = float(np.maximum.reduce(b_max[b0:b1]))
        for i, col in enumerate(self._b_counts):  # bins 2 k and 2 k + 1 leave at step k + 1
            sums[i] -= sum(col[b0 : b0 + 2])
        v[_I_VALID_FRACTION] = valid_fraction
        low = valid_fraction < self.min_valid_fraction
        self.stats.steps += 1
        if kernels is not None and not low:  # compiled: the common case in one call
            out = np.empty(_F)
            clipped = kernels.clip(v, self.lo, self.hi, out)
            if clipped >= 0:  # (-1: a value is undefined)
                return self._defined(out, clipped)
        raw: FloatArray = np.array(v, dtype=np.float64)
        held = np.isnan(raw)
        if not low and not np.count_nonzero(held):  # the common case: all defined
            out = np.maximum(raw, self.lo)
            np.minimum(out, self.hi, out=out)
            return self._defined(out, int(np.count_nonzero(out != raw)))
        stats = self.stats
        if low:
            held |= _BEHAVIOUR
            stats.low_quality_windows += 1
        self._repeats = np.where(held, np.minimum(self._repeats + 1, self._max_repeats + 1), 0)
        self._repeating = True
        repeat = held & (self._repeats <= self._max_repeats)
        x = np.where(repeat, self._last, np.where(held, self.default, raw))
        out = np.minimum(np.maximum(x, self.lo), self.hi)
        stats.held_values += int(np.count_nonzero(repeat))
        stats.defaulted_values += int(np.count_nonzero(held & ~repeat))
        stats.clipped_values += int(np.count_nonzero(out != x))
        self._last = out
        return out

    def _defined(self, out: FloatArray, clipped: int) -> FloatArray:
        """The end of :meth:`_vector` where every value is defined and the window has enough
        valid data: ``out`` (clipped, ``clipped`` values changed by the clip) as it is."""
        if self._repeating:
            self._repeats.fill(0)
            self._repeating = False
        self.stats.clipped_values += clipped
        self._last = out
        return out

    def _event_values(self, w: float) -> list[float]:
        """Event statistics of the current window, in :data:`NAMES` order; NaN where undefined
        (and for the pupil and valid fraction, filled in by the caller).

        Exactly the values of the per-window recomputation this replaced: counts and ratios
        are integers and one division; means and variances are numpy's (pairwise) sums of the
        same values in the same order, as ``ndarray.mean`` and ``ndarray.var`` compute them
        (``sum / n``; ``sum((x - mean)**2) / n``); the maxima do not depend on order."""
        v = [math.nan] * len(NAMES)
        fix, sac, blink = self._fix, self._sac, self._blink
        nf, ns, nb = fix.hi - fix.lo, sac.hi - sac.lo, blink.hi - blink.lo
        v[_I_FIXATION_RATE], v[_I_SACCADE_RATE], v[_I_BLINK_RATE] = nf / w, ns / w, nb / w
        if nf:
            vals = fix.vals[:, fix.lo : fix.hi]  # duration, dispersion
            s_dur, s_disp = np.add.reduce(vals, axis=1).tolist()
            mean = s_dur / nf
            d = vals[0] - mean
            v[_I_FIXATION_DURATION_MEAN] = mean
            v[_I_FIXATION_DURATION_VAR] = float(np.add.reduce(np.multiply(d, d, out=d))) / nf
            v[_I_FIXATION_DURATION_MAX] = float(np.maximum.reduce(vals[0]))
            v[_I_FIXATION_DISPERSION_MEAN] = s_disp / nf
            v[_I_SACCADE_FIXATION_RATIO] = ns / nf
        if ns:
            vals = sac.vals[:, sac.lo : sac.hi]  # amplitude, peak velocity, duration
            s_amp, s_vpk, s_dur = np.add.reduce(vals, axis=1).tolist()
            amp_max, vpk_max = np.maximum.reduce(vals[:2], axis=1).tolist()
            mean = s_amp / ns
            d = vals[0] - mean
            v[_I_SACCADE_AMPLITUDE_MEAN] = mean
            v[_I_SACCADE_AMPLITUDE_VAR] = float(np.add.reduce(np.multiply(d, d, out=d))) / ns
            v[_I_SACCADE_AMPLITUDE_MAX] = amp_max
            v[_I_SACCADE_PEAK_VELOCITY_MEAN] = s_vpk / ns
            v[_I_SACCADE_PEAK_VELOCITY_MAX] = vpk_max
            v[_I_SACCADE_DURATION_MEAN] = s_dur / ns
        if nb:
            dur = blink.vals[0, blink.lo : blink.hi]
            mean = float(np.add.reduce(dur)) / nb
            d = dur - mean
            v[_I_BLINK_DURATION_MEAN] = mean
            v[_I_BLINK_DURATION_VAR] = float(np.add.reduce(np.multiply(d, d, out=d))) / nb
        self._counted_values(v, ns)
        return v

    def _event_values_compiled(self, kernels: compiled.Kernels, w: float) -> FloatArray:
        """:meth:`_event_values` with the sums, means, variances and maxima by the compiled
        pass (:mod:`gazeguard.signal.compiled`): the same values bit for bit, in a new array."""
        fix, sac, blink = self._fix, self._sac, self._blink
        v = np.empty(_F)
        kernels.event_stats(
            fix.vals, fix.lo, fix.hi, sac.vals, sac.lo, sac.hi, blink.vals, blink.lo, blink.hi,
            w, v,
        )  # fmt: skip
        self._counted_values(v, sac.hi - sac.lo)
        return v

    def _counted_values(self, v: list[float] | FloatArray, ns: int) -> None:
        """The saccade ratios (if the window has ``ns > 0`` saccades) and the wordbook
        statistics of the window, into ``v`` (:data:`NAMES` order)."""
        if ns:
            count = self._sac_count
            v[_RATIO_AT : _RATIO_AT + len(_RATIO_COUNTERS)] = [
                count[c] / ns for c in _RATIO_COUNTERS
            ]
        stats: list[float] = []
        for n, book in zip(WORDBOOK_NS, self._books, strict=True):
            if ns < n:  # an empty wordbook is defined: all its statistics are 0
                stats += (0.0, 0.0, 0.0, 0.0, 0.0)
                continue
            distinct = len(book.counts)
            stats += (
                float(distinct),
                float(book.hi),
                float(book.lo),
                float(book.hi - book.lo),
                (ns - n + 1) / distinct,  # the mean count: n-grams in the window / distinct
            )
        v[_WORDBOOKS_AT:] = stats


class _Staging:
    """Held samples, copied into buffers that grow as needed (a block may be borrowed)."""

    __slots__ = ("n", "p", "t", "valid", "x", "y")

    def __init__(self) -> None:
        self.n = 0
        self.t, self.x, self.y, self.p = (np.empty(_STAGING_CAP) for _ in range(4))
        self.valid = np.empty(_STAGING_CAP, dtype=bool)

    def append(self, block: GazeSamples) -> None:
        n = self.n
        m = block.timestamps.shape[0]
        if n + m > self.t.shape[0]:
            cap = 2 * (n + m)
            for name in ("t", "x", "y", "p", "valid"):
                old = getattr(self, name)
                new = np.empty(cap, dtype=old.dtype)
                new[:n] = old[:n]
                setattr(self, name, new)
        self.t[n : n + m] = block.timestamps
        self.x[n : n + m] = block.x_deg
        self.y[n : n + m] = block.y_deg
        self.p[n : n + m] = block.pupil_mm
        self.valid[n : n + m] = block.valid
        self.n = n + m

    def clear(self) -> None:
        """Drop the held samples; give back buffers grown for a long block (a recording)."""
        self.n = 0
        if self.t.shape[0] > 16 * _STAGING_CAP:
            self.t, self.x, self.y, self.p = (np.empty(_STAGING_CAP) for _ in range(4))
            self.valid = np.empty(_STAGING_CAP, dtype=bool)

    def view(self) -> GazeSamples:
        """The held samples (views: valid until the next :meth:`append` after a reset)."""
        n = self.n
        return GazeSamples(self.t[:n], self.x[:n], self.y[:n], self.p[:n], self.valid[:n])


def _lengths(cuts: list[int]) -> list[int]:
    """Lengths of the runs between consecutive ``cuts``."""
    return [b - a for a, b in itertools.pairwise(cuts)]


def _in_range(lo: list[float], hi: list[float]) -> bool:
    """Every pupil sample of the bins with minima ``lo`` and maxima ``hi`` (mm, from
    np.minimum and np.maximum, which propagate NaN, which fails both tests) is in range."""
    return all(map(_PUPIL_LO.__le__, lo)) and all(map(_PUPIL_HI.__ge__, hi))


def _stack(xs: list[FloatArray], times: list[float]) -> tuple[FloatArray, FloatArray]:
    """``X`` (k, F) and ``t`` (k,) from k vectors (1, F) and their times (s)."""
    if not xs:
        return np.empty((0, _F)), np.empty(0)
    if len(xs) == 1:  # the common case; a copy, as concatenate makes (the vector is kept)
        return xs[0].copy(), np.array(times)
    return np.concatenate(xs), np.array(times)


def _run_starts(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Start index of each run of equal values in a sorted array."""
    return np.concatenate(([0], np.flatnonzero(ids[1:] != ids[:-1]) + 1))


def extract_features(  # noqa: PLR0917 - the documented positional signature
    timestamps: npt.ArrayLike,
    gaze_x_deg: npt.ArrayLike,
    gaze_y_deg: npt.ArrayLike,
    pupil_mm: npt.ArrayLike | None = None,
    window_s: float = 30.0,
    step_s: float = 0.5,
    *,
    min_valid_fraction: float = 0.5,
    hold_limit_s: float | None = None,
    rate_hz: float | None = None,
    detector: EventDetector | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Features of a whole recording, through the same :meth:`FeatureExtractor.push` as live data.

    Args:
        timestamps: (N,) s, strictly increasing.
        gaze_x_deg, gaze_y_deg: (N,) gaze direction, deg; NaN marks invalid samples.
        pupil_mm: (N,) pupil diameter, mm, or None (pupil features then stay at their
            public default).
        min_valid_fraction, hold_limit_s, rate_hz, detector: as for :class:`FeatureExtractor`
            (the recording's declared rate, or a detector built with it).

    Returns:
        ``X`` float64 (T, F) in :data:`FEATURES` order and ``t`` float64 (T,) window end times, s.
        ``T = 0`` for recordings shorter than ``window_s``.
    """
    fx = FeatureExtractor(
        window_s,
        step_s,
        min_valid_fraction=min_valid_fraction,
        hold_limit_s=hold_limit_s,
        rate_hz=rate_hz,
        detector=detector,
    )
    return fx.push(GazeSamples.from_arrays(timestamps, gaze_x_deg, gaze_y_deg, pupil_mm))
