"""The label plan: ε per label for the labels' share, from the release plan's counts.

Budget (:func:`plan_labels`, called by the release plan, :mod:`gazeguard.plan`). The ledger
caps user-level ε at δ over every hour of gaze, all release kinds together. Labels get their
share ``(R, δ_L)`` of it (``R = labels.budget_share × B``), and ``D`` — the decisions an hour
of gaze can change, counted by the plan — randomized-response releases must compose to at most
that: ``ε`` per decision is the largest for which the accountant's composition of ``D``
decisions is ``≤ R`` at ``δ_L``; or ``ε = labels.epsilon``, whose ``D``-fold composition must
then fit below ``B``. One raw gaze sample reaches the plan's ``per_sample`` decisions. Nothing
in the plan reads the user's data.

That count holds because a decision reads its own block alone: a model that keeps per-session
state (``standardizer.session``) would carry one sample into every later decision, so it is
refused (:func:`gazeguard.signal.labels.check_stateless`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from gazeguard.config import FeatureSettings, LabelSettings
from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import Event, RandomizedResponseEvent, compose
from gazeguard.signal.labels import (
    MAX_EPSILON,
    MIN_EPSILON,
    LabelModel,
    check_stateless,
    load_model,
    released_accuracy,
    survival_probability,
)

__all__ = [
    "LabelPlan",
    "clean_accuracy_of",
    "decision_epsilon",
    "label_events",
    "load_fitting_model",
    "load_label_model",
    "plan_labels",
    "steps_per_decision",
]


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
        release: ``"clock"``, one label per block (the change trigger was retired).
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
        """What one released label is charged: its randomized response."""
        return label_events(self.epsilon, self.classes)

    @property
    def cost(self) -> dict[str, Event]:
        """What one released label costs, for the ledger: its randomized response, as item
        ``label``."""
        return {"label": self.event}

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
        return self.epsilon_of(self.per_window)

    @property
    def sample_epsilon(self) -> float:
        """ε at δ of the labels one raw gaze sample can change."""
        return self.epsilon_of(self.reached)

    def epsilon_of(self, labels: int) -> float:
        """ε at δ of ``labels`` released labels: the accountant's composition of their
        randomized responses (0 for none)."""
        if labels <= 0:
            return 0.0
        return compose({e: c * labels for e, c in self.events.items()}, self.delta).epsilon

    def text(self) -> str:
        """The arithmetic printed at startup (several lines)."""
        c, p, eps = self.classes, self.survival, self.epsilon
        names = ", ".join(self.model.classes)
        how = (
            f"one label per {self.decision_s:g} s of gaze ({self.steps} feature vectors), held "
            "until the next"
        )
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


def label_events(epsilon: float, classes: int) -> dict[Event, int]:
    """The accounting events of one released label: its randomized response at ``epsilon``."""
    return {RandomizedResponseEvent(epsilon, classes): 1}


def decision_epsilon(share: float, decisions: int, classes: int, delta: float) -> float:
    """The largest ε per label (to 1e-6 relative) whose ``decisions``-fold randomized response
    composes to at most ``share`` at ``delta`` (the accountant's PLD; never below the pure split
    ``share/decisions``), capped at :data:`~gazeguard.signal.labels.MAX_EPSILON`."""

    def cost(eps: float) -> float:
        return compose({RandomizedResponseEvent(eps, classes): decisions}, delta).epsilon

    lo, hi = share / decisions, min(share, MAX_EPSILON)
    if cost(hi) <= share:
        return hi
    while hi - lo > 1e-6 * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(mid) <= share else (lo, mid)
    return lo


def load_fitting_model(
    field: str, path: str, features: FeatureSettings, mismatch: Callable[[LabelModel], str]
) -> LabelModel:
    """The label model at ``path`` (the setting ``field``), checked against the feature window
    and step (s).

    Raises:
        ConfigError: the model cannot be loaded, reads unknown features, or was trained with
            another window or step (then ``mismatch(model)`` is the reason).
    """
    model = load_model(path)
    if not (
        math.isclose(model.spec.window_s, features.window_s)
        and math.isclose(model.spec.step_s, features.step_s)
    ):
        raise ConfigError(field, path, mismatch(model))
    return model


def load_label_model(labels: LabelSettings, features: FeatureSettings) -> LabelModel:
    """The label model the settings name, checked against the sidecar's feature window/step.

    Raises:
        ConfigError: the model cannot be loaded, reads unknown features, or was trained with
            another window or step.
    """

    def mismatch(model: LabelModel) -> str:
        return (
            f"model {model.name!r} ({model.source}) was trained on features of window "
            f"{model.spec.window_s:g} s and step {model.spec.step_s:g} s, but the sidecar computes "
            f"features.window_s = {features.window_s:g} s, step_s = {features.step_s:g} s: its "
            "features would not match; train a model with these settings (`gazeguard profile "
            "train-model --window W --step S`) or set the feature window and step it expects"
        )

    return load_fitting_model("labels.model", labels.model, features, mismatch)


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
            leaves nothing for the rest; ε out of range; a model with per-session state.
    """
    check_stateless(model, "labels.model")
    steps = _steps_per_decision(labels.decision_s, features.step_s)
    classes = len(model.classes)
    if labels.epsilon is not None:
        epsilon = float(labels.epsilon)
        reserve = compose({RandomizedResponseEvent(epsilon, classes): per_hour}, delta).epsilon
        if budget is not None and reserve >= budget:
            raise ConfigError(
                "labels.epsilon",
                labels.epsilon,
                f"{per_hour} labels per hour of gaze at ε {epsilon:g} cost {reserve:.4g}, "
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
    )
