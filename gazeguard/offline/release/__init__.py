"""Dataset release: privatize a recorded feature dataset before it leaves the lab.

Every mechanism has the same signature, so the evaluation can add a row for each::

    from gazeguard.offline.release import RELEASE_MECHANISMS
    rel = RELEASE_MECHANISMS["ksame"](table, {"k": 4}, seed=None)
    rel.table      # privatized FeatureTable, same feature columns
    rel.manifest   # mechanism, parameters, guarantee (words + numbers), seed policy, details

Mechanisms (David-John et al., ETRA 2022, and gazeguard's own):

``ksame``
    k-same-select sequence, k-anonymity (:mod:`gazeguard.offline.release.ksame`).
``marginals``
    task-based Marginals with the (k, γ) plausible-deniability test
    (:mod:`gazeguard.offline.release.marginals`).
``expdp``
    Exponential-DP of Steil et al. 2019 (:mod:`gazeguard.offline.release.expdp`).
``lpa``, ``fpa``, ``cfpa``, ``dcfpa``
    gazeguard's own DP mechanisms, chunk by chunk per recording
    (:mod:`gazeguard.offline.release.recording`).

``seed=None`` draws from the OS CSPRNG; an int seed is reproducible and insecure (experiments and
tests only). :func:`gazeguard.offline.release.output.write_release` runs any of them on a table and
writes the released table, a manifest (:mod:`gazeguard.offline.release.manifest`) and, apart, what
must
stay private (k-same's group mapping); ``gazeguard release``
(:mod:`gazeguard.offline.release.output`
via :mod:`gazeguard.cli.release`) does it for a file.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Protocol

from gazeguard.core.errors import ConfigError
from gazeguard.offline.release._common import Progress, Release, ReleaseRandom, no_progress
from gazeguard.offline.release.expdp import expdp_release
from gazeguard.offline.release.ksame import ksame_release
from gazeguard.offline.release.marginals import marginals_release
from gazeguard.offline.release.recording import DP_MECHANISMS, recording_release
from gazeguard.signal.dataset import FeatureTable


class ReleaseMechanism(Protocol):
    """``(table, params, seed=None, progress=...) -> Release``."""

    def __call__(
        self,
        table: FeatureTable,
        params: Mapping[str, object],
        seed: int | None = None,
        progress: Progress = no_progress,
    ) -> Release:
        """Privatize ``table``; raise ``ConfigError`` naming any bad parameter."""
        ...


RELEASE_MECHANISMS: dict[str, ReleaseMechanism] = {
    "ksame": ksame_release,
    "marginals": marginals_release,
    "expdp": expdp_release,
    **{name: functools.partial(recording_release, name) for name in DP_MECHANISMS},
}


def mechanism_named(name: str) -> ReleaseMechanism:
    """The mechanism called ``name`` (see :data:`RELEASE_MECHANISMS`).

    Raises:
        ConfigError: unknown mechanism name.
    """
    try:
        return RELEASE_MECHANISMS[name]
    except KeyError:
        raise ConfigError(
            "mechanism",
            name,
            f"unknown release mechanism; use one of {', '.join(RELEASE_MECHANISMS)}",
        ) from None


__all__ = [
    "RELEASE_MECHANISMS",
    "Release",
    "ReleaseMechanism",
    "ReleaseRandom",
    "mechanism_named",
]
