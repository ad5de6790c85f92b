"""The private-label stream of a session: decisions on clean features, charged, then published.

:class:`LabelStream` sits next to the chunk path inside :class:`gazeguard.pipeline.Pipeline`: it
receives the same clean feature vectors (all registry features, one every ``step_s``), buffers
``n = decision_s / step_s`` consecutive vectors — one *decision block*, exactly like a chunk of
``n`` steps — and for each full block

1. runs the label model (:class:`gazeguard.labels.LabelModel`) on the block's vectors inside the
   trusted process: the argmax of the mean class probability is the clean decision, which never
   leaves :class:`~gazeguard.labels.LabelRelease`;
2. privatizes it with exact k-ary randomized response at ``ε`` per decision
   (:class:`~gazeguard.labels.RandomizedResponse`, OS CSPRNG);
3. charges the ledger, stream ``"labels"``, one ``RandomizedResponseEvent(ε, C)`` with the
   block's gaze span, and enqueues the :class:`~gazeguard.label_message.LabelMessage` payload in
   the same transaction (the outbox the chunks use);
4. hands the :class:`ReleasedLabel` on for publishing — or, when a cap would be exceeded,
   withholds it (recorded in the ledger, nothing published).

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

from gazeguard.accounting import RandomizedResponseEvent, compose
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
        epsilon: ε per decision (pure).
        decision_s: seconds of gaze per decision; steps: feature vectors per decision.
        per_window: ``D``, the decisions one hour of gaze can change (the plan's count).
        reserve: the labels' share of the hourly budget, ε at ``delta`` (with a fixed
            ``labels.epsilon``: what ``D`` decisions cost).
        budget: ``B``, the ledger's budget per hour (``None``: no hourly cap).
        delta: δ of the labels' share.
        reached: decisions one raw gaze sample can change (the plan's count).
        clean_accuracy: the model's recorded clean accuracy per decision (or ``None``).
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

    @property
    def classes(self) -> int:
        """C, the number of labels."""
        return len(self.model.classes)

    @property
    def event(self) -> RandomizedResponseEvent:
        """The accounting event of one decision."""
        return RandomizedResponseEvent(self.epsilon, self.classes)

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
        """ε at δ of the ``D`` decisions of one hour (PLD; at most ``reserve``)."""
        return compose({self.event: self.per_window}, self.delta).epsilon

    @property
    def sample_epsilon(self) -> float:
        """ε at δ of the decisions one raw gaze sample can change."""
        return compose({self.event: self.reached}, self.delta).epsilon

    def text(self) -> str:
        """The arithmetic printed at startup (several lines)."""
        c, p, eps = self.classes, self.survival, self.epsilon
        names = ", ".join(self.model.classes)
        lines = [
            f"private labels: model {self.model.name!r} v{self.model.version}, {c} classes "
            f"({names}); one decision per {self.decision_s:g} s of gaze ({self.steps} feature "
            f"vectors), randomized response at ε {eps:.4g} per decision",
            f"  the true label survives with p = e^ε/(e^ε + C − 1) = {p:.3f} (chance 1/C = "
            f"{1 / c:.3f}); each other label is reported with {(1 - p) / (c - 1):.3f}",
            f"  one hour of gaze can change {self.per_window} decisions: ε "
            f"{self.hour_epsilon:.4g} at δ {self.delta:g}; one raw gaze sample reaches "
            f"{self.reached} decisions: ε {self.sample_epsilon:.4g}",
        ]
        if self.clean_accuracy is not None and self.released_accuracy is not None:
            acc, rel = self.clean_accuracy, self.released_accuracy
            lines.append(
                f"  clean accuracy {acc:.3f} (leave-one-person-out, recorded in the model) → "
                f"released p·acc + (1−p)(1−acc)/(C−1) = {rel:.3f} ({100 * rel / acc:.0f} % of "
                "clean)"
            )
        return "\n".join(lines)


def decision_epsilon(share: float, decisions: int, classes: int, delta: float) -> float:
    """The largest ε per decision (to 1e-6 relative) whose ``decisions``-fold randomized
    response composes to at most ``share`` at ``delta`` (the accountant's PLD; never below
    the pure split ``share/decisions``), capped at :data:`~gazeguard.labels.MAX_EPSILON`."""

    def cost(eps: float) -> float:
        return compose({RandomizedResponseEvent(eps, classes): decisions}, delta).epsilon

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
    if labels.epsilon is not None:
        epsilon = float(labels.epsilon)
        reserve = compose({RandomizedResponseEvent(epsilon, classes): per_hour}, delta).epsilon
        if budget is not None and reserve >= budget:
            raise ConfigError(
                "labels.epsilon",
                labels.epsilon,
                f"{per_hour} decisions per hour of gaze at ε {epsilon:g} cost {reserve:.4g}, "
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
        epsilon = decision_epsilon(share, per_hour, classes, delta)
    if not MIN_EPSILON <= epsilon <= MAX_EPSILON:
        raise ConfigError(
            "labels.epsilon",
            epsilon,
            f"ε per decision must lie in [{MIN_EPSILON:.3g}, {MAX_EPSILON:g}]"
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
        self._events = {event_key(plan.event): 1}
        self._eps_map = {"label": plan.epsilon}
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
        """Decide, privatize, charge and enqueue one block's label; ``None`` when a cap withheld
        it or an error dropped it (both recorded in the ledger and :attr:`stats`). Blocks on the
        ledger's durable commit.

        Args:
            block: (n, F_model) clean feature vectors of one decision block.
            times: (n,) their times, s (LSL clock).
            offset: Unix time minus ``times``, s.
        """
        return self._decide(block, times, offset)

    def _decide(self, block: FloatArray, times: FloatArray, offset: float) -> ReleasedLabel | None:
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
