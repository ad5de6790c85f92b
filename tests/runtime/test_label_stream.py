"""Private labels in the sidecar: the plan (ε per decision, budget split), the label stream in the
pipeline (real SQLite ledger), and `gazeguard run --labels` end to end (real Mosquitto)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gazeguard.config import FeatureSettings, LabelSettings, MechanismSettings, load_settings
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import Ledger
from gazeguard.plan import ReleasePlan
from gazeguard.privacy.accounting import compose
from gazeguard.runtime.labels import STREAM
from gazeguard.runtime.pipeline import Pipeline
from gazeguard.runtime.preflight import check_settings
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.labels import MODEL_FORMAT, load_model
from gazeguard.wire.kinds import LABELS
from gazeguard.wire.label import LabelMessage
from gazeguard.wire.message import ChunkMessage
from tests.conftest import MosquittoBroker, Subscriber

FAST = FeatureSettings(window_s=2.0, step_s=0.05)
MODEL_FEATURES = ["fixation_rate", "saccade_rate", "saccade_amplitude_mean"]


def fast_model(path: Path, *, window_s: float = 2.0, step_s: float = 0.05, **kw: object) -> Path:
    """A consumer's own label model in the shipped format (a linear softmax over 3 features)."""
    spec = {
        "format": MODEL_FORMAT,
        "name": "fast",
        "version": "t1",
        "profile": "fast-test",
        "features": MODEL_FEATURES,
        "classes": ["low", "mid", "high"],
        "window_s": window_s,
        "step_s": step_s,
        "standardizer": {"mean": [3.0, 3.0, 5.0], "scale": [1.0, 1.0, 3.0]},
        "classifier": {
            "coef": [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
            "intercept": [0.0, 0.0, 0.0],
        },
        "gazeguard_version": "test",
        **kw,
    }
    path.write_text(json.dumps(spec))
    return path


# ------------------------------------------------------------------------------------ the plan
def _plan(labels: LabelSettings, **kw: object) -> ReleasePlan:
    return ReleasePlan.build(labels=labels, **{"budget": 10.0, "delta": 1e-6, **kw})  # type: ignore[arg-type]


def test_the_labels_share_buys_the_most_epsilon_its_decisions_can_compose_to() -> None:
    plan = _plan(LabelSettings(enabled=True, model="activity", release="clock", decision_s=900.0))
    lp = plan.label_plan
    assert lp is not None
    assert plan.labels is not None
    assert lp.model.name == "activity"
    assert lp.classes == 6
    # an hour of gaze changes every decision whose 900 s block meets its 63.5 s reach:
    # ⌊(3600 + 63.5 + 899.5)/900⌋ + 1 = 6, not the 4 that end inside it
    assert lp.per_window == plan.labels.per_hour == 6
    assert lp.reserve == pytest.approx(5.0)
    assert lp.hour_epsilon <= lp.reserve + 1e-9
    assert lp.hour_epsilon == pytest.approx(5.0, rel=1e-3)  # the share is used, not wasted
    assert lp.epsilon >= 5.0 / 6  # the accountant's composition: never below the pure split
    assert lp.survival == pytest.approx(math.exp(lp.epsilon) / (math.exp(lp.epsilon) + 5))
    assert lp.steps == 1800
    assert "one hour of gaze can change 6 labels" in lp.text()
    assert plan.per_hour <= 10.0  # chunks calibrated last, jointly


def test_explicit_epsilon_costs_what_its_decisions_compose_to_and_must_leave_room() -> None:
    plan = _plan(LabelSettings(enabled=True, release="clock", decision_s=1200.0, epsilon=1.5))
    lp = plan.label_plan
    assert lp is not None
    assert lp.per_window == 5  # ⌊(3600 + 63.5 + 1199.5)/1200⌋ + 1
    assert lp.reserve == pytest.approx(compose({lp.event: 5}, 1e-6).epsilon)
    assert plan.per_hour <= 10.0
    with pytest.raises(ConfigError) as err:
        _plan(LabelSettings(enabled=True, release="clock", decision_s=1200.0, epsilon=2.5))
    assert err.value.field == "labels.epsilon"
    assert "leaves nothing" in err.value.reason
    with pytest.raises(ConfigError, match=r"labels\.budget_share"):
        _plan(LabelSettings(enabled=True), budget=None)


def test_labels_and_calibrated_chunks_fit_the_budget_together(tmp_path: Path) -> None:
    """Labels take their share; the chunks are calibrated last so that an hour of both, composed
    by the accountant, uses the budget: more than basic composition's half for the chunks."""
    mechanism = MechanismSettings.model_validate({"features": "activity"})
    labels = LabelSettings(enabled=True, release="clock", decision_s=600.0)
    plan = _plan(labels, mechanism=mechanism)
    with Ledger(tmp_path / "l.sqlite", caps=plan.ledger_caps()) as ledger:
        pipe = Pipeline(ledger, session="u", device="d", rate_hz=120.0, plan=plan)
    assert pipe.label_plan is plan.label_plan
    assert plan.per_hour <= 10.0
    assert plan.per_hour == pytest.approx(10.0, rel=1e-3)
    assert plan.labels is not None
    chunks_alone = plan.epsilon({"chunks": plan.chunks.per_hour})
    assert chunks_alone > 5.0  # the labels' 5 and the chunks' more compose to 10


def test_a_model_for_other_features_is_refused_at_load(tmp_path: Path) -> None:
    # trained on another window: its features would not match what the sidecar computes
    with pytest.raises(ConfigError) as err:
        _plan(LabelSettings(enabled=True), features=FAST)
    assert err.value.field == "labels.model"
    assert "window 30 s" in err.value.reason
    assert "features.window_s = 2 s" in err.value.reason
    # a feature the sidecar does not compute
    bad = fast_model(tmp_path / "bad.json")
    spec = json.loads(bad.read_text())
    spec["features"][1] = "sacade_rate"
    bad.write_text(json.dumps(spec))
    with pytest.raises(ConfigError) as err:
        _plan(LabelSettings(enabled=True, model=str(bad), decision_s=1.6), features=FAST)
    assert err.value.field == "features[1]"
    assert "did you mean 'saccade_rate'" in err.value.reason
    # coefficients that do not fit the feature list
    spec["features"][1] = "saccade_rate"
    spec["classifier"]["coef"][0] = [1.0, 0.0]
    bad.write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match=r"classifier.coef"):
        load_model(bad)
    # a decision that is not a whole number of feature steps
    with pytest.raises(ConfigError, match="whole multiple"):
        _plan(LabelSettings(enabled=True, decision_s=1.62))


def test_config_check_reports_label_problems(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[labels]\nenabled = true\nmodel = "activty"\n')
    _, problems = check_settings(cfg)
    assert [p.field for p in problems] == ["model"]
    assert "did you mean 'activity'" in problems[0].reason


# ------------------------------------------------------------------ profiles by name
def test_mechanism_features_accept_a_profile_name_and_chunks_name_it(tmp_path: Path) -> None:
    m = MechanismSettings.model_validate({"features": "activity", "epsilon": 0.5})
    assert m.features == ["saccade_right_ratio", "wordbook2_mean"]
    assert m.profile == "activity"
    assert load_settings(None, mechanism={"profile": "activity"}).mechanism.features == m.features
    with pytest.raises(ConfigError, match="activty"):
        load_settings(None, mechanism={"features": "activty"})
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = Pipeline(ledger, session="u", device="d", rate_hz=120.0, features=FAST, mechanism=m)
        out = [c for s in range(0, 2400, 12) for c in pipe.push(_gaze(20.0).slice(s, s + 12))]
    assert out
    assert {ChunkMessage.from_payload(c.payload).profile for c in out} == {"activity"}


# ------------------------------------------------------------------ the stream in the pipeline
_GAZE: dict[float, object] = {}


def _gaze(seconds: float):  # type: ignore[no-untyped-def]
    if seconds not in _GAZE:
        _GAZE[seconds] = simulate_gaze(seconds, 120.0, 3)
    return _GAZE[seconds]


def _run(pipe: Pipeline, seconds: float) -> tuple[list[object], list[object]]:
    gaze = _gaze(seconds)
    chunks: list[object] = []
    labels: list[object] = []
    for start in range(0, len(gaze), 12):  # type: ignore[arg-type]
        chunks += pipe.push(gaze.slice(start, start + 12))  # type: ignore[attr-defined]
        labels += pipe.take_labels()
    return chunks, labels


def _clock_pipeline(ledger: Ledger, model: Path, label_epsilon: float, **kw: object) -> Pipeline:
    """A pipeline of session "u" releasing chunks at ε 0.5 and a label every 1.6 s at
    ``label_epsilon`` (``kw``: more of :class:`Pipeline`'s arguments)."""
    return Pipeline(
        ledger, session="u", device="hmd", rate_hz=120.0, features=FAST,
        mechanism=MechanismSettings.model_validate({"features": MODEL_FEATURES, "epsilon": 0.5}),
        labels=LabelSettings(
            enabled=True, model=str(model), release="clock", decision_s=1.6,
            epsilon=label_epsilon,
        ),
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_labels_are_charged_before_they_are_handed_on(tmp_path: Path) -> None:
    model = fast_model(tmp_path / "m.json")
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = _clock_pipeline(ledger, model, 1.0, clock_offset_s=1.7e9)
        chunks, labels = _run(pipe, 20.0)
        assert len(labels) >= 10
        charges = ledger.charges("u", STREAM)
        assert [c.chunk_index for c in charges] == list(range(len(labels)))
        assert all(c.total == pytest.approx(1.0) for c in charges)
        pending = {p.id: p for p in ledger.pending()}
        for i, lab in enumerate(labels):
            msg = LabelMessage.from_payload(lab.payload)  # type: ignore[attr-defined]
            assert msg.decision_index == i
            assert msg.classes == ["low", "mid", "high"]
            assert msg.model.name == "fast"
            assert msg.profile == "fast-test"
            assert pending[lab.id].payload == lab.payload  # type: ignore[attr-defined]
            assert pending[lab.id].topic == "gazeguard/v1/hmd/u/labels"  # type: ignore[attr-defined]
            jsonschema.validate(json.loads(lab.payload), LABELS.shipped_schema())  # type: ignore[attr-defined]
        # the session's ε composes both streams: the accountant's figure over chunk and label
        # events, and the pure sequential sum beside it
        assert pipe.label_plan is not None
        both = {e: c * len(chunks) for e, c in pipe.mechanism.events().items()}
        both[pipe.label_plan.event] = len(labels)
        state = ledger.state("u")
        assert state.epsilon == pytest.approx(compose(both, state.delta).epsilon, rel=1e-6)
        assert state.spent == pytest.approx(1.5 * len(chunks) + 1.0 * len(labels))
        assert state.epsilon > compose({pipe.label_plan.event: len(labels)}, 1e-6).epsilon
        # a restart continues the decision numbering
        again = _clock_pipeline(ledger, model, 1.0)
        assert again.labels is not None
        assert again.labels.next_index == len(labels)


def test_a_label_at_the_largest_epsilon_is_published_not_dropped(tmp_path: Path) -> None:
    """At ε ≳ 37 the survival probability e^ε/(e^ε + C − 1) is 1.0 as a float; the message
    refused it, so every label of such a plan was dropped (fail closed) instead of published."""
    model = fast_model(tmp_path / "m.json")
    with Ledger(tmp_path / "l.sqlite") as ledger:
        pipe = _clock_pipeline(ledger, model, 50.0)
        _, labels = _run(pipe, 12.0)
    assert pipe.labels is not None
    assert pipe.labels.stats.dropped == 0
    assert len(labels) >= 5
    msg = LabelMessage.from_payload(labels[0].payload)  # type: ignore[attr-defined]
    assert msg.survival_probability == 1.0
    jsonschema.validate(json.loads(msg.to_payload()), LABELS.shipped_schema())


def test_labels_are_withheld_once_the_window_budget_is_spent(tmp_path: Path) -> None:
    """Chunks and labels at a fixed ε overspend the ledger's hourly cap (6 here, far below what
    they would need): the labels that no longer fit are withheld (recorded, nothing enqueued)
    and no window exceeds its cap."""
    model = fast_model(tmp_path / "m.json")
    cap = 6.0
    plan = ReleasePlan.build(
        features=FAST,
        mechanism=MechanismSettings.model_validate({"features": MODEL_FEATURES, "epsilon": 0.4}),
        budget=None,  # fixed ε: no calibration; the ledger's cap below binds instead
        delta=1e-6,
        labels=LabelSettings(
            enabled=True, model=str(model), release="clock", decision_s=1.6, epsilon=0.5
        ),
    )
    caps = dataclasses.replace(plan.ledger_caps(), window=cap, composition="sequential")
    with Ledger(tmp_path / "l.sqlite", caps=caps) as ledger:
        pipe = Pipeline(
            ledger, session="u", device="hmd", rate_hz=120.0, plan=plan, clock_offset_s=1.7e9
        )
        assert pipe.label_plan is not None
        chunks, labels = _run(pipe, 30.0)
        assert pipe.labels is not None
        withheld = ledger.withheld("u", STREAM)
        assert pipe.labels.stats.withheld == len(withheld) >= 1
        assert labels
        assert len(labels) == pipe.labels.stats.released
        assert "cap" in (pipe.labels.stats.last_reason or "")
        state = ledger.state("u")
        assert state.epsilon_window <= cap + 1e-9
        assert state.epsilon == pytest.approx(1.2 * len(chunks) + 0.5 * len(labels))
        enqueued = {p.chunk_index for p in ledger.pending() if p.stream == STREAM}
        assert enqueued == {lab.chunk_index for lab in labels}  # type: ignore[attr-defined]
        assert not enqueued & {i for i, _, _ in withheld}


# ------------------------------------------------------------------ `gazeguard run` end to end
@pytest.mark.slow
@pytest.mark.network
def test_run_publishes_schema_valid_labels_and_charges_them(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    model = fast_model(tmp_path / "m.json", window_s=2.0, step_s=0.02)
    sub = Subscriber(mosquitto, f"sub-{unique_id}")
    try:
        assert sub.wait_for(sub.client.is_connected, 5)
        cmd = [
            sys.executable, "-m", "gazeguard", "run", "--source", "simulated",
            "--source-id", unique_id, "--session", "s1", "--device", "hmd",
            "--broker", f"{mosquitto.host}:{mosquitto.port}",
            "--ledger", str(tmp_path / "ledger.sqlite"),
            "--features", ",".join(MODEL_FEATURES), "--window-s", "2", "--step-s", "0.02",
            "--chunk-steps", "32", "--epsilon", "0.5", "--budget-per-hour", "none",
            "--labels", str(model), "--label-release", "clock", "--decision-s", "0.64",
            "--label-epsilon", "1.5",
            "--duration", "8",
        ]  # fmt: skip
        env = {
            **os.environ,
            "GAZEGUARD_LEDGER__COMPOSITION": "sequential",
            "GAZEGUARD_INGEST__PULL_EVERY_S": "0.25",  # windows of 2 s: a quick clock
            "GAZEGUARD_INGEST__LATE_AFTER_S": "0.5",
        }
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert "private labels: model 'fast' vt1, 3 classes" in proc.stderr
        assert "p = e^ε/(e^ε + C − 1) = 0.691" in proc.stderr
        with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
            label_charges = ledger.charges("s1", STREAM)
            chunk_charges = ledger.charges("s1")
            spent = ledger.state("s1").epsilon
        assert len(label_charges) >= 3
        assert spent == pytest.approx(1.5 * len(chunk_charges) + 1.5 * len(label_charges))

        def labels() -> list[LabelMessage]:
            with sub.lock:
                return [
                    LabelMessage.from_payload(p)
                    for t, p, _ in sub.messages
                    if t.endswith("/labels")
                ]

        assert sub.wait_for(lambda: len(labels()) >= len(label_charges), 10)
        with sub.lock:
            raw = [(t, p) for t, p, _ in sub.messages if t.endswith("/labels")]
        for topic, payload in raw:
            assert topic == "gazeguard/v1/hmd/s1/labels"
            jsonschema.validate(json.loads(payload), LABELS.shipped_schema())
        got = sorted({m.decision_index for m in labels()})
        assert got == [c.chunk_index for c in label_charges]
        assert all(m.epsilon == 1.5 and m.noise == "os-csprng" for m in labels())
    finally:
        sub.close()
