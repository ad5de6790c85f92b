"""End to end, only the releases depend on the gaze: a stream and its neighbour, every published
byte compared.

The harness runs the sidecar's real path on a gaze stream — raw LSL rows → normalizer and
sample order (the shipped ingest defaults) → :class:`Pipeline` on the public clock (opened at a
public time, queued blocks, :meth:`Pipeline.advance` every second of the stream's clock, closed
at a public time) → chunks and private labels charged to a real SQLite ledger → their message
payloads, and the retained status at every tick — with the noise seeded
(``mechanism.insecure_seed``), once on the stream and once on a neighbour: one sample removed,
added or changed at an adversarial place, or a stretch changed. It then asserts what the egress
contract promises:

- the same releases, at the same indices, in both runs (the schedule is the clock's);
- every chunk and label message byte-identical, except at most the plan's declared reach of
  them (per raw sample, or for a changed stretch of ``d`` seconds what the plan counts for it);
- every status message identical (the time of day aside: the public clock).

The streams: a simulated person with a 100 s pause in the middle (always), and, when
``../shared/data`` is present, real recordings: GazeGraph (desktop, Pupil Core, 30 Hz) and a
slice of MPIIDPEye (reading in VR, Pupil Labs in an HTC Vive, about 30 Hz with its real jitter
and confidence dips; the dataset of Bozkir et al.'s tables) read by the shipped ``mpiidpeye``
reader. Where a recording is absent the test is skipped, naming the path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gazeguard.config import IngestSettings, Settings
from gazeguard.core.samples import GazeSamples
from gazeguard.ledger import Ledger
from gazeguard.plan import ReleasePlan
from gazeguard.privacy.accounting import releases_within
from gazeguard.runtime.fleet import CohortWiring
from gazeguard.runtime.pipeline import Pipeline
from gazeguard.runtime.presets import Normalizer, StreamMeta, build_layout
from gazeguard.runtime.simulate import simulate_gaze

T0 = 50_000.0  # where the streams sit on the stream's clock, s
TICK_S = 1.0  # the public clock's tick: blocks pulled and windows released once a tick
PAUSE_S = 100.0


def plan_settings(mechanism: str = "lpa") -> Settings:
    """The shipped defaults with private labels on, the noise seeded (the harness compares
    bytes: the same draws in both runs) and a budget so large that the noise is small beside
    the features' ranges: at the default budget nearly every released value sits at a bound
    whatever the gaze, and a difference could hide there. LPA releases every value of a chunk
    (DCFPA with one coefficient, the default, releases its net change), so nothing a sample
    changed can hide in a value the mechanism leaves out."""
    return Settings.model_validate(
        {
            "labels": {"enabled": True},
            "mechanism": {"name": mechanism, "insecure_seed": 7},
            "ledger": {"budget_per_hour": 100_000.0},
            "fleet": {"enabled": True},
            "cohort": {"enabled": True, "name": "lab", "budget_share": 0.3},
        }
    )


@dataclasses.dataclass(frozen=True)
class Stream:
    """A gaze stream on the stream's clock and the public facts around it."""

    samples: GazeSamples
    rate_hz: float
    opens: float  # the session's declared open, s
    closes: float  # its close, s

    def rows(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The raw LSL rows of preset ``gazeguard`` (index, x, y, pupil, validity) and their
        timestamps."""
        s = self.samples
        n = len(s)
        rows = np.column_stack(
            [np.arange(n, dtype=float), s.x_deg, s.y_deg, s.pupil_mm, s.valid.astype(float)]
        )
        return rows, s.timestamps


@dataclasses.dataclass
class Published:
    """What one run put on the broker: every payload the ledger's outbox holds for the broker,
    in order, as ``(topic, index, payload)``, and the status after every tick."""

    messages: list[tuple[str, int, bytes]]
    statuses: list[str]

    def kind(self, kind: str) -> dict[tuple[str, int], bytes]:
        """The payloads of one kind (``chunks``, ``labels``, ``receipts``, ``cohort``)."""
        return {(t, i): p for t, i, p in self.messages if kind_of(t) == kind}


def kind_of(topic: str) -> str:
    """What a topic carries: a session's chunks, labels or cohort receipts, or a cohort's
    aggregate (every other topic)."""
    last = topic.rsplit("/", 1)[-1]
    return {"chunks": "chunks", "labels": "labels", "cohort": "receipts"}.get(last, "cohort")


def fresh_plan(settings: Settings) -> ReleasePlan:
    """The plan of ``settings``, built anew: its seeded noise starts from the seed (the plans
    :meth:`ReleasePlan.from_settings` keeps would go on drawing where the last run stopped)."""
    return ReleasePlan.build(
        features=settings.features, mechanism=settings.mechanism,
        budget=settings.ledger.budget_per_hour, delta=settings.ledger.delta,
        session_cap=settings.ledger.session_cap, labels=settings.labels, cohort=settings.cohort,
        ingest=settings.ingest,
    )  # fmt: skip


def run(stream: Stream, tmp: Path, name: str) -> Published:
    """The real path on ``stream`` (module docstring); every message it published."""
    settings = plan_settings()
    plan = fresh_plan(settings)
    meta = StreamMeta(
        "gazeguard-sim", "Gaze", "harness", stream.rate_hz, 5, manufacturer="gazeguard"
    )
    ingest = IngestSettings()  # the shipped ingest defaults (dejitter among them)
    norm = Normalizer(
        build_layout(meta, ingest), nominal_rate_hz=stream.rate_hz, future_tolerance_s=None,
        dejitter=ingest.dejitter,
    )  # fmt: skip
    rows, ts = stream.rows()
    out = Published([], [])
    offset = 1.7e9 - T0  # Unix time minus the stream's clock
    with Ledger(tmp / f"{name}.sqlite", "NORMAL", caps=plan.ledger_caps(settings.ledger)) as ledger:
        pipe = Pipeline(
            ledger, session="s", device="d", rate_hz=stream.rate_hz, plan=plan,
            clock_offset_s=offset, opens_at=stream.opens,
        )  # fmt: skip
        cohort = CohortWiring.build(settings, plan, ledger, "w", "gazeguard/v1")
        cohort.aggregator.open_session("d", "s", stream.opens + offset)  # the declared open
        pipe.on_features = cohort.observer("d", "s", pipe)
        pipe.on_samples = cohort.gaze_observer("d", "s", pipe)
        done = 0
        for tick in np.arange(stream.opens + TICK_S, stream.closes + TICK_S, TICK_S):
            now = min(float(tick), stream.closes)
            upto = int(np.searchsorted(ts, now))
            if upto > done:
                block = norm(rows[done:upto], ts[done:upto], now)
                if block is not None:
                    pipe.queue(block)
                done = upto
            pipe.advance(now - ingest.late_after_s)
            pipe.take_labels()
            cohort.aggregator.release_due(now + offset)
            status = pipe.status().model_dump(mode="json", exclude={"time"})
            out.statuses.append(repr(sorted(status.items())))
        pipe.close()
        cohort.aggregator.close_session("d", "s", stream.closes + offset)
        cohort.aggregator.release_due(stream.closes + offset + 3600)
        out.messages = [(m.topic, m.chunk_index, m.payload) for m in ledger.pending()]
    return out


def compare(a: Published, b: Published, allowed: dict[str, int]) -> dict[str, int]:
    """Assert the egress contract between two runs; return how many messages of each kind
    differ (``allowed``: the most the plan declares, per kind)."""
    schedule = [(t, i) for t, i, _ in a.messages]
    assert schedule == [(t, i) for t, i, _ in b.messages], "the schedule depends on the samples"
    assert a.statuses == b.statuses, "a status message depends on the samples"
    differ = {}
    for kind, most in allowed.items():
        x, y = a.kind(kind), b.kind(kind)
        differ[kind] = sum(x[k] != y[k] for k in x)
        assert differ[kind] <= most, f"{differ[kind]} {kind} differ; the plan declares {most}"
    return differ


def reach(plan: ReleasePlan, stretch_s: float = 0.0) -> dict[str, int]:
    """The messages of each kind one sample (or a changed stretch of ``stretch_s``) can change,
    as the plan counts them: receipts state only what was paid (none)."""
    out = {"receipts": 0}
    for kind, r in (("chunks", plan.chunks), ("labels", plan.labels), ("cohort", plan.cohort)):
        assert r is not None
        if stretch_s == 0:
            out[kind] = r.per_sample
        else:
            span = Fraction(repr(stretch_s)) + plan.reach.span_s + r.summary_s
            out[kind] = releases_within(span, r.period_s)
    return out


# -- the streams ----------------------------------------------------------------------------
def simulated(seconds: float = 480.0, rate: float = 60.0) -> Stream:
    """A simulated person at ``rate`` with a 100 s pause in the middle."""
    g = simulate_gaze(seconds, rate, seed=5)
    half = len(g) // 2
    t = T0 + g.timestamps + np.where(np.arange(len(g)) >= half, PAUSE_S, 0.0)
    s = GazeSamples(t, g.x_deg, g.y_deg, g.pupil_mm, g.valid)
    return Stream(s, rate, opens=T0 - 2.3, closes=float(t[-1]) + 5.7)


def recorded(shared: Path) -> Stream:
    """Two GazeGraph recordings (30 Hz, one person) with a 100 s pause between them."""
    from gazeguard.offline.eval.datasets import GazeGraph  # noqa: PLC0415 - eval extra

    recs = list(GazeGraph(shared / "gazegraph_desktop_activity").recordings())[:2]
    parts = []
    at = T0
    for r in recs:
        s = r.samples
        parts.append(GazeSamples(at + s.timestamps - s.timestamps[0], s.x_deg, s.y_deg,
                                 s.pupil_mm, s.valid))  # fmt: skip
        at = float(parts[-1].timestamps[-1]) + PAUSE_S
    return Stream(GazeSamples.concat(parts), 30.0, opens=T0 - 1.1, closes=at - PAUSE_S + 4.2)


#: One MPIIDPEye recording: person 1 reading the comic in VR (19,125 samples, 10.6 min).
MPIIDPEYE_RECORDING = Path("mpiidpeye_vr_reading") / "Data_P1_R1.csv"


def reading_in_vr(shared: Path, seconds: float = 210.0) -> Stream:
    """The first ``2 × seconds`` of gaze of :data:`MPIIDPEYE_RECORDING`, read by the shipped
    ``mpiidpeye`` reader (30 Hz declared, confidence below 0.6 invalid, eye-camera positions
    turned into degrees), with a 100 s pause cut in half-way: the second half is shifted 100 s
    later. Long enough for the harness's places (a decision edge three label periods after the
    first window) and short enough for seconds per run. Skipped, naming the file, where absent."""
    from gazeguard.offline.recordings import ReadOptions, read_recording  # noqa: PLC0415

    path = shared / MPIIDPEYE_RECORDING
    if not path.is_file():
        pytest.skip(
            f"MPIIDPEye recording not found at {path} (../shared/data/mpiidpeye_vr_reading)"
        )
    rec = read_recording(path, ReadOptions(format="mpiidpeye"))
    g = rec.samples
    t = g.timestamps - g.timestamps[0]
    k = t < 2 * seconds
    ts = T0 + t[k] + np.where(t[k] >= seconds, PAUSE_S, 0.0)
    s = GazeSamples(ts, g.x_deg[k], g.y_deg[k], g.pupil_mm[k], g.valid[k])
    assert rec.rate_hz is not None
    return Stream(s, rec.rate_hz, opens=T0 - 0.9, closes=float(ts[-1]) + 3.1)


# -- neighbours -----------------------------------------------------------------------------
def without(s: Stream, i: int) -> Stream:
    g = s.samples
    k = np.arange(len(g)) != i
    kept = GazeSamples(g.timestamps[k], g.x_deg[k], g.y_deg[k], g.pupil_mm[k], g.valid[k])
    return dataclasses.replace(s, samples=kept)


def with_sample(s: Stream, t: float, x: float = 3.0, y: float = -2.0, valid: bool = True) -> Stream:
    g = s.samples
    i = int(np.searchsorted(g.timestamps, t))
    if i < len(g) and g.timestamps[i] == t:
        t = float(np.nextafter(t, np.inf))
        i += 1
    ins = lambda a, v: np.insert(a, i, v)  # noqa: E731
    return dataclasses.replace(s, samples=GazeSamples(
        ins(g.timestamps, t), ins(g.x_deg, x if valid else np.nan),
        ins(g.y_deg, y if valid else np.nan), ins(g.pupil_mm, 4.0 if valid else np.nan),
        ins(g.valid, valid)))  # fmt: skip


def changed(s: Stream, i: int, dx: float = 6.0, valid: bool | None = None) -> Stream:
    g = s.samples
    x, y, p, v = g.x_deg.copy(), g.y_deg.copy(), g.pupil_mm.copy(), g.valid.copy()
    if valid is None:
        x[i] += dx
        p[i] += 1.0
    else:
        v[i] = valid
        x[i] = y[i] = np.nan if not valid else 1.0
        if valid:
            p[i] = 4.0
    return dataclasses.replace(s, samples=GazeSamples(g.timestamps, x, y, p, v))


def stretch(s: Stream, start_s: float, seconds: float) -> Stream:
    """The gaze between ``start_s`` and ``start_s + seconds`` (stream time) replaced by another
    person's."""
    g = s.samples
    other = simulate_gaze(seconds + 1.0, s.rate_hz, seed=99)
    sel = (g.timestamps >= start_s) & (g.timestamps < start_s + seconds)
    k = int(sel.sum())
    x, y, p, v = g.x_deg.copy(), g.y_deg.copy(), g.pupil_mm.copy(), g.valid.copy()
    x[sel], y[sel] = other.x_deg[:k], other.y_deg[:k]
    p[sel], v[sel] = other.pupil_mm[:k], other.valid[:k]
    return dataclasses.replace(s, samples=GazeSamples(g.timestamps, x, y, p, v))


def adversarial(s: Stream, plan: ReleasePlan) -> Iterator[tuple[str, Stream]]:
    """The named single-sample neighbours at the places that used to leak."""
    t = s.samples.timestamps
    gaps = np.flatnonzero(np.diff(t) > 10.0)
    before, after = int(gaps[0]), int(gaps[0]) + 1
    grid = plan.grid_s
    start = np.ceil(s.opens / grid) * grid
    w = plan.features.window_s
    chunk_edge = start + w + 5 * plan.chunks.period_s  # a chunk's end step
    decision = start + w + 3 * plan.labels.period_s if plan.labels else chunk_edge
    near = lambda at: int(np.clip(np.searchsorted(t, at), 0, len(t) - 1))  # noqa: E731
    valid = s.samples.valid
    long_run = near(t[0] + 0.3 * (t[before] - t[0]))
    yield "first sample removed", without(s, 0)
    yield "last sample removed", without(s, len(t) - 1)
    yield "a sample added in the pause", with_sample(s, float((t[before] + t[after]) / 2))
    yield "a sample added just after the pause starts", with_sample(s, float(t[before]) + 0.4)
    yield "the last sample before the pause removed", without(s, before)
    yield "the first sample after the pause removed", without(s, after)
    yield "a sample moved inside an event", changed(s, long_run)
    yield "a sample at a chunk edge changed", changed(s, near(chunk_edge))
    yield "a sample at a decision edge removed", without(s, near(decision))
    yield (
        "a valid sample made invalid",
        changed(s, int(np.flatnonzero(valid)[len(t) // 3]), valid=False),
    )
    yield "a sample added before the first", with_sample(s, float(t[0]) - 0.5)


@pytest.fixture(scope="module")
def sim() -> Stream:
    return simulated()


@pytest.fixture(scope="module")
def sim_published(sim: Stream, tmp_path_factory: pytest.TempPathFactory) -> Published:
    return run(sim, tmp_path_factory.mktemp("base"), "base")


@pytest.mark.slow
@pytest.mark.parametrize("case", range(11))
def test_one_sample_changes_at_most_the_declared_reach(
    case: int, sim: Stream, sim_published: Published, tmp_path: Path
) -> None:
    plan = fresh_plan(plan_settings())
    name, neighbour = list(adversarial(sim, plan))[case]
    differ = compare(sim_published, run(neighbour, tmp_path, "n"), reach(plan))
    assert len(sim_published.kind("chunks")) > 20  # the stream is long enough to mean something
    assert sim_published.kind("cohort")
    assert sim_published.kind("labels")
    print(f"{name}: differ {differ}")


@pytest.mark.slow
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    where=st.floats(0.0, 1.0),
    how=st.sampled_from(["remove", "add", "change", "invalid"]),
)
def test_a_sample_anywhere_changes_at_most_the_declared_reach(
    where: float,
    how: str,
    sim: Stream,
    sim_published: Published,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    plan = fresh_plan(plan_settings())
    t = sim.samples.timestamps
    i = min(int(where * len(t)), len(t) - 1)
    neighbour: Callable[[], Stream] = {
        "remove": lambda: without(sim, i),
        "add": lambda: with_sample(sim, float(t[0] + where * (t[-1] - t[0])) + 1e-4),
        "change": lambda: changed(sim, i),
        "invalid": lambda: changed(sim, i, valid=False),
    }[how]
    compare(sim_published, run(neighbour(), tmp_path_factory.mktemp("n"), "n"), reach(plan))


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [20.0, 150.0])
def test_a_changed_stretch_changes_at_most_what_the_plan_counts_for_it(
    seconds: float, sim: Stream, sim_published: Published, tmp_path: Path
) -> None:
    plan = fresh_plan(plan_settings())
    t = sim.samples.timestamps
    neighbour = stretch(sim, float(t[0]) + 37.3, seconds)
    differ = compare(sim_published, run(neighbour, tmp_path, "n"), reach(plan, seconds))
    assert differ["chunks"] > 0  # the stretch really changed releases


@pytest.mark.slow
@pytest.mark.data
def test_a_real_recording_and_its_neighbours(shared_data: Path, tmp_path: Path) -> None:
    plan = fresh_plan(plan_settings())
    stream = recorded(shared_data)
    base = run(stream, tmp_path, "base")
    assert len(base.kind("chunks")) > 30
    for k, (name, neighbour) in enumerate(adversarial(stream, plan)):
        differ = compare(base, run(neighbour, tmp_path, f"n{k}"), reach(plan))
        print(f"{name}: differ {differ}")


@pytest.mark.slow
@pytest.mark.data
def test_a_vr_reading_recording_and_its_neighbours(shared_data: Path, tmp_path: Path) -> None:
    """The harness on the paper's own data: a slice of one MPIIDPEye recording, its eleven
    adversarial neighbours and a 20 s stretch of it changed."""
    plan = fresh_plan(plan_settings())
    stream = reading_in_vr(shared_data)
    assert 0 < int((~stream.samples.valid).sum()) < len(stream.samples)  # real confidence dips
    base = run(stream, tmp_path, "base")
    assert len(base.kind("chunks")) > 20
    assert base.kind("labels")
    assert base.kind("cohort")
    for k, (name, neighbour) in enumerate(adversarial(stream, plan)):
        differ = compare(base, run(neighbour, tmp_path, f"n{k}"), reach(plan))
        print(f"{name}: differ {differ}")
    t = stream.samples.timestamps
    changed_20s = stretch(stream, float(t[0]) + 37.3, 20.0)
    differ = compare(base, run(changed_20s, tmp_path, "stretch"), reach(plan, 20.0))
    assert differ["chunks"] > 0  # the releases do depend on this gaze
