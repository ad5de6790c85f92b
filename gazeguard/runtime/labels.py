"""The private-label stream of a session: decisions on clean features, charged, then published.

:class:`LabelStream` sits next to the chunk path inside
:class:`gazeguard.runtime.pipeline.Pipeline`: it receives the same clean feature vectors (all
registry features, one every ``step_s``), buffers ``n = decision_s / step_s`` consecutive vectors
— one *block*, exactly like a chunk of ``n`` steps — and runs the label model
(:class:`gazeguard.signal.labels.LabelModel`) on each full block inside the trusted process: the
block's mean class probabilities never leave it.

Every block is a decision — the argmax, privatized by exact k-ary randomized response at ``ε``
(:class:`~gazeguard.signal.labels.RandomizedResponse`, OS CSPRNG): one label per
``decision_s`` of gaze, a clock; between labels the consumer holds the last one (the message
says from when).

Each label is charged to the ledger (stream ``"labels"``) with its block's gaze span
and its :class:`~gazeguard.wire.label.LabelMessage` payload enqueued in the same transaction
(the outbox the chunks use), then handed on for publishing — or, when a cap would be exceeded,
withheld (recorded in the ledger, nothing published).

The label plan (ε per decision, the labels an hour can change) is :mod:`gazeguard.plan.labels`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import Ledger, LedgerState, StaleStateError
from gazeguard.plan.labels import LabelPlan
from gazeguard.privacy.mechanisms.randomness import RandomSource, random_source
from gazeguard.signal.labels import LabelRelease
from gazeguard.wire.label import LabelMessage
from gazeguard.wire.topics import label_topic

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]

#: The ledger stream (index space) of labels.
STREAM = "labels"
_STALE_RETRIES = 8


@dataclass(frozen=True, slots=True)
class ReleasedLabel:
    """A label whose charge is committed and whose payload waits in the ledger outbox (the
    outbox-entry view :class:`gazeguard.ledger.outbox.OutboxEntry`: hand it to
    ``Publisher.notify``).

    Attributes:
        message: the label message as published.
        payload: the exact bytes enqueued.
        topic: ``{prefix}/{device}/{session}/labels``.
        id: position in the ledger outbox.
        state: the session's ledger state right after the charge.
    """

    message: LabelMessage
    payload: bytes
    topic: str
    id: int
    state: LedgerState

    @property
    def session(self) -> str:
        """Session id."""
        return self.message.session

    @property
    def chunk_index(self) -> int:
        """The decision index (the index in the ledger's ``labels`` stream)."""
        return self.message.decision_index


@dataclass(slots=True)
class LabelStats:
    """Counters of one session's label stream.

    Attributes:
        released: labels charged and handed on.
        switches: released labels that differ from the one before (what a consumer sees
            change; randomized response can switch a label, or keep it across a change).
        withheld, dropped: labels a cap withheld, or an error dropped (recorded in the ledger).
        last_reason: why the last one was withheld or dropped.
        last_label: the last released label, or ``None``.
    """

    released: int = 0
    switches: int = 0
    withheld: int = 0
    dropped: int = 0
    last_reason: str | None = None
    last_label: str | None = None


class LabelStream:
    """Decision blocks → private labels → ledger, for one session (synchronous; see the module
    docstring).

    Args:
        ledger: where every label is charged before it is handed on.
        plan: :func:`plan_labels`.
        session, device: the ledger account and the topic's device.
        input_features: names of the columns of the vectors :meth:`add` receives (the
            extractor's: :data:`gazeguard.signal.features.NAMES`).
        topic_prefix: the MQTT topic prefix.
        profile: the release profile named in each message (default: the model's, else its
            name).
        insecure_seed: seed a reproducible generator (tests only; messages say
            ``INSECURE-seeded``).
    """

    def __init__(
        self,
        ledger: Ledger,
        plan: LabelPlan,
        *,
        session: str,
        device: str,
        input_features: Sequence[str],
        topic_prefix: str = "gazeguard/v1",
        profile: str | None = None,
        insecure_seed: int | None = None,
    ) -> None:
        self.ledger = ledger
        self.plan = plan
        self.session = session
        self.device = device
        self.topic = label_topic(topic_prefix, device, session)
        self.profile = profile or plan.model.spec.profile or plan.model.name
        source: RandomSource = random_source(insecure_seed)
        self.release_ = LabelRelease(
            plan.model, plan.epsilon, input_features=list(plan.model.features), source=source
        )
        names = list(input_features)
        missing = [f for f in plan.model.features if f not in names]
        if missing:
            raise ConfigError(
                "labels.model",
                plan.model.source,
                f"model {plan.model.name!r} reads features {missing} the sidecar does not compute",
            )
        self._cols = np.array([names.index(f) for f in plan.model.features], dtype=np.intp)
        self._buf = np.empty((plan.steps, self._cols.size), dtype=np.float64)
        self._times = np.empty(plan.steps, dtype=np.float64)
        self._fill = 0
        self.next_index = ledger.next_index(session, STREAM)
        self._cost = plan.cost
        self.stats = LabelStats()

    @property
    def pending_steps(self) -> int:
        """Feature vectors buffered towards the next decision (dropped if the session ends)."""
        return self._fill

    def add(self, X: FloatArray, t: FloatArray) -> list[tuple[FloatArray, FloatArray]]:
        """Append clean feature vectors; return the decision blocks they complete (cheap, no
        I/O). The blocks are raw: hand them to :meth:`release` and nowhere else.

        Args:
            X: (k, F_in) clean feature vectors, columns ``input_features``.
            t: (k,) their times, s (LSL clock).

        Returns:
            ``(vectors (n, F_model), times (n,))`` per completed block.
        """
        out: list[tuple[FloatArray, FloatArray]] = []
        k, n, i = len(t), self.plan.steps, 0
        while i < k:
            take = min(n - self._fill, k - i)
            self._buf[self._fill : self._fill + take] = X[i : i + take][:, self._cols]
            self._times[self._fill : self._fill + take] = t[i : i + take]
            self._fill += take
            i += take
            if self._fill == n:
                self._fill = 0
                out.append((self._buf.copy(), self._times.copy()))
        return out

    def release(self, block: FloatArray, times: FloatArray, offset: float) -> ReleasedLabel | None:
        """One block: decide, privatize, charge and enqueue its label; ``None`` when a cap
        withheld it or an error dropped it (recorded in the ledger and :attr:`stats`). Blocks on
        the ledger's durable commit.

        Args:
            block: (n, F_model) clean feature vectors of one block.
            times: (n,) their times, s (LSL clock).
            offset: Unix time minus ``times``, s.
        """
        index = self.next_index
        self.next_index += 1
        gaze = (float(times[0]) + offset, float(times[-1]) + offset)
        try:
            finite = block[np.isfinite(block).all(axis=1)]
            if finite.shape[0] == 0:
                msg = "no finite feature vector in the decision block"
                raise FloatingPointError(msg)
            decision = self.release_.release(finite)
            message = LabelMessage.build(
                decision,
                session=self.session,
                device=self.device,
                decision_index=index,
                window_start=float(times[0]),
                window_end=float(times[-1]),
                model_name=self.plan.model.name,
                model_version=self.plan.model.version,
                profile=self.profile,
                clean_accuracy=self.plan.clean_accuracy,
                unix_end=gaze[1],
            )
            body = message.to_payload()
            for attempt in range(_STALE_RETRIES):
                try:
                    charge = self.ledger.charge(
                        self.session, index, self._cost, self.topic, body,
                        gaze=gaze, stream=STREAM,
                    )  # fmt: skip
                    break
                except StaleStateError:
                    if attempt == _STALE_RETRIES - 1:
                        raise
        except BudgetExhaustedError as exc:
            self.ledger.withhold(self.session, index, self._cost, str(exc), stream=STREAM)
            self.stats.withheld += 1
            self.stats.last_reason = str(exc)
            log.warning("session %r: label %d withheld: %s", self.session, index, exc)
            return None
        except Exception as exc:  # fail closed: nothing about the decision is published
            reason = f"label {index} dropped: {type(exc).__name__} (see the sidecar log)"
            log.exception("session %r: label %d dropped", self.session, index)
            self.stats.dropped += 1
            self.stats.last_reason = reason
            try:
                self.ledger.withhold(self.session, index, self._cost, reason, stream=STREAM)
            except Exception:
                log.exception("session %r: could not record the dropped label", self.session)
            return None
        self.stats.released += 1
        self.stats.switches += self.stats.last_label not in (None, message.label)
        self.stats.last_label = message.label
        return ReleasedLabel(message, body, self.topic, charge.outbox_id, charge.state)

    @property
    def epsilon(self) -> float:
        """ε at the plan's δ of the labels released so far: the accountant's composition of
        their randomized responses (the labels alone; the ledger's user-level figure composes
        them with every other release of the session)."""
        return self.plan.epsilon_of(self.stats.released)


__all__ = ["STREAM", "LabelStats", "LabelStream", "ReleasedLabel"]
