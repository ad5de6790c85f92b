"""The private-label payload (``gazeguard.label/1``; its kind: :data:`gazeguard.wire.kinds.LABELS`).

One :class:`LabelMessage` per decision on ``{prefix}/{device}/{session}/labels`` (QoS 1, not
retained): the label released by randomized response (:mod:`gazeguard.signal.labels`), the classes
it was drawn from, its ε, the probability that it is the true one, the decision window, and the
model and profile that produced it. Nothing else about the decision — not the clean label, not the
class probabilities, not the features — can be expressed. Every float must be finite and the
survival probability must be the one randomized response has at this ε over these classes, so an
inconsistent message cannot be built. The JSON Schema ships as ``gazeguard/data/label.schema.json``
(``gazeguard schemas --write``).

Delivery is at least once; consumers deduplicate by ``(session, decision_index)``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Final, Literal, Self

from pydantic import Field, model_validator

from gazeguard.signal.labels import released_accuracy
from gazeguard.wire.message import (
    FiniteFloat,
    Name,
    NoiseSource,
    Positive,
    WireModel,
)

if TYPE_CHECKING:
    from gazeguard.signal.labels import LabelDecision

LABEL_SCHEMA: Final = "gazeguard.label/1"
#: Largest difference tolerated between the stated survival probability and
#: ``e^ε/(e^ε + C − 1)``: the exact sampler's realized value is within 2^-62 of it.
SURVIVAL_TOLERANCE: Final = 1e-9


class LabelModelRef(WireModel):
    """The model that made the clean decision (its file's ``name`` and ``version``)."""

    name: Name
    version: Name


class LabelMessage(WireModel):
    """One privatized label of one session (``gazeguard.label/1``).

    Attributes:
        session, device: as in the topic.
        decision_index: 0-based decision number within the session; with ``session`` the dedup key.
        window_start, window_end: the decision window, s (LSL clock): the label summarises the
            feature vectors whose windows end in ``(window_start, window_end]``.
        label: the released label, one of ``classes`` (randomized response: it is the true
            class with probability ``survival_probability``).
        classes: the C labels randomized response draws from (C ≥ 2).
        epsilon: ε charged for this decision (pure ε-DP for the decision window's features).
        mechanism: ``randomized_response``.
        survival_probability: ``e^ε/(e^ε + C − 1)``, the probability that ``label`` is the
            classifier's clean decision; every other label had ``(1 − p)/(C − 1)`` (1.0 when
            it rounds to 1 as a float: ε ≳ 37).
        model: the label model's name and version.
        profile: the release profile whose features the model reads.
        noise: ``os-csprng`` in production; ``INSECURE-seeded`` for reproducible tests.
        release: ``clock``: one label per decision window, held from ``unix_end`` until the
            next.
        clean_accuracy: the model's clean accuracy per decision as its file records it
            (leave one person out; public, the same for every label of the model), or ``None``:
            with ``survival_probability`` it gives :attr:`right_probability`.
        unix_end: Unix time of the decision window's end, s: the label holds from then until
            the next one (``None``: not stated).
    """

    schema_: Literal["gazeguard.label/1"] = Field(LABEL_SCHEMA, alias="schema")
    session: Name
    device: Name
    decision_index: int = Field(ge=0)
    window_start: FiniteFloat
    window_end: FiniteFloat
    label: Name
    classes: list[Name] = Field(min_length=2, max_length=256)
    epsilon: Positive
    mechanism: Literal["randomized_response"] = "randomized_response"
    survival_probability: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
    model: LabelModelRef
    profile: Name
    noise: NoiseSource
    release: Literal["clock"] = "clock"
    clean_accuracy: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    unix_end: FiniteFloat | None = None

    @property
    def right_probability(self) -> float | None:
        """Probability that the label is the person's true activity, as the plan states it:
        ``p·acc + (1 − p)(1 − acc)/(C − 1)`` (``p`` the survival probability, ``acc`` the
        model's clean accuracy: a right decision survives, a wrong one becomes right only when
        randomized response picks the true class); ``None`` without ``clean_accuracy``."""
        if self.clean_accuracy is None:
            return None
        return released_accuracy(self.clean_accuracy, self.survival_probability, len(self.classes))

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.window_end > self.window_start:
            msg = f"window_end={self.window_end} must be after window_start={self.window_start}"
            raise ValueError(msg)
        if len(set(self.classes)) != len(self.classes):
            msg = f"classes must be unique, got {self.classes}"
            raise ValueError(msg)
        if self.label not in self.classes:
            msg = f"label {self.label!r} is not one of the classes {self.classes}"
            raise ValueError(msg)
        c = len(self.classes)
        want = 1.0 / (1.0 + (c - 1) * math.exp(-self.epsilon))
        if abs(self.survival_probability - want) > SURVIVAL_TOLERANCE:
            msg = (
                f"survival_probability={self.survival_probability} but randomized response at "
                f"ε={self.epsilon} over {c} classes keeps the true label with {want:.12g}"
            )
            raise ValueError(msg)
        return self

    @classmethod
    def build(
        cls,
        decision: LabelDecision,
        *,
        session: str,
        device: str,
        decision_index: int,
        window_start: float,
        window_end: float,
        model_name: str,
        model_version: str,
        profile: str,
        clean_accuracy: float | None = None,
        unix_end: float | None = None,
    ) -> LabelMessage:
        """The message for one released :class:`~gazeguard.signal.labels.LabelDecision`.

        Raises:
            pydantic.ValidationError: an inconsistent or non-finite field.
        """
        return cls(
            session=session,
            device=device,
            decision_index=decision_index,
            window_start=window_start,
            window_end=window_end,
            label=decision.label,
            classes=list(decision.classes),
            epsilon=decision.epsilon,
            mechanism=decision.mechanism,
            survival_probability=decision.survival,
            model=LabelModelRef(name=model_name, version=model_version),
            profile=profile,
            clean_accuracy=clean_accuracy,
            unix_end=unix_end,
            noise=decision.noise,
        )
