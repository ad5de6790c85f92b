"""Noise calibrated to a user-level budget: the chunk mechanism of a release profile.

Given the chunks' share of the budget ``(ε, δ)`` per hour of gaze and the number ``C`` of chunks
an hour of gaze can change (the release plan's count, :mod:`gazeguard.plan`: every chunk whose
feature windows an hour of gaze reaches, not only those that end inside it), with ``F``
features each releasing one accounting event per chunk (:meth:`Mechanism.events`), the noise
multiplier ``r`` (noise scale / effective sensitivity) is the smallest whose ``F·C``-fold
composition is within the share (:func:`gazeguard.privacy.accounting.calibrate`: PLD for Laplace,
the
exact Gaussian closed form for Gaussian noise), including the samplers' slack of up to ``n``
coordinates per release.

Nothing here reads the user's data: ``F``, ``n``, ``s``, the budget and the bounds are
configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import (
    Event,
    Family,
    LaplaceEvent,
    PrivacyLoss,
    calibrate,
    compose,
)
from gazeguard.privacy.mechanisms import Bounds, Mechanism, make_mechanism
from gazeguard.privacy.mechanisms.discrete_gaussian import GAUSS_SAMPLER_LOSS_PER_COORDINATE
from gazeguard.privacy.mechanisms.discrete_laplace import SAMPLER_LOSS_PER_COORDINATE
from gazeguard.privacy.mechanisms.registry import MECHANISMS, ONLINE_MECHANISMS

if TYPE_CHECKING:
    from gazeguard.config import MechanismSettings

log = logging.getLogger(__name__)


def laplace_releases_epsilon(epsilon: float, releases: int, delta: float) -> float:
    """ε at ``delta`` of ``releases`` Laplace releases of pure ε ``epsilon`` each (noise
    multiplier ``1/epsilon``): the accountant's PLD composition."""
    return compose({LaplaceEvent(1.0 / epsilon): releases}, delta).epsilon


def noise_multiplier_for(
    noise: str,
    *,
    features: int,
    chunks: int,
    budget: float,
    delta: float,
    max_m: int = 1,
    slack: float | None = None,
    fixed: Mapping[Event, int] | None = None,
) -> float:
    """The noise multiplier ``r`` that keeps ``features·chunks`` releases within
    ``(budget, delta)``, each paying ``slack`` (default: the Laplace/Gaussian sampler's
    rounding slack of ``max_m`` coordinates; pass the mechanism's own ``sampler_slack``),
    together with the ``fixed`` releases of the other kinds (event → count per hour).

    Raises:
        ConfigError: a budget the noise family cannot meet (e.g. non-positive).
    """
    if slack is None:
        gauss = noise == "gaussian"
        per = GAUSS_SAMPLER_LOSS_PER_COORDINATE if gauss else SAMPLER_LOSS_PER_COORDINATE
        slack = max_m * per
    limit = PrivacyLoss.approx(budget, delta, field="ledger.budget_per_hour")
    family: Family = "gaussian" if noise == "gaussian" else "laplace"
    return calibrate(family, features * chunks, limit, slack, fixed)


def build_mechanism(
    mechanism: MechanismSettings,
    names: Sequence[str],
    bounds: Bounds,
    step_s: float,
    *,
    budget: float | None,
    chunks_for: Callable[[int], int],
    delta: float,
    fixed: Mapping[Event, int] | None = None,
) -> Mechanism:
    """The mechanism of a release profile: at the configured per-chunk ε, or — without one —
    with the noise calibrated so that the chunks one hour of gaze can change cost at most
    ``budget`` (ε at ``delta``).

    Args:
        mechanism: the mechanism settings.
        names: the released features, (F,).
        bounds: their public bounds.
        step_s: feature step, s.
        budget: the chunks' share of the hourly budget (``None``: no budget).
        chunks_for: the chunks an hour of gaze can change, for chunks of ``n`` steps (the
            release plan's count).
        delta: δ of the budget (and of a Gaussian mechanism's per-release ε).
        fixed: the other release kinds' events of one hour (event → count): the chunks are
            calibrated so that everything composes to ``budget`` together.

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
            mechanism, names, bounds, step_s, budget=budget, chunks_for=chunks_for, delta=delta,
            max_chunk_steps=mechanism.chunk_steps, fixed=fixed,
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
    return calibrated(
        mechanism.name, kw, k=mechanism.k, features=len(names),
        chunks=chunks_for(mechanism.chunk_steps), budget=budget, delta=delta, fixed=fixed,
    )  # fmt: skip


def calibrated(
    name: str,
    kw: Mapping[str, Any],
    *,
    k: int | str | None,
    features: int,
    chunks: int,
    budget: float,
    delta: float,
    fixed: Mapping[Event, int] | None = None,
) -> Mechanism:
    """``make_mechanism(name, k=k, noise_multiplier=r, **kw)`` with ``r`` the smallest noise
    multiplier for which ``features·chunks`` releases (with the ``fixed`` others) compose to at
    most ``budget`` at ``delta``, each paying the slack the mechanism's samplers pay — the
    sidecar's calibration, shared with the offline evaluation (``k`` None: a mechanism that
    keeps no frequencies)."""
    noise = str(kw.get("noise", "laplace"))

    def make(k: int | str | None, r: float) -> Mechanism:
        args: dict[str, Any] = {**kw, "noise_multiplier": r}
        if k is not None:
            args["k"] = k
        return make_mechanism(name, **args)

    def ratio(slack: float | None, joint: bool = True) -> float:
        b, others = budget, fixed
        if not joint and fixed:  # a first guess: the others' ε taken off the budget
            b, others = budget - compose(dict(fixed), delta).epsilon, None
        return noise_multiplier_for(
            noise, features=features, chunks=chunks, budget=b, delta=delta, slack=slack,
            fixed=others,
        )  # fmt: skip

    # k (and so m, and the samplers' slack) depends a little on the noise: calibrate roughly
    # for the slack of one coordinate, let auto-k choose, then calibrate for the slack the
    # chosen mechanism pays per release and keep that k. Should the slack paid at that noise
    # still exceed the slack charged, recalibrate (it settles at once).
    first = make(k, ratio(None, joint=False))
    slack = float(first.sampler_slack.max())
    for _ in range(4):
        mech = make(None if k is None else first.k, ratio(slack))
        paid = float(mech.sampler_slack.max())
        if paid <= slack:
            return mech
        slack = paid * (1.0 + 1e-6)
    raise ConfigError(
        "mechanism.k", first.k, "the samplers' slack did not settle; report this", None
    )


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
    chunks_for: Callable[[int], int],
    delta: float,
    max_chunk_steps: int | None = None,
    fixed: Mapping[Event, int] | None = None,
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
                            m, names, bounds, step_s, budget=budget, chunks_for=chunks_for,
                            delta=delta, fixed=fixed,
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
