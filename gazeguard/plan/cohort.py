"""The cohort aggregate's plan: what one bucket releases, its parts, their calibrated noise (a
Gaussian on sums, or the ε of the mode's private choice) and the event each charges a person
(:func:`plan_cohort`).

The mechanism itself (contributions, the exact sum, the noise draw, the ledger charges) is
:mod:`gazeguard.runtime.cohort`, whose docstring states the whole release; this module is the
part the release plan (:mod:`gazeguard.plan`) reads, so that a plan never imports the runtime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import (
    Event,
    GaussianEvent,
    PrivacyLoss,
    PureEvent,
    calibrate,
    compose,
)
from gazeguard.privacy.mechanisms.calibration import NoiseCalibration, calibrate_noise
from gazeguard.signal.attention import AttentionLayout

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "ATTENTION_STREAM",
    "MAX_SESSIONS",
    "MODE_GRID",
    "MODE_MAX_EPSILON",
    "MODE_SENSITIVITY",
    "MODE_STREAM",
    "STREAM",
    "SUM_ERROR",
    "CohortPart",
    "CohortPlan",
    "mode_epsilon",
    "plan_cohort",
]

#: The ledger stream of cohort charges (index: the bucket number).
STREAM = "cohort"
#: The ledger stream of attention charges (index: the bucket number).
ATTENTION_STREAM = "attention"
#: The ledger stream of the mode's charges (index: the bucket number).
MODE_STREAM = "mode"
#: The mode's class scores are rounded to multiples of this (exact in binary) before the choice.
MODE_GRID = Fraction(1, 2**12)
#: How far one session moves a rounded class score, in steps of :data:`MODE_GRID`: its vote
#: share (≤ 1, i.e. 2^12 steps) plus the rounding of both scores (≤ 1 step) and the sum's float
#: error (≤ 2·2^-33, under one step): 2^12 + 2 steps ≥ 1 + γ + 2^-32.
MODE_SENSITIVITY = 2**12 + 2
#: The mode's ε per choice is a multiple of this (so the charged event is exactly the ε used).
MODE_EPSILON_STEP = Fraction(1, 2**20)
#: The most ε one choice spends: beyond it the choice is the argmax but for a rival within a
#: tenth of a session (e^-6.4), and the accountant's discretised composition of such pure events
#: beside the chunks' is too coarse to calibrate the chunks jointly. A budget that would buy more
#: leaves the rest to the other release kinds (the chunks are calibrated last).
MODE_MAX_EPSILON = Fraction(64)
#: Most sessions one bucket may sum (the bound below holds up to it).
MAX_SESSIONS = 2**20
#: Public bound on the float error of the sum: each coordinate is summed with ``math.fsum``
#: (correctly rounded), so its error is at most half an ulp of a value ≤ 2^20: 2^-33.
SUM_ERROR = 2.0**-33


@dataclass(frozen=True)
class CohortPart:
    """One published part of a cohort bucket: its own sum, noise draw or choice, ledger charge
    and message.

    A bucket has up to three parts, ``aggregates`` (feature means and label shares, on
    ``…/aggregates``, ledger stream ``cohort``), ``attention`` (heatmap and AOI dwell, on
    ``…/attention``, stream ``attention``) and ``mode`` (the group's dominant activity, on
    ``…/mode``, stream ``mode``). The first two are Gaussian mechanisms of the same ratio
    ``r = σ_p/Δ2_p`` (their share of the budget split evenly), so both charge the same event and
    a person in both pays two of them (the plan counts both). The mode is a permute-and-flip
    choice of ε per bucket (:mod:`gazeguard.privacy.mechanisms.selection`): a
    :class:`~gazeguard.privacy.accounting.PureEvent`, no noise calibration.

    Attributes:
        name: ``aggregates``, ``attention`` or ``mode``.
        stream: its ledger stream (index: the bucket).
        blocks: its blocks of L2 norm ≤ 1 (Δ2 of the part = √blocks; the mode: 1, its score
            vector a distribution).
        dimension: its noised coordinates (the mode: its candidates, the classes).
        noise: its calibrated discrete Gaussian (one feature of ``dimension`` coordinates), or
            ``None`` for the mode.
        event: the accounting event of one bucket of this part, per person.
        epsilon: the mode's ε per choice, exactly (a multiple of 2^-20); ``None`` otherwise.
    """

    name: str
    stream: str
    blocks: int
    dimension: int
    noise: NoiseCalibration | None
    event: GaussianEvent | PureEvent
    epsilon: Fraction | None = None

    @property
    def cost(self) -> dict[str, Event]:
        """What one bucket of this part charges a person, for the ledger: its event, under
        its stream's name."""
        return {self.stream: self.event}

    @property
    def sensitivity_l2(self) -> float:
        """``√blocks``: how far one person moves this part's sum, L2, contribution units."""
        return math.sqrt(self.blocks)

    @property
    def sigma(self) -> float:
        """σ per coordinate, contribution units (grid inflation included); 0 for the mode
        (no noise is added to a released value: only its choice is random)."""
        return 0.0 if self.noise is None else float(self.noise.scale[0])

    @property
    def noise_multiplier(self) -> float:
        """What the ledger composes per charge: the Gaussian ratio ``σ/Δ2``, or for the mode
        ``1/ε`` (permute-and-flip is report-noisy-max with exponential noise of scale
        ``Δ/ε``)."""
        if isinstance(self.event, GaussianEvent):
            return self.event.ratio
        return 1.0 / self.event.epsilon


@dataclass(frozen=True)
class CohortPlan:
    """The Gaussian mechanism of one bucket, calibrated to the cohort's share of the budget.

    Attributes:
        features: the profile features aggregated (F may be 0: ``means`` not released).
        lo, hi: (F,) their public bounds, feature units.
        units: (F,) their units.
        classes: the label model's classes whose shares are released (C may be 0).
        bucket_s: bucket length, s of gaze time.
        budget: user-level ε per hour reserved for the cohort, at ``delta``.
        delta: δ of ``budget``.
        buckets_per_hour: the buckets one hour of gaze can change (the release plan's count).
        sensitivity_l2: ``Δ2 = √blocks`` of the whole contribution (every part).
        parts: the published parts (:class:`CohortPart`), ``aggregates`` first.
        attention: the attention geometry (grid and AOIs), or ``None``.
        mode_classes: the label model's classes among which the ``mode`` part chooses the
            group's dominant one (empty: no mode).
    """

    features: tuple[str, ...]
    lo: FloatArray
    hi: FloatArray
    units: tuple[str, ...]
    classes: tuple[str, ...]
    bucket_s: float
    budget: float
    delta: float
    buckets_per_hour: int
    sensitivity_l2: float
    parts: tuple[CohortPart, ...]
    attention: AttentionLayout | None = None
    mode_classes: tuple[str, ...] = ()

    def part(self, name: str) -> CohortPart | None:
        """The part ``name`` (``aggregates``, ``attention`` or ``mode``), or ``None``."""
        return next((p for p in self.parts if p.name == name), None)

    @property
    def noise(self) -> NoiseCalibration:
        """The first Gaussian part's noise (the aggregates', when released).

        Raises:
            ValueError: the plan releases only the mode (no Gaussian part).
        """
        for p in self.parts:
            if p.noise is not None:
                return p.noise
        msg = "the cohort plan releases only the mode: no Gaussian noise"
        raise ValueError(msg)

    @property
    def event(self) -> GaussianEvent | PureEvent:
        """The first part's event (a plan of one part: the event of a bucket)."""
        return self.parts[0].event

    @property
    def mode_epsilon(self) -> float | None:
        """ε of the mode's choice per bucket, or ``None`` without a mode."""
        mode = self.part("mode")
        return None if mode is None or mode.epsilon is None else float(mode.epsilon)

    @property
    def events(self) -> dict[Event, int]:
        """What one bucket charges a person who contributes to every part (event → count)."""
        out: dict[Event, int] = {}
        for p in self.parts:
            out[p.event] = out.get(p.event, 0) + 1
        return out

    @property
    def blocks(self) -> int:
        """Blocks of L2 norm ≤ 1 in the whole contribution."""
        return sum(p.blocks for p in self.parts)

    @property
    def has_count(self) -> bool:
        """Whether the aggregates' last coordinate is the count (plans with features)."""
        return len(self.features) > 0

    @property
    def aggregate_dimension(self) -> int:
        """``F + C + [F > 0]``: the aggregates part's coordinates."""
        return len(self.features) + len(self.classes) + self.has_count

    @property
    def dimension(self) -> int:
        """Noised coordinates per bucket, every part: ``F + C + [F > 0]`` plus the attention's
        ``R·C + (A + 1)`` (of what is released)."""
        return sum(p.dimension for p in self.parts)

    @property
    def sigma(self) -> float:
        """σ per coordinate of the first Gaussian part (the aggregates', when released),
        contribution units (grid inflation included); each part's is ``r·√blocks_p``; 0 for a
        plan that releases only the mode."""
        return next((p.sigma for p in self.parts if p.noise is not None), 0.0)

    @property
    def epsilon_per_hour(self) -> float:
        """User-level ε at δ of a full hour of buckets, every part (≤ ``budget``; the
        accountant's figure)."""
        hour = {e: c * self.buckets_per_hour for e, c in self.events.items()}
        return compose(hour, self.delta).epsilon

    def mean_sd(self, sessions: int) -> FloatArray:
        """(F,) the noise sd of each feature mean at ``sessions`` contributors, feature units."""
        f = max(len(self.features), 1)
        return (self.hi - self.lo) * math.sqrt(f) * self.sigma / max(sessions, 1)

    def text(self) -> str:
        """The plan in one line, for the log."""
        what = [
            f"{len(self.features)} feature means" if self.features else "",
            f"{len(self.classes)} class shares" if self.classes else "",
        ]
        if self.attention is not None and self.attention.grid is not None:
            g = self.attention.grid
            what.append(f"a {g.rows}×{g.cols} dwell heatmap over {g.width_deg:g}×{g.height_deg:g}°")
        if self.attention is not None and self.attention.aois is not None:
            what.append(f"dwell shares of {len(self.attention.aois.aois)} AOIs")
        mode = self.part("mode")
        if mode is not None:
            what.append(f"the dominant one of {len(self.mode_classes)} activities")
        gaussian = [p for p in self.parts if p.noise is not None]
        how = []
        if gaussian:
            how.append(
                "Gaussian "
                + ", ".join(
                    f"{p.name} σ = {p.sigma:.3g} (Δ2 = {p.sensitivity_l2:.3g})" for p in gaussian
                )
                + " per coordinate"
            )
        if mode is not None:
            how.append(
                f"the mode by permute-and-flip at ε {float(mode.event.pure_epsilon):.4g} per "
                "bucket (one vote share per session)"
            )
        line = (
            f"cohort: {', '.join(w for w in what if w)} per {self.bucket_s:g} s bucket; "
            + "; ".join(how)
            + f"; ε {self.epsilon_per_hour:.4g} per hour at δ {self.delta:g} of a budget of "
            f"{self.budget:g}"
        )
        if self.features:
            line += (
                f": over 100 sessions a feature mean's noise sd is "
                f"{math.sqrt(len(self.features)) * self.sigma / 100:.2g} of its range"
            )
        return line


def plan_cohort(
    features: Sequence[str],
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    units: Sequence[str],
    classes: Sequence[str],
    *,
    bucket_s: float,
    per_hour: int,
    budget: float,
    delta: float,
    attention: AttentionLayout | None = None,
    mode_classes: Sequence[str] = (),
) -> CohortPlan:
    """Calibrate the bucket mechanism so an hour of buckets costs at most ``(budget, delta)``.

    The budget is split evenly between the parts: each Gaussian part's noise is
    ``σ_p = r·√blocks_p`` for one ratio ``r``, so each charges the same event ``G(r)`` and a
    bucket of a plan with both costs two of them (the release plan counts them; the ledger's
    accountant then composes one Gaussian event kind, as before attention existed). The mode
    (``mode_classes``) is a permute-and-flip choice of ε per bucket: alone, ε is the largest
    multiple of 2^-20 whose ``per_hour`` choices compose to the budget (one event kind,
    :class:`~gazeguard.privacy.accounting.PureEvent`, whose dominating pair is binary
    randomized response: exact composition); beside Gaussian parts, the mode takes its even
    share ``budget/parts`` at ``δ/2`` and the Gaussian ratio is calibrated jointly with it
    (:func:`~gazeguard.privacy.accounting.calibrate` with ``fixed``).

    Args:
        features: profile feature names whose means are released (F ≥ 0).
        lo, hi: (F,) public bounds, feature units, ``lo < hi``.
        units: (F,) units.
        classes: label classes whose shares are released (C ≥ 0; C = 1 is refused: a
            histogram needs two classes).
        bucket_s: bucket length, s (> 0).
        per_hour: the buckets one hour of gaze can change (the release plan's count).
        budget: ε per hour for the cohort (> 0), at ``delta``.
        delta: δ in (0, 1).
        attention: the attention geometry to release (grid and/or AOIs), or ``None``.
        mode_classes: the classes among which the group's dominant activity is chosen (the
            ``mode`` part; C ≥ 2), or empty.

    Raises:
        ConfigError: bad bounds, classes, bucket length or budget, or nothing to release.
    """
    lo_a = np.asarray(lo, dtype=np.float64).reshape(-1)
    hi_a = np.asarray(hi, dtype=np.float64).reshape(-1)
    if lo_a.shape != (len(features),) or hi_a.shape != lo_a.shape or len(units) != len(features):
        raise ConfigError("cohort.features", list(features), "one bound and unit per feature")
    if not (np.all(np.isfinite(lo_a)) and np.all(np.isfinite(hi_a)) and np.all(hi_a > lo_a)):
        raise ConfigError(
            "cohort.features", list(features), "public bounds must be finite, lo < hi"
        )
    if len(classes) == 1:
        raise ConfigError("cohort.classes", list(classes), "a label histogram needs >= 2 classes")
    if len(mode_classes) == 1:
        raise ConfigError("cohort.classes", list(mode_classes), "a mode needs >= 2 classes")
    if not features and not classes and attention is None and not mode_classes:
        raise ConfigError(
            "cohort.release", None,
            "aggregate at least one feature, a label model or attention",
        )  # fmt: skip
    if not (math.isfinite(bucket_s) and bucket_s > 0):
        raise ConfigError("cohort.bucket_s", bucket_s, "must be finite and > 0")
    spec: list[tuple[str, str, int, int]] = []
    if features or classes:
        blocks = 2 * (len(features) > 0) + (len(classes) > 0)
        spec.append(
            ("aggregates", STREAM, blocks, len(features) + len(classes) + (len(features) > 0))
        )
    if attention is not None:
        spec.append(("attention", ATTENTION_STREAM, attention.blocks, attention.dimension))
    total_blocks = sum(b for _, _, b, _ in spec) + (1 if mode_classes else 0)
    limit = PrivacyLoss.approx(budget, delta, field="cohort budget per hour")
    n_parts = len(spec)
    mode_part: CohortPart | None = None
    fixed: dict[Event, int] = {}
    if mode_classes:
        share = budget / (n_parts + 1)
        eps = mode_epsilon(per_hour, share, delta / 2 if n_parts else delta)
        mode_event = PureEvent(float(eps))
        mode_part = CohortPart("mode", MODE_STREAM, 1, len(mode_classes), None, mode_event, eps)
        fixed = {mode_event: per_hour}
    parts: tuple[CohortPart, ...] = ()
    if spec:
        parts = _gaussian_parts(spec, per_hour, limit, fixed)
    if mode_part is not None:
        parts = (*parts, mode_part)
    return CohortPlan(
        tuple(features), lo_a, hi_a, tuple(units), tuple(classes), float(bucket_s),
        float(budget), float(delta), per_hour, math.sqrt(total_blocks), parts, attention,
        tuple(mode_classes),
    )  # fmt: skip


def mode_epsilon(per_hour: int, budget: float, delta: float) -> Fraction:
    """The largest ε (a multiple of 2^-20, at most :data:`MODE_MAX_EPSILON`) whose ``per_hour``
    ε-DP choices compose to at most ``budget`` at ``delta`` (the accountant's exact composition
    of :class:`~gazeguard.privacy.accounting.PureEvent`; never below ``budget/per_hour``, which
    fits by sequential composition).

    Raises:
        ConfigError: a budget too small for one step of 2^-20 per choice.
    """
    step = MODE_EPSILON_STEP
    lo = math.floor(Fraction(budget) / per_hour / step)
    if lo < 1:
        raise ConfigError("cohort.budget_share", budget, "too small for a mode per bucket")
    if lo * step >= MODE_MAX_EPSILON:
        return MODE_MAX_EPSILON

    def fits(k: int) -> bool:
        return compose({PureEvent(float(k * step)): per_hour}, delta).epsilon <= budget

    hi = math.floor(min(Fraction(budget), MODE_MAX_EPSILON) / step) + 1
    if fits(hi - 1):
        return (hi - 1) * step  # the cap (or the whole budget on one choice)
    while hi - lo > 1:  # invariant: lo fits, hi does not (or is past the budget)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo * step


def _gaussian_parts(
    spec: list[tuple[str, str, int, int]],
    per_hour: int,
    limit: PrivacyLoss,
    fixed: Mapping[Event, int],
) -> tuple[CohortPart, ...]:
    """The Gaussian parts of ``spec`` at one ratio, calibrated so that their ``per_hour``
    buckets compose with the ``fixed`` releases to ``limit``."""
    n_parts = len(spec)
    delta = limit.delta
    budget = limit.epsilon
    assert delta is not None
    assert budget is not None

    def noise_for(ratio: float) -> list[NoiseCalibration]:
        # every part at the same ratio σ_p/Δ2_p: its σ_p = ratio·√blocks_p
        return [
            calibrate_noise(
                "gaussian",
                sensitivity_l1=np.array([math.sqrt(b) * math.sqrt(d)]),
                sensitivity_l2=np.array([math.sqrt(b)]),
                m=d,
                input_error=np.array([SUM_ERROR]),
                ratio=np.array([ratio]),
            )
            for _, _, b, d in spec
        ]

    def event_of(cals: list[NoiseCalibration]) -> GaussianEvent:
        # one event for every part: the least ratio (the grid rounding inflates each a little
        # differently) and the largest slack dominate each part's own
        return GaussianEvent(
            min(float(c.ratio[0]) for c in cals), max(float(c.slack[0]) for c in cals)
        )

    def hour(event: GaussianEvent) -> dict[Event, int]:
        out: dict[Event, int] = dict(fixed)
        out[event] = out.get(event, 0) + n_parts * per_hour
        return out

    # The sampler's slack depends on σ, σ on the slack: two rounds settle it (the slack is
    # ~1e-6 per coordinate; the second calibration covers the first's).
    slack = 0.0
    for _ in range(2):
        ratio = calibrate("gaussian", n_parts * per_hour, limit, slack, fixed or None)
        cals = noise_for(ratio)
        slack = event_of(cals).slack
    event = event_of(cals)
    if compose(hour(event), delta).epsilon > budget * (1 + 1e-9):
        ratio = calibrate("gaussian", n_parts * per_hour, limit, slack * 1.01, fixed or None)
        cals = noise_for(ratio)
        event = event_of(cals)
    return tuple(
        CohortPart(name, stream, b, d, c, event)
        for (name, stream, b, d), c in zip(spec, cals, strict=True)
    )
