"""The release manifest: a JSON file written next to every released dataset.

It says what was done and what it guarantees, so a reader of the released file need not trust the
person who released it to remember: the mechanism and its effective parameters, the guarantee in
words and numbers, where the randomness came from, the SHA-256 of the input and of the output,
the gazeguard version, and when it ran.

Layout (``format`` ``gazeguard-release-manifest/1``)::

    {"format", "gazeguard_version", "created_utc", "started_utc", "finished_utc", "duration_s",
     "mechanism", "parameters", "guarantee": {"kind", "statement", "numbers"}, "seed_policy",
     "input": {"source", "sha256" (file) or "fingerprint" (raw recordings), "rows", "features",
               "people", "tasks"},
     "output": {"path", "sha256", "rows", "people", "tasks"}, "details": {...}}
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gazeguard import __version__
from gazeguard.offline.release._common import Release
from gazeguard.signal.dataset import FeatureTable, file_sha256

FORMAT = "gazeguard-release-manifest/1"
#: Keys every manifest has (tests and readers can rely on them).
REQUIRED_KEYS = (
    "format",
    "gazeguard_version",
    "created_utc",
    "started_utc",
    "finished_utc",
    "duration_s",
    "mechanism",
    "parameters",
    "guarantee",
    "seed_policy",
    "input",
    "output",
    "details",
)


def manifest_path_for(output: str | Path) -> Path:
    """Default manifest path: ``released.csv`` → ``released.manifest.json``."""
    output = Path(output)
    return output.with_name(f"{output.stem}.manifest.json")


def _table_summary(table: FeatureTable) -> dict[str, Any]:
    return {
        "rows": table.n_rows,
        "people": int(np.unique(table.person).size),
        "tasks": int(np.unique(table.task).size),
    }


def build_manifest(
    release: Release,
    *,
    input_table: FeatureTable,
    input_source: str,
    input_checksum: dict[str, str],
    output_path: Path,
    started: datetime,
    finished: datetime,
) -> dict[str, Any]:
    """Complete a mechanism's manifest with input, output, version and time facts.

    Args:
        release: the mechanism's result (its table must already be saved at ``output_path``).
        input_table: the table the mechanism read.
        input_source: the input file path, or the dataset spec it was extracted from.
        input_checksum: ``{"sha256": …}`` of the input file
        (``gazeguard.signal.dataset.file_sha256``),
            or ``{"fingerprint": …}``, the dataset's content fingerprint (SHA-256 of its files
            plus the conversion parameters), when features were extracted from raw recordings.
        output_path: where the released table was written.
        started, finished: timezone-aware times around the mechanism run.
    """
    m = release.manifest
    return {
        "format": FORMAT,
        "gazeguard_version": __version__,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "started_utc": started.astimezone(UTC).isoformat(timespec="milliseconds"),
        "finished_utc": finished.astimezone(UTC).isoformat(timespec="milliseconds"),
        "duration_s": round((finished - started).total_seconds(), 3),
        "mechanism": m["mechanism"],
        "parameters": m["parameters"],
        "guarantee": m["guarantee"],
        "seed_policy": m["seed_policy"],
        "input": {
            "source": input_source,
            **input_checksum,
            "features": len(input_table.feature_names),
            **_table_summary(input_table),
        },
        "output": {
            "path": str(output_path),
            "sha256": file_sha256(output_path),
            **_table_summary(release.table),
        },
        "details": m.get("details", {}),
    }


def write_manifest(manifest: dict[str, Any], path: str | Path) -> Path:
    """Write ``manifest`` as indented JSON; returns the path."""
    path = Path(path)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return path
