"""The tail profile (``metrics.tail``): garbage-collector pauses by generation and event-loop
stalls, observed for real (a real collection, a real blocked loop)."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import CollectorRegistry

from gazeguard.runtime.tail import TailProfile


def count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(f"{name}_count", labels)
    return 0.0 if value is None else value


def test_every_collection_is_timed_by_its_generation_until_uninstalled() -> None:
    registry = CollectorRegistry()
    tail = TailProfile(registry)
    tail.install()
    try:
        tail.install()  # twice: still one callback
        gc.collect(2)
        gc.collect(0)
    finally:
        tail.uninstall()
    assert count(registry, "gazeguard_gc_pause_seconds", generation="2") == 1
    assert count(registry, "gazeguard_gc_pause_seconds", generation="0") >= 1
    gc.collect(2)
    assert count(registry, "gazeguard_gc_pause_seconds", generation="2") == 1
    summed = registry.get_sample_value("gazeguard_gc_pause_seconds_sum", {"generation": "2"})
    assert summed is not None
    assert 0.0 < summed < 5.0


def test_a_blocked_loop_is_seen_as_a_stall() -> None:
    """A 0.5 s blocking call on the loop shows as one stall of at least 0.45 s (the probe's
    period is 50 ms); the quiet probes around it as stalls under 0.25 s."""
    registry = CollectorRegistry()
    tail = TailProfile(registry)

    async def run() -> None:
        probe = asyncio.create_task(tail.probe_loop())
        await asyncio.sleep(0.2)
        time.sleep(0.5)  # noqa: ASYNC251 - the loop blocked, on purpose
        await asyncio.sleep(0.2)
        probe.cancel()

    asyncio.run(run())
    total = count(registry, "gazeguard_loop_stall_seconds")
    quick = registry.get_sample_value("gazeguard_loop_stall_seconds_bucket", {"le": "0.25"})
    assert total >= 4
    assert quick is not None
    assert total - quick == 1  # the one stall beyond 0.25 s
