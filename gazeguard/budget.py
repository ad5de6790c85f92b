"""The release plan: noise calibrated to a user-level budget per hour of gaze, and what it costs.

A person cares about everything released about them per hour of their gaze, not about one
chunk. Given a budget ``(ε, δ)`` per window of gaze time (``ledger.budget_per_hour``, the
ledger's window cap) and the release profile (``F`` features, chunks of ``n`` steps of ``s``
seconds), the sidecar derives the noise instead of asking for a per-chunk ε:

* at most ``C = ⌈window_s / (n·s)⌉ + 1`` chunks end in any window of gaze (the ledger counts a
  chunk in the windows that contain its gaze end; the ``+ 1`` absorbs timestamp jitter between
  chunk ends, so the cap does not bind in normal operation);
* each chunk releases one accounting event per feature (:meth:`Mechanism.events`), so a window
  holds at most ``F·C`` releases;
* the noise multiplier ``r`` (noise scale / effective sensitivity) is the smallest whose
  ``F·C``-fold composition is within the budget (:func:`gazeguard.accounting.calibrate`: PLD for
  Laplace, the exact Gaussian closed form for Gaussian noise), including the sampler slack of
  up to ``n`` coordinates per release.

The ledger still checks every charge against the cap; calibration only makes that check pass
for a normally paced stream. Nothing here reads the user's data: ``F``, ``n``, ``s``, the
budget and the bounds are configuration.

Raw-gaze unit: one raw sample can change the features of
:func:`~gazeguard.accounting.chunks_reached` consecutive chunks (feature window, step, chunk
length, hold limit, and events ending up to :data:`RAW_EVENT_SPAN_S` after the sample). The
raw-event ε composes one chunk's events that many times. A change that merges or splits an
event longer than that (a fixation of a minute) reaches every chunk that event overlaps; the
session and per-hour figures cover every case.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gazeguard.accounting import (
    Event,
    Family,
    PrivacyLoss,
    calibrate,
    chunks_reached,
    compose,
)
from gazeguard.errors import ConfigError
from gazeguard.mechanisms import Bounds, Mechanism, make_mechanism
from gazeguard.mechanisms.noise import (
    GAUSS_SAMPLER_LOSS_PER_COORDINATE,
    SAMPLER_LOSS_PER_COORDINATE,
)
from gazeguard.mechanisms.registry import MECHANISMS, ONLINE_MECHANISMS

if TYPE_CHECKING:
    from gazeguard.config import MechanismSettings

log = logging.getLogger(__name__)

#: Events ending up to this long after a changed sample are counted in the raw-gaze reach, s.
RAW_EVENT_SPAN_S = 4.0


def chunks_per_window(window_s: float, chunk_s: float) -> int:
    """``⌈window_s / chunk_s⌉ + 1``: chunks whose gaze end can fall in one window (with one for
    jitter). ``chunk_s = n·s`` seconds."""
    if not (math.isfinite(chunk_s) and chunk_s > 0):
        raise ConfigError("mechanism.chunk_steps", chunk_s, "a chunk must last > 0 s")
    return math.ceil(window_s / chunk_s - 1e-9) + 1


def noise_multiplier_for(
    noise: str,
    *,
    features: int,
    chunks: int,
    budget: float,
    delta: float,
    max_m: int = 1,
    slack: float | None = None,
) -> float:
    """The noise multiplier ``r`` that keeps ``features·chunks`` releases within
    ``(budget, delta)``, each paying ``slack`` (default: the Laplace/Gaussian sampler's
    rounding slack of ``max_m`` coordinates; pass the mechanism's own ``sampler_slack``).

    Raises:
        ConfigError: a budget the noise family cannot meet (e.g. non-positive).
    """
    if slack is None:
        gauss = noise == "gaussian"
        per = GAUSS_SAMPLER_LOSS_PER_COORDINATE if gauss else SAMPLER_LOSS_PER_COORDINATE
        slack = max_m * per
    limit = PrivacyLoss.approx(budget, delta, field="ledger.budget_per_hour")
    family: Family = "gaussian" if noise == "gaussian" else "laplace"
    return calibrate(family, features * chunks, limit, slack)


def composed(events: Mapping[Event, int], times: int, delta: float) -> float:
    """ε at ``delta`` of ``times`` releases of ``events`` (e.g. one chunk, or its raw-gaze
    reach)."""
    return compose({e: c * times for e, c in events.items()}, delta).epsilon


@dataclass(frozen=True, slots=True)
class CostSummary:
    """What a session's releases cost at the ledger's δ (all ε at ``delta``).

    Attributes:
        chunk: ε of one chunk (all its features).
        chunk_pure: pure ε of one chunk (``inf`` for Gaussian noise).
        raw_event: ε of the ``reached`` chunks one raw gaze sample can change.
        reached: chunks one raw gaze sample can change.
        per_window: ε of ``chunks`` chunks, a full window of gaze.
        chunks: chunks per window (:func:`chunks_per_window`).
        window_s: the window, seconds of gaze.
        delta: δ of every figure.
    """

    chunk: float
    chunk_pure: float
    raw_event: float
    reached: int
    per_window: float
    chunks: int
    window_s: float
    delta: float


def cost_summary(
    events: Mapping[Event, int],
    *,
    delta: float,
    window_s: float,
    chunk_steps: int,
    step_s: float,
    feature_window_s: float,
    hold_limit_s: float,
) -> CostSummary:
    """The figures of :class:`CostSummary` for one chunk's ``events``."""
    chunks = chunks_per_window(window_s, chunk_steps * step_s)
    reached = chunks_reached(
        feature_window_s, step_s, chunk_steps, hold_limit_s, event_span_s=RAW_EVENT_SPAN_S
    )
    pure = sum(e.pure_epsilon * c for e, c in events.items())
    return CostSummary(
        chunk=composed(events, 1, delta),
        chunk_pure=pure,
        raw_event=composed(events, reached, delta),
        reached=reached,
        per_window=composed(events, chunks, delta),
        chunks=chunks,
        window_s=window_s,
        delta=delta,
    )


def build_mechanism(
    mechanism: MechanismSettings,
    names: Sequence[str],
    bounds: Bounds,
    step_s: float,
    *,
    budget: float | None,
    window_s: float,
    delta: float,
) -> Mechanism:
    """The mechanism of a release profile: at the configured per-chunk ε, or — without one —
    with the noise calibrated to ``budget`` (ε at ``delta`` per ``window_s`` of gaze).

    Args:
        mechanism: the mechanism settings.
        names: the released features, (F,).
        bounds: their public bounds.
        step_s: feature step, s.
        budget: the per-window cap the noise is calibrated to (``None``: none).
        window_s: that window, seconds of gaze.
        delta: δ of the budget (and of a Gaussian mechanism's per-release ε).

    Raises:
        ConfigError: no per-chunk ε and no budget, per-feature ε without a per-chunk ε, or
            invalid mechanism parameters.
    """
    if mechanism.name == "auto":
        if budget is None or mechanism.epsilon is not None:
            raise ConfigError(
                "mechanism.name", "auto", "needs ledger.budget_per_hour and no mechanism.epsilon: "
                "it chooses the mechanism with the lowest expected error for that budget", None,
            )  # fmt: skip
        best = rank_mechanisms(
            mechanism, names, bounds, step_s, budget=budget, window_s=window_s, delta=delta,
            max_chunk_steps=mechanism.chunk_steps,
        )[0]  # fmt: skip
        log.info("mechanism.name = 'auto' chose %s", best.describe())
        mechanism = mechanism.model_copy(
            update={
                "name": best.name,
                "transform": best.transform if MECHANISMS[best.name].transformed else "dft",
                "chunk_steps": best.chunk_steps, "noise": best.noise,
            }
        )  # fmt: skip
    kw: dict[str, Any] = {
        "n": mechanism.chunk_steps, "bounds": bounds, "transform": mechanism.transform,
        "noise": mechanism.noise, "seed": mechanism.insecure_seed,
    }  # fmt: skip
    if mechanism.epsilon is not None:
        per = mechanism.epsilon_per_feature
        eps = [per.get(n, mechanism.epsilon) for n in names]
        gauss_delta = delta if mechanism.noise == "gaussian" else None
        return make_mechanism(mechanism.name, k=mechanism.k, epsilon=eps, delta=gauss_delta, **kw)
    if mechanism.epsilon_per_feature:
        raise ConfigError(
            "mechanism.epsilon_per_feature",
            dict(mechanism.epsilon_per_feature),
            "needs mechanism.epsilon (a fixed ε per chunk); with the noise calibrated to "
            "ledger.budget_per_hour every feature gets the same noise multiplier",
            None,
        )
    if budget is None:
        raise ConfigError(
            "ledger.budget_per_hour",
            None,
            "nothing to calibrate the noise to: set ledger.budget_per_hour (user-level ε per "
            "hour of gaze, e.g. 10) or mechanism.epsilon (ε per feature per chunk)",
            None,
        )
    chunks = chunks_per_window(window_s, mechanism.chunk_steps * step_s)

    def ratio(slack: float | None) -> float:
        return noise_multiplier_for(
            mechanism.noise, features=len(names), chunks=chunks, budget=budget, delta=delta,
            slack=slack,
        )  # fmt: skip

    # k (and so m, and the sampler's slack) depends a little on the noise: calibrate for the
    # slack of one coordinate, let auto-k choose, then recalibrate for the slack the chosen
    # mechanism pays per release (independent of the noise level) and keep that k.
    first = make_mechanism(mechanism.name, k=mechanism.k, noise_multiplier=ratio(None), **kw)
    slack = float(first.sampler_slack.max())
    return make_mechanism(mechanism.name, k=first.k, noise_multiplier=ratio(slack), **kw)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration :func:`rank_mechanisms` scored (lower ``error`` is better).

    Attributes:
        name, transform, chunk_steps, noise: the configuration (``mechanism.*`` settings).
        k: the k auto-k chose for it.
        multiplier: the calibrated noise multiplier.
        error: mean over features of the expected RMS error per value as a fraction of the
            feature's range (public prior; before clipping to ``[lo, hi]``).
        chunk_s: seconds of gaze per chunk (the latency a consumer waits).
    """

    name: str
    transform: str
    chunk_steps: int
    noise: str
    k: int
    multiplier: float
    error: float
    chunk_s: float

    def describe(self) -> str:
        """One line, e.g. ``cfpa/dct n=64 k=1 laplace: error 3.1× range, 32 s chunks``."""
        return (
            f"{self.name}/{self.transform} n={self.chunk_steps} k={self.k} {self.noise}: "
            f"error {self.error:.3g}× range, noise multiplier {self.multiplier:.3g}, "
            f"{self.chunk_s:g} s chunks"
        )


#: The configurations ``mechanism.name = "auto"`` chooses among.
AUTO_NAMES = ONLINE_MECHANISMS
AUTO_TRANSFORMS = ("dft", "dct")
AUTO_CHUNK_STEPS = (16, 32, 64, 128)
AUTO_NOISE = ("laplace", "gaussian")


def rank_mechanisms(
    mechanism: MechanismSettings,
    names: Sequence[str],
    bounds: Bounds,
    step_s: float,
    *,
    budget: float,
    window_s: float,
    delta: float,
    max_chunk_steps: int | None = None,
) -> list[Candidate]:
    """Every online mechanism × transform × chunk length × noise family, calibrated to
    ``budget`` for the release profile ``names`` and scored by its expected error under the
    public prior (never the user's data), best first.

    ``max_chunk_steps`` bounds the chunk length (the latency); ``mechanism.k`` is honoured.
    """
    out: list[Candidate] = []
    for name in AUTO_NAMES:
        transforms = AUTO_TRANSFORMS if MECHANISMS[name].transformed else ("dft",)
        for transform in transforms:
            for n in AUTO_CHUNK_STEPS:
                if max_chunk_steps is not None and n > max_chunk_steps:
                    continue
                for noise in AUTO_NOISE:
                    m = mechanism.model_copy(
                        update={
                            "name": name, "transform": transform, "chunk_steps": n,
                            "noise": noise, "epsilon": None, "epsilon_per_feature": {},
                        }
                    )  # fmt: skip
                    try:
                        mech = build_mechanism(
                            m, names, bounds, step_s, budget=budget, window_s=window_s,
                            delta=delta,
                        )  # fmt: skip
                    except ConfigError:
                        continue  # e.g. the budget cannot be met with this many releases
                    out.append(
                        Candidate(
                            name,
                            MECHANISMS[name].transform_of(transform),
                            n,
                            noise,
                            int(mech.k),
                            float(mech.noise_multiplier.max()),
                            float(mech.expected_error().mean()),
                            n * step_s,
                        )
                    )
    if not out:
        raise ConfigError(
            "ledger.budget_per_hour", budget, "no mechanism can be calibrated to this budget", None
        )
    return sorted(out, key=lambda c: (c.error, c.chunk_s))
