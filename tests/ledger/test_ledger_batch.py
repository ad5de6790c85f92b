"""Group commit (``Ledger.charge_many``) on real SQLite ledger files: each charge exactly once,
in order, every per-charge check kept, a refused charge never rolling back the others."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gazeguard.core.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import (
    Charge,
    ChargeRequest,
    DuplicateChargeError,
    Ledger,
    StaleStateError,
    pure_cost,
)

EPS = {"fix_rate": 0.25, "sacc_amp": 0.25}  # 0.5 per chunk


def req(session: str, i: int, **kw: object) -> ChargeRequest:
    topic = f"gazeguard/v1/dev/{session}/chunks"
    return ChargeRequest(session, i, pure_cost(EPS), topic, f"{session}:{i}".encode(), **kw)  # type: ignore[arg-type]


def snapshot(ledger: Ledger) -> dict[str, object]:
    """Everything the ledger says about its sessions, but wall-clock times and outbox ids."""
    out: dict[str, object] = {}
    for s in ledger.sessions():
        st_ = ledger.state(s)
        out[s] = (
            [(c.chunk_index, c.epsilon, c.gaze_start, c.gaze_end) for c in ledger.charges(s)],
            [(w[0], w[1]) for w in ledger.withheld(s)],
            (st_.spent, st_.chunks, st_.withheld, st_.remaining, st_.last_chunk, st_.version),
        )
    out["pending"] = [(p.session, p.chunk_index, p.payload) for p in ledger.pending()]
    return out


def test_group_charges_each_once_in_order_with_the_states_of_sequential_charges(
    tmp_path: Path,
) -> None:
    with Ledger(tmp_path / "a.sqlite", session_cap=10.0, composition="sequential") as ledger:
        requests = [req("a", 0), req("b", 0), req("c", 0), req("a", 1), req("b", 1)]
        results = ledger.charge_many(requests)
        assert all(isinstance(r, Charge) for r in results)
        charges = [r for r in results if isinstance(r, Charge)]
        assert [(c.session, c.chunk_index) for c in charges] == [
            (r.session, r.chunk_index) for r in requests
        ]
        assert [c.state.spent for c in charges] == [0.5, 0.5, 0.5, 1.0, 1.0]
        ids = [c.outbox_id for c in charges]
        assert ids == sorted(ids)  # the outbox keeps the group's order
        assert [(p.session, p.chunk_index, p.payload) for p in ledger.pending()] == [
            (r.session, r.chunk_index, r.payload) for r in requests
        ]
        assert ledger.verify() == []
        # the same group again: every one is a duplicate, nothing changes
        before = snapshot(ledger)
        again = ledger.charge_many(requests)
        assert all(isinstance(r, DuplicateChargeError) for r in again)
        assert snapshot(ledger) == before


def test_a_cap_hit_in_the_middle_withholds_exactly_the_refused_charges(tmp_path: Path) -> None:
    with Ledger(tmp_path / "a.sqlite", session_cap=1.0, composition="sequential") as ledger:
        ledger.charge("a", 0, pure_cost(EPS), "t", b"a0")  # a has 0.5 of 1.0 left
        requests = [req("b", 0), req("a", 1), req("a", 2), req("b", 1), req("c", 0)]
        results = ledger.charge_many(requests)
        kinds = [type(r).__name__ for r in results]
        assert kinds == ["Charge", "Charge", "BudgetExhaustedError", "Charge", "Charge"]
        assert [c.chunk_index for c in ledger.charges("a")] == [0, 1]
        assert [c.chunk_index for c in ledger.charges("b")] == [0, 1]
        assert ledger.state("a").spent == 1.0
        assert [(p.session, p.chunk_index) for p in ledger.pending()] == [
            ("a", 0), ("b", 0), ("a", 1), ("b", 1), ("c", 0),
        ]  # fmt: skip
        assert ledger.verify() == []


def test_a_duplicate_a_stale_version_and_bad_arguments_inside_a_group(tmp_path: Path) -> None:
    with Ledger(tmp_path / "a.sqlite", session_cap=10.0, composition="sequential") as ledger:
        ledger.charge("a", 0, pure_cost(EPS), "t", b"a0")
        version = ledger.preview("b", pure_cost(EPS)).version
        requests = [
            req("b", 0, version=version),
            req("a", 0),  # charged before
            req("b", 1, version=version),  # previewed before b:0 was charged: stale
            ChargeRequest("c", -1, pure_cost(EPS), "t", b"x"),  # bad index
            ChargeRequest("c", 0, pure_cost(EPS), "t", "not bytes"),  # type: ignore[arg-type]
            req("c", 0),
            req("c", 0),  # twice in one group
        ]
        results = ledger.charge_many(requests)
        assert isinstance(results[0], Charge)
        assert isinstance(results[1], DuplicateChargeError)
        assert isinstance(results[2], StaleStateError)
        assert isinstance(results[3], ConfigError)
        assert isinstance(results[4], TypeError)
        assert isinstance(results[5], Charge)
        assert isinstance(results[6], DuplicateChargeError)
        assert [c.chunk_index for c in ledger.charges("b")] == [0]
        assert [c.chunk_index for c in ledger.charges("c")] == [0]
        assert len(ledger.pending()) == 3
        assert ledger.verify() == []


def test_a_refused_new_session_leaves_no_row_behind(tmp_path: Path) -> None:
    with Ledger(tmp_path / "a.sqlite", session_cap=0.4, composition="sequential") as ledger:
        results = ledger.charge_many([req("big", 0), req("ok", 0, gaze=None)])
        assert isinstance(results[0], BudgetExhaustedError)
        assert isinstance(results[1], BudgetExhaustedError)
        assert ledger.sessions() == []  # rolled back to each request's savepoint
        assert ledger.charge_many([]) == []


# A request: (session, chunk index, pure ε of each of its two features).
Request = tuple[str, int, float]
requests_st = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(0, 4), st.sampled_from([0.25, 0.5, 1.0])),
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_st, st.integers(1, 5))
def test_property_a_group_equals_the_same_charges_one_by_one(
    items: list[Request], groups: int
) -> None:
    """Split into ``groups`` consecutive groups, charge_many leaves the ledger exactly as the
    same charges one by one (refusals included: a cap, duplicates)."""
    with tempfile.TemporaryDirectory() as tmp:
        kw = {"session_cap": 3.0, "composition": "sequential"}
        with (
            Ledger(Path(tmp) / "one.sqlite", **kw) as one,  # type: ignore[arg-type]
            Ledger(Path(tmp) / "many.sqlite", **kw) as many,  # type: ignore[arg-type]
        ):
            requests = [
                ChargeRequest(
                    s, i, pure_cost({"f": e, "g": e}), "t", f"{s}{i}".encode(), gaze=(i, i + 1)
                )
                for s, i, e in items
            ]
            expected: list[str] = []
            for r in requests:
                try:
                    one.charge(
                        r.session,
                        r.chunk_index,
                        r.cost,
                        r.topic,
                        r.payload,
                        gaze=r.gaze,
                    )
                    expected.append("Charge")
                except (BudgetExhaustedError, DuplicateChargeError) as exc:
                    expected.append(type(exc).__name__)
            got: list[str] = []
            size = max(1, -(-len(requests) // groups))
            for at in range(0, len(requests), size):
                got += [type(r).__name__ for r in many.charge_many(requests[at : at + size])]
            assert got == expected
            assert snapshot(many) == snapshot(one)
            assert many.verify() == []


def test_pipelines_release_group_equals_release_one_by_one(tmp_path: Path) -> None:
    """``release_group`` over several sessions (two chunks of one session in the group, a cap
    hit in the middle) charges and withholds exactly what ``Pipeline.release`` one by one
    does, with the same values and ledger figures (seeded noise): the same bytes published
    and the same charges, bit for bit."""
    from gazeguard.config import MechanismSettings  # noqa: PLC0415
    from gazeguard.runtime.pipeline import Pipeline, release_group  # noqa: PLC0415
    from gazeguard.runtime.simulate import simulate_gaze  # noqa: PLC0415

    mech = MechanismSettings(epsilon=0.02, insecure_seed=7)  # 0.96 pure per chunk
    outcomes = []
    for mode in ("one", "group"):
        path = tmp_path / f"{mode}.sqlite"
        with Ledger(path, session_cap=0.9) as ledger:  # 2 chunks: 0.55, 0.80, 1.00
            pipes = [
                Pipeline(
                    ledger,
                    session=f"s{k}",
                    device="d",
                    rate_hz=120.0,
                    mechanism=mech,
                    clock_offset_s=1.7e9,  # one clock for both runs: the same Unix times
                )
                for k in range(3)
            ]
            jobs = []
            for k, pipe in enumerate(pipes):
                gaze = simulate_gaze(30 + 16 * (k + 1) + 1, 120.0, 100 + k)
                jobs += [(pipe, c) for c in pipe.feed(gaze)]
            assert len({p.session for p, _ in jobs}) == 3
            assert len(jobs) == 6
            if mode == "one":
                released = [pipe.release(c) for pipe, c in jobs]
            else:
                released = release_group(jobs)
            outcomes.append(
                (
                    [
                        None
                        if r is None
                        else (r.session, r.chunk_index, r.message.values, r.message.ledger)
                        for r in released
                    ],
                    {p.session: (p.stats.released, p.stats.withheld) for p in pipes},
                    {s: [w[0] for w in ledger.withheld(s)] for s in ledger.sessions()},
                    # what is published: the outbox's bytes, as charged
                    sorted(
                        (p.session, p.chunk_index, p.topic, p.payload) for p in ledger.pending()
                    ),
                    # what is charged: each release's index, ε and gaze span
                    {
                        s: [
                            (c.chunk_index, c.total, c.epsilon, c.gaze_start, c.gaze_end)
                            for c in ledger.charges(s)
                        ]
                        for s in ledger.sessions()
                    },
                )
            )
            assert ledger.verify() == []
    assert outcomes[0] == outcomes[1]
    assert len(outcomes[0][3]) == sum(r is not None for r in outcomes[0][0])
    assert any(r is None for r in outcomes[0][0])  # the cap withheld some
    assert any(r is not None for r in outcomes[0][0])


def test_a_groups_sessions_draw_independent_noise(tmp_path: Path) -> None:
    """The same chunk in 40 sessions, released in one group with the secure source: every
    session's release differs, and the noise of two sessions is uncorrelated (the mean |r|
    between two sessions' errors over the features is that of independent draws, ~0.12, where
    any shared part of the draw would raise it)."""
    from gazeguard.config import MechanismSettings  # noqa: PLC0415
    from gazeguard.core.chunking import Chunk  # noqa: PLC0415
    from gazeguard.runtime.pipeline import Pipeline, release_group  # noqa: PLC0415
    from gazeguard.signal.features import FEATURES  # noqa: PLC0415

    mech = MechanismSettings(epsilon=1.0)
    rng = np.random.default_rng(3)
    values = rng.uniform(0.0, 1.0, (len(FEATURES), 32))
    stamps = 1000.0 + 0.5 * np.arange(32)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipes = [
            Pipeline(ledger, session=f"s{k}", device="d", rate_hz=120.0, mechanism=mech)
            for k in range(40)
        ]
        out = release_group([(p, Chunk(0, values.copy(), stamps)) for p in pipes])
    # a chunk's information is each feature's ramp end: (sessions, features)
    released = np.stack([np.asarray(r.message.values, dtype=float)[:, -1] for r in out if r])
    assert len(released) == 40
    assert len({row.tobytes() for row in released}) == 40
    errors = released - released.mean(axis=0)
    errors = errors[:, np.ptp(released, axis=0) > 0]  # features the bounds did not pin
    assert errors.shape[1] >= 20
    errors /= errors.std(axis=0)  # each feature's noise on one scale
    r = np.corrcoef(errors)[np.triu_indices(40, k=1)]
    assert np.abs(r).mean() < 0.3, np.abs(r).mean()
