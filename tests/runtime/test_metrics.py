"""Operator metrics: the Prometheus endpoint of a running sidecar and of a fleet worker, scraped
over HTTP during a real run (real LSL outlets, the embedded broker or a real Mosquitto) and read
with prometheus_client's own parser of the text exposition format."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gazeguard.runtime.simulate import SimulatedHeadset
from tests.cli.test_cli import FAST, REPO, Proc
from tests.conftest import MosquittoBroker

URL = r"operator metrics \(local, public figures only\) on (http://127\.0\.0\.1:\d+/metrics)"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_url(proc: Proc) -> str:
    """The metrics endpoint's URL, once ``proc``'s log names it."""
    proc.wait_for(URL)
    match = re.search(URL, proc.text)
    assert match is not None
    return match.group(1)


def scrape(url: str) -> tuple[Samples, set[str]]:
    """Every sample of the endpoint by (name, labels), and the metric families' names."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")  # the text format
        text = response.read().decode()
    out: Samples = {}
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out, names


def scrape_until(url: str, ok: object, within_s: float = 60) -> Samples:
    """Scrape until ``ok(samples)`` holds; the last scrape."""
    deadline = time.monotonic() + within_s
    while True:
        samples, _ = scrape(url)
        if ok(samples) or time.monotonic() > deadline:  # type: ignore[operator]
            return samples
        time.sleep(0.5)


def released(samples: Samples) -> float:
    return samples.get(("gazeguard_chunks_total", (("outcome", "released"),)), 0.0)


def assert_public_only(names: set[str]) -> None:
    """No family counts samples or measures how far the gaze lags (the egress rule)."""
    words = [n.removeprefix("gazeguard_") for n in names]
    assert not [w for w in words if "sample" in w or "lag" in w or "gaze" in w], names


@pytest.mark.slow
@pytest.mark.network
def test_a_running_sidecar_serves_its_metrics(tmp_path: Path, unique_id: str) -> None:
    args = [*FAST, "--features", "fixation_rate", "--ledger", "l.sqlite", "--duration", "60"]
    run = Proc(
        "run", *args, "--source-id", unique_id, "--metrics-port", "0", cwd=tmp_path,
        env={"GAZEGUARD_BROKER__PORT": "0"},
    )  # fmt: skip
    try:
        url = metrics_url(run)
        run.wait_for(r"^chunk +1 charged")
        samples = scrape_until(
            url,
            lambda s: released(s) >= 2 and s.get(("gazeguard_release_seconds_count", ()), 0) >= 1,
        )
        _, names = scrape(url)
    finally:
        code, text = run.finish(signal.SIGTERM)
    assert code == 0, text
    assert released(samples) >= 2, samples
    assert samples[("gazeguard_chunks_total", (("outcome", "withheld"),))] == 0
    assert samples[("gazeguard_sessions_open", ())] == 1
    assert samples[("gazeguard_broker_connected", ())] == 1
    assert samples[("gazeguard_broker_connections_total", ())] >= 1
    assert samples[("gazeguard_outbox_delivered_total", ())] >= 1
    assert samples[("gazeguard_outbox_pending", ())] >= 0
    assert samples[("gazeguard_chunk_charge_seconds_count", ())] >= 2
    assert samples[("gazeguard_release_seconds_count", ())] >= 1
    # the tail profile's figures are not served without metrics.tail
    assert ("gazeguard_broker_ack_seconds_count", ()) not in samples
    assert samples[("gazeguard_info", (("role", "sidecar"), ("worker", _device(text))))] == 1
    assert_public_only(names)
    assert dashboard_metrics() <= names  # every figure the Grafana dashboard plots is served
    # the endpoint goes with the run
    with pytest.raises(OSError):
        scrape(url)


def dashboard_metrics() -> set[str]:
    """The metric families the shipped Grafana dashboard's queries read."""
    doc = json.loads((REPO / "deploy" / "grafana" / "gazeguard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    found = {n for e in exprs for n in re.findall(r"\bgazeguard_\w+", e)}
    assert len(found) >= 10, found
    return {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in found}


def _device(text: str) -> str:
    """The run's device (the host name): from its banner's watch hint."""
    match = re.search(r"--device (\S+) --session", text)
    assert match is not None, text
    return match.group(1)


@pytest.mark.slow
@pytest.mark.network
def test_a_fleet_worker_serves_its_metrics_and_counts_its_samples(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """The LSL worker's metrics while it serves a stream; once the stream stops, the session
    closes and the worker's line names the samples it took (it said 0 before)."""
    name = f"metrics-{unique_id}"
    head = SimulatedHeadset(120, seed=3, name=f"{name}-hmd", source_id=f"{name}-0")
    head.start()
    worker = Proc(
        "run", "--fleet", "--source", "lsl", "--stream-name", name, "--device", "fleet",
        "--broker", f"{mosquitto.host}:{mosquitto.port}", "--ledger", "l.sqlite",
        "--metrics-port", "0", *FAST[2:], "--features", "fixation_rate", cwd=tmp_path,
        env={"GAZEGUARD_FLEET__IDLE_TIMEOUT_S": "2"},
    )  # fmt: skip
    try:
        url = metrics_url(worker)
        samples = scrape_until(
            url, lambda s: released(s) >= 1 and s.get(("gazeguard_sessions_open", ())) == 1
        )
        assert released(samples) >= 1, samples
        assert samples[("gazeguard_sessions_open", ())] == 1
        head.stop()
        worker.wait_for(r"session \S+ of device fleet closed \(")
        after = scrape_until(url, lambda s: s.get(("gazeguard_sessions_closed_total", ())) == 1)
        _, names = scrape(url)
    finally:
        head.stop()
        code, text = worker.finish(signal.SIGTERM)
    assert code == 0, text
    assert after[("gazeguard_sessions_open", ())] == 0
    assert after[("gazeguard_sessions_closed_total", ())] == 1
    assert released(after) >= released(samples)  # a counter: the closed session's chunks stay
    assert after[("gazeguard_sessions_refused_total", ())] == 0
    worker_id = next(k[1][1][1] for k in after if k[0] == "gazeguard_info")
    assert after[("gazeguard_info", (("role", "fleet"), ("worker", worker_id)))] == 1
    assert_public_only(names)
    closed = re.search(r"closed \((\d+) samples, (\d+) chunks? released\)", text)
    assert closed is not None, text
    assert int(closed.group(1)) > 100, text  # about 120 a second while it streamed
    assert int(closed.group(2)) >= 1, text
