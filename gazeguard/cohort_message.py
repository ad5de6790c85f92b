"""The cohort-aggregate payload (``gazeguard.cohort/1``) and its topic.

One :class:`CohortMessage` per time bucket on ``{prefix}/cohort/{cohort}/aggregates`` (QoS 1,
not retained), published by a fleet worker over the sessions it served in that bucket
(:mod:`gazeguard.cohort`): the noisy number of contributing sessions, the noisy sum and the
derived mean of each profile feature, the noisy label histogram and its shares, the Gaussian
noise's standard deviation, and the user-level ε each contributing person was charged. Every
figure is a post-processing of one Gaussian-mechanism release; nothing per session can be
expressed. The JSON Schema ships as ``gazeguard/data/cohort.schema.json``
(``python -m gazeguard.cohort_message --write-schema``).

Delivery is at least once; consumers deduplicate by ``(cohort, worker, bucket)``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, Self

from pydantic import Field, model_validator

from gazeguard import message
from gazeguard.message import FiniteFloat, Name, NoiseSource, Positive, _check_prefix, _Model

COHORT_SCHEMA: Final = "gazeguard.cohort/1"
SCHEMA_FILE: Final = "cohort.schema.json"

NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class CohortFeature(_Model):
    """One profile feature's aggregate.

    Attributes:
        name: the feature (registry name).
        unit: its unit.
        noisy_sum: noisy Σ over sessions of the session's clipped, normalised bucket mean
            scaled by ``1/√F`` (contribution units; what the Gaussian noise was added to).
        mean: the cohort mean in feature units: ``lo + (hi − lo)·√F·noisy_sum / count``, clipped
            to the public bounds (post-processing).
        sd: the standard deviation of ``mean`` from the noise alone, feature units
            (``(hi − lo)·√F·σ / count``), for the consumer's error bars.
    """

    name: Name
    unit: str
    noisy_sum: FiniteFloat
    mean: FiniteFloat
    sd: NonNegative


class CohortMessage(_Model):
    """The aggregate of one time bucket over the sessions of one worker (``gazeguard.cohort/1``).

    Attributes:
        cohort: the cohort name (a topic level).
        worker: the fleet worker that aggregated.
        bucket: ``⌊t/bucket_s⌋`` of the bucket's gaze time (Unix s).
        bucket_start, bucket_end: the bucket, Unix s.
        noisy_count: the noisy number of contributing sessions (sum of 1s + Gaussian noise; for a
            plan without features, the noisy histogram's total).
        count: ``max(1, round(noisy_count))``, the denominator of every mean (post-processing).
        features: per profile feature, see :class:`CohortFeature`.
        classes: the label model's classes (empty without a label model).
        noisy_histogram: noisy Σ over sessions of the session's mean class probability.
        shares: the histogram's non-negative part, normalised (sums to 1, or all 0).
        sigma: the Gaussian noise's standard deviation per coordinate, contribution units.
        sensitivity_l2: a person's contribution's L2 norm bound (``√blocks``).
        epsilon_per_hour: the user-level ε at ``delta`` that an hour of these buckets costs
            each contributing person (the cohort's share of the budget).
        delta: the δ of that figure.
        profile: the release profile whose features are aggregated.
        model: the label model (name) or ``None``.
        noise: ``os-csprng`` in production; ``INSECURE-seeded`` for reproducible tests.
    """

    schema_: Literal["gazeguard.cohort/1"] = Field(COHORT_SCHEMA, alias="schema")
    cohort: Name
    worker: Name
    bucket: int = Field(ge=0)
    bucket_start: FiniteFloat
    bucket_end: FiniteFloat
    noisy_count: FiniteFloat
    count: int = Field(ge=1)
    features: list[CohortFeature]
    classes: list[Name] = Field(max_length=256)
    noisy_histogram: list[FiniteFloat]
    shares: list[NonNegative]
    sigma: Positive
    sensitivity_l2: Positive
    epsilon_per_hour: Positive
    delta: Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
    mechanism: Literal["gaussian"] = "gaussian"
    profile: Name
    model: Name | None
    noise: NoiseSource

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.bucket_end > self.bucket_start:
            msg = f"bucket_end={self.bucket_end} must be after bucket_start={self.bucket_start}"
            raise ValueError(msg)
        if len(self.noisy_histogram) != len(self.classes) or len(self.shares) != len(self.classes):
            msg = "noisy_histogram and shares need one value per class"
            raise ValueError(msg)
        if not self.features and not self.classes:
            msg = "an aggregate carries features, classes or both"
            raise ValueError(msg)
        return self

    def to_payload(self) -> bytes:
        """UTF-8 JSON bytes, as published."""
        return self.model_dump_json(by_alias=True).encode()


def cohort_topic(prefix: str, cohort: str) -> str:
    """``{prefix}/cohort/{cohort}/aggregates``."""
    _check_prefix(prefix)
    if not cohort or any(c in cohort for c in "/+#"):
        msg = f"cohort name {cohort!r} must be one topic level (no '/', '+' or '#')"
        raise ValueError(msg)
    return f"{prefix}/cohort/{cohort}/aggregates"


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of :class:`CohortMessage`, as shipped."""
    return message.json_schema(CohortMessage)


def shipped_schema() -> dict[str, Any]:
    """``gazeguard/data/cohort.schema.json`` as shipped."""
    return message.shipped_schema(SCHEMA_FILE)


if __name__ == "__main__":  # ``python -m gazeguard.cohort_message --write-schema [DIR]``
    from gazeguard.cli.schemas import cohort_main

    raise SystemExit(cohort_main())
