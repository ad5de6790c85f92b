"""What goes on the wire: versioned payload models and the MQTT topics they travel on.

Two messages leave gazeguard, both JSON described by pydantic models with an exported JSON Schema
(``gazeguard/data/*.schema.json``; regenerate with ``python -m gazeguard.message --write-schemas``):

- :class:`ChunkMessage` (``"schema": "gazeguard.chunk/1"``), one per privatized chunk, on
  ``{prefix}/{device}/{session}/chunks`` (QoS 1, not retained). It carries the privatized values
  ``[F][n]``, the step timestamps, feature names and units, the mechanism parameters that produced
  them and the ledger state right after this chunk was charged.
- :class:`StatusMessage` (``"schema": "gazeguard.status/1"``), retained on
  ``{prefix}/{device}/{session}/status``: what the session is doing, its budget, how many chunks
  were published, withheld and dropped, and why.

Only privatized values can be expressed: a chunk message must name its mechanism, ε, λ and Δ2 per
feature, and its ledger state must agree with its ε. Every float must be finite; NaN and ±inf are
refused at construction, so nothing half-baked can be serialised.

Chunks are delivered at least once (MQTT QoS 1): a chunk whose PUBACK was lost is sent again
after a reconnect or restart. Consumers deduplicate by ``(session, chunk_index)``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Protocol, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gazeguard.errors import ConfigError

CHUNK_SCHEMA: Final = "gazeguard.chunk/1"
STATUS_SCHEMA: Final = "gazeguard.status/1"

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


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        # What we emit always has every field: the exported schema marks them all required.
        json_schema_serialization_defaults_required=True,
    )


class MechanismParams(_Model):
    """How a chunk was privatized (DESIGN.md "Mechanisms"); lists have one entry per feature.

    Attributes:
        name: ``lpa`` (Laplace on every value), ``cfpa`` (FPA per chunk) or ``dcfpa`` (FPA on the
            difference chunk, then cumulative sum).
        transform: ``dft`` or ``dct`` for the Fourier mechanisms; ``None`` for ``lpa``.
        n: steps per chunk, a power of two.
        k: kept frequencies (``None`` for ``lpa``), 1 ≤ k ≤ n/2.
        m: kept real coefficients: ``2k − 1`` for ``dft``, ``k`` for ``dct``; ``n`` for ``lpa``.
        epsilon: ε per feature for this chunk, (F,).
        noise_scale: λ per feature, the Laplace scale actually used, in the feature's unit, (F,).
        sensitivity_l2: Δ2 per feature from the public bounds, in the feature's unit, (F,).
        noise: ``os-csprng`` in production; ``INSECURE-seeded`` when a reproducible seed was set.
    """

    name: Literal["lpa", "cfpa", "dcfpa"]
    transform: Literal["dft", "dct"] | None
    n: int = Field(ge=2)
    k: int | None = Field(ge=1)
    m: int = Field(ge=1)
    epsilon: list[Positive] = Field(min_length=1)
    noise_scale: list[Positive] = Field(alias="lambda", min_length=1)
    sensitivity_l2: list[Positive] = Field(alias="delta2", min_length=1)
    noise: NoiseSource

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.n & (self.n - 1):
            msg = f"n must be a power of two, got {self.n}"
            raise ValueError(msg)
        if self.name == "lpa":
            if self.transform is not None or self.k is not None or self.m != self.n:
                msg = "lpa has no transform and no k, and m must equal n"
                raise ValueError(msg)
        else:
            if self.transform is None or self.k is None:
                msg = f"{self.name} needs a transform and k"
                raise ValueError(msg)
            if self.k > self.n // 2:
                msg = f"k={self.k} exceeds n/2={self.n // 2}"
                raise ValueError(msg)
            want = 2 * self.k - 1 if self.transform == "dft" else self.k
            if self.m != want:
                msg = f"m={self.m} but {self.transform} with k={self.k} keeps m={want}"
                raise ValueError(msg)
        if not len(self.epsilon) == len(self.noise_scale) == len(self.sensitivity_l2):
            msg = (
                f"epsilon, lambda and delta2 must have one entry per feature, got "
                f"{len(self.epsilon)}, {len(self.noise_scale)}, {len(self.sensitivity_l2)}"
            )
            raise ValueError(msg)
        return self


class LedgerStateLike(Protocol):
    """What :meth:`LedgerSnapshot.from_state` reads from the ledger's post-charge state."""

    @property
    def spent(self) -> float: ...
    @property
    def remaining(self) -> float | None: ...
    @property
    def max_chunk_eps(self) -> float: ...
    @property
    def session_cap(self) -> float | None: ...
    @property
    def w_event(self) -> int | None: ...
    @property
    def w_event_cap(self) -> float | None: ...


class LedgerSnapshot(_Model):
    """The session's ledger right after this chunk was charged (ε is dimensionless).

    Attributes:
        chunk_epsilon: this chunk's cost, the sum of its features' ε (sequential composition).
        session_spent: everything the session spent so far, this chunk included: the honest
            user-level ε (sequential composition over chunks).
        per_chunk_max: the largest single-chunk ε of the session: the paper's per-chunk
            (parallel composition) view, which is NOT a user-level guarantee.
        remaining: ε still available under the binding cap; ``None`` when uncapped.
        session_cap: per-session cap, or ``None``.
        w_event: w of the w-event cap (chunks), or ``None``.
        w_event_cap: ε allowed over any w consecutive chunks, or ``None``.
    """

    chunk_epsilon: Positive
    session_spent: Positive
    per_chunk_max: Positive
    remaining: NonNegative | None
    session_cap: Positive | None
    w_event: int | None = Field(ge=1)
    w_event_cap: Positive | None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        tol = _EPS_RTOL * max(1.0, self.session_spent)
        if self.chunk_epsilon > self.per_chunk_max + tol:
            msg = f"chunk_epsilon={self.chunk_epsilon} exceeds per_chunk_max={self.per_chunk_max}"
            raise ValueError(msg)
        if self.per_chunk_max > self.session_spent + tol:
            msg = f"per_chunk_max={self.per_chunk_max} exceeds session_spent={self.session_spent}"
            raise ValueError(msg)
        if (self.w_event is None) != (self.w_event_cap is None):
            msg = "w_event and w_event_cap are set together or not at all"
            raise ValueError(msg)
        return self

    @classmethod
    def from_state(cls, chunk_epsilon: float, state: LedgerStateLike) -> LedgerSnapshot:
        """Build from the ledger's post-charge state (``gazeguard.ledger.LedgerState``)."""
        return cls(
            chunk_epsilon=chunk_epsilon,
            session_spent=state.spent,
            per_chunk_max=state.max_chunk_eps,
            remaining=state.remaining,
            session_cap=state.session_cap,
            w_event=state.w_event,
            w_event_cap=state.w_event_cap,
        )


class ChunkMessage(_Model):
    """One privatized chunk of one session (``gazeguard.chunk/1``).

    Attributes:
        session: session id; device: device id (as in the topic).
        chunk_index: 0-based chunk number within the session; with ``session`` the dedup key.
        timestamps: end time of each step's feature window, s (LSL clock), (n,), increasing.
        features: feature names, (F,); units: their units, (F,).
        values: privatized feature values ``[F][n]`` in the features' units.
        mechanism: how the values were privatized.
        ledger: the ledger state after this chunk was charged.
    """

    schema_: Literal["gazeguard.chunk/1"] = Field(CHUNK_SCHEMA, alias="schema")
    session: Name
    device: Name
    chunk_index: int = Field(ge=0)
    timestamps: list[FiniteFloat] = Field(min_length=2)
    features: list[Name] = Field(min_length=1)
    units: list[str]
    values: list[list[FiniteFloat]]
    mechanism: MechanismParams
    ledger: LedgerSnapshot

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
        total = math.fsum(self.mechanism.epsilon)
        if not math.isclose(
            total, self.ledger.chunk_epsilon, rel_tol=_EPS_RTOL, abs_tol=_EPS_UNIT * F
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
    ) -> ChunkMessage:
        """Build from numpy arrays: ``timestamps`` (n,) s, ``values`` float64 (F, n).

        Raises:
            pydantic.ValidationError: wrong shapes, non-finite values or inconsistent ε.
        """
        return cls(
            session=session,
            device=device,
            chunk_index=chunk_index,
            timestamps=np.asarray(timestamps, dtype=np.float64).tolist(),
            features=list(features),
            units=list(units),
            values=np.asarray(values, dtype=np.float64).tolist(),
            mechanism=mechanism,
            ledger=ledger,
        )

    def values_array(self) -> npt.NDArray[np.float64]:
        """The privatized values as float64 (F, n)."""
        return np.asarray(self.values, dtype=np.float64)

    def to_payload(self) -> bytes:
        """UTF-8 JSON bytes, as published."""
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_payload(cls, payload: bytes | str) -> ChunkMessage:
        """Parse and validate a received payload."""
        return cls.model_validate_json(payload)


Count = Annotated[int, Field(ge=0)]


class IngestCounters(_Model):
    """What the gaze ingest did with the samples it received since the stream opened (counts of
    samples; each field's description says what it counts). ``dropped`` is the sum of
    ``duplicates``, ``out_of_order``, ``implausible``, ``nonfinite`` and ``overflow``."""

    samples: Count = Field(description="samples delivered to feature extraction")
    invalid: Count = Field(description="delivered samples marked invalid")
    dropped: Count = Field(description="samples never delivered (sum of the drop counters)")
    duplicates: Count = Field(description="dropped: timestamp or sample index repeated")
    out_of_order: Count = Field(description="dropped: timestamp or sample index went back")
    implausible: Count = Field(
        description="dropped: ahead of (or far behind) the clock, or an index jump the nominal "
        "rate cannot make"
    )
    future: Count = Field(
        description="of the implausible: timestamp more than ingest.future_tolerance_s ahead"
    )
    nonfinite: Count = Field(description="dropped: timestamp NaN or infinite")
    overflow: Count = Field(description="dropped: processing fell behind (queue full)")
    lost: Count = Field(
        description="index numbers missing from the delivered samples (lost in transit or dropped)"
    )
    resyncs: Count = Field(description="times ingest followed a jump of the sender's clock")


class StatusMessage(_Model):
    """The retained state of one session (``gazeguard.status/1``); the latest one wins.

    Attributes:
        state: ``starting``, ``running``, ``budget_exhausted`` (chunks are being withheld),
            ``stream_lost`` (no usable gaze sample for ``ingest.stream_lost_after_s``; waiting for
            them) or ``stopped``.
        time: when this status was made, Unix time, s.
        spent: ε spent so far (sequential composition); remaining: ε left under the binding cap
            (``None`` when uncapped); session_cap: the per-session cap or ``None``.
        chunks_published: chunks charged and handed to the publisher.
        chunks_withheld: chunks refused by a cap (nothing about them was released).
        chunks_dropped: chunks lost to errors or to the session ending mid-chunk.
        reason: why the session is in this state, and the cause of the latest withhold or drop;
            required for ``budget_exhausted`` and ``stream_lost``.
        ingest: the gaze ingest's counters (:class:`IngestCounters`); ``None`` where the
            session's samples do not come through gazeguard's ingest (in-process API, fleets).
    """

    schema_: Literal["gazeguard.status/1"] = Field(STATUS_SCHEMA, alias="schema")
    session: Name
    device: Name
    state: SessionState
    time: NonNegative
    spent: NonNegative
    remaining: NonNegative | None
    session_cap: Positive | None
    chunks_published: int = Field(ge=0)
    chunks_withheld: int = Field(ge=0)
    chunks_dropped: int = Field(ge=0)
    reason: str | None = None
    ingest: IngestCounters | None = Field(
        None, description="ingest counters (samples delivered, dropped and why), if known"
    )

    @model_validator(mode="after")
    def _reason_given(self) -> Self:
        if self.state in ("budget_exhausted", "stream_lost") and not self.reason:
            msg = f"state {self.state!r} needs a reason"
            raise ValueError(msg)
        return self

    def to_payload(self) -> bytes:
        """UTF-8 JSON bytes, as published."""
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_payload(cls, payload: bytes | str) -> StatusMessage:
        """Parse and validate a received payload."""
        return cls.model_validate_json(payload)


# ---------------------------------------------------------------------------------------------
# Topics


def _check_segment(field: str, value: str) -> None:
    bad = [c for c in "/+#\0" if c in value]
    if not value or bad or value != value.strip():
        raise ConfigError(
            field,
            value,
            "must be a non-empty MQTT topic level without '/', '+', '#', NUL or surrounding "
            "spaces; choose another id",
        )


def _check_prefix(prefix: str) -> None:
    if (
        not prefix
        or prefix.startswith("/")
        or prefix.endswith("/")
        or any(c in prefix for c in "+#\0")
    ):
        raise ConfigError(
            "broker.topic_prefix",
            prefix,
            "must be non-empty, without wildcards ('+', '#'), NUL or a leading/trailing '/' "
            "(default 'gazeguard/v1')",
        )


def chunk_topic(prefix: str, device: str, session: str) -> str:
    """``{prefix}/{device}/{session}/chunks``: one privatized chunk per message, QoS 1.

    Raises:
        ConfigError: a part is empty or contains MQTT wildcards or separators.
    """
    _check_prefix(prefix)
    _check_segment("device", device)
    _check_segment("session", session)
    return f"{prefix}/{device}/{session}/chunks"


def status_topic(prefix: str, device: str, session: str) -> str:
    """``{prefix}/{device}/{session}/status``: the retained session status.

    Raises:
        ConfigError: a part is empty or contains MQTT wildcards or separators.
    """
    _check_prefix(prefix)
    _check_segment("device", device)
    _check_segment("session", session)
    return f"{prefix}/{device}/{session}/status"


# ---------------------------------------------------------------------------------------------
# JSON Schema export

SCHEMA_FILES: dict[str, type[_Model]] = {
    "chunk.schema.json": ChunkMessage,
    "status.schema.json": StatusMessage,
}


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a payload model, as shipped in ``gazeguard/data``."""
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    name = "chunk" if model is ChunkMessage else "status"
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://gazeguard.invalid/schemas/{name}/1",
        **schema,
    }


def shipped_schema(filename: str) -> dict[str, Any]:
    """A schema file as shipped in the package: ``chunk.schema.json`` or ``status.schema.json``."""
    text = resources.files("gazeguard").joinpath("data", filename).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def write_schemas(directory: Path) -> list[Path]:
    """Write the payload schemas as ``chunk.schema.json`` and ``status.schema.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, model in SCHEMA_FILES.items():
        path = directory / filename
        path.write_text(json.dumps(json_schema(model), indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gazeguard.message --write-schemas [DIR]``."""
    parser = argparse.ArgumentParser(prog="python -m gazeguard.message", description=__doc__)
    parser.add_argument(
        "--write-schemas",
        nargs="?",
        const=Path(__file__).resolve().parent / "data",
        type=Path,
        metavar="DIR",
        help="write the payload JSON Schemas (default: gazeguard/data in the source tree)",
    )
    args = parser.parse_args(argv)
    if args.write_schemas is None:
        parser.print_help()
        return 2
    for path in write_schemas(args.write_schemas):
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
