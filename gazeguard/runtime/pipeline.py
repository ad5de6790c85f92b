"""One session's privacy pipeline, in-process: gaze samples in, charged privatized chunks out.

``events → features → chunks → mechanism → ledger``: the synchronous core that ``gazeguard run``
drives from LSL and drains to MQTT, and that a headset vendor can embed directly (no LSL, no
MQTT)::

    from gazeguard.ledger import Ledger
    from gazeguard.runtime.pipeline import Pipeline
    from gazeguard.core.samples import GazeSamples, lsl_unix_offset

    with Ledger("ledger.sqlite") as ledger:
        pipe = Pipeline(ledger, session="s1", device="hmd-7", rate_hz=120.0, on_release=print)
        for t, x, y, pupil in my_sample_blocks():   # arrays of shape (N,): s, deg, deg, mm
            pipe.push(GazeSamples.from_arrays(t, x, y, pupil))
        pipe.close()

Live, a session's releases should follow the clock, not the samples (docs/privacy.md): declare
when it opened (``Pipeline(..., opens_at=pylsl.local_clock())``), hand blocks to
:meth:`Pipeline.queue` and call :meth:`Pipeline.advance` with the clock (less a lateness
allowance) as often as you like; every window of the open session is then released on time,
gaze or not, as ``gazeguard run`` does. :meth:`Pipeline.push` releases what the samples
complete as soon as they complete it (offline use and tests).

Every released chunk is charged to the ledger *before* anyone sees it: :meth:`Pipeline.push`
returns (and hands ``on_release``) only chunks whose charge is committed, each with the exact
payload bytes that sit in the ledger's outbox. A chunk that would exceed a cap is withheld (and
recorded); a chunk that fails anywhere between the feature buffer and the charge is dropped (and
recorded). Nothing raw or half-noised is ever returned, on any path.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gazeguard.config import FeatureSettings, MechanismSettings
from gazeguard.core.chunking import Chunk, Chunker
from gazeguard.core.errors import BudgetExhaustedError, ConfigError, GazeguardError
from gazeguard.core.samples import GazeSamples, lsl_unix_offset
from gazeguard.ledger import (
    Charge,
    ChargeRequest,
    Ledger,
    LedgerState,
    Preview,
    StaleStateError,
)
from gazeguard.plan import ReleasePlan
from gazeguard.signal.events import LOOKBEHIND_S, EventDetector, check_rate
from gazeguard.signal.features import FEATURES, FeatureExtractor
from gazeguard.wire.message import (
    ChunkMessage,
    LedgerSnapshot,
    MechanismParams,
    SessionState,
    StatusMessage,
)
from gazeguard.wire.topics import chunk_topic

if TYPE_CHECKING:
    from gazeguard.config import LabelSettings
    from gazeguard.plan.labels import LabelPlan
    from gazeguard.runtime.labels import LabelStream, ReleasedLabel
    from gazeguard.signal.compiled import Kernels

log = logging.getLogger(__name__)

#: Previews a release may be rebuilt for when other writers keep charging the same session.
_STALE_RETRIES = 8


def on_grid(t: float, period_s: float, phase_s: float = 0.0) -> float:
    """The first point ``phase_s + k · period_s`` at or after ``t`` (s, stream clock): where a
    session opened at ``t`` starts its release grid."""
    if not math.isfinite(t):
        raise ConfigError("opens_at", t, "must be a finite time on the stream's clock")
    return math.ceil((t - phase_s) / period_s) * period_s + phase_s


def _check_phase(phase_s: float, period_s: float) -> float:
    """``phase_s`` if it lies in ``[0, period_s)`` (s), else ConfigError."""
    if not 0.0 <= phase_s < period_s:
        raise ConfigError("phase_s", phase_s, f"must lie in [0, {period_s:g}) s")
    return phase_s


def session_phase(session: str, period_s: float) -> float:
    """A public phase of ``session``'s release grid in ``[0, period_s)``, s, to the millisecond,
    drawn from a hash of the session id and nothing else.

    A fleet gives each session its own phase so that the chunks of sessions on one clock come
    due spread evenly over the grid period, not in bursts on shared ticks. The phase is a
    function of the session id alone: public, and the same on every worker (a session taken
    over keeps its grid)."""
    slots = max(1, int(period_s * 1000))
    digest = hashlib.blake2b(session.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") % slots) / 1000.0


@dataclass(frozen=True, slots=True)
class ReleasedChunk:
    """A chunk whose charge is committed and whose payload waits in the ledger outbox.

    Attributes:
        message: the privatized chunk as published (values ``[F][n]``, mechanism, ledger).
        payload: the exact bytes enqueued (UTF-8 JSON).
        topic: where the publisher sends them.
        outbox_id: position in the ledger outbox.
        state: the session's ledger state right after the charge.
        completed_at: ``time.perf_counter()`` when the chunk came due, s: when its last
            feature vector existed (:meth:`Pipeline.push`), or when the clock released it
            (:meth:`Pipeline.advance`).
        charged_at: ``time.perf_counter()`` when its charge had committed, s.
    """

    message: ChunkMessage
    payload: bytes
    topic: str
    outbox_id: int
    state: LedgerState
    completed_at: float
    charged_at: float

    # The outbox-entry view (``gazeguard.ledger.outbox.OutboxEntry``): hand it to Publisher.notify.
    @property
    def id(self) -> int:
        """Position in the ledger outbox (same as :attr:`outbox_id`)."""
        return self.outbox_id

    @property
    def session(self) -> str:
        """Session id."""
        return self.message.session

    @property
    def chunk_index(self) -> int:
        """Chunk number within the session."""
        return self.message.chunk_index


@dataclass(slots=True)
class PipelineStats:
    """Counters of one session (chunks and steps)."""

    steps: int = 0
    released: int = 0
    withheld: int = 0
    dropped: int = 0
    tail_steps_dropped: int = 0
    last_reason: str | None = None
    state: SessionState = "starting"
    withheld_indices: list[int] = field(default_factory=list)


class Pipeline:
    """events → features → chunks → mechanism → ledger for one session (synchronous).

    Args:
        ledger: where every release is charged before it is handed on.
        session: session id (the ledger account; topics use it).
        device: device id (topics use it).
        rate_hz: the gaze stream's declared (nominal) sampling rate, Hz, e.g. the LSL stream's
            ``nominal_srate``: the event detector's parameters come from it, never from the
            samples' timestamps.
        plan: the release plan (:class:`gazeguard.plan.ReleasePlan`: the mechanism, labels and
            every figure); ``None``: built from ``features``, ``mechanism`` and ``labels`` for
            the ledger's caps (its hourly cap is the budget). The ledger's window must hold
            every release one hour of gaze can change (``plan.window_s``): open it with
            ``Ledger(path, caps=plan.ledger_caps())``.
        features, mechanism, labels: the settings a plan is built from when ``plan`` is
            ``None`` (labels: private labels when ``labels.enabled``,
            :mod:`gazeguard.runtime.labels`, charged to the same ledger and collected by
            :meth:`take_labels`).
        topic_prefix: MQTT topic prefix written into the outbox rows.
        on_release: called with each :class:`ReleasedChunk`, after its charge committed.
        tap: called with ``(raw chunk, released chunk)`` for in-process diagnostics only
            (``gazeguard demo`` plots raw against privatized); never wired to any network path.
        clock_offset_s: Unix time minus sample time, s; ``None`` (default): samples are on the
            LSL clock of this host (``time.time() − pylsl.local_clock()``, read once). The
            ledger counts its per-hour window in this gaze time.
        kernels: the compiled passes the session's detector and extractor run
            (:func:`gazeguard.signal.compiled.load_kernels`: a fleet worker's choice, made once
            where it starts); ``None``: numpy. The same chunks either way, bit for bit.
        opens_at: when the session opened, on the stream's clock (s): a public time, such as
            the moment the sidecar attached to the stream. The release grid starts at the
            first grid point (:attr:`phase_s` plus a multiple of :attr:`grid_s`) at or after
            it. ``None``: at the first grid point at or after the first sample (the Python
            API's convenience; then that sample's time, to within a grid period, decides where
            the session starts).
        phase_s: the grid's public phase, s, in ``[0, grid_s)`` (:func:`session_phase`):
            chunks start at ``phase_s + k · grid_s``. A fleet spreads its sessions' chunk ends
            with it; 0 (default) for a sidecar's one session.

    Raises:
        ConfigError: an unknown feature name in the release profile or in
            ``epsilon_per_feature``, invalid mechanism parameters, or a ledger whose window
            is shorter than the plan's.
    """

    #: Late samples the local log last reported (it says so again when the count doubles).
    _late_said = 0

    def __init__(
        self,
        ledger: Ledger,
        *,
        session: str,
        device: str,
        rate_hz: float,
        plan: ReleasePlan | None = None,
        features: FeatureSettings | None = None,
        mechanism: MechanismSettings | None = None,
        labels: LabelSettings | None = None,
        topic_prefix: str = "gazeguard/v1",
        on_release: Callable[[ReleasedChunk], None] | None = None,
        tap: Callable[[Chunk, ReleasedChunk], None] | None = None,
        clock_offset_s: float | None = None,
        kernels: Kernels | None = None,
        opens_at: float | None = None,
        phase_s: float = 0.0,
    ) -> None:
        self.rate_hz = check_rate(rate_hz, "rate_hz")
        self.kernels = kernels
        self.ledger = ledger
        self.session = session
        self.device = device
        self.topic = chunk_topic(topic_prefix, device, session)
        self.on_release = on_release
        self.tap = tap
        # Fixed for the session: chunk ends stay a chunk apart in the ledger's Unix gaze time.
        self.clock_offset_s = clock_offset_s if clock_offset_s is not None else lsl_unix_offset()
        self.stats = PipelineStats()
        # Caps recorded with the session bind; a looser configuration is refused here.
        self.opened = ledger.open_session(session)
        if plan is None:
            plan = ReleasePlan.build(
                features=features, mechanism=mechanism, budget=self.opened.window_cap,
                delta=self.opened.delta, session_cap=self.opened.session_cap,
                labels=labels if labels is not None and labels.enabled else None,
            )  # fmt: skip
        if self.opened.window_cap is not None and self.opened.window_s < plan.window_s:
            raise ConfigError(
                "ledger.window_s",
                self.opened.window_s,
                f"the ledger's window must hold every release one hour of gaze can change: "
                f"{plan.window_s:g} s of release ends for this plan; open the ledger with the "
                "plan's caps, Ledger(path, caps=plan.ledger_caps())",
                None,
            )
        self.plan = plan
        features = plan.features
        all_names = [f.name for f in FEATURES]
        names = plan.names
        self.feature_names = names
        self._index = np.array([all_names.index(n) for n in names], dtype=np.intp)
        self.units = plan.units
        #: Called with every batch of clean feature vectors ``(X (T, 48), t (T,) sample time)``
        #: by :meth:`feed`; the trusted cohort aggregator of a fleet worker, nothing else.
        self.on_features: Callable[[np.ndarray, np.ndarray], None] | None = None
        #: Called with every block of gaze samples the extractor took (:class:`GazeSamples`,
        #: sample time; those at or before :attr:`resume_after` left out), each sample once, in
        #: order, by :meth:`feed`; the trusted cohort aggregator's attention tally of a fleet
        #: worker, nothing else. The block is borrowed: copy what is kept.
        self.on_samples: Callable[[GazeSamples], None] | None = None
        self.mechanism = plan.mechanism
        self._params = MechanismParams.from_mechanism(self.mechanism)
        self._carries = self.mechanism.carries()
        # What the ledger charges for a chunk: each feature's accounting event, by name.
        self._cost = plan.chunk_cost
        self.epsilon = self.mechanism.epsilon
        self._per_sample = plan.per_sample
        self._features = features
        #: The release grid's period, s: chunks (and label decision blocks) start on its
        #: multiples on the stream's clock, from the session's open on.
        self.grid_s = plan.grid_s
        #: The grid's public phase, s: chunks start at ``phase_s + k · grid_s``.
        self.phase_s = _check_phase(phase_s, self.grid_s)
        #: Where the session's first feature window starts (stream clock, s; None until known).
        self.start_s: float | None = None
        self._labels_from = math.inf  # the first label block's first window end, s
        #: The session's declared open (stream clock, s), if one was declared.
        self.opens_at = opens_at if opens_at is None else self._start(opens_at)
        self.extractor = self._new_extractor()
        self.chunker = Chunker(len(FEATURES), self.mechanism.n, ledger.next_index(session))
        self._due: list[Chunk] = []  # chunks fed by queue(), waiting for the clock (advance)
        self._last_t = -math.inf  # newest sample time fed
        #: Sample time, s: feature vectors stamped at or before it rebuild the window but are
        #: not chunked, counted or observed (a fleet worker taking a session over replays the
        #: retained gaze whose chunks the ledger charged already). ``-inf``: every vector counts.
        self.resume_after = -math.inf
        self.profile = plan.profile
        self.label_plan: LabelPlan | None = plan.label_plan
        self.labels = self._label_stream(topic_prefix, all_names)
        self._label_blocks: list[tuple[np.ndarray, np.ndarray]] = []
        self._labels_ready: list[ReleasedLabel] = []
        self._completed_at = 0.0
        if plan.insecure_seed is not None:
            log.warning(
                "session %r: INSECURE seeded noise (mechanism.insecure_seed=%d): releases are "
                "reproducible and NOT differentially private against anyone who knows the seed",
                session,
                plan.insecure_seed,
            )

    def _label_stream(self, topic_prefix: str, names: list[str]) -> LabelStream | None:
        """The private-label stage of the plan (None: no labels)."""
        if self.label_plan is None:
            return None
        from gazeguard.runtime.labels import LabelStream  # noqa: PLC0415 - optional stage

        return LabelStream(
            self.ledger, self.label_plan, session=self.session, device=self.device,
            input_features=names, topic_prefix=topic_prefix, profile=self.plan.profile,
            insecure_seed=self.plan.insecure_seed,
        )  # fmt: skip

    @property
    def carries(self) -> str:
        """What each chunk carries per feature, in words (as the message says)."""
        return self._carries

    @property
    def chunk_epsilon(self) -> float:
        """Pure ε one chunk costs (sum over released features; ``inf`` for Gaussian noise).
        The user-level figures are in :attr:`cost`."""
        return self.plan.chunk_pure

    def push(self, block: GazeSamples) -> list[ReleasedChunk]:
        """Feed a block of samples; return the chunks it completed that were charged (the labels
        it completed are charged too and wait in :meth:`take_labels`)."""
        released = (self.release(chunk) for chunk in self.feed(block))
        chunks = [out for out in released if out is not None]
        self.release_labels()
        return chunks

    def queue(self, block: GazeSamples) -> None:
        """Feed a block; what it completes waits for :meth:`advance` (a live session, whose
        releases follow the clock, not the samples). Samples that arrive after their windows
        were released are dropped and said in the local log."""
        self._due += self.feed(block)
        late = self.extractor.stats.late_samples
        if late > 2 * self._late_said:  # the first, then whenever the count has doubled
            self._late_said = late
            log.warning(
                "session %r: %d gaze samples so far arrived after their windows were released "
                "(more than ingest.late_after_s behind the clock) and were dropped; a replay "
                "faster than real time cannot feed a live sidecar (replay at --speed 1, or "
                "privatize a recording with gazeguard release)",
                self.session, late,
            )  # fmt: skip

    def advance(self, until_s: float) -> list[ReleasedChunk]:
        """The public clock passed ``until_s`` (stream clock, s: every sample before it has
        been fed): release the chunks and labels of every window that ends by then, with
        gaze or without (:meth:`FeatureExtractor.advance`), and nothing later, so that when a
        release happens depends on the clock alone; samples that come later with earlier
        timestamps are dropped. Returns the charged chunks (labels wait in
        :meth:`take_labels`)."""
        if self.start_s is None:  # no sample yet and no declared open: nothing is scheduled
            return []
        X, t = self.extractor.advance(until_s)
        due = self._due + self._fed(None, X, t)
        # Every window ending LOOKBEHIND_S before the watermark is complete by now, whatever
        # the samples (the detector's look-ahead is shorter); later ones wait, even if the
        # samples completed them already, so that when a release happens is the clock's.
        settled = until_s - LOOKBEHIND_S
        ready = [c for c in due if c.timestamps[-1] <= settled]
        self._due = due[len(ready) :]
        if ready:  # they came due now (the deliberate wait for the clock is not latency)
            self._completed_at = time.perf_counter()
        released = (self.release(chunk) for chunk in ready)
        chunks = [out for out in released if out is not None]
        self.release_labels(settled)
        return chunks

    def release_labels(self, until_s: float = math.inf) -> list[ReleasedLabel]:
        """Decide, charge and enqueue the label of every decision block :meth:`feed` completed
        that ends by ``until_s`` (stream clock, s; withheld or dropped ones are recorded);
        returns the charged ones, which also wait in :meth:`take_labels`. Blocks on the
        ledger's durable commit."""
        if self.labels is None or not self._label_blocks:
            return []
        offset = self.clock_offset_s
        ready = [b for b in self._label_blocks if b[1][-1] <= until_s]
        blocks, self._label_blocks = ready, self._label_blocks[len(ready) :]
        done = [self.labels.release(b, t, offset) for b, t in blocks]
        out = [d for d in done if d is not None]
        self._labels_ready.extend(out)
        return out

    def take_labels(self) -> list[ReleasedLabel]:
        """The labels charged since the last call (outbox entries: hand them to
        ``Publisher.notify``)."""
        out, self._labels_ready = self._labels_ready, []
        return out

    def _new_extractor(self) -> FeatureExtractor:
        f = self._features
        return FeatureExtractor(
            start_s=self.start_s,
            window_s=f.window_s,
            step_s=f.step_s,
            min_valid_fraction=f.min_valid_fraction,
            hold_limit_s=f.hold_limit_s,
            detector=EventDetector(
                rate_hz=self.rate_hz,
                velocity_threshold_deg_s=f.saccade_threshold_deg_s,
                kernels=self.kernels,
            ),
            kernels=self.kernels,
        )

    def feed(self, block: GazeSamples) -> list[Chunk]:
        """Events, features and chunking only: the (raw) chunks this block completed.

        Cheap and CPU-only; :meth:`release` does the privatizing and the durable charge. The
        chunks returned are raw: hand them to :meth:`release` and nowhere else. A pause in the
        gaze is walked like any other stretch: its windows carry held values, then defaults,
        and their chunks are released on the grid like every other (the schedule never depends
        on whether samples arrived).
        """
        self._open_grid(block)
        return self._feed(block)

    def _open_grid(self, block: GazeSamples) -> None:
        """Without a declared open, the first block's first sample places the grid."""
        if self.start_s is not None or not len(block):
            return
        first = float(block.timestamps[0])
        if math.isfinite(first):
            self._start(first)
            self.extractor = self._new_extractor()

    def _start(self, opens_at: float) -> float:
        """Place the grid for a session that opened at ``opens_at`` (returned): the first
        window starts on the next chunk grid point; label blocks on their own grid's next."""
        self.start_s = on_grid(opens_at, self.grid_s, self.phase_s)
        label_grid = self.plan.label_grid_s
        if label_grid is not None:
            first = on_grid(self.start_s, label_grid, self.phase_s)
            # window ends are compared with half a step of slack (float sums of steps)
            self._labels_from = first + self._features.window_s - self._features.step_s / 2
        return opens_at

    def _feed(self, block: GazeSamples) -> list[Chunk]:
        X, t = self.extractor.push(block)
        return self._fed(block, X, t)

    def _fed(self, block: GazeSamples | None, X: np.ndarray, t: np.ndarray) -> list[Chunk]:
        """After the extractor took ``block`` (or advanced: None): its vectors ``X`` (T, 48) at
        ``t`` (T,) counted, observed and chunked; the chunks they completed."""
        if block is not None and len(block):
            self._last_t = float(block.timestamps[-1])
            if self.on_samples is not None:
                self._observe_samples(block)
        if len(t) and t[0] <= self.resume_after:
            keep = t > self.resume_after
            X, t = X[keep], t[keep]
        self.stats.steps += len(t)
        if self.labels is not None and len(t) and t[-1] >= self._labels_from:
            first = int(np.searchsorted(t, self._labels_from))
            self._label_blocks += self.labels.add(X[first:], t[first:])
        if self.on_features is not None and len(t):
            self.on_features(X, t)
        chunks = self.chunker.add(X, t)
        if chunks:
            self._completed_at = time.perf_counter()
        return chunks

    def _observe_samples(self, block: GazeSamples) -> None:
        """Hand ``block`` (less the samples at or before :attr:`resume_after`) to
        :attr:`on_samples`."""
        assert self.on_samples is not None
        ts = block.timestamps
        if ts[0] <= self.resume_after:
            first = int(np.searchsorted(ts, self.resume_after, side="right"))
            if first == len(block):
                return
            block = block.slice(first, len(block))
        self.on_samples(block)

    def close(self) -> int:
        """End the session: the incomplete tail is dropped (not padded). Returns its steps."""
        dropped = self.chunker.pending_steps
        self.stats.tail_steps_dropped = dropped
        self.stats.state = "stopped"
        if dropped:
            log.info(
                "session %r ended: %d steps of an incomplete chunk dropped (not padded)",
                self.session,
                dropped,
            )
        return dropped

    def release(self, chunk: Chunk) -> ReleasedChunk | None:
        """Privatize ``chunk``, charge it with its payload, hand it on; or withhold or drop it.

        Returns the released chunk, or ``None`` when a cap withheld it or an error dropped it
        (both recorded in the ledger and the counters). Blocks on the ledger's durable commit.
        (:func:`release_group` does the same for the chunks of many sessions in one commit.)
        """
        completed_at = self._completed_at
        try:
            values, offset, gaze = self._privatize(chunk)
            for attempt in range(_STALE_RETRIES):
                version, message, body = self._build(chunk, values, offset, gaze)
                try:
                    charge = self.ledger.charge(
                        self.session, chunk.index, self._cost, self.topic, body,
                        gaze=gaze, version=version,
                    )  # fmt: skip
                    break
                except StaleStateError:  # another writer charged this session meanwhile
                    if attempt == _STALE_RETRIES - 1:
                        raise
        except Exception as exc:  # withheld by a cap, or dropped (fail closed)
            self._refused(chunk, exc)
            return None
        return self._released(chunk, message, body, charge, completed_at)

    def _privatize(self, chunk: Chunk) -> tuple[np.ndarray, float, tuple[float, float]]:
        """The mechanism's values ``(F, n)`` of ``chunk``, the clock offset (Unix − sample time,
        s) and the chunk's gaze span (Unix s). Raises on non-finite values."""
        values = self.mechanism.release(chunk.values[self._index])
        if not np.all(np.isfinite(values)):
            msg = "mechanism produced non-finite values"
            raise FloatingPointError(msg)  # one fail-closed path for all errors
        offset = self.clock_offset_s
        gaze = (float(chunk.timestamps[0]) + offset, float(chunk.timestamps[-1]) + offset)
        return values, offset, gaze

    def _build(
        self,
        chunk: Chunk,
        values: np.ndarray,
        offset: float,
        gaze: tuple[float, float],
        preview: Preview | None = None,
    ) -> tuple[int, ChunkMessage, bytes]:
        """Preview the charge (BudgetExhaustedError: a cap refuses it; ``preview``: read
        already) and build the message quoting the state it leaves: ``(preview version,
        message, payload bytes)``."""
        if preview is None:
            preview = self.ledger.preview(self.session, self._cost, gaze=gaze)
        message = ChunkMessage.build(
            session=self.session,
            device=self.device,
            chunk_index=chunk.index,
            timestamps=chunk.timestamps,
            features=self.feature_names,
            units=self.units,
            values=values,
            mechanism=self._params,
            ledger=LedgerSnapshot.from_state(
                self.plan.chunk_pure,
                preview.state,
                raw_event_epsilon=self._per_sample,
                chunks_reached=self.plan.chunks.per_sample,
            ),
            unix_offset=offset,
            carries=self._carries,
            profile=self.profile,
        )
        return preview.version, message, message.to_payload()

    def _refused(self, chunk: Chunk, exc: Exception) -> None:
        """Record ``chunk`` withheld (a cap refused it) or dropped (any other error)."""
        if isinstance(exc, BudgetExhaustedError):
            self.ledger.withhold(self.session, chunk.index, self._cost, str(exc))
            self.stats.withheld += 1
            self.stats.withheld_indices.append(chunk.index)
            self.stats.last_reason = str(exc)
            self.stats.state = "budget_exhausted"
            log.warning("%s", exc)
            return
        # The status says fixed words: an exception's message or type may depend on the gaze,
        # which must not reach the status topic. The error's type stays local (the ledger's
        # record, ``gazeguard ledger show``), the full error in the log.
        reason = f"chunk {chunk.index} dropped by an error in its release (see the sidecar log)"
        log.error(
            "session %r: chunk %d dropped", self.session, chunk.index,
            exc_info=(type(exc), exc, exc.__traceback__),
        )  # fmt: skip
        self.stats.dropped += 1
        self.stats.last_reason = reason
        local = f"chunk {chunk.index} dropped: {type(exc).__name__} (see the sidecar log)"
        try:
            self.ledger.withhold(self.session, chunk.index, self._cost, local)
        except Exception:
            log.exception("session %r: could not record the dropped chunk", self.session)

    def _released(
        self, chunk: Chunk, message: ChunkMessage, body: bytes, charge: Charge, completed_at: float
    ) -> ReleasedChunk:
        """The chunk's charge committed: count it, tap it, hand it on."""
        out = ReleasedChunk(
            message,
            body,
            self.topic,
            charge.outbox_id,
            charge.state,
            completed_at,
            time.perf_counter(),
        )
        self.stats.released += 1
        self.stats.state = "running"
        if self.tap is not None:
            self.tap(chunk, out)
        if self.on_release is not None:
            self.on_release(out)
        return out

    def status(
        self,
        state: SessionState | None = None,
        reason: str | None = None,
        ledger_state: LedgerState | None = None,
    ) -> StatusMessage:
        """The retained status message for this session, from the ledger and the chunk
        counters (``ledger_state``: the session's state, when the caller just read it, else it
        is read now). Public figures only (:mod:`gazeguard.wire.egress`): ``state`` and
        ``reason`` come from the ledger, the release schedule and the session's lifetime, never
        from counts of samples."""
        led = self.ledger.state(self.session) if ledger_state is None else ledger_state
        return StatusMessage.model_validate(
            {
                "session": self.session,
                "device": self.device,
                "state": state or self.stats.state,
                "time": time.time(),
                "epsilon": led.epsilon,
                "delta": led.delta,
                "epsilon_window": led.epsilon_window,
                "window_s": led.window_s,
                "window_cap": led.window_cap,
                "spent": led.spent if math.isfinite(led.spent) else None,
                "remaining": led.remaining,
                "session_cap": led.session_cap,
                "chunks_charged": led.chunks,
                "chunks_delivered": max(0, led.chunks - led.pending - led.refused),
                "chunks_refused": led.refused,
                "chunks_withheld": self.stats.withheld,
                "chunks_dropped": self.stats.dropped,
                "reason": reason or self.stats.last_reason,
            }
        )


def feed_many(
    items: Sequence[tuple[Pipeline, GazeSamples]],
) -> tuple[list[tuple[Pipeline, Chunk]], list[tuple[Pipeline, GazeguardError]]]:
    """:meth:`Pipeline.feed` of many sessions, in order (each session's detector and extractor
    run the compiled passes where it was given them, numpy otherwise).

    Returns:
        The chunks the blocks completed, as ``(pipeline, chunk)`` in the order of ``items``
        (hand them to :func:`release_group`), and ``(pipeline, error)`` of each session whose
        block its extractor refused (that session's block is not taken; the others are).
    """
    jobs: list[tuple[Pipeline, Chunk]] = []
    errors: list[tuple[Pipeline, GazeguardError]] = []
    for pipe, block in items:
        try:
            chunks = pipe.feed(block)
        except GazeguardError as exc:
            errors.append((pipe, exc))
            continue
        jobs.extend((pipe, c) for c in chunks)
    return jobs, errors


def release_group(jobs: Sequence[tuple[Pipeline, Chunk]]) -> list[ReleasedChunk | None]:
    """:meth:`Pipeline.release` of many sessions' chunks with one ledger commit per round.

    ``jobs``: ``(pipeline, chunk)`` pairs, every pipeline on one ledger, each pipeline's chunks
    in order. Each chunk is privatized, previewed and built exactly as :meth:`Pipeline.release`
    does; the charges of one round — the first chunk still to charge of every session — go in
    one :meth:`Ledger.charge_many` transaction (group commit), so a session's chunks are charged
    in order, each at most once. A chunk a cap refuses is withheld, one that fails is dropped,
    a stale one is built and charged again in the next round (at most as often as
    :meth:`Pipeline.release` would), without touching the others. A group of one is
    :meth:`Pipeline.release`. Blocks on the commits.

    Returns:
        Per job, in order: the released chunk, or ``None`` (withheld or dropped, recorded).
    """
    if len(jobs) == 1:  # a group of one: the one-chunk path
        pipe, chunk = jobs[0]
        return [pipe.release(chunk)]
    out: list[ReleasedChunk | None] = [None] * len(jobs)
    if not jobs:
        return out
    ledger = jobs[0][0].ledger
    completed = [pipe._completed_at for pipe, _ in jobs]
    todo: dict[int, collections.deque[int]] = {}  # per pipeline: its jobs still to charge
    made: dict[int, tuple[np.ndarray, float, tuple[float, float]]] = {}
    for k, (pipe, chunk) in enumerate(jobs):
        if pipe.ledger is not ledger:
            msg = "release_group: every pipeline must charge the same ledger"
            raise ValueError(msg)
        try:
            made[k] = pipe._privatize(chunk)
        except Exception as exc:
            pipe._refused(chunk, exc)
            continue
        todo.setdefault(id(pipe), collections.deque()).append(k)
    stale = collections.Counter[int]()
    while todo:
        built, requests = _build_round(jobs, todo, made)
        if not requests:
            continue
        results: Sequence[Charge | Exception]
        try:
            results = ledger.charge_many(requests)
        except Exception as exc:  # the transaction failed: none of them was charged
            results = [exc] * len(requests)
        for (k, message, body), result in zip(built, results, strict=True):
            pipe, chunk = jobs[k]
            if isinstance(result, StaleStateError) and stale[k] < _STALE_RETRIES - 1:
                stale[k] += 1  # another writer charged the session meanwhile: again
                continue
            _done(todo, id(pipe))
            if isinstance(result, Exception):
                pipe._refused(chunk, result)
            else:
                out[k] = pipe._released(chunk, message, body, result, completed[k])
    return out


def _build_round(
    jobs: Sequence[tuple[Pipeline, Chunk]],
    todo: dict[int, collections.deque[int]],
    made: dict[int, tuple[np.ndarray, float, tuple[float, float]]],
) -> tuple[list[tuple[int, ChunkMessage, bytes]], list[ChargeRequest]]:
    """Preview (all in one read) and build the first job still to charge of every pipeline:
    ``(job, message, payload)`` and its charge request each; a job a cap or an error refuses
    is settled."""
    built: list[tuple[int, ChunkMessage, bytes]] = []
    requests: list[ChargeRequest] = []
    firsts = [(key, queue[0]) for key, queue in todo.items()]
    asks = []
    for _, k in firsts:
        pipe, chunk = jobs[k]
        ask = ChargeRequest(pipe.session, chunk.index, pipe._cost, pipe.topic, b"", made[k][2])
        asks.append(ask)
    try:
        previews: Sequence[Preview | Exception] = jobs[0][0].ledger.preview_many(asks)
    except Exception as exc:  # the read failed: each job is settled as its own preview would be
        previews = [exc] * len(asks)
    for (key, k), preview in zip(firsts, previews, strict=True):
        pipe, chunk = jobs[k]
        values, offset, gaze = made[k]
        try:
            if isinstance(preview, Exception):
                raise preview
            version, message, body = pipe._build(chunk, values, offset, gaze, preview)
        except Exception as exc:  # a cap refuses it already, or it failed
            pipe._refused(chunk, exc)
            _done(todo, key)
            continue
        built.append((k, message, body))
        request = ChargeRequest(
            pipe.session, chunk.index, pipe._cost, pipe.topic, body, gaze=gaze, version=version
        )
        requests.append(request)
    return built, requests


def _done(todo: dict[int, collections.deque[int]], key: int) -> None:
    """The first job of pipeline ``key`` is settled."""
    queue = todo[key]
    queue.popleft()
    if not queue:
        del todo[key]
