"""Payload models: round trips, shipped JSON Schemas, refusal of half-baked messages, topics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from pydantic import ValidationError

from gazeguard.cli.schemas import main
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import Ledger, pure_cost
from gazeguard.wire.kinds import SCHEMA_FILES
from gazeguard.wire.message import (
    ChunkMessage,
    LedgerSnapshot,
    MechanismParams,
    StatusMessage,
    json_schema,
    shipped_schema,
)
from gazeguard.wire.topics import chunk_topic, name_problem, session_id_for, status_topic
from tests.wire._params import mechanism_params, status_message

F, N = 4, 16


def mechanism(**over: Any) -> MechanismParams:
    return mechanism_params(F, N, **{"noise_scale": [1.0, 2.0, 3.0, 4.0], **over})


def snapshot(**over: Any) -> LedgerSnapshot:
    fields: dict[str, Any] = {
        "epsilon": 5.5,
        "delta": 1e-6,
        "epsilon_window": 5.5,
        "window_s": 3600.0,
        "chunk_epsilon": 2.0,
        "session_spent": 6.0,
        "per_chunk_max": 2.0,
        "remaining": 4.5,
        "session_cap": 10.0,
        "window_cap": None,
    }
    fields.update(over)
    return LedgerSnapshot.model_validate(fields)


def chunk(values: np.ndarray | None = None, **over: Any) -> ChunkMessage:
    fields: dict[str, Any] = {
        "session": "s1",
        "device": "hmd-7",
        "chunk_index": 2,
        "timestamps": 100.0 + 0.5 * np.arange(N),
        "features": ["fix_rate", "sacc_amp_mean", "pupil_mean", "blink_rate"],
        "units": ["1/s", "deg", "mm", "1/s"],
        "values": np.linspace(-1, 1, F * N).reshape(F, N) if values is None else values,
        "mechanism": mechanism(),
        "ledger": snapshot(),
    }
    fields.update(over)
    return ChunkMessage.build(**fields, unix_offset=1.7e9)


def test_round_trip_is_exact() -> None:
    values = np.random.default_rng(0).normal(scale=1e3, size=(F, N))
    msg = chunk(values)
    back = ChunkMessage.from_payload(msg.to_payload())
    assert back == msg
    np.testing.assert_array_equal(back.values_array(), values)  # bit-exact floats
    assert json.loads(msg.to_payload())["schema"] == "gazeguard.chunk/2"
    assert json.loads(msg.to_payload())["mechanism"]["noise_scale"] == [1.0, 2.0, 3.0, 4.0]
    assert (back.unix_start, back.unix_end) == (1.7e9 + 100.0, 1.7e9 + 100.0 + 0.5 * (N - 1))


@settings(max_examples=50, deadline=None)
@given(
    arrays(
        np.float64,
        (F, N),
        elements=st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True),
    )
)
def test_any_finite_chunk_round_trips_bit_exactly(values: np.ndarray) -> None:
    back = ChunkMessage.from_payload(chunk(values).to_payload()).values_array()
    np.testing.assert_array_equal(back, values)
    assert np.array_equal(np.signbit(back), np.signbit(values))  # -0.0 stays -0.0


def test_shipped_schema_files_match_the_models(tmp_path: Path) -> None:
    for filename, model in SCHEMA_FILES.items():
        assert shipped_schema(filename) == json_schema(model), (
            f"gazeguard/data/{filename} is stale: run gazeguard schemas --write"
        )
        jsonschema.Draft202012Validator.check_schema(shipped_schema(filename))
    assert main(["--write", str(tmp_path)]) == 0
    for filename in SCHEMA_FILES:
        assert json.loads((tmp_path / filename).read_text()) == shipped_schema(filename)


def test_real_payloads_validate_against_the_schema() -> None:
    validator = jsonschema.Draft202012Validator(shipped_schema("chunk.schema.json"))
    payload = json.loads(chunk().to_payload())
    validator.validate(payload)
    lpa = chunk(
        mechanism=mechanism(name="lpa", transform=None, k=None, m=N, randomness="INSECURE-seeded")
    )
    validator.validate(json.loads(lpa.to_payload()))
    for broken in (
        {k: v for k, v in payload.items() if k != "mechanism"},
        {**payload, "schema": "gazeguard.chunk/1"},
        {**payload, "values": [["1.0"] * N] * F},
        {**payload, "raw": [1.0]},  # no extra fields: nothing unprivatized can ride along
    ):
        assert not validator.is_valid(broken)

    status = status_message(
        "s1",
        "hmd-7",
        state="stopped",
        time=1.7e9,
        spent=6.0,
        chunks_charged=3,
        chunks_dropped=1,
        reason="session ended with 11 steps of a partial chunk (dropped)",
    )
    jsonschema.validate(json.loads(status.to_payload()), shipped_schema("status.schema.json"))
    assert StatusMessage.from_payload(status.to_payload()) == status


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused(bad: float) -> None:
    values = np.zeros((F, N))
    values[2, 5] = bad
    with pytest.raises(ValidationError, match=r"values\.2\.5"):
        chunk(values)
    times = 100.0 + 0.5 * np.arange(N)
    times[0] = bad
    with pytest.raises(ValidationError, match=r"timestamps\.0"):
        chunk(timestamps=times)
    with pytest.raises(ValidationError, match="finite"):
        mechanism(noise_scale=[1.0, bad, 1.0, 1.0])


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"values": np.zeros((F, N - 1))}, r"values must be \[F\]\[n\]"),
        ({"values": np.zeros((F - 1, N))}, r"values must be \[F\]\[n\]"),
        ({"timestamps": np.arange(N - 1.0)}, "timestamps but mechanism.n"),
        ({"timestamps": np.zeros(N)}, "strictly increasing"),
        ({"units": ["1/s"]}, "4 features but 1 units"),
        ({"features": ["a", "a", "b", "c"]}, "unique"),
        ({"ledger": snapshot(chunk_epsilon=1.5, per_chunk_max=2.0)}, "must report exactly"),
        ({"session": ""}, "session"),
        ({"chunk_index": -1}, "chunk_index"),
    ],
)
def test_inconsistent_chunks_are_refused(over: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        chunk(**over)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"n": 12}, "power of two"),
        ({"k": 9}, "exceeds n/2"),
        ({"m": 3}, "keeps m=5"),
        ({"transform": "dct", "m": 5}, "keeps m=3"),
        ({"name": "lpa"}, "lpa has no transform"),
        ({"transform": None}, "needs a transform"),
        ({"epsilon": [0.5] * (F - 1)}, "one entry per feature"),
        ({"epsilon": [0.5, 0.5, 0.0, 0.5]}, "greater than 0"),
        ({"randomness": "seeded"}, "randomness"),
        ({"noise": "cauchy"}, "not one of laplace"),
        ({"epsilon": [0.5, None, 0.5, 0.5]}, "null with gaussian"),
        ({"noise": "gaussian"}, "null with gaussian"),
    ],
)
def test_inconsistent_mechanisms_are_refused(over: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        mechanism(**over)


@pytest.mark.parametrize(
    ("over", "match"),
    [({"n": 12}, "power of two"), ({"k": 9}, "exceeds n/2"), ({"m": 3}, "keeps m=5")],
)
def test_a_received_chunk_with_inconsistent_mechanism_params_is_refused(
    over: dict[str, Any], match: str
) -> None:
    # a sender checks its MechanismParams once, when made; a receiver checks every field
    doc = json.loads(chunk().to_payload())
    doc["mechanism"].update(over)
    with pytest.raises(ValidationError, match=match):
        ChunkMessage.from_payload(json.dumps(doc))
    params = mechanism()
    assert chunk(mechanism=params).mechanism is params  # quoted as it is: checked when made


def test_ledger_snapshot_checks() -> None:
    with pytest.raises(ValidationError, match="exceeds session_spent"):
        snapshot(per_chunk_max=7.0)
    with pytest.raises(ValidationError, match="exceeds the pure session_spent"):
        snapshot(epsilon=6.5, epsilon_window=6.5)
    with pytest.raises(ValidationError, match="exceeds the session's epsilon"):
        snapshot(epsilon_window=6.0)
    with pytest.raises(ValidationError, match="delta"):
        snapshot(delta=0.0)
    gaussian = snapshot(chunk_epsilon=None, session_spent=None, epsilon=12.0, epsilon_window=3.0)
    assert gaussian.session_spent is None  # no pure bound, only (ε, δ)


def test_snapshot_from_a_real_ledger_state(tmp_path: Path) -> None:
    """The chunk payload quotes the ledger's post-charge state, from a preview."""
    eps = {"fix_rate": 0.1, "sacc_amp_mean": 0.2, "pupil_mean": 0.3, "blink_rate": 0.4}
    topic = chunk_topic("gazeguard/v1", "hmd-7", "s1")
    with Ledger(tmp_path / "ledger.sqlite", session_cap=5.0, window_cap=3.0) as led:
        for i in range(3):
            preview = led.preview("s1", pure_cost(eps))
            body = chunk(
                chunk_index=i,
                mechanism=mechanism(epsilon=list(eps.values())),
                ledger=LedgerSnapshot.from_state(sum(eps.values()), preview.state),
            ).to_payload()
            led.charge("s1", i, pure_cost(eps), topic, body, version=preview.version)
        items = led.pending()
        state = led.state("s1")
    assert [it.chunk_index for it in items] == [0, 1, 2]
    last = ChunkMessage.from_payload(items[-1].payload).ledger
    assert last.session_spent == pytest.approx(3.0) == state.spent
    assert last.epsilon == pytest.approx(state.epsilon)
    assert last.epsilon <= last.session_spent
    assert last.per_chunk_max == pytest.approx(1.0)
    assert last.remaining == pytest.approx(5.0 - state.epsilon)
    assert (last.session_cap, last.window_cap) == (5.0, 3.0)
    assert (last.window_s, last.delta) == (3600.0, 1e-6)
    assert ChunkMessage.from_payload(items[0].payload).ledger.session_spent == pytest.approx(1.0)


def test_status_needs_a_reason_when_something_is_wrong() -> None:
    base: dict[str, Any] = {
        "session": "s1",
        "device": "d",
        "time": 1.7e9,
        "spent": 1.0,
        "remaining": 0.0,
        "session_cap": 1.0,
        "chunks_charged": 1,
        "chunks_withheld": 2,
        "chunks_dropped": 0,
    }
    for state in ("budget_exhausted", "stream_lost"):
        with pytest.raises(ValidationError, match=f"state '{state}' needs a reason"):
            StatusMessage.model_validate({**base, "state": state})
    with pytest.raises(ValidationError, match="state"):
        StatusMessage.model_validate({**base, "state": "paused"})
    ok = StatusMessage.model_validate(
        {**base, "state": "budget_exhausted", "reason": "session cap 1 reached"}
    )
    assert json.loads(ok.to_payload())["schema"] == "gazeguard.status/2"


def test_the_status_carries_no_count_of_samples() -> None:
    """Finding 4 of issue 46: the ingest's counters (``invalid`` is the blink signal) left the
    status; a status that carries them, or a paused-stream state, is refused."""
    base: dict[str, Any] = {
        "session": "s1", "device": "d", "state": "running", "time": 1.7e9, "spent": 1.0,
        "remaining": None, "session_cap": None, "chunks_charged": 1, "chunks_withheld": 0,
        "chunks_dropped": 0,
    }  # fmt: skip
    StatusMessage.model_validate(base)
    counters = {"samples": 8260, "invalid": 473, "dropped": 0, "lost": 0, "resyncs": 0}
    for extra in ({"ingest": counters}, counters, {"tail_steps_dropped": 3}):
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            StatusMessage.model_validate({**base, **extra})
    shipped = shipped_schema("status.schema.json")["properties"]
    fields = set(StatusMessage.model_fields) | set(shipped)
    assert not fields & {"ingest", *counters, "samples_invalid", "tail_steps_dropped"}


@given(st.text(max_size=300), st.text(max_size=300))
def test_a_session_id_derived_from_a_stream_is_always_topic_safe(source_id: str, name: str) -> None:
    """Whatever an LSL outlet calls itself (control characters, surrogates, 10 kB), the session id
    derived from it passes the topic rule, so a stream's name can never stall the outbox."""
    assert name_problem(session_id_for(source_id, name)) is None


def test_topics() -> None:
    assert chunk_topic("gazeguard/v1", "hmd-7", "s1") == "gazeguard/v1/hmd-7/s1/chunks"
    assert status_topic("acme/gg", "hmd-7", "s1") == "acme/gg/hmd-7/s1/status"
    bad = [
        ("a/b", "s"), ("d", "s+"), ("d", "#"), ("", "s"), ("d", " s"), ("d", "ab\x01cd"),
        ("d", "x\x85y"), ("d", "\ufffe"), ("d", "a\udcffb"), ("d", "\ufdd0"), ("d", "x" * 129),
    ]  # fmt: skip
    for device, session in bad:
        with pytest.raises(ConfigError, match="choose another id"):
            chunk_topic("gazeguard/v1", device, session)
    assert chunk_topic("gazeguard/v1", "hmd-7", "Zoë's session 2") == (
        "gazeguard/v1/hmd-7/Zoë's session 2/chunks"
    )
    for prefix in ["", "/abs", "trail/", "wild/+", "wild/#", "a//b", "a/\x00"]:
        with pytest.raises(ConfigError, match=r"broker\.topic_prefix"):
            status_topic(prefix, "d", "s")
