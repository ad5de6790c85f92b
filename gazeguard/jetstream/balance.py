"""Balance: which live worker each partition is assigned to (see :mod:`gazeguard.jetstream`,
**Balance**): the membership subject and a bounded-load rendezvous assignment."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


def members_subject(stream: str) -> str:
    """The core NATS subject the workers of ``stream`` announce themselves on (balance)."""
    return f"gazeguard.workers.{stream}"


def _weight(salt: str, partition: int, worker: str) -> int:
    digest = hashlib.blake2b(f"{salt}\0{partition}\0{worker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign_partitions(partitions: int, workers: Iterable[str], salt: str = "") -> dict[int, str]:
    """Partition → its assigned worker: rendezvous hashing with bounded loads.

    Every (partition, worker) pair gets a pseudo-random weight (a hash of ``salt``, the partition
    and the worker id); pairs are taken heaviest first, a partition going to the worker of its
    heaviest pair that still has room: first ``P // N`` partitions each, then one more for the
    ``P % N`` partitions left. So every worker gets ``P // N`` or ``P // N + 1`` partitions (plain
    rendezvous hashing spreads 4 partitions 2–2 over 2 workers only 6 times in 16), every worker
    computes the same map from the same set of ids, and a worker joining or leaving moves few
    partitions besides its own share (the heaviest pairs keep their partitions).
    """
    live = sorted(set(workers))
    if not live:
        return {}
    pairs = sorted(
        ((_weight(salt, p, w), p, w) for p in range(partitions) for w in live), reverse=True
    )
    base = partitions // len(live)
    owner: dict[int, str] = {}
    load = dict.fromkeys(live, 0)
    for room in (base, base + 1):
        for _, p, w in pairs:
            if p not in owner and load[w] < room:
                owner[p] = w
                load[w] += 1
    return owner


@dataclass
class Member:
    """Another worker, as heard on :func:`members_subject` (balance)."""

    last: float  # monotonic time of its last heartbeat
    beats: int = 1  # heartbeats heard since it was last absent
    pulling: bool = False  # it pulls its assigned partitions (it has heard the others)
    holds: frozenset[int] = field(default_factory=frozenset)  # partitions it holds a pin on
    # partitions whose pulls the server answered lately (None: a worker of an earlier version)
    answered: frozenset[int] | None = None
