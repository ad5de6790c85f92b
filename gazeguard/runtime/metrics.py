"""Local operator metrics: a Prometheus endpoint (``/metrics``, the text exposition format) on
the sidecar (``gazeguard run``) and on fleet workers (``gazeguard run --fleet``).

Off unless ``metrics.port`` is set (``--metrics-port``); it binds ``metrics.host``, loopback by
default. It is served by ``prometheus_client``'s own HTTP server in a daemon thread, from
:class:`Metrics`' registry.

**Only public figures.** The endpoint is egress like the broker: a Prometheus server scrapes it
and keeps the figures for months, usually on another machine. So it carries only what the egress
contract (:mod:`gazeguard.wire.egress`) calls public: counts of releases and of what the ledger
decided (charged, withheld by a cap, dropped on an error, refused by the broker), the outbox
(depth, age of the oldest item, deliveries), the broker connection, sessions open and closed,
and the latencies of the release path (a chunk coming due on the public clock → charged → the
broker's acknowledgement). Never a count of samples (delivered, invalid, late, dropped): they
count the gaze (``invalid`` is the blink signal, a silent stream is a pause) and stay in the
local log (:func:`gazeguard.runtime.service.log_ingest_counters`). Nor the lag of the newest
sample behind the clock, which would publish every pause the release schedule hides.

Wiring: :meth:`Metrics.opened` and :meth:`Metrics.closed` are called where a session's
pipeline is made and closed (the sidecar's :func:`~gazeguard.runtime.service.serve`, the fleet's
:meth:`~gazeguard.runtime.fleet.Fleet.open_session` / ``close_session``, through
:class:`SessionMetrics`, a no-op when the endpoint is off); the counters are read from the
pipelines' own counters when Prometheus scrapes, and the two latency histograms are observed
as chunks are charged (:attr:`Pipeline.on_release <gazeguard.runtime.pipeline.Pipeline>`) and
acknowledged (the publisher's ``on_acked``; its ``on_sent`` too, for the tail profile).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from gazeguard.config import MetricsSettings
from gazeguard.core.errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from gazeguard.ledger import Ledger
    from gazeguard.ledger.outbox import OutboxEntry
    from gazeguard.runtime.cohort import CohortRelease
    from gazeguard.runtime.pipeline import Pipeline, ReleasedChunk
    from gazeguard.runtime.publish import Publisher
    from gazeguard.runtime.tail import TailProfile

log = logging.getLogger(__name__)

#: Buckets of ``gazeguard_chunk_charge_seconds`` (privatization + the ledger's commit), s.
CHARGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Buckets of ``gazeguard_release_seconds`` (due → the broker's acknowledgement), s.
RELEASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

Role = Literal["sidecar", "fleet"]


class SessionMetrics:
    """Where a sidecar or a fleet worker tells the metrics about its sessions. This base does
    nothing (no ``metrics.port``); :class:`Metrics` counts. Every method is called on the
    event loop."""

    def opened(self, pipeline: Pipeline) -> None:
        """A session's pipeline was made (before its first release)."""

    def closed(self, pipeline: Pipeline) -> None:
        """A session's pipeline was closed (after its last release)."""

    def cohort_released(self, releases: Sequence[CohortRelease]) -> None:
        """Cohort buckets were charged and handed to the publisher."""


@dataclass(slots=True)
class _Totals:
    """Counts of the sessions already closed (their pipelines are gone)."""

    chunks: dict[str, int]
    labels: dict[str, int]
    cohort: dict[str, int]
    sessions_closed: int = 0


OUTCOMES = ("released", "withheld", "dropped")


class Metrics(SessionMetrics, Collector):
    """The figures of one process, and its ``/metrics`` endpoint (:meth:`serve`).

    Args:
        role: ``sidecar`` or ``fleet`` (the ``gazeguard_info`` metric; the dashboard's filter).
        worker: the fleet worker's id, or the sidecar's device id.
    """

    def __init__(self, role: Role, worker: str) -> None:
        self.role, self.worker = role, worker
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()  # the scrape thread reads what the event loop changes
        self._open: dict[int, Pipeline] = {}
        self._totals = _Totals(dict.fromkeys(OUTCOMES, 0), dict.fromkeys(OUTCOMES, 0), {})
        self._ledger: Ledger | None = None
        self._publisher: Publisher | None = None
        self._refused_sessions: Callable[[], int] = lambda: 0
        self.charge_seconds = Histogram(
            "gazeguard_chunk_charge_seconds",
            "From a chunk coming due (its window's release time on the clock) to its charge "
            "committed in the ledger: privatization and the ledger transaction, s",
            buckets=CHARGE_BUCKETS,
            registry=self.registry,
        )
        self.release_seconds = Histogram(
            "gazeguard_release_seconds",
            "From a chunk coming due to the broker's acknowledgement of it (charge, outbox, "
            "MQTT QoS 1 PUBACK), s; chunks sent from the outbox after a restart are not counted",
            buckets=RELEASE_BUCKETS,
            registry=self.registry,
        )
        self.tail: TailProfile | None = None
        """The tail profile (``metrics.tail``), fed the publisher's sends and acknowledgements."""
        self.registry.register(self)
        ProcessCollector(registry=self.registry)

    # -- what the service hands over -------------------------------------------------------------

    def bind(
        self,
        ledger: Ledger,
        publisher: Publisher,
        refused_sessions: Callable[[], int] | None = None,
    ) -> None:
        """The ledger (the outbox's depth and age) and the publisher (deliveries, the broker
        connection) to read at each scrape; ``refused_sessions``: a fleet worker's count of
        sessions refused at ``fleet.max_sessions``."""
        self._ledger, self._publisher = ledger, publisher
        if refused_sessions is not None:
            self._refused_sessions = refused_sessions

    def opened(self, pipeline: Pipeline) -> None:
        """Count ``pipeline``'s releases from now on, and time its charges."""
        before = pipeline.on_release

        def released(out: ReleasedChunk) -> None:
            if before is not None:
                before(out)
            self.charge_seconds.observe(max(out.charged_at - out.completed_at, 0.0))

        pipeline.on_release = released
        with self._lock:
            self._open[id(pipeline)] = pipeline

    def closed(self, pipeline: Pipeline) -> None:
        """Move ``pipeline``'s counts into the totals of closed sessions."""
        with self._lock:
            if self._open.pop(id(pipeline), None) is None:
                return
            t = self._totals
            for outcome, n in _chunk_counts(pipeline).items():
                t.chunks[outcome] += n
            for outcome, n in _label_counts(pipeline).items():
                t.labels[outcome] += n
            t.sessions_closed += 1

    def cohort_released(self, releases: Sequence[CohortRelease]) -> None:
        """Count each released cohort part by its kind (the message's schema name)."""
        with self._lock:
            for r in releases:
                kind = r.message.schema_.split("/")[0].removeprefix("gazeguard.")
                self._totals.cohort[kind] = self._totals.cohort.get(kind, 0) + 1

    def sent(self, item: OutboxEntry) -> None:
        """The publisher's ``on_sent``: timed by the tail profile, when it is on."""
        if self.tail is not None:
            self.tail.sent(item)

    def acked(self, item: OutboxEntry) -> None:
        """The publisher's ``on_acked``: a chunk charged in this run that the broker
        acknowledged (items of an earlier run carry no due time and are not timed)."""
        if self.tail is not None:
            self.tail.acked(item)
        completed = getattr(item, "completed_at", None)
        if isinstance(completed, float):
            self.release_seconds.observe(max(time.perf_counter() - completed, 0.0))

    # -- the scrape ------------------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        """The counters and gauges, read now (prometheus_client calls it at each scrape, in its
        server thread)."""
        info = InfoMetricFamily("gazeguard", "What this process is")
        info.add_metric([], {"role": self.role, "worker": self.worker})
        yield info
        with self._lock:
            pipes = list(self._open.values())
            t = self._totals
            chunks, labels = dict(t.chunks), dict(t.labels)
            cohort, closed = dict(t.cohort), t.sessions_closed
        for pipe in pipes:
            for outcome, n in _chunk_counts(pipe).items():
                chunks[outcome] += n
            for outcome, n in _label_counts(pipe).items():
                labels[outcome] += n
        yield _by(
            "gazeguard_chunks", "Chunks settled by the ledger: charged and released, withheld "
            "by a cap (budget), dropped on an error", "outcome", chunks,
        )  # fmt: skip
        yield _by(
            "gazeguard_labels", "Private labels settled by the ledger (as chunks)", "outcome",
            labels,
        )  # fmt: skip
        yield _by(
            "gazeguard_cohort_releases", "Cohort bucket parts charged and released, by kind",
            "kind", cohort,
        )  # fmt: skip
        yield _gauge("gazeguard_sessions_open", "Sessions this process serves now", len(pipes))
        yield _counter("gazeguard_sessions_closed", "Sessions this process closed", closed)
        yield _counter(
            "gazeguard_sessions_refused",
            "Sessions a fleet worker refused (fleet.max_sessions reached)",
            self._refused_sessions(),
        )
        yield from self._broker()
        yield from self._outbox()

    def _broker(self) -> Iterator[Metric]:
        pub = self._publisher
        if pub is None:
            return
        yield _gauge(
            "gazeguard_broker_connected", "1 while the MQTT connection is up", pub.connected
        )
        yield _counter(
            "gazeguard_broker_connections", "Successful MQTT connections", pub.connections
        )
        yield _counter(
            "gazeguard_broker_refusals",
            "Times the broker refused the login, the protocol, TLS or a message",
            pub.refusals,
        )
        yield _counter(
            "gazeguard_outbox_delivered",
            "Outbox items (chunks, labels, cohort parts) the broker acknowledged",
            pub.delivered,
        )
        yield _counter(
            "gazeguard_outbox_refused",
            "Outbox items the broker refused for good (moved aside in the ledger)",
            pub.refused_items,
        )

    def _outbox(self) -> Iterator[Metric]:
        if self._ledger is None:
            return
        try:
            pending, oldest = self._ledger.outbox_backlog()
        except Exception as exc:  # a scrape never takes the service down
            log.warning("metrics: could not read the outbox: %s", exc)
            return
        yield _gauge(
            "gazeguard_outbox_pending",
            "Charged releases of any session waiting in the ledger's outbox for the broker",
            pending,
        )
        age = 0.0 if oldest is None else max(time.time() - oldest, 0.0)
        yield _gauge(
            "gazeguard_outbox_oldest_age_seconds",
            "Age of the oldest release waiting in the outbox (0: empty), s",
            age,
        )

    # -- the endpoint ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def serve(self, settings: MetricsSettings) -> Iterator[str | None]:
        """Serve ``/metrics`` while the block runs (nothing when ``settings.port`` is unset);
        yields ``http://HOST:PORT/metrics``, or ``None``.

        Raises:
            ConfigError: the address cannot be bound (taken, or not this host's).
        """
        if settings.port is None:
            yield None
            return
        try:
            server, thread = start_http_server(
                settings.port, addr=settings.host, registry=self.registry
            )
        except OSError as exc:
            raise ConfigError(
                "metrics.port",
                settings.port,
                f"cannot serve metrics on {settings.host}:{settings.port}: {exc.strerror or exc} "
                "(choose another port, or 0 for any free one)",
            ) from None
        port = int(server.server_address[1])
        url = f"http://{_host(settings.host)}:{port}/metrics"
        log.warning(
            "operator metrics (local, public figures only) on %s%s", url,
            "" if settings.host in ("127.0.0.1", "::1", "localhost") else
            " — on every network this address reaches, without a login",
        )  # fmt: skip
        try:
            yield url
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5.0)


def metrics_for(settings: MetricsSettings, role: Role, worker: str) -> Metrics | None:
    """The process's :class:`Metrics` when ``metrics.port`` is set, else ``None``."""
    return None if settings.port is None else Metrics(role, worker)


@contextlib.asynccontextmanager
async def serving(metrics: Metrics | None, settings: MetricsSettings) -> AsyncIterator[None]:
    """:meth:`Metrics.serve` of ``metrics`` while the block runs (nothing for ``None``)."""
    if metrics is None:
        yield
        return
    with metrics.serve(settings):
        yield


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _chunk_counts(pipe: Pipeline) -> dict[str, int]:
    s = pipe.stats
    return {"released": s.released, "withheld": s.withheld, "dropped": s.dropped}


def _label_counts(pipe: Pipeline) -> dict[str, int]:
    labels = pipe.labels
    if labels is None:
        return {}
    s = labels.stats
    return {"released": s.released, "withheld": s.withheld, "dropped": s.dropped}


def _by(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(counts.items()):
        family.add_metric([key], n)
    return family


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))
