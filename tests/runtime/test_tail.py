"""The tail profile (``metrics.tail``): garbage-collector pauses by generation and event-loop
stalls, observed for real (a real collection, a real blocked loop)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

import pytest
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


def test_a_long_collection_is_said_in_the_log_a_short_one_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A young collection that takes 60 ms (a callback after the profile's sleeps at its start)
    is one warning with its generation and what is frozen; a quick one is none (generation 0:
    a full collection of this test process's heap can itself take 50 ms)."""
    tail = TailProfile(CollectorRegistry())

    def slow(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            time.sleep(0.06)

    tail.install()
    was_enabled = gc.isenabled()
    gc.disable()  # only the two collections below: none of the allocations' own
    try:
        with caplog.at_level(logging.WARNING, logger="gazeguard.runtime.tail"):
            gc.collect(0)
            assert caplog.messages == []
            gc.callbacks.append(slow)
            try:
                gc.collect(0)
            finally:
                gc.callbacks.remove(slow)
    finally:
        tail.uninstall()
        if was_enabled:
            gc.enable()
    assert len(caplog.messages) == 1, caplog.messages
    assert caplog.messages[0].startswith("a generation-0 garbage collection stopped the loop for ")
    assert f"{gc.get_freeze_count()} frozen" in caplog.messages[0]


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
