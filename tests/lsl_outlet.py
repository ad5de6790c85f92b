"""A scripted LSL outlet, run by the ingest tests as a separate process (like a real headset).

    python tests/lsl_outlet.py SPEC.npz --source-id ID [--wait 10] [--linger 30]

SPEC.npz holds ``data`` (N, C) (sent in the stream's channel format), ``rel_t`` (N,) seconds
from the first sample (sent as explicit per-sample timestamps ``local_clock() + rel_t``, so
duplicates and out-of-order timestamps reach the inlet as written) and ``meta``, a JSON string:
``{"name", "type", "srate", "format": "double64"|"float32", "manufacturer", "channels":
[{"label", "eye", "type", "unit"}, ...]}``.

The outlet prints ``READY`` once it exists, waits up to ``--wait`` s for a consumer, pushes the
samples on their real-time schedule (in chunks of ``--chunk`` samples), prints ``DONE`` and keeps
the outlet alive for ``--linger`` s so the inlet can drain it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pylsl

FORMATS = {"double64": pylsl.cf_double64, "float32": pylsl.cf_float32}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", type=Path)
    ap.add_argument("--source-id", required=True)
    ap.add_argument("--wait", type=float, default=10.0)
    ap.add_argument("--linger", type=float, default=30.0)
    ap.add_argument("--chunk", type=int, default=8)
    args = ap.parse_args()

    spec = np.load(args.spec)
    data, rel_t = spec["data"], spec["rel_t"]
    meta = json.loads(str(spec["meta"]))
    info = pylsl.StreamInfo(
        meta["name"],
        meta["type"],
        data.shape[1],
        meta.get("srate", 0.0),
        FORMATS[meta.get("format", "double64")],
        args.source_id,
    )
    desc = info.desc()
    if meta.get("manufacturer"):
        desc.append_child("acquisition").append_child_value("manufacturer", meta["manufacturer"])
    if meta.get("channels"):
        chans = desc.append_child("channels")
        for ch in meta["channels"]:
            node = chans.append_child("channel")
            for key, value in ch.items():
                node.append_child_value(key, str(value))
    outlet = pylsl.StreamOutlet(info)
    print("READY", flush=True)
    outlet.wait_for_consumers(args.wait)
    time.sleep(0.2)  # let the consumer finish subscribing before the first sample
    start = pylsl.local_clock()
    for i in range(0, len(rel_t), args.chunk):
        sl = slice(i, i + args.chunk)
        delay = start + rel_t[sl][0] - pylsl.local_clock()
        if delay > 0:
            time.sleep(delay)
        outlet.push_chunk(np.ascontiguousarray(data[sl]), list(start + rel_t[sl]))
    print("DONE", flush=True)
    time.sleep(args.linger)


if __name__ == "__main__":
    main()
