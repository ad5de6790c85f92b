"""``gazeguard watch`` against a real Mosquitto and a real ``gazeguard run`` (simulated headset)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from gazeguard.cli import ExitCode, main
from gazeguard.cli.watch import LEGEND, clock, describe, span, sparkline
from gazeguard.signal.labels import LabelDecision, RandomizedResponse
from gazeguard.wire.cohort import (
    AttentionMessage,
    CohortFeature,
    CohortMessage,
    CohortReceipt,
    ModeMessage,
)
from gazeguard.wire.label import LabelMessage
from gazeguard.wire.message import StatusMessage
from tests.cli.test_cli import Proc
from tests.conftest import MosquittoBroker, publish
from tests.runtime.test_label_stream import MODEL_FEATURES, fast_model

FAST = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32"]
FEATURES = "fixation_rate,saccade_rate,pupil_mean"


@pytest.mark.slow
@pytest.mark.network
def test_watch_shows_validated_chunks_of_a_real_run(
    mosquitto: MosquittoBroker, tmp_path: Path, unique_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"{mosquitto.host}:{mosquitto.port}"
    run = subprocess.Popen(
        [
            sys.executable, "-m", "gazeguard", "run", "--source", "simulated",
            "--source-id", unique_id, "--session", unique_id, "--device", "hmd",
            "--broker", address, "--ledger", str(tmp_path / "l.sqlite"),
            "--features", FEATURES, "--duration", "25", *FAST,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        code = main(
            ["watch", "--broker", address, "--session", unique_id, "--count", "2",
             "--duration", "60", "--json"]
        )  # fmt: skip
    finally:
        run.terminate()
        _, err = run.communicate(timeout=30)
    assert code == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    chunks = [d["message"] for d in docs if d["kind"] == "chunks"]
    assert len(chunks) == 2
    assert all(c["session"] == unique_id and c["features"] == FEATURES.split(",") for c in chunks)
    assert all(d["kind"] in ("chunks", "status") for d in docs)  # nothing invalid
    # the run told a newcomer how to watch it
    assert f"gazeguard watch --broker {address} --device hmd --session {unique_id}" in err
    assert f"mosquitto_sub -h {mosquitto.host} -p {mosquitto.port}" in err


def test_an_invalid_message_is_reported_not_fatal() -> None:
    kind, lines, model = describe("gazeguard/v1/d/s/chunks", b'{"schema": "nope"}', 8)
    assert (kind, model) == ("invalid", None)
    assert lines[0].startswith("INVALID message on gazeguard/v1/d/s/chunks:")
    kind, _, _ = describe("gazeguard/v1/d/s/status", b"\xff\xfe not json", 8)
    assert kind == "invalid"
    assert describe("elsewhere/x", b"{}", 8)[0] == "other"


def test_a_status_and_a_cohort_receipt_are_shown_with_their_public_fields() -> None:
    """The status line says the ledger's figures and the chunk counts, dropped included (the
    status carries no count of samples since issue 46); a cohort receipt on the session's
    ``…/cohort`` topic is validated and shown, not ignored."""
    status = StatusMessage(
        session="s", device="hmd", state="budget_exhausted", time=1.7e9, epsilon=0.5,
        spent=1.0, remaining=0.0, session_cap=1.0, chunks_charged=3, chunks_withheld=2,
        chunks_dropped=1, reason="session cap 1 reached",
    )  # type: ignore[arg-type]  # fmt: skip
    kind, lines, _ = describe("gazeguard/v1/hmd/s/status", status.to_payload(), 8)
    assert kind == "status"
    assert lines == [
        "status hmd/s: budget_exhausted, user-level ε 0.5; chunks charged 3, delivered 0, "
        "refused 0, withheld 2, dropped 1 — session cap 1 reached"
    ]
    receipt = CohortReceipt(
        session="s", cohort="lab", worker="w1", bucket=7, release="attention",
        noise_multiplier=26.6, epsilon_per_hour=5.0, delta=1e-6,
    )  # fmt: skip
    kind, lines, model = describe("gazeguard/v1/hmd/s/cohort", receipt.to_payload(), 8)
    assert (kind, model) == ("receipts", receipt)
    assert lines == [
        "receipt s: charged for cohort 'lab' bucket 7 (attention, worker w1): 5 ε per hour of "
        "buckets at δ 1e-06"
    ]
    old = json.loads(status.to_payload()) | {"schema": "gazeguard.status/1", "ingest": None}
    assert describe("gazeguard/v1/hmd/s/status", json.dumps(old).encode(), 8)[0] == "invalid"


def test_sparkline_spans_the_range() -> None:
    assert sparkline([0.0, 0.5, 1.0], 0.0, 1.0) == "▁▅█"
    assert sparkline([-5.0, 5.0], 0.0, 1.0) == "▁█"  # clipped to the range


def _retain(broker: MosquittoBroker, session: str, state: str) -> None:
    """A retained status of ``hmd``/``session`` in ``state``, published as a run would."""
    status = StatusMessage(
        session=session, device="hmd", state=state, time=time.time(), spent=0.0, remaining=None,
        session_cap=None, chunks_charged=0, chunks_withheld=0, chunks_dropped=0,
    )  # type: ignore[arg-type]  # fmt: skip
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        client.publish(
            f"gazeguard/v1/hmd/{session}/status", status.to_payload(), qos=1, retain=True
        ).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


@pytest.mark.slow
@pytest.mark.network
def test_watch_waits_for_the_broker_rides_out_its_end_and_stops_on_ctrl_c(
    tmp_path: Path, unique_id: str
) -> None:
    """Issue 35.4: `watch` ended in a traceback when no broker answered yet and when the run
    (its embedded broker) ended. Now one line each, it keeps trying, and Ctrl-C exits 130."""
    broker = MosquittoBroker(tmp_path)  # its port chosen, not started yet
    watch = Proc(
        "watch", "--broker", broker.address, "--device", "hmd", "--session", unique_id,
        cwd=tmp_path,
    )  # fmt: skip
    try:
        watch.wait_for(f"no MQTT broker answers at {broker.address} yet")
        broker.start()
        watch.wait_for(f"^watching gazeguard/v1/hmd/{unique_id}/\\+ on {broker.address}")
        for _ in range(3):  # a sidecar republishes its status every 5 s: shown once
            _retain(broker, unique_id, "starting")
            time.sleep(0.05)
        _retain(broker, unique_id, "running")  # a change is shown
        watch.wait_for(f"^status hmd/{unique_id}: running")
        broker.stop()  # as the embedded broker of a run that ends
        watch.wait_for(f"lost broker {broker.address}")
        broker.start()
        watch.wait_for(f"broker {broker.address} is back")
        _retain(broker, unique_id, "stopped")
        watch.wait_for(f"^status hmd/{unique_id}: stopped")
        code, text = watch.finish(signal.SIGINT)
    finally:
        broker.stop()
    assert code == ExitCode.INTERRUPTED, text
    assert "Traceback" not in text
    assert len(re.findall("no MQTT broker answers", text)) == 1, text
    assert len(re.findall("lost broker", text)) == 1, text
    assert "0 chunk and label messages, 0 invalid" in text
    assert len(re.findall(f"^status hmd/{unique_id}: starting", text, re.M)) == 1, text


# ------------------------------------------------------------------ labels, visible
def _label(index: int, label: str, unix_end: float, **kw: object) -> bytes:
    """A label message built as the sidecar's stream builds it (randomized response at ε 2
    over 4 classes, its exact survival probability)."""
    rr = RandomizedResponse(4, 2.0)
    classes = ("browse", "read", "watch", "write")
    decision = LabelDecision(
        label, classes.index(label), classes, rr.epsilon, rr.survival, 60, "INSECURE-seeded"
    )
    msg = LabelMessage.build(
        decision, session="s", device="hmd", decision_index=index, window_start=10.0 * index,
        window_end=10.0 * index + 29.5, model_name="activity-portable", model_version="1.0",
        profile="activity-portable", unix_end=unix_end,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return msg.to_payload()


def test_a_label_shows_its_probability_of_being_right_and_how_long_it_held() -> None:
    holds: dict[tuple[str, str], LabelMessage] = {}
    t0 = 1.7e9
    kind, first, _ = describe(
        "gazeguard/v1/hmd/s/labels", _label(0, "read", t0, clean_accuracy=0.63), 8, holds
    )
    assert kind == "labels"
    # p = e²/(e² + 3) = 0.711; 0.711·0.63 + 0.289·0.37/3 = 0.484: what the plan states
    assert f"'read' since {clock(t0)} (on a clock) — right with probability 0.48" in first[0]
    assert "at ε 2 keeps the model's label with p = 0.71" in first[1]
    assert "the model is right 0.63 of the time" in first[1]
    status = StatusMessage(
        session="s", device="hmd", state="running", time=t0 + 95.0, spent=1.0, remaining=None,
        session_cap=None, chunks_charged=3, chunks_withheld=0, chunks_dropped=0,
    )  # type: ignore[arg-type]  # fmt: skip
    _, lines, _ = describe("gazeguard/v1/hmd/s/status", status.to_payload(), 8, holds)
    assert f"holds label 'read' since {clock(t0)} (1 min 35 s)" in lines[0]
    _, second, _ = describe(
        "gazeguard/v1/hmd/s/labels", _label(1, "watch", t0 + 400.0, clean_accuracy=0.63), 8, holds
    )
    assert f"replaces 'read', held for 6 min 40 s (since {clock(t0)})" in second[-1]
    # a message without the model's clean accuracy says what it can
    _, bare, _ = describe("gazeguard/v1/hmd/t/labels", _label(0, "write", t0), 8, holds)
    assert "the model's label with probability 0.71" in bare[0]
    assert "states no clean accuracy" in bare[1]
    assert (span(45), span(400), span(3720)) == ("45 s", "6 min 40 s", "1 h 02 min")


@pytest.mark.slow
@pytest.mark.network
def test_watch_run_and_ledger_show_count_labels_on_a_clock(
    mosquitto: MosquittoBroker, tmp_path: Path, unique_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real `gazeguard run` releasing labels on a clock (simulated headset, a consumer's model
    whose file records a clean accuracy): `watch` shows each with its probability of being right
    and since when it holds, the run's summary and `ledger show` count labels, switches and ε."""
    model = fast_model(tmp_path / "m.json", window_s=2.0, step_s=0.02,
                       trained={"lopo_window_accuracy": 0.8})  # fmt: skip
    address = f"{mosquitto.host}:{mosquitto.port}"
    ledger = tmp_path / "l.sqlite"
    run = subprocess.Popen(
        [
            sys.executable, "-m", "gazeguard", "run", "--source", "simulated",
            "--source-id", unique_id, "--session", unique_id, "--device", "hmd",
            "--broker", address, "--ledger", str(ledger),
            "--features", ",".join(MODEL_FEATURES), "--window-s", "2", "--step-s", "0.02",
            "--chunk-steps", "32", "--epsilon", "0.5", "--budget-per-hour", "none",
            "--labels", str(model), "--decision-s", "0.64", "--label-epsilon", "8",
            "--duration", "16",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={
            **os.environ,
            "GAZEGUARD_LEDGER__COMPOSITION": "sequential",
            "GAZEGUARD_INGEST__PULL_EVERY_S": "0.25",  # windows of 2 s: a quick clock
            "GAZEGUARD_INGEST__LATE_AFTER_S": "0.5",
        },
    )  # fmt: skip
    try:
        code = main(["watch", "--broker", address, "--session", unique_id, "--duration", "18"])
    finally:
        _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert code == 0
    out = capsys.readouterr().out
    shown = re.findall(r"^label (\d+) hmd/\S+: '(\w+)' since (\d\d:\d\d:\d\d) \(on a clock\) — "
                       r"right with probability (0\.\d\d)$", out, re.M)  # fmt: skip
    # one label per 0.64 s block of features: many in 14 s of features (how many reach watch
    # depends on when it subscribed), each after the first replacing the one held before
    assert len(shown) >= 2, out
    indices = [int(i) for i, _, _, _ in shown]
    assert indices == sorted(set(indices))
    # ε 8 per label: p = e⁸/(e⁸ + 2) = 0.9993; 0.9993·0.8 + 0.0007·0.1 = 0.80
    assert {p for _, _, _, p in shown} == {"0.80"}
    assert "the model is right 0.80 of the time" in out
    assert re.search(r"replaces '\w+', held for \d+ s \(since \d\d:\d\d:\d\d\)", out)
    assert re.search(r"^status hmd/\S+: \w+.*; holds label '\w+' since", out, re.M)
    summary = re.search(
        r"(\d+) labels? \(on a clock\), the label changed (\d+) times?, 0 withheld, 0 dropped; "
        r"the labels' ε ([\d.]+)",
        err,
    )
    assert summary is not None, err
    n, switches = int(summary.group(1)), int(summary.group(2))
    assert n >= len(shown)
    assert max(indices) < n
    assert switches < n
    assert float(summary.group(3)) == pytest.approx(8.0 * n, rel=1e-3)  # pure: no δ to gain
    # run says each label as it says each chunk: one line per charged label, in order
    lines = re.findall(
        r"^label +(\d+) charged: '\w+' \(right with probability 0\.80, ε 8\); session ε [\d.]+ "
        r"\(uncapped\) → gazeguard/v1/hmd/\S+/labels$", err, re.M,
    )  # fmt: skip
    assert [int(i) for i in lines] == list(range(n)), err
    assert main(["ledger", "show", "--path", str(ledger), "--session", unique_id]) == 0
    text = capsys.readouterr().out
    assert f"labels released      {n} on a clock   withheld 0" in text
    assert f"labels' ε            {8.0 * n:.4g} pure sum (8 per label" in text
    assert main(["ledger", "show", "--path", str(ledger), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (lab,) = [s["labels"] for s in doc["sessions"] if s["session"] == unique_id]
    assert (lab["released"], lab["withheld"], lab["epsilon_label"]) == (n, 0, [8.0])


# ------------------------------------------------------------------ cohort messages, visible
def _cohort_messages() -> tuple[CohortMessage, AttentionMessage]:
    """An aggregate of a few sessions (count 0.14: nothing readable) and a 2 × 4 heatmap."""
    aggregate = CohortMessage(
        cohort="lab", worker="w1", bucket=7, bucket_start=140.0, bucket_end=160.0,
        noisy_count=0.14, count=1,
        features=[CohortFeature(name="pupil_mean", unit="mm", noisy_sum=-0.4, mean=1.5, sd=233.0),
                  CohortFeature(name="fixation_rate", unit="1/s", noisy_sum=0.3, mean=4.0,
                                sd=91.0)],
        classes=["read", "watch"], noisy_histogram=[30.0, 10.0], shares=[0.75, 0.25],
        sigma=1.0, sensitivity_l2=math.sqrt(3), epsilon_per_hour=5.0, delta=1e-6,
        profile="custom", model="activity", noise="os-csprng",
    )  # fmt: skip
    grid = [[0.0, 1.0, 4.0, -2.0], [2.0, 0.0, 1.0, 0.0]]
    attention = AttentionMessage(
        cohort="lab", worker="w1", bucket=7, bucket_start=140.0, bucket_end=160.0, rows=2,
        cols=4, fov_deg=[48.0, 27.0], grid=grid,
        heatmap=[[max(v, 0.0) / 8.0 for v in row] for row in grid], noisy_count=7.0,
        aois=None, aoi_file=None, sigma=0.5, sensitivity_l2=1.0, epsilon_per_hour=5.0,
        delta=1e-6, noise="os-csprng",
    )  # fmt: skip
    return aggregate, attention


def _mode() -> ModeMessage:
    return ModeMessage(
        cohort="lab", worker="w1", bucket=7, bucket_start=140.0, bucket_end=160.0,
        classes=["read", "watch"], mode="watch", mode_index=1, epsilon=0.5, lead_for_90=3.2,
        epsilon_per_hour=5.0, delta=1e-6, profile="custom", model="activity", noise="os-csprng",
    )  # fmt: skip


def test_cohort_aggregates_and_heatmaps_are_described_with_their_readability() -> None:
    """An aggregate: about how many sessions, each figure's 95 % band and whether it is
    readable (with the sessions it needs); a heatmap as rows of shades with its hottest cell."""
    aggregate, attention = _cohort_messages()
    kind, lines, model = describe("gazeguard/v1/cohort/lab/aggregates", aggregate.to_payload(), 8)
    assert (kind, model) == ("aggregates", aggregate)
    assert lines[0] == (
        f"cohort 'lab' bucket 7 (worker w1, 20 s of gaze to {clock(160.0)}): about 0 sessions "
        "(noisy count 0.14 ± 1.96, too noisy, needs ≥ 20 sessions); Gaussian σ 1, 5 ε per "
        "hour of buckets at δ 1e-06"
    )
    assert lines[1:] == [
        "  feature means, ± 95 % band (too noisy, needs ≥ 28 sessions):",  # 1.96·√2/0.1
        "  pupil_mean                 1.5 ± 457 mm",
        "  fixation_rate              4 ± 178 1/s",
        "  class shares (± 4.9 points, readable): read 75.0 %, watch 25.0 %",
    ]
    kind, lines, model = describe("gazeguard/v1/cohort/lab/attention", attention.to_payload(), 8)
    assert (kind, model) == ("attention", attention)
    assert lines[1] == (
        "  dwell heatmap 2×4 over 48×27° (readable); hottest cell 50.0 % of the dwell at "
        "x +6.0°, y +6.8°"
    )
    assert lines[2:] == ["  │  ░░██  │", "  │▒▒  ░░  │"]
    kind, lines, model = describe("gazeguard/v1/cohort/lab/mode", _mode().to_payload(), 8)
    assert (kind, model) == ("mode", _mode())
    assert lines == [
        f"mode 'lab' bucket 7 (worker w1, to {clock(160.0)}): 'watch' of 2 classes (activity; "
        "permute-and-flip, ε 0.5 per bucket) — right 9 times in 10 when it leads every other "
        "class by 3.2 sessions' votes (a 10-point lead from 32 sessions); 5 ε per hour of "
        "buckets at δ 1e-06"
    ]


@pytest.mark.network
def test_watch_shows_cohort_messages_from_a_real_broker(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    """`gazeguard watch` (every device, its default) subscribed to a real Mosquitto prints the
    cohort topics' aggregates, heatmaps, modes and receipts, none 'not a gazeguard topic'."""
    aggregate, attention = _cohort_messages()
    receipt = CohortReceipt(
        session="s", cohort="lab", worker="w1", bucket=7, release="attention",
        noise_multiplier=26.6, epsilon_per_hour=5.0, delta=1e-6,
    )  # fmt: skip
    watch = Proc("watch", "--broker", mosquitto.address, cwd=tmp_path)
    try:
        watch.wait_for(f"^watching gazeguard/v1/\\+/\\+/\\+ on {mosquitto.address}")
        publish(mosquitto, "gazeguard/v1/cohort/lab/aggregates", aggregate.to_payload())
        publish(mosquitto, "gazeguard/v1/cohort/lab/attention", attention.to_payload())
        publish(mosquitto, "gazeguard/v1/cohort/lab/mode", _mode().to_payload())
        publish(mosquitto, "gazeguard/v1/hmd/s/cohort", receipt.to_payload())
        watch.wait_for("^receipt s: charged for cohort 'lab' bucket 7 \\(attention")
        code, text = watch.finish(signal.SIGINT)
    finally:
        if watch.proc.poll() is None:
            watch.proc.kill()
    assert code == ExitCode.INTERRUPTED, text
    assert "cohort 'lab' bucket 7 (worker w1, 20 s of gaze" in text, text
    assert "  class shares (± 4.9 points, readable): read 75.0 %, watch 25.0 %" in text, text
    assert "attention 'lab' bucket 7 (worker w1" in text, text
    assert "  │  ░░██  │" in text, text
    assert "mode 'lab' bucket 7 (worker w1, to " in text, text
    assert "not a gazeguard topic" not in text, text
    assert "0 chunk and label messages, 0 invalid" in text, text


# ------------------------------------------------------------------ the glossary
def test_watch_explain_prints_the_glossary_the_docs_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`watch --explain` defines every term watch prints (lo/hi, ⊥/⊤, the noise figures, each
    feature with its unit and range, the wordbook), and docs/glossary.md is the same glossary."""
    from gazeguard.signal.features import FEATURES  # noqa: PLC0415
    from gazeguard.wire.glossary import glossary_markdown  # noqa: PLC0415

    assert main(["watch", "--explain"]) == 0
    text = capsys.readouterr().out
    terms = (
        "⊥, ⊤", "lower, upper", "noise sd", "carries", "right with probability",
        "budget_exhausted", "wordbookN_distinct", "user-level ε", "about N sessions",
    )  # fmt: skip
    flat = " ".join(text.split())  # wrapped to the terminal
    for term in terms:
        assert term in flat, term
    assert "only the ramp's end carries information" in flat
    assert "wordbook2_mean 1.5: on average each pair" in flat
    for f in FEATURES:
        assert re.search(rf"^  {f.name}\n      {re.escape(f.description)}\. Unit: ", text, re.M)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "glossary.md").read_text()
    regenerate = "gazeguard watch --explain markdown > docs/glossary.md"
    assert doc == glossary_markdown(), f"regenerate: {regenerate}"
    # the legend points at it, and no printed text speaks of an undefined "lo"
    assert "gazeguard watch --explain" in LEGEND


def test_what_a_chunk_carries_names_its_bound_and_its_one_number() -> None:
    """The `carries` text of DCFPA at k = 1 (in every chunk, the banner and watch) said "the
    chunk's net change from lo", a word defined nowhere."""
    from gazeguard.privacy.mechanisms.registry import mechanism_kind  # noqa: PLC0415

    text = mechanism_kind("dcfpa").carries("dft", 1, 32)
    assert "from lo" not in text
    assert "public lower bound" in text
    assert "only its end carries information" in text
