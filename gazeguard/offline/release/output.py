"""Writing a release: the released table, its manifest and — apart — what must stay private.

:func:`write_release` runs a mechanism on a table and writes, next to each other:

* ``OUTPUT`` (``.csv``, ``.npz`` or ``.parquet``; written to a temporary name and renamed, so a
  failed run leaves no half-written table);
* ``OUTPUT.manifest.json`` (:mod:`gazeguard.offline.release.manifest`): what was done and
guaranteed;
* ``OUTPUT.group-mapping.PRIVATE.json`` only when the mechanism has private facts
  (:attr:`~gazeguard.offline.release.Release.private`, e.g. k-same's mapping from released group
  ids to
  real people). The name says what it is; the manifest does not mention it. Keep it with the
  original data and never publish it with the release.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gazeguard.core.errors import ConfigError
from gazeguard.offline.release import Release, mechanism_named
from gazeguard.offline.release._common import Progress, no_progress
from gazeguard.offline.release.manifest import build_manifest, manifest_path_for, write_manifest
from gazeguard.signal.dataset import FeatureTable

FORMATS = (".csv", ".npz", ".parquet")


def private_path_for(output: str | Path) -> Path:
    """The private mapping's path: ``out.csv`` → ``out.group-mapping.PRIVATE.json``."""
    output = Path(output)
    return output.with_name(f"{output.stem}.group-mapping.PRIVATE.json")


@dataclass(frozen=True)
class ReleaseFiles:
    """What :func:`write_release` wrote.

    Attributes:
        result: the mechanism's release (table, manifest facts, private facts).
        manifest: the complete manifest as written.
        table: the released table's path.
        manifest_path: the manifest's path.
        private_path: the private mapping's path, or ``None`` when the mechanism has none.
    """

    result: Release
    manifest: dict[str, Any]
    table: Path
    manifest_path: Path
    private_path: Path | None


def check_output(output: Path, input_path: Path | None = None) -> None:
    """Refuse an output path with an unknown suffix or equal to the input.

    Raises:
        ConfigError: naming ``output``.
    """
    if output.suffix.lower() not in FORMATS:
        raise ConfigError("output", str(output), f"the suffix must be one of {', '.join(FORMATS)}")
    if input_path is not None and output.resolve() == input_path.resolve():
        raise ConfigError("output", str(output), "must differ from the input file")


def write_release(
    mechanism: str,
    table: FeatureTable,
    params: Mapping[str, object],
    output: Path,
    *,
    input_source: str,
    input_checksum: dict[str, str],
    manifest_path: Path | None = None,
    seed: int | None = None,
    progress: Progress = no_progress,
) -> ReleaseFiles:
    """Release ``table`` with ``mechanism`` and write the table, manifest and private mapping.

    Args:
        mechanism: a name of :data:`gazeguard.offline.release.RELEASE_MECHANISMS`.
        table: the input feature table.
        params: the mechanism's parameters.
        output: the released table's path (its suffix picks the format).
        input_source, input_checksum: for the manifest (see
            :func:`gazeguard.offline.release.manifest.build_manifest`).
        manifest_path: default ``OUTPUT.manifest.json``.
        seed: ``None`` for the OS CSPRNG; an int is reproducible and insecure.
        progress: called as the mechanism works.

    Raises:
        ConfigError: a bad output path or mechanism parameter (nothing is written).
    """
    check_output(output)
    started = datetime.now(UTC)
    result = mechanism_named(mechanism)(table, params, seed=seed, progress=progress)
    finished = datetime.now(UTC)

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.stem}.tmp{os.getpid()}{output.suffix}")
    result.table.save(tmp)
    tmp.replace(output)
    private_path = None
    if result.private:
        private_path = private_path_for(output)
        private_path.write_text(json.dumps(result.private, indent=2) + "\n")
        private_path.chmod(0o600)
    manifest = build_manifest(
        result,
        input_table=table,
        input_source=input_source,
        input_checksum=input_checksum,
        output_path=output,
        started=started,
        finished=finished,
    )
    written = write_manifest(manifest, manifest_path or manifest_path_for(output))
    return ReleaseFiles(result, manifest, output, written, private_path)
