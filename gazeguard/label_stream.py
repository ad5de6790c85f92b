"""The private-label stream of a session: decisions on clean features, charged, then published.

:class:`LabelStream` sits next to the chunk path inside :class:`gazeguard.pipeline.Pipeline`: it
receives the same clean feature vectors (all registry features, one every ``step_s``), buffers
``n = decision_s / step_s`` consecutive vectors — one *block*, exactly like a chunk of ``n``
steps — and runs the label model (:class:`gazeguard.labels.LabelModel`) on each full block inside
the trusted process: the block's mean class probabilities never leave it.

``labels.release = "clock"``: every block is a decision — the argmax, privatized by exact k-ary
randomized response at ``ε`` (:class:`~gazeguard.labels.RandomizedResponse`, OS CSPRNG).

``labels.release = "change"`` (default): a label is released when the activity changes.

1. The first block's decision is released at once (the first label, one block after the first
   feature vector).
2. Then, once ``min_interval_s`` of gaze has passed since the last label, each block asks the
   sparse vector technique (:class:`~gazeguard.mechanisms.svt.AboveThreshold`) whether another
   class's mean probability beats the held label's by ``threshold``: ``q = max_{c≠ℓ} p_c −
   p_ℓ`` (ℓ the *released* label, public), in ``[−1, 1]``, sensitivity 2 whatever the gaze. The
   first "above" ends the round and releases the block's decision by randomized response; a
   new round starts. Between labels the consumer holds the last one (the message says from
   when).
3. Each released label is charged ``RandomizedResponseEvent(ε_rr, C)`` for itself and
   ``PureEvent(ε_svt)`` for the detection round that starts after it (paid before any of its
   queries is asked; a round is ε_svt-DP however many "no change" answers it gives). Labels
   are at least ``min_interval_s`` apart, which bounds what an hour can spend.

Either way, each label is charged to the ledger (stream ``"labels"``) with its block's gaze span
and its :class:`~gazeguard.label_message.LabelMessage` payload enqueued in the same transaction
(the outbox the chunks use), then handed on for publishing — or, when a cap would be exceeded,
withheld (recorded in the ledger, nothing published).

Budget (:func:`plan_labels`, called by the release plan, :mod:`gazeguard.plan`). The ledger
caps user-level ε at δ over every hour of gaze, all release kinds together. Labels get their
share ``(R, δ_L)`` of it (``R = labels.budget_share × B``), and ``D`` — the decisions an hour
of gaze can change, counted by the plan — randomized-response releases must compose to at most
that: ``ε`` per decision is the largest for which the accountant's composition of ``D``
decisions is ``≤ R`` at ``δ_L``; or ``ε = labels.epsilon``, whose ``D``-fold composition must
then fit below ``B``. One raw gaze sample reaches the plan's ``per_sample`` decisions. Nothing
in the plan reads the user's data.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from gazeguard.accounting import Event, PureEvent, RandomizedResponseEvent, compose
from gazeguard.errors import BudgetExhaustedError, ConfigError
from gazeguard.label_message import LabelMessage, label_topic
from gazeguard.labels import (
    MAX_EPSILON,
    MIN_EPSILON,
    LabelModel,
    LabelRelease,
    load_model,
    released_accuracy,
    survival_probability,
)
from gazeguard.ledger import Ledger, LedgerState, StaleStateError, event_key
from gazeguard.mechanisms.noise import RandomSource, random_source
from gazeguard.mechanisms.svt import AboveThreshold

if TYPE_CHECKING:
    from gazeguard.config import FeatureSettings, LabelSettings

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]

#: The ledger stream (index space) of labels.
STREAM = "labels"
_STALE_RETRIES = 8


def _steps_per_decision(decision_s: float, step_s: float) -> int:
    """``decision_s / step_s`` as an exact integer ≥ 2 (durations at their decimal value)."""
    ratio = Fraction(repr(float(decision_s))) / Fraction(repr(float(step_s)))
    if ratio.denominator != 1 or ratio < 2:
        raise ConfigError(
            "labels.decision_s",
            decision_s,
            f"must be a whole multiple (>= 2) of features.step_s = {step_s:g} s: one decision "
            f"summarises that many consecutive feature vectors (e.g. {step_s * 600:g} s)",
        )
    return int(ratio)


def clean_accuracy_of(model: LabelModel, decision_s: float) -> float | None:
    """The model's leave-one-person-out clean accuracy per decision, as recorded in its file:
    ``trained.lopo_decision_accuracy[s]`` for the longest recorded block length ``s ≤
    decision_s`` (blocks longer than the build recordings were not measured), else the per-window
    ``trained.lopo_window_accuracy``; ``None`` if the file records neither."""
    trained = model.spec.trained
    per = trained.get("lopo_decision_accuracy")
    if isinstance(per, dict):
        fits = sorted(
            (float(k), float(v))
            for k, v in per.items()
            if isinstance(v, int | float) and float(k) <= decision_s
        )
        if fits:
            return fits[-1][1]
    v = trained.get("lopo_window_accuracy")
    return float(v) if isinstance(v, int | float) else None


@dataclass(frozen=True)
class LabelPlan:
    """The label release the settings describe, and what it costs and buys.

    Attributes:
        model: the loaded label model (features checked against the sidecar's).
        epsilon: ε of each label's randomized response (pure).
        decision_s: seconds of gaze per decision; steps: feature vectors per decision.
        per_window: ``D``, the decisions one hour of gaze can change (the plan's count).
        reserve: the labels' share of the hourly budget, ε at ``delta`` (with a fixed
            ``labels.epsilon``: what ``D`` decisions cost).
        budget: ``B``, the ledger's budget per hour (``None``: no hourly cap).
        delta: δ of the labels' share.
        reached: decisions one raw gaze sample can change (the plan's count).
        clean_accuracy: the model's recorded clean accuracy per decision (or ``None``).
        release: ``change`` or ``clock`` (module docstring).
        epsilon_svt: ε of each change-detection round (``change``; 0 for ``clock``).
        threshold: the change threshold on the probability margin (``change``).
        min_interval_s: the least gaze time between two labels (``change``), s.
    """

    model: LabelModel
    epsilon: float
    decision_s: float
    steps: int
    per_window: int
    reserve: float
    budget: float | None
    delta: float
    reached: int
    clean_accuracy: float | None
    release: str = "clock"
    epsilon_svt: float = 0.0
    threshold: float = 0.0
    min_interval_s: float = 0.0

    @property
    def classes(self) -> int:
        """C, the number of labels."""
        return len(self.model.classes)

    @property
    def event(self) -> RandomizedResponseEvent:
        """The accounting event of one label's randomized response."""
        return RandomizedResponseEvent(self.epsilon, self.classes)

    @property
    def events(self) -> dict[Event, int]:
        """What one released label is charged: its randomized response, and (``change``) the
        detection round that starts after it."""
        return label_events(self.epsilon, self.epsilon_svt, self.classes)

    @property
    def survival(self) -> float:
        """``p = e^ε/(e^ε + C − 1)``: probability that a label is the clean decision."""
        return survival_probability(self.epsilon, self.classes)

    @property
    def released_accuracy(self) -> float | None:
        """Expected accuracy of released labels, ``p·acc + (1 − p)(1 − acc)/(C − 1)``."""
        if self.clean_accuracy is None:
            return None
        return released_accuracy(self.clean_accuracy, self.survival, self.classes)

    @property
    def hour_epsilon(self) -> float:
        """ε at δ of the ``D`` labels of one hour (PLD; at most ``reserve``)."""
        return compose({e: c * self.per_window for e, c in self.events.items()}, self.delta).epsilon

    @property
    def sample_epsilon(self) -> float:
        """ε at δ of the labels one raw gaze sample can change."""
        return compose({e: c * self.reached for e, c in self.events.items()}, self.delta).epsilon

    def text(self) -> str:
        """The arithmetic printed at startup (several lines)."""
        c, p, eps = self.classes, self.survival, self.epsilon
        names = ", ".join(self.model.classes)
        if self.release == "change":
            how = (
                f"a label when the activity changes (sparse vector technique on each "
                f"{self.decision_s:g} s block, margin {self.threshold:g}, ε {self.epsilon_svt:.4g} "
                f"per detection round), at most one per {self.min_interval_s:g} s of gaze"
            )
        else:
            how = f"one label per {self.decision_s:g} s of gaze ({self.steps} feature vectors)"
        lines = [
            f"private labels: model {self.model.name!r} v{self.model.version}, {c} classes "
            f"({names}); {how}; randomized response at ε {eps:.4g} per label",
            f"  the true label survives with p = e^ε/(e^ε + C − 1) = {p:.3f} (chance 1/C = "
            f"{1 / c:.3f}); each other label is reported with {(1 - p) / (c - 1):.3f}",
            f"  one hour of gaze can change {self.per_window} labels: ε "
            f"{self.hour_epsilon:.4g} at δ {self.delta:g}; one raw gaze sample reaches "
            f"{self.reached} labels: ε {self.sample_epsilon:.4g}",
        ]
        if self.clean_accuracy is not None and self.released_accuracy is not None:
            acc, rel = self.clean_accuracy, self.released_accuracy
            lines.append(
                f"  clean accuracy {acc:.3f} (leave-one-person-out, recorded in the model) → "
                f"released p·acc + (1−p)(1−acc)/(C−1) = {rel:.3f} ({100 * rel / acc:.0f} % of "
                "clean)"
            )
        return "\n".join(lines)


def label_events(epsilon: float, epsilon_svt: float, classes: int) -> dict[Event, int]:
    """The accounting events of one released label: its randomized response at ``epsilon``
    and, when ``epsilon_svt > 0``, the change-detection round it pays for."""
    out: dict[Event, int] = {RandomizedResponseEvent(epsilon, classes): 1}
    if epsilon_svt > 0:
        out[PureEvent(epsilon_svt)] = 1
    return out


def decision_epsilon(
    share: float, decisions: int, classes: int, delta: float, svt_fraction: float = 0.0
) -> float:
    """The largest ε per label (to 1e-6 relative; ``svt_fraction`` of it on change detection,
    the rest on randomized response) whose ``decisions``-fold release composes to at most
    ``share`` at ``delta`` (the accountant's PLD; never below the pure split
    ``share/decisions``), capped at :data:`~gazeguard.labels.MAX_EPSILON` per part."""

    def cost(eps: float) -> float:
        f = svt_fraction
        events = label_events((1.0 - f) * eps, f * eps, classes)
        return compose({e: c * decisions for e, c in events.items()}, delta).epsilon

    lo, hi = share / decisions, min(share, MAX_EPSILON)
    if cost(hi) <= share:
        return hi
    while hi - lo > 1e-6 * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(mid) <= share else (lo, mid)
    return lo


def load_label_model(labels: LabelSettings, features: FeatureSettings) -> LabelModel:
    """The label model the settings name, checked against the sidecar's feature window/step.

    Raises:
        ConfigError: the model cannot be loaded, reads unknown features, or was trained with
            another window or step.
    """
    model = load_model(labels.model)
    if not (
        math.isclose(model.spec.window_s, features.window_s)
        and math.isclose(model.spec.step_s, features.step_s)
    ):
        raise ConfigError(
            "labels.model",
            labels.model,
            f"model {model.name!r} ({model.source}) was trained on features of window "
            f"{model.spec.window_s:g} s and step {model.spec.step_s:g} s, but the sidecar computes "
            f"features.window_s = {features.window_s:g} s, step_s = {features.step_s:g} s: its "
            "features would not match; train a model with these settings (`gazeguard profile "
            "train-model --window W --step S`) or set the feature window and step it expects",
        )
    return model


def steps_per_decision(labels: LabelSettings, features: FeatureSettings) -> int:
    """Feature vectors per decision (ConfigError: not a whole multiple >= 2 of the step)."""
    return _steps_per_decision(labels.decision_s, features.step_s)


def plan_labels(
    labels: LabelSettings,
    features: FeatureSettings,
    *,
    model: LabelModel,
    per_hour: int,
    per_sample: int,
    share: float | None,
    budget: float | None,
    delta: float,
) -> LabelPlan:
    """ε per decision for the release plan's counts (module docstring).

    Args:
        labels: the ``labels`` settings.
        features: the feature window and step.
        model: the label model (:func:`load_label_model`).
        per_hour: ``D``, the decisions one hour of gaze can change.
        per_sample: the decisions one raw gaze sample can change.
        share: the labels' share of the hourly budget, ε at ``delta`` (``None``: no budget).
        budget: ``ledger.budget_per_hour`` (``None``: no hourly cap).
        delta: δ of the labels' share.

    Raises:
        ConfigError: ``decision_s`` is not a whole multiple of the step; a fixed ε whose hour
            leaves nothing for the rest; ε out of range.
    """
    steps = _steps_per_decision(labels.decision_s, features.step_s)
    classes = len(model.classes)
    f = labels.svt_fraction if labels.release == "change" else 0.0
    if labels.epsilon is not None:
        total = float(labels.epsilon)
        events = label_events((1.0 - f) * total, f * total, classes)
        reserve = compose({e: c * per_hour for e, c in events.items()}, delta).epsilon
        if budget is not None and reserve >= budget:
            raise ConfigError(
                "labels.epsilon",
                labels.epsilon,
                f"{per_hour} labels per hour of gaze at ε {total:g} cost {reserve:.4g}, "
                f"which leaves nothing of ledger.budget_per_hour = {budget:g} for the chunks: "
                "lower labels.epsilon, raise labels.decision_s, or unset labels.epsilon to use "
                "labels.budget_share",
            )
    else:
        if share is None:
            raise ConfigError(
                "labels.epsilon",
                None,
                "nothing to derive ε per decision from: set labels.epsilon or "
                "ledger.budget_per_hour (with labels.budget_share)",
            )
        reserve = share
        total = decision_epsilon(share, per_hour, classes, delta, f)
    epsilon = (1.0 - f) * total
    if not MIN_EPSILON <= epsilon <= MAX_EPSILON:
        raise ConfigError(
            "labels.epsilon",
            epsilon,
            f"ε of a label's randomized response must lie in [{MIN_EPSILON:.3g}, "
            f"{MAX_EPSILON:g}]"
            + ("" if labels.epsilon is not None else " (from labels.budget_share)"),
        )
    return LabelPlan(
        model=model,
        epsilon=epsilon,
        decision_s=float(labels.decision_s),
        steps=steps,
        per_window=per_hour,
        reserve=reserve,
        budget=budget,
        delta=delta,
        reached=per_sample,
        clean_accuracy=clean_accuracy_of(model, labels.decision_s),
        release=labels.release,
        epsilon_svt=f * total,
        threshold=labels.threshold,
        min_interval_s=labels.min_interval_s,
    )


@dataclass(frozen=True, slots=True)
class ReleasedLabel:
    """A label whose charge is committed and whose payload waits in the ledger outbox (the
    outbox-entry view :class:`gazeguard.outbox.OutboxEntry`: hand it to ``Publisher.notify``).

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
    """Counters of one session's label stream."""

    released: int = 0
    checks: int = 0  # change detection queries asked (release = "change")
    withheld: int = 0
    dropped: int = 0
    last_reason: str | None = None


class LabelStream:
    """Decision blocks → private labels → ledger, for one session (synchronous; see the module
    docstring).

    Args:
        ledger: where every label is charged before it is handed on.
        plan: :func:`plan_labels`.
        session, device: the ledger account and the topic's device.
        input_features: names of the columns of the vectors :meth:`add` receives (the
            extractor's: :data:`gazeguard.features.NAMES`).
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
        self._events = {event_key(e): c for e, c in plan.events.items()}
        self._eps_map = {"label": plan.epsilon}
        # change: the held (released, so public) label, when it was released, and the
        # detection round (paid by the last released label; started at its first query)
        self._change = plan.release == "change"
        if self._change:
            self._eps_map["change"] = plan.epsilon_svt
        self._svt = (
            AboveThreshold(plan.epsilon_svt, 2.0, plan.threshold, source) if self._change else None
        )
        self._held: int | None = None
        self._held_until = -math.inf  # gaze time (LSL clock) before which nothing is asked
        self._paid = False  # a detection round is paid for (the last label was charged)
        self.stats = LabelStats()

    @property
    def pending_steps(self) -> int:
        """Feature vectors buffered towards the next decision (dropped if the session ends)."""
        return self._fill

    def restart(self) -> None:
        """Drop the incomplete decision block (a pause ended its segment: a label decides on
        one stretch of gaze, not on both sides of a pause)."""
        self._fill = 0

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
        """One block: decide, privatize, charge and enqueue its label (``clock``), or — with
        ``change`` — release one only for the first block and when the sparse vector technique
        says the activity changed; ``None`` when no label was released, a cap withheld it or
        an error dropped it (the last two recorded in the ledger and :attr:`stats`). Blocks on
        the ledger's durable commit.

        Args:
            block: (n, F_model) clean feature vectors of one block.
            times: (n,) their times, s (LSL clock).
            offset: Unix time minus ``times``, s.
        """
        if not self._change:
            return self._decide(block, times, offset)
        assert self._svt is not None
        finite = block[np.isfinite(block).all(axis=1)]
        end = float(times[-1])
        if finite.shape[0] == 0 or end < self._held_until:
            return None
        p = self.release_.probabilities(finite)  # once: it feeds a per-session model's stats
        if self._held is not None and self._paid:
            others = np.delete(p, self._held)
            if not self._svt.active:
                self._svt.start()
            self.stats.checks += 1
            if not self._svt.query(float(others.max() - p[self._held])):
                return None
        # the first label, a change, or a label a cap withheld before: release this block's
        self._paid = False  # the round that said "changed" is over
        out = self._decide(block, times, offset, int(np.argmax(p)))
        if out is not None:
            self._held = out.message.classes.index(out.message.label)
            self._held_until = end + self.plan.min_interval_s
            self._paid = True  # its charge paid for the next round
        return out

    def _decide(
        self, block: FloatArray, times: FloatArray, offset: float, true: int | None = None
    ) -> ReleasedLabel | None:
        """Privatize, charge and enqueue one block's label: randomized response on its clean
        decision (``true``, when the caller has it already)."""
        index = self.next_index
        self.next_index += 1
        gaze = (float(times[0]) + offset, float(times[-1]) + offset)
        try:
            finite = block[np.isfinite(block).all(axis=1)]
            if finite.shape[0] == 0:
                msg = "no finite feature vector in the decision block"
                raise FloatingPointError(msg)
            decision = (
                self.release_.release(finite)
                if true is None
                else self.release_.release_class(true, vectors=finite.shape[0])
            )
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
                release="change" if self._change else "clock",
                epsilon_change=self.plan.epsilon_svt if self._change else None,
            )
            body = message.to_payload()
            for attempt in range(_STALE_RETRIES):
                try:
                    charge = self.ledger.charge(
                        self.session, index, self._eps_map, self.topic, body,
                        events=self._events, gaze=gaze, stream=STREAM,
                    )  # fmt: skip
                    break
                except StaleStateError:
                    if attempt == _STALE_RETRIES - 1:
                        raise
        except BudgetExhaustedError as exc:
            self.ledger.withhold(self.session, index, self._eps_map, str(exc), stream=STREAM)
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
                self.ledger.withhold(self.session, index, self._eps_map, reason, stream=STREAM)
            except Exception:
                log.exception("session %r: could not record the dropped label", self.session)
            return None
        self.stats.released += 1
        return ReleasedLabel(message, body, self.topic, charge.outbox_id, charge.state)


__all__ = [
    "STREAM",
    "LabelPlan",
    "LabelStats",
    "LabelStream",
    "ReleasedLabel",
    "clean_accuracy_of",
    "plan_labels",
]
