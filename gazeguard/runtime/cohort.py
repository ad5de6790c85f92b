"""Cohort aggregates: per time bucket, the differentially private mean of each profile feature,
the private label histogram and the private attention (dwell heatmap, AOI dwell shares) over
the sessions one trusted worker serves.

Why. Local releases (a chunk stream or a label per session) must each hide their person, so a
consumer averaging ``N`` of them sees noise that shrinks only as ``σ/√N``. A worker already sees
every session's clean features (it computes them); adding noise once to the *sum* over sessions
hides each person as well and leaves an error ``σ/N`` on the mean — the difference between
unusable and usable at 100–1,000 sessions (``bench/eval_cohort.py``).

The release of one bucket ``b`` (``bucket_s`` seconds of gaze time, Unix clock):

1. **Contribution.** Every session open in the bucket contributes (who is open is public: the
   session's lifetime as its stream declares it). One with at least one feature vector whose
   window ends in the bucket contributes ``v = [u/√F, h, 1]``: ``u`` the mean over its vectors
   of the profile features, each clipped to its public bounds ``[lo, hi]`` and mapped to
   ``[0, 1]`` (``‖u/√F‖₂ ≤ 1``); ``h`` the mean of the label model's class probabilities over
   the same vectors (a probability vector, ``‖h‖₂ ≤ 1``); and ``1`` for the count when there are
   features (their means need it; a histogram-only plan needs no count coordinate: every ``h``
   sums to 1, so the histogram's total is the count). So ``‖v‖₂ ≤ √blocks =: Δ2``
   (blocks = 2·[F > 0] + [C > 0]) whatever the gaze — the bound comes from the clipping, never
   from the data. A histogram-only plan thus has Δ2 = 1, not √2: σ is √2 smaller for the same
   budget. One without a feature vector (no valid gaze) contributes ``v = 0``, what its
   absence would: the count and the sums are over the sessions with vectors.
2. **Mechanism.** ``S = Σ_sessions v`` plus discrete Gaussian noise of ``σ = r·Δ2`` on every
   coordinate, on a power-of-two grid from the OS CSPRNG (:func:`gazeguard.privacy.mechanisms.
   calibration.calibrate_noise`: the grid's rounding is paid by inflating σ; the sampler's
   slack is charged). Adding or removing one person's session moves ``S`` by at most ``Δ2`` in
   L2: one :class:`~gazeguard.privacy.accounting.GaussianEvent` ``(r, slack)`` per bucket per
   person.
3. **Budget.** The cohort gets its share ``(R, δ_c)`` of the per-hour budget ``B``
   (``ledger.budget_per_hour``, :mod:`gazeguard.plan`); ``r`` is calibrated so that the buckets
   one hour of gaze can change (the plan's count: every bucket holding a feature vector whose
   window that hour reaches) compose to ``(R, δ_c)`` (exact Gaussian composition,
   :func:`gazeguard.privacy.accounting.calibrate`). The other release kinds get the rest; basic
   composition keeps them within ``(B, δ)`` and the ledger's accountant checks every charge.
4. **Ledger.** One transaction per part (:meth:`~gazeguard.ledger.Ledger.charge_admitted`:
   multi-row statements, each session checked against its own caps) reads and locks the
   sessions' rows, leaves out those whose ledger would refuse the charge (a cap; their state
   depends on past releases only), sums the contributions of exactly the sessions admitted,
   and charges them with the aggregate, or nobody: the aggregate is enqueued only with every
   person in it paid, and a crash leaves nobody charged and nothing published. Every session
   open in the bucket is charged alike, valid gaze or not, in the ``cohort`` stream at index
   ``b`` with the bucket's gaze span — were only the sessions with data charged, the ledger's ε
   (which every chunk and status quotes) would say which sessions had valid gaze in which
   bucket. The last admitted session's charge carries the aggregate, enqueued ahead of the
   receipts (the outbox delivers in order: it does not wait for hundreds of receipts); every
   other one the same receipt on ``{prefix}/{device}/{session}/cohort``
   (:class:`~gazeguard.wire.cohort.CohortReceipt`: the ε they paid, nothing else). A charged
   aggregate is delivered after a restart by the ledger's outbox.
5. **Post-processing.** ``count = max(1, round(noisy count))``; feature means
   ``lo + (hi − lo)·√F·S_f/count`` clipped to the bounds; class shares the normalised positive
   part of the histogram. The message states σ and each mean's noise sd.

**What is released** (``cohort.release``, through the release plan): any of ``mode`` (the
group's dominant activity, below), ``means`` (the feature means and the count: two blocks),
``shares`` (the label histogram: one block), ``attention`` (the dwell grid: one block) and
``aois`` (the AOI dwell: one block); unset, the mode with a label model (the default,
``activity-portable``), else means. Δ2 = √blocks counts only what is released: a heatmap-only
plan has Δ2 = 1, and the budget is spent on what the consumer asked for.

**The mode** (``mode``: the ``mode`` part, stream ``mode``, topic ``…/mode``). Each session
open in the bucket contributes its vote share ``h`` (the mean over its windows of the label
model's class probabilities, a distribution: ``0 ≤ h_c ≤ 1``; zero without windows), and the
class scores are ``q = Σ h`` (``math.fsum``, correctly rounded), rounded to multiples of
``γ = 2^-12``. The neighbour relation is the ledger's: adding or removing one person's
session. Adding one raises every score by ``h_c ∈ [0, 1]`` — all in the same direction — so the
rounded scores move monotonically by at most ``1 + γ + 2^-32 ≤ (2^12 + 2)·γ``
(:data:`~gazeguard.plan.cohort.MODE_SENSITIVITY` steps; rounding is monotone). Permute-and-flip
(:func:`gazeguard.privacy.mechanisms.selection.permute_and_flip`, sampled exactly from the OS
CSPRNG: a shuffled order, one exact ``Bernoulli(exp(−ε·gap/Δ))`` coin per candidate) then
chooses one class; for monotone scores it is ε-DP with ``Δ`` (not ``2Δ``): one
:class:`~gazeguard.privacy.accounting.PureEvent` ``ε`` per bucket per person. Only the choice
is published (:class:`~gazeguard.wire.cohort.ModeMessage`); it is charged, receipted and
carried by its last charge as the other parts.

**Attention** (:mod:`gazeguard.signal.attention`). A session that had valid gaze samples in the
bucket contributes its dwell distribution over the grid and/or the AOIs (each block a
probability vector, L2 ≤ 1), tallied by the worker from the samples the pipeline hands it
(:attr:`gazeguard.runtime.pipeline.Pipeline.on_samples`); one without contributes zero and is
charged all the same. The means and shares (the ``aggregates`` part, stream ``cohort``, topic
``…/aggregates``) and the attention (the ``attention`` part, stream ``attention``, topic
``…/attention``) are each summed, noised, charged and carried as in steps 2–4, each charged to
every session open in the bucket. The cohort's budget is split **evenly** between the parts it
releases: each part's noise is ``σ_p = r·√blocks_p`` for one ratio ``r``, calibrated so that
``2 × buckets per hour`` releases of ``G(r)`` compose to the cohort's share; a person in both
pays two identical events (exact Gaussian composition; one event kind keeps the ledger's
accountant as fast as before — three distinct kinds took it seconds per charge). So every
message is enqueued only once each person in its sum has paid for it.

**A worker crash in the middle of a bucket** (fleet on JetStream;
``tests/runtime/test_cohort_crash.py`` kills a real worker with SIGKILL mid-bucket). A bucket's
contributions live only in its worker's memory until the bucket is released (``grace_s`` after
its end, by a loop that runs once a second), and nobody is charged before that: the killed
worker has charged no one for the bucket in progress (nor for an ended bucket it had not
released yet), and its partial sums die with it. Its sessions move to a surviving worker, which
replays their retained gaze from the stream; only the vectors after each session's last charged
*chunk* (``Pipeline.resume_after``) reach the survivor's aggregator again. So:

* the bucket in progress is **released by the survivor, over its own sessions and the moved
  ones, each charged once** — a moved session's contribution resting on its vectors after its
  last charged chunk (the rest of the bucket, gaze after the crash included: a mean of fewer
  windows, still within Δ2);
* an ended bucket the killed worker had not released yet is released the same way if some
  moved vectors fall in it after the last charged chunk, and otherwise **not released and
  charged to no one** (observed when the worker's chunks lag: its vectors all precede the cut);
* a moved session whose replayed vectors reach the survivor only after the survivor released
  that bucket is late: left out, not charged.

Never twice: the ledger charges a (session, bucket) at most once, and a session already charged
for the bucket by another worker (the replay can feed buckets the killed worker released) is
left out *before* the sum, so its values never go out in two aggregates. A part's charges and
its aggregate commit in one transaction, so a crash *during* a release leaves the part charged
to no one and unpublished; two workers releasing the same moved session in the same instant
serialise on its ledger row: the second's transaction is refused whole (nobody in its sum
charged) and its message withheld.

Unit of privacy. One person = one session (a person on two headsets counts twice, as
everywhere in gazeguard). The aggregate hides each person's *values*; that a session was active
is visible from its own status topic, as for every release.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import (
    Charge,
    ChargeRequest,
    DuplicateChargeError,
    Ledger,
    OutboxItem,
)
from gazeguard.plan.cohort import (
    MAX_SESSIONS,
    MODE_GRID,
    MODE_SENSITIVITY,
    CohortPart,
    CohortPlan,
)
from gazeguard.privacy.mechanisms.randomness import RandomSource, random_source
from gazeguard.privacy.mechanisms.selection import lead_for, permute_and_flip
from gazeguard.signal.attention import shares as attention_shares
from gazeguard.wire.cohort import (
    AoiShare,
    AttentionMessage,
    CohortFeature,
    CohortMessage,
    CohortReceipt,
    ModeMessage,
)
from gazeguard.wire.topics import attention_topic, cohort_topic, mode_topic, receipt_topic

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
#: Contributions are shrunk by this factor so that float rounding cannot push a block's L2
#: norm past 1.
_SHRINK = 1.0 - 2.0**-40


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


def privatize_sum(
    plan: CohortPlan | CohortPart, total: npt.ArrayLike, source: RandomSource
) -> FloatArray:
    """``S`` (D,) + discrete Gaussian noise on the grid of ``plan`` (its first part) or of one
    part: every output a multiple of γ."""
    noise = plan.noise
    assert noise is not None, "the mode part adds no noise"
    s = np.asarray(total, dtype=np.float64).reshape(1, -1)
    grid = float(noise.grid[0])
    v = np.rint(s / grid)
    v += noise.sample(source)
    v *= grid
    out: FloatArray = v.reshape(-1)
    return out


@dataclass(frozen=True)
class MessageHead:
    """Who publishes a cohort message, for which bucket, with what: the cohort, the worker, the
    bucket's index, the profile and label model named in it, and whether its noise was seeded
    (tests) or drawn from the OS CSPRNG."""

    cohort: str
    worker: str
    bucket: int
    profile: str
    model: str | None
    insecure: bool

    def fields(self, bucket_s: float) -> dict[str, Any]:
        """The fields every cohort message shares: ``cohort``, ``worker``, ``bucket``,
        ``bucket_start`` and ``bucket_end`` (Unix s, buckets of ``bucket_s`` seconds) and
        ``noise``."""
        return {
            "cohort": self.cohort,
            "worker": self.worker,
            "bucket": self.bucket,
            "bucket_start": self.bucket * bucket_s,
            "bucket_end": (self.bucket + 1) * bucket_s,
            "noise": "INSECURE-seeded" if self.insecure else "os-csprng",
        }


def build_message(plan: CohortPlan, noisy: FloatArray, head: MessageHead) -> CohortMessage:
    """Post-process one noisy sum into the published :class:`CohortMessage`."""
    f, c = len(plan.features), len(plan.classes)
    part = plan.part("aggregates")
    assert part is not None, "the plan releases no means or shares"
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
        **head.fields(plan.bucket_s),
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
        sigma=part.sigma,
        sensitivity_l2=part.sensitivity_l2,
        epsilon_per_hour=plan.epsilon_per_hour,
        delta=plan.delta,
        profile=head.profile,
        model=head.model,
    )


def mode_contribution(probabilities: npt.ArrayLike, classes: int) -> FloatArray:
    """One session's vote share for the mode, (C,): the mean over its windows of the class
    probabilities (T, C) (NaN as 0, clipped to [0, 1], scaled down to sum to at most 1), so
    every coordinate lies in ``[0, 1]``."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1, classes)
    if p.shape[0] == 0:
        raise ValueError("a vote share needs at least one window")
    h = np.clip(np.nan_to_num(p, nan=0.0), 0.0, 1.0).mean(axis=0)
    total = h.sum()
    out: FloatArray = np.clip(h / total if total > 1.0 else h, 0.0, 1.0)
    return out


def mode_scores(total: npt.ArrayLike) -> list[int]:
    """The class scores ``Σ h`` (C,) rounded to multiples of :data:`MODE_GRID`, in grid steps."""
    q = np.asarray(total, dtype=np.float64).reshape(-1)
    steps = np.rint(q * MODE_GRID.denominator)  # × 2^12: exact in binary
    return [int(v) for v in steps]


def choose_mode(part: CohortPart, total: npt.ArrayLike, source: RandomSource) -> int:
    """The mode part's choice: permute-and-flip at the part's ε over :func:`mode_scores` of
    the exact score sums ``total`` (C,), sensitivity :data:`MODE_SENSITIVITY` steps."""
    assert part.epsilon is not None, "not a mode part"
    return permute_and_flip(mode_scores(total), part.epsilon, MODE_SENSITIVITY, source)


def build_mode_message(plan: CohortPlan, choice: int, head: MessageHead) -> ModeMessage:
    """The published :class:`ModeMessage` of one choice (an index into ``plan.mode_classes``)."""
    part = plan.part("mode")
    assert part is not None, "the plan releases no mode"
    assert part.epsilon is not None
    eps = float(part.epsilon)
    return ModeMessage(
        **head.fields(plan.bucket_s), classes=list(plan.mode_classes),
        mode=plan.mode_classes[choice], mode_index=choice, epsilon=eps,
        lead_for_90=lead_for(0.9, eps, len(plan.mode_classes)),
        epsilon_per_hour=plan.epsilon_per_hour, delta=plan.delta, profile=head.profile,
        model=head.model or "custom",
    )  # fmt: skip


def attention_contribution(plan: CohortPlan, tally: npt.ArrayLike) -> FloatArray:
    """One session's attention blocks from its bucket tally (:meth:`gazeguard.signal.attention.
    AttentionLayout.tally`), ``(R·C + A + 1,)`` of what is released, L2 norm ≤ √blocks."""
    assert plan.attention is not None, "the plan releases no attention"
    return plan.attention.contribution(tally)


def build_attention_message(
    plan: CohortPlan, noisy: FloatArray, head: MessageHead
) -> AttentionMessage:
    """Post-process one noisy attention sum into the published :class:`AttentionMessage`."""
    layout, part = plan.attention, plan.part("attention")
    assert layout is not None, "the plan releases no attention"
    assert part is not None
    grid = heat = None
    rows = cols = None
    fov = None
    noisy_count = 0.0
    at = 0
    if layout.grid is not None:
        g = layout.grid
        rows, cols, fov = g.rows, g.cols, [g.width_deg, g.height_deg]
        cells = noisy[: g.cells]
        noisy_count = float(cells.sum()) / _SHRINK
        grid = cells.reshape(g.rows, g.cols).tolist()
        heat = attention_shares(cells).reshape(g.rows, g.cols).tolist()
        at = g.cells
    aois = None
    if layout.aois is not None:
        dwell = noisy[at : at + layout.aoi_slots]
        if layout.grid is None:
            noisy_count = float(dwell.sum()) / _SHRINK
        names = [*layout.aois.names, "elsewhere"]
        aois = [
            AoiShare(name=n, noisy_dwell=float(d), share=float(sh))
            for n, d, sh in zip(names, dwell, attention_shares(dwell), strict=True)
        ]
    return AttentionMessage(
        **head.fields(plan.bucket_s), rows=rows, cols=cols, fov_deg=fov, grid=grid,
        heatmap=heat, noisy_count=noisy_count, aois=aois,
        aoi_file=layout.aois.source if layout.aois is not None else None, sigma=part.sigma,
        sensitivity_l2=part.sensitivity_l2, epsilon_per_hour=plan.epsilon_per_hour,
        delta=plan.delta,
    )  # fmt: skip


@dataclass(frozen=True)
class CohortRelease:
    """One released part of a bucket: its message (the aggregate or the attention), the
    sessions charged, those left out (no budget)."""

    message: CohortMessage | AttentionMessage | ModeMessage
    sessions: tuple[str, ...]
    left_out: tuple[str, ...]
    #: the message's outbox item, for the drain to send from memory (``Drain.notify``): behind
    #: another worker's hundreds of receipts in the table it would wait for their delivery
    enqueued: OutboxItem | None = None


@dataclass
class _Bucket:
    rows: dict[tuple[str, str], list[FloatArray]] = field(default_factory=dict)
    probs: dict[tuple[str, str], list[FloatArray]] = field(default_factory=dict)
    tallies: dict[tuple[str, str], npt.NDArray[np.int64]] = field(default_factory=dict)
    #: Sessions without a declared lifetime that handed anything for the bucket (vectors, or
    #: gaze samples valid or not).
    seen: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class _Lifetime:
    """One stretch a session was open, Unix s (``closed`` None: still open)."""

    opened: float
    closed: float | None = None

    def overlaps(self, start: float, end: float) -> bool:
        """Whether the session was open at some time in ``[start, end)``."""
        return self.opened < end and (self.closed is None or self.closed >= start)


class CohortAggregator:
    """Collects clean profile features and gaze tallies per session and bucket; releases a
    bucket once closed.

    Feed it from the trusted worker: :meth:`open_session` and :meth:`close_session` with each
    session's lifetime (public: when its stream appeared and ended), :meth:`add` with its
    feature vectors (means and shares) and :meth:`add_gaze` with its gaze samples (attention);
    call :meth:`release_due` with the current Unix time to release every bucket that ended
    ``grace_s`` before it. The feeds and the releases may run in different threads (a lock
    guards the buckets); vectors or samples that arrive for a bucket already released are
    dropped and counted in :attr:`late_vectors` and :attr:`late_samples`.

    **Who is charged is public.** Every session open at some time in a bucket is charged for
    every part of the plan (:class:`CohortPart`) and gets the same receipt, whether or not its
    gaze was valid in the bucket: one without feature vectors or valid samples contributes
    zero to that part's sum (what its absence would), within the part's L2 bound. Charging
    only the sessions with data would let the ledger's ε, which every chunk and status message
    quotes, say which sessions had valid gaze in which bucket. A session that never declared a
    lifetime (the Python API) counts as open in each bucket it handed anything for, valid or
    not; so does a declared session for a bucket outside its lifetime it handed data for (a
    fleet takeover's replay). Each part's message is carried by its last session's charge,
    enqueued first.

    Args:
        plan: the calibrated bucket mechanism.
        ledger: the ledger every open session is charged in (streams ``cohort`` and
            ``attention``).
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
        self.attention_topic = attention_topic(topic_prefix, cohort)
        self.mode_topic = mode_topic(topic_prefix, cohort)
        self.profile, self.model, self.grace_s = profile, model, grace_s
        self._insecure = insecure_seed is not None
        self._source = random_source(insecure_seed)
        self._buckets: dict[int, _Bucket] = {}
        self._lock = threading.Lock()  # add() on the event loop, release() in a worker thread
        self._closed_through = -1  # buckets up to this one were released: later rows are late
        #: Vectors dropped because their bucket had already been released.
        self.late_vectors = 0
        #: Gaze samples dropped because their bucket had already been released.
        self.late_samples = 0
        self._late_reported = (0, 0)
        self._lifetimes: dict[tuple[str, str], list[_Lifetime]] = {}

    def open_session(self, device: str, session: str, t_unix: float) -> None:
        """``session`` (published under ``device``) opened at ``t_unix`` (Unix s, a public
        time: when its stream appeared): from its bucket on, every bucket is charged to it and
        released, with its data or without (zero contribution). Nothing if it is open already."""
        with self._lock:
            spans = self._lifetimes.setdefault((device, session), [])
            if not spans or spans[-1].closed is not None:
                spans.append(_Lifetime(float(t_unix)))

    def close_session(self, device: str, session: str, t_unix: float) -> None:
        """``session`` closed at ``t_unix`` (Unix s, public: when its stream ended); its
        buckets through the one holding ``t_unix`` are still charged and released. Nothing if
        it is not open."""
        with self._lock:
            spans = self._lifetimes.get((device, session))
            if spans and spans[-1].closed is None:
                spans[-1].closed = max(float(t_unix), spans[-1].opened)

    def _open_in(self, bucket: int) -> set[tuple[str, str]]:
        """The sessions whose declared lifetime overlaps ``bucket`` (hold the lock)."""
        start, end = bucket * self.plan.bucket_s, (bucket + 1) * self.plan.bucket_s
        return {
            key
            for key, spans in self._lifetimes.items()
            if any(span.overlaps(start, end) for span in spans)
        }

    def _lifetime_buckets(self, last: int) -> set[int]:
        """The buckets after the last released one, through ``last``, in which some declared
        session is open (hold the lock)."""
        out: set[int] = set()
        width = self.plan.bucket_s
        for spans in self._lifetimes.values():
            for span in spans:
                first = max(self._closed_through + 1, math.floor(span.opened / width))
                end = last if span.closed is None else min(last, math.floor(span.closed / width))
                out.update(range(first, end + 1))
        return out

    def _forget_closed(self) -> None:
        """Drop the lifetimes that ended before every bucket still to release (hold the lock)."""
        start = (self._closed_through + 1) * self.plan.bucket_s
        for key in list(self._lifetimes):
            spans = [s for s in self._lifetimes[key] if s.closed is None or s.closed >= start]
            if spans:
                self._lifetimes[key] = spans
            else:
                del self._lifetimes[key]

    @property
    def open_buckets(self) -> list[int]:
        """Buckets with contributions not yet released."""
        with self._lock:
            return sorted(self._buckets)

    def _bucket_of(
        self, t_unix: npt.ArrayLike
    ) -> tuple[FloatArray, npt.NDArray[np.bool_], IntArray]:
        t = np.asarray(t_unix, dtype=np.float64).reshape(-1)
        ok = np.isfinite(t) & (t >= 0)
        return t, ok, np.floor(np.where(ok, t, 0.0) / self.plan.bucket_s).astype(np.int64)

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
        ``probabilities`` (T, C) or ``None``. A plan without means, shares or mode ignores
        them."""
        if self.plan.part("aggregates") is None and self.plan.part("mode") is None:
            return
        t, ok, buckets = self._bucket_of(t_unix)
        f = len(self.plan.features)
        x = np.asarray(X, dtype=np.float64).reshape(-1, f) if f else np.zeros((t.size, 0))
        if x.shape[0] != t.shape[0]:
            raise ValueError(f"{x.shape[0]} vectors but {t.shape[0]} times")
        p = None
        classes = self.plan.classes or self.plan.mode_classes
        if classes:
            if probabilities is None:
                raise ValueError("the plan has classes: pass the class probabilities")
            p = np.asarray(probabilities, dtype=np.float64).reshape(-1, len(classes))
        key = (device, session)
        with self._lock:
            late = ok & (buckets <= self._closed_through)
            self.late_vectors += int(late.sum())
            ok &= ~late
            for b in np.unique(buckets[ok]):
                sel = ok & (buckets == b)
                bucket = self._buckets.setdefault(int(b), _Bucket())
                bucket.seen.add(key)
                bucket.rows.setdefault(key, []).append(x[sel])
                if p is not None:
                    bucket.probs.setdefault(key, []).append(p[sel])

    def add_gaze(
        self,
        device: str,
        session: str,
        *,
        t_unix: npt.ArrayLike,
        x_deg: npt.ArrayLike,
        y_deg: npt.ArrayLike,
        valid: npt.ArrayLike,
    ) -> None:
        """Tally gaze samples of one session per bucket (attention): ``t_unix`` (N,) sample
        times, Unix s (non-finite or negative: ignored); ``x_deg``, ``y_deg`` (N,) gaze angles,
        deg; ``valid`` (N,) bool. Only counts per cell and AOI are kept, never the samples; a
        session without a declared lifetime counts as open in each bucket it sent samples for,
        valid or not. A plan without attention ignores them."""
        layout = self.plan.attention
        if layout is None:
            return
        _, ok, buckets = self._bucket_of(t_unix)
        x = np.asarray(x_deg, dtype=np.float64).reshape(-1)
        y = np.asarray(y_deg, dtype=np.float64).reshape(-1)
        v = np.asarray(valid, dtype=bool).reshape(-1)
        if not (x.shape == y.shape == v.shape == ok.shape):
            raise ValueError("t_unix, x_deg, y_deg and valid need one value per sample")
        if not ok.any():
            return
        key = (device, session)
        with self._lock:
            open_ = ok & (buckets > self._closed_through)
            self.late_samples += int((ok & v & ~open_).sum())
            for b in np.unique(buckets[open_]):
                sel = open_ & (buckets == b)
                bucket = self._buckets.setdefault(int(b), _Bucket())
                bucket.seen.add(key)
                if not (sel & v).any():
                    continue
                tally = layout.tally(x[sel & v], y[sel & v], v[sel & v])
                held = bucket.tallies.get(key)
                bucket.tallies[key] = tally if held is None else held + tally

    def release_due(self, now_unix: float) -> list[CohortRelease]:
        """Release every bucket that ended at least ``grace_s`` before ``now_unix`` (and log
        the late vectors and samples dropped since the last report, if any)."""
        last = math.floor((now_unix - self.grace_s) / self.plan.bucket_s) - 1
        with self._lock:
            held = {b for b in self._buckets if b <= last}
            due = sorted(held | self._lifetime_buckets(last))
        late = (self.late_vectors, self.late_samples)
        if late != self._late_reported:
            self._late_reported = late
            log.info(
                "cohort %s: %d feature vectors and %d gaze samples arrived after their bucket "
                "was released and were dropped (in all, worker %s)",
                self.cohort, late[0], late[1], self.worker,
            )  # fmt: skip
        return [r for b in due for r in self.release(b)]

    def release(self, bucket: int) -> list[CohortRelease]:
        """Release ``bucket`` now (dropping its collected data): one release per part that some
        session open in it can pay for (none: an empty list), each charged to every such
        session alike. Blocks on the ledger's durable commits."""
        with self._lock:
            data = self._buckets.pop(bucket, None) or _Bucket()
            keys = sorted(self._open_in(bucket) | data.seen)
            self._closed_through = max(self._closed_through, bucket)
            self._forget_closed()
        out = []
        for part in self.plan.parts if keys else ():
            released = self._release_part(part, bucket, data, keys)
            if released is not None:
                out.append(released)
        return out

    def _contributions(
        self, part: CohortPart, data: _Bucket, keys: Sequence[tuple[str, str]]
    ) -> FloatArray:
        """Each session's contribution to ``part``, (len(keys), D): zero for a session without
        data for it in the bucket (what its absence would contribute)."""
        plan = self.plan
        if part.name == "mode":
            c = len(plan.mode_classes)
            zero = np.zeros(c)
            return np.stack(
                [
                    mode_contribution(np.concatenate(data.probs[k]), c) if k in data.probs else zero
                    for k in keys
                ]
            )
        if part.name == "attention":
            layout = plan.attention
            assert layout is not None
            none = np.zeros(layout.tally_size, dtype=np.int64)
            return np.stack([attention_contribution(plan, data.tallies.get(k, none)) for k in keys])
        zero = np.zeros(plan.aggregate_dimension)
        return np.stack(
            [
                contribution(
                    plan,
                    np.concatenate(data.rows[k]),
                    np.concatenate(data.probs[k]) if plan.classes else None,
                )
                if k in data.rows
                else zero
                for k in keys
            ]
        )

    def _release_part(
        self, part: CohortPart, bucket: int, data: _Bucket, keys: Sequence[tuple[str, str]]
    ) -> CohortRelease | None:
        span = (bucket * self.plan.bucket_s, (bucket + 1) * self.plan.bucket_s)
        # Asked last session first: the first admitted one's charge carries the aggregate,
        # which so comes first in the outbox; every other one carries its receipt.
        order = list(reversed(keys))
        asked = [
            ChargeRequest(s, bucket, part.cost, "", b"", gaze=span, stream=part.stream)
            for _, s in order
        ]
        released: list[tuple[CohortMessage | AttentionMessage | ModeMessage, str, bytes]] = []

        def decide(positions: list[int]) -> list[tuple[str, bytes]]:
            # Called inside the charge's transaction, with the admitted sessions' rows locked:
            # the sum holds exactly the sessions charged for it.
            if not positions:
                return []
            if len(positions) > MAX_SESSIONS:
                raise ConfigError("fleet.max_sessions", len(positions), f"at most {MAX_SESSIONS}")
            admitted = [order[i] for i in positions]
            message, carrier = self._message(part, bucket, data, admitted[::-1])
            payload = message.to_payload()
            released.append((message, carrier, payload))
            receipts = [
                (receipt_topic(self.prefix, d, s), self._receipt(s, bucket, part))
                for d, s in admitted[1:]
            ]
            return [(carrier, payload), *receipts]

        results = self.ledger.charge_admitted(asked, decide)[::-1]  # (in keys' order)
        taken = [
            s for (_, s), r in zip(keys, results, strict=True)
            if isinstance(r, DuplicateChargeError) and r.what == "charged"
        ]  # fmt: skip
        left_out = [
            s for (_, s), r in zip(keys, results, strict=True)
            if isinstance(r, BudgetExhaustedError | DuplicateChargeError) and s not in taken
        ]  # fmt: skip
        for r in results:
            if isinstance(r, Exception) and not isinstance(
                r, BudgetExhaustedError | DuplicateChargeError
            ):
                raise r
        if taken:
            log.info(
                "cohort bucket %d (%s): %d session(s) left out, their bucket was charged (and "
                "summed) by another worker before this one took them over: %s",
                bucket, part.name, len(taken), ", ".join(taken[:5]),
            )  # fmt: skip
        if not released:
            log.info(
                "cohort bucket %d (%s): every session's budget is spent; nothing released",
                bucket, part.name,
            )  # fmt: skip
            return None
        charged = [(s, r) for (_, s), r in zip(keys, results, strict=True) if isinstance(r, Charge)]
        (message, carrier, payload), (session, charge) = released[0], charged[-1]
        enqueued = OutboxItem(
            charge.outbox_id, session, bucket, carrier, payload, time.time(), part.stream
        )
        return CohortRelease(message, tuple(s for s, _ in charged), tuple(left_out), enqueued)

    def _message(
        self, part: CohortPart, bucket: int, data: _Bucket, admitted: Sequence[tuple[str, str]]
    ) -> tuple[CohortMessage | AttentionMessage | ModeMessage, str]:
        """The part's message for the sum of ``admitted``'s contributions, and its topic."""
        plan = self.plan
        head = MessageHead(
            self.cohort, self.worker, bucket, self.profile, self.model, self._insecure
        )
        total = exact_sum(self._contributions(part, data, admitted))
        if part.name == "mode":
            choice = choose_mode(part, total, self._source)
            return build_mode_message(plan, choice, head), self.mode_topic
        noisy = privatize_sum(part, total, self._source)
        if part.name == "attention":
            return build_attention_message(plan, noisy, head), self.attention_topic
        return build_message(plan, noisy, head), self.topic

    def _receipt(self, session: str, bucket: int, part: CohortPart) -> bytes:
        """What a charged session's own topic learns: that it paid, and how much (public
        figures only: the same for every session of the bucket, data or not)."""
        receipt = {
            "session": session,
            "cohort": self.cohort,
            "worker": self.worker,
            "bucket": bucket,
            "release": part.name,
            "mechanism": "permute-and-flip" if part.name == "mode" else "gaussian",
            "noise_multiplier": part.noise_multiplier,
            "epsilon_per_hour": self.plan.epsilon_per_hour,
            "delta": self.plan.delta,
        }
        return CohortReceipt.model_validate(receipt).to_payload()
