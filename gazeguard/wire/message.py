"""What goes on the wire: versioned payload models and the MQTT topics they travel on.

Two messages leave gazeguard, both JSON described by pydantic models with an exported JSON Schema
(``gazeguard/data/*.schema.json``; regenerate with ``gazeguard schemas
--write``,
:mod:`gazeguard.cli.schemas`):

- :class:`ChunkMessage` (``"schema": "gazeguard.chunk/2"``), one per privatized chunk, on
  ``{prefix}/{device}/{session}/chunks`` (QoS 1, not retained). It carries the privatized values
  ``[F][n]``, the step timestamps, feature names and units, the mechanism parameters that produced
  them and the ledger state right after this chunk was charged.
- :class:`StatusMessage` (``"schema": "gazeguard.status/2"``), retained on
  ``{prefix}/{device}/{session}/status``: what the session is doing, its budget, how many chunks
  were published, withheld and dropped, and why. Only public figures: nothing counted from the
  gaze samples (:mod:`gazeguard.wire.egress` classifies every published field).

Only privatized values can be expressed: a chunk message must name its mechanism, ε, λ and Δ2 per
feature, and its ledger state must agree with its ε. Every float must be finite; NaN and ±inf are
refused at construction, so nothing half-baked can be serialised.

Chunks are delivered at least once (MQTT QoS 1): a chunk whose PUBACK was lost is sent again
after a reconnect or restart. Consumers deduplicate by ``(session, chunk_index)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Protocol, Self

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidatorFunctionWrapHandler,
    model_validator,
)

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.registry import (
    NOISE,
    ONLINE_MECHANISMS,
    MechanismKind,
    mechanism_kind,
)

CHUNK_SCHEMA: Final = "gazeguard.chunk/2"
STATUS_SCHEMA: Final = "gazeguard.status/2"

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=200)]

SessionState = Literal["starting", "running", "budget_exhausted", "stream_lost", "stopped"]
NoiseSource = Literal["os-csprng", "INSECURE-seeded"]

# Tolerances when comparing ε figures. The ledger keeps ε in integer micro-ε and rounds each
# feature's ε up, so its figures may exceed the exact float sums by up to 1e-6 per feature.
_EPS_RTOL = 1e-9
_EPS_UNIT = 1e-6


class WireModel(BaseModel):
    """The base of every wire message: no extra fields, frozen, every field in the schema."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        # What we emit always has every field: the exported schema marks them all required.
        json_schema_serialization_defaults_required=True,
    )

    def to_payload(self) -> bytes:
        """UTF-8 JSON bytes, as published."""
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_payload(cls, payload: bytes | str) -> Self:
        """Parse and validate a received payload."""
        return cls.model_validate_json(payload)


class MechanismParams(WireModel):
    """How a chunk was privatized (docs/design.md "Mechanisms"); lists have one entry per feature.

    Attributes:
        name: ``lpa`` (noise on every value), ``cfpa`` (FPA per chunk) or ``dcfpa`` (FPA on the
            difference chunk, then cumulative sum).
        noise: the noise family: ``laplace`` (discrete Laplace, pure ε-DP, pays the L1
            sensitivity) or ``gaussian`` (discrete Gaussian, (ε, δ)-DP, pays the L2 sensitivity).
        transform: ``dft`` or ``dct`` for the Fourier mechanisms; ``None`` for ``lpa``.
        n: steps per chunk, a power of two.
        k: kept frequencies (``None`` for ``lpa``), 1 ≤ k ≤ n/2 (dft) or n (dct).
        m: noised real coefficients per feature: ``2k − 1`` for ``dft``, ``k`` for ``dct``;
            ``n`` for ``lpa``.
        epsilon: pure ε per feature for this chunk, (F,); ``None`` entries for Gaussian noise,
            which has no pure guarantee (its (ε, δ) is in the ledger snapshot).
        noise_scale: per feature, the noise actually added to each coefficient in the
            feature's unit: the Laplace scale λ, or the Gaussian standard deviation σ, (F,).
        sensitivity: per feature, the sensitivity the noise pays (L1 for Laplace, L2 for
            Gaussian) of the noised coefficients, from the public bounds, (F,).
        noise_multiplier: ``noise_scale / effective sensitivity`` per feature (what the
            accountant composes), (F,).
        value_noise_sd: per feature, the standard deviation of the noise on each published
            value, in the feature's unit (root mean square over the chunk's n values, before
            clipping to the bounds), from public settings only, (F,): THE noise figure a
            consumer reads (``noise_scale`` is per coefficient, not per value).
        value_noise_range: ``value_noise_sd / (upper − lower)`` per feature: the noise as a
            multiple of the feature's public range, dimensionless, (F,).
        lower: each feature's public lower bound, in its unit (F,); values are clipped to it.
        upper: each feature's public upper bound, in its unit (F,); ``upper > lower``.
        randomness: ``os-csprng`` in production; ``INSECURE-seeded`` when a reproducible seed
            was set.
    """

    name: str = Field(json_schema_extra={"enum": list(ONLINE_MECHANISMS)})
    noise: str = Field("laplace", json_schema_extra={"enum": list(NOISE)})
    transform: Literal["dft", "dct"] | None
    n: int = Field(ge=2)
    k: int | None = Field(ge=1)
    m: int = Field(ge=1)
    epsilon: list[Positive | None] = Field(min_length=1)
    noise_scale: list[Positive] = Field(min_length=1)
    sensitivity: list[Positive] = Field(min_length=1)
    noise_multiplier: list[Positive] = Field(min_length=1)
    value_noise_sd: list[Positive]
    value_noise_range: list[Positive]
    lower: list[FiniteFloat]
    upper: list[FiniteFloat]
    randomness: NoiseSource

    @model_validator(mode="wrap")
    @classmethod
    def _checked_once(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Self:
        """A MechanismParams object is checked when it is made, not again each time a message
        quotes it (frozen, so it cannot have changed; a pipeline quotes one per chunk). Dicts and
        JSON, e.g. a received message's, get every check. gazeguard never makes one with
        ``model_construct`` or ``model_copy(update=...)``, which would skip them."""
        if type(data) is cls:
            return data
        params: Self = handler(data)
        return params._consistent()

    def _consistent(self) -> Self:
        if self.n & (self.n - 1):
            msg = f"n must be a power of two, got {self.n}"
            raise ValueError(msg)
        try:
            kind = mechanism_kind(self.name, online=True, field="mechanism.name")
            if not kind.transformed:
                if self.transform is not None or self.k is not None or self.m != self.n:
                    msg = f"{self.name} has no transform and no k, and m must equal n"
                    raise ValueError(msg)
            else:
                if self.transform is None or self.k is None:
                    msg = f"{self.name} needs a transform and k"
                    raise ValueError(msg)
                top = kind.max_k(self.transform, self.n)
                if self.k > top:
                    limit = "n/2" if self.transform == "dft" else "n"
                    msg = f"k={self.k} exceeds {limit}={top} ({self.transform})"
                    raise ValueError(msg)
                want = kind.kept(self.transform, self.k, self.n)
                if self.m != want:
                    msg = f"m={self.m} but {self.transform} with k={self.k} keeps m={want}"
                    raise ValueError(msg)
        except ConfigError as exc:
            raise ValueError(f"{exc.field}={exc.value!r}: {exc.reason}") from exc
        lengths = {
            len(x)
            for x in (self.epsilon, self.noise_scale, self.sensitivity, self.noise_multiplier)
        }
        if len(lengths) != 1:
            msg = (
                "epsilon, noise_scale, sensitivity and noise_multiplier must have one entry per "
                f"feature, got {len(self.epsilon)}, {len(self.noise_scale)}, "
                f"{len(self.sensitivity)}, {len(self.noise_multiplier)}"
            )
            raise ValueError(msg)
        self._check_value_noise(len(self.epsilon))
        if self.noise not in NOISE:
            msg = f"noise {self.noise!r} is not one of {', '.join(NOISE)}"
            raise ValueError(msg)
        pure = self.noise == "laplace"
        if any((e is None) == pure for e in self.epsilon):
            msg = (
                "epsilon must be given for every feature with laplace noise, and null with "
                "gaussian noise (no pure guarantee)"
            )
            raise ValueError(msg)
        return self

    def _check_value_noise(self, f: int) -> None:
        """The per-value figures: F entries each, ``lower < upper``, and
        ``value_noise_range = value_noise_sd / (upper − lower)``."""
        per_value = {
            "value_noise_sd": self.value_noise_sd,
            "value_noise_range": self.value_noise_range,
            "lower": self.lower,
            "upper": self.upper,
        }
        for name, x in per_value.items():
            if len(x) != f:
                msg = f"{name} must have one entry per feature ({f}), got {len(x)}"
                raise ValueError(msg)
        if any(hi <= lo for lo, hi in zip(self.lower, self.upper, strict=True)):
            msg = "every upper bound must exceed its lower bound"
            raise ValueError(msg)
        for sd, frac, lo, hi in zip(
            self.value_noise_sd, self.value_noise_range, self.lower, self.upper, strict=True
        ):
            if not math.isclose(frac, sd / (hi - lo), rel_tol=1e-9):
                msg = f"value_noise_range={frac} but value_noise_sd / (upper − lower) = "
                msg += f"{sd / (hi - lo)}"
                raise ValueError(msg)

    @classmethod
    def from_mechanism(cls, mechanism: MechanismLike) -> MechanismParams:
        """The parameters a configured :class:`gazeguard.privacy.mechanisms.Mechanism` reports."""
        p = mechanism.parameters()
        transformed = mechanism.kind.transformed
        return cls.model_validate(
            {
                "name": p["name"],
                "noise": p["noise"],
                "transform": p["transform"] if transformed else None,
                "n": p["n"],
                "k": p["k"] if transformed else None,
                "m": p["kept_coefficients"],
                "epsilon": [e if math.isfinite(e) else None for e in p["epsilon"]],
                "noise_scale": p["noise_scale"],
                "sensitivity": p["sensitivity"],
                "noise_multiplier": p["noise_multiplier"],
                "value_noise_sd": p.get("value_noise_sd"),
                "value_noise_range": p.get("value_noise_range"),
                "lower": p.get("lower"),
                "upper": p.get("upper"),
                "randomness": "os-csprng" if p["secure"] else "INSECURE-seeded",
            }
        )

    @property
    def pure_total(self) -> float | None:
        """Sum of the features' pure ε, or ``None`` without a pure guarantee."""
        if any(e is None for e in self.epsilon):
            return None
        return math.fsum(e for e in self.epsilon if e is not None)


class MechanismLike(Protocol):
    """What :meth:`MechanismParams.from_mechanism` reads
    (``gazeguard.privacy.mechanisms.Mechanism``)."""

    @property
    def kind(self) -> MechanismKind: ...
    def parameters(self) -> dict[str, Any]: ...


class LedgerStateLike(Protocol):
    """What :meth:`LedgerSnapshot.from_state` reads from the ledger's post-charge state."""

    @property
    def epsilon(self) -> float: ...
    @property
    def delta(self) -> float: ...
    @property
    def epsilon_window(self) -> float: ...
    @property
    def window_s(self) -> float: ...
    @property
    def spent(self) -> float: ...
    @property
    def remaining(self) -> float | None: ...
    @property
    def max_chunk_eps(self) -> float: ...
    @property
    def session_cap(self) -> float | None: ...
    @property
    def window_cap(self) -> float | None: ...


#: How people read ``value_noise_sd`` (banner, ``gazeguard watch``, docs/consumer.md).
VALUE_NOISE_LABEL: Final = "noise sd"


def value_noise_text(sd: float, fraction: float, unit: str) -> str:
    """One feature's ``value_noise_sd`` for people: ``512 1/s (1.7× range)``.

    Args:
        sd: the standard deviation of the noise on each published value, in ``unit``.
        fraction: ``sd / (upper − lower)``, the noise as a multiple of the public range.
        unit: the feature's unit.
    """
    return f"{sd:.3g} {unit} ({fraction:.3g}× range)"


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


class LedgerSnapshot(WireModel):
    """The session's ledger right after this chunk was charged (ε is dimensionless).

    Attributes:
        epsilon: the session's user-level ε at ``delta`` so far, this chunk included: the
            accountant's composition of every release (never above ``session_spent``).
        delta: the δ of ``epsilon``, ``epsilon_window`` and the caps.
        epsilon_window: user-level ε at ``delta`` of the releases ending in the trailing
            ``window_s`` seconds of gaze: every release one hour of gaze can change, so this
            is the ε per hour of gaze (gazeguard.plan).
        window_s: that window, seconds of gaze: one hour plus how far one sample reaches
            (feature window, hold, event reach) plus the longest release's span.
        chunk_epsilon: this chunk's pure ε, the sum of its features' ε; ``None`` for noise
            without a pure guarantee (Gaussian).
        session_spent: sequential pure ε of the session so far (the conservative view);
            ``None`` once anything without a pure guarantee was released.
        per_chunk_max: the largest single-chunk pure ε of the session: the paper's per-chunk
            (parallel composition) view, which is NOT a user-level guarantee.
        remaining: ``session_cap − epsilon``; ``None`` when uncapped.
        session_cap: cap on ``epsilon``, or ``None``.
        window_cap: cap on the ε of any ``window_s`` seconds of gaze, or ``None``.
        raw_event_epsilon: ε at ``delta`` that protects one raw gaze sample: the composition
            of every release one sample can change, of every kind the session releases
            (``chunks_reached`` chunks, and labels or cohort buckets where released).
        chunks_reached: how many consecutive chunks one raw gaze sample can change: its reach
            is bounded by the feature window, the hold limit, and the event detector (whose
            parameters come from the declared rate and which cuts every event under 2 s), so
            this holds for any gaze, long fixations included.
    """

    epsilon: NonNegative
    delta: float = Field(gt=0.0, lt=1.0)
    epsilon_window: NonNegative
    window_s: Positive
    chunk_epsilon: Positive | None
    session_spent: Positive | None
    per_chunk_max: NonNegative
    remaining: NonNegative | None
    session_cap: Positive | None
    window_cap: Positive | None
    raw_event_epsilon: Positive | None = None
    chunks_reached: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.session_spent is not None:
            tol = _EPS_RTOL * max(1.0, self.session_spent)
            if self.chunk_epsilon is not None and self.chunk_epsilon > self.per_chunk_max + tol:
                msg = (
                    f"chunk_epsilon={self.chunk_epsilon} exceeds per_chunk_max={self.per_chunk_max}"
                )
                raise ValueError(msg)
            if self.per_chunk_max > self.session_spent + tol:
                msg = (
                    f"per_chunk_max={self.per_chunk_max} exceeds session_spent={self.session_spent}"
                )
                raise ValueError(msg)
            if self.epsilon > self.session_spent + tol:
                msg = f"epsilon={self.epsilon} exceeds the pure session_spent={self.session_spent}"
                raise ValueError(msg)
        if self.epsilon_window > self.epsilon + _EPS_RTOL * max(1.0, self.epsilon):
            msg = (
                f"epsilon_window={self.epsilon_window} exceeds the session's epsilon={self.epsilon}"
            )
            raise ValueError(msg)
        return self

    @classmethod
    def from_state(
        cls,
        chunk_epsilon: float,
        state: LedgerStateLike,
        *,
        raw_event_epsilon: float | None = None,
        chunks_reached: int | None = None,
    ) -> LedgerSnapshot:
        """Build from the ledger's post-charge state (``gazeguard.ledger.LedgerState``)."""
        return cls(
            raw_event_epsilon=raw_event_epsilon,
            chunks_reached=chunks_reached,
            epsilon=state.epsilon,
            delta=state.delta,
            epsilon_window=state.epsilon_window,
            window_s=state.window_s,
            chunk_epsilon=_finite_or_none(chunk_epsilon),
            session_spent=_finite_or_none(state.spent),
            per_chunk_max=state.max_chunk_eps,
            remaining=state.remaining,
            session_cap=state.session_cap,
            window_cap=state.window_cap,
        )


class ChunkSummary(WireModel):
    """A chunk in a few numbers per feature, computed from its published ``values`` only
    (post-processing: it costs no ε and says nothing the values do not).

    With DCFPA at k = 1 (the default) a chunk carries one number per feature, its net change
    from the public lower bound, drawn as a ramp of n values ending at ``lower + net change``
    (clipped to the bounds): ``last − lower`` is that number. With CFPA at k = 1 the values are
    flat and ``mean`` is the one number.

    Attributes:
        mean: per feature, the mean of the chunk's n published values, in its unit, (F,).
        last: per feature, the chunk's last published value, in its unit, (F,).
    """

    mean: list[FiniteFloat] = Field(min_length=1)
    last: list[FiniteFloat] = Field(min_length=1)

    @classmethod
    def of(cls, values: npt.ArrayLike) -> ChunkSummary:
        """The summary of published values float64 (F, n), n ≥ 2."""
        v = np.asarray(values, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            mean = v.mean(axis=1)
        if not np.isfinite(mean).all():
            # Values near ±1.8e308 overflow the sum: average them scaled to [−1, 1] instead.
            scale = np.max(np.abs(v), axis=1)
            scale[scale == 0.0] = 1.0
            mean = np.clip((v / scale[:, None]).mean(axis=1), -1.0, 1.0) * scale
        mean = np.clip(mean, v.min(axis=1), v.max(axis=1))
        return cls(mean=mean.tolist(), last=v[:, -1].tolist())

    def agrees_with(self, values: npt.ArrayLike) -> bool:
        """Whether this summary is the one of ``values`` (F, n), to float rounding."""
        v = np.asarray(values, dtype=np.float64)
        want = ChunkSummary.of(v)
        tol = 1e-9 * (1.0 + float(np.abs(v).max(initial=0.0)))
        if len(self.mean) != len(want.mean):
            return False
        close = bool(np.allclose(self.mean, want.mean, rtol=0.0, atol=tol))
        return close and self.last == want.last


class ChunkMessage(WireModel):
    """One privatized chunk of one session (``gazeguard.chunk/2``).

    Attributes:
        session: session id; device: device id (as in the topic).
        chunk_index: 0-based chunk number within the session; with ``session`` the dedup key.
        timestamps: end time of each step's feature window, s (LSL clock of the sidecar's host:
            seconds since an arbitrary origin), (n,), increasing.
        unix_start: Unix time of the first step, s (LSL clock + the host's clock offset): place
            the chunk in wall-clock time on any host.
        unix_end: Unix time of the last step, s.
        features: feature names, (F,); units: their units, (F,).
        values: privatized feature values ``[F][n]`` in the features' units.
        carries: what the values carry, in words (e.g. "one number per feature per chunk ...").
        profile: the release profile that chose the features, or ``None``.
        mechanism: how the values were privatized.
        ledger: the ledger state after this chunk was charged.
        summary: the chunk's values in a few numbers per feature (:class:`ChunkSummary`),
            for transforms that keep k coefficients; computed from ``values`` only. ``None``
            for ``lpa``.
    """

    schema_: Literal["gazeguard.chunk/2"] = Field(CHUNK_SCHEMA, alias="schema")
    session: Name
    device: Name
    chunk_index: int = Field(ge=0)
    timestamps: list[FiniteFloat] = Field(min_length=2)
    unix_start: FiniteFloat
    unix_end: FiniteFloat
    carries: str = ""
    profile: str | None = None
    features: list[Name] = Field(min_length=1)
    units: list[str]
    values: list[list[FiniteFloat]]
    mechanism: MechanismParams
    ledger: LedgerSnapshot
    summary: ChunkSummary | None = None

    @model_validator(mode="after")
    def _shapes(self) -> Self:
        F, n = len(self.features), len(self.timestamps)
        if n != self.mechanism.n:
            msg = f"{n} timestamps but mechanism.n={self.mechanism.n}"
            raise ValueError(msg)
        if any(b <= a for a, b in zip(self.timestamps, self.timestamps[1:], strict=False)):
            msg = "timestamps must be strictly increasing"
            raise ValueError(msg)
        if len(set(self.features)) != F:
            msg = "feature names must be unique"
            raise ValueError(msg)
        if len(self.units) != F or len(self.mechanism.epsilon) != F:
            msg = (
                f"{F} features but {len(self.units)} units and "
                f"{len(self.mechanism.epsilon)} mechanism entries"
            )
            raise ValueError(msg)
        if len(self.values) != F or any(len(row) != n for row in self.values):
            msg = f"values must be [F][n] = [{F}][{n}]"
            raise ValueError(msg)
        if self.summary is not None and not self.summary.agrees_with(self.values):
            msg = "summary must be the mean and last of the published values"
            raise ValueError(msg)
        if self.unix_end < self.unix_start:
            msg = f"unix_end={self.unix_end} precedes unix_start={self.unix_start}"
            raise ValueError(msg)
        total = self.mechanism.pure_total
        if (total is None) != (self.ledger.chunk_epsilon is None):
            msg = "ledger.chunk_epsilon must be null exactly when the noise has no pure ε"
            raise ValueError(msg)
        if total is not None and not math.isclose(
            total, self.ledger.chunk_epsilon or 0.0, rel_tol=_EPS_RTOL, abs_tol=_EPS_UNIT * F
        ):
            msg = (
                f"ledger.chunk_epsilon={self.ledger.chunk_epsilon} but the features' ε sum to "
                f"{total}: the message must report exactly what was charged"
            )
            raise ValueError(msg)
        return self

    @classmethod
    def build(
        cls,
        *,
        session: str,
        device: str,
        chunk_index: int,
        timestamps: npt.ArrayLike,
        features: Sequence[str],
        units: Sequence[str],
        values: npt.ArrayLike,
        mechanism: MechanismParams,
        ledger: LedgerSnapshot,
        unix_offset: float,
        carries: str = "",
        profile: str | None = None,
    ) -> ChunkMessage:
        """Build from numpy arrays: ``timestamps`` (n,) s, ``values`` float64 (F, n);
        ``unix_offset``: Unix time minus timestamp, s.

        Raises:
            pydantic.ValidationError: wrong shapes, non-finite values or inconsistent ε.
        """
        t = np.asarray(timestamps, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        # Non-finite or misshapen values get no summary: the values' own checks refuse them.
        ok = mechanism.k is not None and v.ndim == 2 and v.shape[1] > 0 and np.isfinite(v).all()
        message = cls(
            session=session,
            device=device,
            chunk_index=chunk_index,
            timestamps=t.tolist(),
            unix_start=float(t[0]) + unix_offset if t.size else unix_offset,
            unix_end=float(t[-1]) + unix_offset if t.size else unix_offset,
            features=list(features),
            units=list(units),
            values=v.tolist(),
            carries=carries,
            profile=profile,
            mechanism=mechanism,
            ledger=ledger,
        )
        # The summary is attached after validation: it is computed here from the very values
        # just validated, so the validator's recomputation (agrees_with: ~100 µs a chunk, half
        # of a build) would only repeat it. A received message is checked in full.
        return message.model_copy(update={"summary": ChunkSummary.of(v)}) if ok else message

    def values_array(self) -> npt.NDArray[np.float64]:
        """The privatized values as float64 (F, n)."""
        return np.asarray(self.values, dtype=np.float64)


class StatusMessage(WireModel):
    """The retained state of one session (``gazeguard.status/2``); the latest one wins.

    Every field is **public** (:mod:`gazeguard.wire.egress`): a function of the settings, the
    stream's declared metadata, a public clock and the ledger's state (itself a function of the
    public release schedule). Nothing counted from the gaze samples is here: how many samples
    arrived, were invalid or were dropped, and whether samples are arriving at all, stays on
    the device (its log, ``gazeguard ledger show``).

    Attributes:
        state: ``starting`` (nothing charged or withheld yet), ``running``, ``budget_exhausted``
            (a cap refused the latest release: releases are being withheld), ``stream_lost``
            (the session ended because its stream did: the LSL inlet reported it lost, or the
            ingest failed; final) or ``stopped`` (the session ended). Whether samples arrive
            does not change it.
        time: when this status was made, Unix time, s.
        epsilon: the session's user-level ε at ``delta`` so far (the accountant's composition);
            epsilon_window: the same over the trailing ``window_s`` s of gaze (per hour);
            window_cap: the cap on that (``ledger.budget_per_hour``), or ``None``.
        spent: pure sequential ε so far (the conservative view; ``None`` with Gaussian noise);
            remaining: ``session_cap − epsilon`` (``None`` when uncapped); session_cap: the
            per-session cap or ``None``.
        chunks_charged: chunks of the session charged to the ledger (every run of it).
        chunks_delivered: of those, acknowledged by the broker (PUBACK).
        chunks_refused: of those, permanently refused by the broker (e.g. an ACL): kept in the
            ledger, their ε spent, never retried (``gazeguard ledger show`` lists them).
        chunks_withheld: chunks refused by a cap (nothing about them was released).
        chunks_dropped: chunks whose due release failed in the mechanism or the ledger (fail
            closed: nothing about them was released); each leaves a gap in ``chunk_index`` on
            the chunks topic, which is all this count says.
        reason: why the session is in this state, in fixed words and ledger figures (never an
            error's text or type, never a count of samples); required for
            ``budget_exhausted`` and ``stream_lost``.
    """

    schema_: Literal["gazeguard.status/2"] = Field(STATUS_SCHEMA, alias="schema")
    session: Name
    device: Name
    state: SessionState
    time: NonNegative
    epsilon: NonNegative | None = Field(None, description="user-level ε at delta, session")
    delta: float | None = Field(None, gt=0.0, lt=1.0, description="δ of every ε here")
    epsilon_window: NonNegative | None = Field(
        None, description="user-level ε at delta of the trailing window_s seconds of gaze"
    )
    window_s: Positive | None = Field(None, description="that window, seconds of gaze")
    window_cap: Positive | None = Field(None, description="cap on epsilon_window, or null")
    spent: NonNegative | None
    remaining: NonNegative | None
    session_cap: Positive | None
    chunks_charged: int = Field(ge=0)
    chunks_delivered: int = Field(0, ge=0)
    chunks_refused: int = Field(0, ge=0)
    chunks_withheld: int = Field(ge=0)
    chunks_dropped: int = Field(ge=0)
    reason: str | None = None

    @model_validator(mode="after")
    def _reason_given(self) -> Self:
        if self.state in ("budget_exhausted", "stream_lost") and not self.reason:
            msg = f"state {self.state!r} needs a reason"
            raise ValueError(msg)
        return self


# ---------------------------------------------------------------------------------------------
# JSON Schema export (every kind's file: gazeguard.wire.kinds.SCHEMA_FILES)


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a payload model, as shipped in ``gazeguard/data``."""
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    tag = str(model.model_fields["schema_"].default).removeprefix("gazeguard.")  # e.g. chunk/2
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://gazeguard.invalid/schemas/{tag}",
        **schema,
    }


def shipped_schema(filename: str) -> dict[str, Any]:
    """A schema file as shipped in the package, e.g. ``chunk.schema.json``."""
    text = resources.files("gazeguard").joinpath("data", filename).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def write_schemas(directory: Path, files: Mapping[str, type[WireModel]]) -> list[Path]:
    """Write payload schemas into ``directory``: ``files`` (file name → model), e.g.
    :data:`gazeguard.wire.kinds.SCHEMA_FILES`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, model in files.items():
        path = directory / filename
        path.write_text(json.dumps(json_schema(model), indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written
