"""Cohort aggregates: per time bucket, the differentially private mean of each profile feature
and the private label histogram over the sessions one trusted worker serves.

Why. Local releases (a chunk stream or a label per session) must each hide their person, so a
consumer averaging ``N`` of them sees noise that shrinks only as ``σ/√N``. A worker already sees
every session's clean features (it computes them); adding noise once to the *sum* over sessions
hides each person as well and leaves an error ``σ/N`` on the mean — the difference between
unusable and usable at 100–1,000 sessions (``bench/eval_cohort.py``).

The release of one bucket ``b`` (``bucket_s`` seconds of gaze time, Unix clock):

1. **Contribution.** A session with at least one feature vector whose window ends in the bucket
   contributes ``v = [u/√F, h, 1]``: ``u`` the mean over its vectors of the profile features,
   each clipped to its public bounds ``[lo, hi]`` and mapped to ``[0, 1]``
   (``‖u/√F‖₂ ≤ 1``); ``h`` the mean of the label model's class probabilities over the same
   vectors (a probability vector, ``‖h‖₂ ≤ 1``); and ``1`` for the count when there are
   features (their means need it; a histogram-only plan needs no count coordinate: every ``h``
   sums to 1, so the histogram's total is the count). So ``‖v‖₂ ≤ √blocks =: Δ2``
   (blocks = 2·[F > 0] + [C > 0]) whatever the gaze — the bound comes from the clipping, never
   from the data. A histogram-only plan thus has Δ2 = 1, not √2: σ is √2 smaller for the same
   budget.
2. **Mechanism.** ``S = Σ_sessions v`` plus discrete Gaussian noise of ``σ = r·Δ2`` on every
   coordinate, on a power-of-two grid from the OS CSPRNG (:func:`gazeguard.mechanisms.
   calibration.calibrate_noise`: the grid's rounding is paid by inflating σ; the sampler's
   slack is charged). Adding or removing one person's session moves ``S`` by at most ``Δ2`` in
   L2: one :class:`~gazeguard.accounting.GaussianEvent` ``(r, slack)`` per bucket per person.
3. **Budget.** The cohort gets its share ``(R, δ_c)`` of the per-hour budget ``B``
   (``ledger.budget_per_hour``, :mod:`gazeguard.plan`); ``r`` is calibrated so that the buckets
   one hour of gaze can change (the plan's count: every bucket holding a feature vector whose
   window that hour reaches) compose to ``(R, δ_c)`` (exact Gaussian composition,
   :func:`gazeguard.accounting.calibrate`). The other release kinds get the rest; basic
   composition keeps them within ``(B, δ)`` and the ledger's accountant checks every charge.
4. **Ledger.** Sessions whose ledger would refuse the charge (a cap) are left out *before*
   the sum (their state depends on past releases only). Every contributing session is charged
   in the ``cohort`` stream at index ``b`` with the bucket's gaze span; all but one get a
   receipt on ``{prefix}/{device}/{session}/cohort`` (the ε they paid, nothing else), and the
   last charge carries the aggregate itself, so the aggregate is enqueued only once every
   person in it has paid: a crash in between leaves people charged and nothing published
   (conservative), never the reverse; a charged aggregate is delivered after a restart by the
   ledger's outbox.
5. **Post-processing.** ``count = max(1, round(noisy count))``; feature means
   ``lo + (hi − lo)·√F·S_f/count`` clipped to the bounds; class shares the normalised positive
   part of the histogram. The message states σ and each mean's noise sd.

Unit of privacy. One person = one session (a person on two headsets counts twice, as
everywhere in gazeguard). The aggregate hides each person's *values*; that a session was active
is visible from its own status topic, as for every release.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gazeguard.accounting import GaussianEvent, PrivacyLoss, calibrate, compose
from gazeguard.cohort_message import CohortFeature, CohortMessage, cohort_topic
from gazeguard.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import DuplicateChargeError, Ledger
from gazeguard.ledger._model import event_key
from gazeguard.mechanisms.calibration import NoiseCalibration, calibrate_noise
from gazeguard.mechanisms.noise import RandomSource, random_source

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
#: The ledger stream of cohort charges (index: the bucket number).
STREAM = "cohort"
#: Most sessions one bucket may sum (the bound below holds up to it).
MAX_SESSIONS = 2**20
#: Public bound on the float error of the sum: each coordinate is summed with ``math.fsum``
#: (correctly rounded), so its error is at most half an ulp of a value ≤ 2^20: 2^-33.
SUM_ERROR = 2.0**-33
#: Contributions are shrunk by this factor so that float rounding cannot push a block's L2
#: norm past 1.
_SHRINK = 1.0 - 2.0**-40


@dataclass(frozen=True)
class CohortPlan:
    """The Gaussian mechanism of one bucket, calibrated to the cohort's share of the budget.

    Attributes:
        features: the profile features aggregated (F may be 0).
        lo, hi: (F,) their public bounds, feature units.
        units: (F,) their units.
        classes: the label model's classes (C may be 0).
        bucket_s: bucket length, s of gaze time.
        budget: user-level ε per hour reserved for the cohort, at ``delta``.
        delta: δ of ``budget``.
        buckets_per_hour: the buckets one hour of gaze can change (the release plan's count).
        sensitivity_l2: ``Δ2 = √blocks``.
        noise: the calibrated discrete Gaussian (one feature of ``D = F + C + [F > 0]``
            coordinates).
        event: the accounting event of one bucket, per person.
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
    noise: NoiseCalibration
    event: GaussianEvent

    @property
    def has_count(self) -> bool:
        """Whether the last coordinate is the count (plans with features)."""
        return len(self.features) > 0

    @property
    def dimension(self) -> int:
        """``D = F + C + [F > 0]`` noised coordinates per bucket."""
        return len(self.features) + len(self.classes) + self.has_count

    @property
    def sigma(self) -> float:
        """σ per coordinate, contribution units (grid inflation included)."""
        return float(self.noise.scale[0])

    @property
    def epsilon_per_hour(self) -> float:
        """User-level ε at δ of a full hour of buckets (≤ ``budget``; the accountant's figure)."""
        return compose({self.event: self.buckets_per_hour}, self.delta).epsilon

    def mean_sd(self, sessions: int) -> FloatArray:
        """(F,) the noise sd of each feature mean at ``sessions`` contributors, feature units."""
        f = max(len(self.features), 1)
        return (self.hi - self.lo) * math.sqrt(f) * self.sigma / max(sessions, 1)

    def text(self) -> str:
        """The plan in one line, for the log."""
        return (
            f"cohort: {len(self.features)} features, {len(self.classes)} classes per "
            f"{self.bucket_s:g} s bucket; Gaussian σ = {self.sigma:.3g} (Δ2 = "
            f"{self.sensitivity_l2:.3g}) per coordinate for ε {self.budget:g} per hour at δ "
            f"{self.delta:g}: over 100 sessions a feature mean's noise sd is "
            f"{math.sqrt(max(len(self.features), 1)) * self.sigma / 100:.2g} of its range"
        )


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
) -> CohortPlan:
    """Calibrate the bucket mechanism so an hour of buckets costs at most ``(budget, delta)``.

    Args:
        features: profile feature names (F ≥ 0).
        lo, hi: (F,) public bounds, feature units, ``lo < hi``.
        units: (F,) units.
        classes: label classes (C ≥ 0; C = 1 is refused: a histogram needs two classes).
        bucket_s: bucket length, s (> 0).
        per_hour: the buckets one hour of gaze can change (the release plan's count).
        budget: ε per hour for the cohort (> 0), at ``delta``.
        delta: δ in (0, 1).

    Raises:
        ConfigError: bad bounds, classes, bucket length or budget.
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
    if not features and not classes:
        raise ConfigError("cohort", None, "aggregate at least one feature or a label model")
    if not (math.isfinite(bucket_s) and bucket_s > 0):
        raise ConfigError("cohort.bucket_s", bucket_s, "must be finite and > 0")
    blocks = 2 * (len(features) > 0) + (len(classes) > 0)
    l2 = math.sqrt(blocks)
    dim = len(features) + len(classes) + (len(features) > 0)
    limit = PrivacyLoss.approx(budget, delta, field="cohort budget per hour")

    def noise_for(ratio: float) -> NoiseCalibration:
        return calibrate_noise(
            "gaussian",
            sensitivity_l1=np.array([l2 * math.sqrt(dim)]),
            sensitivity_l2=np.array([l2]),
            m=dim,
            input_error=np.array([SUM_ERROR]),
            ratio=np.array([ratio]),
        )

    # The sampler's slack depends on σ, σ on the slack: two rounds settle it (the slack is
    # ~1e-6 per coordinate; the second calibration covers the first's).
    slack = 0.0
    for _ in range(2):
        ratio = calibrate("gaussian", per_hour, limit, slack)
        cal = noise_for(ratio)
        slack = float(cal.slack[0])
    event = GaussianEvent(float(cal.ratio[0]), slack)
    if compose({event: per_hour}, delta).epsilon > budget * (1 + 1e-9):
        ratio = calibrate("gaussian", per_hour, limit, slack * 1.01)
        cal = noise_for(ratio)
        event = GaussianEvent(float(cal.ratio[0]), float(cal.slack[0]))
    return CohortPlan(
        tuple(features), lo_a, hi_a, tuple(units), tuple(classes), float(bucket_s),
        float(budget), float(delta), per_hour, l2, cal, event,
    )  # fmt: skip


def contribution(
    plan: CohortPlan, X: npt.ArrayLike, probabilities: npt.ArrayLike | None
) -> FloatArray:
    """One session's bucket contribution ``[u/√F, h, 1]`` (no count without features), (D,),
    L2 norm ≤ ``Δ2``.

    Args:
        plan: the cohort plan.
        X: (T, F) the session's clean profile-feature vectors in the bucket, feature units
            (T ≥ 1; non-finite values count as the bound they exceed, NaN as ``lo``).
        probabilities: (T, C) the label model's class probabilities for the same vectors, or
            ``None`` when the plan has no classes.
    """
    f, c = len(plan.features), len(plan.classes)
    x = np.asarray(X, dtype=np.float64).reshape(-1, f) if f else np.zeros((1, 0))
    if x.shape[0] == 0:
        raise ValueError("a contribution needs at least one feature vector")
    x = np.nan_to_num(x, nan=-np.inf)  # NaN → lo after the clip
    u = (np.clip(x, plan.lo, plan.hi) - plan.lo) / (plan.hi - plan.lo)
    mean_u = np.clip(u.mean(axis=0), 0.0, 1.0) * (_SHRINK / math.sqrt(max(f, 1)))
    if c:
        if probabilities is None:
            raise ValueError("the plan has classes: pass the class probabilities")
        p = np.asarray(probabilities, dtype=np.float64).reshape(-1, c)
        p = np.clip(np.nan_to_num(p, nan=0.0), 0.0, 1.0)
        h = p.mean(axis=0)
        total = h.sum()
        h = (h / total if total > 1.0 else h) * _SHRINK  # ‖h‖₂ ≤ ‖h‖₁ ≤ 1
    else:
        h = np.zeros(0)
    return np.concatenate([mean_u, h, [1.0] if plan.has_count else []])


def exact_sum(parts: npt.ArrayLike) -> FloatArray:
    """(N, D) contributions → (D,) column sums, each correctly rounded (``math.fsum``)."""
    a = np.asarray(parts, dtype=np.float64)
    return np.array([math.fsum(col) for col in a.T], dtype=np.float64)


def privatize_sum(plan: CohortPlan, total: npt.ArrayLike, source: RandomSource) -> FloatArray:
    """``S`` (D,) + discrete Gaussian noise on the plan's grid: every output a multiple of γ."""
    s = np.asarray(total, dtype=np.float64).reshape(1, -1)
    grid = float(plan.noise.grid[0])
    v = np.rint(s / grid)
    v += plan.noise.sample(source)
    v *= grid
    out: FloatArray = v.reshape(-1)
    return out


def build_message(
    plan: CohortPlan,
    noisy: FloatArray,
    *,
    cohort: str,
    worker: str,
    bucket: int,
    profile: str,
    model: str | None,
    insecure: bool,
) -> CohortMessage:
    """Post-process one noisy sum into the published :class:`CohortMessage`."""
    f, c = len(plan.features), len(plan.classes)
    # a histogram-only plan's count is the histogram's total (every session's h sums to 1)
    noisy_count = float(noisy[-1]) if plan.has_count else float(noisy[f : f + c].sum()) / _SHRINK
    count = max(1, round(noisy_count))
    root_f = math.sqrt(max(f, 1))
    means = np.clip(plan.lo + (plan.hi - plan.lo) * root_f * noisy[:f] / count, plan.lo, plan.hi)
    sd = plan.mean_sd(count)
    hist = noisy[f : f + c]
    pos = np.maximum(hist, 0.0)
    shares = pos / pos.sum() if pos.sum() > 0 else pos
    return CohortMessage(
        cohort=cohort,
        worker=worker,
        bucket=bucket,
        bucket_start=bucket * plan.bucket_s,
        bucket_end=(bucket + 1) * plan.bucket_s,
        noisy_count=noisy_count,
        count=count,
        features=[
            CohortFeature(
                name=n, unit=u, noisy_sum=float(noisy[i]), mean=float(means[i]), sd=float(sd[i])
            )
            for i, (n, u) in enumerate(zip(plan.features, plan.units, strict=True))
        ],
        classes=list(plan.classes),
        noisy_histogram=[float(v) for v in hist],
        shares=[float(v) for v in shares],
        sigma=plan.sigma,
        sensitivity_l2=plan.sensitivity_l2,
        epsilon_per_hour=plan.epsilon_per_hour,
        delta=plan.delta,
        profile=profile,
        model=model,
        noise="INSECURE-seeded" if insecure else "os-csprng",
    )


@dataclass(frozen=True)
class CohortRelease:
    """One released bucket: the aggregate, the sessions charged, those left out (no budget)."""

    message: CohortMessage
    sessions: tuple[str, ...]
    left_out: tuple[str, ...]


@dataclass
class _Bucket:
    rows: dict[tuple[str, str], list[FloatArray]] = field(default_factory=dict)
    probs: dict[tuple[str, str], list[FloatArray]] = field(default_factory=dict)


class CohortAggregator:
    """Collects clean profile features per session and bucket; releases a bucket once closed.

    Feed it from the trusted worker (:meth:`add`); call :meth:`release_due` with the current
    Unix time to release every bucket that ended ``grace_s`` before it. :meth:`add` and the
    releases may run in different threads (a lock guards the buckets); vectors that arrive for
    a bucket already released are dropped and counted in :attr:`late_vectors`.

    Args:
        plan: the calibrated bucket mechanism.
        ledger: the ledger every contributing session is charged in (stream ``cohort``).
        cohort: the cohort name (topic level).
        worker: this worker's id.
        topic_prefix: the publishing prefix (``gazeguard/v1``).
        profile: the release profile's name.
        model: the label model's name, or ``None``.
        grace_s: how long after a bucket's end late vectors are still accepted, s.
        insecure_seed: reproducible noise for tests (NOT private against the seed's holder).
    """

    def __init__(
        self,
        plan: CohortPlan,
        ledger: Ledger,
        *,
        cohort: str,
        worker: str,
        topic_prefix: str = "gazeguard/v1",
        profile: str = "custom",
        model: str | None = None,
        grace_s: float = 5.0,
        insecure_seed: int | None = None,
    ) -> None:
        self.plan, self.ledger = plan, ledger
        self.cohort, self.worker, self.prefix = cohort, worker, topic_prefix
        self.topic = cohort_topic(topic_prefix, cohort)
        self.profile, self.model, self.grace_s = profile, model, grace_s
        self._insecure = insecure_seed is not None
        self._source = random_source(insecure_seed)
        self._buckets: dict[int, _Bucket] = {}
        self._lock = threading.Lock()  # add() on the event loop, release() in a worker thread
        self._closed_through = -1  # buckets up to this one were released: later rows are late
        #: Vectors dropped because their bucket had already been released.
        self.late_vectors = 0
        self._event = {event_key(plan.event): 1}

    @property
    def open_buckets(self) -> list[int]:
        """Buckets with contributions not yet released."""
        with self._lock:
            return sorted(self._buckets)

    def add(
        self,
        device: str,
        session: str,
        X: npt.ArrayLike,
        t_unix: npt.ArrayLike,
        probabilities: npt.ArrayLike | None = None,
    ) -> None:
        """Record clean vectors of one session: ``session`` is its ledger session (receipts go
        to ``{prefix}/{device}/{session}/cohort``); ``X`` (T, F) profile features, feature
        units; ``t_unix`` (T,) each window's end, Unix s (non-finite or negative: ignored);
        ``probabilities`` (T, C) or ``None``."""
        t = np.asarray(t_unix, dtype=np.float64).reshape(-1)
        f = len(self.plan.features)
        x = np.asarray(X, dtype=np.float64).reshape(-1, f) if f else np.zeros((t.size, 0))
        if x.shape[0] != t.shape[0]:
            raise ValueError(f"{x.shape[0]} vectors but {t.shape[0]} times")
        p = None
        if self.plan.classes:
            if probabilities is None:
                raise ValueError("the plan has classes: pass the class probabilities")
            p = np.asarray(probabilities, dtype=np.float64).reshape(-1, len(self.plan.classes))
        key = (device, session)
        ok = np.isfinite(t) & (t >= 0)
        buckets = np.floor(np.where(ok, t, 0.0) / self.plan.bucket_s).astype(np.int64)
        with self._lock:
            late = ok & (buckets <= self._closed_through)
            self.late_vectors += int(late.sum())
            ok &= ~late
            for b in np.unique(buckets[ok]):
                sel = ok & (buckets == b)
                bucket = self._buckets.setdefault(int(b), _Bucket())
                bucket.rows.setdefault(key, []).append(x[sel])
                if p is not None:
                    bucket.probs.setdefault(key, []).append(p[sel])

    def release_due(self, now_unix: float) -> list[CohortRelease]:
        """Release every bucket that ended at least ``grace_s`` before ``now_unix``."""
        end = self.plan.bucket_s
        due = [b for b in self.open_buckets if (b + 1) * end + self.grace_s <= now_unix]
        out = [self.release(b) for b in due]
        return [r for r in out if r is not None]

    def release(self, bucket: int) -> CohortRelease | None:
        """Release ``bucket`` now (dropping its collected vectors): ``None`` when no session can
        pay for it. Blocks on the ledger's durable commits."""
        with self._lock:
            data = self._buckets.pop(bucket, None)
            self._closed_through = max(self._closed_through, bucket)
        if data is None or not data.rows:
            return None
        plan = self.plan
        keys = sorted(data.rows)
        span = (bucket * plan.bucket_s, (bucket + 1) * plan.bucket_s)
        admitted: list[tuple[str, str]] = []
        left_out: list[str] = []
        for key in keys:
            sid = key[1]
            try:
                self.ledger.preview(sid, {STREAM: math.inf}, events=self._event, gaze=span)
            except BudgetExhaustedError:
                left_out.append(sid)
                continue
            admitted.append(key)
        if not admitted:
            log.info("cohort bucket %d: every session's budget is spent; nothing released", bucket)
            return None
        if len(admitted) > MAX_SESSIONS:
            raise ConfigError("fleet.max_sessions", len(admitted), f"at most {MAX_SESSIONS}")
        parts = np.stack(
            [
                contribution(
                    plan,
                    np.concatenate(data.rows[key]),
                    np.concatenate(data.probs[key]) if plan.classes else None,
                )
                for key in admitted
            ]
        )
        total = exact_sum(parts)
        del data  # the clean vectors are no longer needed
        noisy = privatize_sum(plan, total, self._source)
        message = build_message(
            plan, noisy, cohort=self.cohort, worker=self.worker, bucket=bucket,
            profile=self.profile, model=self.model, insecure=self._insecure,
        )  # fmt: skip
        payload = message.to_payload()
        charged: list[str] = []
        for i, (device, session) in enumerate(admitted):
            sid = session
            last = i == len(admitted) - 1
            topic = self.topic if last else f"{self.prefix}/{device}/{session}/cohort"
            body = payload if last else self._receipt(sid, bucket)
            try:
                self.ledger.charge(
                    sid, bucket, {STREAM: math.inf}, topic, body,
                    events=self._event, gaze=span, stream=STREAM,
                )  # fmt: skip
            except (BudgetExhaustedError, DuplicateChargeError) as exc:
                # Its values are in the sum: the aggregate must not go out. Those charged stay
                # charged (conservative).
                log.warning(
                    "cohort bucket %d not released: session %s was refused after the sum (%s)",
                    bucket, sid, exc,
                )  # fmt: skip
                return None
            charged.append(sid)
        return CohortRelease(message, tuple(charged), tuple(left_out))

    def _receipt(self, session: str, bucket: int) -> bytes:
        """What a contributing session's own topic learns: that it paid, and how much."""
        body: Mapping[str, object] = {
            "schema": "gazeguard.cohort-receipt/1",
            "session": session,
            "cohort": self.cohort,
            "worker": self.worker,
            "bucket": bucket,
            "mechanism": "gaussian",
            "noise_multiplier": self.plan.event.ratio,
            "epsilon_per_hour": self.plan.epsilon_per_hour,
            "delta": self.plan.delta,
        }
        return json.dumps(body, sort_keys=True).encode()
