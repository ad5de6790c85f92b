"""Attention in the cohort release (`gazeguard.signal.attention`, issue 33): a session's dwell
blocks
are bounded whatever the gaze, the AOI file's mistakes are named, the consumer's choice of what
the cohort releases sets Δ2 and σ as the plan says, a bucket's attention is charged to every
contributor (real SQLite) before it is enqueued, and a real `gazeguard run --fleet --cohort`
publishes schema-valid attention messages over a real Mosquitto."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gazeguard.config import CohortSettings, load_settings
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import Ledger
from gazeguard.plan import ReleasePlan
from gazeguard.plan.cohort import ATTENTION_STREAM, STREAM
from gazeguard.privacy.accounting import compose
from gazeguard.runtime.cohort import CohortAggregator
from gazeguard.runtime.simulate import SimulatedHeadset, simulate_scene_gaze
from gazeguard.signal.attention import (
    Aoi,
    AoiSet,
    AttentionGrid,
    AttentionLayout,
    load_aois,
    parse_aois,
    shares,
)
from gazeguard.wire.cohort import AttentionMessage
from gazeguard.wire.kinds import ATTENTION
from tests.conftest import MosquittoBroker, Subscriber
from tests.runtime.test_dashboard import Proc, cohort_worker, wait_for

DEMO = Path(__file__).resolve().parents[2] / "gazeguard/data/attention/demo_aois.json"
SQUARE = Aoi("a", ((0.0, 0.0), (4.0, 0.0), (4.0, 4.0), (0.0, 4.0)))
TRIANGLE = Aoi("b", ((2.0, 2.0), (10.0, 2.0), (2.0, 10.0)))

gaze = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=200, deadline=None)
@given(
    xy=arrays(np.float64, st.tuples(st.integers(0, 300), st.just(2)), elements=gaze),
    valid=st.lists(st.booleans(), min_size=0, max_size=300),
    rows=st.integers(1, 12),
    cols=st.integers(1, 20),
    fov=st.tuples(st.floats(0.5, 180.0), st.floats(0.5, 180.0)),
    with_aois=st.booleans(),
    cut=st.integers(0, 300),
)
def test_a_sessions_attention_is_bounded_whatever_the_gaze(
    xy: np.ndarray,
    valid: list[bool],
    rows: int,
    cols: int,
    fov: tuple[float, float],
    with_aois: bool,
    cut: int,
) -> None:
    """Each block is a probability vector or zero (L2 ≤ 1), the whole ≤ √blocks, whatever the
    gaze (NaN, ±inf, far off the field, invalid); tallies of a split block add up."""
    n = len(xy)
    v = np.resize(np.array(valid or [True]), n).astype(bool)
    layout = AttentionLayout(
        AttentionGrid(rows, cols, *fov), AoiSet((SQUARE, TRIANGLE)) if with_aois else None
    )
    tally = layout.tally(xy[:, 0], xy[:, 1], v)
    c = min(cut, n)
    split = layout.tally(xy[:c, 0], xy[:c, 1], v[:c]) + layout.tally(xy[c:, 0], xy[c:, 1], v[c:])
    assert np.array_equal(tally, split)
    assert layout.valid_samples(tally) == int((v & np.isfinite(xy).all(axis=1)).sum())
    block = layout.contribution(tally)
    assert block.shape == (layout.dimension,)
    assert np.all(np.isfinite(block))
    assert np.all(block >= 0)
    grid, aoi = block[: rows * cols], block[rows * cols :]
    for part in (grid, aoi):
        assert np.linalg.norm(part) <= 1.0
        assert part.sum() <= 1.0
    assert np.linalg.norm(block) <= math.sqrt(layout.blocks)
    if with_aois and layout.valid_samples(tally):
        assert aoi.sum() == pytest.approx(1.0)  # every valid sample is in an AOI or elsewhere


def test_the_grid_and_the_aois_place_gaze_as_documented() -> None:
    grid = AttentionGrid(rows=3, cols=4, width_deg=8.0, height_deg=6.0)  # 2° cells
    x = np.array([-3.9, 3.9, -3.9, 0.0, 4.0, 0.0, np.nan])
    y = np.array([2.9, 2.9, -2.9, 0.0, 0.0, 3.0, 0.0])
    # top-left, top-right, bottom-left, centre (row 1 col 2), right edge (off), top edge (in)
    assert grid.cell_of(x, y).tolist() == [0, 3, 8, 6, -1, 2, -1]
    aois = AoiSet((SQUARE, TRIANGLE))
    px = np.array([1.0, 3.0, 5.0, 9.0, 2.5, np.inf])
    py = np.array([1.0, 3.0, 3.0, 9.0, 7.0, 0.0])
    # (3, 3) is in both: the first wins; (9, 9) in neither; (2.5, 7) in the triangle
    assert aois.assign(px, py).tolist() == [0, 0, 1, 2, 1, -1]


def test_the_demo_scene_puts_each_task_where_its_aoi_is() -> None:
    layout = AttentionLayout(None, load_aois(DEMO))
    for task, aoi in (("reading", "text"), ("watching", "video")):
        g = simulate_scene_gaze(60, 60, seed=7, task=task)
        block = layout.contribution(layout.tally(g.x_deg, g.y_deg, g.valid))
        names = [*layout.aois.names, "elsewhere"]  # type: ignore[union-attr]
        assert names[int(np.argmax(block[:-1]))] == aoi, (task, block)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], r"must be a JSON object"),
        ({"aois": []}, r"'aois' must be a non-empty list"),
        ({"aois": [{"rect": [0, 0, 1, 1]}]}, r"\(aois\[0\]\): 'name' must be a non-empty"),
        (
            {"aois": [{"name": "x", "rect": [0, 0, 1]}]},
            r"\(aois\[0\] 'x'\): 'rect' must be \[x_min, y_min, x_max, y_max\]",
        ),
        (
            {"aois": [{"name": "x", "rect": [2, 0, 1, 1]}]},
            r"\(aois\[0\] 'x'\): 'rect' \[2, 0, 1, 1\] needs x_min < x_max",
        ),
        (
            {"aois": [{"name": "x", "polygon": [[0, 0], [1, 1]]}]},
            r"'polygon' must list 3 to 256",
        ),
        (
            {"aois": [{"name": "x", "polygon": [[0, 0], [1, 1], [2, 2]]}]},
            r"\(aois\[0\] 'x'\): 'polygon' encloses no area",
        ),
        (
            {"aois": [{"name": "x", "polygon": [[0, 0], [1, "a"], [2, 0]]}]},
            r"\(aois\[0\] 'x' vertex 1\): a vertex must be \[x, y\]",
        ),
        (
            {"aois": [{"name": "x", "rect": [0, 0, 1e9, 1]}]},
            r"must be finite degrees within ±360",
        ),
        (
            {"aois": [{"name": "x", "rect": [0, 0, 1, 1], "polygon": [[0, 0], [1, 0], [0, 1]]}]},
            r"give exactly one of 'rect' or 'polygon'",
        ),
        ({"aois": [{"name": "x", "circle": 1}]}, r"unknown key\(s\) 'circle'"),
        (
            {"aois": [{"name": "x", "rect": [0, 0, 1, 1]}, {"name": "x", "rect": [0, 0, 2, 2]}]},
            r"\(aois\[1\]\): the name 'x' appears twice",
        ),
        ({"aois": [{"name": "elsewhere", "rect": [0, 0, 1, 1]}]}, r"'elsewhere' is reserved"),
        ({"frame": "pixels", "aois": [{"name": "x", "rect": [0, 0, 1, 1]}]}, r"frame 'pixels'"),
    ],
)
def test_aoi_file_mistakes_are_named(doc: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_aois(doc, "scene.json")
    assert err.value.field == "cohort.attention_aois"
    assert "AOI file scene.json" in err.value.reason


def test_aoi_files_that_cannot_be_read_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_aois(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"aois": [\n  {"name": "x",]}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"is not JSON: .* at line 2 column"):
        load_aois(bad)
    assert load_aois(DEMO).names == ("text", "video", "search")


def _plan(release: list[str] | None, budget: float = 10.0, **more: object) -> ReleasePlan:
    more.setdefault("bucket_s", 60.0)
    cohort = CohortSettings(enabled=True, release=release, **more)  # type: ignore[arg-type]
    return ReleasePlan.build(budget=budget, delta=1e-6, cohort=cohort)


@pytest.mark.slow
def test_the_consumer_choice_sets_delta2_and_sigma_as_the_plan_says() -> None:
    """Δ2 = √blocks of what is released; the cohort's budget split evenly between the parts
    (one ratio σ_p/Δ2_p, one event each); an hour of buckets composes to the cohort's share;
    the plan's figures say so."""
    plans = {
        "means": _plan(["means"]),
        "attention": _plan(["attention"]),
        "aois": _plan(["aois"], attention_aois=str(DEMO)),
        "attention+aois": _plan(["attention", "aois"], attention_aois=str(DEMO)),
        "means+attention": _plan(["means", "attention"]),
        "means+attention+aois": _plan(["means", "attention", "aois"], attention_aois=str(DEMO)),
        "default": _plan(None, model=None),  # without a label model: the means
    }
    blocks = {k: p.cohort_plan.blocks for k, p in plans.items()}  # type: ignore[union-attr]
    assert blocks == {
        "means": 2, "attention": 1, "aois": 1, "attention+aois": 2, "means+attention": 3,
        "means+attention+aois": 4, "default": 2,
    }  # fmt: skip
    for name, plan in plans.items():
        c = plan.cohort_plan
        assert c is not None
        assert c.sensitivity_l2 == pytest.approx(math.sqrt(blocks[name]))
        assert sum(p.blocks for p in c.parts) == blocks[name]
        share = 0.5 * 10.0
        assert c.epsilon_per_hour <= share * (1 + 1e-9)
        assert c.epsilon_per_hour >= share * 0.97, name
        assert plan.per_hour <= 10.0 * (1 + 1e-9)
        (event,) = {p.event for p in c.parts}  # one event: the ledger composes one kind
        assert c.events == {event: len(c.parts)}
        hour = compose({event: len(c.parts) * c.buckets_per_hour}, 1e-6).epsilon
        assert c.epsilon_per_hour == pytest.approx(hour)
        for p in c.parts:  # σ_p = r·Δ2_p (the grid's rounding only adds noise)
            assert p.sigma >= event.ratio * p.sensitivity_l2
            assert p.sigma == pytest.approx(event.ratio * p.sensitivity_l2, rel=1e-3)
        assert plan.cohort is not None
        assert dict(plan.cohort.events) == c.events
        figures = plan.figures()["cohort"]
        assert figures["blocks"] == blocks[name]
        assert figures["sensitivity_l2"] == pytest.approx(c.sensitivity_l2)
        assert {k: v["sigma"] for k, v in figures["parts"].items()} == {
            p.name: p.sigma for p in c.parts
        }
    # a heatmap-only plan has Δ2 = 1: its σ is √2 smaller than a means-only plan's; releasing
    # the means as well halves each part's budget (σ × √2 for the heatmap)
    att = plans["attention"].cohort_plan
    assert att is not None
    assert att.sensitivity_l2 == 1.0
    assert att.dimension == 144
    assert [p.name for p in att.parts] == ["attention"]
    means = plans["means"].cohort_plan
    assert means is not None
    assert means.sigma / att.sigma == pytest.approx(math.sqrt(2), rel=0.02)
    both = plans["means+attention"].cohort_plan
    assert both is not None
    assert [p.name for p in both.parts] == ["aggregates", "attention"]
    assert both.dimension == 49 + 144
    with_means = both.part("attention")
    assert with_means is not None
    assert with_means.sigma / att.sigma == pytest.approx(math.sqrt(2), rel=0.02)
    assert both.sigma / means.sigma == pytest.approx(math.sqrt(2), rel=0.02)
    # grid and AOIs in one part: Δ2 = √2, σ √2 larger than the heatmap's alone
    grid_aois = plans["attention+aois"].cohort_plan
    assert grid_aois is not None
    assert grid_aois.sigma / att.sigma == pytest.approx(math.sqrt(2), rel=0.02)
    assert "9×16 dwell heatmap" in both.text()


def test_release_settings_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ConfigError, match="'shares' needs a label model") as e:
        _plan(["shares"], model=None)
    assert e.value.field == "cohort.release"
    with pytest.raises(ConfigError, match="'aois' needs an AOI file"):
        _plan(["aois"])
    with pytest.raises(ConfigError, match="does not include 'aois'") as e:
        _plan(["attention"], attention_aois=str(DEMO))
    assert e.value.field == "cohort.attention_aois"
    with pytest.raises(ConfigError, match="needs rows >= 1"):
        _plan(["attention"], attention_grid=(0, 16))
    with pytest.raises(ConfigError, match="no such file"):
        _plan(["aois"], attention_aois="/nonexistent/aois.json")
    with pytest.raises(ValueError, match="at most once"):
        CohortSettings(release=["attention", "attention"])  # type: ignore[list-item]


def test_shares_project_onto_the_simplex_of_the_noisy_total() -> None:
    v = np.array([5.0, 1.0, -2.0, 0.5, 3.0])
    assert shares(v).tolist() == pytest.approx((np.maximum(v, 0) / 9.5).tolist())
    assert shares(v, 4.0).tolist() == pytest.approx([0.75, 0.0, 0.0, 0.0, 0.25])
    assert shares(v, 100.0).tolist() == pytest.approx(shares(v).tolist())
    assert shares(v, -1.0).tolist() == [0.0] * 5


def test_schema_file_is_current() -> None:
    assert ATTENTION.shipped_schema() == json.loads(
        json.dumps(ATTENTION.json_schema(), sort_keys=True)
    ), "attention.schema.json is stale: gazeguard schemas --write"


def _gaze(agg: CohortAggregator, n: int, t0: float, task: str = "watching") -> None:
    for i in range(n):
        g = simulate_scene_gaze(55, 60, seed=i, task=task)
        agg.add_gaze("hmd", f"s{i:03d}", t_unix=t0 + 1 + g.timestamps,
                     x_deg=g.x_deg, y_deg=g.y_deg, valid=g.valid)  # fmt: skip


@pytest.mark.slow
def test_a_bucket_charges_every_session_then_enqueues_the_attention(tmp_path: Path) -> None:
    """Means and attention: two parts, each charged in its own stream to its contributors, each
    message carried by one charge, enqueued ahead of its receipts; a session with gaze but no
    feature vector pays for both parts alike (it adds zero to the means: issue 46, finding 6);
    the released heatmap is close to the clean one at ε 100 per hour."""
    plan = _plan(["means", "attention", "aois"], budget=2000.0, attention_aois=str(DEMO))
    c = plan.cohort_plan
    assert c is not None
    n, bucket = 60, 29_000_000
    t0 = bucket * 60.0
    with Ledger(tmp_path / "ledger.sqlite", caps=plan.ledger_caps()) as ledger:
        agg = CohortAggregator(c, ledger, cohort="lab", worker="w1", insecure_seed=5)
        _gaze(agg, n, t0)
        rng = np.random.default_rng(1)
        for i in range(n - 1):  # the last session has no feature vector in the bucket
            agg.add("hmd", f"s{i:03d}", rng.uniform(0, 1, (4, 48)), t0 + np.arange(4) + 30)
        released = agg.release_due(t0 + 66.0)
        assert [type(r.message).__name__ for r in released] == ["CohortMessage", "AttentionMessage"]
        means, att = released
        assert len(means.sessions) == len(att.sessions) == n  # charged alike, vectors or not
        assert len(ledger.charges(f"s{n - 1:03d}", STREAM)) == 1
        assert len(ledger.charges(f"s{n - 1:03d}", ATTENTION_STREAM)) == 1
        pending = ledger.pending()
        assert len(pending) == 2 * n
        carried = [p for p in pending if p.topic == "gazeguard/v1/cohort/lab/attention"]
        assert len(carried) == 1
        its = [p.id for p in pending if p.stream == ATTENTION_STREAM]
        assert carried[0].id == min(its), "the attention goes ahead of its part's receipts"
        assert carried[0].id > max(p.id for p in pending if p.stream == STREAM)
        payload = json.loads(carried[0].payload)
        jsonschema.validate(payload, ATTENTION.shipped_schema())
        msg = AttentionMessage.model_validate(payload)
        assert msg == att.message
        receipts = [json.loads(p.payload) for p in pending if p.topic.endswith("/cohort")]
        assert {r["release"] for r in receipts} == {"aggregates", "attention"}
        assert ledger.verify() == []
        late = agg.late_samples
        agg.add_gaze("hmd", "s001", t_unix=[t0 + 3], x_deg=[0.0], y_deg=[0.0], valid=[True])
        assert agg.late_samples == late + 1
        assert agg.open_buckets == []
    assert (msg.rows, msg.cols) == (9, 16)
    assert abs(msg.noisy_count - n) < 5 * msg.sigma * 12  # 144 cells' noise on the total
    assert msg.sensitivity_l2 == pytest.approx(math.sqrt(2))
    assert msg.epsilon_per_hour == pytest.approx(c.epsilon_per_hour)
    heat = np.array(msg.heatmap)
    assert heat.sum() == pytest.approx(1.0)
    layout = c.attention
    assert layout is not None
    clean = np.zeros(layout.dimension)
    for i in range(n):
        g = simulate_scene_gaze(55, 60, seed=i, task="watching")
        clean += layout.contribution(layout.tally(g.x_deg, g.y_deg, g.valid))
    assert msg.aois is not None
    got = np.array([a.share for a in msg.aois])
    want = shares(clean[144:])
    assert np.abs(got - want).max() < 0.1, (got, want)
    # where the watchers look (the video panel, up and right) is where the heatmap is hot
    hot = np.unravel_index(np.argmax(heat), heat.shape)
    assert hot[0] < 5, hot
    assert hot[1] >= 8, hot


@pytest.mark.slow
def test_a_fleet_worker_publishes_schema_valid_attention(tmp_path: Path, unique_id: str) -> None:
    """A real `gazeguard run --fleet --cohort` over simulated LSL headsets and a real Mosquitto
    publishes, per 2-s bucket, a heatmap with AOI shares on …/attention that the shipped schema
    accepts and whose figures are the plan's."""
    broker = MosquittoBroker(tmp_path)
    broker.start()
    name = f"att-{unique_id}"
    heads = [SimulatedHeadset(120, seed=i, name=name, source_id=f"{name}-{i}") for i in range(3)]
    worker: Proc | None = None
    sub = Subscriber(broker, f"sub-{unique_id}")
    topic = "gazeguard/v1/cohort/lab/attention"
    try:
        for h in heads:
            h.start()
        worker = cohort_worker(
            tmp_path,
            broker,
            name,
            "fixation_rate,pupil_mean",
            "means,attention,aois",
            "--attention-aois",
            str(DEMO),
            extra_env={"GAZEGUARD_FLEET__COMPILED": "false"},
        )

        def both() -> tuple[list[dict[str, object]], list[str]] | None:
            """The attention messages so far, once an aggregate has arrived too."""
            with sub.lock:
                found = [json.loads(p) for t, p, _ in sub.messages if t == topic]
                agg = [t for t, _, _ in sub.messages if t.endswith("/cohort/lab/aggregates")]
            return (found, agg) if found and agg else None

        found, aggregates = wait_for(both, 90, worker.text)
    finally:
        code = worker.stop() if worker else 0
        for h in heads:
            h.stop()
        sub.close()
        broker.stop()
    assert code == 0, worker.text() if worker else ""
    assert aggregates, "the means are published beside the attention"
    settings = load_settings(
        None, fleet={"enabled": True}, ingest={"source": "lsl"},
        features={"window_s": 2, "step_s": 0.05}, ledger={"budget_per_hour": 200},
        mechanism={"chunk_steps": 32, "features": ["fixation_rate", "pupil_mean"]},
        cohort={"enabled": True, "name": "lab", "bucket_s": 2, "grace_s": 1,
                "release": ["means", "attention", "aois"], "attention_aois": str(DEMO)},
    )  # fmt: skip
    cohort = ReleasePlan.from_settings(settings).cohort_plan
    assert cohort is not None
    part = cohort.part("attention")
    assert part is not None
    schema = ATTENTION.shipped_schema()
    for doc in found:
        jsonschema.validate(doc, schema)
        msg = AttentionMessage.model_validate(doc)
        assert (msg.rows, msg.cols) == (9, 16)
        assert msg.grid is not None
        assert len(msg.grid) == 9
        assert msg.aois is not None
        assert [a.name for a in msg.aois] == ["text", "video", "search", "elsewhere"]
        assert msg.noise == "os-csprng"
        assert msg.bucket_end - msg.bucket_start == 2.0
        assert msg.bucket_end <= time.time()
        assert msg.sigma == pytest.approx(part.sigma)  # the plan's figures
        assert msg.sensitivity_l2 == pytest.approx(math.sqrt(2))
        assert msg.epsilon_per_hour == pytest.approx(cohort.epsilon_per_hour)
        assert msg.delta == cohort.delta
    text = worker.text() if worker else ""
    assert "dwell heatmap" in text
    assert "Traceback" not in text
