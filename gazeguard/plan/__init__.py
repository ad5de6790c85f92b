"""The release plan: what gazeguard releases, how far one sample of gaze reaches, what it costs.

Every privacy figure gazeguard prints, publishes or enforces comes from one
:class:`ReleasePlan`, built from the settings (never from the user's data): the sidecar and the
fleet build their mechanisms and open their ledger from it, ``config check`` refuses exactly
what it refuses, and the banner, ``watch``, ``ledger show``, the messages, ``gazeguard plan``,
``eval`` and the docs' tables print its figures.

**Reach** (:class:`Reach`). A change of the gaze at time τ — one sample changed, added or
removed, or any change over ``[τ, τ + d)`` — changes only the feature vectors stamped in
``(τ − A, τ + d + E + W + H]``: ``A`` and ``E`` bound how far before and after the change the
events it alters end (:data:`gazeguard.signal.events.LOOKBEHIND_S`, :data:`~gazeguard.signal.events.
EVENT_REACH_S`: the detector's parameters come from the declared rate and long runs are cut),
``W`` is the feature window (a vector counts the events that end in its window and the samples
in it) and ``H`` the hold limit (a held value repeats a changed one at most that long).

**Releases** (:class:`Release`). Each release kind summarises the vectors of a stretch of gaze
time: a chunk its ``n`` steps (``(n − 1)·s`` from first to last), a label decision its block of
vectors, a cohort bucket the vectors stamped in its ``bucket_s``. The ledger dates each release
by its end. A release is changed by a change of gaze iff one of its vectors is, so the releases
one raw sample can change end within ``A + E + W + H + summary`` of each other, and those an
hour of gaze can change within ``3600`` more. Release ends of one kind are at least a period
apart (``n·s``; a decision's block; a bucket), so
:func:`~gazeguard.privacy.accounting.releases_within` counts them: at the defaults (W = H = 30 s,
s = 0.5 s, n = 32) one raw sample reaches 5 chunks, and an hour of gaze 230 — not the 226 that
end inside the hour.

**Budget.** The user-level budget ``B`` per hour of gaze at ``δ`` (``ledger.budget_per_hour``)
is shared between the kinds: labels and cohort aggregates are calibrated so that the releases
of their kind an hour of gaze can change compose to ``budget_share × B`` at ``δ``; then the
chunks are calibrated last, with those releases fixed beside them, so that everything an hour of
gaze can change — every kind together, composed jointly by the accountant at the same ``δ`` —
fits ``(B, δ)``. Every figure here is that joint composition.

**The ledger's window.** The ledger caps every window of :attr:`ReleasePlan.window_s` seconds of
release ends, ``3600 + A + E + W + H`` plus the longest summary: it holds every release one hour
of gaze can change, of every kind, so the cap it enforces is an honest cap per hour of gaze.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gazeguard.config import (
    CohortSettings,
    FeatureSettings,
    IngestSettings,
    LabelSettings,
    LedgerSettings,
    MechanismSettings,
    Settings,
)
from gazeguard.core.errors import ConfigError
from gazeguard.core.ordering import DEJITTER_CELL_S
from gazeguard.ledger.policy import HOUR_S, Caps
from gazeguard.plan.chunks import build_mechanism
from gazeguard.plan.cohort import CohortPlan, plan_cohort
from gazeguard.plan.labels import (
    LabelPlan,
    load_fitting_model,
    load_label_model,
    plan_labels,
    steps_per_decision,
)
from gazeguard.privacy.accounting import (
    Event,
    PrivacyLoss,
    RandomizedResponseEvent,
    compose,
    releases_within,
)
from gazeguard.privacy.mechanisms import Bounds, Mechanism
from gazeguard.signal.attention import AttentionGrid, AttentionLayout, load_aois
from gazeguard.signal.events import EVENT_REACH_S, LOOKBEHIND_S
from gazeguard.signal.features import FEATURES, feature_bounds
from gazeguard.signal.labels import LabelModel

__all__ = [
    "HOUR_S",
    "Reach",
    "Release",
    "ReleasePlan",
    "chunk_counter",
    "chunks_per_hour",
    "label_cadence",
    "labels_alone",
    "profile_names",
    "releases_per_hour",
]

#: Plans built from settings in this process, by their settings (a public function of them).
_BUILT: dict[str, ReleasePlan] = {}


def _exact(value: float) -> Fraction:
    """A setting at its shortest decimal value (0.1 is 1/10, as a configuration states it)."""
    return Fraction(repr(float(value)))


@dataclass(frozen=True, slots=True)
class Reach:
    """How far a change of gaze reaches into the feature vectors (module docstring), s.

    Attributes:
        window_s: ``W``, the feature window.
        step_s: ``s``, the feature step.
        hold_s: ``H``, the longest a held value repeats.
        lookbehind_s: ``A``, how long before a change the events it alters can end.
        event_reach_s: ``E``, how long after a change the events it alters can end.
        ingest_s: ``I``, how far the ingest moves other samples' timestamps on either side of
            a changed sample (the dejitter cell when ``ingest.dejitter`` is on, else 0).
    """

    window_s: Fraction
    step_s: Fraction
    hold_s: Fraction
    lookbehind_s: Fraction = field(default_factory=lambda: _exact(LOOKBEHIND_S))
    event_reach_s: Fraction = field(default_factory=lambda: _exact(EVENT_REACH_S))
    ingest_s: Fraction = Fraction(0)

    @classmethod
    def of(cls, features: FeatureSettings, ingest: IngestSettings | None = None) -> Reach:
        """The reach of these feature settings (``hold_limit_s`` unset: ``W``) behind this
        ingest (``None``: samples as they are, as the Python API takes them)."""
        hold = features.window_s if features.hold_limit_s is None else features.hold_limit_s
        moved = _exact(DEJITTER_CELL_S) if ingest is not None and ingest.dejitter else Fraction(0)
        return cls(_exact(features.window_s), _exact(features.step_s), _exact(hold),
                   ingest_s=moved)  # fmt: skip

    @property
    def span_s(self) -> Fraction:
        """``A + E + W + H + 2I``: the vectors one raw sample can change lie within this, s."""
        return (
            self.lookbehind_s + self.event_reach_s + self.window_s + self.hold_s
            + 2 * self.ingest_s
        )  # fmt: skip


def releases_per_hour(
    features: FeatureSettings, period_s: float | Fraction, summary_s: float | Fraction
) -> int:
    """Releases of one kind, alone in a plan, that one hour of gaze can change: one every
    ``period_s`` of gaze, each summarising the vectors of the ``summary_s`` before its end."""
    period = period_s if isinstance(period_s, Fraction) else _exact(period_s)
    summary = summary_s if isinstance(summary_s, Fraction) else _exact(summary_s)
    return releases_within(HOUR_S + Reach.of(features).span_s + summary, period)


def chunks_per_hour(features: FeatureSettings, chunk_steps: int) -> int:
    """Chunks of ``chunk_steps`` steps that one hour of gaze can change (chunks alone)."""
    step = _exact(features.step_s)
    return releases_per_hour(features, chunk_steps * step, (chunk_steps - 1) * step)


def chunk_counter(features: FeatureSettings, max_chunk_steps: int) -> Callable[[int], int]:
    """Chunks of ``n ≤ max_chunk_steps`` steps one hour of gaze can change, counted in the
    ledger's window of a plan whose chunks are at most ``max_chunk_steps`` long (what
    ``mechanism.name = "auto"`` ranks by)."""
    step = _exact(features.step_s)
    window = HOUR_S + Reach.of(features).span_s + (max_chunk_steps - 1) * step
    return lambda n: releases_within(window, n * step)


def label_cadence(
    share: float, classes: int, epsilon: float, *, delta: float, features: FeatureSettings
) -> tuple[int, float] | None:
    """The most label decisions one hour of gaze can change whose randomized response at
    ``epsilon`` still composes within ``share`` at ``delta``, and the shortest decision length
    (s, a whole number of steps) whose plan counts at most that many; ``None`` if not even two
    fit (a decision may straddle the hour's edge)."""
    event = RandomizedResponseEvent(epsilon, classes)

    def fits(d: int) -> bool:
        return compose({event: d}, delta).epsilon <= share

    if not fits(2):
        return None
    step = features.step_s
    most = releases_per_hour(features, 2 * step, step)  # decisions of two steps each
    if fits(most):
        return most, 2 * step
    lo, hi = 2, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    steps = max(2, math.floor(HOUR_S / lo / step))
    while releases_per_hour(features, steps * step, (steps - 1) * step) > lo:
        steps += 1
    return lo, steps * step


def labels_alone(
    labels: LabelSettings,
    features: FeatureSettings,
    *,
    share: float,
    delta: float,
    model: LabelModel | None = None,
) -> tuple[LabelPlan, float]:
    """The label plan of a sidecar whose labels alone take ``share`` ε per hour of gaze at
    ``delta`` (the evaluation's axis, :mod:`gazeguard.offline.eval.labels`), counted as
    :meth:`ReleasePlan.build` counts labels, and the ledger window of such a plan, s (every
    label end one hour of gaze can change lies within it).

    Args:
        labels: the ``labels`` settings (``decision_s``, ``model``, …).
        features: the feature window and step.
        share: ε per hour of gaze for the labels (at ``delta``).
        delta: δ of ``share``.
        model: the label model (default: ``labels.model``, loaded and checked).
    """
    reach = Reach.of(features)
    steps = steps_per_decision(labels, features)
    summary = (steps - 1) * reach.step_s
    window = HOUR_S + reach.span_s + summary
    layout = _Layout(
        features, reach, {"labels": summary}, window, delta, steps,
        model if model is not None else load_label_model(labels, features),
    )  # fmt: skip
    plan, _ = layout.labels(labels, share, None)
    return plan, float(window)


@dataclass(frozen=True, slots=True)
class Release:
    """One release kind of a plan.

    Attributes:
        kind: ``chunks``, ``labels`` or ``cohort``.
        stream: the ledger stream its releases are charged to.
        period_s: the least gaze time between two releases' ends, s.
        summary_s: gaze time from a release's first summarised vector to its end, s.
        events: the accounting events one release charges one person.
        share: its share of the hourly budget, ε at ``delta`` (``None``: no budget).
        delta: δ of that share.
        per_sample: releases one raw gaze sample can change.
        per_hour: releases one hour of gaze can change (in the ledger's window).
    """

    kind: str
    stream: str
    period_s: Fraction
    summary_s: Fraction
    events: Mapping[Event, int]
    share: float | None
    delta: float
    per_sample: int
    per_hour: int


def profile_names(mechanism: MechanismSettings) -> list[str]:
    """The release profile's feature names (all 48 when ``mechanism.features`` is unset).

    Raises:
        ConfigError: an unknown name (also in ``epsilon_per_feature``), or an empty profile.
    """
    all_names = [f.name for f in FEATURES]
    names = list(mechanism.features) if mechanism.features is not None else all_names
    unknown = [n for n in [*names, *mechanism.epsilon_per_feature] if n not in all_names]
    if unknown or not names:
        raise ConfigError(
            "mechanism.features",
            unknown or names,
            f"unknown feature name(s); known: {', '.join(all_names)}"
            if unknown
            else "the release profile is empty",
            None,
        )
    return names


@dataclass(frozen=True)
class ReleasePlan:
    """Everything a session releases and what it costs (module docstring).

    Build it with :meth:`build` or :meth:`from_settings`.

    Attributes:
        budget: ``B``, user-level ε per hour of gaze at ``delta`` (``None``: no hourly budget).
        delta: δ of every figure.
        session_cap: cap on a session's ε (``None``: none).
        features: the feature settings (window, step, hold).
        reach: how far a change of gaze reaches.
        window_s: the ledger's window: release ends one hour of gaze can change lie within it.
        names: the released features of the chunks, (F,); units: their units.
        mechanism: the chunks' mechanism (noise calibrated to their share).
        chunks: the chunk release; labels, cohort: the others, or ``None``.
        label_plan: the label model and ε per decision (``labels`` enabled).
        cohort_plan: the cohort aggregate's calibration (fleet with ``cohort`` enabled).
        profile: the release profile's name, if one chose the features.
        insecure_seed: ``mechanism.insecure_seed`` (reproducible, NOT private noise).
    """

    budget: float | None
    delta: float
    session_cap: float | None
    features: FeatureSettings
    reach: Reach
    window_s: float
    names: list[str]
    units: list[str]
    mechanism: Mechanism
    chunks: Release
    labels: Release | None = None
    cohort: Release | None = None
    label_plan: LabelPlan | None = None
    cohort_plan: CohortPlan | None = None
    profile: str | None = None
    insecure_seed: int | None = None

    # ------------------------------------------------------------------------------ building
    @classmethod
    def from_settings(cls, settings: Settings) -> ReleasePlan:
        """The plan of ``gazeguard run`` with these settings (cohort aggregates only in fleet
        mode, labels when enabled).

        Raises:
            ConfigError: naming the setting whose value the plan cannot meet.
        """
        key = settings.model_dump_json(
            include={"features", "mechanism", "labels", "cohort", "fleet", "ledger", "ingest"}
        )
        if key in _BUILT:  # a process builds the same plan for validation and for the run
            return _BUILT[key]
        cohort = settings.cohort if settings.cohort.enabled and settings.fleet.enabled else None
        plan = cls.build(
            features=settings.features,
            mechanism=settings.mechanism,
            budget=settings.ledger.budget_per_hour,
            delta=settings.ledger.delta,
            session_cap=settings.ledger.session_cap,
            labels=settings.labels if settings.labels.enabled else None,
            cohort=cohort,
            ingest=settings.ingest,
        )
        while len(_BUILT) >= 8:
            del _BUILT[next(iter(_BUILT))]
        _BUILT[key] = plan
        return plan

    @classmethod
    def build(
        cls,
        *,
        features: FeatureSettings | None = None,
        mechanism: MechanismSettings | None = None,
        budget: float | None,
        delta: float,
        session_cap: float | None = None,
        labels: LabelSettings | None = None,
        cohort: CohortSettings | None = None,
        ingest: IngestSettings | None = None,
    ) -> ReleasePlan:
        """Plan chunks (always), labels and cohort aggregates (when given) for ``budget``,
        behind ``ingest`` (its dejittering widens the reach; ``None``: samples as they are).

        Raises:
            ConfigError: naming the setting whose value the plan cannot meet (shares that
                leave nothing for the chunks, a budget too small, a model that does not fit).
        """
        features = features or FeatureSettings()
        mechanism = mechanism or MechanismSettings()
        names = profile_names(mechanism)
        all_names = [f.name for f in FEATURES]
        units = [FEATURES[all_names.index(n)].unit for n in names]
        layout = _Layout.of(features, mechanism, labels, cohort, delta, ingest=ingest)
        shares = _shares(budget, labels, cohort)
        label_release = label_plan = None
        if labels is not None:
            label_plan, label_release = layout.labels(labels, shares.get("labels"), budget)
            if budget is not None and labels.epsilon is not None:  # a fixed ε: what it costs
                shares = _shares(budget, labels, cohort, fixed_labels=label_plan.reserve)
        cohort_release = cohort_plan = None
        if cohort is not None:
            cohort_plan, cohort_release = layout.cohort(cohort, names, units, shares.get("cohort"))
        # Chunks last, calibrated so that every kind's releases of an hour compose to the budget
        # together (the others' events are fixed by now).
        fixed: dict[Event, int] = {}
        for other in (label_release, cohort_release):
            if other is not None:
                for e, c in other.events.items():
                    fixed[e] = fixed.get(e, 0) + c * other.per_hour
        lo, hi, max_step = feature_bounds(names, features.window_s, features.step_s)
        step = layout.reach.step_s
        try:
            mech = build_mechanism(
                mechanism, names, Bounds(lo=lo, hi=hi, max_step=max_step), features.step_s,
                budget=budget, delta=delta, fixed=fixed or None,
                chunks_for=lambda n: releases_within(layout.window, n * step),
            )  # fmt: skip
        except ConfigError as exc:
            if not fixed or exc.field != "budget":
                raise
            field, value = (
                ("labels.budget_share", labels.budget_share)
                if labels is not None
                else ("cohort.budget_share", cohort.budget_share if cohort else None)
            )
            raise ConfigError(
                field, value,
                f"the labels and cohort aggregates leave too little of ledger.budget_per_hour "
                f"= {budget} for the chunks ({exc.reason}); lower their shares",
            ) from exc  # fmt: skip
        layout.summaries["chunks"] = (mech.n - 1) * step
        chunks = layout.release("chunks", mech.n * step, mech.events(), shares.get("chunks"))
        return cls(
            budget=budget, delta=delta, session_cap=session_cap, features=features,
            reach=layout.reach, window_s=float(layout.window), names=names, units=units,
            mechanism=mech, chunks=chunks, labels=label_release, cohort=cohort_release,
            label_plan=label_plan, cohort_plan=cohort_plan, profile=mechanism.profile,
            insecure_seed=mechanism.insecure_seed,
        )  # fmt: skip

    # ------------------------------------------------------------------------------ figures
    @property
    def grid_s(self) -> float:
        """The chunk grid's period ``n·s``, s: a session's feature grid starts on a multiple of
        it on the stream's clock, so that its chunks start on multiples of their length
        there, whatever the samples (label blocks: :attr:`label_grid_s`)."""
        return float(self.mechanism.n * self.reach.step_s)

    @property
    def label_grid_s(self) -> float | None:
        """The label decision blocks' period, s: blocks start on its multiples on the stream's
        clock (the steps before a session's first one decide no label); ``None``: no labels."""
        if self.label_plan is None:
            return None
        return float(self.label_plan.steps * self.reach.step_s)

    @property
    def releases(self) -> tuple[Release, ...]:
        """The kinds this plan releases, chunks first."""
        return tuple(r for r in (self.chunks, self.labels, self.cohort) if r is not None)

    def epsilon(self, counts: Mapping[str, int]) -> float:
        """User-level ε at :attr:`delta` of ``counts[kind]`` releases of each kind, composed by
        the accountant."""
        events: dict[Event, int] = {}
        for r in self.releases:
            times = counts.get(r.kind, 0)
            for e, c in r.events.items():
                events[e] = events.get(e, 0) + c * times
        return compose(events, self.delta).epsilon if events else 0.0

    @property
    def per_release(self) -> dict[str, float]:
        """ε at δ of one release of each kind."""
        return {r.kind: self.epsilon({r.kind: 1}) for r in self.releases}

    @property
    def per_sample(self) -> float:
        """ε at δ protecting one raw gaze sample: every release it can change, every kind."""
        return self.epsilon({r.kind: r.per_sample for r in self.releases})

    @property
    def per_hour(self) -> float:
        """ε at δ of every release one hour of gaze can change, every kind (≤ :attr:`budget`)."""
        return self.epsilon({r.kind: r.per_hour for r in self.releases})

    def per_session(self, hours: float) -> float:
        """ε at δ of every release a session of ``hours`` of gaze can make, every kind."""
        length = _exact(hours) * HOUR_S + self.reach.span_s
        return self.epsilon(
            {r.kind: releases_within(length + r.summary_s, r.period_s) for r in self.releases}
        )

    @property
    def chunk_cost(self) -> dict[str, Event]:
        """What one chunk costs, for the ledger: each released feature's accounting event, by
        feature name (:attr:`names`)."""
        return dict(zip(self.names, self.mechanism.feature_events(), strict=True))

    @property
    def chunk_pure(self) -> float:
        """Pure ε of one chunk (``inf`` for Gaussian noise)."""
        return sum(e.pure_epsilon * c for e, c in self.chunks.events.items())

    def ledger_caps(self, ledger: LedgerSettings | None = None) -> Caps:
        """The caps to open :class:`gazeguard.ledger.Ledger` with (``caps=``): the hourly budget
        over the plan's window (every release one hour of gaze can change) and the session
        cap, each an (ε, δ) loss at :attr:`delta`; ``ledger``: its composition and wall-clock
        setting (default: the accountant's ε, gaze time only)."""
        hourly = None if self.budget is None else PrivacyLoss.approx(
            self.budget, self.delta, field="ledger.budget_per_hour", delta_field="ledger.delta"
        )  # fmt: skip
        session = None if self.session_cap is None else PrivacyLoss.approx(
            self.session_cap, self.delta, field="ledger.session_cap", delta_field="ledger.delta"
        )  # fmt: skip
        return Caps.of(
            session=session, window=hourly, window_s=self.window_s, delta=self.delta,
            composition="pld" if ledger is None else ledger.composition,
            wall_clock=False if ledger is None else ledger.wall_clock,
        )  # fmt: skip

    def figures(self) -> dict[str, Any]:
        """The plan's figures as JSON-ready values (what ``gazeguard plan --json`` prints)."""
        return {
            "budget_per_hour": self.budget,
            "delta": self.delta,
            "session_cap": self.session_cap,
            "ledger_window_s": self.window_s,
            "reach_s": float(self.reach.span_s),
            "epsilon_per_sample": self.per_sample,
            "epsilon_per_hour": self.per_hour,
            "epsilon_per_8h_session": self.per_session(8.0),
            "releases": {
                r.kind: {
                    "period_s": float(r.period_s),
                    "share": r.share,
                    "delta": r.delta,
                    "per_sample": r.per_sample,
                    "per_hour": r.per_hour,
                    "epsilon_per_release": self.epsilon({r.kind: 1}),
                    "epsilon_per_sample": self.epsilon({r.kind: r.per_sample}),
                    "epsilon_per_hour": self.epsilon({r.kind: r.per_hour}),
                }
                for r in self.releases
            },
            "noise_multiplier": float(self.mechanism.noise_multiplier.max()),
            **({"cohort": self._cohort_figures()} if self.cohort_plan is not None else {}),
        }

    def _cohort_figures(self) -> dict[str, Any]:
        """What the cohort release holds and its noise: blocks, Δ2, σ, each part's event."""
        c = self.cohort_plan
        assert c is not None
        return {
            "release": [
                *(["means"] if c.features else []),
                *(["shares"] if c.classes else []),
                *(["attention"] if c.attention is not None and c.attention.grid else []),
                *(["aois"] if c.attention is not None and c.attention.aois else []),
                *(["mode"] if c.mode_classes else []),
            ],
            "dimension": c.dimension,
            "blocks": c.blocks,
            "sensitivity_l2": c.sensitivity_l2,
            "sigma": c.sigma,
            "parts": {
                p.name: {
                    "stream": p.stream,
                    "blocks": p.blocks,
                    "dimension": p.dimension,
                    "sensitivity_l2": p.sensitivity_l2,
                    "sigma": p.sigma,
                    "noise_multiplier": p.noise_multiplier,
                    **({"epsilon": float(p.epsilon)} if p.epsilon is not None else {}),
                }
                for p in c.parts
            },
            **({"attention": c.attention.describe()} if c.attention is not None else {}),
        }

    def text(self) -> str:
        """The plan in a few lines (the banner, ``config check``, ``gazeguard plan``)."""
        how = (
            "no hourly budget"
            if self.budget is None
            else f"ε {self.budget:g} per hour of gaze at δ {self.delta:g}"
        )
        lines = [
            f"release plan: {how}; one raw gaze sample reaches "
            + ", ".join(f"{r.per_sample} {r.kind}" for r in self.releases)
            + f" (ε {self.per_sample:.4g}); one hour of gaze reaches "
            + ", ".join(f"{r.per_hour} {r.kind}" for r in self.releases)
            + f" (ε {self.per_hour:.4g}); an 8-hour session ε {self.per_session(8.0):.4g}",
        ]
        for r in self.releases:
            if r.share is None:
                share = ""
            elif r.kind == "chunks" and len(self.releases) > 1:
                share = ", calibrated last: every kind of an hour together within the budget"
            else:
                share = f", share ε {r.share:.4g} at δ {r.delta:.3g}"
            lines.append(
                f"  {r.kind}: one every {float(r.period_s):g} s of gaze, ε "
                f"{self.epsilon({r.kind: 1}):.4g} each{share}"
            )
            if r.kind == "cohort" and self.cohort_plan is not None:
                lines.append(f"    {self.cohort_plan.text()}")
        return "\n".join(lines)


@dataclass
class _Layout:
    """How a plan's release kinds sit in gaze time: the reach, each kind's summary and the
    ledger's window (every release end one hour of gaze can change, of every kind; chunks at
    most ``mechanism.chunk_steps`` long: 'auto' chooses no longer ones)."""

    features: FeatureSettings
    reach: Reach
    summaries: dict[str, Fraction]
    window: Fraction
    delta: float
    label_steps: int = 0
    model: LabelModel | None = None
    cohort_model: LabelModel | None = None

    @classmethod
    def of(
        cls,
        features: FeatureSettings,
        mechanism: MechanismSettings,
        labels: LabelSettings | None,
        cohort: CohortSettings | None,
        delta: float,
        *,
        ingest: IngestSettings | None = None,
    ) -> _Layout:
        reach = Reach.of(features, ingest)
        summaries = {"chunks": (mechanism.chunk_steps - 1) * reach.step_s}
        model = cohort_model = None
        label_steps = 0
        if labels is not None:
            model = load_label_model(labels, features)
            label_steps = steps_per_decision(labels, features)
            summaries["labels"] = (label_steps - 1) * reach.step_s
        if cohort is not None:
            summaries["cohort"] = _exact(cohort.bucket_s)
            cohort_model = _cohort_model(cohort, features)
        window = HOUR_S + reach.span_s + max(summaries.values())
        return cls(features, reach, summaries, window, delta, label_steps, model, cohort_model)

    def release(
        self, kind: str, period: Fraction, events: Mapping[Event, int], share: float | None
    ) -> Release:
        """The release ``kind``, one every ``period``, with the plan's counts."""
        summary = self.summaries[kind]
        return Release(
            kind, kind, period, summary, dict(events), share, self.delta,
            releases_within(self.reach.span_s + summary, period),
            releases_within(self.window, period),
        )  # fmt: skip

    def labels(
        self, labels: LabelSettings, share: float | None, budget: float | None
    ) -> tuple[LabelPlan, Release]:
        """The label plan (ε per decision for its share) and its release."""

        assert self.model is not None
        period = self.label_steps * self.reach.step_s  # a label per block, on the clock
        plan = plan_labels(
            labels, self.features, model=self.model,
            per_hour=releases_within(self.window, period),
            per_sample=releases_within(self.reach.span_s + self.summaries["labels"], period),
            share=share, budget=budget, delta=self.delta,
        )  # fmt: skip
        return plan, self.release("labels", period, plan.events, plan.reserve)

    def cohort(
        self, cohort: CohortSettings, names: list[str], units: list[str], share: float | None
    ) -> tuple[CohortPlan, Release]:
        """The cohort aggregate's calibration for its share, and its release."""

        if share is None:
            raise ConfigError(
                "cohort.enabled", True,
                "cohort aggregates are calibrated to ledger.budget_per_hour; set one",
            )  # fmt: skip
        bucket = self.summaries["cohort"]
        release = cohort_release(cohort)
        if "means" not in release:
            names, units = [], []
        lo, hi, _ = feature_bounds(names, self.features.window_s, self.features.step_s)
        model = self.cohort_model
        plan = plan_cohort(
            names, lo, hi, units, model.classes if model and "shares" in release else (),
            bucket_s=cohort.bucket_s, per_hour=releases_within(self.window, bucket),
            budget=share, delta=self.delta, attention=attention_layout(cohort),
            mode_classes=model.classes if model and "mode" in release else (),
        )  # fmt: skip
        return plan, self.release("cohort", bucket, plan.events, share)


def cohort_release(cohort: CohortSettings) -> tuple[str, ...]:
    """What the cohort releases (``cohort.release``; unset: the mode with a model — the
    default, ``activity`` — else means).

    Raises:
        ConfigError: ``shares`` or ``mode`` without ``cohort.model``, ``aois`` without
            ``cohort.attention_aois``, or either setting (set explicitly) without what releases
            it.
    """
    if cohort.release is None:
        return ("mode",) if cohort.model is not None else ("means",)
    release = tuple(cohort.release)
    for kind in ("shares", "mode"):
        if kind in release and cohort.model is None:
            raise ConfigError(
                "cohort.release", list(release), f"'{kind}' needs a label model: set cohort.model"
            )
    if (
        "shares" not in release
        and "mode" not in release
        and cohort.model is not None
        and "model" in cohort.model_fields_set  # the default model is simply not used
    ):
        raise ConfigError(
            "cohort.model", cohort.model,
            "cohort.release includes neither 'shares' nor 'mode': add one, or unset cohort.model",
        )  # fmt: skip
    if "aois" in release and cohort.attention_aois is None:
        raise ConfigError(
            "cohort.release", list(release), "'aois' needs an AOI file: set cohort.attention_aois"
        )
    if "aois" not in release and cohort.attention_aois is not None:
        raise ConfigError(
            "cohort.attention_aois", cohort.attention_aois,
            "cohort.release does not include 'aois': add it, or unset cohort.attention_aois",
        )  # fmt: skip
    return release


def attention_layout(cohort: CohortSettings) -> AttentionLayout | None:
    """The attention the cohort releases (grid and/or AOIs, from the public settings and AOI
    file), or ``None``.

    Raises:
        ConfigError: a bad grid, field or AOI file (naming the setting and what is wrong).
    """

    release = cohort_release(cohort)
    if "attention" not in release and "aois" not in release:
        return None
    grid = None
    if "attention" in release:
        rows, cols = cohort.attention_grid
        width, height = cohort.attention_fov_deg
        grid = AttentionGrid(rows, cols, width, height)
    aois = load_aois(cohort.attention_aois) if "aois" in release and cohort.attention_aois else None
    return AttentionLayout(grid, aois)


def _shares(
    budget: float | None,
    labels: LabelSettings | None,
    cohort: CohortSettings | None,
    *,
    fixed_labels: float | None = None,
) -> dict[str, float]:
    """Each kind's share of ``budget`` (empty without a budget); ``fixed_labels``: what labels
    at a fixed ``labels.epsilon`` cost per hour (instead of their share).

    Raises:
        ConfigError: labels and cohort leave nothing for the chunks.
    """
    if budget is None:
        return {}
    out: dict[str, float] = {}
    if labels is not None:
        out["labels"] = labels.budget_share * budget if fixed_labels is None else fixed_labels
    if cohort is not None:
        out["cohort"] = cohort.budget_share * budget
    taken = sum(out.values())
    if taken >= budget * (1 - 1e-9):
        field, value = (
            ("cohort.budget_share", cohort.budget_share)
            if cohort is not None
            else ("labels.budget_share", labels.budget_share if labels is not None else None)
        )
        raise ConfigError(
            field,
            value,
            "labels.budget_share + cohort.budget_share must leave a share of "
            "ledger.budget_per_hour for the chunks (their sum must be < 1)",
        )
    out["chunks"] = budget - taken
    return out


def _cohort_model(cohort: CohortSettings, features: FeatureSettings) -> LabelModel | None:
    """The cohort's label model (its class shares or mode are released), checked against the
    feature window and step; ``None`` when the release needs no classes."""
    if cohort.model is None or not {"shares", "mode"} & set(cohort_release(cohort)):
        return None

    def mismatch(model: LabelModel) -> str:
        return (
            f"model {model.name!r} was trained on {model.spec.window_s:g} s windows every "
            f"{model.spec.step_s:g} s; features here are {features.window_s:g} s every "
            f"{features.step_s:g} s (its classes are what cohort.release "
            f"{list(cohort_release(cohort))} releases: release 'means' or 'attention' instead, "
            "or use the model's window and step)"
        )

    return load_fitting_model("cohort.model", cohort.model, features, mismatch)
