"""`gazeguard dashboard` against real parts: a real Mosquitto, a real
`gazeguard run --fleet --cohort` over simulated LSL headsets, the dashboard as a subprocess, and
the page in a real headless Chromium driven by Selenium, read through its DOM and its pixels
(a screenshot of the heatmap). The readability figures are checked against the release plan.

The browser test needs Debian's `chromium` and `chromium-driver` (.ci/run installs them) and the
`selenium` package (the `test` extra): without them it is skipped with what to install, except
under CI (CI=true), where it fails instead.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.config import load_settings
from gazeguard.plan import ReleasePlan
from gazeguard.plan.cohort import plan_cohort
from gazeguard.privacy.mechanisms.selection import lead_for
from gazeguard.runtime.dashboard import Board
from gazeguard.runtime.dashboard.readability import (
    READABLE_SHARE,
    aggregate_readability,
    attention_readability,
    mode_readability,
    sessions_needed,
)
from gazeguard.runtime.simulate import SimulatedHeadset
from gazeguard.wire.cohort import (
    AoiShare,
    AttentionMessage,
    CohortFeature,
    CohortMessage,
    ModeMessage,
)
from tests.conftest import MosquittoBroker, Subscriber, free_port, publish

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1300,1600",
]  # fmt: skip
Z95 = 1.96


def wait_for(predicate: Callable[[], object], within_s: float, what: Callable[[], str]) -> Any:
    """Poll ``predicate`` every 50 ms until it returns something truthy (returned); fail with
    ``what()`` after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within_s:g} s\n{what()}")
        time.sleep(0.05)


def env() -> dict[str, str]:
    """This checkout first on the path, no GAZEGUARD_* settings from the caller."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), e.get("PYTHONPATH", "")])
    return e


class Proc:
    """A ``python -m gazeguard ARGS`` process whose stdout and stderr go to a file (readable
    while it runs)."""

    def __init__(
        self, workdir: Path, name: str, *args: str, extra_env: dict[str, str] | None = None
    ):
        self.log = workdir / f"{name}.log"
        self._out: IO[bytes] = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gazeguard", *args],
            stdout=self._out, stderr=self._out, cwd=workdir, env=env() | (extra_env or {}),
        )  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Send ``sig`` and reap (SIGKILL after 30 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._out.close()
        return code


def cohort_worker(
    tmp_path: Path,
    broker: MosquittoBroker,
    stream: str,
    features: str,
    releases: str,
    *extra: str,
    extra_env: dict[str, str] | None = None,
) -> Proc:
    """A verbose ``gazeguard run --fleet`` worker over the LSL streams named ``stream``: chunks of
    ``features`` (a 2 s window, a step every 50 ms, 200 ε per hour) and, per 2-s bucket after a
    1-s grace, cohort ``lab``'s ``releases`` (``--cohort-release``); ``extra`` flags and
    ``extra_env`` added."""
    return Proc(
        tmp_path, "worker", "-v", "run", "--fleet", "--source", "lsl", "--stream-name", stream,
        "--device", "fleet", "--broker", broker.address, "--ledger", str(tmp_path / "l.sqlite"),
        "--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32",
        "--budget-per-hour", "200", "--features", features,
        "--cohort", "lab", "--bucket-s", "2", "--cohort-release", releases, *extra,
        extra_env={"GAZEGUARD_COHORT__GRACE_S": "1", **(extra_env or {})},
    )  # fmt: skip


def start_dashboard(tmp_path: Path, broker: str, *more: str) -> tuple[Proc, str]:
    """The dashboard on a free port, and the URL its start line names."""
    dash = Proc(tmp_path, "dashboard", "dashboard", "--port", "0", "--broker", broker, *more)
    found = wait_for(
        lambda: re.search(r"gazeguard dashboard: open (http://\S+)", dash.text()),
        30,
        dash.text,
    )
    return dash, found.group(1)


def get(
    url: str, path: str, method: str = "GET", host: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request to the dashboard: status, headers (lower-case names), body."""
    m = re.match(r"http://([^:/]+):(\d+)/", url)
    assert m is not None, url
    conn = http.client.HTTPConnection(m.group(1), int(m.group(2)), timeout=10)
    try:
        conn.request(method, path, headers={"Host": host} if host else {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def synthetic_aggregate(cohort: str = "reading", bucket: int = 10) -> CohortMessage:
    """A valid aggregate with classes (the fleet run publishes none: the shipped label model
    needs 30-s windows, too slow for this test)."""
    hist = [200.5, 150.25, -3.0]
    total = sum(max(h, 0.0) for h in hist)
    return CohortMessage(
        cohort=cohort, worker="w2", bucket=bucket, bucket_start=bucket * 60.0,
        bucket_end=(bucket + 1) * 60.0, noisy_count=412.3, count=412,
        features=[CohortFeature(name="pupil_mean", unit="mm", noisy_sum=100.0, mean=3.52,
                                sd=0.041)],
        classes=["read", "watch", "browse"], noisy_histogram=hist,
        shares=[max(h, 0.0) / total for h in hist], sigma=7.3, sensitivity_l2=math.sqrt(3),
        epsilon_per_hour=5.0, delta=5e-7, profile="activity", model="activity",
        noise="INSECURE-seeded",
    )  # fmt: skip


def synthetic_mode(bucket: int, mode: str, cohort: str = "reading") -> ModeMessage:
    """A valid mode message of worker w2 over the synthetic aggregate's classes (ε 0.1 per
    bucket: a lead of about 22.7 sessions names the true mode 9 times in 10)."""
    classes = ["read", "watch", "browse"]
    return ModeMessage(
        cohort=cohort, worker="w2", bucket=bucket, bucket_start=bucket * 60.0,
        bucket_end=(bucket + 1) * 60.0, classes=classes, mode=mode,
        mode_index=classes.index(mode), epsilon=0.1, lead_for_90=lead_for(0.9, 0.1, 3),
        epsilon_per_hour=5.0, delta=5e-7, profile="activity", model="activity",
        noise="INSECURE-seeded",
    )  # fmt: skip


# ---------------------------------------------------------------------------------- the browser


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium through chromedriver (Debian's), a fresh profile, no network of its own;
    skipped with what to install when they are missing (a failure under CI=true)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        from selenium import webdriver  # noqa: PLC0415
        from selenium.webdriver.chrome.options import Options  # noqa: PLC0415
        from selenium.webdriver.chrome.service import Service  # noqa: PLC0415
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
    if missing:
        why = (
            f"headless browser test needs {', '.join(missing)}: apt-get install -y chromium "
            "chromium-driver; .ci/run installs them"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    profile = tempfile.mkdtemp(prefix="gazeguard-chromium-")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (:func:`chromium`)."""
    with chromium() as driver:
        yield driver


#: Finds ``card``, the card of one (cohort, worker) (null when there is none), for a script.
FIND_CARD = """
const [cohort, worker] = arguments;
const section = [...document.querySelectorAll('section.cohort')]
  .find(s => s.dataset.cohort === cohort);
if (!section) return null;
const card = [...section.querySelectorAll('.worker')].find(c => c.dataset.worker === worker);
if (!card) return null;
"""

#: The card of one (cohort, worker) as the page shows it: every figure's text.
READ_CARD = (
    FIND_CARD
    + """
const text = (root, sel) => { const n = root.querySelector(sel); return n ? n.textContent : null; };
const mark = (root) => {
  const m = root && root.querySelector('.readability');
  if (!m) return null;
  return {readable: m.dataset.readable, sessions: Number(m.dataset.sessions), text: m.textContent};
};
return {
  bucket: text(card, '.bucket .value'),
  count: text(card, '.count .value'), about: text(card, '.count .about'),
  count_mark: mark(card.querySelector('.count')),
  verdict: text(card, '.verdict'),
  count_lo: text(card, '.count .lo'), count_hi: text(card, '.count .hi'),
  epsilon: text(card, '.epsilon .value'), delta: text(card, '.epsilon .delta'),
  sigma: text(card, '.sigma .value'), noise: text(card, '.sigma .source'),
  features: [...card.querySelectorAll('tr.feature')].map(r => ({
    name: r.dataset.feature, mean: text(r, '.mean'), unit: text(r, '.unit'),
    lo: text(r, '.lo'), hi: text(r, '.hi'), sd: text(r, '.sd'),
    spark: r.querySelectorAll('svg.spark polyline.mean').length, mark: mark(r)})),
  classes: [...card.querySelectorAll('tr.class')].map(r => ({
    name: r.dataset.class, share: text(r, '.share'), lo: text(r, '.lo'), hi: text(r, '.hi'),
    mark: mark(r)})),
};
"""
)

BROKER_STATE = "return document.getElementById('broker').dataset.state"

READ_ATTENTION = (
    FIND_CARD
    + """
const a = card.querySelector('.attention');
const svg = a.querySelector('svg.heatmap');
const nodata = a.querySelector('.nodata');
const mark = a.querySelector('.heatmap-figure .readability');
return {
  nodata: nodata ? {reason: nodata.dataset.reason, text: nodata.textContent} : null,
  note: a.querySelector('.note') ? a.querySelector('.note').textContent : null,
  rows: svg ? Number(svg.dataset.rows) : null, cols: svg ? Number(svg.dataset.cols) : null,
  cells: [...a.querySelectorAll('rect.cell')].map(r => Number(r.dataset.value)),
  fills: [...new Set([...a.querySelectorAll('rect.cell')].map(r => r.getAttribute('fill')))].length,
  labels: [...a.querySelectorAll('svg.heatmap text')].map(t => t.textContent),
  mark: mark ? {readable: mark.dataset.readable, sessions: Number(mark.dataset.sessions)} : null,
  aois: [...a.querySelectorAll('tr.aoi')].map(r => ({
    name: r.dataset.aoi, share: r.querySelector('.share').textContent,
    mark: r.querySelector('.readability') ? r.querySelector('.readability').dataset.readable
                                          : null})),
};
"""
)

#: Every noisy figure on the page (an element with a 95 % band, a heatmap) without a
#: readability marker beside it: its description.
UNMARKED = """
const out = [];
for (const row of document.querySelectorAll('tr.feature, tr.class, tr.aoi, dd.count')) {
  if (!row.querySelector('.readability[data-readable]')) out.push(row.className);
}
for (const fig of document.querySelectorAll('.heatmap-figure')) {
  if (!fig.querySelector('.readability[data-readable]')) out.push('heatmap');
}
for (const latest of document.querySelectorAll('.mode .latest')) {
  if (!latest.querySelector('.readability[data-readable]')) out.push('mode');
}
return out;
"""


READ_MODE = (
    FIND_CARD
    + """
const m = card.querySelector('.mode');
const mark = m.querySelector('.latest .readability');
return {
  latest: m.querySelector('.latest .value') ? m.querySelector('.latest .value').textContent : null,
  slots: [...m.querySelectorAll('svg.timeline rect.slot')].map(r => ({
    bucket: Number(r.dataset.bucket), mode: r.dataset.mode, fill: r.getAttribute('fill')})),
  legend: [...m.querySelectorAll('ul.classes li')].map(li => li.textContent.trim()),
  mark: mark ? {readable: mark.dataset.readable, sessions: Number(mark.dataset.sessions)} : null,
  nodata: m.querySelector('.nodata') ? m.querySelector('.nodata').textContent : null,
};
"""
)


def close(text: str | None, value: float, rel: float = 1e-3) -> bool:
    """The page's 4-significant-digit text of ``value``."""
    return text is not None and float(text) == pytest.approx(value, rel=rel, abs=1e-9)


def assert_card_shows(card: dict[str, Any], m: CohortMessage) -> None:
    """Every figure of ``m`` on its card, bands at ± 1.96 sd."""
    assert card["bucket"] == str(m.bucket)
    assert close(card["count"], m.noisy_count), (card, m)
    sd_count = m.sigma if m.features else m.sigma * math.sqrt(len(m.classes))
    assert close(card["count_lo"], m.noisy_count - Z95 * sd_count), (card, m)
    assert close(card["count_hi"], m.noisy_count + Z95 * sd_count), (card, m)
    assert close(card["epsilon"], m.epsilon_per_hour), (card, m)
    assert float(card["delta"]) == m.delta
    assert close(card["sigma"], m.sigma)
    assert [f["name"] for f in card["features"]] == [f.name for f in m.features]
    for shown, f in zip(card["features"], m.features, strict=True):
        assert close(shown["mean"], f.mean), (shown, f)
        assert close(shown["sd"], f.sd), (shown, f)
        assert close(shown["lo"], f.mean - Z95 * f.sd), (shown, f)
        assert close(shown["hi"], f.mean + Z95 * f.sd), (shown, f)
        assert shown["unit"] == f.unit
        assert shown["spark"] == 1
    assert [c["name"] for c in card["classes"]] == list(m.classes)
    total = sum(max(h, 0.0) for h in m.noisy_histogram)
    for shown, share, h in zip(card["classes"], m.shares, m.noisy_histogram, strict=True):
        assert float(shown["share"]) == pytest.approx(100 * share, abs=0.051), (shown, share)
        lo = min(1.0, max(0.0, (h - Z95 * m.sigma) / total))
        hi = min(1.0, max(0.0, (h + Z95 * m.sigma) / total))
        assert float(shown["lo"]) == pytest.approx(100 * lo, abs=0.051), (shown, lo)
        assert float(shown["hi"]) == pytest.approx(100 * hi, abs=0.051), (shown, hi)


@pytest.mark.network
@pytest.mark.slow
def test_the_page_shows_a_fleets_cohort_aggregates_as_they_arrive(
    tmp_path: Path, unique_id: str, browser: Any
) -> None:
    """The dashboard starts before its broker (one notice, no traceback) and subscribes once
    Mosquitto is up; a fleet worker serving three simulated headsets publishes a 2-s bucket's
    aggregate and attention heatmap; the page in headless Chromium shows that aggregate's
    figures — the same as a separate MQTT subscriber received — with bands of ± 1.96 sd, a
    readability marker on every figure whose sessions needed are the release plan's, and the
    heatmap as a picture (its screenshot's pixels, not only its elements); `gazeguard watch`
    prints the same aggregates and heatmaps; a worker without attention is told what to enable;
    Ctrl-C stops the dashboard with one line and exit 130."""
    broker = MosquittoBroker(tmp_path)  # not started yet
    dash, url = start_dashboard(tmp_path, broker.address)
    heads: list[SimulatedHeadset] = []
    worker: Proc | None = None
    watch: Proc | None = None
    sub: Subscriber | None = None
    try:
        wait_for(lambda: "cannot reach broker" in dash.text(), 30, dash.text)
        browser.get(url)  # the page says so too, and that nothing has arrived
        wait_for(lambda: browser.execute_script(BROKER_STATE) == "waiting", 20, dash.text)
        assert browser.execute_script("return document.getElementById('empty').hidden") is False
        broker.start()
        wait_for(lambda: "subscribed to" in dash.text(), 30, dash.text)
        wait_for(lambda: browser.execute_script(BROKER_STATE) == "connected", 20, dash.text)
        sub = Subscriber(broker, f"sub-{unique_id}")
        watch = Proc(tmp_path, "watch", "watch", "--broker", broker.address, "--features", "3")
        name = f"dash-{unique_id}"
        heads = [
            SimulatedHeadset(120, seed=i, name=name, source_id=f"{name}-{i}") for i in range(3)
        ]
        for h in heads:
            h.start()
        worker = cohort_worker(tmp_path, broker, name, FLEET_FEATURES, "means,attention")
        logs = lambda: f"--- worker\n{worker.text()}\n--- dashboard\n{dash.text()}"  # noqa: E731

        # one worker's card appears with a bucket and its heatmap; read both at once (buckets
        # keep coming)
        def card_and_heatmap() -> tuple[dict[str, Any], dict[str, Any]] | None:
            wid = _worker_id(worker)
            card = browser.execute_script(READ_CARD, "lab", wid)
            att = browser.execute_script(READ_ATTENTION, "lab", wid)
            return (card, att) if card and card["bucket"] and att and att["cells"] else None

        card, att = wait_for(card_and_heatmap, 60, logs)
        topic = "gazeguard/v1/cohort/lab/aggregates"

        def received() -> CohortMessage | None:
            with sub.lock:
                found = [
                    CohortMessage.model_validate_json(p) for t, p, _ in sub.messages if t == topic
                ]
            return next((m for m in found if str(m.bucket) == card["bucket"]), None)

        message = wait_for(received, 20, logs)
        assert_card_shows(card, message)
        assert card["noise"] == "os-csprng"

        # readability: three headsets are far too few at this budget; every marker says so,
        # with the plan's sessions needed
        plan = fleet_plan()
        part = plan.part("attention")
        assert part is not None
        needed_means = least_sessions(
            lambda n: bool(np.all(Z95 * plan.mean_sd(n) / (plan.hi - plan.lo) <= READABLE_SHARE))
        )
        assert message.sigma == pytest.approx(plan.sigma)
        assert {f["mark"]["sessions"] for f in card["features"]} == {needed_means}, card
        assert {f["mark"]["readable"] for f in card["features"]} == {"no"}, card
        assert card["count_mark"]["readable"] == "no", card
        assert card["count_mark"]["sessions"] == least_sessions(
            lambda n: Z95 * plan.sigma / n <= READABLE_SHARE
        )
        assert f"≥ {needed_means:,} sessions" in card["features"][0]["mark"]["text"]
        assert card["about"] == str(max(0, round(message.noisy_count)))
        assert card["verdict"].startswith("Too few sessions to read any figure"), card["verdict"]
        assert att["mark"] == {
            "readable": "no",
            "sessions": least_sessions(lambda n: Z95 * part.sigma / n <= 1 / 144),
        }, att
        assert browser.execute_script(UNMARKED) == []

        # the heatmap: 9 × 16 cells, the message's shares, drawn in more than one colour, and
        # its screenshot is a picture (most of it coloured, many colours), not an empty frame
        assert (att["rows"], att["cols"]) == (9, 16)
        assert len(att["cells"]) == 144
        assert sum(att["cells"]) == pytest.approx(1.0, abs=1e-6), "shares of the dwell"
        assert att["fills"] > 3, att
        assert att["labels"] == ["+13.5°", "−13.5°", "−24°", "0°", "+24°"]
        shot = element_png(browser, ".worker svg.heatmap")
        (tmp_path / "heatmap.png").write_bytes(shot)
        browser.save_screenshot(str(tmp_path / "dashboard.png"))
        coloured, colours = heatmap_pixels(shot)
        assert coloured > 0.5, f"only {coloured:.0%} of the heatmap's pixels are coloured"
        assert colours > 3, f"{colours} colours in the heatmap"

        # `gazeguard watch` shows the same cohort's aggregates and heatmaps
        wait_for(
            lambda: (
                re.search(r"^cohort 'lab' bucket \d+ \(worker ", watch.text(), re.M)
                and re.search(r"^attention 'lab' bucket \d+ \(worker ", watch.text(), re.M)
                and "dwell heatmap 9×16 over 48×27° (too noisy, needs ≥" in watch.text()
            ),
            30,
            watch.text,
        )
        assert "not a gazeguard topic" not in watch.text(), watch.text()
        assert "INVALID" not in watch.text(), watch.text()

        # class shares with their bands, from an aggregate with classes; a worker without
        # attention: first "not yet", then, after two buckets, what to enable
        synthetic = synthetic_aggregate()
        publish(broker, "gazeguard/v1/cohort/reading/aggregates", synthetic.to_payload())
        shown = wait_for(lambda: browser.execute_script(READ_CARD, "reading", "w2"), 20, logs)
        assert_card_shows(shown, synthetic)
        assert "NOT private" in shown["noise"]
        assert {c["mark"]["readable"] for c in shown["classes"]} == {"yes"}, shown
        assert shown["count_mark"]["readable"] == "yes", shown
        assert shown["verdict"].startswith("Every figure of this bucket is readable"), shown
        nodata = browser.execute_script(READ_ATTENTION, "reading", "w2")["nodata"]
        assert nodata["reason"] == "waiting", nodata
        publish(
            broker, "gazeguard/v1/cohort/reading/aggregates",
            synthetic_aggregate(bucket=11).to_payload(),
        )  # fmt: skip
        nodata = wait_for(
            lambda: (
                (n := browser.execute_script(READ_ATTENTION, "reading", "w2")["nodata"])["reason"]
                == "not-released"
                and n
            ),
            20,
            logs,
        )
        assert "releases no attention" in nodata["text"]
        assert 'cohort.release = ["means", "attention"]' in nodata["text"]
        assert "--cohort-release means,attention" in nodata["text"]
        assert browser.execute_script(UNMARKED) == []

        # the mode per bucket over time: a timeline of the modes kept, the latest named, its
        # marker from the same bucket's count (412 sessions: a 10-point lead is 41, more than
        # the 22.7 that permute-and-flip at ε 0.1 needs)
        modes = {12: "watch", 10: "read", 11: "read", 14: "browse"}  # 13 lost: a gap
        for bucket, mode in modes.items():
            publish(
                broker, "gazeguard/v1/cohort/reading/mode",
                synthetic_mode(bucket, mode).to_payload(),
            )  # fmt: skip
        timeline = wait_for(
            lambda: (
                (t := browser.execute_script(READ_MODE, "reading", "w2"))["slots"]
                and len(t["slots"]) == len(modes)
                and t
            ),
            20,
            logs,
        )
        assert [(x["bucket"], x["mode"]) for x in timeline["slots"]] == sorted(modes.items())
        fills = {x["mode"]: x["fill"] for x in timeline["slots"]}
        assert len(set(fills.values())) == 3, fills  # one colour per class
        assert timeline["latest"] == "browse"
        assert timeline["legend"] == ["read (2 of 4)", "watch (1 of 4)", "browse (1 of 4)"]
        need = math.ceil(lead_for(0.9, 0.1, 3) / READABLE_SHARE)
        assert timeline["mark"] == {"readable": "unknown", "sessions": need}, timeline
        publish(
            broker, "gazeguard/v1/cohort/reading/aggregates",
            synthetic_aggregate(bucket=14).to_payload(),
        )  # fmt: skip
        wait_for(
            lambda: browser.execute_script(READ_MODE, "reading", "w2")["mark"]["readable"] == "yes",
            20,
            logs,
        )
        assert browser.execute_script(READ_MODE, "lab", _worker_id(worker))["nodata"]
        shot = element_png(browser, ".mode svg.timeline")
        coloured, colours = heatmap_pixels(shot)
        assert coloured > 0.3, coloured  # 4 columns of 5 and the times below them
        assert colours >= 3, colours
        assert browser.execute_script(UNMARKED) == []

        # the AOI shares beside a heatmap, each with its band and marker
        publish(
            broker, "gazeguard/v1/cohort/reading/attention", synthetic_attention(14).to_payload()
        )
        att = wait_for(
            lambda: (a := browser.execute_script(READ_ATTENTION, "reading", "w2"))["aois"] and a,
            20,
            logs,
        )
        assert att["aois"] == [
            {"name": "video", "share": "75.0", "mark": "yes"},
            {"name": "elsewhere", "share": "25.0", "mark": "yes"},
        ]
        assert (att["rows"], att["cols"]) == (2, 3)
        assert att["mark"]["sessions"] == math.ceil(Z95 * 0.5 * 6)
        assert browser.execute_script(UNMARKED) == []
        browser.execute_script(
            "document.querySelector('section.cohort[data-cohort=reading]').scrollIntoView()"
        )
        browser.save_screenshot(str(tmp_path / "reading.png"))
    finally:
        codes = {"worker": worker.stop() if worker else 0}
        for h in heads:
            h.stop()
        if sub is not None:
            sub.close()
        codes["dashboard"] = dash.stop(signal.SIGINT)
        if watch is not None:
            watch.stop(signal.SIGINT)
        broker.stop()
    text = dash.text()
    assert codes == {"worker": 0, "dashboard": 130}, (codes, text)
    assert "Traceback" not in text, text
    assert "ERROR" not in text, text
    lines = text.strip().splitlines()
    assert lines[-1] == "gazeguard dashboard: stopped (Ctrl-C)", text
    assert len([ln for ln in lines if "cannot reach broker" in ln]) == 1, "one notice per outage"


FLEET_FEATURES = "fixation_rate,saccade_rate,pupil_mean"


def fleet_plan() -> Any:
    """The cohort plan of the fleet worker the browser test runs."""
    config = load_settings(
        None, fleet={"enabled": True}, ingest={"source": "lsl"},
        features={"window_s": 2, "step_s": 0.05}, ledger={"budget_per_hour": 200},
        mechanism={"chunk_steps": 32, "features": FLEET_FEATURES.split(",")},
        cohort={"enabled": True, "name": "lab", "bucket_s": 2, "grace_s": 1,
                "release": ["means", "attention"]},
    )  # fmt: skip
    plan = ReleasePlan.from_settings(config).cohort_plan
    assert plan is not None
    return plan


def least_sessions(readable: Callable[[int], bool], top: int = 10**7) -> int:
    """The least ``n`` with ``readable(n)`` (monotone), by bisection."""
    lo, hi = 1, top
    assert readable(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if readable(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def element_png(browser: Any, selector: str, attempts: int = 10) -> bytes:
    """A screenshot (PNG) of the element `selector` names. The page redraws a worker's card with
    every message (a bucket every 2 s), so the element found can be replaced before its picture
    is taken (StaleElementReferenceException, CI at 0b783ef): find it again and retake. Each retry
    needs another redraw inside the few milliseconds between find and screenshot."""
    from selenium.common.exceptions import StaleElementReferenceException  # noqa: PLC0415

    for attempt in range(attempts):
        try:
            png: bytes = browser.find_element("css selector", selector).screenshot_as_png
        except StaleElementReferenceException:
            if attempt == attempts - 1:
                raise
            continue
        return png
    raise AssertionError("unreachable")


def heatmap_pixels(png: bytes) -> tuple[float, int]:
    """A screenshot's share of coloured pixels (saturated: not the page's white, grey or black
    text) and how many distinct colours those have (quantised to 16 levels per channel)."""
    from PIL import Image  # noqa: PLC0415

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16).reshape(-1, 3)
    coloured = pixels[pixels.max(axis=1) - pixels.min(axis=1) > 40]
    levels = {tuple(c) for c in (coloured >> 4).tolist()}
    return len(coloured) / len(pixels), len(levels)


def _worker_id(worker: Proc) -> str:
    """The fleet worker's id, from its log (``worker <id>: cohort …``)."""
    m = re.search(r"worker (\S+): cohort", worker.text())
    return m.group(1) if m else "?"


# ---------------------------------------------------------------------------- the server alone


@pytest.mark.network
def test_the_server_is_read_only_and_answers_loopback_names_only(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """The page, its script and style, the event stream and the snapshot; everything but GET and
    HEAD refused; a Host that is not a loopback name refused (DNS rebinding); invalid and
    duplicate aggregates are counted or dropped, never shown twice."""
    dash, url = start_dashboard(tmp_path, mosquitto.address, "--history", "5")
    try:
        wait_for(lambda: "subscribed to" in dash.text(), 30, dash.text)
        status, headers, body = get(url, "/")
        assert status == 200
        assert headers["content-type"].startswith("text/html")
        assert b'src="dashboard.js"' in body
        assert b"1.96" in body
        assert "script-src 'self'" in headers["content-security-policy"]
        for path, kind in (("/dashboard.js", "text/javascript"), ("/dashboard.css", "text/css")):
            status, headers, body = get(url, path)
            assert (status, headers["content-type"].split(";")[0]) == (200, kind)
            assert body
        assert get(url, "/nope")[0] == 404
        assert get(url, "/", method="POST")[0] == 405
        assert get(url, "/", host="evil.example:80")[0] == 421
        assert get(url, "/", host="localhost:1")[0] == 200
        status, headers, body = get(url, "/events", method="HEAD")
        assert status == 200
        assert headers["content-type"].startswith("text/event-stream")

        topic = "gazeguard/v1/cohort/reading/aggregates"
        message = synthetic_aggregate()
        for payload in (message.to_payload(), message.to_payload(), b'{"schema": 1}'):
            publish(mosquitto, topic, payload)

        def state() -> dict[str, Any]:
            return json.loads(get(url, "/state.json")[2])

        snap = wait_for(lambda: (s := state())["invalid"]["count"] and s, 20, dash.text)
        assert [(a["cohort"], a["bucket"]) for a in snap["aggregates"]] == [("reading", 10)]
        assert snap["aggregates"][0]["shares"] == message.shares
        assert "not a valid gazeguard.cohort/1 aggregate" in snap["invalid"]["last"]
        assert snap["broker"]["state"] == "connected"
        # late and newer buckets are kept in order, at most --history of them
        for bucket in (15, 11, 14, 12, 13, 16):
            publish(mosquitto, topic, synthetic_aggregate(bucket=bucket).to_payload())
        wait_for(lambda: state()["aggregates"][-1]["bucket"] == 16, 20, dash.text)
        assert [a["bucket"] for a in state()["aggregates"]] == [12, 13, 14, 15, 16]
    finally:
        code = dash.stop(signal.SIGTERM)
    assert code == 0, dash.text()
    assert dash.text().strip().splitlines()[-1] == "gazeguard dashboard: stopped", dash.text()


def test_help_and_a_taken_port(tmp_path: Path) -> None:
    """`--help` says what the page shows, what the band is and the broker default; a port in use
    is one error line (exit 1), no traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "gazeguard", "dashboard", "--help"],
        capture_output=True, text=True, env=env(), timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    flat = " ".join(out.stdout.split())
    for words in ("--host", "--port", "--broker", "127.0.0.1:1883", "1.96", "never publishes"):
        assert words in flat, (words, out.stdout)
    import socket  # noqa: PLC0415

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "gazeguard", "dashboard", "--port", str(port),
             "--broker", f"127.0.0.1:{free_port()}"],
            capture_output=True, text=True, env=env(), timeout=60, check=False, cwd=tmp_path,
        )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert f"cannot listen on 127.0.0.1:{port}" in line
    assert "--port" in line


# ---------------------------------------------------------------------------- the board alone


def synthetic_attention(bucket: int = 10, worker: str = "w2") -> AttentionMessage:
    """A valid attention message: a 2 × 3 heatmap with AOI shares."""
    grid = [[0.5, 3.0, -1.0], [10.0, 0.25, 0.0]]
    total = sum(max(v, 0.0) for row in grid for v in row)
    return AttentionMessage(
        cohort="reading", worker=worker, bucket=bucket, bucket_start=bucket * 60.0,
        bucket_end=(bucket + 1) * 60.0, rows=2, cols=3, fov_deg=[48.0, 27.0], grid=grid,
        heatmap=[[max(v, 0.0) / total for v in row] for row in grid], noisy_count=12.75,
        aois=[AoiShare(name="video", noisy_dwell=9.0, share=0.75),
              AoiShare(name="elsewhere", noisy_dwell=3.0, share=0.25)],
        aoi_file="demo_aois.json", sigma=0.5, sensitivity_l2=math.sqrt(2), epsilon_per_hour=5.0,
        delta=5e-7, noise="INSECURE-seeded",
    )  # fmt: skip


def test_attention_is_validated_kept_per_worker_and_judged() -> None:
    """An attention message validates as gazeguard.attention/1 (anything else is counted
    invalid, not drawn); the latest bucket of each (cohort, worker) is kept, with its
    readability: the heatmap's band against an even spread's share of a cell, the AOIs'
    against the share scale."""
    board = Board("gazeguard/v1")
    topic = "gazeguard/v1/cohort/reading/attention"
    for message in (synthetic_attention(10), synthetic_attention(9), synthetic_attention(10),
                    synthetic_attention(11, worker="w3")):  # fmt: skip
        board.receive(topic, message.to_payload())
    assert sorted(board.attention) == [("reading", "w2"), ("reading", "w3")]
    kept = board.attention[("reading", "w2")]
    assert kept["bucket"] == 10
    heat = kept["readability"]["heatmap"]
    total = 0.5 + 3.0 + 10.0 + 0.25
    assert heat["half_width"] == pytest.approx(Z95 * 0.5 / total)
    assert heat["limit"] == pytest.approx(1 / 6)
    assert heat["readable"] is (Z95 * 0.5 / total <= 1 / 6)
    assert heat["sessions"] == math.ceil(Z95 * 0.5 * 6)
    aois = kept["readability"]["aois"]
    assert aois["sessions"] == math.ceil(Z95 * 0.5 / READABLE_SHARE)
    assert aois["readable"] is True  # ± 1.96·0.5/12 = 8 points
    for bad in (b'{"grid": [[1, 2]]}', b"\xff", synthetic_aggregate().to_payload()):
        board.receive(topic, bad)
    assert board.invalid == 3
    assert "not a valid gazeguard.attention/1 message" in (board.last_invalid or "")


def test_a_few_sessions_are_marked_too_noisy_with_the_sessions_needed() -> None:
    """The page's complaint of old: a noisy count of 0.14 and means at a bound, with no word.
    Now the count and every mean are 'too noisy' and say the sessions they need."""
    m = synthetic_aggregate().model_copy(update={"noisy_count": 0.14, "count": 1, "sigma": 26.7})
    read = aggregate_readability(m)
    assert read["count"]["readable"] is False
    assert read["count"]["sessions"] == math.ceil(Z95 * 26.7 / 0.1)
    assert read["means"]["readable"] is False
    assert read["means"]["sessions"] == math.ceil(Z95 * 26.7 / 0.1)  # one feature: √F = 1
    assert read["shares"]["readable"] is False
    nobody = m.model_copy(update={"noisy_count": -3.0})
    assert aggregate_readability(nobody)["count"]["half_width"] is None  # unbounded: JSON null
    json.dumps(aggregate_readability(nobody), allow_nan=False)


@given(
    features=st.integers(1, 48),
    budget=st.floats(0.5, 50.0),
    per_hour=st.integers(1, 3600),
    width=st.floats(1e-3, 1e3),
)
@settings(max_examples=40, deadline=None)
def test_the_sessions_a_mean_needs_are_the_plans(
    features: int, budget: float, per_hour: int, width: float
) -> None:
    """For any plan, the sessions a mean needs (from the message alone: σ and the number of
    features) are the least n at which the plan's noise sd of a mean,
    CohortPlan.mean_sd(n), gives a 95 % band within 10 % of the public range; a message at
    that count is readable and one at a session fewer is not."""
    names = [f"f{i}" for i in range(features)]
    plan = plan_cohort(
        names, [0.0] * features, [width] * features, ["u"] * features, (),
        bucket_s=60.0, per_hour=per_hour, budget=budget, delta=1e-6,
    )  # fmt: skip
    want = least_sessions(
        lambda n: bool(np.all(Z95 * plan.mean_sd(n) / (plan.hi - plan.lo) <= READABLE_SHARE)),
        top=10**9,
    )

    def message(n: int) -> CohortMessage:
        sd = plan.mean_sd(n)
        return CohortMessage(
            cohort="c", worker="w", bucket=1, bucket_start=60.0, bucket_end=120.0,
            noisy_count=float(n), count=n,
            features=[CohortFeature(name=f, unit="u", noisy_sum=0.0, mean=0.0, sd=float(s))
                      for f, s in zip(names, sd, strict=True)],
            classes=[], noisy_histogram=[], shares=[], sigma=plan.sigma,
            sensitivity_l2=plan.sensitivity_l2, epsilon_per_hour=plan.epsilon_per_hour,
            delta=1e-6, profile="p", model=None, noise="os-csprng",
        )  # fmt: skip

    means = aggregate_readability(message(want))["means"]
    assert means["sessions"] == want
    assert means["readable"] is True
    if want > 1:
        assert aggregate_readability(message(want - 1))["means"]["readable"] is False


@given(sd=st.floats(1e-6, 1e6), limit=st.sampled_from([READABLE_SHARE, 1 / 144, 0.5]))
def test_sessions_needed_is_the_least_that_suffices(sd: float, limit: float) -> None:
    n = sessions_needed(sd, limit)
    assert n >= 1
    assert Z95 * sd / n <= limit
    assert n == 1 or Z95 * sd / (n - 1) > limit


def test_a_heatmap_without_attention_readability_has_none() -> None:
    m = synthetic_attention().model_copy(
        update={"rows": None, "cols": None, "fov_deg": None, "grid": None, "heatmap": None}
    )
    assert attention_readability(m)["heatmap"] is None
    assert attention_readability(m)["aois"] is not None


def test_modes_are_validated_kept_in_order_and_say_what_they_need() -> None:
    board = Board("gazeguard/v1", history=3)
    topic = "gazeguard/v1/cohort/reading/mode"
    for bucket, mode in ((5, "read"), (5, "read"), (7, "watch"), (6, "read"), (8, "browse"),
                         (1, "read")):  # fmt: skip
        board.receive(topic, synthetic_mode(bucket, mode).to_payload())
    kept = board.modes[("reading", "w2")]
    assert [(m["bucket"], m["mode"]) for m in kept] == [(6, "read"), (7, "watch"), (8, "browse")]
    need = mode_readability(synthetic_mode(1, "read"))
    assert need["sessions"] == math.ceil(lead_for(0.9, 0.1, 3) / READABLE_SHARE)
    assert need["readable"] is None  # the mode carries no count
    assert [m["bucket"] for m in board.snapshot().data["modes"]] == [6, 7, 8]
    bad = json.loads(synthetic_mode(9, "read").to_payload()) | {"mode": "dance"}
    board.receive(topic, json.dumps(bad).encode())
    assert board.invalid == 1
    assert "not a valid gazeguard.mode/1 message" in (board.last_invalid or "")


def test_the_board_keeps_one_copy_of_each_bucket_in_order() -> None:
    board = Board("gazeguard/v1", history=3)
    queue = board.listen()
    topic = "gazeguard/v1/cohort/reading/aggregates"
    for bucket in (5, 5, 7, 6, 4, 8, 1):
        board.receive(topic, synthetic_aggregate(bucket=bucket).to_payload())
    assert [a["bucket"] for a in board.aggregates[("reading", "w2")]] == [6, 7, 8]
    events = []
    while not queue.empty():
        events.append(queue.get_nowait())
    assert [e.data["bucket"] for e in events if e] == [5, 7, 6, 8]  # 4 and 1: older than all kept
    board.receive("other/v1/cohort/reading/aggregates", b"{}")  # not under the prefix: ignored
    board.receive("gazeguard/v1/cohort/reading/attention", b"\xff")
    assert board.invalid == 1
