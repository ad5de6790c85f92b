"""Several QoS 1 publishes in flight at once: the time until every PUBACK is in.

A drain pass sends every chunk charged since the previous pass at once and waits for their
PUBACKs (``gazeguard.ledger.outbox``). With Nagle's algorithm on the broker (Mosquitto's
default, ``set_tcp_nodelay false``) and delayed acknowledgements on the client (Linux: 40 ms),
the broker holds its second PUBACK until the client acknowledges the first one's TCP segment,
so a pass of two or more waits about 40 ms. gazeguard's client acknowledges at once
(``TCP_QUICKACK`` after every read) and sends without Nagle (``TCP_NODELAY``):
:mod:`gazeguard.runtime.mqtt.client`.

Per burst size (1, 2, 4, 16 publishes of 12 kB), ``--reps`` bursts 20 ms apart, on uvloop, each
client against a Mosquitto with its defaults and against one with ``set_tcp_nodelay true``:

- ``gazeguard``: :class:`~gazeguard.runtime.mqtt.client.MqttClient`, ``publish_acked`` for each;
- ``aiomqtt``: what a user would otherwise pick, ``aiomqtt.Client.publish(qos=1)`` for each.

Reports p50/p99/max of the burst's time to its last PUBACK, and the ratio aiomqtt / gazeguard in
the same run. Run ``python bench/bench_mqtt_burst.py [--reps N]``; prints a table and writes
``bench/results/mqtt_burst.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiomqtt
import uvloop
from _harness import latency_stats, machine, mosquitto, write_results

from gazeguard.runtime.mqtt.client import MqttClient

BURSTS = (1, 2, 4, 16)
PAYLOAD = b"x" * 12_000
GAP_S = 0.02


async def _bursts(
    host: str, port: int, client: str, burst: int, reps: int
) -> list[float]:  # fmt: skip
    """Seconds from the first publish of each burst to its last PUBACK."""
    out: list[float] = []
    cls = MqttClient if client == "gazeguard" else aiomqtt.Client
    quiet = logging.getLogger("bench.mqtt")  # ("There are 11 pending publish calls.")
    quiet.setLevel(logging.ERROR)
    async with cls(host, port, identifier=f"burst-{client}", logger=quiet) as c:
        send: Callable[[int], Awaitable[Any]]
        if isinstance(c, MqttClient):
            mc = c

            def send(i: int) -> Awaitable[Any]:
                return mc.publish_acked(f"b/{i}", PAYLOAD, retain=False, timeout=10)
        else:

            def send(i: int) -> Awaitable[Any]:
                return c.publish(f"b/{i}", PAYLOAD, qos=1)

        for _ in range(3):  # warm up the connection
            await asyncio.gather(*(send(i) for i in range(burst)))
        for _ in range(reps):
            t0 = time.perf_counter()
            await asyncio.gather(*(send(i) for i in range(burst)))
            out.append(time.perf_counter() - t0)
            await asyncio.sleep(GAP_S)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100, help="bursts per configuration")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    print(f"{'broker':24} {'burst':>5} {'client':10} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for broker_name, extra in (("mosquitto defaults", ""),
                                   ("set_tcp_nodelay true", "set_tcp_nodelay true\n")):  # fmt: skip
            with mosquitto(Path(tmp), extra) as broker:
                for burst in BURSTS:
                    row: dict[str, Any] = {}
                    for client in ("gazeguard", "aiomqtt"):
                        secs = uvloop.run(
                            _bursts(broker.host, broker.port, client, burst, args.reps)
                        )
                        row[client] = latency_stats(secs)
                        s = row[client]
                        print(f"{broker_name:24} {burst:5d} {client:10} {s['p50_ms']:7.1f} "
                              f"{s['p99_ms']:7.1f} {s['max_ms']:7.1f}")  # fmt: skip
                    row["p99_ratio_aiomqtt_over_gazeguard"] = (
                        row["aiomqtt"]["p99_ms"] / row["gazeguard"]["p99_ms"]
                    )
                    results[f"{broker_name}, burst {burst}"] = row
    doc = {
        "benchmark": "bench/bench_mqtt_burst.py",
        "machine": machine(),
        "settings": {"reps": args.reps, "payload_bytes": len(PAYLOAD), "gap_s": GAP_S},
        "results": results,
    }
    print(f"wrote {write_results('mqtt_burst', doc)}")


if __name__ == "__main__":
    main()
