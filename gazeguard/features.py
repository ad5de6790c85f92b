"""Sliding-window eye-movement features: one vector every ``step_s`` over the last ``window_s``.

The feature set follows Bulling et al. 2011 and Steil et al. 2019 (MPIIDPEye): fixation, saccade,
blink, pupil and saccade-direction wordbook (n-gram) statistics, plus the data quality. Every
feature is declared once in :data:`FEATURES` with its name, unit, description and its **public
bounds** ``lo``, ``hi`` and ``max_step`` and the reasoning behind them. The bounds ship with the
package and define the mechanisms' sensitivities; they never come from the user's data.

Timing (``t0`` = first sample time, ``W = window_s``, ``s = step_s``):

- Step ``k >= 0`` covers the window ``[t0 + k*s, t0 + k*s + W)`` and is stamped with its end time
  ``T_k = t0 + k*s + W``. The first vector therefore comes exactly ``W`` seconds after the first
  sample (no partial windows: every vector describes a full ``W``; with ``W = 10 s`` the first
  vector arrives after 10 s and a 32-step chunk at 0.5 s steps after 25.5 s).
- Step ``k`` is emitted by the first :meth:`FeatureExtractor.push` after which the event detector
  has classified a sample at or after ``T_k`` (a few samples of velocity look-ahead), so a vector
  never depends on how the stream was cut into blocks: recorded and live data give identical
  vectors. A stream dropout emits the skipped steps when data resumes.
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
chunk. ``tests/test_features.py`` measures it on simulated gaze.

Bounds: ``lo``/``hi`` follow from physiology and the detector's definitions; ``max_step`` from
how many events can enter and leave the window in one step (``W``/``s`` enter every rule, so
:func:`feature_bounds` takes them). Some step bounds are exact (``valid_fraction``, pupil mean,
wordbook ``distinct``/``max`` given the event-rate ceiling); the others hold for plausible data
(e.g. a window with at least ``W`` fixations). A larger change between two steps is clipped in
the difference domain by DCFPA, which keeps the privacy guarantee and costs utility only at that
step. ``bench/validate_events.py`` measures how often that happens on real recordings: at most
2% of steps, for ``saccade_rate`` and the wordbook ``distinct`` counts (I-VT saccade bursts).

Cost: per step the statistics are recomputed from per-event summaries kept in a ring (a 30 s
window holds a few hundred events) and from per-step sample bins (integer sums, min, max; a step
is split in two where a window edge falls inside it), never from the window's raw samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from gazeguard.errors import ConfigError, StreamError
from gazeguard.events import EventDetector, EventKind, Events, check_timestamps
from gazeguard.samples import FloatArray, GazeSamples

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
# Event ring columns.
_K, _TEND, _DUR, _AMP, _DX, _DY, _VPK, _DISP, _SYM = range(9)
_EV_COLS = 9
_FIX, _SAC, _BLINK = int(EventKind.FIXATION), int(EventKind.SACCADE), int(EventKind.BLINK)
_PUPIL_Q = 1e4  # pupil summed as integers of 0.1 µm: exact, order-independent window sums
# Sample-bin columns: valid samples, pupil samples, Σ pupil, Σ pupil² (pupil in 0.1 µm).
_NV, _NP, _S1, _S2 = range(4)


@dataclass(slots=True)
class FeatureStats:
    """Counters of a :class:`FeatureExtractor` (read them, don't write them)."""

    steps: int = 0  # vectors emitted
    low_quality_windows: int = 0  # valid fraction < min_valid_fraction: behaviour features held
    held_values: int = 0  # values repeated from the previous step (undefined or low quality)
    defaulted_values: int = 0  # public defaults released: no defined value within the hold limit
    clipped_values: int = 0  # values clipped to [lo, hi]
    pupil_out_of_range: int = 0  # pupil samples outside 1.5..9 mm, ignored


class FeatureExtractor:
    """Turns gaze blocks into feature vectors, incrementally (see the module docstring).

    Args:
        window_s: window length W, s.
        step_s: step s between vectors, s (<= W).
        min_valid_fraction: windows with less valid data hold their behaviour features.
        hold_limit_s: a held value repeats for at most this long (s; None: ``window_s``); after
            that, and before a feature's first defined value, its public default is released.
        detector: the event detector to use (default: ``EventDetector()``), owned afterwards.
        coalesce: hold (copies of) blocks that cannot complete a step and process them with
            the next block that can, or that enters a new step interval: the same vectors,
            returned by the same :meth:`push` calls, for fewer detector passes (small blocks).
    """

    def __init__(
        self,
        window_s: float = 30.0,
        step_s: float = 0.5,
        *,
        min_valid_fraction: float = 0.5,
        hold_limit_s: float | None = None,
        detector: EventDetector | None = None,
        coalesce: bool = True,
    ) -> None:
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
        self.detector = detector if detector is not None else EventDetector()
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
        # Window = whole step intervals [k, k+q) plus the first r seconds of interval k+q.
        q = math.floor(self.window_s / self.step_s + 1e-9)
        r = self.window_s - q * self.step_s
        self._q = q
        self._r = r if r > 1e-9 * self.step_s else 0.0
        self._t0: float | None = None
        self._k = 0  # next step to emit
        self._ev = np.empty((256, _EV_COLS))
        self._ev_lo = self._ev_hi = 0  # live rows
        self._bins = np.zeros((64, 4), dtype=np.int64)
        self._bmin = np.full(64, np.inf)
        self._bmax = np.full(64, -np.inf)
        self._bin_base = 0  # bin id of row 0
        self._bin_top = -1  # highest bin id written
        # Coalescing: blocks that cannot complete a step wait here (copied) until one can.
        self._coalesce = coalesce
        self._held: list[GazeSamples] = []
        self._held_until = -math.inf  # a block whose last sample is at or after this is processed
        self._last_t: float | None = None  # newest timestamp accepted, s

    def push(self, block: GazeSamples) -> tuple[FloatArray, FloatArray]:
        """Feed a block; return ``X`` float64 (k, F) and ``t`` float64 (k,) for the k steps it
        completed (k may be 0). Blocks of any size give the same vectors."""
        if len(block) == 0:
            return np.empty((0, len(FEATURES))), np.empty(0)
        ts = block.timestamps
        if self._t0 is None:
            if not math.isfinite(ts[0]):
                raise StreamError(f"first gaze timestamp is {ts[0]!r}; timestamps must be finite")
            self._t0 = float(ts[0])
        # Coalesce: a block that ends before the next possible vector and inside the step
        # interval of the held samples is only validated and held (no vector can depend on it
        # yet), so a stream of small blocks costs one detector pass per step interval or so.
        check_timestamps(ts, self._last_t)
        self._last_t = float(ts[-1])
        if self._last_t < self._held_until:
            self._held.append(GazeSamples.concat([block]))  # a copy: blocks may be borrowed
            return np.empty((0, len(FEATURES))), np.empty(0)
        if self._held:
            block = GazeSamples.concat([*self._held, block])
            ts = block.timestamps
            self._held.clear()
        xs, times = self._process(block)
        if self._coalesce:
            step = math.floor((self._last_t - self._t0) / self.step_s)
            self._held_until = min(self._edge(step + 1), self._edge(self._k + self._q, sub=True))
        return xs, times

    def _process(self, block: GazeSamples) -> tuple[FloatArray, FloatArray]:
        """Detector, bins, events and vectors for ``block`` (validated, not held)."""
        assert self._t0 is not None
        ts = block.timestamps
        # Walk the block one step interval at a time so buffers stay bounded for long blocks.
        j = np.floor((ts - self._t0) / self.step_s)
        cuts = np.flatnonzero(j[1:] != j[:-1]) + 1
        xs: list[FloatArray] = []
        times: list[float] = []
        for a, b in zip(
            [0, *cuts.tolist()], [*cuts.tolist(), len(block)], strict=True
        ):  # loop over step intervals
            piece = block.slice(a, b)
            events = self.detector.push(piece)  # validates the timestamps first
            self._bin_samples(piece)
            self._add_events(events)
            self._emit(xs, times)
        if not xs:
            return np.empty((0, len(FEATURES))), np.empty(0)
        return np.vstack(xs), np.array(times)

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

    def _bin_samples(self, piece: GazeSamples) -> None:
        ids = self._bin_ids(piece.timestamps)
        top = int(ids[-1])
        if top > self._bin_top:
            self._ensure_bins(top)
        p = piece.pupil_mm
        in_range = np.isfinite(p) & (p >= PUPIL_MM[0]) & (p <= PUPIL_MM[1])
        n_pupil = int(np.count_nonzero(in_range))
        self.stats.pupil_out_of_range += int(np.count_nonzero(np.isfinite(p))) - n_pupil
        single = ids[0] == top  # the common case: the whole piece falls into one bin
        starts = np.zeros(1, np.int64) if single else _run_starts(ids)
        rows = ids[starts] - self._bin_base
        self._bins[rows, _NV] += np.add.reduceat(piece.valid, starts, dtype=np.int64)
        if n_pupil == 0:
            return
        pq = np.rint(np.where(in_range, p, 0.0) * _PUPIL_Q).astype(np.int64)
        self._bins[rows, _NP] += np.add.reduceat(in_range, starts, dtype=np.int64)
        self._bins[rows, _S1] += np.add.reduceat(pq, starts)
        self._bins[rows, _S2] += np.add.reduceat(pq * pq, starts)
        pn = np.where(in_range, p, np.nan)
        self._bmin[rows] = np.fmin(self._bmin[rows], np.fmin.reduceat(pn, starts))
        self._bmax[rows] = np.fmax(self._bmax[rows], np.fmax.reduceat(pn, starts))

    def _ensure_bins(self, top: int) -> None:
        """Make rows for bin ids up to ``top``, dropping bins older than the next window."""
        keep_from = 2 * self._k  # first bin of the oldest window not yet emitted
        shift = max(0, keep_from - self._bin_base)
        need = top - (self._bin_base + shift) + 1
        cap = self._bins.shape[0]
        if shift or need > cap:
            live = max(0, self._bin_top - (self._bin_base + shift) + 1)
            new_cap = max(cap, 2 * need)
            bins = np.zeros((new_cap, 4), dtype=np.int64)
            bmin = np.full(new_cap, np.inf)
            bmax = np.full(new_cap, -np.inf)
            if live:
                bins[:live] = self._bins[shift : shift + live]
                bmin[:live] = self._bmin[shift : shift + live]
                bmax[:live] = self._bmax[shift : shift + live]
            self._bins, self._bmin, self._bmax = bins, bmin, bmax
            self._bin_base += shift
        self._bin_top = top

    # --- event ring ----------------------------------------------------------------------------
    def _add_events(self, ev: Events) -> None:
        if len(ev) == 0:
            return
        keep = (ev.kind == _FIX) | (ev.kind == _SAC) | (ev.kind == _BLINK)
        n = int(np.count_nonzero(keep))
        if n == 0:
            return
        kind = ev.kind[keep]
        sac = kind == _SAC
        # Per-event values clipped to their plausible ranges before any aggregation.
        dur_hi = np.where(kind == _FIX, FIXATION_DURATION_MAX_S, SACCADE_DURATION_MAX_S)
        dur_hi[kind == _BLINK] = BLINK_DURATION_S[1]
        amp = np.minimum(ev.amplitude[keep], SACCADE_AMPLITUDE_MAX_DEG)
        theta = np.degrees(np.arctan2(ev.dy[keep], ev.dx[keep]))  # NaN for non-saccades
        sector8 = np.floor((np.where(sac, theta, 0.0) + 22.5) / 45.0) % 8
        rows = np.empty((n, _EV_COLS))
        rows[:, _K] = kind
        rows[:, _TEND] = ev.t_end[keep]
        rows[:, _DUR] = np.minimum(ev.duration[keep], dur_hi)
        rows[:, _AMP] = amp
        rows[:, _DX] = ev.dx[keep]
        rows[:, _DY] = ev.dy[keep]
        rows[:, _VPK] = np.minimum(ev.peak_velocity[keep], SACCADE_PEAK_VELOCITY_MAX)
        rows[:, _DISP] = np.minimum(ev.dispersion[keep], FIXATION_DISPERSION_MAX_DEG)
        rows[:, _SYM] = sector8 + 8 * (np.where(sac, amp, 0.0) >= WORD_SPLIT_DEG)
        # Append, compacting the ring when full.
        if self._ev_hi + n > self._ev.shape[0]:
            live = self._ev_hi - self._ev_lo
            cap = max(self._ev.shape[0], 2 * (live + n))
            new = np.empty((cap, _EV_COLS))
            new[:live] = self._ev[self._ev_lo : self._ev_hi]
            self._ev, self._ev_lo, self._ev_hi = new, 0, live
        self._ev[self._ev_hi : self._ev_hi + n] = rows
        self._ev_hi += n

    # --- steps ---------------------------------------------------------------------------------
    def _emit(self, xs: list[FloatArray], times: list[float]) -> None:
        t_done = self.detector.last_classified_t
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
        # Drop events that ended before this window, then take those ending inside it.
        tend = self._ev[self._ev_lo : self._ev_hi, _TEND]
        self._ev_lo += int(np.searchsorted(tend, start, side="left"))
        tend = self._ev[self._ev_lo : self._ev_hi, _TEND]
        ev = self._ev[self._ev_lo : self._ev_lo + int(np.searchsorted(tend, end, side="left"))]
        b0 = 2 * self._k - self._bin_base
        b1 = b0 + 2 * self._q + (1 if self._r > 0 else 0)
        b1 = min(b1, self._bin_top - self._bin_base + 1)
        sums = self._bins[b0:b1].sum(axis=0)
        valid_fraction = min(1.0, float(sums[_NV]) * dt / w)
        v = _window_values(ev, w)
        if sums[_NP] * dt >= PUPIL_MIN_COVERAGE * w:
            n = float(sums[_NP])
            s1, s2 = float(sums[_S1]), float(sums[_S2])  # exact: below 2**53
            v["pupil_mean"] = s1 / n / _PUPIL_Q
            v["pupil_var"] = max(0.0, (s2 - s1 * s1 / n) / n) / _PUPIL_Q**2
            v["pupil_min"] = float(self._bmin[b0:b1].min())
            v["pupil_max"] = float(self._bmax[b0:b1].max())
        else:
            v["pupil_mean"] = v["pupil_var"] = v["pupil_min"] = v["pupil_max"] = math.nan
        v["valid_fraction"] = valid_fraction
        raw = np.array([v[name] for name in NAMES])
        held = np.isnan(raw)
        if valid_fraction < self.min_valid_fraction:
            held |= _BEHAVIOUR
            self.stats.low_quality_windows += 1
        self._repeats = np.where(held, np.minimum(self._repeats + 1, self._max_repeats + 1), 0)
        repeat = held & (self._repeats <= self._max_repeats)
        x = np.where(repeat, self._last, np.where(held, self.default, raw))
        out = np.minimum(np.maximum(x, self.lo), self.hi)
        self.stats.held_values += int(np.count_nonzero(repeat))
        self.stats.defaulted_values += int(np.count_nonzero(held & ~repeat))
        self.stats.clipped_values += int(np.count_nonzero(out != x))
        self.stats.steps += 1
        self._last = out
        return out


def _run_starts(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Start index of each run of equal values in a sorted array."""
    return np.concatenate(([0], np.flatnonzero(ids[1:] != ids[:-1]) + 1))


def _window_values(ev: FloatArray, w: float) -> dict[str, float]:
    """Event statistics of one window (rows of the event ring); NaN where undefined."""
    v = dict.fromkeys(NAMES, math.nan)
    kind = ev[:, _K]
    fix = ev[kind == _FIX]
    sac = ev[kind == _SAC]
    blk = ev[kind == _BLINK]
    nf, ns, nb = len(fix), len(sac), len(blk)
    v["fixation_rate"], v["saccade_rate"], v["blink_rate"] = nf / w, ns / w, nb / w
    if nf:
        d = fix[:, _DUR]
        v["fixation_duration_mean"] = float(d.mean())
        v["fixation_duration_var"] = float(d.var())
        v["fixation_duration_max"] = float(d.max())
        v["fixation_dispersion_mean"] = float(fix[:, _DISP].mean())
        v["saccade_fixation_ratio"] = ns / nf
    if ns:
        amp = sac[:, _AMP]
        theta = np.degrees(np.arctan2(sac[:, _DY], sac[:, _DX]))  # (-180, 180], 0 = right
        v |= {
            "saccade_amplitude_mean": float(amp.mean()),
            "saccade_amplitude_var": float(amp.var()),
            "saccade_amplitude_max": float(amp.max()),
            "saccade_peak_velocity_mean": float(sac[:, _VPK].mean()),
            "saccade_peak_velocity_max": float(sac[:, _VPK].max()),
            "saccade_duration_mean": float(sac[:, _DUR].mean()),
            "saccade_small_ratio": float(np.mean(amp < SMALL_SACCADE_DEG)),
            "saccade_large_ratio": float(np.mean(amp >= LARGE_SACCADE_DEG)),
            "saccade_right_ratio": float(np.mean((theta > -45) & (theta <= 45))),
            "saccade_up_ratio": float(np.mean((theta > 45) & (theta <= 135))),
            "saccade_left_ratio": float(np.mean((theta > 135) | (theta <= -135))),
            "saccade_down_ratio": float(np.mean((theta > -135) & (theta <= -45))),
            "saccade_diagonal_ratio": float(np.mean(sac[:, _SYM] % 2 == 1)),
        }
    if nb:
        v["blink_duration_mean"] = float(blk[:, _DUR].mean())
        v["blink_duration_var"] = float(blk[:, _DUR].var())
    sym = sac[:, _SYM].astype(np.int64)
    for n in WORDBOOK_NS:
        p = f"wordbook{n}"
        if ns < n:  # an empty wordbook is defined: all its statistics are 0
            v |= dict.fromkeys((f"{p}_{stat}" for stat in _WORD_STATS), 0.0)
            continue
        codes = np.zeros(ns - n + 1, dtype=np.int64)
        for j in range(n):  # n-gram code: base-16 digits of consecutive letters
            codes = codes * WORDBOOK_LETTERS + sym[j : ns - n + 1 + j]
        _, counts = np.unique(codes, return_counts=True)
        c = counts.astype(np.float64)
        v |= {
            f"{p}_distinct": float(c.size),
            f"{p}_max": float(c.max()),
            f"{p}_min": float(c.min()),
            f"{p}_range": float(c.max() - c.min()),
            f"{p}_mean": float(c.mean()),
        }
    return v


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
    detector: EventDetector | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Features of a whole recording, through the same :meth:`FeatureExtractor.push` as live data.

    Args:
        timestamps: (N,) s, strictly increasing.
        gaze_x_deg, gaze_y_deg: (N,) gaze direction, deg; NaN marks invalid samples.
        pupil_mm: (N,) pupil diameter, mm, or None (pupil features then stay at their
            public default).
        min_valid_fraction, hold_limit_s, detector: as for :class:`FeatureExtractor`.

    Returns:
        ``X`` float64 (T, F) in :data:`FEATURES` order and ``t`` float64 (T,) window end times, s.
        ``T = 0`` for recordings shorter than ``window_s``.
    """
    fx = FeatureExtractor(
        window_s,
        step_s,
        min_valid_fraction=min_valid_fraction,
        hold_limit_s=hold_limit_s,
        detector=detector,
    )
    return fx.push(GazeSamples.from_arrays(timestamps, gaze_x_deg, gaze_y_deg, pupil_mm))
