"""The cohort-aggregate payload (``gazeguard.cohort/1``), the attention payload
(``gazeguard.attention/1``) and their topics.

One :class:`CohortMessage` per time bucket on ``{prefix}/cohort/{cohort}/aggregates`` (QoS 1,
not retained), published by a fleet worker over the sessions it served in that bucket
(:mod:`gazeguard.runtime.cohort`): the noisy number of contributing sessions, the noisy sum and the
derived mean of each profile feature, the noisy label histogram and its shares, the Gaussian
noise's standard deviation, and the user-level ε each contributing person was charged. Every
figure is a post-processing of one Gaussian-mechanism release; nothing per session can be
expressed. The JSON Schema ships as ``gazeguard/data/cohort.schema.json``
(``gazeguard schemas --write``).

When the cohort releases attention (``cohort.release`` with ``attention`` or ``aois``), one
:class:`AttentionMessage` per bucket goes to ``{prefix}/cohort/{cohort}/attention``: the noisy
dwell grid (``grid``, ``rows`` × ``cols``), its post-processed heatmap, the AOI dwell shares
and the same noise and budget figures (:mod:`gazeguard.signal.attention`); its JSON Schema ships as
``gazeguard/data/attention.schema.json`` (written by the same command).

When the cohort releases the mode (``cohort.release`` with ``mode``), one :class:`ModeMessage`
(``gazeguard.mode/1``) per bucket goes to ``{prefix}/cohort/{cohort}/mode``: the group's
dominant activity, chosen by permute-and-flip among the label model's classes, with the ε of
the choice and the lead (in sessions) at which it names the true mode with probability 0.9 —
no score, no count: only the choice is released. Its JSON Schema ships as
``gazeguard/data/mode.schema.json``.

Each session charged for a bucket but not carrying its message gets a :class:`CohortReceipt`
(``gazeguard.cohort-receipt/1``) on ``{prefix}/{device}/{session}/cohort``: the ε it paid,
nothing else; its JSON Schema ships as ``gazeguard/data/cohort-receipt.schema.json``.

Delivery is at least once; consumers deduplicate by ``(cohort, worker, bucket)`` (receipts by
``(session, bucket, release)``).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, Self

from pydantic import Field, model_validator

from gazeguard.wire.message import FiniteFloat, Name, NoiseSource, Positive, WireModel

COHORT_SCHEMA: Final = "gazeguard.cohort/1"
ATTENTION_SCHEMA: Final = "gazeguard.attention/1"
MODE_SCHEMA: Final = "gazeguard.mode/1"
RECEIPT_SCHEMA: Final = "gazeguard.cohort-receipt/1"

NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class CohortFeature(WireModel):
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


class BucketMessage(WireModel):
    """What a cohort's message of one bucket opens with: ``cohort``, ``worker``, ``bucket``,
    ``bucket_start`` and ``bucket_end`` (as :class:`CohortMessage` describes them), the bucket
    ending after it starts; each subclass fixes ``schema``."""

    schema_: str = Field(alias="schema")
    cohort: Name
    worker: Name
    bucket: int = Field(ge=0)
    bucket_start: FiniteFloat
    bucket_end: FiniteFloat

    @model_validator(mode="after")
    def _bucket_ordered(self) -> Self:
        if not self.bucket_end > self.bucket_start:
            msg = f"bucket_end={self.bucket_end} must be after bucket_start={self.bucket_start}"
            raise ValueError(msg)
        return self


class CohortMessage(BucketMessage):
    """The aggregate of one time bucket over the sessions of one worker (``gazeguard.cohort/1``).

    Attributes:
        cohort: the cohort name (a topic level).
        worker: the fleet worker that aggregated.
        bucket: ``⌊t/bucket_s⌋`` of the bucket's gaze time (Unix s).
        bucket_start, bucket_end: the bucket, Unix s.
        noisy_count: the noisy number of sessions with feature vectors in the bucket (sum of 1s
            + Gaussian noise; for a plan without features, the noisy histogram's total). Every
            session open in the bucket is charged; one without vectors adds zero.
        count: ``max(1, round(noisy_count))``, the denominator of every mean (post-processing).
        features: per profile feature, see :class:`CohortFeature`.
        classes: the label model's classes (empty without a label model).
        noisy_histogram: noisy Σ over sessions of the session's mean class probability.
        shares: the histogram's non-negative part, normalised (sums to 1, or all 0).
        sigma: the Gaussian noise's standard deviation per coordinate, contribution units.
        sensitivity_l2: a person's contribution to this message's sum, L2 norm bound
            (``√blocks`` of the means and shares).
        epsilon_per_hour: the user-level ε at ``delta`` that an hour of cohort buckets costs
            each person whose session is open (the cohort's share of the budget, every part of
            the cohort release: with attention, its heatmap too).
        delta: the δ of that figure.
        profile: the release profile whose features are aggregated.
        model: the label model (name) or ``None``.
        noise: ``os-csprng`` in production; ``INSECURE-seeded`` for reproducible tests.
    """

    schema_: Literal["gazeguard.cohort/1"] = Field(COHORT_SCHEMA, alias="schema")
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
        if len(self.noisy_histogram) != len(self.classes) or len(self.shares) != len(self.classes):
            msg = "noisy_histogram and shares need one value per class"
            raise ValueError(msg)
        if not self.features and not self.classes:
            msg = "an aggregate carries features, classes or both"
            raise ValueError(msg)
        return self


class AoiShare(WireModel):
    """One area of interest's dwell (``elsewhere``: valid gaze in no AOI).

    Attributes:
        name: the AOI's name from the AOI file, or ``elsewhere``.
        noisy_dwell: noisy Σ over sessions of the session's share of valid samples in it.
        share: the noisy dwells' non-negative part, normalised (post-processing).
    """

    name: Name
    noisy_dwell: FiniteFloat
    share: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class AttentionMessage(BucketMessage):
    """A bucket's dwell-time distribution over the sessions of one worker
    (``gazeguard.attention/1``).

    Attributes:
        cohort, worker, bucket, bucket_start, bucket_end: as in :class:`CohortMessage`.
        rows, cols: the heatmap grid's shape (``None`` when only AOIs are released).
        fov_deg: the field the grid covers, ``[width, height]``, degrees of gaze angle, centred
            on straight ahead; row 0 is the top row, column 0 the left one.
        grid: ``rows × cols`` noisy sums over sessions of each session's share of its valid
            in-field samples per cell (contribution units; what the noise was added to).
        heatmap: the cohort's share of dwell per cell (post-processing): the noisy grid's
            non-negative part, normalised to sum to 1 (all 0 if no cell is positive).
        noisy_count: the noisy grid's total, the noisy number of sessions whose gaze fell on the
            field (with AOIs only: the AOI dwells' total, sessions with valid gaze).
        aois: per AOI in file order, then ``elsewhere``: its noisy dwell and share (``None``
            without AOIs).
        aoi_file: the AOI file the names come from (``None`` without AOIs).
        dwell: how dwell is measured: valid samples, time-weighted at the declared rate.
        sigma: the Gaussian noise's standard deviation per coordinate, contribution units.
        sensitivity_l2: a person's contribution to this message's sums, L2 norm bound
            (``√blocks``: 1 for the grid or the AOIs, √2 for both).
        epsilon_per_hour: the user-level ε at ``delta`` that an hour of cohort buckets costs
            each contributing person (every part of the cohort release).
        delta: the δ of that figure.
        noise: ``os-csprng`` in production; ``INSECURE-seeded`` for reproducible tests.
    """

    schema_: Literal["gazeguard.attention/1"] = Field(ATTENTION_SCHEMA, alias="schema")
    rows: int | None = Field(ge=1)
    cols: int | None = Field(ge=1)
    fov_deg: list[Positive] | None = Field(min_length=2, max_length=2)
    grid: list[list[FiniteFloat]] | None
    heatmap: list[list[NonNegative]] | None
    noisy_count: FiniteFloat
    aois: list[AoiShare] | None = Field(max_length=65)
    aoi_file: str | None
    dwell: Literal["valid-samples"] = "valid-samples"
    sigma: Positive
    sensitivity_l2: Positive
    epsilon_per_hour: Positive
    delta: Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
    mechanism: Literal["gaussian"] = "gaussian"
    noise: NoiseSource

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        shaped = (self.rows, self.cols, self.fov_deg, self.grid, self.heatmap)
        if any(v is None for v in shaped) and any(v is not None for v in shaped):
            msg = "rows, cols, fov_deg, grid and heatmap come together (or none of them)"
            raise ValueError(msg)
        for name, g in (("grid", self.grid), ("heatmap", self.heatmap)):
            if g is not None and (len(g) != self.rows or any(len(r) != self.cols for r in g)):
                msg = f"{name} must be rows × cols = {self.rows} × {self.cols}"
                raise ValueError(msg)
        if self.grid is None and self.aois is None:
            msg = "an attention message carries a grid, AOI shares or both"
            raise ValueError(msg)
        if (self.aois is None) != (self.aoi_file is None):
            msg = "aois and aoi_file come together"
            raise ValueError(msg)
        return self


class ModeMessage(BucketMessage):
    """The group's dominant activity in one bucket over the sessions of one worker
    (``gazeguard.mode/1``, on ``{prefix}/cohort/{cohort}/mode``).

    Each session open in the bucket contributes its label model's class probabilities averaged
    over its windows in the bucket (a distribution: it moves each class score by at most 1; a
    session without windows contributes zero); the scores are the sums, rounded to multiples of
    2^-12, and permute-and-flip (McKenna & Sheldon 2020) chooses one class, ε-DP per bucket for
    adding or removing one session (:mod:`gazeguard.privacy.mechanisms.selection`).

    Attributes:
        cohort, worker, bucket, bucket_start, bucket_end: as in :class:`CohortMessage`.
        classes: the label model's classes (the candidates), in the model's order.
        mode: the chosen class (one of ``classes``): the only released value.
        mode_index: its index in ``classes``.
        epsilon: ε of the choice (per bucket, per person; exact, a multiple of 2^-20).
        lead_for_90: how many sessions' worth of score the true mode must lead every other
            class by for it to be chosen with probability ≥ 0.9 (a public function of ε and the
            number of classes: what makes a mode readable).
        epsilon_per_hour: the user-level ε at ``delta`` that an hour of cohort buckets costs
            each person whose session is open (every part of the cohort release).
        delta: the δ of that figure.
        mechanism: ``permute-and-flip``.
        profile: the release profile of the worker.
        model: the label model (name).
        noise: ``os-csprng`` in production; ``INSECURE-seeded`` for reproducible tests.
    """

    schema_: Literal["gazeguard.mode/1"] = Field(MODE_SCHEMA, alias="schema")
    classes: list[Name] = Field(min_length=2, max_length=256)
    mode: Name
    mode_index: int = Field(ge=0)
    epsilon: Positive
    lead_for_90: Positive
    epsilon_per_hour: Positive
    delta: Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
    mechanism: Literal["permute-and-flip"] = "permute-and-flip"
    profile: Name
    model: Name
    noise: NoiseSource

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.mode_index >= len(self.classes) or self.classes[self.mode_index] != self.mode:
            msg = "mode must be classes[mode_index]"
            raise ValueError(msg)
        return self


class CohortReceipt(WireModel):
    """What a session's own topic learns of a cohort bucket it was charged for
    (``gazeguard.cohort-receipt/1``, on ``{prefix}/{device}/{session}/cohort``): that it paid,
    and how much. Every open session of the bucket gets the same receipt, whether or not its
    gaze was valid in the bucket (one of them carries the aggregate instead): every field is
    public (:mod:`gazeguard.wire.egress`).

    Attributes:
        session: the session charged (the ledger account).
        cohort, worker, bucket: as in :class:`CohortMessage`.
        release: the part of the cohort release charged: ``aggregates`` (means and shares),
            ``attention`` or ``mode``.
        mechanism: ``gaussian``, or ``permute-and-flip`` for the mode.
        noise_multiplier: the Gaussian noise's ratio ``σ/Δ2`` that the ledger composes; for
            the mode ``1/ε`` (permute-and-flip is report-noisy-max with exponential noise of
            scale ``Δ/ε``).
        epsilon_per_hour: the user-level ε at ``delta`` that an hour of cohort buckets costs
            each session (every part of the cohort release).
        delta: the δ of that figure.
    """

    schema_: Literal["gazeguard.cohort-receipt/1"] = Field(RECEIPT_SCHEMA, alias="schema")
    session: Name
    cohort: Name
    worker: Name
    bucket: int = Field(ge=0)
    release: Literal["aggregates", "attention", "mode"]
    mechanism: Literal["gaussian", "permute-and-flip"] = "gaussian"
    noise_multiplier: Positive
    epsilon_per_hour: Positive
    delta: Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
